"""Where tformer's own output goes: the terminal (rich colours and tables) and, for a run, its log file.

A terminal gets rich's rendering at its width. Anything else (a file, a pipe, `tformer train > run.log`) gets full
lines: no wrapping at 80 columns, no cut table headers, no ANSI codes, because a log is read later, grepped and
diffed. A run's log file (`RunDir.log`) receives everything the terminal shows, rendered the same file-friendly
way, plus the composed config at the top and the final error or interruption line, so the run directory keeps
the whole story even when the terminal scrollback is gone.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

WIDE = 10_000  # "as wide as the content": rich tables never expand, so this only stops wrapping


def plain_console(file):
    """A console that renders for files: full width, no colour, no wrapping."""
    from rich.console import Console

    return Console(file=file, width=WIDE, soft_wrap=True, no_color=True, highlight=False, emoji=False,
                   force_terminal=False, force_jupyter=False, color_system=None)


def screen_console():
    """stdout as the user sees it: rich at the terminal's width, or file-friendly when redirected."""
    from rich.console import Console

    console = Console(highlight=False) if sys.stdout.isatty() else plain_console(sys.stdout)
    # `tformer train | head`: the run goes on and its log keeps everything (rich's default exits the process)
    console.on_broken_pipe = lambda: _screen_gone(console)
    return console


def _screen_gone(console) -> None:
    import os

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

    def print(self, *objects, **kwargs) -> None:
        self.screen.print(*objects, **kwargs)
        if self.log_console is not None:
            self.log_console.print(*objects, **kwargs)

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
        from .safe_text import markup

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
