"""`hydra/sweeper: tformer_optuna`: the defaults of tformer's Optuna sweeper (configs/hparams_search/ set the rest).

Hydra imports every module of the `hydra_plugins` namespace at start-up and this is how a plugin adds a config
group option; it imports Hydra only, so a start that sweeps nothing pays nothing for Optuna."""
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class TformerOptunaSweeperConf:
    _target_: str = "hydra_plugins.tformer_sweepers.resumable_optuna.ResumableOptunaSweeper"
    # any optuna.samplers class (GridSampler aside: sweep a grid with -m and comma lists)
    sampler: Any = field(default_factory=lambda: {"_target_": "optuna.samplers.TPESampler", "seed": None})
    direction: Any = "auto"  # train returns the monitored metric: auto maximizes an accuracy, minimizes a loss
    storage: Optional[Any] = None  # sqlite:///... keeps the study (and makes the sweep resumable)
    study_name: Optional[str] = None
    n_trials: int = 20
    n_jobs: int = 1  # trials asked at once (run in parallel by a parallel launcher)
    max_failure_rate: float = 0.0
    search_space: Optional[Dict[str, Any]] = None  # (Hydra 1.1's form: refused, use params)
    params: Optional[Dict[str, str]] = None  # key: interval(...) | choice(...) | range(...) | a fixed value
    custom_search_space: Optional[str] = None  # a callable(cfg, trial) that suggests more parameters


ConfigStore.instance().store(group="hydra/sweeper", name="tformer_optuna", node=TformerOptunaSweeperConf,
                             provider="tformer")
