"""Early stopping on any logged metric."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..errors import ConfigError


LOWER_IS_BETTER = ("loss", "ece", "brier", "nll")  # a metric whose name ends so: its best is its least
HIGHER_IS_BETTER = ("accuracy", "f1", "precision", "recall")  # ... its greatest
AUTO = "auto"


def direction_of(monitor: str) -> str | None:
    """min or max for a metric whose name says which way is better (val_loss, val_mlm_accuracy); None else."""
    name = str(monitor).lower()
    return "min" if name.endswith(LOWER_IS_BETTER) else "max" if name.endswith(HIGHER_IS_BETTER) else None


def mode_for(monitor: str, mode: str) -> str:
    """trainer.early_stopping.mode as used: auto is the metric's own direction (max for one that does not say); a
    mode against it (mode=max on val_loss) would keep the worst epoch as the best and is refused."""
    known = direction_of(monitor)
    if mode == AUTO:
        return known or "max"
    if known is not None and mode != known:
        raise ConfigError(f"trainer.early_stopping.mode={mode} with monitor={monitor} would keep its worst epoch "
                          f"as the best ({monitor} is better when {'lower' if known == 'min' else 'higher'}); drop "
                          f"mode= (auto) or pass mode={known}")
    return mode


@dataclass
class EarlyStopping:
    monitor: str = "val_loss"
    mode: str = "min"  # min | max
    patience: int = 3  # epochs without improvement before stopping; 0 disables stopping
    min_delta: float = 0.0
    best: float | None = None
    best_epoch: int = -1
    bad_epochs: int = 0

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise ConfigError(f"trainer.early_stopping.mode={self.mode!r} must be min or max")

    def improved(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def update(self, metrics: dict, epoch: int) -> bool:
        """Record this epoch's metrics; True when this epoch is the new best."""
        if self.monitor not in metrics:
            raise ConfigError(f"trainer.early_stopping.monitor={self.monitor!r} is not a logged metric; "
                           f"choose one of {', '.join(sorted(metrics))}")
        value = float(metrics[self.monitor])
        if self.improved(value):
            self.best, self.best_epoch, self.bad_epochs = value, epoch, 0
            return True
        self.bad_epochs += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.bad_epochs >= self.patience

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)
