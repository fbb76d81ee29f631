"""A training run started from Python rather than by Hydra's command line: `tformer_cli.train()` and
`tformer_cli.distill()` (api.py) and each fold of `tformer audit` (runs/audit.py). The overrides are composed by
Hydra's compose API with the configs the command uses, into a run directory of its own (default
outputs/<task>/<date>/<time>), never over another run's."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from ..classifier import Classifier
from ..console import output
from ..hydra_setup import compose_tree
from ..store.layout import RunDir
from ..store.ownership import new_run_dir
from ..yesno import bool_or_path
from .classify import configure
from .classify import train as train_run
from .config import TrainConfig
from .distill import distill as distill_run
from .distill import options_of as distill_options
from .session import Trained


def _train(tree: dict, run_dir: RunDir, overrides: list[str]) -> Trained:
    config, tree = configure(tree, overrides)
    return train_run(config, run_dir, tree, overrides)


# task -> how a composed tree runs into a run dir (the Hydra commands' entry points do the same)
TASKS = {"train": _train, "distill": distill_run}


def checked(task: str, tree: dict) -> None:
    """The composed tree's keys and values, checked as the command checks them before it reads data."""
    if task == "distill":
        distill_options(tree)
        tree = {k: v for k, v in tree.items() if k not in ("distill", "teacher")}
    TrainConfig.from_dict(tree)


@dataclass
class TrainResult:
    run_dir: Path
    best_checkpoint: Path
    monitor: str  # the metric early stopping watched (trainer.early_stopping.monitor)
    best_value: float  # its best value: what a sweeper would optimise
    history: list[dict]  # per-epoch metrics
    test_metrics: dict | None  # the best checkpoint on the test split (None with trainer.test_after_fit=false)

    def classifier(self, device: str = "auto") -> Classifier:
        """The best checkpoint, ready to predict."""
        return Classifier.load(self.best_checkpoint, device=device)


def train_overrides(overrides: list[str], run_dir: str | Path | None = None, quiet: bool = False,
                    task: str = "train") -> TrainResult:
    """Train (or with `resume=...` continue) the run of these key=value overrides (task: train or distill);
    quiet=True prints nothing (the run's log still has everything). An error leaves no empty run dir and the log
    closed."""
    screen = output().screen
    was_quiet, screen.quiet = screen.quiet, screen.quiet or quiet
    try:
        return _run(task, overrides, run_dir)
    finally:
        screen.quiet = was_quiet


def _run(task: str, overrides: list[str], run_dir: str | Path | None) -> TrainResult:
    tree = compose_tree(task, overrides)
    checked(task, tree)  # every key, before the run dir is made: a refused config leaves no folder
    resume = bool_or_path(tree.get("resume"), "resume")
    if run_dir is None:
        stamp = time.strftime("%Y-%m-%d/%H-%M-%S") + f"-{time.time_ns() // 1000 % 1_000_000:06d}"
        run_dir = Path("outputs") / task / stamp
    start = RunDir(Path(run_dir).resolve())
    new_run_dir(start.root, task, resume, key="run_dir")  # never over another run
    try:
        done = TASKS[task](tree, start, overrides)
    except BaseException:
        output().close_log()  # an error leaves the run log closed, not collecting the caller's later output
        start.discard_if_empty()
        raise
    run = done.run_dir
    if run.root != start.root:  # resumed into the run's own directory
        start.discard_if_empty()
    return TrainResult(run_dir=run.root, best_checkpoint=run.best.path,
                       monitor=run.best.early_stopping()[0], best_value=done.best_value,  # (auto: as resolved)
                       history=json.loads(run.history.read_text()),
                       test_metrics=json.loads(run.test_metrics.read_text()) if run.test_metrics.is_file() else None)
