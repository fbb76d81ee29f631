"""Shared test helpers: the installed `tformer` command in a subprocess, real Hydra composition, tiny data."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

from tformer_cli.cli import config_dir

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
TFORMER = shutil.which("tformer", path=str(Path(sys.executable).parent)) or "tformer"


def run_tformer(*args, cwd, input=None, env=None, timeout=600):
    """Run the installed `tformer` command in a subprocess, as a user would."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    full_env.pop("TFORMER_DEBUG", None)
    return subprocess.run([TFORMER, *args], cwd=cwd, input=input, capture_output=True, text=True, env=full_env,
                          timeout=timeout)


def ctrl_c_reaches_it() -> None:
    """Popen preexec_fn: SIGINT back to its default in the child. A shell starts a background job (`make test &`,
    a CI step run with `&`) with SIGINT ignored, every child inherits that, and Python then never raises
    KeyboardInterrupt: the Ctrl-C tests would pass or fail by how pytest was launched, not by what tformer does."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupted_when(pattern: str, *args, cwd, group: bool = False, timeout: int = 300):
    """Run `tformer <args>` until a path matching `pattern` (a glob under cwd) exists, then Ctrl-C it (its whole
    process group with group=True, as a terminal does); returns (exit code, output)."""
    import glob
    import signal
    import time

    proc = subprocess.Popen([TFORMER, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=group, preexec_fn=ctrl_c_reaches_it)
    deadline = time.time() + timeout
    while time.time() < deadline and not glob.glob(str(Path(cwd) / pattern)) and proc.poll() is None:
        time.sleep(0.02)
    if group:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out


def compose_config(name="train", *overrides):
    """The config a `tformer <name> <overrides>` would get (real Hydra composition, no run)."""
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


def train_config(*overrides):
    """The typed TrainConfig of `tformer train <overrides>`."""
    from tformer_cli.commands.config import TrainConfig

    return TrainConfig.compose(overrides)


def data_config(name, **overrides):
    """The typed DataConfig of `data=<name>` with data.<key>=<value> overrides."""
    return train_config(f"data={name}", *[f"data.{k}={v}" for k, v in overrides.items()]).data


def config_options(group):
    """The options of a config group, as found on disk (never a hard-coded list)."""
    return sorted(p.stem for p in (Path(config_dir()) / group).glob("*.yaml") if not p.stem.startswith("_"))
