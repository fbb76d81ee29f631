"""`tformer train`: the composed config -> the run engine's classification job (runs/classify.py)."""
from __future__ import annotations

from hydra.core.hydra_config import HydraConfig

from ..store.layout import RunDir
from ..runs.classify import configure, train
from ..typed_config import plain


def run(cfg) -> float:
    """The Hydra entry point; returns the monitored metric's best value (what a sweeper optimises)."""
    hydra = HydraConfig.get()
    config, tree = configure(plain(cfg), list(hydra.overrides.task))
    return train(config, RunDir(hydra.runtime.output_dir), tree, overrides=list(hydra.overrides.task)).best_value
