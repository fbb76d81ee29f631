"""Typed training configs, one per YAML group. Field defaults are deliberately absent: every default lives in
configs/<group>/*.yaml, and `typed_config.build` turns the composed tree into these."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..cores import parse_threads
from ..errors import ConfigError
from ..typed_config import build, finite, number_or_auto
from .early_stopping import AUTO, mode_for


@dataclass
class EarlyStoppingConfig:
    monitor: str
    mode: str
    patience: int
    min_delta: float

    RANGES = {"patience": (0, None, "[)"), "min_delta": (0, None, "[)")}  # (NaN/inf: refused by typed_config)

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max", AUTO):
            raise ConfigError(f"trainer.early_stopping.mode={self.mode!r} must be auto, min or max")
        if self.monitor != AUTO:  # (a monitor=auto is chosen from the data: its mode is resolved then)
            self.mode = mode_for(self.monitor, self.mode)


@dataclass
class TrainerConfig:
    epochs: int | str  # a number, or auto: chosen from the training rows when the data is read (training/recipe.py)
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
    calibrate: bool  # fit a temperature on validation after training, saved in `best` (evaluation/calibration.py)
    keep_optimizer_state: bool
    early_stopping: EarlyStoppingConfig
    devices: int  # >1: `tformer train` starts this many processes (launch.py)
    micro_batches: int  # each batch as N slices of rows with summed gradients (loop.train_step)
    threads: int | str  # CPU threads: auto (this process's share of the usable cores, cores.py) or a number

    # Upper bounds: past them a value is a typo (1e30), not a setting; what fits is checked by memory (runs/config.py)
    RANGES = {"batch_size": (1, 1 << 20, "[]"), "eval_batch_size": (1, 1 << 20, "[]"),
              "grad_clip": (0, None, "[)"), "log_every_steps": (1, None, "[)"), "num_workers": (0, 1024, "[]"),
              "checkpoint_every_steps": (0, None, "[)"), "devices": (1, 1024, "[]"),
              "micro_batches": (1, 1 << 20, "[]")}

    def __post_init__(self) -> None:
        parse_threads(self.threads)
        self.epochs = number_or_auto(self.epochs, "trainer.epochs", "a whole number")
        if self.epochs != "auto" and self.epochs < 1:
            raise ConfigError(f"trainer.epochs={self.epochs} must be at least 1")
        if self.epochs != "auto" and self.epochs > 1_000_000:
            raise ConfigError(f"trainer.epochs={self.epochs} must be between 1 and 1000000")


@dataclass
class OptimizerConfig:
    """name, lr and weight_decay are common to all; the rest (betas, eps, momentum, ...) belongs to one optimizer
    and is read by its builder through `option()`."""

    name: str
    lr: float | str  # a number, or auto: chosen from the model options and the train texts (training/recipe.py)
    weight_decay: float
    options: dict[str, Any] = field(default_factory=dict)

    RANGES = {"lr": (0, None, "[)"), "weight_decay": (0, None, "[)")}

    def __post_init__(self) -> None:
        self.lr = number_or_auto(self.lr, "optimizer.lr")

    @classmethod
    def from_mapping(cls, data: dict, where: str = "optimizer") -> "OptimizerConfig":
        data = dict(finite(data, where))  # (its own keys are named optimizer.<key>, not optimizer.options.<key>)
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

    RANGES = {"warmup_steps": (0, None, "[)"), "warmup_ratio": (0, 1, "[)"), "min_lr_ratio": (0, 1, "[]")}


@dataclass
class LossConfig:
    class_weights: str | None  # auto | null | balanced (runs/classify.py: class_weights)
    label_smoothing: float

    RANGES = {"label_smoothing": (0, 1, "[)")}

    def __post_init__(self) -> None:
        if isinstance(self.class_weights, str):
            self.class_weights = self.class_weights.strip().lower()
        if self.class_weights not in (None, "balanced", "auto"):
            raise ConfigError(f"loss.class_weights={self.class_weights!r} must be auto, null or balanced")


@dataclass
class LoggerConfig:
    """Where metrics go besides metrics.jsonl: name picks a LOGGERS entry (training/loggers.py); its other keys
    (log_dir, tracking_uri, ...) belong to that logger and are read through `option()`."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, data: dict, where: str = "logger") -> "LoggerConfig":
        data = dict(finite(data, where))
        return build(cls, {"name": data.pop("name", None), "options": data}, where)

    def option(self, key: str, default=None):
        return self.options.get(key, default)
