"""cleanlab's confident-learning rule for models with many classes, without its class x class matrices.

`cleanlab.filter.find_label_issues` always builds the confident joint, a K x K count matrix, and its pruning
methods several more: at 10,000 classes that is gigabytes (an audit of 40,000 rows peaked at 10.8 GB) for a matrix
that is almost all zeros. Its `confident_learning` filter needs only each row's place in that matrix: a row is a
suspected error when the class the model is confident of (above that class's threshold, the mean probability its
own rows give it) is not its given label, unless the given label is (within 1e-6) the model's top class. That is
computed here a block of rows at a time, with the same thresholds and ties as cleanlab (tested against it), so
`tformer audit` uses it above CLEANLAB_CLASSES classes.
"""
from __future__ import annotations

import numpy as np

CLEANLAB_CLASSES = 2000  # above this many classes the audit flags rows with `confident_learning_issues`
_FUZZ = 1e-6  # cleanlab's FLOATING_POINT_COMPARISON
_LOWEST_THRESHOLD = 2 * _FUZZ  # cleanlab's CONFIDENT_THRESHOLDS_LOWER_BOUND


def thresholds(labels: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Per class, the mean probability the model gives that class on the rows labelled with it (2, never reached,
    for a class no row has), at least _LOWEST_THRESHOLD."""
    k = probs.shape[1]
    own = probs[np.arange(len(labels)), labels].astype(np.float64)
    counts = np.bincount(labels, minlength=k)
    means = np.bincount(labels, weights=own, minlength=k) / np.maximum(counts, 1)
    return np.clip(np.where(counts > 0, means, 2.0), _LOWEST_THRESHOLD, None)


def confident_learning_issues(labels, probs, block_entries: int = 1 << 22) -> np.ndarray:
    """(N,) bool: cleanlab's find_label_issues(filter_by="confident_learning") for (N,) labels and (N, K) probs."""
    labels, probs = np.asarray(labels, dtype=np.int64), np.asarray(probs)
    cut = thresholds(labels, probs) - _FUZZ
    out = np.zeros(len(labels), dtype=bool)
    rows = max(1, block_entries // max(probs.shape[1], 1))
    for start in range(0, len(labels), rows):
        p, y = probs[start:start + rows], labels[start:start + rows]
        confident = p >= cut
        count = confident.sum(axis=1)
        guess = np.where(count > 1, p.argmax(axis=1), confident.argmax(axis=1))
        issue = (count > 0) & (guess != y)
        nudged = p.copy()
        nudged[np.arange(len(y)), y] += _FUZZ  # (cleanlab's _reduce_issues: the given label, if near the top, wins)
        out[start:start + rows] = issue & (nudged.argmax(axis=1) != y)
    return out
