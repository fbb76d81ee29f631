"""Everything a resumed run needs beyond the weights, split into tensors (safetensors) and JSON.

Optimizer moments, the LR schedule, the gradient scaler, early-stopping state, the epoch/step position and the
random number generators of Python, NumPy and torch (CPU and CUDA). The batch order needs no state: it is a
pure function of (seed, epoch), so a resumed epoch replays the same batches and skips those already done.
"""
from __future__ import annotations

import random

import numpy as np
import torch


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
