"""Optimizer construction and the embedding freeze switch.

The pretrained token table has its own parameter group (learning-rate multiplier, no weight decay). Freezing
only flips `requires_grad`: a frozen parameter gets no gradient, so the optimizer skips it and the other
parameters' Adam moments and step counts carry on untouched when it is unfrozen.
"""
from __future__ import annotations

import torch

from ..errors import TformerError


def param_groups(model, lr: float, weight_decay: float, embedding_lr_multiplier: float) -> list[dict]:
    embedding, decay, no_decay = [], [], []
    for name, p in model.named_parameters():
        if name == "token_embedding.weight":
            embedding.append(p)
        elif p.ndim < 2 or "norm" in name or "position_embedding" in name:
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [
        {"name": "decay", "params": decay, "weight_decay": weight_decay, "lr": lr},
        {"name": "no_decay", "params": no_decay, "weight_decay": 0.0, "lr": lr},
        {"name": "embedding", "params": embedding, "weight_decay": 0.0, "lr": lr * embedding_lr_multiplier},
    ]
    return [g for g in groups if g["params"]]


def build(model, cfg, embedding_lr_multiplier: float, device: torch.device) -> torch.optim.Optimizer:
    name, lr, wd = str(cfg.name), float(cfg.lr), float(cfg.get("weight_decay", 0.0))
    groups = param_groups(model, lr, wd, embedding_lr_multiplier)
    # One fused kernel for the whole update (CUDA, and CPU since torch 2.4) instead of a loop over tensors.
    fused = {"fused": True} if device.type in ("cuda", "cpu") else {}
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(cfg.betas), eps=float(cfg.eps), **fused)
    if name == "adam":
        return torch.optim.Adam(groups, lr=lr, betas=tuple(cfg.betas), eps=float(cfg.eps), **fused)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=float(cfg.get("momentum", 0.0)),
                               nesterov=bool(cfg.get("nesterov", False)))
    raise TformerError(f"optimizer.name={name} is not one of adamw, adam, sgd")


def set_embedding_frozen(model, frozen: bool) -> None:
    model.token_embedding.weight.requires_grad_(not frozen)
