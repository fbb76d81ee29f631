"""Files people open after an evaluation: a confusion-matrix PNG, the per-class report, and the errors."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np


def confusion_matrix_png(path: Path, matrix, label_names: list[str], normalize: bool, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..safe_text import mathtext

    label_names = [mathtext(n) for n in label_names]
    title = mathtext(title)
    m = np.asarray(matrix, dtype=float)
    if normalize:  # each row sums to 1: recall per true class on the diagonal
        m = m / np.clip(m.sum(axis=1, keepdims=True), 1, None)
    k = len(label_names)
    size = min(4 + 0.45 * k, 18)
    fig, ax = plt.subplots(figsize=(size, size * 0.85))
    im = ax.imshow(m, cmap="Blues", vmin=0, vmax=1 if normalize else None)
    ax.set_xticks(range(k), labels=label_names, rotation=45 if k > 4 else 0, ha="right" if k > 4 else "center",
                  fontsize=8 if k > 10 else 10)
    ax.set_yticks(range(k), labels=label_names, fontsize=8 if k > 10 else 10)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title + (" (rows normalised)" if normalize else ""))
    if k <= 25:
        threshold = m.max() / 2 if m.size else 0
        for i in range(k):
            for j in range(k):
                ax.text(j, i, f"{m[i, j]:.2f}" if normalize else f"{int(m[i, j])}", ha="center", va="center",
                        fontsize=7 if k > 10 else 9, color="white" if m[i, j] > threshold else "black")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def training_curves_png(path: Path, history: list[dict]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(epochs, [h["train_loss"] for h in history], "o-", label="train loss")
    a.plot(epochs, [h["val_loss"] for h in history], "o-", label="validation loss")
    a.set_xlabel("epoch")
    a.legend()
    b.plot(epochs, [h["val_accuracy"] for h in history], "o-", label="validation accuracy")
    b.plot(epochs, [h["val_f1"] for h in history], "o-", label="validation F1")
    b.set_xlabel("epoch")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report_paths(out_dir: Path) -> dict[str, Path]:
    """The files `write` puts in out_dir (this module owns their names)."""
    return {"confusion_matrix": out_dir / "confusion_matrix.png",
            "classification_report": out_dir / "classification_report.json", "errors": out_dir / "errors.csv"}


def write(out_dir: Path, metrics: dict, label_names: list[str], texts, y_true, probs, *, normalize: bool,
          title: str) -> dict[str, Path]:
    """confusion_matrix.png, classification_report.json and errors.csv (most confident mistakes first)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = report_paths(out_dir)
    confusion_matrix_png(paths["confusion_matrix"], metrics["confusion_matrix"], label_names, normalize, title)
    paths["classification_report"].write_text(json.dumps(metrics["per_class"], indent=2))
    probs = np.asarray(probs)
    y_true = np.asarray(y_true)
    pred = probs.argmax(-1)
    confidence = probs.max(-1)
    wrong = np.flatnonzero(pred != y_true)
    wrong = wrong[np.argsort(-confidence[wrong], kind="stable")]
    with open(paths["errors"], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["index", "text", "true_label", "predicted_label", "confidence", "true_label_probability"])
        for i in wrong:
            w.writerow([int(i), texts[int(i)], label_names[y_true[i]], label_names[pred[i]], f"{confidence[i]:.4f}",
                        f"{probs[i, y_true[i]]:.4f}"])
    return paths
