"""Which folders are tformer's to replace or remove: those holding its marker file (`.tformer`, written when
tformer creates the folder: the folder's kind, a random id, the names it wrote), and nothing else.

Why a marker and not a guess from the contents: a project folder can hold a `manifest.json` and a `README.md` (or
a `checkpoints/` of its own) without being an earlier `tformer push` stage, and a folder taken for ours would be
emptied. So a stage, an export or a run goes into a folder that is new, empty, or marked as the same kind; a marked
folder that has gained files tformer did not write is refused too, since replacing it would delete them. Every
refusal is one line naming the folder, the reason, and what to pass instead.
"""
from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import TformerError
from ..tasks import TASKS
from .atomic import fresh_sibling, json_text, swap_in, write_problem
from .layout import KINDS, MARKER, RunDir, marker, resolve_resumable, temporary_sibling


def mark(folder: str | Path, kind: str, parents: int = 0) -> None:
    """Write `folder`'s marker: its kind, a random id (two folders are never taken for one), the names it holds
    now (what replacing it may remove) and how many folders above it were made with it (`RunDir.discard_if_empty`
    removes those too when they are left empty: a refused run leaves no empty outputs/<task>/<date>)."""
    assert kind in KINDS, kind
    folder = Path(folder)
    files = sorted(p.name for p in folder.iterdir() if p.name != MARKER)
    record = {"kind": kind, "id": secrets.token_hex(8), "created": time.time(), "files": files, "parents": parents}
    (folder / MARKER).write_text(json_text(record) + "\n", encoding="utf-8")


def is_ours(folder: str | Path, kind: str) -> bool:
    found = marker(folder)
    return found is not None and found["kind"] == kind


def _a(kind: str) -> str:
    return ("an " if kind[0] in "aeiou" else "a ") + kind


def check_replaceable(folder: str | Path, kind: str, key: str,
                      legacy: Callable[[Path], set[str] | None] | None = None) -> None:
    """Refuse (one line) unless `folder` is missing, empty, or a marked `kind` folder holding only what tformer
    wrote. `legacy(folder)` may name the files of a folder written before markers existed (e.g. an export whose
    manifest lists every file in it): such a folder counts as ours when it holds exactly those."""
    given, folder = folder, Path(folder).absolute()
    if not folder.exists():
        return
    if not folder.is_dir():
        raise TformerError(f"{key}={given} is a file; pass a folder (new, empty, or an earlier {kind} of tformer)")
    entries = {p.name for p in folder.iterdir()}
    if not entries:
        return
    found = marker(folder)
    if found is None:
        known = legacy(folder) if legacy is not None else None
        if known is not None and entries <= known:
            return
        raise TformerError(f"{key}={given} is not empty and is not {_a(kind)} tformer wrote (it has no {MARKER} "
                           f"marker); pass a new or empty folder: tformer never deletes files it did not write")
    if found["kind"] != kind:
        raise TformerError(f"{key}={given} is {_a(found['kind'])} folder of tformer, not {_a(kind)}; pass a new or "
                           f"empty folder")
    foreign = sorted(entries - set(found["files"]) - {MARKER})
    if foreign:
        listed = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise TformerError(f"{key}={given} holds files tformer did not write there ({listed}); move them out or "
                           f"pass another folder: replacing it would delete them")


@contextmanager
def replacing(folder: str | Path, kind: str, key: str,
              legacy: Callable[[Path], set[str] | None] | None = None) -> Iterator[Path]:
    """A fresh temporary folder to write a `kind` into; when the block ends normally it becomes `folder`
    (marked) in one swap, and a refusal or failure inside the block leaves `folder` as it was (no half-written
    stage or export). An existing empty folder (one the user made, or `.`) keeps its identity: the finished files
    are moved into it, the marker first, instead of the folder itself being swapped away."""
    shown, folder = folder, Path(folder).absolute()  # (`.` has no name to stage beside)
    check_replaceable(shown, kind, key, legacy)
    try:
        with fresh_sibling(folder) as tmp:
            yield tmp
            check_replaceable(shown, kind, key, legacy)  # again: a file added while this was written is kept too
            mark(tmp, kind)
            if folder.is_dir() and not any(folder.iterdir()):
                os.replace(tmp / MARKER, folder / MARKER)
                for entry in sorted(tmp.iterdir()):
                    os.replace(entry, folder / entry.name)
            else:
                swap_in(tmp, folder)
    except OSError as exc:
        raise TformerError(f"could not write {key}={shown}: {write_problem(exc)}") from exc


def _running(run: RunDir) -> bool:
    """Whether another process holds the run's lock (a run still starting has no checkpoint yet either)."""
    if not run.lock_file.is_file():
        return False
    lock = run.lock()
    if not lock.try_acquire():
        return True
    lock.release()
    return False


def _make_parents(path: Path) -> int:
    """Make the missing folders above `path`, top down; returns how many of the nearest ones this call made (one
    another process made in between is not counted, nor anything above it)."""
    made = 0
    for parent in reversed([p for p in path.parents if not p.is_dir()]):
        try:
            parent.mkdir()
            made += 1
        except FileExistsError:
            made = 0
    return made


def new_run_dir(path: str | Path, task: str, resume: bool | str | None, key: str = "hydra.run.dir") -> None:
    """A run starts only in a new or empty folder: an existing run (finished or not, ours or a copy) is never
    written over, and neither is a folder of the user's. A resume goes on in its own run's folder (the session
    moves there), so `hydra.run.dir` may name that folder and no other. The folder is created here and marked, so
    that a command refused before any result can remove it (and only it)."""
    path = Path(os.path.abspath(path))  # (`..` resolved as Hydra resolves hydra.run.dir: the same parents)
    try:
        taken = path.is_dir() and any(path.iterdir())
    except OSError as exc:
        raise TformerError(f"cannot read the run dir {path}: {write_problem(exc)}") from None
    if taken and resume not in (None, False):
        target = resolve_resumable(resume) if isinstance(resume, str) else None
        if target is None or RunDir.of_checkpoint(target).root.resolve() != path.resolve():
            raise TformerError(f"{key}={path} is not empty and is not the run resume={resume} continues; "
                               f"drop {key} (a resume goes on in its own run's folder)")
    elif taken:
        run = RunDir(path)
        if run.finished and task in TASKS and TASKS[task].trains:
            raise TformerError(f"{path} holds a finished run; train it further with `tformer {task} <same overrides> "
                               f"trainer.epochs=<more> resume={path}`, or pass a new {key}")
        if run.hydra_record.is_dir() or run.checkpoints.is_dir() or is_ours(path, "run"):
            if task in TASKS and TASKS[task].trains and run.last.existing() is None and \
                    resolve_resumable(path) is None and not _running(run):
                raise TformerError(f"{path} holds a run that stopped before its first checkpoint, so there is "
                                   f"nothing to resume; pass a new {key}, or delete that folder to start there again")
            how = f"continue it with `tformer {task} <same overrides> resume={path}`, or " if task in TASKS and TASKS[task].trains \
                else ""
            raise TformerError(f"{path} already holds a run; {how}pass a new {key} (a new run never starts "
                               f"in another run's folder)")
        raise TformerError(f"{key}={path} is not empty; a run starts in a new or empty folder (tformer never "
                           f"writes over files it did not write)")
    try:
        existed = path.is_dir()
        made = _make_parents(path)
        path.mkdir(exist_ok=True)
        if not existed:
            mark(path, "run", parents=made)
        probe = temporary_sibling(path / "probe")
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise TformerError(f"cannot write the run dir {path}: {write_problem(exc)}") from None
