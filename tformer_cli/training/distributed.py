"""Data-parallel training with the standard engine: `torchrun --nproc_per_node=N -m tformer_cli train ...` (or
`tformer train trainer.devices=N`, which starts torchrun itself) runs one process per device under
DistributedDataParallel.

What each rank does (loop.py reads this top to bottom):
  - the same seeded length-grouped global batches on every rank; rank r trains rows r, r+N, r+2N, ... of each, so
    every rank takes the same number of steps and no sample is seen twice in an epoch (a global batch with fewer
    rows than ranks is dropped: at most N-1 samples an epoch);
  - each rank's loss is weighted by its share of the global batch, so DDP's gradient average is the gradient of
    the global batch's mean loss: the same step a single process takes on the same batch;
  - every rank validates on the whole validation split (the models are identical, so are the metrics and every
    early-stopping decision: no broadcast needed); train loss and throughput are summed across ranks;
  - rank 0 alone writes: checkpoints, logs, metrics, reports. The others run in a throwaway directory (launch.py);
  - a stop (Ctrl-C, SIGTERM) seen by any rank is agreed on by all at the next step, so all stop after the same
    step and rank 0 saves `last`: the run resumes with resume=<run dir> like any other.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def from_env() -> Dist:
    """The process's place in a torchrun launch (RANK, WORLD_SIZE, LOCAL_RANK), or a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return Dist()
    return Dist(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))


def init(dist: Dist, device: torch.device) -> torch.device:
    """Join the process group (NCCL on CUDA, gloo on the CPU); on CUDA each local rank takes its own GPU."""
    import torch.distributed as td

    if device.type == "cuda":
        torch.cuda.set_device(dist.local_rank)
        device = torch.device("cuda", dist.local_rank)
    if not td.is_initialized():  # (on GPUs, gloo too: the tokenizer broadcast is of CPU tensors)
        td.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo")
    return device


def shutdown() -> None:
    import torch.distributed as td

    if td.is_available() and td.is_initialized():
        td.destroy_process_group()


def wrap(model: torch.nn.Module, dist: Dist, device: torch.device) -> torch.nn.Module:
    """The model under DDP (built again whenever parameters are frozen or unfrozen: DDP registers its gradient
    hooks for the parameters that require gradients when it is built)."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def shard(batches: list[torch.Tensor], dist: Dist) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(this rank's rows, the whole global batch) of each global batch that has a row for every rank."""
    return [(b[dist.rank::dist.world], b) for b in batches if len(b) >= dist.world]


def all_sum(values: list[float], device: torch.device) -> list[float]:
    import torch.distributed as td

    t = torch.tensor(values, dtype=torch.float64, device=device)
    td.all_reduce(t)
    return t.tolist()


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when it is True on one (a stop request, agreed on at a step boundary)."""
    import torch.distributed as td

    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    td.all_reduce(t, op=td.ReduceOp.MAX)
    return bool(t.item())


def same_tokenizer(tok, max_len: int):
    """Rank 0's tokenizer on every rank (as JSON bytes in a tensor: nothing pickled); unchanged outside DDP."""
    import torch.distributed as td

    if not (td.is_available() and td.is_initialized()) or td.get_world_size() == 1:
        return tok
    from tokenizers import Tokenizer

    from ..data.tokenization import configure

    data = tok.to_str().encode() if td.get_rank() == 0 else b""
    size = torch.tensor([len(data)], dtype=torch.int64)
    td.broadcast(size, src=0)
    buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(int(size), dtype=torch.uint8)
    td.broadcast(buffer, src=0)
    return tok if td.get_rank() == 0 else configure(Tokenizer.from_str(bytes(buffer.tolist()).decode()), max_len)
