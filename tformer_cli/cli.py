"""The `tformer` command: the first argument picks the command (the COMMANDS table), the rest are its arguments.

`train`, `evaluate` and `pretrain` run under Hydra (`-m` sweeps, `--cfg job`, `--help`, `hydra.run.dir=...` all
work); `predict`, `serve`, `export`, `push` and `report` parse their few options themselves, so that `predict`
starts in about the time it takes to import torch. This module stays light for that: a command's module (and
Hydra) is imported when the command runs. Every command runs under `_guarded`: a TformerError is one line on
stderr and its exit code, in a `-m` sweep job also a record in the job's folder (sweeps/job_status.py).
"""
from __future__ import annotations

import importlib
import os
import shlex
import sys
import warnings

from . import __version__
from .errors import SIGNALLED, Refused, TformerError, hydra_error_line, interrupted_by
from .safe_text import terminal
from .tasks import TASKS
from .typed_config import given_twice
from .yesno import parse_bool

USAGE = """usage: tformer {train,evaluate,calibrate,predict,pretrain,distill,audit,suggest,export,serve,push,report} [overrides ...]

  tformer train [key=value ...]           train (Hydra overrides; -m for a multirun sweep)
  tformer pretrain [key=value ...]        masked-LM pretraining on unlabeled text; then train model.init=RUN_DIR
  tformer evaluate [checkpoint=PATH ...]  metrics of a checkpoint on a split (default: newest run, test split)
  tformer calibrate [file=PATH ...]       refit a checkpoint's probabilities and label sets on labelled texts
  tformer predict "text" [...]            label texts with a checkpoint (see tformer predict --help)
  tformer distill teacher=RUN_DIR [...]   a fast student trained on a teacher's probabilities (+ unlabeled texts)
  tformer audit [key=value ...]           likely label errors (k-fold, cleanlab) and duplicate texts of a dataset
  tformer suggest file=PATH n=N           the unlabelled texts most worth labelling next, as a CSV to fill in
  tformer export [checkpoint=PATH]        the checkpoint as ONNX, checked against PyTorch (predict --runtime onnx)
  tformer serve [checkpoint=PATH]         an HTTP server: POST /predict, GET /labels, GET /health
  tformer push checkpoint=PATH repo=ID    upload to the Hugging Face Hub; load with checkpoint=hf://ID
  tformer report RUN_DIR                  config, per-epoch metrics, test metrics and plots of a run

  tformer train --help / --cfg job        Hydra's config help and the composed config
  eval "$(tformer -sc install=bash)"      tab completion of commands, config groups and keys (bash)
  tformer --version
Set TFORMER_DEBUG=1 for full tracebacks."""

# command -> (its module in tformer_cli/commands, the module's entry point, how it runs): tasks.TASKS
COMMANDS = {name: (task.module, task.entry, task.style) for name, task in TASKS.items()}
# `--help`: every key, its value and its YAML comment (commands/help.py)
KEY_HELP = tuple(name for name, task in TASKS.items() if task.key_help)


def _fail(exc: BaseException) -> None:
    """One line on stderr (and at the end of the run log); exit with the error's code. A job of a `-m` sweep also
    records how it ended in its folder (sweeps/job_status.py, read by the sweep summary), and one that failed with
    exit code 2 returns instead: the sweep goes on."""
    import signal

    held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}  # (a second Ctrl-C
    from . import console  # while the line is said, or a launcher's SIGTERM: the process ends with this line)
    from .sweeps import job_status
    from .store.layout import RunDir
    from .safe_text import terminal

    message = terminal(exc)
    code = getattr(exc, "exit_code", 2)
    # Ctrl-C is the user's choice, not a failure: its line (exit code 130) carries no "error:" prefix
    line = message if code == Stopped.exit_code else f"error: {message}"
    print(line, file=sys.stderr)
    logged = console._output is not None and console._output.log_path is not None
    if logged:  # the run log ends with what ended the run
        console._output.log_only(line)
        console._output.close_log()
    job = _hydra_job()  # None outside the Hydra commands
    if job is None:
        _exiting()
        sys.exit(code)
    run = RunDir(job.runtime.output_dir)
    in_sweep = str(job.mode) == "RunMode.MULTIRUN"
    if in_sweep and code == 2:  # one job failed: the sweep goes on; its summary lists the job with this line
        if not logged:  # refused before its log was opened (a bad config value)
            with open(run.log(job.job.config_name), "a", encoding="utf-8") as f:
                f.write(line + "\n")
        job_status.write(run.root, job_status.JobStatus.ended(code, message))
        for sig, handler in held.items():
            if handler is not None:
                signal.signal(sig, handler)
        return
    # a refused or failed command leaves no folder unless it holds a result
    if not run.discard_if_empty() and in_sweep:
        job_status.write(run.root, job_status.JobStatus.ended(code, message))
    _exiting()
    sys.exit(code)


def _exiting() -> None:
    """The command has said its last line and the interpreter is tearing down: a SIGINT or SIGTERM now (a Ctrl-C
    at the end of a finished command, a DDP launcher stopping the ranks that are left) must not turn it into an
    interrupted one or a KeyboardInterrupt traceback. Ignored (a Python handler would not do: the interpreter puts
    the default, killing one back while it tears down); Ctrl-\\ still ends a teardown that hangs. Nor may a
    library's exit hook add lines after the last one (torch stopped while it imports logs its cache statistics
    through Hydra's handlers)."""
    import logging
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    logging.disable(logging.INFO)


def _hydra_job():
    """The running Hydra job's config (run dir, mode, task name), or None when not under Hydra."""
    if "hydra" not in sys.modules:
        return None
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None


def _debug() -> bool:
    """TFORMER_DEBUG=1 (any yes of `yesno.parse_bool`; unset or empty: no): tracebacks instead of one line."""
    value = os.environ.get("TFORMER_DEBUG", "")
    return bool(value.strip()) and parse_bool(value, "TFORMER_DEBUG")


def _guarded(fn):
    """Turn user errors into one line on stderr and exit code 2 (tracebacks only with TFORMER_DEBUG=1)."""

    def wrapper(*args, **kwargs):
        if _debug():
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        except TformerError as exc:  # (one of ours wrapping what a stop broke, e.g. a file read cut short, is the stop)
            _fail(Stopped() if exc.exit_code != Stopped.exit_code and interrupted_by(exc) else exc)
        except KeyboardInterrupt:  # Ctrl-C outside the training loop (which saves and stops by itself)
            _fail(Stopped())
        except Exception as exc:
            if interrupted_by(exc):
                _fail(Stopped())
            # a DDP rank whose peer died: gloo/NCCL raise from inside a collective
            if not isinstance(exc, RuntimeError) or int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1 \
                    or not _lost_peer(exc):
                raise
            how = ("the launcher stops the rest and says how to continue" if os.environ.get("TFORMER_RANKS") else
                   "stop the other ranks, then continue the run with resume=<run dir>")
            _fail(TformerError(f"rank {os.environ.get('RANK', '?')}: another rank of this DDP run stopped "
                               f"({str(exc).splitlines()[0][:120]}); {how}"))

    return wrapper


def _lost_peer(exc: BaseException) -> bool:
    """A collective that failed because another rank is gone (torch's DistBackendError, or gloo's and NCCL's own
    RuntimeErrors), not a bug of this rank's."""
    text = str(exc).lower()
    return type(exc).__name__ == "DistBackendError" or any(
        w in text for w in ("connection closed by peer", "connection reset", "broken pipe", "read error"))


class Stopped(Exception):
    """Ctrl-C in any phase but training: every write is atomic, so what exists on disk is whole."""

    exit_code = 130

    def __str__(self) -> str:
        task = TASKS.get(_command[0]) if _command else None
        job = _hydra_job()  # (between two jobs of a sweep too: the last one's)
        sweep = task is not None and task.resumes_sweeps and bool({"-m", "--multirun"} & set(sys.argv[1:]))
        if sweep and job is not None:
            again = (f". The sweep continues with the same `tformer {_command[0]} -m ...` command plus "
                     f"{shlex.quote(f'resume={job.sweep.dir}')}")
        elif sweep:
            again = f". No job of the sweep had begun: run the same `tformer {_command[0]} -m ...` command again"
        elif task is not None and task.trains:
            again = (f". A run that had saved a checkpoint continues with `tformer {_command[0]} <same overrides> "
                     f"resume=<run dir>`")
        else:
            again = ""
        import signal  # (here, as in _stop_signals: the start-up of `tformer --version`)

        how = "SIGTERM" if SIGNALLED and SIGNALLED[-1] == signal.SIGTERM else "Ctrl-C"  # (a scheduler's stop is no key)
        return f"interrupted ({how}); nothing was left half-written{again}"


_command: list[str] = []  # the command running (`_main`), for the stop line


def _entry(task: str):
    """The entry point of `task`'s module (imported now: only the command that runs is loaded)."""
    module, name, _ = COMMANDS[task]
    return getattr(importlib.import_module(f"{__package__}.commands.{module}"), name)


def _run_argv(task: str, args: list[str]) -> None:
    sys.exit(_guarded(lambda argv: _entry(task)(argv))(args))  # (a Ctrl-C while the module imports: one line)


def _run_hydra(task: str, args: list[str]) -> None:
    try:
        if task in KEY_HELP and ("--help" in args or "-h" in args):
            from .commands import help as help_cmd

            print(_guarded(help_cmd.render)(task, [a for a in args if not a.startswith("-")]))
            return
        from . import launch

        _guarded(given_twice)(args)
        args = _guarded(launch.prepare)(task, args)  # trainer.devices=N: the ranks start here (and this exits)
        if TASKS[task].resumes_sweeps and ("-m" in args or "--multirun" in args):
            from .sweeps.summary import resume_args

            args = _guarded(resume_args)(args, task)
        _hydra_main(task, args)
    except KeyboardInterrupt:  # before our code runs (while Hydra composes the config)
        _fail(Stopped())
    except Exception as exc:
        if interrupted_by(exc):
            _fail(Stopped())
        raise


def _hydra_main(task: str, args: list[str]) -> None:
    import hydra
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    from .hydra_setup import config_dir
    from .sweeps.summary import discard_unstarted_sweep

    def fn(cfg):  # the command's module (torch, the data libraries) is imported once the config has composed: a
        from .hardware import own_host_allocator  # mistyped override is refused in the time Hydra takes, not torch's

        own_host_allocator()  # this process is ours: on CPU the commands keep freed memory for reuse
        return _entry(task)(cfg)

    sys.argv = [f"tformer {task}"] + args
    for module in ("optuna", "hydra_plugins"):  # (Optuna's deprecation notices about its own API)
        warnings.filterwarnings("ignore", category=FutureWarning, module=module)
    # Hydra raises a bad override to us instead of printing its own many-line report (a debugger's choice)
    full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        hydra.main(version_base="1.3", config_path=config_dir(), config_name=task)(_job(fn))()
    except (ConfigCompositionException, MissingConfigException, OverrideParseException) as exc:
        discard_unstarted_sweep()  # a -m sweep refused at its first job: no empty sweep dir left behind
        if full_error or _debug():
            raise
        if interrupted_by(exc):
            _fail(Stopped())
        print(f"error: {terminal(hydra_error_line(task, exc))}", file=sys.stderr)  # before any run dir exists
        sys.exit(2)
    except Refused as refused:  # a callback refused the run or sweep folder, before Hydra wrote into it
        print(f"error: {terminal(refused.error)}", file=sys.stderr)
        sys.exit(2)
    except OSError as exc:  # Hydra's own writes (the run dir, .hydra/*.yaml) on a read-only or full disk
        if _job_started or full_error or _debug() or isinstance(exc, BrokenPipeError):  # (inside a job, an OSError
            raise  # is the job's, not Hydra's set-up; a closed pipe is main()'s quiet exit)
        from .store.atomic import write_problem

        where = f" {exc.filename}" if getattr(exc, "filename", None) else " the run dir"
        print(f"error: could not write{terminal(where)}: {write_problem(exc)}", file=sys.stderr)
        sys.exit(2)
    finally:
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error


_job_started = False  # Hydra has handed over to a job: its set-up writes (run dir, .hydra) are done


def _job(fn):
    """A Hydra command's entry point, guarded; a job of a `-m` sweep records how it ended (sweeps/job_status.py):
    `_fail` writes a failure, and a job that returns is recorded done. On the screen a sweep's training job shows
    its epoch lines and one final line (sweeps/job_output.py); its train.log keeps everything."""
    guarded = _guarded(fn)

    def job(cfg):
        global _job_started
        _job_started = True
        from .sweeps import job_output, job_status

        hydra_job = _hydra_job()
        if hydra_job is None or str(hydra_job.mode) != "RunMode.MULTIRUN":
            return guarded(cfg)
        folder = hydra_job.runtime.output_dir
        job_status.clear(folder)  # a resumed sweep starting the job again
        with job_output.quiet(hydra_job):
            result = guarded(cfg)
            if job_status.read(folder) is None:  # (nothing recorded by _fail: the job returned)
                job_status.write(folder, job_status.JobStatus.ended(0))
        return result

    return job


RUNNERS = {"hydra": _run_hydra, "argv": _run_argv}


def _stop_signals() -> None:
    """SIGINT (Ctrl-C) and SIGTERM (a scheduler, `kill`, a container stop) raise KeyboardInterrupt, the one clean
    path to a stop, and are remembered (errors.SIGNALLED): a library stopped inside its own code may turn the
    KeyboardInterrupt into an error of its own, which is then the stop too (errors.interrupted_by). One that lands
    in an object's finalizer, where Python would print it and go on, is sent again a moment later, from another
    thread (sent at once, it would land in this hook, which cannot raise either). A SIGINT that a background shell
    made this process ignore stays ignored. (Training installs its own handlers, which finish the step and save:
    runs/session.py.)"""
    import _thread
    import signal  # (here, not at the top: 5 ms of `tformer --version` / `--help`)
    import threading

    def raise_interrupt(signum, frame):
        SIGNALLED.append(signum)
        raise KeyboardInterrupt

    def unraisable(info) -> None:
        if info.exc_type is not None and issubclass(info.exc_type, KeyboardInterrupt):
            again = threading.Timer(0.01, _thread.interrupt_main, (SIGNALLED[-1] if SIGNALLED else signal.SIGINT,))
            again.daemon = True
            again.start()
        else:
            sys.__unraisablehook__(info)

    signal.signal(signal.SIGTERM, raise_interrupt)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, raise_interrupt)
    sys.unraisablehook = unraisable


def main() -> None:
    try:
        _main()
    except BrokenPipeError:  # `tformer ... | head` closed the pipe: stop quietly, as Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        _exiting()
        sys.exit(141)
    except SystemExit:
        _exiting()
        raise
    except KeyboardInterrupt:  # (before the commands' own guards: the first lines of _main)
        _fail(Stopped())
    _exiting()


def _main() -> None:
    argv = sys.argv[1:]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        sys.exit(0 if argv else 2)
    if argv[0] in ("--version", "-V", "version"):
        print(f"tformer {__version__}")
        sys.exit(0)
    task, rest = argv[0], argv[1:]
    _command[:] = [task]
    try:
        _debug()  # a TFORMER_DEBUG that is not a yes/no is refused before anything runs
    except TformerError as exc:
        _fail(exc)
    _stop_signals()
    if task in ("-sc", "--shell-completion"):
        from .hydra_setup import shell_completion

        shell_completion(rest, list(COMMANDS))
        return
    if task not in COMMANDS:
        *names, last = COMMANDS
        print(f"error: unknown command {task!r}; use {', '.join(names)} or {last}", file=sys.stderr)
        sys.exit(2)
    RUNNERS[COMMANDS[task][2]](task, rest)


if __name__ == "__main__":
    main()
