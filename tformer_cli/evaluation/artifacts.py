"""Files people open after an evaluation: a confusion-matrix PNG, the reliability diagram (calibration.py's numbers
drawn), the per-class report, and the errors (a CSV whose text and label cells go through safe_text.csv_cell: a
spreadsheet shows `=HYPERLINK(...)` as text, never runs it)."""
from __future__ import annotations

import csv
import logging
import textwrap
from pathlib import Path

import numpy as np

from ..safe_text import csv_row, mathtext
from ..store.atomic import write_json, write_with
from . import calibration



def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, imported when a figure is drawn: half a second that a
    run (or an error) which draws nothing does not pay. Its INFO lines (the first run's "generated new
    fontManager") are not the run's news: under Hydra's logging they would print as [HYDRA] lines."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: Path, dpi: int) -> Path:
    """Lay the figure out, write it atomically as `path`, and free it (pyplot keeps every open figure)."""
    fig.tight_layout()
    try:
        write_with(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))
    finally:
        pyplot().close(fig)
    return path

def confusion_matrix_png(path: Path, metrics: dict, label_names: list[str], normalize: bool, title: str) -> Path:
    """The whole matrix up to metrics.DENSE_CONFUSION_CLASSES classes; above, a readable view of the classes most
    often confused (PNG_CLASSES of them, from the metrics' top confusions): their counts among themselves, the
    diagonal their correct texts, rows normalised by each class's whole support."""
    k_all = len(label_names)
    if metrics.get("confusion_matrix") is not None:
        counts, shown, support = np.asarray(metrics["confusion_matrix"], dtype=float), list(label_names), None
    else:
        counts, shown, support = _confused_view(metrics, label_names)
        title = f"{title}: the {len(shown)} classes most often confused, of {k_all:,}"
    label_names = [mathtext(n) for n in shown]
    title = mathtext(title)
    m = counts
    if normalize:  # each row sums to 1: recall per true class on the diagonal
        rows = counts.sum(axis=1, keepdims=True) if support is None else support[:, None]
        m = counts / np.clip(rows, 1, None)
    k = len(label_names)
    size = min(4 + 0.45 * k, 18)
    fig, ax = pyplot().subplots(figsize=(size, size * 0.85))
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
                value = f"{m[i, j]:.2f}\n({int(counts[i, j])})" if normalize else f"{int(m[i, j])}"
                ax.text(j, i, value, ha="center", va="center",
                        fontsize=7 if k > 10 else 9, color="white" if m[i, j] > threshold else "black")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return save_png(fig, path, dpi=120)


PNG_CLASSES = 30  # classes in the confusion PNG of a model with more than metrics.DENSE_CONFUSION_CLASSES


def _confused_view(metrics: dict, label_names: list[str]):
    """(counts among the PNG_CLASSES classes most involved in the top confusions, their names, their supports)."""
    index = {n: i for i, n in enumerate(label_names)}
    involved: dict[int, int] = {}
    for t, p, c in metrics.get("top_confusions", []):
        for name in (t, p):
            involved[index[name]] = involved.get(index[name], 0) + int(c)
    chosen = sorted(involved, key=lambda i: (-involved[i], i))[:PNG_CLASSES] or list(range(min(PNG_CLASSES,
                                                                                                len(label_names))))
    chosen.sort()
    at = {c: j for j, c in enumerate(chosen)}
    counts = np.zeros((len(chosen), len(chosen)))
    for t, p, c in metrics.get("top_confusions", []):
        if index[t] in at and index[p] in at:
            counts[at[index[t]], at[index[p]]] = c
    per_class = metrics.get("per_class", {})
    support = np.array([float(per_class.get(label_names[c], {}).get("support", 0)) for c in chosen])
    for j, c in enumerate(chosen):  # right answers: recall x support
        counts[j, j] = round(float(per_class.get(label_names[c], {}).get("recall", 0)) * support[j])
    return counts, [label_names[c] for c in chosen], support


def training_curves_png(path: Path, history: list[dict], best_epoch: int | None = None, metric: str = "",
                        name: str = "") -> Path:
    """Losses and validation scores per epoch (whole-epoch ticks), the best epoch marked on both panels. One plot
    for every task: `metric` prefixes its keys (pretraining's train_mlm_loss: "mlm_"), `name` its legend's words."""
    from matplotlib import ticker

    epochs = [h["epoch"] for h in history]
    fig, (a, b) = pyplot().subplots(1, 2, figsize=(10, 4))
    a.plot(epochs, [h[f"train_{metric}loss"] for h in history], "o-", label=f"train {name}loss")
    a.plot(epochs, [h[f"val_{metric}loss"] for h in history], "o-", label=f"validation {name}loss")
    a.set_xlabel("epoch")
    b.plot(epochs, [h[f"val_{metric}accuracy"] for h in history], "o-", label=f"validation {name}accuracy")
    if all(f"val_{metric}f1" in h for h in history):  # (classification)
        b.plot(epochs, [h[f"val_{metric}f1"] for h in history], "o-", label=f"validation {name}F1")
    b.set_xlabel("epoch")
    for ax in (a, b):
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        if best_epoch is not None:
            ax.axvline(best_epoch, color="gray", linestyle="--", linewidth=1, label=f"best (epoch {best_epoch})")
    a.legend()
    b.legend()
    return save_png(fig, path, dpi=110)


def reliability_diagram_png(path: Path, curves: dict, multi_label: bool, title: str, temperature=None) -> Path:
    """Accuracy against confidence per bin, before (raw) and after temperature scaling, on the diagonal a
    perfectly calibrated model lies on; below it, bars of how many texts each bin holds (a point of 3 texts
    means little). The ECE of each curve is in its legend. curves: {"raw": bins, "calibrated": bins} with bins
    calibration.reliability's (count, mean confidence, accuracy); calibrated only when a temperature was fitted."""
    fig, (top, bottom) = pyplot().subplots(2, 1, figsize=(5.5, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1, label="perfectly calibrated")
    centres = (np.arange(calibration.ECE_BINS) + 0.5) / calibration.ECE_BINS
    shown = [("raw", curves["raw"], "tab:red")]
    if temperature is not None:
        shown.append((f"calibrated (T = {calibration.describe(temperature)})", curves["calibrated"], "tab:blue"))
    for i, (name, (count, conf, acc), colour) in enumerate(shown):
        filled = count > 0
        top.plot(conf[filled], acc[filled], "o-", color=colour,
                 label=f"{mathtext(name)}: ECE {calibration.ece_from_bins(count, conf, acc):.3f}")
        width = 0.8 / calibration.ECE_BINS / len(shown)
        bottom.bar(centres + (i - (len(shown) - 1) / 2) * width, count, width=width, color=colour, alpha=0.7)
    what = "probability of each label" if multi_label else "confidence (top-class probability)"
    top.set_ylabel("fraction positive" if multi_label else "accuracy")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.set_title(mathtext(title), fontsize=10)
    top.legend(fontsize=8, loc="upper left")
    bottom.set_xlabel(what)
    bottom.set_ylabel("count")
    return save_png(fig, path, dpi=110)


def label_sets_png(path: Path, label_sets: dict, multi_label: bool, title: str) -> Path:
    """Conformal label sets (evaluation/conformal.py) against the level asked for: the coverage measured on this
    split beside the diagonal it is promised to reach and the range it falls in on texts drawn like the
    calibration texts, and the mean set size."""
    levels = np.array([float(k) for k in label_sets])
    coverage = np.array([v["coverage"] for v in label_sets.values()])
    size = np.array([v["mean_set_size"] for v in label_sets.values()])
    fig, (top, bottom) = pyplot().subplots(2, 1, figsize=(5.5, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    top.plot(levels, levels, linestyle="--", color="gray", linewidth=1, label="promised (the level)")
    ranges = [v.get("expected") for v in label_sets.values()]
    if all(r is not None for r in ranges):  # (where texts drawn like the calibration texts land, 95% of the time)
        low, high = np.array(ranges, dtype=float).T
        top.fill_between(levels, low, high, color="gray", alpha=0.2, linewidth=0, label="expected range (95%)")
    top.plot(levels, coverage, "o-", color="tab:blue", markersize=3,
             label="true labels in the set (share)" if multi_label else "texts whose set holds the true label")
    top.set_ylabel("coverage")
    top.set_title(mathtext(title), fontsize=10)
    top.legend(fontsize=8, loc="upper left")
    bottom.plot(levels, size, "o-", color="tab:green", markersize=3)
    bottom.set_xlabel("level asked for (predict --coverage)")
    bottom.set_ylabel("mean set size (labels)")
    return save_png(fig, path, dpi=110)


def report_paths(out_dir: Path) -> dict[str, Path]:
    """The files `write` puts in out_dir (this module owns their names)."""
    return {"confusion_matrix": out_dir / "confusion_matrix.png",
            "classification_report": out_dir / "classification_report.json", "errors": out_dir / "errors.csv",
            "reliability_diagram": out_dir / "reliability_diagram.png",  # (reliability_diagram_png)
            "label_sets": out_dir / "label_sets.png"}  # (label_sets_png)


ERRORS_MAX_ROWS = 100_000  # errors.csv keeps the most confident (or most wrong) of this many mistakes
TEXT_BLOCK = 10_000  # texts fetched from the split at a time for errors.csv


def write(out_dir: Path, metrics: dict, label_names: list[str], texts, *, rows=None, y_true=None, probs=None,
          normalize: bool, title: str) -> dict[str, Path]:
    """confusion_matrix.png, classification_report.json and errors.csv (most confident mistakes first) of a
    single-label model's `rows` (evaluation/rows.py); a multi-label model (its `rows`, rows.LabelRows, or y_true and
    probs, (N, C)) gets the report and its own errors.csv (no confusion matrix: its labels are not exclusive).
    texts: the split's texts, as a list or a function from row indices to their texts (read a block at a time)."""
    paths = {k: v for k, v in report_paths(out_dir).items()
             if k not in ("reliability_diagram", "label_sets")}  # (evaluate.py's)
    write_json(paths["classification_report"], metrics["per_class"], open_levels=1)  # (a class a line)
    if metrics.get("multi_label"):
        return _write_multi_label(paths, metrics, label_names, texts, rows, y_true, probs)
    confusion_matrix_png(paths["confusion_matrix"], metrics, label_names, normalize, title)
    wrong = np.flatnonzero(rows.pred != rows.labels)
    wrong = wrong[np.argsort(-rows.calibrated.conf[wrong], kind="stable")][:ERRORS_MAX_ROWS]

    def lines(block):
        for i, text in zip(block, _texts(texts, block)):
            yield [int(i), text, label_names[rows.labels[i]], label_names[rows.pred[i]],
                   f"{rows.calibrated.conf[i]:.4f}", f"{rows.calibrated.p_true[i]:.4f}"]

    _errors_csv(paths["errors"], ["index", "text", "true_label", "predicted_label", "confidence",
                                  "true_label_probability"], wrong, lines)
    return paths


def _texts(texts, idx: np.ndarray) -> list[str]:
    return texts(idx) if callable(texts) else [texts[int(i)] for i in idx]


def _errors_csv(path: Path, header: list[str], wrong: np.ndarray, lines) -> None:
    """errors.csv: the header, then `lines(block)` for each block of TEXT_BLOCK wrong rows (cells made safe for a
    spreadsheet by safe_text.csv_row)."""
    def csv_file(tmp: Path) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(header)
            for start in range(0, len(wrong), TEXT_BLOCK):
                w.writerows(csv_row(line) for line in lines(wrong[start:start + TEXT_BLOCK]))

    write_with(path, csv_file)


def _write_multi_label(paths: dict, metrics: dict, label_names, texts, rows, y_true, probs) -> dict[str, Path]:
    """errors.csv: texts whose predicted label set differs from the true one, the most wrong labels first."""
    if rows is not None:  # (streamed: the sets kept as bits)
        y_true, wrong_count, predicted = rows.labels, rows.wrong, rows.pred
    else:
        pred = np.asarray(probs) >= np.asarray(metrics["thresholds"])[None, :]
        wrong_count = ((np.asarray(y_true) > 0.5) != pred).sum(1)
        predicted = pred.__getitem__
    wrong = np.flatnonzero(wrong_count)
    wrong = wrong[np.argsort(-wrong_count[wrong], kind="stable")][:ERRORS_MAX_ROWS]
    names = lambda row: "|".join(label_names[j] for j in np.flatnonzero(row))

    def lines(block):
        true, pred = np.asarray(y_true[block]) > 0.5, predicted(block)
        for k, (i, text) in enumerate(zip(block, _texts(texts, block))):
            yield [int(i), text, names(true[k]), names(pred[k]), int(wrong_count[i])]

    _errors_csv(paths["errors"], ["index", "text", "true_labels", "predicted_labels", "wrong_labels"], wrong, lines)
    return {k: v for k, v in paths.items() if k != "confusion_matrix"}
