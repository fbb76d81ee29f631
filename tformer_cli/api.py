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

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ArgumentTypeError, TformerError


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


def train(overrides: list[str] | tuple[str, ...] | dict = (), *, run_dir: str | Path | None = None, data: Any = None,
          validation_data: Any = None, test_data: Any = None, quiet: bool = False) -> TrainResult:
    """Train (or with `resume=...` continue) one run; raises TformerError with the CLI's one-line messages."""
    from .console import output

    overrides = _as_overrides(overrides)
    if run_dir is not None and not isinstance(run_dir, (str, Path)):
        raise ArgumentTypeError(f"run_dir={run_dir!r:.80} must be a path (str or pathlib.Path)")
    if any(o.startswith("-") for o in overrides):
        raise TformerError(f"train() takes key=value overrides only, not {[o for o in overrides if o[:1] == '-']}; "
                           f"for sweeps call it once per setting")
    if not isinstance(quiet, bool):
        raise ArgumentTypeError(f"quiet={quiet!r:.80} must be True or False")
    overrides += _in_memory_data(overrides, {"train": data, "validation": validation_data, "test": test_data})
    screen = output().screen
    was_quiet, screen.quiet = screen.quiet, screen.quiet or quiet
    try:
        return _train(overrides, run_dir)
    finally:
        screen.quiet = was_quiet


def _as_overrides(given) -> list[str]:
    """A list of key=value strings, from one (as the CLI takes them) or from a dict {key: value}."""
    if isinstance(given, dict):
        return [f"{key}={_override_value(key, value)}" for key, value in given.items()]
    overrides = [] if isinstance(given, (str, bytes)) else list(given)
    if isinstance(given, (str, bytes)) or not all(isinstance(o, str) for o in overrides):
        raise ArgumentTypeError(f"train() takes a list of key=value strings, e.g. train(['model=small']), or a dict, "
                                f"e.g. train({{'model': 'small'}}), not {given!r:.80}")
    return overrides


def _override_value(key, value) -> str:
    """A Python value as Hydra's override grammar reads it back: true/false, null, [a,b], quoted strings."""
    if not isinstance(key, str) or not key:
        raise ArgumentTypeError(f"train()'s dict keys are config keys like 'trainer.epochs', not {key!r:.80}")
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return repr(value)
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        plain = value and all(c.isalnum() or c in "._-/+~" for c in value)
        return value if plain else "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override_value(key, v) for v in value) + "]"
    raise ArgumentTypeError(f"train({{{key!r}: {value!r:.60}}}): a value must be a string, number, bool, None or "
                            f"list")


def _in_memory_data(overrides: list[str], splits: dict) -> list[str]:
    """data=files overrides naming parquet files of the in-memory splits (none given: none)."""
    given = {split: frame for split, frame in splits.items() if frame is not None}
    if not given:
        return []
    if "train" not in given:
        raise ArgumentTypeError("validation_data= and test_data= go with data= (the train split)")
    clash = [o for o in overrides if o.split("=", 1)[0] in ("data", "data.train_file", "data.validation_file",
                                                            "data.test_file")]
    if clash:
        raise TformerError(f"train(data=...) trains on the data given; drop {clash[0]} (or drop data=)")
    return ["data=files", *[f"data.{split}_file={_override_value('data', str(_stored(_frame(frame, split), split)))}"
                            for split, frame in given.items()]]  # (quoted: a path may hold , = or spaces)


def _frame(data, split: str):
    """A DataFrame of a DataFrame, a dict of columns, or a (texts, labels) pair."""
    import pandas as pd  # deferred: only train(data=...) needs it

    name = "data" if split == "train" else f"{split}_data"
    if isinstance(data, pd.DataFrame):
        return data
    if isinstance(data, dict):
        try:
            return pd.DataFrame(data)
        except ValueError as exc:
            raise ArgumentTypeError(f"{name}= as a dict of columns: {exc}") from None
    if isinstance(data, (tuple, list)) and len(data) == 2 and not isinstance(data[0], str):
        texts, labels = (list(part) for part in data)
        if len(texts) != len(labels):
            raise ArgumentTypeError(f"{name}=(texts, labels) has {len(texts)} texts and {len(labels)} labels; give "
                                    f"one label per text")
        return pd.DataFrame({"text": texts, "label": labels})
    raise ArgumentTypeError(f"{name}= takes a pandas DataFrame, a dict of columns or a (texts, labels) pair, not "
                            f"{type(data).__name__}")


def _stored(frame, split: str) -> Path:
    """The frame as parquet under outputs/data/<its content's hash>/: the same data is the same file (so the same
    run config, and a resume), and the run's config names a file that stays."""
    import io

    from .store.atomic import write_with
    from .store.layout import in_memory_data

    buffer = io.BytesIO()
    try:
        frame.to_parquet(buffer, index=False)
    except (ValueError, TypeError, ImportError) as exc:  # pyarrow refuses mixed or odd column types
        raise ArgumentTypeError(f"the {split} data cannot be stored as parquet ({str(exc).splitlines()[0]}); give "
                                f"texts as strings and labels as strings or integers") from None
    content = buffer.getvalue()
    path = in_memory_data(hashlib.sha256(content).hexdigest()[:16], split).resolve()
    if not path.is_file():
        write_with(path, lambda tmp: tmp.write_bytes(content))
    return path


def _train(overrides: list[str], run_dir: str | Path | None) -> TrainResult:
    from .hydra_setup import compose_tree
    from .runs.classify import configure
    from .runs.classify import train as train_run
    from .store.layout import RunDir
    from .store.ownership import new_run_dir

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
