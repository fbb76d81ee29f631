"""`tformer distill`: the composed config -> the run engine's distillation job (runs/distill.py)."""
from __future__ import annotations

from hydra.core.hydra_config import HydraConfig

from ..runs.distill import distill
from ..store.layout import RunDir
from ..typed_config import plain


def run(cfg) -> float:
    """The Hydra entry point; returns the monitored metric's best value (what a sweeper optimises)."""
    hydra = HydraConfig.get()
    return distill(plain(cfg), RunDir(hydra.runtime.output_dir), list(hydra.overrides.task)).best_value
