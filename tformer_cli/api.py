"""Training from Python, without Hydra's command line:

    from tformer_cli import train
    result = train(["data=files", "data.train_file=reviews.csv", "model=small"])
    result.test_metrics["accuracy"], result.best_checkpoint
    clf = result.classifier()

The overrides are exactly those of `tformer train`, composed with the same configs by Hydra's compose API, so a
notebook run and a command-line run of the same overrides are the same run (and resume each other). The run
writes the usual run directory, by default under outputs/train/<date>/<time> of the current directory.

Overrides may also be a dict ({"model": "small", "trainer.epochs": 3}), and the data may be in memory:
`train(data=df)` with a pandas DataFrame, a dict of columns or a (texts, labels) pair (validation_data= and
test_data= likewise). It is written once, as parquet named by its content, under outputs/data/ of the current
directory, and trained on as data=files: the run's config names that file, so the run can be evaluated and
resumed like any other. quiet=True prints nothing (the run's train.log still has everything).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.errors import ConfigCompositionException, OverrideParseException

from .errors import ArgumentTypeError, ConfigError, TformerError, hydra_error_line
from .overrides import as_overrides, in_memory_data
from .runs.in_process import TrainResult, train_overrides
from .typed_config import given_twice

__all__ = ["TrainResult", "distill", "train"]


def checked_arguments(name: str, overrides, run_dir, quiet) -> list[str]:
    """The overrides as key=value strings, and the other arguments of train() / distill() checked: one line each."""
    overrides = as_overrides(overrides, name)
    given_twice(overrides, name)
    if run_dir is not None and not isinstance(run_dir, (str, Path)):
        raise ArgumentTypeError(f"run_dir={run_dir!r:.80} must be a path (str or pathlib.Path)")
    if any(o.startswith("-") for o in overrides):
        raise TformerError(f"{name}() takes key=value overrides only, not {[o for o in overrides if o[:1] == '-']}; "
                           f"for sweeps call it once per setting")
    if not isinstance(quiet, bool):
        raise ArgumentTypeError(f"quiet={quiet!r:.80} must be True or False")
    return overrides


def train(overrides: list[str] | tuple[str, ...] | dict = (), *, run_dir: str | Path | None = None, data: Any = None,
          validation_data: Any = None, test_data: Any = None, quiet: bool = False) -> TrainResult:
    """Train (or with `resume=...` continue) one run; raises TformerError with the CLI's one-line messages."""
    overrides = checked_arguments("train", overrides, run_dir, quiet)
    overrides += in_memory_data(overrides, {"train": data, "validation": validation_data, "test": test_data},
                                "train")
    return composed(overrides, run_dir, quiet, "train")


def distill(overrides: list[str] | tuple[str, ...] | dict = (), *, run_dir: str | Path | None = None,
            quiet: bool = False) -> TrainResult:
    """`tformer distill` from Python: the overrides of the command (teacher=<run dir> among them), the student's
    TrainResult; raises TformerError with the CLI's one-line messages.

        from tformer_cli import distill
        student = distill({"teacher": "outputs/train/<date>/<time>", "distill.unlabeled": ["unlabeled.csv"]})
    """
    overrides = checked_arguments("distill", overrides, run_dir, quiet)
    return composed(overrides, run_dir, quiet, "distill")


def composed(overrides: list[str], run_dir, quiet: bool, task: str) -> TrainResult:
    """The run of these overrides, with an override Hydra cannot parse or apply (a typo in a key, a missing
    config, `trainer.epochs` without a value) in the CLI's one line, not Hydra's traceback."""
    try:
        return train_overrides(overrides, run_dir, quiet, task=task)
    except (ConfigCompositionException, OverrideParseException) as exc:
        raise ConfigError(f"{task}(): {hydra_error_line(task, exc)}") from None
