"""Typed training configs, one per YAML group. Field defaults are deliberately absent: every default lives in
configs/<group>/*.yaml, and `typed_config.build` turns the composed tree into these."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError


@dataclass
class EarlyStoppingConfig:
    monitor: str
    mode: str
    patience: int
    min_delta: float


@dataclass
class TrainerConfig:
    epochs: int
    batch_size: int
    eval_batch_size: int
    device: str
    precision: str
    seed: int
    grad_clip: float
    log_every_steps: int
    num_workers: int
    checkpoint_every_steps: int
    compile: bool
    test_after_fit: bool
    early_stopping: EarlyStoppingConfig


@dataclass
class OptimizerConfig:
    """name, lr and weight_decay are common to all; the rest (betas, eps, momentum, ...) belongs to one optimizer
    and is read by its builder through `option()`."""

    name: str
    lr: float
    weight_decay: float
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, data: dict, where: str = "optimizer") -> "OptimizerConfig":
        from ..typed_config import build

        data = dict(data)
        common = {k: data.pop(k) for k in ("name", "lr", "weight_decay") if k in data}
        return build(cls, {**common, "options": data}, where)

    def option(self, key: str):
        if key not in self.options:
            raise ConfigError(f"optimizer={self.name} needs optimizer.{key}; add it to configs/optimizer/"
                              f"{self.name}.yaml or pass +optimizer.{key}=<value>")
        return self.options[key]


@dataclass
class ScheduleConfig:
    name: str
    warmup_steps: int | None  # null: warmup_ratio of the run's optimizer steps
    warmup_ratio: float
    min_lr_ratio: float


@dataclass
class LossConfig:
    class_weights: str | None  # null | balanced
    label_smoothing: float
