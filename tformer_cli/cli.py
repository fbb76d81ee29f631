"""The `tformer` command: the first argument picks the task, the rest are Hydra overrides.

`train` and `evaluate` run under Hydra (`-m` sweeps, `--cfg job`, `--help`, `hydra.run.dir=...` all work);
`predict` parses its few options itself so that it starts in about the time it takes to import torch.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

USAGE = """usage: tformer {train,evaluate,predict,pretrain,export,serve,push,report} [overrides ...]

  tformer train [key=value ...]           train (Hydra overrides; -m for a multirun sweep)
  tformer pretrain [key=value ...]        masked-LM pretraining on unlabeled text; then train model.init=RUN_DIR
  tformer evaluate [checkpoint=PATH ...]  metrics of a checkpoint on a split (default: newest run, test split)
  tformer predict "text" [...]            label texts with a checkpoint (see tformer predict --help)
  tformer export [checkpoint=PATH]        the checkpoint as ONNX, checked against PyTorch (predict runtime=onnx)
  tformer serve [checkpoint=PATH]         an HTTP server: POST /predict, GET /labels, GET /health
  tformer push checkpoint=PATH repo=ID    upload to the Hugging Face Hub; load with checkpoint=hf://ID
  tformer report RUN_DIR                  config, per-epoch metrics, test metrics and plots of a run

  tformer train --help / --cfg job        Hydra's config help and the composed config
  eval "$(tformer -sc install=bash)"      tab completion of commands, config groups and keys (bash)
  tformer --version
Set TFORMER_DEBUG=1 for full tracebacks."""


MAX_JOB_DIRNAME = 150  # characters of a sweep job's folder name from its overrides (file names stop at 255 bytes)


def short_dirname(overrides: str) -> str:
    """A sweep job's folder name from its overrides: as is when short, else cut and ended with a hash of the whole,
    so every job still gets its own stable name (Optuna's 17-digit floats and long grids pass 255 bytes)."""
    import hashlib

    if len(overrides.encode()) <= MAX_JOB_DIRNAME:
        return overrides
    digest = hashlib.sha1(overrides.encode()).hexdigest()[:10]
    return overrides.encode()[:MAX_JOB_DIRNAME - 12].decode(errors="ignore") + "~" + digest


def config_dir() -> str:
    """Installed wheels carry the configs inside the package; a source checkout has them at the top level. (The
    resolvers the configs use are registered here, since everything that composes them asks for this first.)"""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("tformer_dirname"):
        OmegaConf.register_new_resolver("tformer_dirname", short_dirname)
    here = Path(__file__).resolve().parent
    for candidate in (here / "configs", here.parent / "configs"):
        if (candidate / "train.yaml").is_file():
            return str(candidate)
    raise RuntimeError(f"tformer configs not found next to {here}; reinstall the package")


def _fail(exc: BaseException) -> None:
    from . import console
    from .safe_text import terminal

    line = f"error: {terminal(exc)}"
    print(line, file=sys.stderr)
    logged = console._output is not None and console._output.log_path is not None
    if logged:  # the run log ends with what ended the run
        console._output.log_only(line)
        console._output.close_log()
    code = getattr(exc, "exit_code", 2)
    job = _hydra_job()  # None outside train/evaluate
    if code == 2 and job is not None and str(job.mode) == "RunMode.MULTIRUN":
        # one job failed: the sweep goes on; its summary lists the job with this line
        if not logged:  # refused before its log was opened (a bad config value)
            from .run_dir import RunDir

            with open(RunDir(job.runtime.output_dir).log(job.job.config_name), "a", encoding="utf-8") as f:
                f.write(line + "\n")
        return
    if job is not None:  # a refused or failed train/evaluate leaves no folder unless it holds a result
        from .run_dir import RunDir

        RunDir(job.runtime.output_dir).discard_if_empty()
    sys.exit(code)


def _hydra_job():
    """The running Hydra job's config (run dir, mode, task name), or None when not under Hydra."""
    if "hydra" not in sys.modules:
        return None
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None


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
        except KeyboardInterrupt:  # Ctrl-C outside the training loop (which saves and stops by itself)
            _fail(Stopped())

    return wrapper


class Stopped(Exception):
    """Ctrl-C in any phase but training: every write is atomic, so what exists on disk is whole."""

    exit_code = 130

    def __str__(self) -> str:
        return ("interrupted (Ctrl-C); nothing was left half-written. A run that had saved a checkpoint continues "
                "with `tformer train <same overrides> resume=<run dir>`")


def _run_hydra(task: str, args: list[str]) -> None:
    import hydra

    from .commands import evaluate as evaluate_cmd
    from .commands import pretrain as pretrain_cmd
    from .commands import train as train_cmd

    from .hardware import own_host_allocator

    fn = {"train": train_cmd.run, "evaluate": evaluate_cmd.run, "pretrain": pretrain_cmd.run}[task]
    own_host_allocator()  # this process is ours: on CPU the commands keep freed memory for reuse
    sys.argv = [f"tformer {task}"] + args
    import warnings

    for module in ("optuna", "hydra_plugins"):  # Hydra's Optuna sweeper still speaks optuna 2 (its deprecations)
        warnings.filterwarnings("ignore", category=FutureWarning, module=module)
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    from .errors import hydra_error_line

    # Hydra raises a bad override to us instead of printing its own many-line report (a debugger's choice)
    full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        hydra.main(version_base="1.3", config_path=config_dir(), config_name=task)(_guarded(fn))()
    except (ConfigCompositionException, MissingConfigException, OverrideParseException) as exc:
        from .sweep import discard_unstarted_sweep

        discard_unstarted_sweep()  # a -m sweep refused at its first job: no empty sweep dir left behind
        if full_error or os.environ.get("TFORMER_DEBUG"):
            raise
        print(f"error: {hydra_error_line(task, exc)}", file=sys.stderr)  # before any run dir exists
        sys.exit(2)
    finally:
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error


COMMANDS = ("train", "evaluate", "predict", "pretrain", "report", "export", "serve", "push")


def _shell_completion(args: list[str]) -> None:
    """`eval "$(tformer -sc install=bash)"` registers completion for `tformer`; the shell then asks
    `tformer -sc query=bash` with COMP_LINE set. The first word after `tformer` is our command, so it is completed
    here, and the rest is handed to Hydra's completion of that command's config as if the command were the program."""
    import hydra

    words = os.environ.get("COMP_LINE", "").split()
    querying = any(a.startswith("query=") for a in args)
    if querying and (len(words) < 2 or (len(words) == 2 and not os.environ["COMP_LINE"].endswith(" "))):
        typed = words[1] if len(words) == 2 else ""
        print(" ".join(c for c in COMMANDS if c.startswith(typed)))
        return
    task = words[1] if querying else "train"
    if task not in ("train", "evaluate"):
        return  # predict and report take texts and paths: the shell's own file completion applies
    if querying:
        os.environ["COMP_LINE"] = " ".join(["tformer", *words[2:]]) + (" " if os.environ["COMP_LINE"].endswith(" ")
                                                                        else "")
    from .commands import evaluate as evaluate_cmd
    from .commands import train as train_cmd

    sys.argv = ["tformer", "-sc", *args]  # Hydra names the completed program after argv[0]
    fn = {"train": train_cmd.run, "evaluate": evaluate_cmd.run}[task]
    hydra.main(version_base="1.3", config_path=config_dir(), config_name=task)(fn)()


def _resume_sweep_args(args: list[str]) -> list[str]:
    """`tformer train -m <same overrides> resume=<sweep dir>|true`: the sweep goes on in its own directory (each
    job finds its folder there: finished jobs are read, not retrained; interrupted ones resume; the rest run)."""
    from .errors import TformerError
    from .run_dir import SweepDir, newest_sweep

    given = [a for a in args if a.startswith("resume=")]
    if not given:
        return args
    value = given[-1].split("=", 1)[1]
    if value.lower() in ("true", "1", "yes"):
        sweep = newest_sweep("outputs")
        if sweep is None:
            raise TformerError("resume=true with -m but there is no sweep under outputs/multirun/; run the sweep "
                               "first or pass resume=<sweep dir>")
    elif value.lower() in ("false", "null", "none", ""):
        return args
    else:
        sweep = Path(value).expanduser()
        if not SweepDir(sweep).is_sweep():
            raise TformerError(f"resume={value} with -m must be a sweep directory (outputs/multirun/<date>/<time>, "
                               f"with multirun.yaml); to continue one run, drop -m")
    if any(a.startswith("hydra.sweep.dir=") for a in args):
        raise TformerError("resume=<sweep dir> sets hydra.sweep.dir itself; drop hydra.sweep.dir=")
    sweep = sweep.resolve()
    return [a for a in args if not a.startswith("resume=")] + [f"resume={sweep}", f"hydra.sweep.dir={sweep}"]


def _distributed_args(args: list[str]) -> list[str]:
    """`trainer.devices=N` (N > 1) starts N copies of this command as the ranks of one DDP run (this process waits
    for them); under torchrun (or those copies), ranks other than 0 run in a throwaway folder: rank 0 writes."""
    import shutil
    import tempfile

    from .errors import TformerError

    given = [a.split("=", 1)[1] for a in args if a.startswith("trainer.devices=")]
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    multirun = "-m" in args or "--multirun" in args
    if world > 1:
        if multirun:
            raise TformerError("a -m sweep cannot run under torchrun; sweep with trainer.devices=N per job instead "
                               "(jobs run one after another, each on N processes)")
        if os.environ.get("RANK", "0") != "0":
            folder = tempfile.mkdtemp(prefix=f"tformer-rank{os.environ['RANK']}-")
            import atexit

            atexit.register(shutil.rmtree, folder, True)
            return args + [f"hydra.run.dir={folder}"]
        return args
    if not given:
        return args
    try:
        n = int(given[-1])
    except ValueError:
        raise TformerError(f"trainer.devices={given[-1]} must be a whole number of processes (1 = no DDP)") from None
    if n <= 1:
        return args
    if multirun:
        raise TformerError("trainer.devices>1 with -m is not supported yet; run the sweep's jobs one at a time "
                           "(or launch each with torchrun)")
    sys.exit(_launch_ranks(n, [a for a in args if not a.startswith("trainer.devices=")]))


def _launch_ranks(n: int, args: list[str]) -> int:
    """Start `tformer train` N times on this machine with the environment torchrun gives its workers (RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) and wait. The ranks share this terminal: Ctrl-C reaches each of them
    and they stop after the same step (rank 0 saves); this process only waits (torchrun's own agent would meet
    Ctrl-C with a traceback and cut the ranks short). If a rank fails, the others are stopped (a rank left alone
    would wait for the failed one forever). Returns rank 0's exit code, or the failed rank's."""
    import signal
    import socket
    import subprocess
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"[tformer] starting {n} processes (DistributedDataParallel on this machine)", flush=True)
    threads = str(max(1, (os.cpu_count() or 1) // n))  # (as torchrun: the cores shared, not oversubscribed)
    procs = []
    for rank in range(n):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
               "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        env.setdefault("OMP_NUM_THREADS", threads)
        procs.append(subprocess.Popen([sys.executable, "-m", "tformer_cli", "train", *args], env=env))
    def forward(signum, frame):  # (from the terminal the ranks got it too; they take a repeat within 1 s as one)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    failed, first_exit = None, None
    while any(p.poll() is None for p in procs):
        done = [p.returncode for p in procs if p.returncode is not None]
        first_exit = first_exit or (time.time() if procs[0].returncode is not None else None)
        bad = [c for c in done if c not in (0, 130)]
        if failed is None and bad:
            failed = bad[0]
        # a rank that failed, or ranks still running a minute after rank 0 ended (they would wait on it for ever;
        # the others end first as a rule: rank 0 alone reports): stop them, then kill what is left
        if failed is not None or (first_exit and time.time() - first_exit > 60):
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            deadline = time.time() + 30
            while time.time() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.1)
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            if failed is None:
                failed = next((c for c in (p.returncode for p in procs) if c not in (0, 130)), None)
            break
        time.sleep(0.1)
    code = failed if failed is not None else procs[0].returncode
    return code if code >= 0 else 128 - code  # (killed by signal N: 128 + N, as a shell reports it)


def _sigterm_like_ctrl_c() -> None:
    """SIGTERM (a scheduler, `kill`, a container stop) takes the same clean path as Ctrl-C."""
    import signal

    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, raise_interrupt)


def main() -> None:
    try:
        _main()
    except BrokenPipeError:  # `tformer ... | head` closed the pipe: stop quietly, as Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(141)


def _main() -> None:
    argv = sys.argv[1:]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        sys.exit(0 if argv else 2)
    if argv[0] in ("--version", "-V", "version"):
        from . import __version__

        print(f"tformer {__version__}")
        sys.exit(0)
    task, rest = argv[0], argv[1:]
    _sigterm_like_ctrl_c()
    if task in ("-sc", "--shell-completion"):
        _shell_completion(rest)
        return
    if task == "predict":
        from .commands import predict

        sys.exit(_guarded(predict.main)(rest))
    if task == "report":
        from .commands import report

        sys.exit(_guarded(report.main)(rest))
    if task == "export":
        from .commands import export

        sys.exit(_guarded(export.main)(rest))
    if task == "push":
        from .commands import push

        sys.exit(_guarded(push.main)(rest))
    if task == "serve":
        from .commands import serve

        sys.exit(_guarded(serve.main)(rest))
    if task in ("train", "evaluate") and ("--help" in rest or "-h" in rest):
        from .commands import help as help_cmd

        print(_guarded(help_cmd.render)(task, [a for a in rest if not a.startswith("-")]))
        return
    if task == "train":
        rest = _guarded(_distributed_args)(rest)
    if task == "pretrain" and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        from .errors import TformerError

        _fail(TformerError("tformer pretrain runs in one process (no DDP yet); start it without torchrun"))
    if task in ("train", "evaluate", "pretrain"):
        try:
            if task == "train" and ("-m" in rest or "--multirun" in rest):
                rest = _guarded(_resume_sweep_args)(rest)
            _run_hydra(task, rest)
        except KeyboardInterrupt:  # before our code runs (while Hydra composes the config)
            _fail(Stopped())
        return
    print(f"error: unknown command {task!r}; use train, evaluate, predict, pretrain, report, export, serve or push", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
