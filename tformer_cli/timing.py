"""Where a run's time and memory went: its phases (load, checks, vocabulary, tokenize, train, calibrate, test,
reports), each with its wall time and the peak resident memory reached during it.

The run log ends with one line of them and the run dir keeps them (timings.json), so a slow or large run says which
phase to look at, and benchmarks/scale.py reads its figures from the runs themselves. The peak of each phase is
the process's high-water mark (VmHWM), reset at the phase's start where Linux allows it (/proc/self/clear_refs);
elsewhere it is the peak so far.
"""
from __future__ import annotations

import contextlib
import resource
import sys
import time
from pathlib import Path

from .store.atomic import write_json


def _peak_mb() -> float:
    """The resident high-water mark in MiB (since the last reset, where resets work)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def _reset_peak() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak resident size (Linux >= 4.0)


class Phases:
    """The phases of one run, in order."""

    def __init__(self):
        self.records: list[dict] = []

    @contextlib.contextmanager
    def phase(self, name: str):
        _reset_peak()
        start = time.monotonic()
        try:
            yield
        finally:
            self.records.append({"phase": name, "seconds": round(time.monotonic() - start, 3),
                                 "peak_rss_mb": round(_peak_mb(), 1)})

    def save(self, path: Path) -> None:
        write_json(path, self.records)

    def line(self) -> str:
        """'time: load 1.2 s (0.4 GB), checks 0.3 s (0.4 GB), ...'."""
        return "time: " + ", ".join(f"{r['phase']} {_seconds(r['seconds'])} ({r['peak_rss_mb'] / 1024:.1f} GB)"
                                    for r in self.records)


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 600 else f"{s / 60:.0f} min"


_current: Phases | None = None


def phase(name: str):
    """A phase of the running run (a no-op outside one: the library's functions are also called alone)."""
    return _current.phase(name) if _current is not None else contextlib.nullcontext()


@contextlib.contextmanager
def recording():
    """Record the phases of the block (a run); yields the Phases."""
    global _current
    previous, _current = _current, Phases()
    try:
        yield _current
    finally:
        _current = previous
