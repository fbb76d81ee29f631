"""Learning-rate schedules as multipliers of the base rate, stepped once per optimizer step."""
from __future__ import annotations

import math

import torch

from ..errors import ConfigError

NAMES = ("constant", "linear_warmup", "cosine", "noam")


def lr_multiplier(name: str, step: int, total_steps: int, warmup_steps: int, min_ratio: float = 0.0) -> float:
    """Multiplier at `step` (0-based count of optimizer steps taken so far).

    constant       1
    linear_warmup  s/w during warm-up, then linear decay to min_ratio at total_steps
    cosine         s/w during warm-up, then half a cosine down to min_ratio
    noam           min(s/w, sqrt(w/s)): Vaswani et al.'s d^-0.5 * min(s^-0.5, s * w^-1.5), normalised so the
                   peak (at s = w) is the base lr; their formula is lr = d_model^-0.5 * w^-0.5 here.
    """
    if name not in NAMES:
        raise ConfigError(f"schedule.name={name!r} is not one of {', '.join(NAMES)}")
    s = step + 1
    w = max(warmup_steps, 0)
    if name == "constant":
        return 1.0 if w == 0 else min(1.0, s / w)
    if name == "noam":
        w = max(w, 1)
        return min(s / w, math.sqrt(w / s))
    if w and s <= w:
        return s / w
    progress = min(1.0, (s - w) / max(1, total_steps - w))
    if name == "linear_warmup":
        return min_ratio + (1.0 - min_ratio) * (1.0 - progress)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine


def warmup_steps(cfg, total_steps: int) -> int:
    """schedule.warmup_steps if set, else schedule.warmup_ratio of the run's optimizer steps."""
    if cfg.get("warmup_steps") is not None:
        return int(cfg.warmup_steps)
    return int(round(float(cfg.get("warmup_ratio", 0.0)) * total_steps))


def build(optimizer: torch.optim.Optimizer, cfg, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    name, w, min_ratio = str(cfg.name), warmup_steps(cfg, total_steps), float(cfg.get("min_lr_ratio", 0.0))
    lr_multiplier(name, 0, total_steps, w, min_ratio)  # validates the name before training starts
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(name, step, total_steps, w, min_ratio))
