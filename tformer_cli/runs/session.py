"""The run engine's shell, the same for every training task: where the run writes (a resumed run goes on in its own
folder), its lock and log, the checks before it goes on, device, precision and seeds, the stop handlers, the one
interruption message that says how to resume, and the loggers. A task plugs in as a `Job` (runs/classify.py,
runs/pretraining.py): what it loads, how it builds the `Run` for the loop, and what it reports at the end.
"""
from __future__ import annotations

import dataclasses
import os
import random
import shlex
import shutil
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import yaml

from .. import cores, timing
from .. import checkpoint
from ..console import Output, output
from ..errors import TformerError, interrupted_by
from ..overrides import override_value
from ..safe_text import markup
from ..typed_config import typed_keys
from ..hardware import keep_freed_host_memory, pick_device, pick_precision
from ..store.atomic import write_json
from ..store.layout import CheckpointDir, RunDir
from ..training import distributed, recipe
from ..training.loggers import build_logger
from ..training.loop import Interrupted, Run, fit
from ..training.state import TrainingState
from .resume import check_finished, check_same_run


@dataclass
class Trained:
    run_dir: RunDir  # where the run was written (a resumed run's own directory)
    best_value: float  # the monitored metric's best value (what a sweeper optimises)


@dataclass
class Resume:
    """A `last` checkpoint to continue from, checked: the run's saved config and training state, and what the
    job loaded from it (the model, or its weights)."""

    run_dir: RunDir
    config: dict
    tensors: dict
    state: dict
    loaded: Any

    @property
    def step(self) -> int:
        return int(self.state["step"])


class Job(Protocol):
    """What one training task adds to the engine."""

    task: str  # "train" | "pretrain": the log's name, the command in the resume line
    resumes_sweeps: bool  # whether `tformer <task> -m ... resume=<sweep dir>` picks up an interrupted sweep

    def load(self, ckpt: CheckpointDir) -> tuple[Any, tuple[dict, dict]]:
        ...  # (what the task keeps of a resumable checkpoint, its training state (tensors, JSON))

    def build(self, session: "Session") -> tuple[Run, str]:
        ...  # data, tokenizer, model: the Run for the loop, and the line that describes it

    def report(self, session: "Session", state: TrainingState) -> float:
        ...  # history, plots, test metrics; the best value


@dataclass
class Session:
    """One run as it happens: what every job's `build` and `report` read."""

    job: Job
    config: Any  # TrainConfig
    tree: dict  # the composed config as plain containers, saved with every checkpoint
    run_dir: RunDir
    overrides: list[str]
    console: Output
    resume: Resume | None = None
    device: torch.device | None = None
    precision: Any = None
    dist: distributed.Dist | None = None
    logger: Any = None
    prepared: Any = None  # what the job's build made (data, tokenizer, model), for its report
    allocator: str | None = None  # "retain" where freed host memory is kept for reuse (hardware.py)


def execute(job: Job, config, tree: dict, run_dir: RunDir, overrides=(), resume_from: CheckpointDir | None = None
            ) -> Trained:
    """Run `job` into run_dir, or on in the run that resume_from belongs to (Hydra's fresh folder is dropped)."""
    dist = distributed.from_env()
    if dist.enabled and not dist.is_main:
        return _execute_worker(job, config, tree, run_dir, dist, resume_from)
    console = output()
    if resume_from is not None:
        run_dir.discard_if_empty()  # the folder Hydra made for this invocation: the run goes on in its own
        run_dir = RunDir.of_checkpoint(resume_from)
    session = Session(job, config, tree, run_dir, list(overrides), console, dist=dist)
    with run_dir.lock():  # before reading `last`: another process may be writing it
        # a resume's log lines wait in memory until its checks pass: a refused resume leaves the run as it was
        console.open_log(run_dir.log(job.task), log_header(job.task, overrides, tree, resumed=resume_from is not None),
                         defer=resume_from is not None)
        if resume_from is not None:
            console.print(f"[bold]resuming[/] {markup(run_dir)}", highlight=False)
            resume_session(session, resume_from)
        best = _run_locked(session)
    console.close_log()
    return Trained(run_dir, best)


def resume_session(session: Session, ckpt: CheckpointDir) -> None:
    """session.resume from the run's `last` checkpoint, checked; an `auto` the run resolved (trainer.epochs,
    optimizer.lr) takes the run's own value, in the config as in the tree (every rank of a DDP run the same)."""
    data = getattr(session.config, "data", None)
    typed = typed_keys(session.overrides)
    session.resume = load_resume(session.job, ckpt, session.tree, bool(getattr(data, "multi_label", False)), typed)
    trainer = getattr(session.config, "trainer", None)
    if trainer is not None and recipe.said_auto(trainer.epochs):
        trainer.epochs = session.tree["trainer"]["epochs"]
    optimizer = getattr(session.config, "optimizer", None)
    if optimizer is not None and recipe.said_auto(optimizer.lr):
        optimizer.lr = session.tree["optimizer"]["lr"]
    saved = (session.resume.config.get("data") or {}) if isinstance(session.resume.config, dict) else {}
    if data is not None and not data.dir and saved.get("dir") and saved.get("name") == data.name and \
            "data.dir" not in typed:  # (data.dir=null typed: the Hub, as asked)
        # the folder the run read (a data.dir, or $TFORMER_DATA_ROOT's, which this shell may not set): read again
        session.config.data = dataclasses.replace(data, dir=saved["dir"])
        session.tree["data"]["dir"] = saved["dir"]


def load_resume(job: Job, ckpt: CheckpointDir, tree: dict, multi_label: bool = False, typed=()) -> Resume:
    """The checked training state of a run's `last` checkpoint (resume.py says what is checked; typed: the keys
    typed on the command line)."""
    run = RunDir.of_checkpoint(ckpt)
    saved = checkpoint.read_config(ckpt) if ckpt.config.is_file() else {}
    trainer, saved_epochs = tree.get("trainer") or {}, (saved.get("trainer") or {}).get("epochs")
    if recipe.said_auto(trainer.get("epochs")) and isinstance(saved_epochs, int):
        trainer["epochs"] = saved_epochs  # trainer.epochs=auto resumes with the number the run chose
    optimizer, saved_lr = tree.get("optimizer") or {}, (saved.get("optimizer") or {}).get("lr")
    if recipe.said_auto(optimizer.get("lr")) and isinstance(saved_lr, (int, float)):
        optimizer["lr"] = saved_lr  # so does optimizer.lr=auto
    loss, saved_loss = tree.get("loss") or {}, saved.get("loss") or {}
    if recipe.said_auto(loss.get("class_weights")) and "class_weights" in saved_loss:
        meant = "balanced" if multi_label else None  # what auto means for this data
        if saved_loss["class_weights"] in (meant, "auto"):  # (a run saved before auto existed says it plainly)
            loss["class_weights"] = saved_loss["class_weights"]
    extending = check_finished(run, saved, tree, job.task)
    loaded, (tensors, state) = job.load(ckpt)
    check_same_run(run, saved, tree, state, extending, typed)
    return Resume(run, saved, tensors, state, loaded)


def start(session: Session) -> None:
    """Device (joining a torchrun group), seeds and precision, in that order: joining draws random numbers."""
    config, dist = session.config, session.dist
    if config.trainer.devices > 1 and not dist.enabled:  # (the CLI's `tformer train` starts its ranks in launch.py)
        how = ("start it from a shell, `tformer train ... trainer.devices=N` (the Python API trains in this process)"
               if session.job.task == "train" else f"tformer {session.job.task} runs in one process (DDP is for "
               f"tformer train): drop trainer.devices=")
        raise TformerError(f"trainer.devices={config.trainer.devices} needs one process per rank; {how}")
    device = pick_device(config.trainer.device)
    allocator = keep_freed_host_memory(device)
    if dist.enabled:
        device = distributed.init(dist, device)
        session.console.print(f"[bold]distributed[/] {dist.world} processes (DDP, "
                              f"{'NCCL' if device.type == 'cuda' else 'gloo'}), global batch "
                              f"{config.trainer.batch_size}; rank 0 writes", highlight=False)
    seed_everything(config.seed)
    session.device, session.precision = device, pick_precision(config.trainer.precision, device)
    session.allocator = allocator
    torch.set_float32_matmul_precision("high")


def _run_locked(session: Session) -> float:
    start(session)
    with cores.claimed(session.config.trainer.threads, device_type=session.device.type, say=session.console.print), \
            timing.recording() as phases:
        try:
            best = _run_started(session)
        except Interrupted:  # (a stopped run keeps where its time went; a refused or failed one writes nothing)
            phases.save(session.run_dir.timings)
            raise
        phases.save(session.run_dir.timings)
        session.console.print(phases.line(), highlight=False)
        return best


def _run_started(session: Session) -> float:
    config, run_dir, console, resume = session.config, session.run_dir, session.console, session.resume
    # (before the data is read: a tracker that cannot be used is refused in seconds, not after minutes of reading)
    session.logger = build_logger(config.logger, run_dir, session.overrides, say=console.print)
    run, description = session.job.build(session)
    console.commit_log()
    if resume is not None and run_dir.finished:  # being trained longer: unfinished again until it ends, so an
        run_dir.history.unlink()                  # interruption of the extension can itself be resumed
    console.print(f"{description}; [bold]device[/] {session.device}"
                  f"{' (host allocator: freed memory kept for reuse)' if session.allocator == 'retain' else ''}, precision "
                  f"{session.precision.name}; run dir {markup(run_dir)}", highlight=False)
    session.logger.start(session.tree, resume.step if resume is not None else None)
    metrics_log = run.log_metrics
    run.log_metrics = lambda record: (metrics_log(record), session.logger.log(record))
    run.dist, run.say = session.dist, console.print
    status = "FAILED"
    exact = getattr(run.objective, "exact_slices", True)
    try:
        restore = install_signal_handlers(run)
        try:
            with timing.phase("train"):
                state = fit(run)
        except torch.cuda.OutOfMemoryError as exc:
            raise _out_of_memory(config, session.dist, "GPU", exact) from exc
        except RuntimeError as exc:  # the CPU allocator's refusal of one big block (the OOM killer gives no word)
            if "can't allocate memory" not in str(exc) and "not enough memory" not in str(exc):
                raise
            raise _out_of_memory(config, session.dist, "host", exact) from exc
        except Interrupted as exc:
            status = "KILLED"
            raise Interrupted(f"{exc}; {resume_hint(session)}") from None
        finally:
            restore()  # Ctrl-C while reporting: the generic one-line stop (the checkpoints are complete)
            distributed.shutdown()  # (the other ranks are done: rank 0 reports alone)
        try:
            best = session.job.report(session, state)
        except BaseException as exc:  # trained to its end, not yet calibrated, tested or reported: unfinished
            if not (isinstance(exc, KeyboardInterrupt) or interrupted_by(exc)):
                raise
            status = "KILLED"
            raise Interrupted(f"interrupted after training, before its reports (calibration, test) were all "
                              f"written; {resume_hint(session)}") from None
        write_json(run_dir.history, state.history)  # the run's finished mark (layout.RunDir.finished): last
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        session.logger.finish(status)
    if not config.trainer.keep_optimizer_state:
        checkpoint.drop_training_state(run_dir.last)
    return best


def resume_hint(session: Session) -> str:
    """How to pick an interrupted run up: the whole sweep for a job of a `-m` sweep, else the same command."""
    sweep = session.run_dir.sweep() if session.job.resumes_sweeps else None
    if sweep is not None:
        return (f"resume the sweep with the same `tformer {session.job.task} -m ...` command plus "
                f"{shlex.quote(f'resume={sweep}')}")
    command = shlex.join(["tformer", session.job.task, *[o for o in session.overrides if not o.startswith("resume=")],
                          *([f"trainer.devices={session.dist.world}"] if session.dist.enabled else []),
                          f"resume={override_value('resume', str(session.run_dir))}"])  # (quoted for Hydra, then
    # for the shell: a path with a space, a comma or an accent pastes back)
    return f"resume with: {command}"


def _out_of_memory(config, dist, where: str, exact_slices: bool = True) -> TformerError:
    """exact_slices: the objective's word on whether slices add up to the batch's update (not with
    distill.relations: a slice's texts are related among themselves), so that more of them may be added to
    resume=."""
    micro, rows = config.trainer.micro_batches, config.trainer.batch_size // dist.world
    how = "the same updates in slices; it may be added to resume=" if exact_slices else \
        "in a new run: distill.relations relates the texts of one slice"
    slices = f"trainer.micro_batches={micro * 2} ({how}), " if micro * 2 <= rows else ""
    return TformerError(f"out of {where} memory with trainer.batch_size={config.trainer.batch_size} and "
                        f"model.max_len={config.model['max_len']}; try {slices}a lower model.max_len, or "
                        f"trainer.eval_batch_size={max(1, config.trainer.eval_batch_size // 2)} if it was "
                        f"validating (the last checkpoint is kept)")


def _execute_worker(job: Job, config, tree: dict, run_dir: RunDir, dist, resume_from) -> Trained:
    """A torchrun rank other than 0: the same data, model, optimizer state and steps as rank 0, writing nothing
    (its Hydra folder is a throwaway one; rank 0 writes checkpoints, logs and reports)."""
    console = output()
    console.screen.quiet = True  # one voice: rank 0's (its warnings too)
    warnings.simplefilter("ignore")
    session = Session(job, config, tree, run_dir, [], console, dist=dist)
    if resume_from is not None:
        resume_session(session, resume_from)  # (the same epochs as rank 0: the run's own number)
    start(session)
    with cores.claimed(config.trainer.threads, device_type=session.device.type):
        return _worker_fit(session, run_dir, dist)


def _worker_fit(session: Session, run_dir: RunDir, dist) -> Trained:
    run, _ = session.job.build(session)
    run.save_checkpoint, run.log_metrics, run.dist = (lambda *args: None), None, dist
    run.say = lambda *args, **kwargs: None
    restore = install_signal_handlers(run, quiet=True)
    try:
        state = fit(run)
    except Interrupted:  # rank 0 says it (and saved the checkpoint); this rank wrote nothing but its throwaway
        restore()  # folder, so it ends here: an interrupted rank's interpreter teardown could hang (seen under
        distributed.shutdown()  # load, with the other ranks gone), and the launcher would have to kill it
        if run_dir.root.name.startswith("tformer-rank"):  # (launch.py's throwaway folder; atexit would remove it)
            shutil.rmtree(run_dir.root, ignore_errors=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    finally:
        restore()
        distributed.shutdown()
    return Trained(run_dir, float(state.best_metrics["best_value"]))


def log_header(task: str, overrides, tree: dict, resumed: bool = False) -> str:
    """The top of a run log: the command, when, and the composed config."""
    command = " ".join(["tformer", task, *overrides])
    if resumed:
        return f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} resumed: {command}\n"
    return (f"===== {time.strftime('%Y-%m-%d %H:%M:%S')} {command}\n"
            + yaml.safe_dump(tree, sort_keys=False, allow_unicode=True) + "=====\n")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def install_signal_handlers(run: Run, quiet: bool = False):
    """First SIGINT/SIGTERM: finish the step, save, stop. Second: exit at once (checkpoints are atomic). A second
    signal within a second is the same stop (Ctrl-C under torchrun: the terminal's SIGINT, then torchrun's
    SIGTERM). Returns what puts the previous handlers back."""
    first = []

    def handler(signum, frame):
        if run.stop_requested and first and time.monotonic() - first[0] < 1.0:
            return
        if run.stop_requested:
            say("\n[tformer] second interrupt: exiting now")
            os._exit(130)
        run.stop_requested = True
        first.append(time.monotonic())
        if not quiet:
            say(f"\n[tformer] {signal.Signals(signum).name}: finishing this step and saving the last checkpoint "
                f"(again to exit at once)")

    def say(line: str) -> None:  # (a closed terminal must not turn the stop into an error inside the step)
        try:
            print(line, flush=True)
        except OSError:
            pass

    if threading.current_thread() is not threading.main_thread():  # e.g. a library caller's worker thread
        return lambda: None
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    return lambda: [signal.signal(sig, h) for sig, h in previous.items()]
