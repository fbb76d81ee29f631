"""Optimizers (a registry: one function per name) and the embedding freeze switch.

Parameter groups are decided by what a parameter *is*, not by its name: matrices of linear layers decay;
biases, LayerNorm gains (anything 1-D) and embedding tables (nn.Embedding) do not. The token table has its own
group (learning-rate multiplier, no weight decay). Freezing only flips `requires_grad`: a frozen parameter gets
no gradient, so the optimizer skips it and the other parameters' Adam moments and step counts carry on
untouched when it is unfrozen.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..errors import ConfigError
from ..registry import registrar
from .config import OptimizerConfig

# name -> builder(param_groups, config, extra kwargs such as fused=True) -> optimizer
OPTIMIZERS: dict[str, Callable[[list[dict], OptimizerConfig, dict], torch.optim.Optimizer]] = {}

register = registrar(OPTIMIZERS)


@register("adamw")
def adamw(groups, cfg: OptimizerConfig, fused: dict) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.option("betas")), eps=float(cfg.option("eps")),
                             **fused)


@register("adam")
def adam(groups, cfg: OptimizerConfig, fused: dict) -> torch.optim.Optimizer:
    return torch.optim.Adam(groups, lr=cfg.lr, betas=tuple(cfg.option("betas")), eps=float(cfg.option("eps")),
                            **fused)


@register("sgd")
def sgd(groups, cfg: OptimizerConfig, fused: dict) -> torch.optim.Optimizer:
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=float(cfg.option("momentum")),
                           nesterov=bool(cfg.option("nesterov")))


def param_groups(model: nn.Module, lr: float, weight_decay: float, embedding_lr_multiplier: float) -> list[dict]:
    token_table = getattr(model, "token_embedding", None)
    token_table = token_table.weight if token_table is not None else None
    no_decay_ids = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    embedding, decay, no_decay = [], [], []
    for p in model.parameters():
        if p is token_table:
            embedding.append(p)
        elif p.ndim < 2 or id(p) in no_decay_ids:
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [
        {"name": "decay", "params": decay, "weight_decay": weight_decay, "lr": lr},
        {"name": "no_decay", "params": no_decay, "weight_decay": 0.0, "lr": lr},
        {"name": "embedding", "params": embedding, "weight_decay": 0.0, "lr": lr * embedding_lr_multiplier},
    ]
    return [g for g in groups if g["params"]]


def build(model: nn.Module, cfg: OptimizerConfig, embedding_lr_multiplier: float,
          device: torch.device) -> torch.optim.Optimizer:
    builder = OPTIMIZERS.get(cfg.name)
    if builder is None:
        raise ConfigError(f"optimizer.name={cfg.name!r} is not one of {', '.join(sorted(OPTIMIZERS))}")
    groups = param_groups(model, cfg.lr, cfg.weight_decay, embedding_lr_multiplier)
    # One fused kernel for the whole update (CUDA, and CPU since torch 2.4) instead of a loop over tensors.
    fused = {"fused": True} if device.type in ("cuda", "cpu") else {}
    return builder(groups, cfg, fused)


def set_embedding_frozen(model: nn.Module, frozen: bool) -> None:
    model.token_embedding.weight.requires_grad_(not frozen)
