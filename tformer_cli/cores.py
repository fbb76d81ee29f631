"""How many CPU threads this process computes with: the cores it may use, and its share of them beside other work.

Why not simply every core: PyTorch splits each CPU operation across a pool of threads that wait for one another at
its end. When two processes each take every core (two trainings, the jobs of a parallel sweep, a training beside a
server or any busy program), a thread whose core is taken finishes its part a time slice late and the whole pool
waits for it, thousands of times a second: on a 2-core machine two demo trainings with 2 threads each ran at 0.11x
the speed of one alone, with 1 thread each at 0.6x. So:

- usable cores: the CPUs this process may run on (its affinity: taskset, a cpuset), capped by a CPU quota (cgroup
  v2 `cpu.max`, v1 `cpu.cfs_quota_us`: `docker --cpus`, Kubernetes limits), rounded down, at least 1;
- its share: the usable cores split evenly among the tformer processes that are computing (each registers a file
  named by its pid in a folder of the temp directory; one that used under a quarter of a core in the last look
  does not count), and never more than the cores that other programs leave free (measured from /proc/stat over
  the last look, this process's own time taken out);
- followed while it runs: the training and evaluation loops call `rebalance()` after every batch; every LOOK_SECONDS
  it looks again, lowers the count at once and raises it only after two looks in a row found the cores free.

A fixed count: `trainer.threads=N` (`threads=N` for evaluate), else the environment's OMP_NUM_THREADS, is used as
given (the process still registers, so the others make room). The run log says what was chosen and why.
Threads change the order in which floating-point sums are added: a run is bit-for-bit repeatable at a fixed count.
Linux has the files this reads; elsewhere the share is the usable cores, or the fixed count.
"""
from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .console import output
from .errors import ConfigError

LOOK_SECONDS = 2.0  # between looks at the machine's load
BUSY_PEER = 0.25  # cores a registered tformer process must have used in the last look to count as computing
CGROUP_ROOT = Path("/sys/fs/cgroup")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_threads(value, key: str = "trainer.threads") -> int | None:
    """A configured thread count: a whole number >= 1, or auto/null (None: tformer chooses)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}={value!r} must be auto or a whole number of threads >= 1")
    return value


def fixed_threads(value, key: str = "trainer.threads", environ=None) -> tuple[int | None, str]:
    """(the fixed thread count, where it comes from), or (None, '') when tformer chooses: the config's value
    first, then OMP_NUM_THREADS (a positive whole number; anything else is ignored, as OpenMP ignores it)."""
    given = parse_threads(value, key)
    if given is not None:
        return given, key
    env = (os.environ if environ is None else environ).get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env), "OMP_NUM_THREADS"
    return None, ""


def affinity() -> set[int]:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def _cgroup_dirs(root: Path, self_cgroup: str) -> list[tuple[str, Path]]:
    """(version, folder) of this process's CPU cgroup and each of its parents, innermost first: v2 (`0::/path`)
    or v1 (`N:cpu,cpuacct:/path`). Folders that are not mounted are left out."""
    out = []
    for line in self_cgroup.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "" and (root / "cgroup.controllers").is_file():
            base, version = root, "v2"
        elif "cpu" in controllers.split(","):
            base = next((root / name for name in (controllers, "cpu", "cpu,cpuacct") if (root / name).is_dir()), None)
            if base is None:
                continue
            version = "v1"
        else:
            continue
        folder = base / path.lstrip("/")
        while True:
            if folder.is_dir():
                out.append((version, folder))
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def cgroup_quota(root: Path = CGROUP_ROOT, self_cgroup: str | None = None) -> float | None:
    """The CPU quota of this process's cgroups in cores (the tightest along the path to the root), None: none."""
    if self_cgroup is None:
        self_cgroup = _read(Path("/proc/self/cgroup"))
    quotas = []
    for version, folder in _cgroup_dirs(root, self_cgroup):
        if version == "v2":
            fields = _read(folder / "cpu.max").split()
            if len(fields) == 2 and fields[0] != "max":
                quota, period = fields
            else:
                continue
        else:
            quota, period = _read(folder / "cpu.cfs_quota_us").strip(), _read(folder / "cpu.cfs_period_us").strip()
        try:
            q, p = int(quota), int(period)
        except ValueError:
            continue
        if q > 0 and p > 0:
            quotas.append(q / p)
    return min(quotas) if quotas else None


def usable_cores(cpus: set[int] | None = None, quota: float | None = None, root: Path = CGROUP_ROOT,
                 self_cgroup: str | None = None) -> tuple[int, str]:
    """(cores this process may use, why): its affinity, capped by its cgroup quota rounded down (at least 1)."""
    cpus = affinity() if cpus is None else cpus
    quota = cgroup_quota(root, self_cgroup) if quota is None else quota
    count, why = len(cpus), f"{len(cpus)} CPU{'s' if len(cpus) != 1 else ''} in its affinity"
    if quota is not None and quota < count:
        count, why = max(1, math.floor(quota + 1e-9)), f"a CPU quota of {quota:g} cores ({why})"
    return max(1, count), why


def choose(usable: int, free: float, busy_peers: int) -> int:
    """The thread count: an even share of the usable cores among this process and its busy tformer peers, at most
    the cores other programs leave free (rounded to the nearest core), at least one."""
    fair = max(1, usable // (busy_peers + 1))
    return max(1, min(fair, math.floor(free + 0.5)))


# -- measuring ----------------------------------------------------------------------------------------------------

def _proc_stat(cpus: set[int]) -> float | None:
    """Seconds the CPUs in `cpus` have been busy since boot (user, nice, system, irq, softirq), from /proc/stat."""
    text = _read(Path("/proc/stat"))
    if not text:
        return None
    busy = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            v = [int(x) for x in rest.split()]
            busy += v[0] + v[1] + v[2] + (v[5] if len(v) > 5 else 0) + (v[6] if len(v) > 6 else 0)
    return busy / CLOCK_TICKS


def _process(pid: int) -> tuple[int, float] | None:
    """(start time in ticks since boot, CPU seconds used) of a process, None when it is gone."""
    text = _read(Path(f"/proc/{pid}/stat"))
    if not text:
        return None
    fields = text[text.rfind(")") + 2:].split()  # (the command name may hold spaces and parentheses)
    try:
        return int(fields[19]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (IndexError, ValueError):
        return None


def registry_dir() -> Path:
    """Where computing tformer processes of this user announce themselves: a file named by each one's pid."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"tformer-cores-{uid}"


@dataclass
class Look:
    """One reading: when, the busy seconds of the usable CPUs, this process's CPU seconds, each peer's."""

    at: float
    busy: float | None
    own: float
    peers: dict[int, float] = field(default_factory=dict)


class Share:
    """This process's threads: registered, chosen, followed (see the module's docstring)."""

    def __init__(self, fixed: int | None = None, source: str = "", registry: Path | None = None,
                 cpus: set[int] | None = None, quota: float | None = None, sets_torch: bool = True):
        self.cpus = affinity() if cpus is None else cpus
        self.usable, self.why = usable_cores(self.cpus, quota)
        self.fixed, self.source, self.sets_torch = fixed, source, sets_torch
        self.registry = registry_dir() if registry is None else registry
        self.pid, self.file = os.getpid(), None
        self.threads = fixed or self.usable
        self.pending = None  # a higher count seen at the last look: taken if the next look agrees
        self.last = self._look()

    # the registry
    def register(self) -> None:
        me = _process(self.pid)
        if me is None:  # (no /proc: nothing to share with)
            return
        try:
            self.registry.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.file = self.registry / str(self.pid)
            self.file.write_text(str(me[0]))
        except OSError:  # a read-only temp dir: this process alone does not make room for others
            self.file = None

    def unregister(self) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.unlink()
            self.file = None

    def peers(self) -> dict[int, float]:
        """{pid: CPU seconds} of the other registered tformer processes still running (stale files removed)."""
        out = {}
        try:
            entries = list(self.registry.iterdir()) if self.registry.is_dir() else []
        except OSError:
            return out
        for path in entries:
            if not path.name.isdigit() or int(path.name) == self.pid:
                continue
            proc = _process(int(path.name))
            started = _read(path).strip()
            if proc is None or str(proc[0]) != started:  # gone (or its pid taken by another program)
                if proc is None or started:
                    with contextlib.suppress(OSError):
                        path.unlink()
                continue
            out[int(path.name)] = proc[1]
        return out

    def _look(self) -> Look:
        return Look(time.monotonic(), _proc_stat(self.cpus), time.process_time(), self.peers())

    def measure(self) -> tuple[float, int]:
        """(cores the other programs left free, busy tformer peers) since the last look; the look is renewed."""
        before, now = self.last, self._look()
        self.last = now
        wall = max(now.at - before.at, 1e-6)
        busy_peers = sum(1 for pid, cpu in now.peers.items()
                         if pid not in before.peers or (cpu - before.peers[pid]) / wall >= BUSY_PEER)
        if now.busy is None or before.busy is None:
            return float(self.usable), busy_peers
        others = max(0.0, (now.busy - before.busy) - (now.own - before.own)) / wall
        return max(0.0, len(self.cpus) - others), busy_peers

    # the choice
    def apply(self, threads: int) -> None:
        """Take `threads` as the count (and set torch's, unless the caller sets it per batch: the server)."""
        if self.sets_torch:
            import torch  # (deferred: `tformer predict --runtime onnx` imports the classifier, never torch)

            if threads != torch.get_num_threads():
                torch.set_num_threads(threads)
        self.threads = threads

    def start(self) -> None:
        """The first choice, before any load was measured: the fixed count, or an even share among this process and
        the registered ones (the first look, LOOK_SECONDS on, measures what the others use)."""
        self.apply(self.fixed or choose(self.usable, self.usable, len(self.last.peers)))

    def rebalance(self) -> bool:
        """Look again if LOOK_SECONDS have passed; returns whether the thread count changed."""
        if self.fixed is not None or time.monotonic() - self.last.at < LOOK_SECONDS:
            return False
        free, busy_peers = self.measure()
        target = choose(self.usable, free, busy_peers)
        if target < self.threads or (target > self.threads and self.pending == target):
            self.pending = None
            old = self.threads
            self.apply(target)
            return target != old
        self.pending = target if target > self.threads else None
        return False

    def describe(self) -> str:
        if self.fixed is not None:
            return f"{self.fixed} thread{'s' if self.fixed != 1 else ''} ({self.source}; {self.usable} usable cores)"
        return (f"{self.threads} thread{'s' if self.threads != 1 else ''} of {self.usable} usable cores ({self.why}), "
                f"following the load of other processes (trainer.threads=N fixes it)")


_active: Share | None = None


def rebalance() -> None:
    """The loops' hook: look at the load again when it is time (a no-op without a claimed share)."""
    if _active is not None and _active.rebalance():
        output().log_only(f"threads: now {_active.threads} (other processes use the cores)")


def active() -> Share | None:
    return _active


@contextlib.contextmanager
def claimed(value=None, key: str = "trainer.threads", device_type: str = "cpu", say=None, sets_torch: bool = True):
    """This process's share of the cores for the block: registered, chosen now (said with `say`), followed by
    `rebalance()`; the previous torch thread count is put back after it (a library caller's process is left as it
    was). Nested claims reuse the outer one. On a GPU the share only sizes the host's threads (data, tokenizer).
    sets_torch=False: the share is only counted (`active().threads`), for a caller that sets torch's count itself
    per batch (the server: one thread for a little work)."""
    global _active
    if _active is not None:
        yield _active
        return
    fixed, source = fixed_threads(value, key)
    before = _torch_threads() if sets_torch else None
    share = Share(fixed, source, sets_torch=sets_torch)
    share.register()
    try:
        share.start()
        _active = share
        if say is not None:
            say(f"[bold]cpu[/] {share.describe()}" if device_type == "cpu" else
                f"[bold]cpu[/] {share.describe()} for the host's work", highlight=False)
        yield share
    finally:
        _active = None
        share.unregister()
        if before is not None and _torch_threads() != before:
            import torch

            torch.set_num_threads(before)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()
