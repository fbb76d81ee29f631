"""Calibrated probabilities: temperature scaling, and the numbers that say how far a model's probabilities are from
the frequencies they claim.

Why: a classifier trained to minimise cross-entropy until its training loss is near zero ends up overconfident on
new texts (Guo et al., 2017, "On Calibration of Modern Neural Networks"): the demo model said 0.9999 on sentences
it got wrong. Temperature scaling divides the logits by one number T > 1 (softer) or < 1 (sharper), fitted on
the validation split after training by minimising the negative log-likelihood there. One parameter cannot
overfit a validation split of a few hundred texts, and dividing by a positive number never changes which class is
largest, so accuracy, F1 and every argmax decision stay exactly what they were; only the probabilities move.

    softmax model      p = softmax(z / T)          one T for all classes
    multi-label model  p_c = sigmoid(z_c / T_c)    one T per label (each label is its own binary problem)

Metrics (each on documents, with the labels of the split):
    ECE    expected calibration error: confidences cut into 15 equal-width bins, the weighted mean of
           |accuracy - mean confidence| per bin. Softmax: the top class's probability, right when it is the true
           class. Multi-label: every (text, label) probability, right when the label is on.
    Brier  softmax: mean over texts of ||p - onehot(y)||^2 (0 is perfect, 2 the worst); multi-label: the mean of
           (p_c - y_c)^2 over texts and labels.
    NLL    softmax: mean -log p_y; multi-label: binary cross-entropy averaged over texts and labels (what the
           fit minimises, so it never goes up on the texts T was fitted on: a multi-label model's are half
           its validation split, `halves`).

numpy only (the reliability diagram is drawn with matplotlib by artifacts.py): `tformer predict` and the torch-free
ONNX runtime apply the temperature through `probabilities` and must keep their cold start.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import conformal

# T is searched in [T_MIN, T_MAX] on a log scale. A real model's T lies around 0.5 .. 5; the range is wide enough
# for a badly overfitted one (logits 10x too large: T 10). A validation split the model gets entirely right (a
# label: its positives and negatives on either side of 0) has its NLL falling for ever as T -> 0: it says nothing of
# how sure the model should be, and a fit that stops at T_MIN would make it sure of everything (3 texts, all right:
# test NLL 0.45 -> 2.78). Such a fit keeps T = 1 (a refit: the checkpoint's own), as texts with no information do.
T_MIN, T_MAX = 0.05, 50.0
ECE_BINS = 15
_SEARCH_STEPS = 80  # golden-section steps: the bracket shrinks by 0.618 each, from log(1000) to ~1e-16


FIT_ENTRIES = 1 << 22  # logits a temperature is fitted on: more rows than this allows are a seeded sample of rows


def fit_rows(n: int, classes: int, seed: int = 0, multi_label: bool = False) -> np.ndarray | None:
    """Which of n validation rows the temperature is fitted on: None (every row: `fitted` takes a multi-label
    model's half itself) when their logits number at most FIT_ENTRIES, else a seeded sample of FIT_ENTRIES //
    classes rows (sorted; a multi-label model's from its temperature half, `halves`). One number (or one per
    label) is pinned down by thousands of rows; 10,000 classes x 10,000 rows would cost 80 passes over 100 million
    logits."""
    if n * max(classes, 1) <= FIT_ENTRIES:
        return None
    pool = halves(n, seed)[0] if multi_label else np.arange(n)
    keep = max(1, FIT_ENTRIES // max(classes, 1))
    return np.sort(np.random.default_rng(seed).choice(pool, size=min(keep, len(pool)), replace=False))


def cut_rows(n: int, classes: int, seed: int = 0, multi_label: bool = False) -> np.ndarray | None:
    """Which rows the label-set cuts are fitted on when the temperature is fitted on a sample (`fit_rows` not
    None): every row (None) for a softmax model, the other half for a multi-label one (`halves`)."""
    if not multi_label or n * max(classes, 1) <= FIT_ENTRIES:
        return None
    return halves(n, seed)[1]


def halves(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(rows a multi-label model's temperatures are fitted on, rows its label-set cuts are fitted on): a seeded
    half each, sorted. One temperature per label, fitted on the texts the cuts are then fitted on, makes those
    texts look better covered than new ones: each rare label's temperature is chosen to make its few validation
    positives likely (1,000 labels fitted on 1,000 texts: sets promised at 0.90 covered 0.78 of new texts; on
    disjoint halves, 0.92). A softmax model's one temperature is one number chosen among the rows: it keeps them."""
    order = np.random.default_rng([seed, 0xCA1F]).permutation(n)
    return np.sort(order[: (n + 1) // 2]), np.sort(order[(n + 1) // 2:])


def told(labels) -> np.ndarray:
    """Per label of a multi-label model, whether these 0/1 targets say anything about its temperature: it is on for
    some texts and off for others (a label never on, or always on, has its NLL falling towards T_MIN for no reason)."""
    y = np.asarray(labels) > 0.5
    return y.any(axis=0) & (~y).any(axis=0)


def fit_temperature(logits, labels, multi_label: bool, keep=None) -> float | list[float]:
    """The temperature minimising the NLL of `labels` under `logits / T` (T in [T_MIN, T_MAX]): one float for a
    softmax model, one per label for a multi-label model. logits (N, C); labels (N,) class ids or (N, C) 0/1.

    A golden-section search over log T: the NLL is convex in 1/T (a log-sum-exp of a linear function of 1/T, less
    a linear one), hence unimodal in log T, so the search is exact up to float precision, needs no gradient, no
    learning rate and no starting point, is deterministic, and its answer is always inside the range (LBFGS on T
    can step to T <= 0 or to NaN on separable data). No examples, or no information in them (a label never on or
    never off has its NLL falling towards T_MIN for no reason), gives T = 1: the model as trained. Every label of a
    multi-label model is searched at once (one pass over the logits per step, whatever the number of labels).
    keep: a multi-label model's temperatures so far (a refit): a label these texts say nothing about keeps its own
    instead of going back to 1 (a few hundred texts rarely hold every rare label); likewise a softmax model's
    temperature (a float) where its texts are all answered right (see T_MIN above)."""
    z = np.asarray(logits, dtype=np.float64)
    if multi_label:
        y = np.asarray(labels, dtype=np.float64) > 0.5
        out = np.ones(z.shape[1] if z.ndim == 2 else 0)
        if isinstance(keep, (list, tuple)) and len(keep) == len(out):
            out[:] = keep
        if len(z):
            informative = told(y) & np.isfinite(z).all(axis=0)
            if informative.any():
                zi, yi = z[:, informative], y[:, informative]
                found = _golden(lambda t: _binary_nll(zi, yi, t[None, :]).mean(axis=0), int(informative.sum()))
                out[informative] = np.where(_all_right(zi, yi, True), out[informative], found)
        return [float(t) for t in out]
    y = np.asarray(labels, dtype=np.int64)
    if len(z) == 0 or not np.isfinite(z).all():
        return 1.0
    d = z - z.max(axis=1, keepdims=True)  # (N, C) <= 0: exp never overflows, whatever T
    d_true = d[np.arange(len(d)), y]
    if bool(_all_right(z, y, False)):
        return float(keep) if isinstance(keep, numbers.Real) and not isinstance(keep, bool) else 1.0
    return float(_golden(lambda t: np.mean(np.log(np.exp(d / t[0]).sum(axis=1)) - d_true / t[0]), 1)[0])


def _all_right(z: np.ndarray, y: np.ndarray, multi_label: bool):
    """Whether texts are all answered right, so that a smaller T always fits them better (see T_MIN): a softmax
    model's true label among the top logits of each text; per label of a multi-label model (an array), its
    positives at logit 0 or above and its negatives at 0 or below."""
    if multi_label:
        return ((z >= 0) | ~y).all(axis=0) & ((z <= 0) | y).all(axis=0)
    return (z[np.arange(len(z)), y] >= z.max(axis=1)).all()


def _golden(nll, width: int) -> np.ndarray:
    """argmin over T in [T_MIN, T_MAX] of `width` functions unimodal in log T, searched side by side (nll: an array
    of `width` temperatures -> `width` values), rounded to 6 significant digits (what is saved; the NLL is flat
    there)."""
    ratio = (math.sqrt(5) - 1) / 2
    lo, hi = np.full(width, math.log(T_MIN)), np.full(width, math.log(T_MAX))
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = nll(np.exp(a)), nll(np.exp(b))
    for _ in range(_SEARCH_STEPS):
        left = fa <= fb  # the minimum is left of b: [lo, b], else [a, hi]
        hi, lo = np.where(left, b, hi), np.where(left, lo, a)
        b_new, a_new = np.where(left, a, lo + ratio * (hi - lo)), np.where(left, hi - ratio * (hi - lo), b)
        fresh = np.where(left, a_new, b_new)  # the one new point per function
        f = nll(np.exp(fresh))
        fa, fb = np.where(left, f, fb), np.where(left, fa, f)
        a, b = a_new, b_new
    return np.array([float(f"{v:.6g}") for v in np.exp((lo + hi) / 2)])


def _softmax_nll(z: np.ndarray, y: np.ndarray, t: float) -> float:
    s = z / t  # (N, C)
    top = s.max(axis=1, keepdims=True)
    log_norm = top[:, 0] + np.log(np.exp(s - top).sum(axis=1))  # (N,) log-sum-exp, shifted: no overflow
    return float(np.mean(log_norm - s[np.arange(len(s)), y]))


def _binary_nll(z: np.ndarray, y: np.ndarray, t) -> np.ndarray:
    """Binary cross-entropy of sigmoid(z / t) per element: -log sigmoid(s) = softplus(-s), written without
    overflow."""
    s = z / t
    s = np.where(y, s, -s)  # the logit of the observed outcome
    return np.logaddexp(0.0, -s)


def checked(temperature, num_classes: int, multi_label: bool) -> str | None:
    """What is wrong with a saved temperature (meta.json, export.json), or None: a number in [T_MIN, T_MAX] (the
    range the fit searches, so every temperature tformer wrote) for a softmax model, a list of one per label for a
    multi-label model, or null (no calibration). 1e308 is finite but would make every probability equal."""
    def in_range(t) -> bool:
        return isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and \
            T_MIN * (1 - 1e-9) <= t <= T_MAX * (1 + 1e-9)

    if temperature is None:
        return None
    if multi_label:
        if isinstance(temperature, list) and len(temperature) == num_classes and all(map(in_range, temperature)):
            return None
        return f"a list of {num_classes} numbers from {T_MIN:g} to {T_MAX:g} (one per label)"
    return None if in_range(temperature) else f"a number from {T_MIN:g} to {T_MAX:g}"


def scaled(logits, temperature) -> np.ndarray:
    """logits / T (float64): T a number, or one per label (broadcast over the last axis); None: unchanged."""
    z = np.asarray(logits, dtype=np.float64)
    return z if temperature is None else z / np.asarray(temperature, dtype=np.float64)


def probabilities(logits, temperature=None, multi_label: bool = False) -> np.ndarray:
    """(N, C) float32 probabilities of (N, C) document logits at `temperature` (None: the raw model's):
    softmax(z / T), or sigmoid(z_c / T_c) per label. float64 inside, so that torch's and the ONNX runtime's
    answers differ only by their logits. A block of rows at a time: the float64 steps never hold more than
    BLOCK_ENTRIES numbers (a multi-label evaluation's texts x labels would take them several times over)."""
    z = np.asarray(logits)
    if z.ndim != 2 or z.size <= BLOCK_ENTRIES:
        return _probabilities(z, temperature, multi_label)
    out, rows = np.empty(z.shape, dtype=np.float32), max(1, BLOCK_ENTRIES // max(z.shape[1], 1))
    for start in range(0, len(z), rows):
        out[start:start + rows] = _probabilities(z[start:start + rows], temperature, multi_label)
    return out


def _probabilities(logits, temperature, multi_label: bool) -> np.ndarray:
    s = scaled(logits, temperature)
    if multi_label:
        return (1 / (1 + np.exp(-s))).astype(np.float32)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def nll(logits, labels, multi_label: bool, temperature=None) -> float:
    """Mean negative log-likelihood of the labels under logits / T (computed from logits: no log(0))."""
    z = scaled(logits, temperature)
    if len(z) == 0:
        return float("nan")
    if multi_label:
        return float(np.mean(_binary_nll(z, np.asarray(labels) > 0.5, 1.0)))
    return _softmax_nll(z, np.asarray(labels, dtype=np.int64), 1.0)


BLOCK_ENTRIES = 1 << 22  # probabilities binned at a time (float64: 32 MB)


def _events(probs, labels, multi_label: bool):
    """(confidence, right) blocks the ECE and the reliability diagram bin: the top class's probability and whether
    it is the true class; multi-label: every label's probability and whether the label is on."""
    probs = np.asarray(probs)
    rows = max(1, BLOCK_ENTRIES // max(probs.shape[-1] if probs.ndim == 2 else 1, 1))
    for start in range(0, len(probs), rows):
        p = probs[start:start + rows].astype(np.float64)
        if multi_label:
            yield p.ravel(), (np.asarray(labels[start:start + rows]) > 0.5).ravel()
        else:
            yield p.max(axis=1), p.argmax(axis=1) == np.asarray(labels[start:start + rows], dtype=np.int64)


def _bins(confidence: np.ndarray, bins: int) -> np.ndarray:
    """Bin index of each confidence: bin b holds (edge b, edge b+1] of np.linspace(0, 1, bins + 1), 0 itself the
    first (compared with the edges, not by confidence x bins, whose rounding moves 0.8 out of (0.7333, 0.8])."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    return np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, bins - 1)


class _Bins:
    """Running sums per bin of (confidence, right) events: how many, their confidence, how many were right."""

    def __init__(self, bins: int = ECE_BINS):
        self.bins, self.count, self.conf, self.right = bins, np.zeros(bins), np.zeros(bins), np.zeros(bins)

    def add(self, confidence, right) -> None:
        confidence = np.asarray(confidence, dtype=np.float64)
        idx = _bins(confidence, self.bins)
        self.count += np.bincount(idx, minlength=self.bins)
        self.conf += np.bincount(idx, weights=confidence, minlength=self.bins)
        self.right += np.bincount(idx, weights=np.asarray(right, dtype=np.float64), minlength=self.bins)

    def result(self):
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.count, self.conf / self.count, self.right / self.count


def reliability_of(events, bins: int = ECE_BINS):
    """Per bin: (count, mean confidence, accuracy) arrays of (confidence, right) blocks; empty bins have count 0
    and NaN means."""
    tally = _Bins(bins)
    for confidence, right in events:
        tally.add(confidence, right)
    return tally.result()


def reliability(probs, labels, multi_label: bool, bins: int = ECE_BINS):
    """Per bin: (count, mean confidence, accuracy) arrays; empty bins have count 0 and NaN means."""
    return reliability_of(_events(probs, labels, multi_label), bins)


def ece_from_bins(count, conf, acc) -> float:
    """The ECE of `reliability`'s bins."""
    if count.sum() == 0:
        return float("nan")
    filled = count > 0
    return float(np.sum(count[filled] / count.sum() * np.abs(acc[filled] - conf[filled])))


def ece(probs, labels, multi_label: bool = False, bins: int = ECE_BINS) -> float:
    """Expected calibration error: sum over bins of (share of events) x |accuracy - mean confidence|."""
    return ece_from_bins(*reliability(probs, labels, multi_label, bins))


def ece_of(confidence, right, bins: int = ECE_BINS) -> float:
    """`ece` of (confidence, right) pairs (evaluation/rows.py keeps them per text)."""
    return ece_from_bins(*reliability_of([(confidence, right)], bins))


def brier(probs, labels, multi_label: bool = False) -> float:
    """Softmax: mean ||p - onehot(y)||^2 over texts; multi-label: mean (p_c - y_c)^2 over texts and labels."""
    probs = np.asarray(probs)
    if len(probs) == 0:
        return float("nan")
    rows, total = max(1, BLOCK_ENTRIES // max(probs.shape[1], 1)), 0.0
    for start in range(0, len(probs), rows):
        p, y = probs[start:start + rows].astype(np.float64), np.asarray(labels[start:start + rows])
        if multi_label:
            total += float(np.sum((p - (y > 0.5)) ** 2))
        else:
            p[np.arange(len(p)), y.astype(np.int64)] -= 1.0
            total += float(np.sum(p * p))
    return total / (probs.size if multi_label else len(probs))


def metrics(logits, labels, multi_label: bool, temperature=None) -> dict:
    """ece, brier, nll at `temperature` (what consumers get), ece_raw, brier_raw, nll_raw of the model as
    trained, and the temperature (null: none fitted, the two agree). Taken a block of rows at a time: never more
    than BLOCK_ENTRIES probabilities in memory besides the logits."""
    z_all, labels = np.asarray(logits), np.asarray(labels)
    sums = Sums(multi_label, temperature)
    rows = max(1, BLOCK_ENTRIES // max(z_all.shape[1], 1)) if z_all.ndim == 2 else 1
    for start in range(0, len(z_all), rows):
        sums.add(z_all[start:start + rows], labels[start:start + rows])
    return sums.result()


class Sums:
    """`metrics` added a block of texts at a time (their logits and labels): the ECE's bins, the Brier and NLL
    sums, at the temperature and raw. A split streamed through it is never held as texts x classes."""

    SIDES = ("", "_raw")  # at the temperature, raw

    def __init__(self, multi_label: bool, temperature=None):
        self.multi, self.temperature, self.total = multi_label, temperature, 0
        self.bins = {suffix: _Bins() for suffix in self.SIDES}
        self.sums = {suffix: [0.0, 0.0] for suffix in self.SIDES}

    def add(self, z: np.ndarray, y: np.ndarray, calibrated: np.ndarray | None = None) -> None:
        """calibrated: the block's probabilities at the temperature, when the caller has them already."""
        if not len(z):
            return
        n = z.size if self.multi else len(z)
        for suffix in self.SIDES:
            t = self.temperature if suffix == "" else None
            p = calibrated if suffix == "" and calibrated is not None else probabilities(z, t, self.multi)
            for confidence, right in _events(p, y, self.multi):
                self.bins[suffix].add(confidence, right)
            self.sums[suffix][0] += brier(p, y, self.multi) * n
            self.sums[suffix][1] += nll(z, y, self.multi, t) * n
        self.total += n

    def curves(self) -> dict:
        """The reliability diagram's bins, raw and calibrated (`reliability`'s (count, confidence, accuracy))."""
        return {"raw": self.bins["_raw"].result(), "calibrated": self.bins[""].result()}

    def result(self) -> dict:
        if not self.total:
            return {**{f"{k}{suffix}": float("nan") for suffix in self.SIDES for k in ("ece", "brier", "nll")},
                    "temperature": self.temperature}
        out = {}
        for suffix in self.SIDES:
            out.update({f"ece{suffix}": ece_from_bins(*self.bins[suffix].result()),
                        f"brier{suffix}": self.sums[suffix][0] / self.total,
                        f"nll{suffix}": self.sums[suffix][1] / self.total})
        return {**out, "temperature": self.temperature}


def rescaled_thresholds(thresholds, temperature, old_temperature=None) -> list[float]:
    """A multi-label model's per-label cuts moved with its temperature, so that p_c >= t_c decides exactly what it
    decided before: on the logit scale the cut stays where it was. sigmoid(z / T) >= t  <=>  z >= T logit(t), so
    the cut on calibrated probabilities is sigmoid(logit(t_raw) / T); `old_temperature` (the checkpoint's, when its
    cuts were moved already) first takes them back to raw: t_raw = sigmoid(T_old logit(t))."""
    t = np.clip(np.asarray(thresholds, dtype=np.float64), 1e-12, 1 - 1e-12)
    z = np.log(t) - np.log1p(-t)  # logit(t)
    if old_temperature is not None:
        z = z * np.asarray(old_temperature, dtype=np.float64)
    if temperature is not None:
        z = z / np.asarray(temperature, dtype=np.float64)
    # kept inside (0, 1), where float32 probabilities can still fall on either side: a cut of exactly 1.0 (a label
    # whose temperature reached T_MIN) would be refused on load and would never let the label on
    return [float(v) for v in np.clip(1 / (1 + np.exp(-z)), 1e-6, 1 - 1e-6)]


def describe(temperature) -> str:
    """'1.84', or for per-label temperatures '0.92 .. 3.1 (median 1.6)'."""
    if temperature is None:
        return "none"
    if isinstance(temperature, list):
        t = np.asarray(temperature)
        return f"{t.min():.3g} .. {t.max():.3g} (median {np.median(t):.3g}, one per label)" if len(t) > 1 \
            else f"{t[0]:.3g}"
    return f"{temperature:.3g}"


def fitted(logits, labels, multi_label: bool, seed: int = 0, thresholds=None, old_temperature=None,
           refit: bool = False, every_text=None) -> dict:
    """What a checkpoint saves after a fit on labelled texts it never trained on (training's validation split, or
    `tformer calibrate`'s texts): the temperature, the label-set cuts on the probabilities at that temperature
    (conformal.py) and, for a multi-label model, its thresholds moved to the new scale (no decision changes).
    refit: old_temperature is kept where these texts cannot fit it again (`fit_temperature`'s keep). every_text:
    where `logits` are a sample of the texts (`fit_rows`), the cuts of every text (`cut_rows`) at a temperature (a
    function of it): one number pins a temperature down on a sample, while each cut is a quantile that wants every
    text. A multi-label model's temperatures and cuts are fitted on disjoint halves of the texts (`halves`)."""
    fit, cut = _parts(len(logits), multi_label, seed, every_text is not None)
    labels = np.asarray(labels)
    temperature = fit_temperature(logits[fit], labels[fit], multi_label, keep=old_temperature if refit else None)
    changes = {"temperature": temperature,
               "conformal": every_text(temperature) if every_text is not None else conformal.fit_cuts(
                   probabilities(logits[cut], temperature, multi_label), labels[cut], multi_label, seed)}
    if multi_label:  # the cuts follow the probabilities they are applied to
        changes["thresholds"] = rescaled_thresholds(thresholds, temperature, old_temperature)
    return changes


def _parts(n: int, multi_label: bool, seed: int, sampled: bool):
    """(the rows of `fitted`'s texts its temperature is fitted on, those its cuts are): all of them, but a
    multi-label model's seeded halves where the texts are not already a sample (`halves`)."""
    return (slice(None), slice(None)) if sampled or not multi_label else halves(n, seed)


def kept_note(logits, labels, multi_label: bool, seed: int = 0, sampled: bool = False) -> str:
    """What a fit line adds where texts answered all right kept a temperature as it was (`fit_temperature`), else
    ''; logits and labels as given to `fitted` (sampled: its every_text was given)."""
    fit = _parts(len(logits), multi_label, seed, sampled)[0]
    z = np.asarray(logits, dtype=np.float64)[fit]
    if not len(z) or not np.isfinite(z).all():
        return ""
    if multi_label:
        y = np.asarray(labels)[fit] > 0.5
        n = int((_all_right(z, y, True) & told(y)).sum())
        return f" ({n} label{'s' if n != 1 else ''} kept as {'they were' if n != 1 else 'it was'}: every text " \
               f"answered right, which says nothing of how sure to be)" if n else ""
    return " (kept as it was: every text answered right, which says nothing of how sure to be)" if _all_right(
        z, np.asarray(labels, dtype=np.int64)[fit], False) else ""


def at_the_edge(temperature) -> str:
    """The warning a fitted temperature at a bound of its search range deserves ('' when inside)."""
    return " (at the edge of its range: the texts may be too few, or unlike the model's own)" if any(
        t in (T_MIN, T_MAX) for t in np.atleast_1d(temperature)) else ""
