"""Every file tformer writes goes through here: into a temporary sibling, fsynced, renamed into place.

A crash, Ctrl-C or full disk mid-write therefore leaves the previous file (or none), never half of one, and the
temporary file is removed. Failures become one `TformerError` line saying what to do (free disk space, make the
directory writable), whatever library raised them. Checkpoint directories use the same idea one level up
(`checkpoint.save`: a temporary directory swapped in).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from .errors import TformerError
from .run_dir import temporary_sibling


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


def write_with(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` to produce the file at a temporary sibling, then atomically put it at `path`."""
    path = Path(path)
    tmp = temporary_sibling(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError, ValueError) as exc:  # matplotlib/safetensors wrap OSErrors in their own types
        _remove(tmp)
        if isinstance(exc, (RuntimeError, ValueError)) and not _looks_like_io(exc):
            raise
        raise TformerError(f"could not write {path}: {write_problem(exc)}") from exc
    except BaseException:
        _remove(tmp)
        raise
    return path


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
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_text(path: str | Path, text: str) -> Path:
    return write_with(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(path: str | Path, obj) -> Path:
    """Strict JSON, indented: a NaN or infinite number is written as null (JSON has no NaN)."""
    return write_text(path, json.dumps(_finite(obj), indent=2, default=str, allow_nan=False) + "\n")


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
                f.write(json.dumps(_finite(record), allow_nan=False, default=str) + "\n")
        except OSError as exc:
            raise TformerError(f"could not write {self.path}: {write_problem(exc)}") from exc
