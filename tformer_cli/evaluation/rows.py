"""What evaluation keeps of a single-label model's answers: a few numbers per text, never one per (text, class).

N texts of K classes give N x K logits: 10,000 classes and 100,000 texts make 4 GB of float32, and the probabilities
at two temperatures as much again. The metrics, the calibration figures and the report files need only, per text,
the predicted class, the top probability and the true class's, and the terms of the Brier score and the
log-likelihood, at the checkpoint's temperature and raw. So each block of logits is reduced as the forward pass
yields it (`reduce`), and `Rows` holds those numbers: O(N) memory at any K.

The numbers are computed exactly as `calibration.probabilities` computes probabilities (float64 inside, float32
out): accuracy, ECE and errors.csv read the same values as when every probability was kept.

A multi-label model at known thresholds (test, `tformer evaluate`) is streamed the same way (`LabelRows`): the
split's own labels (one byte a pair) are read, not copied, and what is kept per text is its predicted label set
as bits (C / 8 bytes) and its number of wrong labels; the metrics and the calibration figures are running sums.
Its logits and probabilities (float32, 8 bytes a pair) are never held whole.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import calibration
from .metrics import LabelCounts

BLOCK_ENTRIES = 1 << 22  # logits reduced at a time (32 MB of float64)


@dataclass
class Side:
    """Per text, at one temperature: the predicted class (argmax of the float32 probabilities), the top probability,
    the true class's, the sum of squared probabilities (Brier) and -log p(true class) (from the logits: no log 0)."""

    pred: np.ndarray  # (N,) int64
    conf: np.ndarray  # (N,) float32
    p_true: np.ndarray  # (N,) float32
    sumsq: np.ndarray  # (N,) float64
    nll: np.ndarray  # (N,) float64

    @classmethod
    def empty(cls, n: int) -> "Side":
        return cls(np.zeros(n, np.int64), np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n), np.zeros(n))

    def fill(self, idx: np.ndarray, z: np.ndarray, y: np.ndarray, temperature) -> None:
        """Rows `idx` from their logits z (B, K) float64 and labels y (B,), at `temperature`."""
        s = calibration.scaled(z, temperature)
        top = s.max(axis=1, keepdims=True)
        e = np.exp(s - top)
        total = e.sum(axis=1, keepdims=True)
        p = (e / total).astype(np.float32)  # what calibration.probabilities gives
        rows = np.arange(len(y))
        p64 = p.astype(np.float64)
        self.pred[idx], self.conf[idx], self.p_true[idx] = p.argmax(axis=1), p.max(axis=1), p[rows, y]
        self.sumsq[idx] = np.einsum("ij,ij->i", p64, p64)
        self.nll[idx] = top[:, 0] + np.log(total[:, 0]) - s[rows, y]

    def figures(self, labels: np.ndarray, suffix: str = "") -> dict:
        """ece, brier, nll (with `suffix`), as calibration.metrics computes them from every probability."""
        if not len(labels):
            return {f"{k}{suffix}": float("nan") for k in ("ece", "brier", "nll")}
        return {f"ece{suffix}": calibration.ece_of(self.conf, self.pred == labels),
                f"brier{suffix}": float(np.mean(self.sumsq - 2 * self.p_true.astype(np.float64) + 1)),
                f"nll{suffix}": float(np.mean(self.nll))}


@dataclass
class Rows:
    """A single-label model on N texts: the labels, the calibrated side (at `temperature`) and the raw side (the
    model as trained; the same object when no temperature was fitted)."""

    labels: np.ndarray  # (N,) int64
    calibrated: Side
    raw: Side
    temperature: float | None

    @property
    def pred(self) -> np.ndarray:
        return self.calibrated.pred

    def __len__(self) -> int:
        return len(self.labels)

    def figures(self) -> dict:
        """ece, brier, nll at the temperature, their *_raw twins, and the temperature (calibration.metrics' keys)."""
        return {**self.calibrated.figures(self.labels), **self.raw.figures(self.labels, "_raw"),
                "temperature": self.temperature}


def reduce(blocks, labels, temperature=None) -> Rows:
    """Rows of a model from (document indices, their logits) blocks (inference.logit_blocks) and the documents'
    labels (N,); each block is taken BLOCK_ENTRIES logits at a time."""
    labels = np.asarray(labels, dtype=np.int64)
    calibrated = Side.empty(len(labels))
    raw = calibrated if temperature is None else Side.empty(len(labels))
    for index, logits in blocks:
        index, logits = np.asarray(index, dtype=np.int64), np.asarray(logits)
        step = max(1, BLOCK_ENTRIES // max(logits.shape[1], 1))
        for start in range(0, len(index), step):
            idx, z = index[start:start + step], logits[start:start + step].astype(np.float64)
            calibrated.fill(idx, z, labels[idx], temperature)
            if raw is not calibrated:
                raw.fill(idx, z, labels[idx], None)
    return Rows(labels, calibrated, raw, temperature)


@dataclass
class LabelRows:
    """A multi-label model on N texts at its thresholds, added a block at a time (`add`): the labels (the split's,
    (N, C), not copied), each text's predicted set packed as bits, its number of wrong labels, the metrics' counts
    and (with `sums`) the calibration figures' sums."""

    labels: np.ndarray  # (N, C) 0/1
    cuts: np.ndarray  # (1, C) the thresholds, on the probabilities the blocks are given at
    predicted: np.ndarray  # (N, ceil(C / 8)) uint8: np.packbits of each text's set
    wrong: np.ndarray  # (N,) int32
    counts: LabelCounts
    sums: calibration.Sums | None

    @classmethod
    def start(cls, labels: np.ndarray, thresholds, temperature, calibration_figures: bool = True) -> "LabelRows":
        n, c = labels.shape
        return cls(labels, np.asarray(thresholds, dtype=np.float64)[None, :], np.zeros((n, (c + 7) // 8), np.uint8),
                   np.zeros(n, np.int32), LabelCounts(c),
                   calibration.Sums(True, temperature) if calibration_figures else None)

    def add(self, index: np.ndarray, logits: np.ndarray, probs: np.ndarray) -> None:
        """Documents `index`: their logits and their probabilities at the temperature (B, C)."""
        y = self.labels[index]
        pred = probs >= self.cuts
        self.wrong[index] = self.counts.add(y > 0.5, pred)
        self.predicted[index] = np.packbits(pred, axis=1)
        if self.sums is not None:
            self.sums.add(logits, y, calibrated=probs)

    def pred(self, index) -> np.ndarray:
        """(B, C) bool: the predicted sets of texts `index`."""
        return np.unpackbits(self.predicted[index], axis=1, count=self.labels.shape[1]).astype(bool)
