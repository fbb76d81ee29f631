"""A model on a tokenized split: the metrics, and the report files. Shared by `train` (validation each epoch,
the test split at the end) and `evaluate`."""
from __future__ import annotations

from pathlib import Path

from ..inference import predict_proba
from ..safe_text import markup
from . import artifacts
from .metrics import compute, compute_multi_label, tune_thresholds


def evaluate_split(model, split, label_names, *, pad_id, device, precision, batch_size, loss_weight=None,
                   progress="evaluating", thresholds=None):
    """(metrics, class probabilities (N, C) as numpy) of a model on a tokenized split. A multi-label model's
    labels are cut at `thresholds` (the checkpoint's); None tunes them on this split (validation does)."""
    probs, loss = predict_proba(model, split, batch_size=batch_size, pad_id=pad_id, device=device,
                                precision=precision, loss_weight=loss_weight, progress=progress)
    if model.cfg.multi_label:
        y = split.doc_labels.numpy()
        cuts = thresholds if thresholds is not None else tune_thresholds(y, probs.numpy())
        return compute_multi_label(y, probs.numpy(), cuts, label_names, loss), probs.numpy()
    return compute(split.doc_labels.numpy(), probs.argmax(-1).numpy(), label_names, loss), probs.numpy()


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
                  console) -> None:
    paths = artifacts.write(out_dir, metrics, label_names, texts, split.doc_labels.numpy(), probs, normalize=normalize,
                            title=title)
    console.print("reports: " + ", ".join(markup(p) for p in paths.values()), highlight=False)
