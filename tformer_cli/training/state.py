"""Everything a resumed run needs beyond the weights, split into tensors (safetensors) and JSON.

`TrainingState` is where the loop is (epoch, step, batches done in the epoch, the epoch's running loss), what
it has learnt about itself (history, best metrics, early stopping, whether the embeddings are frozen) and the
random number generators of Python, NumPy and torch (CPU and CUDA). The optimizer, LR schedule and gradient
scaler are saved beside it by `Optimization.state_dict()`. The batch order needs no state: it is a pure function
of (seed, epoch), so a resumed epoch replays the same batches and skips those already done.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import torch

from .early_stopping import EarlyStopping


@dataclass
class TrainingState:
    stopper: EarlyStopping
    epoch: int = 0  # 0-based index of the epoch in progress (= epochs finished, at an epoch boundary)
    batches_done: int = 0  # batches of that epoch already trained
    step: int = 0  # optimizer steps taken in the whole run
    epoch_loss_sum: float = 0.0  # sum of per-sample losses so far in the epoch
    epoch_seen: int = 0  # samples so far in the epoch
    epoch_seconds: float = 0.0  # training time of the epoch so far, summed over resumes (not the time between)
    epoch_untimed: int = 0  # samples of the epoch trained before resuming from a checkpoint that saved no time
    best_metrics: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    embeddings_frozen: bool = False

    def start_epoch(self) -> None:
        """Called at an epoch boundary: the next epoch starts from its first batch."""
        self.epoch, self.batches_done, self.epoch_loss_sum, self.epoch_seen = self.epoch + 1, 0, 0.0, 0
        self.epoch_seconds, self.epoch_untimed = 0.0, 0

    def samples_per_s(self) -> float:
        """The epoch's training rate: its samples over its training time, however many resumes it took."""
        return (self.epoch_seen - self.epoch_untimed) / max(self.epoch_seconds, 1e-9)

    def state_dict(self) -> tuple[dict, dict]:
        """(tensors, JSON) of this state, RNGs included; the JSON keys are those of the saved training state."""
        tensors, rng = rng_state()
        return tensors, {"epoch_index": self.epoch, "batches_done": self.batches_done, "step": self.step,
                         "epoch_loss_sum": self.epoch_loss_sum, "epoch_seen": self.epoch_seen,
                         "epoch_seconds": self.epoch_seconds, "epoch_untimed": self.epoch_untimed, "rng": rng,
                         "early_stopping": self.stopper.state_dict(), "best_metrics": self.best_metrics,
                         "history": self.history, "embeddings_frozen": self.embeddings_frozen}

    def load_state_dict(self, tensors: dict, state: dict) -> None:
        self.epoch, self.batches_done, self.step = int(state["epoch_index"]), int(state["batches_done"]), int(state["step"])
        self.epoch_loss_sum, self.epoch_seen = float(state["epoch_loss_sum"]), int(state["epoch_seen"])
        self.epoch_seconds = float(state.get("epoch_seconds", 0.0))
        self.epoch_untimed = int(state.get("epoch_untimed", 0 if "epoch_seconds" in state else self.epoch_seen))
        self.stopper.load_state_dict(state["early_stopping"])
        self.best_metrics, self.history = dict(state["best_metrics"]), list(state["history"])
        self.embeddings_frozen = bool(state.get("embeddings_frozen", False))
        set_rng_state(tensors, state["rng"])


def rng_state() -> tuple[dict, dict]:
    py = random.getstate()
    np_state = np.random.get_state()
    tensors = {"rng.torch": torch.get_rng_state(), "rng.numpy": torch.from_numpy(np_state[1].astype(np.int64))}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    meta = {"python": [py[0], list(py[1]), py[2]], "numpy": [np_state[0], int(np_state[2]), int(np_state[3]),
                                                             float(np_state[4])]}
    return tensors, meta


def set_rng_state(tensors: dict, meta: dict) -> None:
    py = meta["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    name, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((name, tensors["rng.numpy"].numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["rng.torch"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for key, value in st.items():
            if torch.is_tensor(value):
                tensors[f"optimizer.{idx}.{key}"] = value
            else:
                scalars[f"{idx}.{key}"] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def load_optimizer_state(optimizer: torch.optim.Optimizer, tensors: dict, meta: dict) -> None:
    state: dict = {}
    for key, value in tensors.items():
        if key.startswith("optimizer."):
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = value
    for key, value in meta["scalars"].items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})
