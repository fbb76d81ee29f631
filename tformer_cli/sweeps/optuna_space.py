# Parts of this module are adapted from hydra-optuna-sweeper 1.3.0 (hydra_plugins/hydra_optuna_sweeper/_impl.py),
# distributed under the MIT License:
#
#   Copyright (c) Facebook, Inc. and its affiliates.
#
#   Permission is hereby granted, free of charge, to any person obtaining a copy of this software and associated
#   documentation files (the "Software"), to deal in the Software without restriction, including without
#   limitation the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of the
#   Software, and to permit persons to whom the Software is furnished to do so, subject to the following
#   conditions:
#
#   The above copyright notice and this permission notice shall be included in all copies or substantial portions
#   of the Software.
#
#   THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED
#   TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL
#   THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF
#   CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
#   DEALINGS IN THE SOFTWARE.
"""Hydra's sweep syntax -> Optuna distributions, and the Optuna sweeper's settings, owned here.

This was Hydra's `hydra-optuna-sweeper` (1.3.0, MIT, Facebook). That plugin pins optuna<3, which predates
SQLAlchemy 2 (MLflow needs it), and builds distributions Optuna has deprecated; a `pip install 'tformer[optuna]'`
could not install it beside a current Optuna. The part tformer uses (override parsing, trial configuration) is
small, so it lives here on Optuna's current API (FloatDistribution / IntDistribution), and the sweeper ships in
tformer's wheel (hydra_plugins/tformer_sweepers)."""
from __future__ import annotations

from typing import Any, Sequence

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, Transformer
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from ..errors import ConfigError
from ..training.early_stopping import AUTO, mode_for


def _choices(override: Override) -> CategoricalDistribution:
    choices = list(override.sweep_iterator(transformer=Transformer.encode))
    bad = [c for c in choices if not isinstance(c, (str, int, float, bool, type(None)))]
    if bad:
        raise ConfigError(f"{override.get_key_element()}: a choice sweep takes numbers, strings, booleans or null, "
                          f"not {bad[0]!r}")
    return CategoricalDistribution(choices)


def distribution(override: Override) -> Any:
    """A sweep override's Optuna distribution, or the fixed value (a string) of a plain override."""
    if not override.is_sweep_override():
        return override.get_value_element_as_str()
    value = override.value()
    if override.is_choice_sweep():
        return _choices(override)
    if override.is_range_sweep():  # range(start, stop, step): as hydra-optuna-sweeper read it, stop included
        if value.shuffle:
            return _choices(override)
        if any(isinstance(v, float) for v in (value.start, value.stop, value.step)):
            return FloatDistribution(value.start, value.stop, step=value.step)
        return IntDistribution(int(value.start), int(value.stop), step=int(value.step))
    if override.is_interval_sweep():  # interval(low, high), tag(log, interval(...)) for a log scale
        log = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log)
        return FloatDistribution(value.start, value.end, log=log)
    raise ConfigError(f"{override.input_line}: the Optuna sweeper takes choice(...), range(...), interval(...) or "
                      f"comma lists")


def create_params_from_overrides(arguments: list[str]) -> tuple[dict[str, BaseDistribution], dict[str, Any]]:
    """(the distributions to search, the fixed overrides) of `key=value` / `key=interval(...)` arguments."""
    distributions, fixed = {}, {}
    for override in OverridesParser.create().parse_overrides(arguments):
        value = distribution(override)
        if isinstance(value, BaseDistribution):
            distributions[override.get_key_element()] = value
        else:
            fixed[override.get_key_element()] = value
    return distributions, fixed


class OptunaSweeperImpl(Sweeper):
    """The settings of `hydra.sweeper.*` and what every Optuna sweep needs; `sweep` is the subclass's."""

    def __init__(self, sampler: Any, direction: Any, storage: Any, study_name: Any, n_trials: int, n_jobs: int,
                 max_failure_rate: float, search_space: Any, custom_search_space: Any, params: Any) -> None:
        if search_space:  # (Hydra 1.1's form, removed from the plugin's docs since 1.2)
            raise ConfigError("hydra.sweeper.search_space is not supported: give the ranges as hydra.sweeper.params "
                              "(optimizer.lr: tag(log, interval(1e-4, 3e-3)); see configs/hparams_search/)")
        if not 0.0 <= max_failure_rate <= 1.0:
            raise ConfigError(f"hydra.sweeper.max_failure_rate={max_failure_rate} must be between 0 and 1")
        self.sampler, self.direction, self.storage, self.study_name = sampler, direction, storage, study_name
        self.n_trials, self.n_jobs, self.max_failure_rate = n_trials, n_jobs, max_failure_rate
        self.custom_search_space_extender = (instantiate({"_target_": custom_search_space, "_partial_": True})
                                             if custom_search_space else None)
        self.params = params
        self.search_space_distributions: dict[str, BaseDistribution] | None = None

    def _process_searchspace_config(self) -> None:
        if self.params is None:
            self.params = OmegaConf.create({})

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(config=config, hydra_context=hydra_context,
                                                                task_function=task_function)
        self.sweep_dir = config.hydra.sweep.dir

    def _get_directions(self) -> list[str]:
        """auto: the way the runs' early stopping calls a metric better (a trial returns its best monitored value:
        minimize for a loss); a direction against it would keep the worst trial as the best, and is refused."""
        directions = list(self.direction) if isinstance(self.direction, Sequence) and not isinstance(
            self.direction, str) else [self.direction]
        names = [getattr(d, "name", d) for d in directions]
        bad = [d for d in names if d not in ("minimize", "maximize", AUTO)]
        if bad:
            raise ConfigError(f"hydra.sweeper.direction={bad[0]!r} must be auto, minimize or maximize")
        stopping = self.config.trainer.early_stopping
        monitor = "val_accuracy" if stopping.monitor == AUTO else str(stopping.monitor)  # (val_f1 alike: max)
        wanted = "minimize" if mode_for(monitor, str(stopping.mode)) == "min" else "maximize"
        if len(names) == 1 and names[0] not in (AUTO, wanted):
            raise ConfigError(f"hydra.sweeper.direction={names[0]} with trainer.early_stopping.monitor={monitor} "
                              f"would keep the worst trial as the best; drop it (auto) or pass direction={wanted}")
        return [wanted if d == AUTO else d for d in names]

    def _configure_trials(self, trials: list[optuna.trial.Trial], distributions: dict[str, BaseDistribution],
                          fixed: dict[str, Any]) -> list[tuple[str, ...]]:
        """Each trial's overrides: its suggested values plus the fixed ones."""
        overrides = []
        for trial in trials:
            for name, dist in distributions.items():
                trial._suggest(name, dist)  # (Optuna's own path for a ready-made distribution)
            for name, value in fixed.items():
                trial.set_user_attr(name, value)
            if self.custom_search_space_extender:
                self.custom_search_space_extender(self.config, trial)
            overlap = trial.params.keys() & fixed.keys()
            if overlap:
                raise ConfigError(f"{sorted(overlap)[0]} is both searched and fixed: drop one of the two")
            overrides.append(tuple(f"{k}={v}" for k, v in {**trial.params, **fixed}.items()))
        return overrides

    def _parse_sweeper_params_config(self) -> list[str]:
        return [f"{k!s}={v}" for k, v in self.params.items()] if self.params else []

    def sweep(self, arguments: list[str]) -> None:  # (the subclass's)
        raise NotImplementedError
