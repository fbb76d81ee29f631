"""What a `-m` sweep did, one row per job: its overrides, status, monitored metric, best epoch, test metrics and
wall time, read back from the files each job left (so it works for a sweep that is running, finished or died).

At the end of every `tformer train -m ...` (Hydra callback `SummaryCallback`, in configs/train.yaml) the summary is
written as summary.csv and summary.md in the sweep dir and shown as a table; `tformer report <sweep dir>` shows it
again. Jobs that differ only in `seed` are also aggregated (mean ± std over the seeds whose job finished). A
grid's jobs that never started (the sweep died first) are listed too, from the sweep's plan (plan.py). Each row
names its job by number and every override that sets it apart, whatever its folder is called (naming.py: short
folder names), with floats rounded to 4 significant digits (an Optuna trial's 0.00031415926535897931 is 0.0003142;
the exact value is in the job's .hydra/overrides.yaml).
"""
from __future__ import annotations

import csv
import io
import json
import shlex
import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from rich.table import Table

from . import job_status, naming, plan
from .naming import round_floats
from ..store.atomic import write_text
from ..console import output
from ..errors import Refused, TformerError
from ..typed_config import typed_overrides
from ..store.layout import RunDir, SweepDir, newest_sweep
from ..tasks import TASKS
from ..safe_text import csv_row, markup, rich
from ..yesno import bool_or_path

try:
    from hydra.experimental.callback import Callback
except ImportError:  # hydra is a dependency; this only keeps `report` importable without it
    Callback = object


NOT_STARTED = "not started"  # a job of the sweep's plan that has no folder: the sweep died before it


@dataclass
class Job:
    name: str
    overrides: list[str]
    status: str  # done | interrupted | failed | running | not started
    monitor: str | None = None
    mode: str = "max"  # of the monitored metric: max (accuracy, F1) or min (loss)
    best: float | None = None
    best_epoch: int | None = None
    test: dict = field(default_factory=dict)
    seconds: float | None = None
    error: str | None = None
    is_best: bool = False
    varying: list[str] = field(default_factory=list)  # the overrides that tell this job from the others

    @property
    def number(self) -> str:
        return self.name.split("_")[0]

    @property
    def setting(self) -> tuple[str, ...]:
        """The varying overrides without the seed: jobs with the same setting are repeats over seeds."""
        return tuple(o for o in self.varying if not o.startswith("seed="))


def jobs(sweep_dir: Path) -> list[Job]:
    """Every job of the sweep, in job-number order, the best finished one marked; a grid's jobs that never
    started (the sweep died first) too, from its plan (plan.py)."""
    found = []
    for job_dir in SweepDir(sweep_dir).job_dirs():
        run = RunDir(job_dir)
        overrides = yaml.safe_load(run.hydra_overrides.read_text()) if run.hydra_overrides.is_file() else None
        # (resume=<sweep dir> is how the sweep was continued, not a setting)
        found.append(read_job(run, [str(o) for o in overrides or [] if not str(o).startswith("resume=")]))
    numbers = {j.number for j in found}
    unstarted = [Job(str(n), planned, NOT_STARTED) for n, planned in enumerate(plan.planned_jobs(sweep_dir) or [])
                 if str(n) not in numbers]
    found = sorted(found + unstarted, key=lambda j: int(j.number) if j.number.isdigit() else 1 << 30)
    shared = set.intersection(*(set(j.overrides) for j in found)) if found else set()
    for j in found:
        j.varying = [o for o in j.overrides if o not in shared]
    scored = [j for j in found if j.best is not None and j.status == "done"]  # (a partial best is no result)
    if scored:
        best = (min if scored[0].mode == "min" else max)(scored, key=lambda j: j.best)
        best.is_best = True
    return found


def read_job(run: RunDir, overrides: list[str]) -> Job:
    """One job as its folder tells it (a running or killed job too); also each job's final line (job_output.py)."""
    job = Job(run.root.name, overrides, "running")  # no record: running, or killed before it could write one
    ended = job_status.read(run.root)
    if ended is not None:
        job.status, job.error = ended.status, ended.message
    best_ckpt = run.best.existing()
    if best_ckpt is not None and best_ckpt.metrics.is_file():
        metrics = json.loads(best_ckpt.metrics.read_text())
        job.monitor, job.mode = best_ckpt.early_stopping()
        job.best, job.best_epoch = metrics.get(job.monitor), metrics.get("epoch")
    if run.finished:
        job.status = "done"
    if run.test_metrics.is_file():
        test = json.loads(run.test_metrics.read_text())
        job.test = {k: test[k] for k in ("accuracy", "f1") if k in test}
    if run.finished:  # training time per epoch, as recorded (a resumed sweep rewrites .hydra/ of finished jobs)
        try:
            job.seconds = sum(float(h.get("epoch_seconds", 0)) for h in json.loads(run.history.read_text()))
        except (OSError, ValueError, TypeError, AttributeError):
            pass
    times = [p.stat().st_mtime for p in run.root.rglob("*") if p.is_file()]
    if job.seconds is None and times and run.hydra_config.is_file():
        job.seconds = max(times) - run.hydra_config.stat().st_mtime
    return job


def by_seed(found: list[Job]) -> list[dict]:
    """Settings run with more than one seed: mean ± std of the monitored metric and test accuracy, over the jobs
    that finished (an interrupted job's best is that of the epochs it ran: no result yet), each configuration once
    (a sweep resumed with other values by an earlier tformer ran some twice, under two job numbers)."""
    groups: dict[tuple, dict[tuple, Job]] = {}
    left_out: dict[tuple, list[str]] = {}
    for j in found:
        if j.best is not None and j.status == "done":
            groups.setdefault(j.setting, {}).setdefault(tuple(sorted(j.overrides)), j)
        else:
            left_out.setdefault(j.setting, []).append(f"job {j.number} {j.status}")
    out = []
    for setting, unique in groups.items():
        members = list(unique.values())
        if len(members) < 2:
            continue
        best = [j.best for j in members]
        test = [j.test["accuracy"] for j in members if "accuracy" in j.test]
        out.append({"setting": round_floats(" ".join(setting)) or "(defaults)", "seeds": len(members),
                    "monitor": members[0].monitor,
                    "mean": statistics.fmean(best), "std": statistics.stdev(best),
                    "test_mean": statistics.fmean(test) if test else None,
                    "test_std": statistics.stdev(test) if len(test) > 1 else None,
                    "left_out": left_out.get(setting, [])})
    return out


def seed_line(g: dict, test_std: bool = True) -> str:
    """`<setting>: <monitor> <mean> ± <std> over <n> seeds; test accuracy <mean> ± <std>; left out: job 3
    interrupted`."""
    test = "" if g["test_mean"] is None else f"; test accuracy {g['test_mean']:.4f}" + (
        f" ± {g['test_std']:.4f}" if test_std and g["test_std"] is not None else "")
    left = f"; left out: {', '.join(g['left_out'])}" if g["left_out"] else ""
    return f"{g['setting']}: {g['monitor']} {g['mean']:.4f} ± {g['std']:.4f} over {g['seeds']} seeds{test}{left}"


COLUMNS = ["job", "overrides", "status", "monitor", "best", "best_epoch", "test_accuracy", "test_f1", "seconds",
           "error", "best_job"]


def _row(j: Job) -> dict:
    fmt = lambda v, spec: "" if v is None else format(v, spec)
    return {"job": j.number, "overrides": round_floats(" ".join(j.varying)) or "(none)", "status": j.status,
            "monitor": j.monitor or "", "best": fmt(j.best, ".4f"), "best_epoch": fmt(j.best_epoch, "d"),
            "test_accuracy": fmt(j.test.get("accuracy"), ".4f"), "test_f1": fmt(j.test.get("f1"), ".4f"),
            "seconds": fmt(j.seconds, ".0f"), "error": j.error or "", "best_job": "*" if j.is_best else ""}


def write(sweep_dir: Path, found: list[Job]) -> tuple[Path, Path]:
    """summary.csv (every column, for tools) and summary.md (for people and READMEs)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(csv_row(_row(j)) for j in found)
    rows = [_row(j) for j in found]
    shared = [o for o in (found[0].overrides if found else []) if o not in found[0].varying]
    every = f"; every job had {round_floats(' '.join(shared))}" if shared else ""
    md = [f"Sweep {sweep_dir}: {len(found)} jobs{every}", "",
          "| " + " | ".join(COLUMNS[:-2]) + " |", "|" + "---|" * (len(COLUMNS) - 2)]
    md += ["| " + " | ".join(("**" + r[c] + "**" if r["best_job"] and c == "best" else r[c].replace("|", "\\|"))
                             for c in COLUMNS[:-2]) + " |" for r in rows]
    for g in by_seed(found):
        md.append("\n" + seed_line(g))
    errors = [f"- job {r['job']}: {r['error']}" for r in rows if r["error"]]
    if errors:
        md += ["", "Errors:", *errors]
    sweep = SweepDir(sweep_dir)
    return write_text(sweep.summary_csv, buf.getvalue()), write_text(sweep.summary_md, "\n".join(md) + "\n")


def show(sweep_dir: Path, found: list[Job], console) -> None:
    table = Table(title=rich(f"sweep {sweep_dir} ({len(found)} jobs; * best)"), header_style="bold")
    for c in COLUMNS[:-2]:
        table.add_column(c, justify="right" if c in ("best", "best_epoch", "test_accuracy", "test_f1", "seconds")
                         else "left", overflow="fold")
    colour = {"done": "green", "failed": "red", "interrupted": "yellow", "running": "cyan", NOT_STARTED: "dim"}
    for j in found:
        r = _row(j)
        cells = [rich(r[c]) for c in COLUMNS[:-2]]
        cells[COLUMNS.index("status")] = f"[{colour[j.status]}]{j.status}[/]"
        if j.is_best:
            cells[COLUMNS.index("best")] = f"[bold]{r['best']} *[/]"
        table.add_row(*cells)
    console.print(table)
    for g in by_seed(found):
        console.print(rich(seed_line(g, test_std=False)))


def summarize(sweep_dir: str | Path, console=None) -> list[Job]:
    sweep_dir = Path(sweep_dir)
    found = jobs(sweep_dir)
    csv_path, md_path = write(sweep_dir, found)
    console = console or output()
    show(sweep_dir, found, console)
    console.print(f"summary: {markup(csv_path)}, {markup(md_path)}", highlight=False)
    return found


_fresh_sweep_dirs: list[Path] = []  # folders this process's sweep is about to create, deepest first


def discard_unstarted_sweep() -> None:
    """Remove the folders a refused sweep left: Hydra writes the sweep dir (multirun.yaml; Optuna's sweeper its
    optuna.db) before it composes the first job, so `tformer train -m optimizer.lrr=1,2` left an empty-looking
    outputs/multirun/<date>/<time> for each mistake. Only folders this sweep created and that hold no job folder
    go (a resumed sweep's dir existed before; a sweep that ran a job keeps everything)."""
    for folder in _fresh_sweep_dirs:
        try:
            if not folder.is_dir() or any(p.is_dir() for p in folder.iterdir()):
                break  # a job ran (or something else appeared): keep it and every folder above it
            shutil.rmtree(folder)
        except OSError:
            break
    _fresh_sweep_dirs.clear()


class FreshSweepDir(Callback):
    """Notes which folders a `-m` sweep is about to create, for `discard_unstarted_sweep` (in every command's
    config: train, evaluate and pretrain all take -m)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        root = Path(config.hydra.sweep.dir).absolute()  # (`now` is cached: the sweeper gets the same path)
        resumed = str(config.get("resume")) == str(root)  # resume_args points both at the sweep it continues
        if not resumed and root.is_dir() and any(root.iterdir()):
            task = config.hydra.job.config_name
            hint = (f"continue that sweep with `tformer {task} -m <same overrides> resume={root}`, or "
                    if SweepDir(root).is_sweep() and TASKS[task].resumes_sweeps else "")
            raise Refused(TformerError(f"hydra.sweep.dir={root} is not empty; {hint}pass a new hydra.sweep.dir (a "
                                       f"sweep never writes over another sweep or files tformer did not write)"))
        _fresh_sweep_dirs[:] = [p for p in (root, *root.parents) if not p.exists()]

    def on_multirun_end(self, config, **kwargs) -> None:
        _fresh_sweep_dirs.clear()  # the sweep ran: nothing of it is discarded


class SummaryCallback(Callback):
    """Hydra calls this when a `-m` sweep ends (finished, or after its last job failed)."""

    def on_multirun_end(self, config, **kwargs) -> None:
        output().close_log()  # the last job's log is complete; the summary belongs to the sweep
        summarize(Path(config.hydra.sweep.dir))


def resume_args(args: list[str], task: str = "train") -> list[str]:
    """`tformer <task> -m <same overrides> resume=<sweep dir>|true` (the tasks that resume sweeps: train, distill):
    the sweep goes on in its own directory (each job finds its folder there: finished jobs are read, not retrained;
    interrupted ones resume; the rest run).
    resume= is read as without -m (`yesno.bool_or_path`): a yes (resume=true, =yes, ...) is the newest sweep, a no
    or unset changes nothing, anything else must be a sweep dir."""
    given = [a for a in args if a.startswith("resume=")]
    if not given:
        return args
    value = given[-1].split("=", 1)[1]
    target = bool_or_path(value, "resume")
    if target is None or target is False:
        return args
    if target is True:
        sweep = newest_sweep("outputs", lambda folder: plan.saved_task(folder) in (task, None))
        if sweep is None:
            raise TformerError(f"resume={value} with -m but there is no `tformer {task} -m` sweep under "
                               f"outputs/multirun/; run the sweep first or pass resume=<sweep dir>")
    else:
        sweep = Path(target).expanduser()
        if not SweepDir(sweep).is_sweep():
            raise TformerError(f"resume={value} with -m must be a sweep directory (outputs/multirun/<date>/<time>, "
                               f"with multirun.yaml); to continue one run, drop -m")
        ran = plan.saved_task(sweep)
        if ran not in (task, None):
            raise TformerError(f"resume={value} is a `tformer {ran} -m` sweep; continue it with `tformer {ran} -m "
                               f"<its overrides> resume={value}`")
    if any(a.startswith("hydra.sweep.dir=") for a in args):
        raise TformerError("resume=<sweep dir> sets hydra.sweep.dir itself; drop hydra.sweep.dir=")
    sweep = sweep.resolve()
    earlier = [p.name for p in SweepDir(sweep).job_dirs() if not naming.is_current(p.name)]
    if earlier:  # its jobs would not be found under today's names: each would train again, beside its old folder
        raise TformerError(f"sweep {sweep} was started by an earlier tformer (job folders such as {earlier[0]!r}); "
                           f"resuming it here would train its jobs again: finish it with that version, or start a "
                           f"new sweep")
    ran = plan.saved_overrides(sweep)  # (None: a sweeper that records none; nothing to compare)
    saved = [o for o in ran or [] if not o.startswith("resume=")]
    changes = plan.resume_changes(saved, args, plan.is_grid(sweep)) if ran is not None else []
    if changes:  # other values would get other jobs under the same numbers, and a job done twice counted twice
        moved = [typed for key, _, typed in typed_overrides(args) if key == "data.dir"]  # (where the data is now)
        dirs = {typed for key, _, typed in typed_overrides(saved) if key == "data.dir"}
        kept = [o for o in saved if not (moved and o in dirs)]
        again = shlex.join(["tformer", task, "-m", *kept, *moved, *plan.saved_hydra_overrides(sweep),
                            f"resume={sweep}"])
        free = " and ".join(f"{k}=" for k in plan.FREE if k != "resume")
        raise TformerError(f"resume={value} changes the sweep's overrides: {', '.join(changes)}; a resumed sweep "
                           f"runs the jobs it began with (only {free} may change): continue it with `{again}`, "
                           f"or drop resume= to run the new values as a sweep of their own")
    return [a for a in args if not a.startswith("resume=")] + [f"resume={sweep}", f"hydra.sweep.dir={sweep}"]
