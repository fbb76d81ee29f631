"""Tensor files read in place: a safetensors file's tensors memory-mapped (file pages of the page cache, which the
kernel drops when it needs the memory and reads again, rather than the process's own memory), and shards of rows
read as one table. A distillation's teacher logits are texts x classes numbers (a million texts of 5,000 classes: 20
GB); held in process memory they would bound the data a student can learn from by RAM, where mapped they are read a
batch of rows at a time.

The file format is safetensors' own (an 8-byte little-endian header length, a JSON header of each tensor's dtype,
shape and byte offsets, then the bytes): the header is parsed here as JSON, nothing is unpickled."""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
          "I32": torch.int32}  # (safetensors' names)
MAX_HEADER = 100_000_000  # safetensors' own limit on a header, in bytes


def mapped_safetensors(path: str | Path, names=None) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file (those of `names`; None: all), as views of one private memory map of the
    file (torch.from_file: no file descriptor is held, so a cache of thousands of shards stays under the open-file
    limit; never written back). ValueError for a file that is not whole safetensors of the dtypes above (the
    caller computes it again)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            (length,) = struct.unpack("<Q", head) if len(head) == 8 else (size,)
            if length > min(MAX_HEADER, size - 8):
                raise ValueError(f"a header of {length} bytes")
            header = json.loads(f.read(length))
        start, wanted = 8 + length, None if names is None else set(names)
        raw = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
        out = {}
        for name, info in header.items():
            if name == "__metadata__" or (wanted is not None and name not in wanted):
                continue
            dtype, shape = DTYPES[info["dtype"]], tuple(int(n) for n in info["shape"])
            begin, end = (int(n) for n in info["data_offsets"])
            if min(shape, default=0) < 0 or end - begin != math.prod(shape) * dtype.itemsize or start + end > size:
                raise ValueError(f"{name}'s bytes do not match its shape")
            if (start + begin) % dtype.itemsize:
                raise ValueError(f"{name} is not aligned")
            out[name] = raw[start + begin:start + end].view(dtype).reshape(shape)
    except (KeyError, TypeError, AttributeError, OverflowError, RecursionError, RuntimeError,
            UnicodeDecodeError, json.JSONDecodeError) as exc:  # (a damaged header, whatever it holds)
        raise ValueError(f"{path} is not whole safetensors: {type(exc).__name__}") from None
    except ValueError as exc:
        raise ValueError(f"{path} is not whole safetensors: {exc}") from None
    return out


class ShardedRows:
    """Shards of `shard_rows` rows each (the last one may be shorter) read as one (rows, width) table: `table[index]`
    gathers the rows of an index tensor from the shards that hold them, in the index's order, as a new tensor."""

    def __init__(self, shards: list[torch.Tensor], shard_rows: int, width: int, dtype: torch.dtype):
        self.shards, self.shard_rows, self.dtype = shards, shard_rows, dtype
        self.shape = torch.Size((sum(len(s) for s in shards), width))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index) -> torch.Tensor:
        index = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        if len(index) and (int(index.min()) < 0 or int(index.max()) >= len(self)):
            raise IndexError(f"row index out of range for {len(self)} rows")
        which, at = index // self.shard_rows, index % self.shard_rows
        out = torch.empty((len(index), self.shape[1]), dtype=self.dtype)
        for k in torch.unique(which).tolist():
            chosen = which == k
            out[chosen] = self.shards[k][at[chosen]].to(self.dtype)
        return out
