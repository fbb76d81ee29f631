"""`tformer calibrate`: a checkpoint's temperature and label-set cuts refitted on labelled texts it never trained on,
written as a new checkpoint beside the untouched original (runs/recalibrate.py does the work)."""
from __future__ import annotations

from hydra.core.hydra_config import HydraConfig

from ..runs.config import CalibrateConfig
from ..runs.recalibrate import refit
from ..runs.scoring import scoring
from ..store.layout import RunDir
from ..typed_config import plain


def run(cfg) -> float:
    hydra = HydraConfig.get()
    overrides = list(hydra.overrides.task)
    return scoring("calibrate", refit, CalibrateConfig.from_hydra(cfg, overrides), RunDir(hydra.runtime.output_dir),
                   plain(cfg), overrides)
