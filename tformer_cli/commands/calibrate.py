"""`tformer calibrate`: a checkpoint's temperature and label-set cuts refitted on labelled texts it never trained on,
written as a new checkpoint beside the untouched original (runs/recalibrate.py does the work)."""
from __future__ import annotations

from hydra.core.hydra_config import HydraConfig

from .. import cores
from ..console import output
from ..hardware import keep_freed_host_memory, pick_device, pick_precision
from ..runs.config import CalibrateConfig
from ..runs.recalibrate import refit
from ..runs.session import log_header
from ..store.layout import RunDir
from ..typed_config import plain
from .evaluate import reading


def run(cfg) -> float:
    hydra = HydraConfig.get()
    overrides = list(hydra.overrides.task)
    return calibrate(CalibrateConfig.from_hydra(cfg, overrides), RunDir(hydra.runtime.output_dir), plain(cfg),
                     overrides)


def calibrate(config: CalibrateConfig, run_dir: RunDir, tree: dict | None = None, overrides=()) -> float:
    console = output()
    console.open_log(run_dir.log("calibrate"), log_header("calibrate", overrides, tree))
    device = pick_device(config.device)
    keep_freed_host_memory(device)
    precision = pick_precision(config.precision, device)
    with cores.claimed(config.threads, "threads", device.type, console.print):
        return refit(config, run_dir, console, device, precision, reading)
