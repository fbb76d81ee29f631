"""The `tformer` command: the first argument picks the task, the rest are Hydra overrides.

`train` and `evaluate` run under Hydra (`-m` sweeps, `--cfg job`, `--help`, `hydra.run.dir=...` all work);
`predict` parses its few options itself so that it starts in about the time it takes to import torch.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

USAGE = """usage: tformer {train,evaluate,predict} [overrides ...]

  tformer train [key=value ...]           train (Hydra overrides; -m for a multirun sweep)
  tformer evaluate [checkpoint=PATH ...]  metrics of a checkpoint on a split (default: newest run, test split)
  tformer predict "text" [...]            label texts with a checkpoint (see tformer predict --help)
  tformer report RUN_DIR                  config, per-epoch metrics, test metrics and plots of a run

  tformer train --help / --cfg job        Hydra's config help and the composed config
  tformer --version
Set TFORMER_DEBUG=1 for full tracebacks."""


def config_dir() -> str:
    """Installed wheels carry the configs inside the package; a source checkout has them at the top level."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "configs", here.parent / "configs"):
        if (candidate / "train.yaml").is_file():
            return str(candidate)
    raise RuntimeError(f"tformer configs not found next to {here}; reinstall the package")


def _fail(exc: BaseException) -> None:
    from .safe_text import terminal

    print(f"error: {terminal(exc)}", file=sys.stderr)
    sys.exit(getattr(exc, "exit_code", 2))


def _guarded(fn):
    """Turn user errors into one line on stderr and exit code 2 (tracebacks only with TFORMER_DEBUG=1)."""
    from .errors import TformerError

    def wrapper(*args, **kwargs):
        if os.environ.get("TFORMER_DEBUG"):
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        except TformerError as exc:
            _fail(exc)

    return wrapper


def _run_hydra(task: str, args: list[str]) -> None:
    import hydra

    from .commands import evaluate as evaluate_cmd
    from .commands import train as train_cmd

    fn = {"train": train_cmd.run, "evaluate": evaluate_cmd.run}[task]
    sys.argv = [f"tformer {task}"] + args
    hydra.main(version_base="1.3", config_path=config_dir(), config_name=task)(_guarded(fn))()


def main() -> None:
    argv = sys.argv[1:]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        sys.exit(0 if argv else 2)
    if argv[0] in ("--version", "-V", "version"):
        from . import __version__

        print(f"tformer {__version__}")
        sys.exit(0)
    task, rest = argv[0], argv[1:]
    if task == "predict":
        from .commands import predict

        sys.exit(_guarded(predict.main)(rest))
    if task == "report":
        from .commands import report

        sys.exit(_guarded(report.main)(rest))
    if task in ("train", "evaluate"):
        _run_hydra(task, rest)
        return
    print(f"error: unknown command {task!r}; use train, evaluate, predict or report", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
