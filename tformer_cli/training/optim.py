"""Optimizers (a registry: one function per name), parameter groups and the freeze switch.

Parameter groups are decided by what a parameter *is*, not by its name: matrices of linear layers decay;
biases, LayerNorm gains (anything 1-D) and embedding tables (nn.Embedding) do not. The token table has its own
group (learning-rate multiplier, no weight decay). With layer-wise decay d < 1, a parameter of layer l (0 = the
embeddings, top = the head; `model.layers()`) gets lr * d^(top - l): lower pretrained layers move less.
Freezing only flips `requires_grad`: a frozen parameter gets no gradient, so the optimizer skips it and the
other parameters' Adam moments and step counts carry on untouched when it is unfrozen.

Row updates of the token table (`optimizer.embedding_update=rows`, the Adam/AdamW default): a batch of short
sentences uses a few hundred of the table's 30,522 rows, yet a dense AdamW step reads and writes all of them
(weights, gradient, two moments: ~200 MB a step for a 30,522 x 384 table), which cost more than the encoder
itself on short texts. With rows, the lookup's gradient is sparse (`nn.Embedding(sparse=True)`) and only the rows
it names are updated ("lazy Adam", as `torch.optim.SparseAdam` or TensorFlow's LazyAdam): a row's moments decay
only on steps that use it. The moments live in the optimizer's usual state (same names and shapes as Adam's),
so checkpoints and resume are unchanged and a run may switch modes on resume. A static model's table of hashed
token pairs (model.pair_buckets) is updated by rows the same way.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import nn

from ..errors import ConfigError
from ..registry import registrar
from .config import OptimizerConfig

# name -> builder(param_groups, config, extra kwargs such as fused=True) -> optimizer
OPTIMIZERS: dict[str, Callable[[list[dict], OptimizerConfig, dict], torch.optim.Optimizer]] = {}

register = registrar(OPTIMIZERS)


class RowUpdates:
    """Mixed into Adam/AdamW: parameters whose gradient is sparse get the lazy row update below; the others the
    parent's (fused) step. An fp16 gradient scaler must unscale every gradient and skip the whole `step` on
    inf/NaN: a fused optimizer normally asks it to leave both to the kernel (`_step_supports_amp_scaling`),
    which would leave the rows scaled and updated with inf, so this class says no (one host sync per fp16 step)."""

    decoupled = False  # AdamW: weight decay applied to the weights, not added to the gradient

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._step_supports_amp_scaling = False

    @torch.no_grad()
    def step(self, closure=None):
        sparse = [(group, p, p.grad) for group in self.param_groups for p in group["params"]
                  if p.grad is not None and p.grad.is_sparse]
        for _, p, _ in sparse:
            p.grad = None  # the dense kernels refuse sparse gradients; they skip parameters without one
        try:
            loss = super().step(closure)
        finally:
            for _, p, grad in sparse:
                p.grad = grad
        for group, p, grad in sparse:
            self._update_rows(group, p, grad.coalesce())
        return loss

    def _update_rows(self, group: dict, p: torch.Tensor, grad: torch.Tensor) -> None:
        if group.get("amsgrad") or group.get("maximize"):
            raise ConfigError("optimizer.embedding_update=rows supports neither amsgrad nor maximize; "
                              "use optimizer.embedding_update=dense")
        rows, g = grad.indices()[0], grad.values()  # each used row once, its gradient summed over the batch
        beta1, beta2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        state = self.state[p]
        if not state:  # the names, shapes and dtypes Adam itself uses, so either step can continue the other
            fused = group.get("fused") or group.get("capturable")
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device if fused else None)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        step = state["step"].to(p.device)
        weights = p[rows]
        if wd and not (self.decoupled or group.get("decoupled_weight_decay")):
            g = g + wd * weights  # Adam's L2 penalty, on the rows in use
        m = state["exp_avg"][rows].lerp_(g, 1 - beta1)  # m = beta1 m + (1 - beta1) g
        v = state["exp_avg_sq"][rows].mul_(beta2).addcmul_(g, g, value=1 - beta2)
        state["exp_avg"].index_copy_(0, rows, m)
        state["exp_avg_sq"].index_copy_(0, rows, v)
        denom = (v / (1 - beta2 ** step)).sqrt_().add_(group["eps"])
        if wd and (self.decoupled or group.get("decoupled_weight_decay")):
            weights.mul_(1 - lr * wd)
        weights.sub_(m / denom * (lr / (1 - beta1 ** step)))  # (a tensor step: no host sync on a GPU)
        p.index_copy_(0, rows, weights)


class AdamWRows(RowUpdates, torch.optim.AdamW):
    decoupled = True


class AdamRows(RowUpdates, torch.optim.Adam):
    pass


@register("adamw")
def adamw(groups, cfg: OptimizerConfig, fused: dict) -> torch.optim.Optimizer:
    return AdamWRows(groups, lr=cfg.lr, betas=tuple(cfg.option("betas")), eps=float(cfg.option("eps")), **fused)


@register("adam")
def adam(groups, cfg: OptimizerConfig, fused: dict) -> torch.optim.Optimizer:
    return AdamRows(groups, lr=cfg.lr, betas=tuple(cfg.option("betas")), eps=float(cfg.option("eps")), **fused)


# Optimizers whose step takes sparse gradients (row updates of the token table).
SPARSE_ROWS = {"adamw", "adam"}


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


EMPTY = "empty parameter list"  # what torch.optim.Optimizer says of no parameters, after the options' checks


def check(cfg: OptimizerConfig) -> None:
    """Build the configured optimizer over no parameters: its own keys (betas, eps, momentum, ... of
    configs/optimizer/) are checked by its constructor, and refused in one line now, before any data is read,
    rather than by torch after it. (Without parameters torch stops right after those checks, before adding a
    parameter group, which would import its compiler: 1.4 s of every start.)"""
    builder = OPTIMIZERS.get(cfg.name)
    if builder is None:
        raise ConfigError(f"optimizer.name={cfg.name!r} is not one of {', '.join(sorted(OPTIMIZERS))}")
    if isinstance(cfg.lr, str):  # lr=auto: a number once the data is read; its other keys are checked with one
        cfg = dataclasses.replace(cfg, lr=1e-3)
    try:
        builder([], cfg, {})
    except ValueError as exc:
        if EMPTY not in str(exc):
            _refused(cfg, exc)
    except (TypeError, IndexError) as exc:  # (a list of the wrong length: betas=[0.9])
        _refused(cfg, exc)


def _refused(cfg: OptimizerConfig, exc: Exception):
    keys = ", ".join(f"optimizer.{k}" for k in cfg.options) or "optimizer.lr"
    raise ConfigError(f"optimizer={cfg.name} refuses its settings ({str(exc).splitlines()[0]}); check "
                      f"{keys}") from None


def use_row_updates(model: nn.Module, cfg: OptimizerConfig, compiled: bool = False, distributed: bool = False) -> bool:
    """Switch the token table to sparse gradients when `optimizer.embedding_update=rows` can be honoured: an
    optimizer with row updates, no torch.compile (its graphs expect dense gradients), one process (NCCL has no
    sparse all-reduce). Otherwise the table keeps dense updates. Returns whether rows are on."""
    mode = cfg.options.get("embedding_update", "dense")  # an optimizer YAML without the key: dense
    if mode not in ("rows", "dense"):
        raise ConfigError(f"optimizer.embedding_update={mode!r} must be rows or dense")
    tables = [t for t in (getattr(model, "token_embedding", None), getattr(model, "pair_embedding", None))
              if isinstance(t, nn.Embedding)]  # (a static model's hashed pairs: most rows idle in any batch too)
    on = mode == "rows" and cfg.name in SPARSE_ROWS and bool(tables) and not compiled and not distributed
    for table in tables:
        table.sparse = on
    return on


def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` that also takes sparse gradients (row updates): a sparse gradient is
    coalesced (each row once, so its norm is the norm of its values) and clipped with the same coefficient."""
    params = [p for p in parameters if p.grad is not None]
    sparse = [p for p in params if p.grad.is_sparse]
    if not sparse:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    for p in sparse:
        p.grad = p.grad.coalesce()
    dense = [p for p in params if not p.grad.is_sparse]
    norms = [torch.linalg.vector_norm(p.grad.values()) for p in sparse]
    if dense:
        norms.append(torch.nn.utils.get_total_norm([p.grad for p in dense]))
    total = torch.linalg.vector_norm(torch.stack(norms))
    torch.nn.utils.clip_grads_with_norm_(dense, max_norm, total)
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)  # as clip_grads_with_norm_ computes it
    for p in sparse:
        p.grad.values().mul_(coef)
    return total


def set_embedding_frozen(model: nn.Module, frozen: bool, layers: int = 0) -> None:
    """Freeze (or unfreeze) the token table; with layers = N > 0 also every embedding parameter and the lowest
    N encoder blocks."""
    model.token_embedding.weight.requires_grad_(not frozen)
    if layers > 0:
        for modules in model.layers()[: layers + 1]:
            for m in modules:
                m.requires_grad_(not frozen)
