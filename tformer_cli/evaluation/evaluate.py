"""A model on a tokenized split: the metrics, and the report files. Shared by `train` (validation each epoch,
the test split at the end) and `evaluate`."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..inference import logit_blocks, loss_of, predict_logits
from ..safe_text import markup
from . import artifacts, calibration, conformal
from .metrics import compute, compute_multi_label, tune_thresholds
from .rows import LabelRows, Rows, reduce


@dataclass
class Scored:
    """A model on a split: its metrics and what the reports read of its answers: for a single-label model a few
    numbers per text (evaluation/rows.py), for a multi-label model at known thresholds its sets as bits
    (rows.LabelRows), and for one whose thresholds were tuned on the split its (N, C) document logits."""

    metrics: dict
    rows: Rows | LabelRows | None = None  # single-label; multi-label at known thresholds (streamed)
    logits: np.ndarray | None = None  # multi-label with its thresholds tuned here (N, C)
    labels: np.ndarray | None = None  # with `logits` (N, C) 0/1
    temperature: object = None

    def probs(self, temperature="checkpoint") -> np.ndarray:
        """Multi-label: (N, C) probabilities at the checkpoint's temperature, or at `temperature` (None: raw)."""
        t = self.temperature if temperature == "checkpoint" else temperature
        return calibration.probabilities(self.logits, t, True)


def score_split(model, split, label_names, *, pad_id, device, precision, batch_size, loss_weight=None,
                progress="evaluating", thresholds=None, temperature=None, calibration_metrics: bool = True,
                label_sets: dict | None = None) -> Scored:
    """The metrics of a model on a tokenized split, its labels decided on the probabilities at `temperature` (the
    checkpoint's; None: raw): a multi-label model's cut at `thresholds` (the checkpoint's, moved to the calibrated
    scale with its temperature), None tunes them on this split (validation does). With calibration_metrics the
    metrics gain ece, brier, nll at the temperature and the raw model's ece_raw, brier_raw, nll_raw. A single-label
    model's logits are reduced block by block as the forward pass makes them, and so are a multi-label model's at
    known thresholds (rows.LabelRows): memory grows with texts plus classes (a multi-label model's labels and
    predicted sets: 1.125 bytes a pair), not with the logits. `label_sets` (the checkpoint's conformal cuts) adds
    `label_sets`: the coverage and mean set size at every level (evaluation/conformal.py)."""
    y = split.doc_labels
    if bool(model.cfg.multi_label) and thresholds is not None:
        return _streamed_multi_label(model, split, label_names, y, pad_id=pad_id, device=device, precision=precision,
                                     batch_size=batch_size, loss_weight=loss_weight, progress=progress,
                                     thresholds=thresholds, temperature=temperature,
                                     calibration_metrics=calibration_metrics, label_sets=label_sets)
    if bool(model.cfg.multi_label):  # (validation: its thresholds are tuned on all of its texts at once)
        logits, loss = predict_logits(model, split, batch_size=batch_size, pad_id=pad_id, device=device,
                                      precision=precision, loss_weight=loss_weight, progress=progress)
        logits, labels = logits.numpy(), y.numpy()
        probs = calibration.probabilities(logits, temperature, True)
        cuts = thresholds if thresholds is not None else tune_thresholds(labels, probs)
        metrics = compute_multi_label(labels, probs, cuts, label_names, loss)
        if calibration_metrics:
            metrics.update(calibration.metrics(logits, labels, True, temperature))
        if label_sets is not None:
            tally = conformal.Tally(label_sets, True)
            tally.add(probs, labels)
            metrics["label_sets"] = tally.result()
        return Scored(metrics, logits=logits, labels=labels, temperature=temperature)
    loss_sum = [0.0]
    tally = conformal.Tally(label_sets, False) if label_sets is not None else None
    u = uniforms(split) if tally is not None else None  # (each text's, as predict draws it)

    def blocks():  # the logits, their loss (and label sets) summed on the way
        for index, logits in logit_blocks(model, split, batch_size=batch_size, pad_id=pad_id, device=device,
                                          precision=precision, progress=progress):
            loss_sum[0] += loss_of(logits, y[index], False, loss_weight, reduction="sum")
            if tally is not None:
                tally.add(calibration.probabilities(logits.numpy(), temperature), y[index].numpy(), u[index.numpy()])
            yield index.numpy(), logits.numpy()

    rows = reduce(blocks(), y.numpy(), temperature)
    metrics = compute(rows.labels, rows.pred, label_names, loss_sum[0] / max(len(rows), 1))
    if calibration_metrics:
        metrics.update(rows.figures())
    if tally is not None:
        metrics["label_sets"] = tally.result()
    return Scored(metrics, rows=rows, temperature=temperature)


def uniforms(split) -> np.ndarray:
    """(documents,) the u of each text of a tokenized split, as predict and serve draw it for the same text
    (conformal.split_uniforms): evaluate counts the sets they give."""
    return conformal.split_uniforms(split.values.numpy(), split.offsets.numpy(),
                                    None if split.docs is None else split.docs.numpy())


def _streamed_multi_label(model, split, label_names, y, *, thresholds, temperature, calibration_metrics: bool,
                          label_sets, loss_weight, **scoring) -> Scored:
    """`score_split` of a multi-label model at known thresholds: every figure counted as the blocks of logits come
    (rows.LabelRows), so memory holds the split's labels and a few bits per (text, label), not its logits."""
    labels = y.numpy()
    kept = LabelRows.start(labels, thresholds, temperature, calibration_metrics)
    tally = conformal.Tally(label_sets, True) if label_sets is not None else None
    loss = 0.0
    for index, logits in logit_blocks(model, split, **scoring):
        loss += loss_of(logits, y[index], True, loss_weight, reduction="sum")
        rows, z = index.numpy(), logits.numpy()
        probs = calibration.probabilities(z, temperature, True)
        kept.add(rows, z, probs)
        if tally is not None:
            tally.add(probs, labels[rows])
    metrics = kept.counts.metrics(thresholds, label_names, loss / max(labels.size, 1))
    if calibration_metrics:
        metrics.update(kept.sums.result())
    if tally is not None:
        metrics["label_sets"] = tally.result()
    return Scored(metrics, rows=kept, temperature=temperature)


def every_text_cuts(model, split, multi_label: bool, seed: int, rows=None, **scoring):
    """For a calibration whose temperature is fitted on a sample of the texts (calibration.fit_rows: many classes):
    the function of a temperature that gives the conformal cuts (conformal.CutFit) of every text of the split (or
    of `rows`: a multi-label model's cut half, calibration.cut_rows), from one more pass over it (scoring:
    logit_blocks' pad_id, device, precision, batch_size). A cut is a quantile of the texts' scores, which a sample
    would leave noisy, and a few numbers per text are all the pass keeps."""

    keep = None if rows is None else np.isin(np.arange(split.n_docs), rows)  # (rows: calibration.cut_rows)

    def cuts(temperature) -> dict:
        labels = split.doc_labels.numpy()
        fit = conformal.CutFit(split.n_docs if keep is None else int(keep.sum()), multi_label, seed)
        for index, logits in logit_blocks(model, split, progress="label-set cuts", **scoring):
            at, z = index.numpy(), logits.numpy()
            if keep is not None:  # (multi-label only: its CutFit counts the rows given, whatever their index)
                at, z = at[keep[at]], z[keep[at]]
            fit.add(at, calibration.probabilities(z, temperature, multi_label), labels[at])
        return fit.result()

    return cuts


def evaluate_split(model, split, label_names, *, pad_id, device, precision, batch_size, loss_weight=None,
                   progress="evaluating", thresholds=None, temperature=None) -> dict:
    """The metrics of a model on a tokenized split, see `score_split` (no calibration figures)."""
    return score_split(model, split, label_names, pad_id=pad_id, device=device, precision=precision,
                       batch_size=batch_size, loss_weight=loss_weight, progress=progress, thresholds=thresholds,
                       temperature=temperature, calibration_metrics=False).metrics


def count(split) -> str:
    """'25,000 examples', or with chunks '25,000 examples, 39,712 windows': metrics count documents."""
    docs = len(split.doc_labels)
    return f"{docs:,} examples" + (f", {len(split):,} windows" if len(split) != docs else "")


def validation_metrics(model, split, label_names, *, pad_id, device, precision, batch_size, loss_weight=None) -> dict:
    """The per-epoch validation pass: val_loss, val_accuracy, val_f1, val_precision, val_recall. A multi-label
    model also gets its per-label thresholds tuned here (`thresholds`, saved with the epoch's checkpoints) and
    val_f1_macro; its val_accuracy is subset accuracy and val_f1 micro F1, both at the tuned thresholds."""
    m = evaluate_split(model, split, label_names, pad_id=pad_id, device=device, precision=precision,
                          batch_size=batch_size, loss_weight=loss_weight, progress="validating")
    out = {f"val_{k}": m[k] for k in ("loss", "accuracy", "f1", "precision", "recall")}
    if m.get("multi_label"):
        out.update(val_f1_macro=m["f1_macro"], thresholds=m["thresholds"])
    return out


def write_reports(out_dir: Path, scored: Scored, label_names, texts, normalize: bool, title: str, console,
                  reliability: bool = True) -> None:
    """The report files (artifacts.write) of a scored split, and reliability_diagram.png (raw against calibrated).
    texts: the split's Dataset (its text column read a block of rows at a time) or a list of texts."""
    metrics = scored.metrics
    read = (lambda idx: texts.select(idx)["text"][:]) if hasattr(texts, "select") else texts
    multi = bool(metrics.get("multi_label"))
    rows = scored.rows
    if rows is not None:
        paths = artifacts.write(out_dir, metrics, label_names, read, rows=rows, normalize=normalize, title=title)
        if isinstance(rows, LabelRows):  # (its bins were counted as the blocks came)
            curves = rows.sums.curves() if rows.sums is not None else None
        else:
            curves = {"raw": calibration.reliability_of([(rows.raw.conf, rows.raw.pred == rows.labels)]),
                      "calibrated": calibration.reliability_of([(rows.calibrated.conf, rows.pred == rows.labels)])}
    else:
        y = scored.labels
        paths = artifacts.write(out_dir, metrics, label_names, read, y_true=y, probs=scored.probs(),
                                normalize=normalize, title=title)
        curves = {"raw": calibration.reliability(scored.probs(None), y, True),
                  "calibrated": calibration.reliability(scored.probs(), y, True)}
    if reliability and curves is not None:
        paths["reliability_diagram"] = artifacts.reliability_diagram_png(
            artifacts.report_paths(out_dir)["reliability_diagram"], curves, multi, f"reliability: {title}",
            metrics.get("temperature"))
    if metrics.get("label_sets"):
        paths["label_sets"] = artifacts.label_sets_png(artifacts.report_paths(out_dir)["label_sets"],
                                                       metrics["label_sets"], multi, f"label sets: {title}")
    console.print("reports: " + ", ".join(markup(p) for p in paths.values()), highlight=False)
