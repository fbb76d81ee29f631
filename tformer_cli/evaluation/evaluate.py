"""A model on a tokenized split: the metrics, and the report files. Shared by `train` (validation each epoch,
the test split at the end) and `evaluate`."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..inference import predict_logits
from ..safe_text import markup
from . import artifacts, calibration
from .metrics import compute, compute_multi_label, tune_thresholds


@dataclass
class Scored:
    """A model on a split: its metrics, its probabilities at the temperature asked for (what consumers get), the
    raw ones, and its document logits (N, C), all numpy."""

    metrics: dict
    probs: np.ndarray
    raw_probs: np.ndarray
    logits: np.ndarray


def score_split(model, split, label_names, *, pad_id, device, precision, batch_size, loss_weight=None,
                progress="evaluating", thresholds=None, temperature=None, calibration_metrics: bool = True) -> Scored:
    """The metrics of a model on a tokenized split, its labels decided on the probabilities at `temperature` (the
    checkpoint's; None: raw): a multi-label model's cut at `thresholds` (the checkpoint's, moved to the calibrated
    scale with its temperature), None tunes them on this split (validation does). With calibration_metrics the
    metrics gain ece, brier, nll at the temperature and the raw model's ece_raw, brier_raw, nll_raw."""
    logits, loss = predict_logits(model, split, batch_size=batch_size, pad_id=pad_id, device=device,
                                  precision=precision, loss_weight=loss_weight, progress=progress)
    logits, multi = logits.numpy(), bool(model.cfg.multi_label)
    raw = calibration.probabilities(logits, None, multi)
    probs = calibration.probabilities(logits, temperature, multi) if temperature is not None else raw
    y = split.doc_labels.numpy()
    if multi:
        cuts = thresholds if thresholds is not None else tune_thresholds(y, probs)
        metrics = compute_multi_label(y, probs, cuts, label_names, loss)
    else:
        metrics = compute(y, probs.argmax(-1), label_names, loss)
    if calibration_metrics:
        metrics.update(calibration.metrics(logits, y, multi, temperature))
    return Scored(metrics, probs, raw, logits)


def evaluate_split(model, split, label_names, *, pad_id, device, precision, batch_size, loss_weight=None,
                   progress="evaluating", thresholds=None, temperature=None):
    """(metrics, class probabilities (N, C) as numpy) of a model on a tokenized split, see `score_split`."""
    scored = score_split(model, split, label_names, pad_id=pad_id, device=device, precision=precision,
                         batch_size=batch_size, loss_weight=loss_weight, progress=progress, thresholds=thresholds,
                         temperature=temperature, calibration_metrics=False)
    return scored.metrics, scored.probs


def count(split) -> str:
    """'25,000 examples', or with chunks '25,000 examples, 39,712 windows': metrics count documents."""
    docs = len(split.doc_labels)
    return f"{docs:,} examples" + (f", {len(split):,} windows" if len(split) != docs else "")


def validation_metrics(model, split, label_names, *, pad_id, device, precision, batch_size, loss_weight=None) -> dict:
    """The per-epoch validation pass: val_loss, val_accuracy, val_f1, val_precision, val_recall. A multi-label
    model also gets its per-label thresholds tuned here (`thresholds`, saved with the epoch's checkpoints) and
    val_f1_macro; its val_accuracy is subset accuracy and val_f1 micro F1, both at the tuned thresholds."""
    m, _ = evaluate_split(model, split, label_names, pad_id=pad_id, device=device, precision=precision,
                          batch_size=batch_size, loss_weight=loss_weight, progress="validating")
    out = {f"val_{k}": m[k] for k in ("loss", "accuracy", "f1", "precision", "recall")}
    if m.get("multi_label"):
        out.update(val_f1_macro=m["f1_macro"], thresholds=m["thresholds"])
    return out


def write_reports(out_dir: Path, metrics, label_names, texts, split, probs, normalize: bool, title: str,
                  console, raw_probs=None) -> None:
    """The report files (artifacts.write); with raw_probs, reliability_diagram.png too (raw against `probs`)."""
    paths = artifacts.write(out_dir, metrics, label_names, texts, split.doc_labels.numpy(), probs, normalize=normalize,
                            title=title)
    if raw_probs is not None:
        paths["reliability_diagram"] = artifacts.reliability_diagram_png(
            artifacts.report_paths(out_dir)["reliability_diagram"], raw_probs, probs, split.doc_labels.numpy(),
            bool(metrics.get("multi_label")), f"reliability: {title}", metrics.get("temperature"))
    console.print("reports: " + ", ".join(markup(p) for p in paths.values()), highlight=False)
