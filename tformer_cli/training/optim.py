"""Optimizers (a registry: one function per name), parameter groups and the freeze switch.

Parameter groups are decided by what a parameter *is*, not by its name: matrices of linear layers decay;
biases, LayerNorm gains (anything 1-D) and embedding tables (nn.Embedding) do not. The token table has its own
group (learning-rate multiplier, no weight decay). With layer-wise decay d < 1, a parameter of layer l (0 = the
embeddings, top = the head; `model.layers()`) gets lr * d^(top - l): lower pretrained layers move less.
Freezing only flips `requires_grad`: a frozen parameter gets no gradient, so the optimizer skips it and the
other parameters' Adam moments and step counts carry on untouched when it is unfrozen.
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


def _layer_scales(model: nn.Module, layer_decay: float) -> dict[int, int]:
    """id(parameter) -> its distance from the top layer (0 for everything when there is no layer decay)."""
    if layer_decay == 1.0 or not hasattr(model, "layers"):
        return {}
    layers = model.layers()
    return {id(p): len(layers) - 1 - depth for depth, modules in enumerate(layers) for m in modules
            for p in m.parameters()}


def param_groups(model: nn.Module, lr: float, weight_decay: float, embedding_lr_multiplier: float,
                 layer_decay: float = 1.0) -> list[dict]:
    token_table = getattr(model, "token_embedding", None)
    token_table = token_table.weight if token_table is not None else None
    no_decay_ids = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    below_top = _layer_scales(model, layer_decay)
    groups: dict[tuple[str, int], dict] = {}
    for p in model.parameters():
        kind = "embedding" if p is token_table else "no_decay" if p.ndim < 2 or id(p) in no_decay_ids else "decay"
        depth = below_top.get(id(p), 0)
        if (kind, depth) not in groups:
            group_lr = lr * layer_decay ** depth * (embedding_lr_multiplier if kind == "embedding" else 1.0)
            groups[kind, depth] = {"name": kind if not below_top else f"{kind}.{depth}", "params": [],
                                   "weight_decay": weight_decay if kind == "decay" else 0.0, "lr": group_lr}
        groups[kind, depth]["params"].append(p)
    order = {"decay": 0, "no_decay": 1, "embedding": 2}
    return [groups[k] for k in sorted(groups, key=lambda k: (order[k[0]], -k[1]))]


def build(model: nn.Module, cfg: OptimizerConfig, embedding_lr_multiplier: float, device: torch.device,
          layer_decay: float = 1.0) -> torch.optim.Optimizer:
    builder = OPTIMIZERS.get(cfg.name)
    if builder is None:
        raise ConfigError(f"optimizer.name={cfg.name!r} is not one of {', '.join(sorted(OPTIMIZERS))}")
    if not 0.0 < layer_decay <= 1.0:
        raise ConfigError(f"model.layer_lr_decay={layer_decay} must be in (0, 1]")
    groups = param_groups(model, cfg.lr, cfg.weight_decay, embedding_lr_multiplier, layer_decay)
    # One fused kernel for the whole update (CUDA, and CPU since torch 2.4) instead of a loop over tensors.
    fused = {"fused": True} if device.type in ("cuda", "cpu") else {}
    return builder(groups, cfg, fused)


def set_embedding_frozen(model: nn.Module, frozen: bool, layers: int = 0) -> None:
    """Freeze (or unfreeze) the token table; with layers = N > 0 also every embedding parameter and the lowest
    N encoder blocks."""
    model.token_embedding.weight.requires_grad_(not frozen)
    if layers > 0:
        for modules in model.layers()[: layers + 1]:
            for m in modules:
                m.requires_grad_(not frozen)
