"""A model on a tokenized split: the metrics, and the report files. Shared by `train` (validation each epoch,
the test split at the end) and `evaluate`."""
from __future__ import annotations

from pathlib import Path

from ..inference import predict_proba


def evaluate_split(model, split, label_names, *, pad_id, device, precision, batch_size, loss_weight=None,
                   progress="evaluating"):
    """(metrics, class probabilities (N, C) as numpy) of a model on a tokenized split."""
    from .metrics import compute

    probs, loss = predict_proba(model, split, batch_size=batch_size, pad_id=pad_id, device=device,
                                precision=precision, loss_weight=loss_weight, progress=progress)
    return compute(split.doc_labels.numpy(), probs.argmax(-1).numpy(), label_names, loss), probs.numpy()


def validation_metrics(model, split, label_names, *, pad_id, device, precision, batch_size, loss_weight=None) -> dict:
    """The per-epoch validation pass: val_loss, val_accuracy, val_f1, val_precision, val_recall."""
    m, _ = evaluate_split(model, split, label_names, pad_id=pad_id, device=device, precision=precision,
                          batch_size=batch_size, loss_weight=loss_weight, progress="validating")
    return {f"val_{k}": m[k] for k in ("loss", "accuracy", "f1", "precision", "recall")}


def write_reports(out_dir: Path, metrics, label_names, texts, split, probs, normalize: bool, title: str,
                  console) -> None:
    from . import artifacts

    paths = artifacts.write(out_dir, metrics, label_names, texts, split.doc_labels.numpy(), probs, normalize=normalize,
                            title=title)
    console.print("reports: " + ", ".join(str(p) for p in paths.values()), highlight=False)
