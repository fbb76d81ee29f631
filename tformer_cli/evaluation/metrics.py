"""Classification metrics: binary averaging for two classes, macro otherwise, micro for multi-label (scikit-learn's
definitions and output, tested against it; counted here with numpy, so `tformer train` starts without importing
scikit-learn and SciPy, a second of every start, and a multi-label split is counted a block of rows at a time
instead of through scikit-learn's copies of it).

Everything here grows with texts plus classes, never with their product's square: up to DENSE_CONFUSION_CLASSES
classes the whole confusion matrix is kept (`confusion_matrix`, K x K counts), above that only its most frequent
off-diagonal cells (`top_confusions`: [true name, predicted name, count], at most TOP_CONFUSIONS of them): a dense
10,000-class matrix is 100 million counts (901 MB as JSON) that no one reads. Per-class precision, recall, F1 and
support stay complete (`per_class`, one entry per class).
"""
from __future__ import annotations

import numpy as np

DENSE_CONFUSION_CLASSES = 50  # up to this many classes the whole matrix is kept (2,500 counts)
TOP_CONFUSIONS = 1000  # above it, the most frequent (true, predicted) mistakes


def compute(y_true, y_pred, label_names: list[str], loss: float | None = None) -> dict:
    y_true, y_pred = np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)
    k = len(label_names)
    average = "binary" if k == 2 else "macro"
    report = classification_report(y_true, y_pred, label_names)
    chosen = report[label_names[1]] if k == 2 else report["macro avg"]  # (binary: the second class is positive)
    out = {
        "accuracy": report["accuracy"],
        "precision": chosen["precision"],
        "recall": chosen["recall"],
        "f1": chosen["f1-score"],
        "average": average,
        "n": int(len(y_true)),
        **confusions(y_true, y_pred, label_names),
        "per_class": report,
    }
    if loss is not None:
        out["loss"] = float(loss)
    return out


def _divide(numerator, denominator) -> np.ndarray:
    """numerator / denominator as float64, 0 where the denominator is 0 (scikit-learn's zero_division=0)."""
    numerator, denominator = np.asarray(numerator, dtype=np.float64), np.asarray(denominator, dtype=np.float64)
    return np.divide(numerator, denominator, out=np.zeros_like(numerator), where=denominator != 0)


def classification_report(y_true: np.ndarray, y_pred: np.ndarray, label_names: list[str]) -> dict:
    """scikit-learn's classification_report(output_dict=True, zero_division=0) of class ids 0..K-1: per class
    precision, recall, f1-score and support, then accuracy, macro avg and weighted avg; counted in O(texts +
    classes)."""
    k = len(label_names)
    support = np.bincount(y_true, minlength=k)[:k]
    predicted = np.bincount(y_pred, minlength=k)[:k]
    tp = np.bincount(y_true[y_true == y_pred], minlength=k)[:k]
    report = _per_label(label_names, tp, predicted, support)
    report["accuracy"] = float(np.mean(y_true == y_pred)) if len(y_true) else 0.0
    return {**report, **_averages(report, label_names)}


def _per_label(label_names: list[str], tp, predicted, support) -> dict:
    """classification_report's row of each class (or label) from its counts."""
    precision, recall, f1 = _divide(tp, predicted), _divide(tp, support), _divide(2 * tp, support + predicted)
    return {name: {"precision": float(p), "recall": float(r), "f1-score": float(f), "support": float(n)}
            for name, p, r, f, n in zip(label_names, precision, recall, f1, support)}


def _averages(report: dict, label_names: list[str]) -> dict:
    """classification_report's macro avg and weighted avg (by support) of the rows of `label_names`."""
    rows = [report[name] for name in label_names]
    support = np.array([row["support"] for row in rows])
    total = float(support.sum())
    out = {}
    for average, weights in (("macro avg", None), ("weighted avg", support)):
        out[average] = {metric: float(np.average([row[metric] for row in rows], weights=weights))
                        if rows and (weights is None or total) else 0.0
                        for metric in ("precision", "recall", "f1-score")}
        out[average]["support"] = total
    return out


def confusions(y_true, y_pred, label_names: list[str]) -> dict:
    """{'confusion_matrix': K x K counts} for up to DENSE_CONFUSION_CLASSES classes; else {'top_confusions': the
    most frequent [true, predicted, count] mistakes (names), 'confusion_pairs': how many distinct (true, predicted)
    pairs were confused, 'errors': how many texts were wrong}. Built from the pairs that occur: O(texts + classes)."""
    y_true, y_pred, k = np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64), len(label_names)
    if k <= DENSE_CONFUSION_CLASSES:
        cells = np.bincount(y_true * k + y_pred, minlength=k * k).reshape(k, k)
        return {"confusion_matrix": cells.tolist()}
    wrong = y_true != y_pred
    pairs, counts = np.unique(y_true[wrong] * k + y_pred[wrong], return_counts=True)
    order = np.lexsort((pairs, -counts))[:TOP_CONFUSIONS]  # most frequent first; ties by (true, predicted) id
    top = [[label_names[int(p) // k], label_names[int(p) % k], int(c)] for p, c in zip(pairs[order], counts[order])]
    return {"top_confusions": top, "confusion_pairs": int(len(pairs)), "errors": int(wrong.sum())}


def top_confusions(metrics: dict, label_names: list[str]) -> list[tuple[int, int, int]]:
    """(true id, predicted id, count) of the mistakes, most frequent first, from either form `confusions` wrote."""
    if metrics.get("confusion_matrix") is not None:
        m = np.asarray(metrics["confusion_matrix"], dtype=np.int64)
        np.fill_diagonal(m, 0)
        t, p = np.nonzero(m)
        order = np.lexsort((p, t, -m[t, p]))
        return [(int(t[i]), int(p[i]), int(m[t[i], p[i]])) for i in order]
    index = {name: i for i, name in enumerate(label_names)}
    return [(index[t], index[p], int(c)) for t, p, c in metrics.get("top_confusions", [])]


THRESHOLD_GRID = np.round(np.arange(0.05, 0.951, 0.05), 2)
# the grid in the order ties are settled: nearest 0.5 first, then the lower cut
_TIE_ORDER = np.array(sorted(range(len(THRESHOLD_GRID)), key=lambda i: (abs(THRESHOLD_GRID[i] - 0.5), i)))


def tune_thresholds(y_true, probs, block_entries: int = 1 << 22) -> list[float]:
    """Per label, the probability cut (0.05 .. 0.95) that maximises that label's F1 on these examples; ties go to
    the cut nearest 0.5, and a label with no positive example here keeps 0.5. Tuned on validation, stored in the
    checkpoint, applied unchanged to test and predictions. Counted for every label at once, a block of rows at a
    time (10,000 labels: 19 passes over the probabilities, not 190,000 F1 calls)."""
    y_true, probs = np.asarray(y_true), np.asarray(probs)
    rows = max(1, block_entries // max(probs.shape[1], 1))
    tp = np.zeros((len(THRESHOLD_GRID), probs.shape[1]), dtype=np.int64)
    predicted = np.zeros_like(tp)
    positives = np.zeros(probs.shape[1], dtype=np.int64)  # (labels,)
    for start in range(0, len(probs), rows):
        p, y = probs[start:start + rows], y_true[start:start + rows] > 0.5
        positives += y.sum(axis=0)
        for i, cut in enumerate(THRESHOLD_GRID):
            above = p >= cut
            tp[i] += (above & y).sum(axis=0)
            predicted[i] += above.sum(axis=0)
    denominator = predicted + positives  # 2 tp + fp + fn
    f1 = np.where(denominator > 0, 2 * tp / np.maximum(denominator, 1), 0.0)  # (sklearn's F1, zero_division 0)
    scores = np.round(f1, 12)[_TIE_ORDER]  # (cuts in tie order, labels): argmax takes the first best
    best = THRESHOLD_GRID[_TIE_ORDER[scores.argmax(axis=0)]]
    return [float(t) if positives[c] else 0.5 for c, t in enumerate(best)]


def compute_multi_label(y_true, probs, thresholds, label_names: list[str], loss: float | None = None,
                        block_entries: int = 1 << 22) -> dict:
    """Multi-label metrics: subset accuracy (every label of a text right) as `accuracy`, micro-averaged
    precision/recall/F1 as the headline (`average: micro`), macro F1, Hamming loss, and the per-label report
    (`multi_label_report`: scikit-learn's, with its samples average). Counted a block of rows at a time
    (`LabelCounts`): besides the arrays given, memory holds per-label counts, never another texts x labels array."""
    y_all, p_all = np.asarray(y_true), np.asarray(probs)
    cuts = np.asarray(thresholds, dtype=np.float64)[None, :]
    counts = LabelCounts(len(label_names))
    rows = max(1, block_entries // max(len(label_names), 1))
    for start in range(0, len(y_all), rows):
        counts.add(y_all[start:start + rows] > 0.5, p_all[start:start + rows] >= cuts)
    return counts.metrics(thresholds, label_names, loss)


class LabelCounts:
    """What a multi-label model's metrics count, added a block of texts at a time (true and predicted label sets,
    (B, C) bool): per label tp, fp, fn; texts entirely right; wrong (text, label) pairs; the per-text precision,
    recall and F1 summed. A split streamed through it is never held as texts x labels."""

    def __init__(self, labels: int):
        self.tp, self.fp, self.fn = (np.zeros(labels, np.int64) for _ in range(3))
        self.n, self.exact, self.wrong, self.samples = 0, 0, 0, np.zeros(3)

    def add(self, y: np.ndarray, pred: np.ndarray) -> np.ndarray:
        """Counts a block in; returns each text's number of wrong labels (errors.csv ranks by it)."""
        hit = y & pred
        self.tp += hit.sum(axis=0)
        self.fp += (pred & ~y).sum(axis=0)
        self.fn += (y & ~pred).sum(axis=0)
        differ = (y != pred).sum(axis=1)
        self.n += len(y)
        self.exact += int((differ == 0).sum())
        self.wrong += int(differ.sum())
        tp, predicted, true = hit.sum(axis=1), pred.sum(axis=1), y.sum(axis=1)
        self.samples += [_divide(tp, predicted).sum(), _divide(tp, true).sum(),
                         _divide(2 * tp, predicted + true).sum()]
        return differ

    def metrics(self, thresholds, label_names: list[str], loss: float | None = None) -> dict:
        n, k = self.n, len(label_names)
        report = multi_label_report(self.tp, self.fp, self.fn, self.samples / max(n, 1), label_names)
        micro, macro = report["micro avg"], report["macro avg"]
        out = {"accuracy": self.exact / n if n else 0.0, "precision": micro["precision"], "recall": micro["recall"],
               "f1": micro["f1-score"], "average": "micro", "f1_macro": macro["f1-score"],
               "precision_macro": macro["precision"], "recall_macro": macro["recall"],
               "hamming_loss": self.wrong / (n * k) if n and k else 0.0, "n": int(n), "multi_label": True,
               "thresholds": [float(t) for t in thresholds], "per_class": report}
        if loss is not None:
            out["loss"] = float(loss)
        return out


def multi_label_report(tp, fp, fn, samples, label_names: list[str]) -> dict:
    """scikit-learn's classification_report(output_dict=True, zero_division=0) of a multi-label indicator matrix,
    from per-label counts and the per-text averages `samples` (precision, recall, F1): per label, then micro,
    macro, weighted and samples averages."""
    support, predicted = tp + fn, tp + fp
    report = _per_label(label_names, tp, predicted, support)
    total, t = float(support.sum()), int(tp.sum())
    report["micro avg"] = {"precision": float(_divide(t, predicted.sum())), "recall": float(_divide(t, total)),
                           "f1-score": float(_divide(2 * t, total + predicted.sum())), "support": total}
    report.update(_averages(report, label_names))
    report["samples avg"] = {"precision": float(samples[0]), "recall": float(samples[1]),
                             "f1-score": float(samples[2]), "support": total}
    return report
