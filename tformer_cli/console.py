"""Where tformer's own output goes: the terminal (rich colours and tables) and, for a run, its log file.

A terminal gets rich's rendering at its width. Anything else (a file, a pipe, `tformer train > run.log`) gets full
lines: no wrapping at 80 columns, no cut table headers, no ANSI codes, because a log is read later, grepped and
diffed. A run's log file (`RunDir.log`) receives everything the terminal shows, rendered the same file-friendly
way, plus the composed config at the top and the final error or interruption line, so the run directory keeps
the whole story even when the terminal scrollback is gone.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import threading
import time
from pathlib import Path

from .safe_text import markup

WIDE = 10_000  # "as wide as the content": rich tables never expand, so this only stops wrapping
PLAIN_WIDTH = 120  # in a file, a table that can choose its layout (a confusion matrix) fits this


def fitting_width(max_width: int) -> int:
    """The width a table that can choose its layout must fit: the terminal's; in a file (WIDE), PLAIN_WIDTH, so a
    log stays readable in an editor instead of taking the whole matrix's width."""
    return min(max_width, PLAIN_WIDTH) if max_width >= WIDE else max_width


def plain_console(file):
    """A console that renders for files: full width, no colour, no wrapping."""
    from rich.console import Console  # deferred: ~40 ms that predict --json, runtime=onnx and errors never use

    return Console(file=file, width=WIDE, soft_wrap=True, no_color=True, highlight=False, emoji=False,
                   force_terminal=False, force_jupyter=False, color_system=None)


def screen_console():
    """stdout as the user sees it: rich at the terminal's width, or file-friendly when redirected."""
    from rich.console import Console  # deferred: as in plain_console

    console = Console(highlight=False) if sys.stdout.isatty() else plain_console(sys.stdout)
    # `tformer train | head`: the run goes on and its log keeps everything (rich's default exits the process)
    console.on_broken_pipe = lambda: _screen_gone(console)
    return console


def _screen_gone(console) -> None:
    console.quiet = True
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


class _LogSink:
    """A file-like target that holds text in memory until `commit(path)`, then appends to the file."""

    encoding = "utf-8"

    def __init__(self):
        self.pending: list[str] = []
        self.file = None

    def write(self, text: str) -> int:
        if self.file is not None:
            self.file.write(text)
            self.file.flush()
        else:
            self.pending.append(text)
        return len(text)

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    def isatty(self) -> bool:
        return False

    def commit(self, path: Path) -> None:
        if self.file is None:
            self.file = open(path, "a", encoding="utf-8")
            self.write("".join(self.pending))
            self.pending = []

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class Output:
    """`print` to the screen and, while a run log is open, to that file too (rich renderables included)."""

    def __init__(self):
        self.screen = screen_console()
        self.log_console = None
        self._sink: _LogSink | None = None
        self.log_path: Path | None = None
        # a quiet job of a -m sweep (sweeps/job_output.py): which prints reach the screen; the log gets them all
        self.screen_filter = None

    def print(self, *objects, **kwargs) -> None:
        if self.screen_filter is None or self.screen_filter(objects):
            self.screen.print(*objects, **kwargs)
        if self.log_console is not None:
            self.log_console.print(*objects, **kwargs)

    @contextlib.contextmanager
    def filtered(self, keep):
        """While inside, the screen shows only the prints `keep(objects)` accepts (the log still gets them all):
        a sweep's job, an audit's fold. Where a filter is on already (an audit run as a sweep's job), it stays and
        this yields None."""
        if self.screen_filter is not None:
            yield None
            return
        self.screen_filter = keep
        try:
            yield keep
        finally:
            self.screen_filter = None

    def open_log(self, path: Path, header: str = "", defer: bool = False) -> None:
        """Start (or, for a resumed run, continue) the run log; `header` goes first (the composed config).
        defer=True keeps the lines in memory until `commit_log()`: a resume that is refused leaves the run's
        log as it was."""
        self.close_log()
        self._sink, self.log_path = _LogSink(), path
        self.log_console = plain_console(self._sink)
        if header:
            self._sink.write(header.rstrip("\n") + "\n")
        if not defer:
            self.commit_log()
        _route_warnings(self)

    def commit_log(self) -> None:
        if self._sink is not None:
            self._sink.commit(self.log_path)

    def log_only(self, line: str) -> None:
        """A line for the log alone (the terminal shows it some other way, e.g. on stderr)."""
        if self._sink is not None:
            self._sink.write(line.rstrip("\n") + "\n")

    def close_log(self) -> None:
        if self._sink is not None:
            self._sink.close()
        self._sink, self.log_console, self.log_path = None, None, None


_output: Output | None = None


def output() -> Output:
    """The process's one Output (commands, the training loop and reports all print through it)."""
    global _output
    if _output is None:
        _output = Output()
    return _output


class _ToOutput(logging.Handler):
    """Third-party warnings (Python logging) shown once, in our format, and kept in the run log."""

    def __init__(self, out: Output):
        super().__init__(level=logging.WARNING)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.out.print(f"[yellow]warning[/] ({markup(record.name)}): {markup(record.getMessage())}")
        except Exception:  # a log line must never break a run
            self.handleError(record)


def _route_warnings(out: Output) -> None:
    root = logging.getLogger()
    if not any(isinstance(h, _ToOutput) for h in root.handlers):
        for h in list(root.handlers):  # Hydra's console handler would show the same lines again, unformatted
            if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) in (sys.stdout, sys.stderr):
                root.removeHandler(h)
        root.addHandler(_ToOutput(out))
    logging.captureWarnings(True)


def progress(iterable=None, *, total: int | None = None, desc: str = "", unit: str = "it", initial: int = 0,
             enabled: bool = True, unit_scale: bool = False):
    """A progress bar for anything that may take more than a few seconds. A terminal gets tqdm's bar (redrawn
    in place, gone when done); a log file or a pipe (`nohup tformer train > run.out`, a batch job) gets a plain
    line on stderr now and then instead (`progress_seconds`), since a bar there is either nothing (tqdm turns
    itself off) or thousands of carriage returns, and an hour-long epoch or a 20-minute test pass must still say how far it
    is. Both take the same calls: iteration, update(n), set_postfix(...),
    close(), `with`. Only one process of a torchrun launch shows progress (the others would repeat it).
    unit_scale: the bar writes large counts as 1.23M (plain lines always write them in full, 1,234,567)."""
    # one process of a torchrun launch shows progress; none where the screen is quiet (train(quiet=True))
    enabled = enabled and os.environ.get("RANK", "0") == "0" and not (_output is not None and _output.screen.quiet)
    if not enabled or sys.stderr.isatty():
        from tqdm.auto import tqdm  # deferred: ~60 ms; predict imports this module, and shows a bar for big files only

        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, leave=False, dynamic_ncols=True,
                    disable=not enabled, unit_scale=unit_scale)
    return PlainProgress(iterable, total=total, desc=desc, unit=unit, initial=initial)


@contextlib.contextmanager
def heartbeat(desc: str, measure, unit: str = "MB"):
    """Progress for work done by a library call that reports none (datasets converting a data file): a thread reads
    `measure()` (how far it is, in `unit`s) every second into a `progress` bar, so a log still gets a line every
    TFORMER_PROGRESS_SECONDS."""
    bar, done = progress(total=None, desc=desc, unit=unit), threading.Event()

    def watch():
        while not done.wait(1.0):
            try:
                value = int(measure())
            except OSError:  # (the folder it counts is being renamed)
                value = bar.n
            bar.update(max(0, value - bar.n))  # (0: a line still says how long it has been)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield bar
    finally:
        done.set()
        watcher.join()
        bar.close()


def progress_seconds() -> float:
    """Seconds between plain progress lines: TFORMER_PROGRESS_SECONDS, else 60."""
    try:
        seconds = float(os.environ.get("TFORMER_PROGRESS_SECONDS", 60))
    except ValueError:
        return 60.0
    return max(seconds, 0.0) if math.isfinite(seconds) else 60.0


class PlainProgress:
    """`progress` for files: '<desc>: 310/625 batches (50%), 28 min left, 31 min elapsed, loss 0.1234' lines."""

    def __init__(self, iterable=None, *, total: int | None, desc: str, unit: str, initial: int = 0):
        self.iterable, self.total, self.desc = iterable, total, desc
        self.units = unit + ("es" if unit.endswith(("ch", "sh", "s", "x")) else "s")  # batches, texts
        self.n = self.start = initial
        self.every, self.postfix, self.shown = progress_seconds(), "", None  # shown: n at the last line
        self.t0 = self.last = time.monotonic()

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update(1)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.every:
            self._print(now)

    def set_postfix(self, **values) -> None:
        self.postfix = ", ".join(f"{k} {v}" for k, v in values.items())

    def close(self) -> None:
        """A last line saying where it ended, when an earlier line said it was still going."""
        if self.shown is not None and self.shown != self.n:
            self._print(time.monotonic())

    def _print(self, now: float) -> None:
        self.shown, self.last = self.n, now
        print(self.line(now - self.t0), file=sys.stderr, flush=True)

    def line(self, elapsed: float) -> str:
        done = self.n - self.start
        if self.total:
            parts = [f"{self.n:,}/{self.total:,} {self.units} ({100 * self.n // self.total}%)"]
            if done > 0 and self.total > self.n:
                parts.append(f"{duration(elapsed / done * (self.total - self.n))} left")
        else:
            parts = [f"{self.n:,} {self.units}"]
        parts.append(f"{duration(elapsed)} elapsed")
        return f"{self.desc}: " + ", ".join(parts + ([self.postfix] if self.postfix else []))


def duration(seconds: float) -> str:
    """'42 s', '12 min', '2 h 05 min'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60:02d} min"
