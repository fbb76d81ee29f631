"""Learning-rate schedules (a registry: one function per name) as multipliers of the base rate, stepped once
per optimizer step. Each function takes s = 1-based step, total steps, warm-up steps w and min_ratio."""
from __future__ import annotations

import math
from typing import Callable

import torch

from ..errors import ConfigError
from ..registry import registrar
from .config import ScheduleConfig

SCHEDULES: dict[str, Callable[[int, int, int, float], float]] = {}

register = registrar(SCHEDULES)


def _warmup(s: int, w: int) -> float | None:
    """s/w during warm-up, None after it."""
    return s / w if w and s <= w else None


def _progress(s: int, total: int, w: int) -> float:
    return min(1.0, (s - w) / max(1, total - w))


@register("constant")
def constant(s: int, total: int, w: int, min_ratio: float) -> float:
    """1 (after an optional linear warm-up)."""
    return 1.0 if w == 0 else min(1.0, s / w)


@register("linear_warmup")
def linear_warmup(s: int, total: int, w: int, min_ratio: float) -> float:
    """s/w during warm-up, then linear decay to min_ratio at total_steps."""
    up = _warmup(s, w)
    return up if up is not None else min_ratio + (1.0 - min_ratio) * (1.0 - _progress(s, total, w))


@register("cosine")
def cosine(s: int, total: int, w: int, min_ratio: float) -> float:
    """s/w during warm-up, then half a cosine down to min_ratio."""
    up = _warmup(s, w)
    return up if up is not None else min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * _progress(s, total, w)))


@register("noam")
def noam(s: int, total: int, w: int, min_ratio: float) -> float:
    """min(s/w, sqrt(w/s)): Vaswani et al.'s d^-0.5 * min(s^-0.5, s * w^-1.5), normalised so the peak (at s = w)
    is the base lr; their formula is lr = d_model^-0.5 * w^-0.5 here."""
    w = max(w, 1)
    return min(s / w, math.sqrt(w / s))


def lr_multiplier(name: str, step: int, total_steps: int, warmup_steps: int, min_ratio: float = 0.0) -> float:
    """Multiplier at `step` (0-based count of optimizer steps taken so far)."""
    fn = SCHEDULES.get(name)
    if fn is None:
        raise ConfigError(f"schedule.name={name!r} is not one of {', '.join(SCHEDULES)}")
    return fn(step + 1, total_steps, max(warmup_steps, 0), min_ratio)


def warmup_steps(cfg: ScheduleConfig, total_steps: int) -> int:
    """schedule.warmup_steps if set, else schedule.warmup_ratio of the run's optimizer steps."""
    if cfg.warmup_steps is not None:
        return cfg.warmup_steps
    return int(round(cfg.warmup_ratio * total_steps))


def build(optimizer: torch.optim.Optimizer, cfg: ScheduleConfig, total_steps: int,
          restart_at: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """restart_at = N > 0: two schedules back to back, the configured one over the first N steps and again over the
    rest (each with its own warm-up): a phase in which only a new head trains, then the whole model starting from a
    warm-up of its own rather than near the peak rate with fresh optimizer moments (mlm.head_warmup_steps)."""
    name, min_ratio = cfg.name, cfg.min_lr_ratio
    phases = [(0, total_steps)] if not 0 < restart_at < total_steps else [(0, restart_at), (restart_at, total_steps)]
    warm = [warmup_steps(cfg, end - start) for start, end in phases]
    lr_multiplier(name, 0, total_steps, warm[0], min_ratio)  # validates the name before training starts

    def multiplier(step: int) -> float:
        k = int(len(phases) > 1 and step >= restart_at)
        start, end = phases[k]
        return lr_multiplier(name, step - start, end - start, warm[k], min_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)
