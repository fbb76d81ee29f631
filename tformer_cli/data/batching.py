"""Length-grouped batches with dynamic padding, so short texts do not pay for long ones."""
from __future__ import annotations

import torch

from .tokenization import TokenizedSplit


def length_grouped_batches(lengths: torch.Tensor, batch_size: int, generator: torch.Generator,
                           bucket_batches: int = 50) -> list[torch.Tensor]:
    """Shuffle, cut into buckets of `bucket_batches` batches, sort each bucket by length, batch, shuffle batches.

    Batches hold texts of similar length (little padding) while the order stays random from epoch to epoch.
    """
    n = lengths.shape[0]
    order = torch.randperm(n, generator=generator)
    bucket = batch_size * bucket_batches
    batches = []
    for start in range(0, n, bucket):
        idx = order[start:start + bucket]
        idx = idx[torch.argsort(lengths[idx], descending=True, stable=True)]
        batches.extend(idx.split(batch_size))
    perm = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in perm]


def sequential_batches(lengths: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """Evaluation order: sorted by length (least padding); callers scatter results back by index."""
    idx = torch.argsort(lengths, descending=True, stable=True)
    return list(idx.split(batch_size))


def collate(split: TokenizedSplit, idx: torch.Tensor, pad_id: int, multiple: int = 1,
            cap: int | None = None) -> dict[str, torch.Tensor]:
    """Pad the sequences at `idx` to the longest among them, rounded up to `multiple` (but not past `cap`,
    the longest sequence of the split, so never past the model's max_len):
    input_ids (B, T) int64, attention_mask (B, T) bool.

    Rounding keeps the number of distinct shapes small: each new shape costs the CPU's oneDNN kernels a cached
    primitive (memory that grows with every new length in bf16) and CUDA kernels a new launch configuration.
    """
    starts = split.offsets[idx]
    lengths = split.offsets[idx + 1] - starts
    T = int(lengths.max())
    T = max(T, min(-(-T // multiple) * multiple, cap if cap is not None else T))
    # Gather with one vectorised index: position j of row b reads values[start_b + j] where j < length_b.
    pos = torch.arange(T).unsqueeze(0)  # (1, T)
    mask = pos < lengths.unsqueeze(1)  # (B, T)
    gather = (starts.unsqueeze(1) + pos).clamp(max=max(split.values.shape[0] - 1, 0))
    ids = torch.where(mask, split.values[gather].long(), torch.full_like(gather, pad_id))
    labels = split.labels[idx]
    if labels.dtype == torch.uint8:  # (multi-label: the split's one-byte multi-hot rows, as the loss's float targets)
        labels = labels.float()
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "index": idx}


class BatchLoader:
    """An iterable of padded batches; a DataLoader over batch indices when workers help (large data)."""

    def __init__(self, split: TokenizedSplit, batch_size: int, pad_id: int, shuffle: bool, seed: int = 0,
                 num_workers: int = 0, pin_memory: bool = False, pad_multiple: int = 16):
        self.split, self.batch_size, self.pad_id, self.pad_multiple = split, batch_size, pad_id, pad_multiple
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.cap = int(split.lengths.max()) if len(split) else 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self) -> list[torch.Tensor]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            return length_grouped_batches(self.split.lengths, self.batch_size, g)
        return sequential_batches(self.split.lengths, self.batch_size)

    def __len__(self) -> int:
        return (len(self.split) + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        return self.iterate(self.batches())

    def iterate(self, batches: list[torch.Tensor]):
        """Padded batches for the given index lists (a resumed epoch passes the ones not yet done)."""
        if self.num_workers > 0:
            loader = torch.utils.data.DataLoader(
                batches, batch_size=None, shuffle=False, num_workers=self.num_workers,
                collate_fn=lambda idx: collate(self.split, idx, self.pad_id, self.pad_multiple, self.cap), pin_memory=self.pin_memory,
                persistent_workers=False)
            yield from loader
            return
        for idx in batches:
            batch = collate(self.split, idx, self.pad_id, self.pad_multiple, self.cap)
            if self.pin_memory:
                batch = {k: v.pin_memory() for k, v in batch.items()}
            yield batch
