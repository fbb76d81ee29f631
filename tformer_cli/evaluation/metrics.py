"""Classification metrics (scikit-learn): binary averaging for two classes, macro otherwise."""
from __future__ import annotations

import numpy as np


def compute(y_true, y_pred, label_names: list[str], loss: float | None = None) -> dict:
    from sklearn.metrics import accuracy_score, classification_report, confusion_matrix, precision_recall_fscore_support

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
