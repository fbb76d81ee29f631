"""manifest.json, in every checkpoint and export dir: the SHA-256 and size of every other file, written last into
the staged directory (before it is swapped in) and checked on every load, so a flipped byte, a truncated copy or
a file swapped in from another run is refused by name instead of producing NaN or wrong labels later. Integrity,
not authenticity: anyone can recompute it, and the field checks in `checkpoint.load` are what stop a deliberately
crafted checkpoint.

What the digests tell beyond that lives here too: which weights a checkpoint holds now, and whether an export was
made from them.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import TformerError
from .atomic import json_text, sha256_file, write_json
from .layout import OWN_FILE_CAP, CheckpointDir, ExportDir


def digests(folder: CheckpointDir | ExportDir) -> dict:
    """{file name: {"sha256", "bytes"}} of every file in the folder but the manifest itself."""
    return {f.name: {"sha256": sha256_file(f), "bytes": f.stat().st_size}
            for f in sorted(folder.path.iterdir()) if f.is_file() and f != folder.manifest}


def write(folder: CheckpointDir | ExportDir) -> None:
    """Write the folder's manifest, last, while the folder is still staged (its swap into place is the atomic
    step, see atomic.staged_dir)."""
    folder.manifest.write_text(json_text(digests(folder)))


# The most a file tformer reads back may hold, checked by its size before it is read: a manifest lists about ten
# files, and the JSON and YAML of a checkpoint or export (label names, a tokenizer's vocabulary, a run's history)
# are far below these. A crafted or sparse file past them costs a stat, not gigabytes of memory.
MANIFEST_CAP = 1 << 20
TEXT_CAP = OWN_FILE_CAP


def entries(folder: CheckpointDir | ExportDir) -> dict[str, tuple[str, int]] | None:
    """{file name: (sha256, bytes)} as listed, or None when the manifest is missing, oversized or unreadable."""
    try:
        if folder.manifest.stat().st_size > MANIFEST_CAP:
            return None
        listed = json.loads(folder.manifest.read_text())
        return {str(name): (str(e["sha256"]), _size(e["bytes"])) for name, e in listed.items()}
    except (OSError, json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError, UnicodeDecodeError):
        return None


def _size(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"not a size: {value!r}")
    return value


def _kind(folder) -> str:
    return "export" if isinstance(folder, ExportDir) else "checkpoint"


def read_text(folder: CheckpointDir | ExportDir, path: Path, cap: int = TEXT_CAP, listed_size: bool = True) -> str:
    """A JSON or YAML file of `folder`, read only once its size is what the manifest lists (when it lists it; with
    listed_size=False only `cap` bounds it, for meta.json, whose version says how the rest is checked) and within
    `cap`: a file grown or swapped after it was written is refused by a stat, before a byte is read."""
    size = path.stat().st_size
    listed = entries(folder) if listed_size and folder.manifest.is_file() else None
    if listed is not None and path.name in listed and listed[path.name][1] != size:
        raise TformerError(f"{_kind(folder)} {folder}: {path.name} changed after it was written ({size:,} bytes, "
                           f"{folder.manifest.name} lists {listed[path.name][1]:,}); the file is corrupted or was "
                           f"edited, use another {_kind(folder)}")
    if size > cap:
        raise TformerError(f"{_kind(folder)} {folder}: {path.name} is {size:,} bytes, more than such a file ever "
                           f"holds ({cap:,}); the file is corrupted or crafted, use another {_kind(folder)}")
    return path.read_text(encoding="utf-8")


def _refuse_constant(name: str):
    raise ValueError(f"{name} where a number is expected")


def read_json(folder: CheckpointDir | ExportDir, path: Path, *, allow_nan: bool = False, cap: int = TEXT_CAP,
              listed_size: bool = True):
    """`read_text` parsed as JSON; NaN and infinities refused unless the file may hold them (`allow_nan`: the
    metrics of a diverged run, an early-stopping best of inf). Unreadable or malformed: one line naming the file."""
    try:
        text = read_text(folder, path, cap, listed_size)
        return json.loads(text) if allow_nan else json.loads(text, parse_constant=_refuse_constant)
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # (json.JSONDecodeError is a ValueError)
        why = str(exc) if "where a number is expected" in str(exc) else type(exc).__name__
        raise TformerError(f"{_kind(folder)} {folder}: {path.name} is a corrupt JSON file ({why}); retrain or use "
                           f"another {_kind(folder)}") from None


def finite_number(value) -> bool:
    """A JSON number that means one: an int or float, not a bool, not NaN or infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def drop(ckpt: CheckpointDir, names: tuple[str, ...]) -> None:
    """Rewrite the manifest (atomically) without `names`, before the caller removes those files: a crash in between
    leaves unlisted extra files, which loading ignores, never a listed missing one."""
    listed = entries(ckpt)
    if listed is not None:
        write_json(ckpt.manifest, {name: {"sha256": digest, "bytes": size} for name, (digest, size) in listed.items()
                                   if name not in names})


def _invalid_name(name: str) -> bool:
    return "/" in name or "\\" in name or name.startswith(".")


def _changed(folder: CheckpointDir | ExportDir, name: str, digest: str, size: int) -> bool:
    f = folder.path / name
    return f.stat().st_size != size or sha256_file(f) != digest


def verify_checkpoint(ckpt: CheckpointDir) -> None:
    """Every file the manifest lists must be there with the same size and SHA-256, and every file the checkpoint
    needs must be listed."""
    listed = entries(ckpt)
    if listed is None:
        raise TformerError(f"checkpoint {ckpt} has a missing or unreadable {ckpt.manifest.name}; retrain or use "
                           f"another checkpoint")
    unlisted = [n for n in CheckpointDir.REQUIRED if n not in listed]
    if unlisted:
        raise TformerError(f"checkpoint {ckpt}: {ckpt.manifest.name} does not list {', '.join(unlisted)}; the "
                           f"checkpoint was assembled by hand or corrupted")
    for name, (digest, size) in listed.items():
        if _invalid_name(name):
            raise TformerError(f"checkpoint {ckpt}: {ckpt.manifest.name} names an invalid file; retrain or use "
                               f"another checkpoint")
        if not (ckpt.path / name).is_file():
            raise TformerError(f"checkpoint {ckpt} is incomplete (missing {name}); retrain or use another checkpoint")
        if _changed(ckpt, name, digest, size):
            raise TformerError(f"checkpoint {ckpt}: {name} changed after it was written (size or SHA-256 differs "
                               f"from {ckpt.manifest.name}); the file is corrupted or was edited, retrain or use "
                               f"another checkpoint")


def verify_export(export: ExportDir) -> None:
    """Every file an export needs is there and listed, and every listed file has its size and SHA-256 (a partial
    copy is refused, not half-run)."""
    missing = [n for n in ExportDir.REQUIRED if not (export.path / n).is_file()]
    if missing:
        raise TformerError(f"export {export} is incomplete (missing {', '.join(missing)}); export the checkpoint "
                           f"again")
    listed = entries(export)
    if listed is None:
        raise TformerError(f"export {export} has a missing or unreadable {export.manifest.name}; export the "
                           f"checkpoint again")
    for name in ExportDir.REQUIRED:
        if name not in listed:
            raise TformerError(f"export {export}: {export.manifest.name} does not list {name}; export again")
    for name, (digest, size) in listed.items():
        if _invalid_name(name) or not (export.path / name).is_file():
            raise TformerError(f"export {export}: {export.manifest.name} names a missing or invalid file {name!r}; "
                               f"export again")
        if _changed(export, name, digest, size):
            raise TformerError(f"export {export}: {name} changed after it was written (size or SHA-256 differs from "
                               f"{export.manifest.name}); export the checkpoint again")


def weights_sha256(ckpt: CheckpointDir) -> str | None:
    """The SHA-256 of a checkpoint's weights: from its manifest (hashing the file only for one written without)."""
    listed = entries(ckpt)
    if listed is not None and ckpt.weights.name in listed:
        return listed[ckpt.weights.name][0]
    return sha256_file(ckpt.weights) if ckpt.weights.is_file() else None


def stale_export(export: ExportDir, ckpt: CheckpointDir) -> str | None:
    """Why `export` is not `ckpt` as it is now (a newer best was saved, or it was exported from another checkpoint
    of the run), or None. Serving an old model under a checkpoint's name would be silently wrong."""
    try:
        made_from = json.loads(read_text(export, export.info, MANIFEST_CAP)).get("source_weights_sha256")
    except (OSError, ValueError, AttributeError, TformerError):
        made_from = None
    now = weights_sha256(ckpt) if made_from is not None else None
    if made_from is None or now is None or made_from == now:
        return None
    return (f"the ONNX export {export.path} was made from other weights than {ckpt.path} has now (a newer best "
            f"was saved, or another checkpoint was exported); re-export: tformer export checkpoint={ckpt.path}")
