"""Batched forward passes over a tokenized split: class probabilities in the split's original order."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .data.batching import BatchLoader
from .data.tokenization import TokenizedSplit


@torch.inference_mode()
def predict_proba(model, split: TokenizedSplit, *, batch_size: int, pad_id: int, device: torch.device,
                  precision, loss_weight: torch.Tensor | None = None, progress: str | None = None):
    """(probs (N, C) float32 on CPU, mean cross-entropy or None when the split has no labels)."""
    model.eval()
    n = len(split)
    probs = torch.empty(n, model.cfg.num_classes)
    loss_sum = torch.zeros((), device=device)
    loader = BatchLoader(split, batch_size, pad_id, shuffle=False, pin_memory=device.type == "cuda")
    iterator = loader
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(loader, desc=progress, leave=False, unit="batch", dynamic_ncols=True, disable=None)
    for batch in iterator:
        ids = batch["input_ids"].to(device, non_blocking=True)
        mask = batch["attention_mask"].to(device, non_blocking=True)
        labels = batch["labels"].to(device, non_blocking=True)
        with precision.autocast():
            logits = model(ids, mask).float()
        loss_sum += F.cross_entropy(logits, labels, weight=loss_weight, reduction="sum")
        probs[batch["index"]] = logits.softmax(-1).cpu()
    return probs, float(loss_sum) / max(n, 1)
