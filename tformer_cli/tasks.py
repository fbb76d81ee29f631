"""The commands and what each can do, in one table: how `tformer` starts it, whether it trains a run (resume=, a
finished run trained longer with trainer.epochs=<more>), whether a -m sweep of it prints one line per epoch and one
per job and whether it can be continued as a sweep, its --help listing every key, and its Python function. Each
place that needs one of these reads it here."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    module: str  # tformer_cli/commands/<module>.py
    entry: str  # its entry point: run(cfg) for "hydra", main(argv) for "argv"
    style: str  # "hydra": composes the config (-m, --cfg, --help, overrides); "argv": parses its own options
    trains: bool = False  # writes a run of checkpoints: resume=, trained longer with trainer.epochs=<more>
    quiet_sweeps: bool = False  # a -m sweep of it shows each job's epoch lines and one line per job
    resumes_sweeps: bool = False  # `tformer <it> -m <same overrides> resume=<sweep dir>` continues an interrupted sweep
    key_help: bool = False  # --help lists every key with its value and YAML comment (commands/help.py)
    api: str | None = None  # its Python entry point: tformer_cli.<api>


TASKS = {
    "train": Task("train", "run", "hydra", trains=True, quiet_sweeps=True, resumes_sweeps=True, key_help=True,
                  api="train"),
    "evaluate": Task("evaluate", "run", "hydra", key_help=True),  # (a sweep's output is its metrics: shown whole)
    "calibrate": Task("calibrate", "run", "hydra", key_help=True),
    "predict": Task("predict", "main", "argv", api="Classifier"),
    "pretrain": Task("pretrain", "run", "hydra", trains=True, quiet_sweeps=True, key_help=True),
    "distill": Task("distill", "run", "hydra", trains=True, quiet_sweeps=True, resumes_sweeps=True, key_help=True,
                    api="distill"),
    "audit": Task("audit", "run", "hydra", key_help=True, api="audit"),
    "suggest": Task("suggest", "main", "argv", api="suggest"),
    "report": Task("report", "main", "argv"),
    "export": Task("export", "main", "argv"),
    "serve": Task("serve", "main", "argv"),
    "push": Task("push", "main", "argv"),
}
