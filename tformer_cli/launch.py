"""Processes per command, before Hydra runs: `tformer train trainer.devices=N` (N > 1) starts N copies of itself as
the ranks of one DDP run and waits for them; under torchrun (or those copies) every rank but 0 runs in a
throwaway folder; `pretrain` runs in one process only."""
from __future__ import annotations

import atexit
import ctypes
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from . import cores
from .errors import TformerError
from .typed_config import typed_overrides, typed_values

LAUNCHER_PID = "TFORMER_LAUNCHER_PID"  # set for the ranks `launch_ranks` starts
PR_SET_PDEATHSIG = 1  # (linux/prctl.h)


def world_size() -> int:
    """WORLD_SIZE as torchrun (or `launch_ranks`) sets it; 1 outside a launch."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def prepare(task: str, args: list[str]) -> list[str]:
    """The overrides `task` runs with in this process (a worker rank's throwaway run dir added); for
    `train trainer.devices=N` this process starts the N ranks, waits, and exits with their exit code."""
    if task == "train":
        return distributed_args(args)
    if task == "pretrain" and world_size() > 1:
        raise TformerError("tformer pretrain runs in one process (no DDP yet); start it without torchrun")
    return args


def distributed_args(args: list[str]) -> list[str]:
    """`trainer.devices=N` (N > 1) starts N copies of this command as the ranks of one DDP run (this process waits
    for them); under torchrun (or those copies), ranks other than 0 run in a throwaway folder: rank 0 writes."""
    given = typed_values(args, "trainer.devices")
    multirun = "-m" in args or "--multirun" in args
    if world_size() > 1:
        if multirun:
            raise TformerError("a -m sweep cannot run under torchrun; sweep with trainer.devices=N per job instead "
                               "(jobs run one after another, each on N processes)")
        stop_with_launcher()
        if os.environ.get("RANK", "0") != "0":
            folder = tempfile.mkdtemp(prefix=f"tformer-rank{os.environ['RANK']}-")
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
    gpus = visible_gpus((typed_values(args, "trainer.device") or ["auto"])[-1])
    if gpus and n > gpus:  # (rank r takes GPU r: a rank past the last GPU would fail on a device that is not there)
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise TformerError(f"trainer.devices={n} starts one process per GPU and this machine shows {gpus}"
                           f"{f' (CUDA_VISIBLE_DEVICES={shown})' if shown else ''}; give trainer.devices={gpus}"
                           f"{' or fewer' if gpus > 1 else ''}, or add trainer.device=cpu to train on the CPU")
    most = max(2, 2 * cores.usable_cores()[0])  # (each rank is a process with its own threads and model copy)
    if not gpus and n > most:
        raise TformerError(f"trainer.devices={n} is more processes than this machine can run side by side "
                           f"({cores.usable_cores()[1]}: at most {most}); one rank per GPU or per core or two "
                           f"is the most that helps")
    if multirun:
        raise TformerError("trainer.devices>1 with -m is not supported yet; run the sweep's jobs one at a time "
                           "(or launch each with torchrun)")
    devices = {typed for key, _, typed in typed_overrides(args) if key == "trainer.devices"}
    sys.exit(launch_ranks(n, [a for a in args if a not in devices]))


def visible_gpus(device: str) -> int:
    """How many GPUs the ranks of `trainer.device=<device>` would train on: 0 where they train on the CPU (or
    an Apple GPU: one process). torch is imported here, not at the top: every Hydra command imports this module, and
    only a launch of several ranks needs the count (the ranks import torch anyway)."""
    if not (device == "auto" or device.startswith("cuda")):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def stop_with_launcher() -> None:
    """A rank started by `launch_ranks` gets SIGTERM (save, stop) when its launcher dies (Linux): in a process
    group of its own it no longer gets the terminal's signals, and without this a SIGKILLed launcher would leave it
    training. Output to the terminal goes on from that background group (SIGTTOU ignored: `stty tostop` would
    stop a rank at its first line, and the others would wait on it)."""
    launcher = os.environ.get(LAUNCHER_PID)
    if not launcher:
        return
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    if not sys.platform.startswith("linux"):
        return
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        return  # (refused, e.g. by a seccomp policy: the launcher's death is then not seen)
    if os.getppid() != int(launcher):  # (it died before the line above)
        os.kill(os.getpid(), signal.SIGTERM)


def launch_ranks(n: int, args: list[str]) -> int:
    """Start `tformer train` N times on this machine with the environment torchrun gives its workers (RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) and wait. Each rank runs in a process group of its own, so a
    terminal's Ctrl-C reaches this process alone and it passes each signal on exactly once: had the ranks got it
    from the terminal as well, a rank busy in a save or a collective could run the forwarded copy's handler more
    than a second later and take it for a second Ctrl-C (exit at once). They stop after the same step (rank 0
    saves); torchrun's own agent would meet Ctrl-C with a traceback and cut the ranks short. Ctrl-Z stops the
    ranks with this process, and `fg` continues them. On Linux a rank whose launcher is killed gets SIGTERM from
    the kernel and stops the same way. If a rank fails, the others are stopped (a rank left alone would wait for
    the failed one forever). The ranks read no input (stdin is /dev/null: a prompt fails at once instead of
    stopping a background rank). Returns rank 0's exit code, or the failed rank's."""
    procs: list[subprocess.Popen] = []
    stopped: list[int] = []  # a Ctrl-C or SIGTERM while the ranks are being started: no more are started

    def forward(signum, frame):  # the ranks' only way to get it (their own process groups)
        if signum in (signal.SIGINT, signal.SIGTERM):
            stopped.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    def suspend(signum, frame):  # Ctrl-Z: the ranks stop with this process and go on when it does
        forward(signal.SIGSTOP, frame)
        os.kill(os.getpid(), signal.SIGSTOP)
        forward(signal.SIGCONT, frame)  # (runs once this process is continued: fg, bg, kill -CONT)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    if hasattr(signal, "SIGTSTP"):
        signal.signal(signal.SIGTSTP, suspend)
    _start_ranks(n, args, procs, stopped)
    if not procs:  # (a signal before the first rank started)
        return 130
    failed, first_exit = None, None
    while None in [p.poll() for p in procs]:  # (every rank polled: a dead rank 1 is seen while rank 0 runs)
        first_exit = first_exit or (time.time() if procs[0].returncode is not None else None)
        failed = failed if failed is not None else _first_failure(procs)
        # a rank that failed, or ranks still running a minute after rank 0 ended (they would wait on it for ever;
        # the others end first as a rule: rank 0 alone reports): stop them, then kill what is left
        if failed is not None or (first_exit and time.time() - first_exit > 60):
            grace = time.time() + 5  # ranks that lost a peer say so in one line and end by themselves
            while failed is not None and time.time() < grace and None in [p.poll() for p in procs]:
                time.sleep(0.1)
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
            failed = _first_failure(procs) or failed  # (a rank killed while the others reported losing it)
            break
        time.sleep(0.1)
    if failed is None:  # (every rank had ended by the time it was looked at)
        failed = _first_failure(procs)
    code = failed if failed is not None else procs[0].returncode
    code = code if code >= 0 else 128 - code  # (killed by signal N: 128 + N, as a shell reports it)
    if failed is not None and failed != 2:  # (2: a refusal, which the rank said in one line)
        rank = next((r for r, p in enumerate(procs) if p.returncode == failed), "?")
        how = f"killed by signal {-failed}" if failed < 0 else f"exit code {failed}"
        folder = next((a.split("=", 1)[1] for a in reversed(args) if a.startswith("hydra.run.dir=")), None)
        kept = [a for a in args if not a.startswith(("hydra.run.dir=", "resume="))]
        print(f"[tformer] rank {rank} stopped ({how}); the other ranks were stopped. A run that saved a checkpoint "
              f"continues with: tformer train {shlex.join(kept)} trainer.devices={n} "
              f"resume={shlex.quote(folder) if folder else 'true'}", file=sys.stderr, flush=True)
    return code


def _start_ranks(n: int, args: list[str], procs: list, stopped: list) -> None:
    """Start the N ranks into `procs` (which the signal handlers read as it grows), each with torchrun's environment
    and a process group of its own; none after a signal has come (`stopped`): the started ones got it, the rest
    would only wait for peers that stop."""
    # (a process group of its own: Popen's process_group from Python 3.11, setpgid before exec on 3.10)
    own_group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"[tformer] starting {n} processes (DistributedDataParallel on this machine)", flush=True)
    threads = str(max(1, cores.usable_cores()[0] // n))  # the usable cores shared, not oversubscribed
    for rank in range(n):
        if stopped:
            return
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
               "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "TFORMER_RANKS": str(n), LAUNCHER_PID: str(os.getpid())}  # (this process reports a rank that dies)
        env.setdefault("OMP_NUM_THREADS", threads)
        procs.append(subprocess.Popen([sys.executable, "-m", "tformer_cli", "train", *args], env=env,
                                      stdin=subprocess.DEVNULL, **own_group))


def _first_failure(procs) -> int | None:
    """The exit code that is the news among the ranks that ended: a failure other than 2 (a rank that died, not
    another rank's one-line report of losing it), else a 2; None while none failed (0 and Ctrl-C's 130 are not)."""
    bad = [c for c in (p.returncode for p in procs) if c is not None and c not in (0, 130)]
    return next((c for c in bad if c != 2), bad[0]) if bad else None
