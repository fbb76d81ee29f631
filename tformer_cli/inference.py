"""Batched forward passes over a tokenized split: class probabilities per document, in the split's order.
A document read as several windows (long_text=chunks) gets the softmax of its windows' mean logits (a
multi-label model: the sigmoid of each label's mean logit)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .console import progress as progress_bar
from .data.batching import BatchLoader
from .data.tokenization import TokenizedSplit


def predict_proba(model, split: TokenizedSplit, *, batch_size: int, pad_id: int, device: torch.device,
                  precision, loss_weight: torch.Tensor | None = None, progress: str | None = None):
    """(probs (documents, C) float32 on CPU, mean cross-entropy over documents): the raw model's (temperature
    scaling, evaluation/calibration.py, works on `predict_logits`)."""
    logits, loss = predict_logits(model, split, batch_size=batch_size, pad_id=pad_id, device=device,
                                  precision=precision, loss_weight=loss_weight, progress=progress)
    return (logits.sigmoid() if model.cfg.multi_label else logits.softmax(-1)), loss


@torch.inference_mode()
def predict_logits(model, split: TokenizedSplit, *, batch_size: int, pad_id: int, device: torch.device,
                   precision, loss_weight: torch.Tensor | None = None, progress: str | None = None):
    """(document logits (documents, C) float32 on CPU, mean cross-entropy over documents). Logits, not
    probabilities, for calibration: an overconfident model's small probabilities underflow to 0 in float32, and
    log(0) would lose what a temperature needs."""
    model.eval()
    logits_all = torch.empty(len(split), model.cfg.num_classes)
    loader = BatchLoader(split, batch_size, pad_id, shuffle=False, pin_memory=device.type == "cuda")
    bar = None
    if progress:
        # counted in tokens, not batches: batches go longest first, so by batches the first minutes of a
        # long-document test set promised twice the time it took (IMDB at 512 tokens: 57 min said, 29 taken)
        bar = progress_bar(total=int(split.lengths.sum()), desc=progress, unit="token", unit_scale=True)
    try:
        for batch in loader:
            ids = batch["input_ids"].to(device, non_blocking=True)
            mask = batch["attention_mask"].to(device, non_blocking=True)
            with precision.autocast():
                logits_all[batch["index"]] = model(ids, mask).float().cpu()
            if bar is not None:
                bar.update(int(batch["attention_mask"].sum()))  # the host copy: no wait on the device
    finally:  # an error or Ctrl-C mid-pass must not leave a half-drawn bar above its message
        if bar is not None:
            bar.close()
    logits = document_logits(logits_all, split.docs)
    if model.cfg.multi_label:  # per label: sigmoid, binary cross-entropy averaged over documents and labels
        targets = split.doc_labels  # (unlabelled texts, as predict passes them, have no targets: no loss)
        labelled = len(logits) and targets.shape == logits.shape
        loss = F.binary_cross_entropy_with_logits(logits, targets.float()) if labelled else 0.0
        return logits, float(loss)
    weight = None if loss_weight is None else loss_weight.cpu()
    loss = F.cross_entropy(logits, split.doc_labels, weight=weight, reduction="sum") / max(len(logits), 1)
    return logits, float(loss)


def document_logits(logits: torch.Tensor, docs: torch.Tensor | None) -> torch.Tensor:
    """(sequences, C) -> (documents, C): the mean of each document's windows (identity with one per document)."""
    if docs is None:
        return logits
    n_docs = int(docs.max()) + 1 if len(docs) else 0
    total = torch.zeros(n_docs, logits.shape[1]).index_add_(0, docs, logits)
    return total / torch.bincount(docs, minlength=n_docs).clamp(min=1).unsqueeze(1).to(logits.dtype)
