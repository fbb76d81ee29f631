"""Classification metrics (scikit-learn): binary averaging for two classes, macro otherwise."""
from __future__ import annotations

import numpy as np
from sklearn.metrics import (accuracy_score, classification_report, confusion_matrix, f1_score, hamming_loss,
                             precision_recall_fscore_support)


def compute(y_true, y_pred, label_names: list[str], loss: float | None = None) -> dict:
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    k = len(label_names)
    average = "binary" if k == 2 else "macro"
    precision, recall, f1, _ = precision_recall_fscore_support(
        y_true, y_pred, average=average, labels=list(range(k)) if k != 2 else None, zero_division=0)
    out = {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "precision": float(precision),
        "recall": float(recall),
        "f1": float(f1),
        "average": average,
        "n": int(len(y_true)),
        "confusion_matrix": confusion_matrix(y_true, y_pred, labels=list(range(k))).tolist(),
        "per_class": classification_report(y_true, y_pred, labels=list(range(k)), target_names=label_names,
                                           output_dict=True, zero_division=0),
    }
    if loss is not None:
        out["loss"] = float(loss)
    return out


THRESHOLD_GRID = np.round(np.arange(0.05, 0.951, 0.05), 2)


def tune_thresholds(y_true, probs) -> list[float]:
    """Per label, the probability cut (0.05 .. 0.95) that maximises that label's F1 on these examples; ties go to
    the cut nearest 0.5, and a label with no positive example here keeps 0.5. Tuned on validation, stored in the
    checkpoint, applied unchanged to test and predictions."""
    y_true, probs = np.asarray(y_true) > 0.5, np.asarray(probs)
    out = []
    for c in range(probs.shape[1]):
        if not y_true[:, c].any():
            out.append(0.5)
            continue
        scores = [f1_score(y_true[:, c], probs[:, c] >= t, zero_division=0) for t in THRESHOLD_GRID]
        best = max(range(len(THRESHOLD_GRID)), key=lambda i: (round(scores[i], 12), -abs(THRESHOLD_GRID[i] - 0.5)))
        out.append(float(THRESHOLD_GRID[best]))
    return out


def compute_multi_label(y_true, probs, thresholds, label_names: list[str], loss: float | None = None) -> dict:
    """Multi-label metrics: subset accuracy (every label of a text right) as `accuracy`, micro-averaged
    precision/recall/F1 as the headline (`average: micro`), macro F1, Hamming loss, and the per-label report."""
    y_true = (np.asarray(y_true) > 0.5).astype(int)
    pred = (np.asarray(probs) >= np.asarray(thresholds)[None, :]).astype(int)
    labels = list(range(len(label_names)))
    p, r, f1, _ = precision_recall_fscore_support(y_true, pred, average="micro", labels=labels, zero_division=0)
    pm, rm, f1m, _ = precision_recall_fscore_support(y_true, pred, average="macro", labels=labels, zero_division=0)
    out = {"accuracy": float(accuracy_score(y_true, pred)), "precision": float(p), "recall": float(r),
           "f1": float(f1), "average": "micro", "f1_macro": float(f1m), "precision_macro": float(pm),
           "recall_macro": float(rm), "hamming_loss": float(hamming_loss(y_true, pred)), "n": int(len(y_true)),
           "multi_label": True, "thresholds": [float(t) for t in thresholds],
           "per_class": classification_report(y_true, pred, labels=labels, target_names=label_names,
                                              output_dict=True, zero_division=0)}
    if loss is not None:
        out["loss"] = float(loss)
    return out
