"""Batched forward passes over a tokenized split: class probabilities per document, in the split's order.
A document read as several windows (long_text=chunks) gets the softmax of its windows' mean logits (a
multi-label model: the sigmoid of each label's mean logit)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import cores
from .console import progress as progress_bar
from .data.batching import BatchLoader
from .data.tokenization import TokenizedSplit
from .model.fast_paths import Layout


def predict_proba(model, split: TokenizedSplit, *, batch_size: int, pad_id: int, device: torch.device,
                  precision, loss_weight: torch.Tensor | None = None, progress: str | None = None):
    """(probs (documents, C) float32 on CPU, mean cross-entropy over documents): the raw model's (temperature
    scaling, evaluation/calibration.py, works on `predict_logits`)."""
    logits, loss = predict_logits(model, split, batch_size=batch_size, pad_id=pad_id, device=device,
                                  precision=precision, loss_weight=loss_weight, progress=progress)
    return (logits.sigmoid() if model.cfg.multi_label else logits.softmax(-1)), loss


def predict_logits(model, split: TokenizedSplit, *, batch_size: int, pad_id: int, device: torch.device,
                   precision, loss_weight: torch.Tensor | None = None, progress: str | None = None):
    """(document logits (documents, C) float32 on CPU, mean cross-entropy over documents). Logits, not
    probabilities, for calibration: an overconfident model's small probabilities underflow to 0 in float32, and
    log(0) would lose what a temperature needs. Holds documents x classes numbers: scoring a split with many
    classes goes through `logit_blocks` (evaluation/rows.py keeps a few numbers per text)."""
    logits, multi, total = torch.empty(split.n_docs, model.cfg.num_classes), bool(model.cfg.multi_label), 0.0
    labels = split.doc_labels  # (built on each read where texts are windows: read once)
    for index, block in logit_blocks(model, split, batch_size=batch_size, pad_id=pad_id, device=device,
                                     precision=precision, progress=progress):
        logits[index] = block
        total += loss_of(block, labels[index], multi, loss_weight, reduction="sum")  # (no whole-split copies)
    return logits, total / max(logits.numel() if multi else len(logits), 1)


def weighted_bce(logits: torch.Tensor, targets: torch.Tensor, pos_weight: torch.Tensor | None = None,
                 reduction: str = "mean") -> torch.Tensor:
    """Binary cross-entropy with each label's positives weighted by pos_weight, and the logits moved by
    log(pos_weight) inside the loss (logit adjustment, Menon et al. 2021): weighting alone would move the best
    logit of a label by +log(weight), so its probabilities would read too high and no temperature could undo it;
    adjusted, the rare labels' positives still weigh more in the gradient and the model's own sigmoids stay
    probabilities."""
    if pos_weight is None:
        return F.binary_cross_entropy_with_logits(logits, targets, reduction=reduction)
    return F.binary_cross_entropy_with_logits(logits + pos_weight.log(), targets, pos_weight=pos_weight,
                                              reduction=reduction)


def loss_of(logits: torch.Tensor, targets: torch.Tensor, multi_label: bool, loss_weight=None,
            reduction: str = "mean") -> float:
    """The validation loss of document logits: mean cross-entropy (class-weighted sum over documents divided by
    their number), or for a multi-label model binary cross-entropy averaged over documents and labels. Unlabelled
    texts (predict passes none) have no loss: 0. reduction="sum": the sum, for losses taken block by block."""
    if multi_label:
        labelled = len(logits) and targets.shape == logits.shape
        if not labelled:
            return 0.0
        weight = None if loss_weight is None else loss_weight.to(logits.device)  # (the loss trained on)
        loss = weighted_bce(logits.float(), targets.float(), weight, reduction="sum")
        return float(loss) if reduction == "sum" else float(loss) / max(logits.numel(), 1)
    weight = None if loss_weight is None else loss_weight.cpu()
    loss = float(F.cross_entropy(logits, targets, weight=weight, reduction="sum"))
    return loss if reduction == "sum" else loss / max(len(logits), 1)


@torch.inference_mode()
def logit_blocks(model, split: TokenizedSplit, *, batch_size: int, pad_id: int, device: torch.device, precision,
                 progress: str | None = None, with_features: bool = False):
    """(document indices (B,) int64, their logits (B, C) float32 on CPU) for every document of the split, a batch
    at a time in the order batches run (longest first). Documents read as several windows (long_text=chunks) are
    summed window by window into a (documents, C) table, whose means come out at the end. with_features: each row
    is the logits followed by the pooled vector the head read, (B, C + D) (a distillation teacher's, to match)."""
    model.eval()
    loader = BatchLoader(split, batch_size, pad_id, shuffle=False, pin_memory=device.type == "cuda")
    windows = split.docs is not None
    width = model.cfg.num_classes + (model.cfg.d_model if with_features else 0)
    total = torch.zeros(split.n_docs, width) if windows else None
    bar = None
    if progress:
        # counted in tokens, not batches: batches go longest first, so by batches the first minutes of a
        # long-document test set promised twice the time it took (IMDB at 512 tokens: 57 min said, 29 taken)
        bar = progress_bar(total=int(split.lengths.sum()), desc=progress, unit="token", unit_scale=True)
    try:
        for batch in loader:
            ids = batch["input_ids"].to(device, non_blocking=True)
            mask = batch["attention_mask"].to(device, non_blocking=True)
            layout = Layout.of(batch["attention_mask"], device)  # decided on the host: no wait on the device
            with precision.autocast():
                if with_features:
                    logits = torch.cat(model(ids, mask, layout=layout, with_features=True), 1).float().cpu()
                else:
                    logits = model(ids, mask, layout=layout).float().cpu()
            if bar is not None:
                bar.update(int(batch["attention_mask"].sum()))  # the host copy: no wait on the device
            cores.rebalance()
            if windows:
                total.index_add_(0, split.docs[batch["index"]], logits)
            else:
                yield batch["index"], logits
    finally:  # an error or Ctrl-C mid-pass must not leave a half-drawn bar above its message
        if bar is not None:
            bar.close()
    if windows:
        mean = total / torch.bincount(split.docs, minlength=split.n_docs).clamp(min=1).unsqueeze(1).to(total.dtype)
        for start in range(0, split.n_docs, batch_size):
            yield torch.arange(start, min(start + batch_size, split.n_docs)), mean[start:start + batch_size]


def document_logits(logits: torch.Tensor, docs: torch.Tensor | None) -> torch.Tensor:
    """(sequences, C) -> (documents, C): the mean of each document's windows (identity with one per document)."""
    if docs is None:
        return logits
    n_docs = int(docs.max()) + 1 if len(docs) else 0
    total = torch.zeros(n_docs, logits.shape[1]).index_add_(0, docs, logits)
    return total / torch.bincount(docs, minlength=n_docs).clamp(min=1).unsqueeze(1).to(logits.dtype)
