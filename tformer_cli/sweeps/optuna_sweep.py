"""Optuna sweeps that survive being killed: Hydra's own `hydra-optuna-sweeper`, with its study kept in SQLite in
the sweep dir and one change to how a sweep starts (`hparams_search=<name>`, configs/hparams_search/).

The plugin creates its study with `load_if_exists=True`, but on a rerun it still asks for `n_trials` new trials
and numbers jobs from 0 again (lightning-hydra-template #535: a crashed Optuna multirun cannot be resumed). Here a
rerun with `resume=<sweep dir>` (summary.resume_args points Hydra at that dir):
  - counts the trials that ended (told COMPLETE or FAIL) and runs only the rest of `n_trials`;
  - gives a trial that was running when the sweep died back to the study with the same parameters and job number,
    so its job finds its own folder and resumes from `checkpoints/last` (runs/resume.py: `sweep_job_plan`);
  - numbers new jobs after every job the study has seen, so no folder is reused by another trial.
Everything else (search-space syntax, samplers, directions, launchers) is the plugin's, unchanged. A job that
fails is a FAIL trial and the study goes on (as `-m` grids do); the summary lists it with its error line.
"""
from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any

import optuna
from omegaconf import OmegaConf
from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from ..console import output
from ..errors import TformerError
from ..safe_text import markup
from .optuna_space import OptunaSweeperImpl, create_params_from_overrides

JOB = "tformer_job"  # trial user attribute: the Hydra job number (and folder prefix) of the trial
ENDED = "tformer_ended"  # set when the job returned (ok or failed); a trial without it was interrupted


def current_distributions(distributions: dict[str, BaseDistribution]) -> dict[str, BaseDistribution]:
    """The same search space in Optuna's current classes. The plugin still builds UniformDistribution,
    LogUniformDistribution, IntUniformDistribution, ...: removed in Optuna 6, and a study stores each trial's
    distribution by class name, so a study saved with them could not be read (or resumed) by Optuna 6."""
    out: dict[str, BaseDistribution] = {}
    for name, d in distributions.items():
        if isinstance(d, FloatDistribution):  # (the deprecated float classes are its subclasses)
            out[name] = FloatDistribution(d.low, d.high, log=d.log, step=d.step)
        elif isinstance(d, IntDistribution):
            out[name] = IntDistribution(d.low, d.high, log=d.log, step=d.step)
        else:
            out[name] = d
    return out


def kinds_of_study(study: optuna.Study, distributions: dict[str, BaseDistribution]) -> dict[str, BaseDistribution]:
    """A study begun with the pre-3.0 classes (by an earlier tformer) goes on with its own: Optuna refuses a
    parameter whose distribution class changes within one study."""
    stored = {}
    for trial in study.get_trials(deepcopy=False):
        for name, d in trial.distributions.items():
            stored.setdefault(name, d)
    return {name: stored[name] if name in stored and type(stored[name]) is not type(d)
            and isinstance(stored[name], type(d)) else d for name, d in distributions.items()}


def resumable_impl(*, sampler: Any, direction: Any, storage: Any, study_name: Any, n_trials: int, n_jobs: int,
                   max_failure_rate: float = 0.0, search_space: Any = None, custom_search_space: Any = None,
                   params: Any = None) -> "_ResumableImpl":
    """The sweeper behind hydra_plugins/tformer_sweepers (the settings are the plugin's `hydra.sweeper.*`)."""
    return _ResumableImpl(sampler, direction, storage, study_name, n_trials, n_jobs, max_failure_rate, search_space,
                          custom_search_space, params)


class _ResumableImpl(OptunaSweeperImpl):
    def sweep(self, arguments: list[str]) -> None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # its per-trial INFO lines would bury our output
        with warnings.catch_warnings():  # (a search space of the pre-3.0 kind is converted below)
            warnings.simplefilter("ignore", FutureWarning)
            self._process_searchspace_config()
            distributions, fixed = create_params_from_overrides(self._parse_sweeper_params_config() + list(arguments))
        distributions = current_distributions({**(self.search_space_distributions or {}), **distributions})
        for name in fixed:
            distributions.pop(name, None)
        if not distributions:
            raise TformerError("the Optuna sweep has nothing to search: give hydra.sweeper.params (see "
                               "configs/hparams_search/) or ranges like optimizer.lr=interval(1e-4,1e-3)")
        if isinstance(self.sampler, functools.partial):  # the plugin's GridSampler (built from the search space)
            raise TformerError("hparams_search with the grid sampler: sweep a grid with -m and comma lists instead "
                               "(tformer train -m optimizer.lr=1e-4,3e-4 ...; resume=<sweep dir> continues it too)")
        resuming = any(a.startswith("resume=") for a in arguments)
        Path(self.sweep_dir).mkdir(parents=True, exist_ok=True)  # the SQLite study lives here
        wanted = self._get_directions()
        study = optuna.create_study(study_name=self.study_name, storage=self.storage, sampler=self.sampler,
                                    directions=wanted, load_if_exists=True)
        stored = [d.name.lower() for d in study.directions]  # (a study that exists keeps its own: Optuna says nothing)
        if stored != wanted:
            raise TformerError(f"{self.sweep_dir}'s Optuna study was made to {' and '.join(stored)} and these runs' "
                               f"early stopping needs {' and '.join(wanted)}; start a new sweep (another "
                               f"hydra.sweep.dir, without resume=)")
        with warnings.catch_warnings():  # (reading a study saved with the pre-3.0 classes builds them again)
            warnings.simplefilter("ignore", FutureWarning)
            distributions = kinds_of_study(study, distributions)
        if study.trials and not resuming:
            raise TformerError(f"{self.sweep_dir} already holds Optuna study {study.study_name} with "
                               f"{len(study.trials)} trials; continue it with resume={self.sweep_dir}, or give "
                               f"another hydra.sweep.dir")
        OmegaConf.save(self.config, Path(self.sweep_dir) / "multirun.yaml")  # as Hydra's basic sweeper: a sweep
        if study.trials and hasattr(self.sampler, "reseed_rng"):
            # the sampler was rebuilt with the same seed: unchanged, it would propose the first trials again
            self.sampler.reseed_rng()
        next_job, ended, requeued = self._requeue_interrupted(study)
        remaining = self.n_trials - ended
        if ended or requeued:
            again = f"; job {', '.join(map(str, requeued))} resumes where it stopped" if requeued else ""
            output().print(f"Optuna study {markup(study.study_name)} in {markup(self.storage)}: {ended} of "
                           f"{self.n_trials} trials had ended (kept, not rerun){again}; {max(0, remaining)} to go", highlight=False)
        while remaining > 0:
            trials = [study.ask() for _ in range(min(remaining, max(1, self.n_jobs)))]
            for trial in trials:
                if JOB not in trial.user_attrs:  # (a requeued trial keeps its job number and folder)
                    trial.set_user_attr(JOB, next_job)
                    next_job += 1
            try:
                overrides = self._configure_trials(trials, distributions, fixed)
            except ValueError as exc:  # Optuna: a parameter's distribution kind differs from the study's
                raise TformerError(f"the Optuna study in {self.sweep_dir} cannot go on with this search space "
                                   f"({str(exc).splitlines()[0]}); resume it with the search space it began with, "
                                   f"or start a new sweep") from None
            for trial, ret in zip(trials, self._launch(trials, overrides)):
                try:
                    value = float(ret.return_value)  # (a failed job returns None; a crashed one raises here)
                except Exception:
                    value = float("nan")
                trial.set_user_attr(ENDED, True)
                if value == value:
                    study.tell(trial, value)
                else:
                    study.tell(trial, state=TrialState.FAIL)
            remaining -= len(trials)
        self._write_results(study)

    def _requeue_interrupted(self, study: optuna.Study) -> tuple[int, int, list[int]]:
        """(the next free job number, how many trials ended, the jobs requeued). A trial the last run left RUNNING
        (its job was interrupted) is told FAIL and enqueued again with its parameters and job number; one enqueued
        but never asked is simply asked first."""
        trials = study.get_trials(deepcopy=False)
        seen = [t.user_attrs[JOB] for t in trials if JOB in t.user_attrs]
        next_job = max(seen) + 1 if seen else 0
        ended, requeued = 0, []
        for t in trials:
            if t.user_attrs.get(ENDED):
                ended += 1
            elif t.state == TrialState.RUNNING:
                job = t.user_attrs.get(JOB, next_job)
                next_job = max(next_job, job + 1)
                study.tell(t.number, state=TrialState.FAIL)
                study.enqueue_trial(t.params, user_attrs={JOB: job})
                requeued.append(job)
        return next_job, ended, requeued

    def _launch(self, trials, overrides):
        """The launcher numbers a batch consecutively from initial_job_idx; a requeued trial may break the run."""
        jobs = [t.user_attrs[JOB] for t in trials]
        if jobs == list(range(jobs[0], jobs[0] + len(jobs))):
            return self.launcher.launch(overrides, initial_job_idx=jobs[0])
        return [r for job, o in zip(jobs, overrides) for r in self.launcher.launch([o], initial_job_idx=job)]

    def _write_results(self, study: optuna.Study) -> None:
        done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
        if not done or len(self._get_directions()) != 1:
            return
        best = study.best_trial
        OmegaConf.save(OmegaConf.create({"name": "optuna", "best_params": best.params, "best_value": best.value,
                                         "best_job": best.user_attrs.get(JOB)}),
                       Path(self.sweep_dir) / "optimization_results.yaml")
