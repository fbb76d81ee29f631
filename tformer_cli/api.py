"""Training from Python, without Hydra's command line:

    from tformer_cli import train
    result = train(["data=files", "data.train_file=reviews.csv", "model=small"])
    result.test_metrics["accuracy"], result.best_checkpoint
    clf = result.classifier()

The overrides are exactly those of `tformer train`, composed with the same configs by Hydra's compose API, so a
notebook run and a command-line run of the same overrides are the same run (and resume each other). The run
writes the usual run directory, by default under outputs/train/<date>/<time> of the current directory.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class TrainResult:
    run_dir: Path
    best_checkpoint: Path
    monitor: str  # the metric early stopping watched (trainer.early_stopping.monitor)
    best_value: float  # its best value: what a sweeper would optimise
    history: list[dict]  # per-epoch metrics
    test_metrics: dict | None  # the best checkpoint on the test split (None with trainer.test_after_fit=false)

    def classifier(self, device: str = "auto"):
        """The best checkpoint, ready to predict."""
        from .classifier import Classifier

        return Classifier.load(self.best_checkpoint, device=device)


def train(overrides: list[str] | tuple[str, ...] = (), *, run_dir: str | Path | None = None) -> TrainResult:
    """Train (or with `resume=...` continue) one run; raises TformerError with the CLI's one-line messages."""
    from .hydra_setup import compose_tree
    from .runs.classify import configure
    from .runs.classify import train as train_run
    from .store.layout import RunDir
    from .store.ownership import new_run_dir

    from .errors import ArgumentTypeError

    given = overrides
    overrides = [] if isinstance(given, (str, bytes)) else list(given)
    if isinstance(given, (str, bytes)) or not all(isinstance(o, str) for o in overrides):
        raise ArgumentTypeError(f"train() takes a list of key=value strings, e.g. train(['model=small']), not "
                                f"{given!r:.80}")
    if run_dir is not None and not isinstance(run_dir, (str, Path)):
        raise ArgumentTypeError(f"run_dir={run_dir!r:.80} must be a path (str or pathlib.Path)")
    if any(o.startswith("-") for o in overrides):
        from .errors import TformerError

        raise TformerError(f"train() takes key=value overrides only, not {[o for o in overrides if o[:1] == '-']}; "
                           f"for sweeps call it once per setting")
    config, tree = configure(compose_tree("train", overrides))
    if run_dir is None:
        stamp = time.strftime("%Y-%m-%d/%H-%M-%S") + f"-{time.time_ns() // 1000 % 1_000_000:06d}"
        run_dir = Path("outputs") / "train" / stamp
    start = RunDir(Path(run_dir).resolve())
    new_run_dir(start.root, "train", config.resume, key="run_dir")  # never over another run
    try:
        done = train_run(config, start, tree, overrides)
    except BaseException:
        from .console import output

        output().close_log()  # an error leaves the run log closed, not collecting the caller's later output
        start.discard_if_empty()
        raise
    run = done.run_dir
    if run.root != start.root:  # resumed into the run's own directory
        start.discard_if_empty()
    return TrainResult(run_dir=run.root, best_checkpoint=run.best.path, monitor=config.trainer.early_stopping.monitor,
                       best_value=done.best_value, history=json.loads(run.history.read_text()),
                       test_metrics=json.loads(run.test_metrics.read_text()) if run.test_metrics.is_file() else None)
