"""Conformal label sets: instead of one label, the set of labels that holds the true one at least a chosen share of
the time (the level, e.g. 0.9), larger where the model is unsure. A natural input for routing: texts whose set
holds one label (or none) are answered, the others go to a person.

Split conformal prediction (Vovk et al.; Angelopoulos & Bates, "A Gentle Introduction to Conformal Prediction"):
score each calibration text by how far down the model's ranking its true label sits, take the ceil((n+1) L)-th
smallest of the n scores as the cut q, and give a new text every label whose score is at most q. If the new text
and the calibration texts are exchangeable (drawn alike), its true label is in its set with probability at least
L, whatever the model: the guarantee is finite-sample, with no assumption on the model or the data.

Single-label: adaptive prediction sets (APS, Romano, Sesia & Candes 2020), randomised:

    s(x, y) = sum of p_j over the labels j with p_j > p_y  +  u * p_y          u ~ U(0, 1)

so the set is the most probable labels until their probability mass passes q: one label where the model is sure,
many where it spreads its probability. Without u the sets could only over-cover (a model that is right 96% of the
time would give sets of one label and 96% coverage at the level 0.9); with it coverage is L up to 1/(n+1), and a
text the model is very sure of may get an empty set (its top label is surer than the level needs). u is drawn from
a seeded generator for the calibration texts and, wherever a set is given or counted (predict, serve, the ONNX
runtime, evaluate, train's test pass), from a hash of the token ids the text is read as: the same text always gets
the same set, so evaluate's coverage is that of the sets predict gives, whatever the order of the rows.

Multi-label: conformal risk control (Angelopoulos et al. 2022) of the false-negative rate: one cut t on the
calibrated label probabilities, the highest for which the calibration texts' mean share of missed true labels
(counted with a worst case for the new text: (n * risk + 1) / (n + 1)) stays at most 1 - L. A text's set is every
label with p_c >= t; on average it holds at least a share L of the text's true labels (a text with none counts as
fully covered, in the fit as in evaluate).

The cuts are fitted after training on the validation texts, on the calibrated probabilities, for every level in
LEVELS, and saved in the best checkpoint's meta.json under "conformal". A single-label model's cuts use every
validation text, which also chose the best epoch and the one temperature: two numbers chosen among a few
candidates, a dependence far below the sampling error of the cut at a few hundred texts (the test coverage that
`evaluate` reports, with its expected range, is the check). A multi-label model's per-label temperatures are one
number per label, and a rare label's is chosen on its few validation positives: its cuts are fitted on the half of
the validation texts its temperatures were not (calibration.halves).

numpy only, like calibration.py: predict and the torch-free ONNX runtime read it."""
from __future__ import annotations

import math
import zlib

import numpy as np

from ..errors import TformerError

LEVELS = tuple(round(0.5 + 0.01 * i, 2) for i in range(50))  # 0.50 .. 0.99: the levels a checkpoint has cuts for
KEYS = frozenset(f"{x:.2f}" for x in LEVELS)  # (how meta.json names them: `key`)
REPORTED = (0.8, 0.9, 0.95)  # evaluate's table
DEFAULT_LEVEL = 0.9
BLOCK_ENTRIES = 1 << 20  # probabilities worked on at a time: memory is bounded, not (rows, classes)


def _rows_per_block(classes: int) -> int:
    return max(1, BLOCK_ENTRIES // max(classes, 1))


def key(level: float) -> str:
    return f"{level:.2f}"


def level_of(value, name: str = "coverage") -> float | str:
    """A user's level (0.9, "0.9"): the float, or the one-line reason it is refused."""
    try:
        level = float(value)
    except (TypeError, ValueError, OverflowError):  # (a JSON integer of a thousand digits)
        return f"{name}={value!r:.40} must be a number such as 0.9"
    if isinstance(value, bool) or not math.isfinite(level) or key(level) not in KEYS \
            or abs(round(level, 2) - level) > 1e-6:  # (float32's 0.9 is 2e-8 off)
        return f"{name}={value!r:.40} must be one of 0.50, 0.51, ..., 0.99 (two decimals)"
    return round(level, 2)


def level(value, name: str = "coverage") -> float:
    """`level_of`, raising the reason as a TformerError (the CLI and the Python API)."""
    got = level_of(value, name)
    if isinstance(got, str):
        raise TformerError(got)
    return got


def token_uniforms(windows) -> np.ndarray:
    """u in (0, 1) per text from a CRC-32 of the token ids it is read as (each window's): the same reading always
    gets the same u, so a text gets the same set in predict, serve and the ONNX runtime, and a changed spacing or
    casing that the model cannot see does not draw a new one."""
    out = np.empty(len(windows))
    for i, ws in enumerate(windows):
        crc = 0
        for ids, _ in ws:
            crc = zlib.crc32(np.asarray(ids, dtype="<i4").tobytes(), crc)
        out[i] = (crc + 0.5) / 2**32
    return out


def split_uniforms(values: np.ndarray, offsets: np.ndarray, docs: np.ndarray | None = None) -> np.ndarray:
    """`token_uniforms` of every document of a tokenized split (its flat token ids, their offsets, and each
    sequence's document where a document is read as several windows, in order): the u predict draws for the same
    text, one CRC per sequence (a few seconds for a million texts; nothing kept per text but the u)."""
    ids = np.ascontiguousarray(values, dtype="<i4")
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    owner = np.arange(n) if docs is None else np.asarray(docs, dtype=np.int64)
    crc = np.zeros(int(owner.max()) + 1 if n else 0, dtype=np.int64)
    for i in range(n):  # (a document's windows follow one another: its CRC runs on through them)
        crc[owner[i]] = zlib.crc32(ids[offsets[i]:offsets[i + 1]].tobytes(), int(crc[owner[i]]))
    return (crc + 0.5) / 2**32


def draws(seed: int = 0) -> np.random.Generator:
    """The u of calibration texts, in row order."""
    return np.random.default_rng([seed, 0x5E7])


def _ranked(p: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order (B, C): labels most probable first, s (B, C): the APS score of the label at each rank). Labels with
    equal probability share the mass before them, so a score is a function of p alone, not of the sort."""
    order = np.argsort(-p, axis=1, kind="stable")
    ps = np.take_along_axis(p, order, axis=1)
    before = np.cumsum(ps, axis=1) - ps
    starts = np.ones_like(ps, dtype=bool)
    starts[:, 1:] = ps[:, 1:] != ps[:, :-1]
    before = np.maximum.accumulate(np.where(starts, before, -np.inf), axis=1)
    # non-decreasing along the ranking in exact arithmetic; the accumulate removes rounding's 1e-16 dips, so a set
    # is always a prefix (Tally counts it with one searchsorted)
    return order, np.maximum.accumulate(before + u[:, None] * ps, axis=1)


def aps_scores(probs: np.ndarray, labels: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The APS score of each row's true label (module docstring), a block of rows at a time."""
    out = np.empty(len(probs))
    block = _rows_per_block(probs.shape[1] if len(probs) else 1)
    for start in range(0, len(probs), block):
        p = np.asarray(probs[start:start + block], dtype=np.float64)  # as `sets` reads them
        y, v = labels[start:start + block], u[start:start + block]
        py = p[np.arange(len(p)), y]
        out[start:start + block] = np.where(p > py[:, None], p, 0.0).sum(axis=1) + v * py
    return out


def cuts(scores: np.ndarray, levels=LEVELS) -> dict[str, float | None]:
    """The conformal cut per level: the ceil((n+1) L)-th smallest score; None where n is too small for the level
    (every label is in the set: (n+1) L > n)."""
    s = np.sort(np.asarray(scores, dtype=np.float64))
    n = len(s)
    out = {}
    for level in levels:
        k = math.ceil((n + 1) * level - 1e-9)
        out[key(level)] = float(s[k - 1]) if 1 <= k <= n else None
    return out


def fnr_cuts(probs: np.ndarray, targets: np.ndarray, levels=LEVELS) -> dict[str, float | None]:
    """Multi-label: per level the highest cut t on the label probabilities with (sum of missed shares + 1) / (n + 1)
    <= 1 - L (conformal risk control, module docstring); None where n is too small (every label)."""
    p, weight = _true_labels(probs, targets)
    return _fnr_cuts(p, weight, len(probs), levels)


def _true_labels(probs: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the probability of each true label, its share of its text's loss): all the risk control reads of a text."""
    y = np.asarray(targets) > 0.5
    rows, cols = np.nonzero(y)
    weight = 1.0 / np.maximum(y.sum(axis=1), 1)[rows]
    return np.asarray(probs, dtype=np.float64)[rows, cols], weight


def _fnr_cuts(p: np.ndarray, weight: np.ndarray, n: int, levels=LEVELS) -> dict[str, float | None]:
    order = np.argsort(p, kind="stable")
    p, missed = p[order], np.concatenate([[0.0], np.cumsum(weight[order])])  # missed[k]: loss if the k lowest miss
    out = {}
    for level in levels:
        budget = (1 - level) * (n + 1) - 1
        if budget < 0:
            out[key(level)] = None
            continue
        k = int(np.searchsorted(missed, budget + 1e-12, side="right")) - 1  # most true labels that may be missed
        if k >= len(p):
            out[key(level)] = 1.0  # every true label may be missed: only labels at probability 1
            continue
        out[key(level)] = float(p[k])  # t = the (k+1)-th lowest true-label probability: the k below it are missed
    return out


def fit_cuts(probs: np.ndarray, labels: np.ndarray, multi_label: bool, seed: int = 0) -> dict:
    """What a checkpoint saves: the method, the number of calibration texts, and the cut per level."""
    fit = CutFit(len(probs), multi_label, seed)
    fit.add(np.arange(len(probs)), probs, labels)
    return fit.result()


class CutFit:
    """`fit_cuts` a block of rows at a time (rows in any order, each once): per text one APS score, or per true
    label of a multi-label text two numbers, so the cuts are fitted on every calibration text whatever the number
    of classes (the probabilities of all of them at once would be texts x classes)."""

    def __init__(self, n: int, multi_label: bool, seed: int = 0):
        self.n, self.multi = n, multi_label
        self.u = None if multi_label else draws(seed).random(n)  # (row i's draw, whatever order rows come in)
        self.scores = None if multi_label else np.full(n, np.nan)
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, index, probs: np.ndarray, labels: np.ndarray) -> None:
        index = np.asarray(index)
        if self.multi:
            self.parts.append(_true_labels(probs, labels))
        else:
            self.scores[index] = aps_scores(probs, np.asarray(labels), self.u[index])

    def result(self) -> dict:
        if self.multi:
            p, weight = (np.concatenate(x) for x in zip(*self.parts)) if self.parts else (np.zeros(0), np.zeros(0))
            return {"method": "crc-fnr", "n": int(self.n), "cuts": _fnr_cuts(p, weight, self.n)}
        return {"method": "aps", "n": int(self.n), "cuts": cuts(self.scores)}


def too_few(table: dict) -> str | None:
    """The warning a fitted table deserves when its highest levels have no cut (their sets hold every label): the
    calibration texts were too few for them. None when every level has a cut."""
    covered = [x for x in LEVELS if table["cuts"].get(key(x)) is not None]
    if len(covered) == len(LEVELS):
        return None
    top = f"above {covered[-1]:.2f}" if covered else "at every level"
    few = f"{table['n']:,} calibration text{'s are' if table['n'] != 1 else ' is'}"
    return (f"{few} too few for the highest levels: "
            f"sets {top} hold every label (a level L needs L / (1 - L) texts; a few hundred make its coverage steady)")


def checked(table, multi_label: bool) -> str | None:
    """None when a saved table is usable, else what is wrong with it (a hand-edited or foreign meta.json)."""
    want = "crc-fnr" if multi_label else "aps"
    if not isinstance(table, dict) or table.get("method") != want or not isinstance(table.get("cuts"), dict):
        return f"a mapping with method {want} and its cuts"
    if set(table["cuts"]) != KEYS:
        return "a cut (or null) for each of the levels 0.50 .. 0.99"
    number = lambda c: isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c)  # noqa: E731
    if not all(c is None or (number(c) and 0 <= c <= 2) for c in table["cuts"].values()):
        return "cuts between 0 and 2 (or null) at the levels 0.50 .. 0.99"
    return None


def sets(probs: np.ndarray, cut: float | None, multi_label: bool, u: np.ndarray | None = None) -> np.ndarray:
    """(rows, classes) bool: each row's label set at a cut (None: every label)."""
    p = np.asarray(probs, dtype=np.float64)
    if cut is None:
        return np.ones(p.shape, dtype=bool)
    if multi_label:
        return p >= cut
    out = np.zeros(p.shape, dtype=bool)
    block = _rows_per_block(p.shape[1])
    for start in range(0, len(p), block):
        order, s = _ranked(p[start:start + block], u[start:start + block])
        np.put_along_axis(out[start:start + block], order, s <= cut, axis=1)
    return out


Z95 = 1.959963984540054  # a normal's 97.5% quantile (the multi-label range's approximation)
RANGE_TAILS = (0.025, 0.975)  # the expected range holds 95% of the coverages measured
RANGE_TEXTS = 1 << 18  # more scored texts: their range is counted for this many (wider by a hair, never narrower)


def expected_range(level: float, fitted: int, m: int, multi_label: bool, text_variance: float = 0.0
                   ) -> tuple[float, float]:
    """Where the coverage measured on m texts falls, 95% of the time, when they and the `fitted` calibration texts
    are drawn alike: the guarantee is an average over draws of both, and both are finite. Single-label (continuous
    APS scores), exactly: the coverage of the cut fitted on n texts is Beta(k, n + 1 - k), k = ceil((n + 1) L) (Vovk
    2012; Angelopoulos & Bates, section 3.2), and the texts of m it covers are Beta-binomial. Multi-label, a normal
    approximation: the cut keeps the n texts' mean missed share at most (1 - L)(n + 1) - 1 over n, so the covered
    share is about L (n + 1) / n, give or take the per-text variance of the covered share over n and over m. A few
    hundred texts on each side give a range several points wide: a coverage below it says the texts are probably
    not drawn like the calibration texts; one inside it cannot show that they are."""
    n, m = max(int(fitted), 1), min(max(int(m), 1), RANGE_TEXTS)
    if multi_label:
        half = Z95 * math.sqrt(text_variance * (1 / n + 1 / m))
        centre = min(1.0, level * (n + 1) / n)
        return max(0.0, centre - half), min(1.0, centre + half)
    k = math.ceil((n + 1) * level - 1e-9)
    if k > n:  # no cut: every label, coverage 1
        return 1.0, 1.0
    x = np.arange(m, dtype=np.float64)  # P(x + 1) / P(x) of Beta-binomial(m, k, n + 1 - k), summed as logs
    log_p = np.concatenate([[0.0], np.cumsum(np.log((m - x) * (x + k)) - np.log((x + 1) * (m - x - 1 + n + 1 - k)))])
    p = np.exp(log_p - log_p.max())
    cdf = np.cumsum(p) / p.sum()
    low, high = np.searchsorted(cdf, RANGE_TAILS[0]), np.searchsorted(cdf, RANGE_TAILS[1])
    return float(low / m), float(min(high, m) / m)


def range_note(edges, level: float = DEFAULT_LEVEL) -> str:
    """' (texts drawn like the ones they were fitted on: 0.864 to 0.936 at 0.90, 95% of the time)' of a level's
    expected range (`expected_range`; what `tformer calibrate` says of a checkpoint's old cuts, and `tformer
    report` again), or '' where none was recorded (older runs) or the file was edited into something else."""
    try:
        low, high = float(edges[0]), float(edges[1])
    except (TypeError, ValueError, IndexError, KeyError):
        return ""
    return f" (texts drawn like the ones they were fitted on: {low:.3f} to {high:.3f} at {level:.2f}, 95% of the time)"


def below_expected(label_sets: dict, level: float = DEFAULT_LEVEL) -> str | None:
    """The line evaluate prints when the coverage at the default level falls below its expected range
    (`expected_range`; one level, so that texts drawn like the calibration texts get it 1 time in 40)."""
    row = label_sets.get(key(level)) or {}
    low, high = row.get("expected") or (None, None)
    if low is None or row["coverage"] >= low:
        return None
    return (f"label sets: coverage at {level:.2f} is {row['coverage']:.4f}, below the {low:.3f} to {high:.3f} that "
            f"texts drawn like the calibration texts reach 95% of the time: these texts probably differ from them, "
            f"and the sets under-cover them (tformer calibrate refits the sets on labelled texts like them)")


class Tally:
    """Evaluation's running counts, a block of rows at a time: at every level, how many texts had their true label
    in their set (multi-label: the share of true labels in it; a text with none counts as covered, as in the fit)
    and how many labels the sets held."""

    def __init__(self, table: dict, multi_label: bool, seed: int = 0):
        self.levels = list(LEVELS)
        cuts = [table["cuts"].get(key(x)) for x in self.levels]
        # no cut (too few calibration texts): every label, whichever way a set is read
        self.cut = np.array([(-np.inf if multi_label else np.inf) if c is None else c for c in cuts])
        self.multi, self.n = multi_label, 0
        fitted = table.get("n")  # (the calibration texts: the expected range needs their number)
        self.fitted = fitted if isinstance(fitted, int) and not isinstance(fitted, bool) and fitted > 0 else None
        self.draws = draws(seed)
        self.covered = np.zeros(len(self.levels))
        self.squares = np.zeros(len(self.levels))  # multi-label: the covered shares squared (their variance)
        self.size = np.zeros(len(self.levels))
        self.empty = np.zeros(len(self.levels))

    def add(self, probs: np.ndarray, labels: np.ndarray, u: np.ndarray | None = None) -> None:
        """A block of texts: their probabilities, labels and (single-label) u, the `split_uniforms` of the texts
        (None: drawn from the seeded generator in row order)."""
        p, labels = np.asarray(probs), np.asarray(labels)
        if not len(p):
            return
        if u is None and not self.multi:
            u = self.draws.random(len(p))
        block = _rows_per_block(p.shape[1])
        for start in range(0, len(p), block):  # (float64 a block at a time: never a copy of the whole)
            self._add(p[start:start + block].astype(np.float64), labels[start:start + block],
                      None if u is None else np.asarray(u)[start:start + block])
        self.n += len(p)

    def _add(self, p: np.ndarray, labels: np.ndarray, u: np.ndarray | None) -> None:
        if self.multi:
            y = labels > 0.5
            true = np.maximum(y.sum(axis=1), 1)
            has = y.any(axis=1)
            for j, cut in enumerate(self.cut):  # one level at a time: (rows, classes), never x 50
                inside = p >= cut
                count = inside.sum(axis=1)
                self.size[j] += count.sum()
                self.empty[j] += (count == 0).sum()
                share = np.where(has, (inside & y).sum(axis=1) / true, 1.0)
                self.covered[j] += share.sum()
                self.squares[j] += (share * share).sum()
            return
        own = aps_scores(p, labels, u)
        self.covered += (own[:, None] <= self.cut[None, :]).sum(axis=0)
        _, s = _ranked(p, u)
        rows, c = np.arange(len(s))[:, None], s.shape[1]
        flat = (s + 4.0 * rows).ravel()  # each row's scores rise (a prefix is a set); rows 4 apart
        at = np.searchsorted(flat, np.minimum(self.cut[None, :], 3.0) + 4.0 * rows, side="right")
        counts = at - c * rows  # (B, L): labels with s <= cut
        self.size += counts.sum(axis=0)
        self.empty += (counts == 0).sum(axis=0)

    def result(self) -> dict:
        """{level: {coverage, mean_set_size, empty, expected}} for every level; expected: [low, high], the range
        the coverage falls in 95% of the time on texts drawn like the calibration texts (absent when the table
        does not say how many texts it was fitted on)."""
        n = max(self.n, 1)
        out = {}
        for i, x in enumerate(self.levels):
            coverage = float(self.covered[i] / n)
            out[key(x)] = {"coverage": coverage, "mean_set_size": float(self.size[i] / n),
                           "empty": float(self.empty[i] / n)}
            if self.fitted and self.n:
                variance = max(float(self.squares[i] / n) - coverage ** 2, 0.0)
                edges = (1.0, 1.0) if not np.isfinite(self.cut[i]) else \
                    expected_range(x, self.fitted, self.n, self.multi, variance)  # (no cut: every label)
                out[key(x)]["expected"] = [round(v, 6) for v in edges]
        return out
