"""Every file and directory tformer writes goes through here: written at a temporary sibling, fsynced, then
swapped into place by `swap_in`, the one swap there is (single files, checkpoints, exports).

A crash, Ctrl-C or full disk mid-write therefore leaves the previous file or directory (or none), never half of
one, and the temporary one is removed. Failures of single-file writes become one `TformerError` line saying what
to do (free disk space, make the directory writable), whatever library raised them; the directory writers
(`checkpoint.save`, `export.export_onnx`) word their own line with `write_problem`.

JSON is encoded by `json_text` alone, and its NaN rule is explicit: see there.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors import SafetensorError

from ..errors import TformerError
from .layout import old_sibling, temporary_sibling


def write_problem(exc: BaseException) -> str:
    """'<what went wrong>; <what to do>' for a failed write."""
    said = str(exc)
    text = getattr(exc, "strerror", None) or (said.splitlines()[0] if said else type(exc).__name__)
    lowered = said.lower()
    if getattr(exc, "errno", None) == 28 or "space" in lowered:
        return f"{text}; free some disk space"
    if isinstance(exc, PermissionError) or "permission" in lowered or "read-only" in lowered:
        return f"{text}; make the output directory writable or write elsewhere (hydra.run.dir=...)"
    return f"{text}; check the output directory"


def swap_in(staged: Path, target: Path) -> None:
    """Put `staged`, a finished file or directory written at `temporary_sibling(target)`, at `target`.

    Its data is fsynced first. A file replaces the previous one in a single rename. A directory cannot be renamed
    over another, so the previous one is first renamed to `old_sibling(target)`, then `staged` to `target`, then
    the previous one is removed: if the second rename fails the previous one is put back, and if the process dies
    between the two renames it stays at its old sibling, where `CheckpointDir.existing()` finds it. Either way
    there is always a complete one to read."""
    _fsync_tree(staged)
    if not staged.is_dir():
        os.replace(staged, target)
        _fsync_dir(target.parent)
        return
    old = old_sibling(target)
    if target.exists():
        if old.exists():  # left by a crash mid-swap; `target` is complete, so it is not needed
            shutil.rmtree(old)
        os.replace(target, old)
        try:
            os.replace(staged, target)
        except OSError:
            os.replace(old, target)
            raise
    else:  # (an old sibling a crash left is then the only other copy: it stays until `staged` is in place)
        os.replace(staged, target)
    _fsync_dir(target.parent)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def fresh_sibling(target: Path) -> Iterator[Path]:
    """A fresh, empty temporary sibling of the directory `target` to write into, removed whatever happens (what
    becomes of its contents is the caller's: `staged_dir` swaps it in, ownership.replacing may move its files)."""
    tmp = temporary_sibling(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():  # this pid's own leftover
            shutil.rmtree(tmp)
        tmp.mkdir()
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def staged_dir(target: Path) -> Iterator[Path]:
    """A `fresh_sibling` of the directory `target` to write into: swapped in at `target` (`swap_in`) when the block
    ends normally, removed whatever happens. Errors are the caller's to word."""
    with fresh_sibling(target) as tmp:
        yield tmp
        swap_in(tmp, target)


def write_with(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` to produce the file at a temporary sibling, then atomically put it at `path`."""
    path = Path(path)
    tmp = temporary_sibling(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        swap_in(tmp, path)
    except (OSError, RuntimeError, ValueError, SafetensorError) as exc:  # matplotlib/safetensors wrap OSErrors
        _remove(tmp)
        if not isinstance(exc, OSError) and not _looks_like_io(exc):
            raise
        raise TformerError(f"could not write {path}: {write_problem(exc)}") from exc
    except BaseException:
        _remove(tmp)
        raise
    return path


def _fsync_tree(path: Path) -> None:
    """fsync a file, or a directory's files and then the directory itself."""
    if not path.is_dir():
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())
        return
    for f in path.iterdir():
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename into it) durable; not every file system can, which is no error."""
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _looks_like_io(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(w in text for w in ("space", "permission", "read-only", "i/o", "errno"))


def sha256_file(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB blocks (checkpoint manifests, content-keyed data caches)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_text(path: str | Path, text: str) -> Path:
    return write_with(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


OPEN_LEVELS = 2  # json_text opens containers this many levels deep; deeper ones are written on one line each


def json_text(obj, *, allow_nan: bool = False, indent: int | None = 2, open_levels: int = OPEN_LEVELS) -> str:
    """The JSON tformer writes, ending in a newline (indent=None: one line, as in metrics.jsonl); anything JSON has
    no type for is written as its str(). Containers are opened (one item a line) OPEN_LEVELS deep and written on
    one line below that: a run's 10,000 per-class entries are 10,000 lines, not 60,000 indented ones. The NaN rule,
    the one place it is decided:

    allow_nan=False (the default): strict JSON, which every parser reads: a NaN or infinite number becomes null.
        For every file other tools may read: history.json, test_metrics.json, metrics.json, reports,
        metrics.jsonl, job records, manifests.
    allow_nan=True: NaN, Infinity and -Infinity are kept as those words (Python's json reads them back exactly;
        strict parsers refuse them). Only for files tformer itself reads back and whose numbers must survive the
        round trip: a checkpoint's files (a diverged NaN loss in metrics.json, an early-stopping best of inf in
        trainer_state.json, which a resume must see as it was) and an export's export.json (its measured parity).
    """
    if not allow_nan:
        obj = _finite(obj)
    if indent is None:
        return json.dumps(obj, default=str, allow_nan=allow_nan) + "\n"
    return _laid_out(obj, indent, 0, allow_nan, open_levels) + "\n"


def _laid_out(obj, indent: int, depth: int, allow_nan: bool, levels: int) -> str:
    one_line = lambda value: json.dumps(value, default=str, allow_nan=allow_nan)
    if depth >= levels or not isinstance(obj, (dict, list, tuple)) or not obj:
        return one_line(obj)
    pad, inner = " " * (indent * depth), " " * (indent * (depth + 1))
    if isinstance(obj, dict):  # (a key as json.dumps writes it: 1 -> "1", True -> "true")
        items = [f"{inner}{one_line({k: 0})[1:-4]}: {_laid_out(v, indent, depth + 1, allow_nan, levels)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    items = [f"{inner}{_laid_out(v, indent, depth + 1, allow_nan, levels)}" for v in obj]
    return "[\n" + ",\n".join(items) + f"\n{pad}]"


def write_json(path: str | Path, obj, *, allow_nan: bool = False, open_levels: int = OPEN_LEVELS) -> Path:
    """`json_text(obj)` written atomically; strict JSON (NaN and infinities as null) unless allow_nan=True."""
    return write_text(path, json_text(obj, allow_nan=allow_nan, open_levels=open_levels))


def _finite(obj):
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


class JsonLines:
    """An append-only JSON-lines log (metrics.jsonl). Each record is one line, flushed at once, so a crash loses at
    most the line being written; `truncate_after(step)` drops records a resumed run will log again."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def truncate_after(self, step: int) -> None:
        if not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a crash
                continue
            if int(record.get("step", 0)) <= step:
                kept.append(line)
        write_text(self.path, "".join(k + "\n" for k in kept))

    def __call__(self, record: dict) -> None:
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json_text(record, indent=None))
        except OSError as exc:
            raise TformerError(f"could not write {self.path}: {write_problem(exc)}") from exc
