"""Shared test helpers: the installed `tformer` command in a subprocess, real Hydra composition, tiny data."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

from tformer_cli.hydra_setup import config_dir

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
TFORMER = shutil.which("tformer", path=str(Path(sys.executable).parent)) or "tformer"

# The one tiny training setup of the tests. A test that needs something else builds it with tiny(...), so what it
# changes is all it spells out. TINY_TRAINING fits any data (data=files too); TINY adds the demo data, cut small.
# fp32: exact, and for a model this small faster on a CPU than bf16 autocast.
TINY_TRAINING = ["trainer.epochs=1", "embedding_init.vocab_size=300", "trainer.precision=fp32"]
TINY_DATA = ["data.n_train=300", "data.n_validation=100", "data.n_test=100"]
TINY = [*TINY_DATA, *TINY_TRAINING]


def tiny(*changes: str, base=TINY, without=()) -> list[str]:
    """`base` (TINY) with `changes`: a change to a key `base` sets replaces it, the others are added; the keys in
    `without` are dropped (back to the config's default). tiny("trainer.epochs=2") is TINY trained for 2 epochs."""
    key = lambda override: override.split("=", 1)[0]
    dropped = {key(c) for c in changes} | set(without)
    return [o for o in base if key(o) not in dropped] + list(changes)


# The session's shared tiny run (conftest.py's `tiny_run`): TINY for 2 epochs (a best epoch chosen among several),
# with max_len 24 and long_text=chunks so that longer texts are read as several windows (the ONNX parity tests).
TINY_RUN = tiny("trainer.epochs=2", "model.max_len=24", "data.long_text=chunks")


def copy_run(run_dir, dest) -> Path:
    """A copy of a run (shutil.copytree) for a test that changes it: the shared `tiny_run` stays as trained."""
    return Path(shutil.copytree(run_dir, dest, symlinks=True))


def run_tformer(*args, cwd, input=None, env=None, timeout=600):
    """Run the installed `tformer` command in a subprocess, as a user would."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    full_env.pop("TFORMER_DEBUG", None)
    return subprocess.run([TFORMER, *args], cwd=cwd, input=input, capture_output=True, text=True, env=full_env,
                          timeout=timeout)


def ctrl_c_at_step(monkeypatch, objective, at: int = 5) -> None:
    """Patch `objective`'s step (a training objective class) to send this process a SIGINT at step `at`, as a
    Ctrl-C in the middle of an epoch; `monkeypatch.undo()` puts it back."""
    import signal

    real_step = objective.step

    def step(self, opt, batch, step_number, share, micro_batches):
        if step_number == at:
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(self, opt, batch, step_number, share, micro_batches)

    monkeypatch.setattr(objective, "step", step)


def ctrl_c_reaches_it() -> None:
    """Popen preexec_fn: SIGINT back to its default in the child. A shell starts a background job (`make test &`,
    a CI step run with `&`) with SIGINT ignored, every child inherits that, and Python then never raises
    KeyboardInterrupt: the Ctrl-C tests would pass or fail by how pytest was launched, not by what tformer does."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def tformer_reading(*args, cwd, group: bool = False):
    """Start `tformer <args>` (in a new session, as its own process group, with group=True), its output (stdout
    and stderr together) read as it comes: a full pipe would stop it, however slow the machine. Returns (process,
    the lines read so far, the reading thread)."""
    import threading

    proc = subprocess.Popen([TFORMER, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=group, preexec_fn=ctrl_c_reaches_it)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    return proc, lines, reader


def interrupted_when(pattern: str, *args, cwd, group: bool = False, timeout: int = 1800):
    """Run `tformer <args>` until a path matching `pattern` (a glob under cwd) exists, then Ctrl-C it (its whole
    process group with group=True, as a terminal does); returns (exit code, output). Its output is read as it
    comes (a full pipe would stop it, however slow the machine); `timeout` only ends a hung run, as a failure."""
    import glob
    import signal
    import time

    proc, lines, reader = tformer_reading(*args, cwd=cwd, group=group)
    deadline = time.monotonic() + timeout
    while not glob.glob(str(Path(cwd) / pattern)) and proc.poll() is None:
        if time.monotonic() > deadline:
            (os.killpg(proc.pid, signal.SIGKILL) if group else proc.kill())
            raise AssertionError(f"no {pattern} after {timeout} s: {''.join(lines)[-2000:]}")
        time.sleep(0.02)
    if proc.poll() is None:  # (a run that ended first is left to the caller's assertions)
        if group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
    proc.wait(timeout=300)
    reader.join(timeout=30)
    return proc.returncode, "".join(lines)


def compose_config(name="train", *overrides):
    """The config a `tformer <name> <overrides>` would get (real Hydra composition, no run)."""
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


def train_config(*overrides):
    """The typed TrainConfig of `tformer train <overrides>`."""
    from tformer_cli.runs.config import TrainConfig

    return TrainConfig.compose(overrides)


def data_config(name, **overrides):
    """The typed DataConfig of `data=<name>` with data.<key>=<value> overrides."""
    return train_config(f"data={name}", *[f"data.{k}={v}" for k, v in overrides.items()]).data


def config_options(group):
    """The options of a config group, as found on disk (never a hard-coded list)."""
    return sorted(p.stem for p in (Path(config_dir()) / group).glob("*.yaml") if not p.stem.startswith("_"))
