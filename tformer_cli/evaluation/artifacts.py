"""Files people open after an evaluation: a confusion-matrix PNG, the reliability diagram (calibration.py's numbers
drawn), the per-class report, and the errors (a CSV whose text and label cells go through safe_text.csv_cell: a
spreadsheet shows `=HYPERLINK(...)` as text, never runs it)."""
from __future__ import annotations

import csv
import textwrap
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from ..safe_text import csv_row, mathtext
from ..store.atomic import write_json, write_with
from . import calibration



def save_png(fig, path: Path, dpi: int) -> Path:
    """Lay the figure out, write it atomically as `path`, and free it (pyplot keeps every open figure)."""
    fig.tight_layout()
    try:
        write_with(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))
    finally:
        plt.close(fig)
    return path

def confusion_matrix_png(path: Path, matrix, label_names: list[str], normalize: bool, title: str) -> Path:
    matplotlib.use("Agg")
    label_names = [mathtext(n) for n in label_names]
    title = mathtext(title)
    counts = np.asarray(matrix, dtype=float)
    m = counts
    if normalize:  # each row sums to 1: recall per true class on the diagonal
        m = counts / np.clip(counts.sum(axis=1, keepdims=True), 1, None)
    k = len(label_names)
    size = min(4 + 0.45 * k, 18)
    fig, ax = plt.subplots(figsize=(size, size * 0.85))
    im = ax.imshow(m, cmap="Blues", vmin=0, vmax=1 if normalize else None)
    ax.set_xticks(range(k), labels=label_names, rotation=45 if k > 4 else 0, ha="right" if k > 4 else "center",
                  fontsize=8 if k > 10 else 10)
    ax.set_yticks(range(k), labels=label_names, fontsize=8 if k > 10 else 10)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    full_title = title + (" (rows normalised)" if normalize else "")
    ax.set_title(textwrap.fill(full_title, width=max(30, int(size * 8))), fontsize=10)  # never clipped
    if k <= 25:
        threshold = m.max() / 2 if m.size else 0
        for i in range(k):
            for j in range(k):
                shown = f"{m[i, j]:.2f}\n({int(counts[i, j])})" if normalize else f"{int(m[i, j])}"
                ax.text(j, i, shown, ha="center", va="center",
                        fontsize=7 if k > 10 else 9, color="white" if m[i, j] > threshold else "black")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return save_png(fig, path, dpi=120)


def training_curves_png(path: Path, history: list[dict], best_epoch: int | None = None, metric: str = "",
                        name: str = "") -> Path:
    """Losses and validation scores per epoch (whole-epoch ticks), the best epoch marked on both panels. One plot
    for every task: `metric` prefixes its keys (pretraining's train_mlm_loss: "mlm_"), `name` its legend's words."""
    matplotlib.use("Agg")
    epochs = [h["epoch"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(epochs, [h[f"train_{metric}loss"] for h in history], "o-", label=f"train {name}loss")
    a.plot(epochs, [h[f"val_{metric}loss"] for h in history], "o-", label=f"validation {name}loss")
    a.set_xlabel("epoch")
    b.plot(epochs, [h[f"val_{metric}accuracy"] for h in history], "o-", label=f"validation {name}accuracy")
    if all(f"val_{metric}f1" in h for h in history):  # (classification)
        b.plot(epochs, [h[f"val_{metric}f1"] for h in history], "o-", label=f"validation {name}F1")
    b.set_xlabel("epoch")
    for ax in (a, b):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if best_epoch is not None:
            ax.axvline(best_epoch, color="gray", linestyle="--", linewidth=1, label=f"best (epoch {best_epoch})")
    a.legend()
    b.legend()
    return save_png(fig, path, dpi=110)


def reliability_diagram_png(path: Path, raw_probs, calibrated_probs, labels, multi_label: bool, title: str,
                            temperature=None) -> Path:
    """Accuracy against confidence per bin, before (raw) and after temperature scaling, on the diagonal a
    perfectly calibrated model lies on; below it, bars of how many texts each bin holds (a point of 3 texts
    means little). The ECE of each curve is in its legend."""
    matplotlib.use("Agg")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(5.5, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1, label="perfectly calibrated")
    centres = (np.arange(calibration.ECE_BINS) + 0.5) / calibration.ECE_BINS
    curves = [("raw", raw_probs, "tab:red")]
    if temperature is not None:
        curves.append((f"calibrated (T = {calibration.describe(temperature)})", calibrated_probs, "tab:blue"))
    for i, (name, probs, colour) in enumerate(curves):
        count, conf, acc = calibration.reliability(probs, labels, multi_label)
        filled = count > 0
        top.plot(conf[filled], acc[filled], "o-", color=colour,
                 label=f"{mathtext(name)}: ECE {calibration.ece(probs, labels, multi_label):.3f}")
        width = 0.8 / calibration.ECE_BINS / len(curves)
        bottom.bar(centres + (i - (len(curves) - 1) / 2) * width, count, width=width, color=colour, alpha=0.7)
    what = "probability of each label" if multi_label else "confidence (top-class probability)"
    top.set_ylabel("fraction positive" if multi_label else "accuracy")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.set_title(mathtext(title), fontsize=10)
    top.legend(fontsize=8, loc="upper left")
    bottom.set_xlabel(what)
    bottom.set_ylabel("count")
    return save_png(fig, path, dpi=110)


def report_paths(out_dir: Path) -> dict[str, Path]:
    """The files `write` puts in out_dir (this module owns their names)."""
    return {"confusion_matrix": out_dir / "confusion_matrix.png",
            "classification_report": out_dir / "classification_report.json", "errors": out_dir / "errors.csv",
            "reliability_diagram": out_dir / "reliability_diagram.png"}  # (reliability_diagram_png)


def write(out_dir: Path, metrics: dict, label_names: list[str], texts, y_true, probs, *, normalize: bool,
          title: str) -> dict[str, Path]:
    """confusion_matrix.png, classification_report.json and errors.csv (most confident mistakes first); a
    multi-label model gets the report and its own errors.csv (no confusion matrix: its labels are not exclusive)."""
    paths = {k: v for k, v in report_paths(out_dir).items() if k != "reliability_diagram"}  # (evaluate.py's)
    if metrics.get("multi_label"):
        return _write_multi_label(paths, metrics, label_names, texts, y_true, probs)
    confusion_matrix_png(paths["confusion_matrix"], metrics["confusion_matrix"], label_names, normalize, title)
    write_json(paths["classification_report"], metrics["per_class"])
    probs = np.asarray(probs)
    y_true = np.asarray(y_true)
    pred = probs.argmax(-1)
    confidence = probs.max(-1)
    wrong = np.flatnonzero(pred != y_true)
    wrong = wrong[np.argsort(-confidence[wrong], kind="stable")]
    def errors_csv(tmp: Path) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["index", "text", "true_label", "predicted_label", "confidence", "true_label_probability"])
            for i in wrong:
                w.writerow(csv_row([int(i), texts[int(i)], label_names[y_true[i]], label_names[pred[i]],
                                    f"{confidence[i]:.4f}", f"{probs[i, y_true[i]]:.4f}"]))

    write_with(paths["errors"], errors_csv)
    return paths


def _write_multi_label(paths: dict, metrics: dict, label_names, texts, y_true, probs) -> dict[str, Path]:
    """classification_report.json, and errors.csv: texts whose predicted label set differs from the true one,
    the most wrong labels first."""
    write_json(paths["classification_report"], metrics["per_class"])
    y_true = np.asarray(y_true) > 0.5
    pred = np.asarray(probs) >= np.asarray(metrics["thresholds"])[None, :]
    wrong_count = (y_true != pred).sum(1)
    wrong = np.flatnonzero(wrong_count)
    wrong = wrong[np.argsort(-wrong_count[wrong], kind="stable")]
    names = lambda row: "|".join(n for n, on in zip(label_names, row) if on)

    def errors_csv(tmp: Path) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["index", "text", "true_labels", "predicted_labels", "wrong_labels"])
            for i in wrong:
                w.writerow(csv_row([int(i), texts[int(i)], names(y_true[i]), names(pred[i]), int(wrong_count[i])]))

    write_with(paths["errors"], errors_csv)
    return {k: v for k, v in paths.items() if k != "confusion_matrix"}
