"""What a job of a `-m` sweep shows on the screen: its epoch lines and one final line, e.g.

    job 2 done: optimizer.lr=0.0003 seed=1; val_accuracy 0.8125 (epoch 2); test accuracy 0.8040; outputs/...

A single run's summary, test table, per-class table and confusion matrix are worth reading once; repeated for
every job of a sweep, between Hydra's launch lines, they bury what a sweep is for: comparing jobs (the summary
table at the end does that). Everything a job prints still goes to its train.log, whole.
"""
from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path

from ..console import output
from ..safe_text import markup
from ..store.layout import RunDir
from ..tasks import TASKS
from . import naming
from .summary import read_job

QUIET_TASKS = tuple(name for name, task in TASKS.items() if task.quiet_sweeps)
# the lines a quiet job still shows: each epoch's, an early stop, a resume mid-run (training/loop.py writes them)
SHOWN = re.compile(r"(epoch +\d+/\d+ |early stopping: |resuming at epoch )")


class QuietJob:
    """The screen filter of one job (console.Output.screen_filter); notes what it kept from the screen."""

    def __init__(self):
        self.warnings = 0  # warnings shown only in train.log
        self.kept = False  # a finished job of a resumed sweep, read back rather than retrained

    def __call__(self, objects: tuple) -> bool:
        text = objects[0] if len(objects) == 1 and isinstance(objects[0], str) else ""
        if SHOWN.match(text):
            return True
        self.warnings += "[yellow]warning" in text  # (data checks, library warnings, a resume on changed data)
        self.kept = self.kept or text.endswith("; not retrained")
        return False

    def warned(self, log: str) -> str:
        """'2 warnings in <log>' (rich markup) for the warnings kept from the screen; '' for none."""
        return f"[yellow]{self.warnings} warning{'s' if self.warnings != 1 else ''}[/] in {markup(log)}" \
            if self.warnings else ""


@contextmanager
def quiet(hydra_job):
    """Around one job of a -m sweep (cli.py): the screen shows its epoch lines, then its final line once the job
    returned (done, or failed with its error line already on stderr). An interrupted job raises through here:
    its message says how to resume the sweep."""
    out = output()
    if hydra_job.job.config_name not in QUIET_TASKS or out.screen_filter is not None:
        yield
        return
    job = QuietJob()
    with out.filtered(job):
        yield
    out.print(final_line(hydra_job, job), highlight=False)


def final_line(hydra_job, seen: QuietJob | None = None) -> str:
    """`job <n> <status>: <the overrides the sweep varies>; <monitor> <best> (epoch <e>); test accuracy <a>;
    <run dir>` (rich markup)."""
    run = RunDir(hydra_job.runtime.output_dir)
    shown = naming.varying(hydra_job.overrides.task, hydra_job.sweep.dir)
    job = read_job(run, shown)
    colour = {"done": "green", "failed": "red"}.get(job.status, "yellow")
    kept = " (had finished; not retrained)" if seen is not None and seen.kept else ""
    parts = [f"job {hydra_job.job.num} [{colour}]{job.status}[/]{kept}: {markup(' '.join(shown) or '(defaults)')}"]
    if job.best is not None:
        epoch = f" (epoch {job.best_epoch})" if job.best_epoch is not None else ""
        parts.append(f"{markup(job.monitor)} {job.best:.4f}{epoch}")
    if "accuracy" in job.test:
        parts.append(f"test accuracy {job.test['accuracy']:.4f}")
    if seen is not None and seen.warnings:
        parts.append(seen.warned(run.log(hydra_job.job.config_name).name))
    return "; ".join([*parts, markup(shown_path(run.root))])


def shown_path(path: Path) -> str:
    """The path relative to the working directory when it is inside it (shorter to read and to copy)."""
    try:
        return os.path.relpath(path) if Path(path).resolve().is_relative_to(Path.cwd().resolve()) else str(path)
    except ValueError:
        return str(path)
