"""What a `checkpoint=` argument names, as a local directory: the step every command and `Classifier.load` take
before reading anything.

    None (no checkpoint=)        the newest run's best checkpoint under outputs_dir (a sweep's best job)
    <run dir>                    its best checkpoint (or the previous one, when a crash hit mid-swap)
    <checkpoint dir>             itself
    hf://<owner>/<name>[@rev]    a pushed checkpoint (deploy/hub_repo.py), downloaded or from the Hub cache

`locate_export` does the same for `predict --runtime onnx`, ending at an export dir. No torch here: the ONNX
runtime's start imports this module.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .. import hub
from ..errors import ArgumentTypeError, TformerError
from ..safe_text import terminal
from .layout import (HUB_ONNX_FOLDER, AuditDir, CheckpointDir, ExportDir, RunDir, SweepDir, newest_best,
                     resolve_checkpoint)
from .manifest import MANIFEST_CAP, stale_export

PREFIX = "hf://"


def is_ref(path) -> bool:
    return isinstance(path, str) and path.startswith(PREFIX)


# The Hub's own rules (huggingface_hub.utils.validate_repo_id), without importing it on predict's path: 1-96 of
# A-Z a-z 0-9 - _ ., not starting or ending with - or ., no -- or .., not ending in .git.
_REPO_PART = re.compile(r"^(?!.*(--|\.\.))(?![-.])[A-Za-z0-9_.-]{1,96}(?<![-.])$")
# A revision: a 40-hex commit, or a branch / tag name as git allows it (refs/pr/1 too), kept to characters that
# cannot climb out of the Hub cache's snapshots/<revision> folder: no .., no leading / or -, no backslash.
_REVISION = re.compile(r"^(?!.*\.\.)(?![-/])(?!.*//)[A-Za-z0-9_.+-]+(/[A-Za-z0-9_+-][A-Za-z0-9_.+-]*)*$")


def parse_ref(ref: str, typed: str | None = None, key: str = "checkpoint") -> tuple[str, str | None]:
    """hf://owner/name[@revision] -> (repo id, revision or None); refused in one line unless the Hub would take
    the owner, the name and the revision (a checkpoint=hf://a/b@../../x must not open a local folder). `typed`:
    what the user wrote, when it was not <key>=<ref> (push's repo=owner/name)."""
    body = ref[len(PREFIX):].strip("/")
    repo, _, revision = body.partition("@")
    parts = repo.split("/")
    shown = typed or f"{key}={terminal(ref)}"
    if len(parts) != 2 or not all(_REPO_PART.match(p) for p in parts) or repo.endswith(".git"):
        use = "<owner>/<name>" if typed else "hf://<owner>/<name> or hf://<owner>/<name>@<revision>"
        raise TformerError(f"{shown} is not a Hub {'repository' if typed else 'reference'}; use {use} (names of "
                           f"A-Z a-z 0-9 - _ ., at most 96 characters)")
    if revision and (len(revision) > 255 or not _REVISION.match(revision) or revision.endswith((".", ".lock", "/"))
                     or "/." in revision):
        raise TformerError(f"{shown}: {terminal(revision)!r} is not a revision; use a branch or tag "
                           f"name (main, v1.0, refs/pr/1) or a 40-hex commit")
    return repo, revision or None


def download(ref: str, *, onnx: bool = False, key: str = "checkpoint") -> Path:
    """The local folder of a Hub checkpoint (its onnx/ export with onnx=True), downloaded or from the cache; `key`
    is the setting that named it (checkpoint=, teacher=), for the messages."""
    repo, revision = parse_ref(ref, key=key)
    offline = hub.offline()
    from huggingface_hub import snapshot_download  # only for hf:// references, and slow to import
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    patterns = [f"{HUB_ONNX_FOLDER}/*"] if onnx else None
    try:
        folder = Path(snapshot_download(repo, revision=revision, allow_patterns=patterns,
                                        ignore_patterns=None if onnx else [f"{HUB_ONNX_FOLDER}/*"],
                                        local_files_only=offline))
    except (LocalEntryNotFoundError, FileNotFoundError):
        raise TformerError(f"{ref} is not in the local Hub cache, and {hub.unreachable()}; connect to the "
                           f"network once, or copy the repository into a folder and pass {key}=<folder>") from None
    except RepositoryNotFoundError:
        raise TformerError(f"{ref}: no such model repository on the Hub (or it is private: log in with `hf auth "
                           f"login` or set HF_TOKEN)") from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise TformerError(f"could not download {ref}: {str(exc).splitlines()[0][:200]}") from None
    found = folder / HUB_ONNX_FOLDER if onnx else folder
    if onnx and not found.is_dir():
        raise TformerError(f"{ref} has no ONNX export ({HUB_ONNX_FOLDER}/); predict with --runtime torch or push a run "
                           f"that was exported (`tformer export` before `tformer push`)")
    return found


def newest(outputs_dir: str | Path = "outputs", instead: str = "<path>") -> CheckpointDir:
    """The newest run's best checkpoint (a sweep's best job, see `layout.newest_best`); `instead` is what the
    message suggests passing as checkpoint= when there is none."""
    found = newest_best(outputs_dir)
    if found is None:
        raise TformerError(f"no trained checkpoint under {Path(outputs_dir).resolve()}/; run `tformer train` first or "
                           f"pass checkpoint={instead} (predict: --checkpoint {instead})")
    return found


def locate(checkpoint: str | Path | CheckpointDir | None = None, outputs_dir: str | Path = "outputs",
           key: str = "checkpoint") -> CheckpointDir:
    """The checkpoint dir a `checkpoint=` argument names (see the module's docstring); refused by name when there
    is none. `key`: the setting that named it where it is not checkpoint= (distill's teacher=), for the messages."""
    if isinstance(checkpoint, CheckpointDir):
        return checkpoint
    if checkpoint is None:
        return newest(outputs_dir)
    _a_path(checkpoint)
    if is_ref(str(checkpoint)):
        return CheckpointDir(download(str(checkpoint), key=key))
    found = resolve_checkpoint(checkpoint)
    if found is None:
        raise TformerError(not_a_checkpoint(checkpoint, key))
    if ExportDir(found.path).is_export():
        raise TformerError(an_export(checkpoint, ExportDir(found.path), key))
    if not found.weights.is_file() and (other := another_kind(found.path)):
        raise TformerError(f"{key}={checkpoint} is {other}")
    return found


def another_kind(folder: Path) -> str | None:
    """What a folder of tformer's that holds no checkpoint is, with where to look instead (None: not one of them):
    a model folder is asked for, and "incomplete" would send the user looking for lost files."""
    owner = RunDir(folder.parent)
    if owner.checkpoints == folder and (saved := next((c for c in (owner.best, owner.last) if c.weights.is_file()),
                                                      None)) is not None:
        return (f"a run's checkpoints folder, not a checkpoint; pass the run dir ({folder.parent}) or one of its "
                f"checkpoints ({saved.path})")
    if SweepDir(folder).is_sweep():
        return "a sweep folder, not a checkpoint; pass one of its job folders (`tformer report` of it marks the best)"
    if AuditDir(folder).is_audit():
        return "a `tformer audit` folder, not a checkpoint (its folds' checkpoints are dropped); pass a trained run"
    if RunDir(folder).eval_metrics.is_file():
        return ("a `tformer evaluate` run, not a checkpoint; pass the run it evaluated (its metrics name the "
                "checkpoint)")
    run = RunDir(folder)
    last = run.last.existing()
    if last is not None and last.weights.is_file():
        if run.finished:  # (e.g. a pretraining run that masked nothing: no epoch had a validation loss)
            return f"a finished run that has no best checkpoint (no epoch was scored); pass its last one, {last.path}"
        return (f"a run with no best checkpoint yet (it stopped before an epoch gave one): continue it with `tformer "
                f"{last.task()} <its overrides> resume={folder}`, or pass its last checkpoint, {last.path}")
    return None


def _a_path(checkpoint) -> bool:
    """A checkpoint= from Python is a path or an hf:// reference: Classifier.load(5) is refused by name, not with
    pathlib's TypeError."""
    if not isinstance(checkpoint, (str, os.PathLike)):
        raise ArgumentTypeError(f"checkpoint={checkpoint!r:.80} must be a path (str or pathlib.Path) to a run or "
                                f"checkpoint dir, or hf://<owner>/<name>")
    return True


def exported_from(export: ExportDir) -> Path | None:
    """The checkpoint an existing export was made from (its export.json), resolved; None when unknown."""
    try:
        if not export.is_export() or export.info.stat().st_size > MANIFEST_CAP:
            return None
        source = json.loads(export.info.read_text())["source_checkpoint"]
        return (export.path / source).resolve() if isinstance(source, str) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def an_export(checkpoint, export: ExportDir, key: str = "checkpoint") -> str:
    """Why an ONNX export folder is not a checkpoint: what reads it, and the checkpoint it was made from (its
    export.json) for the commands that need the model itself."""
    source = exported_from(export)
    if source is None or resolve_checkpoint(source) is None:  # (an export copied away from its run)
        source = "<the run dir it was exported from>"
    return (f"{key}={checkpoint} is an ONNX export, which `tformer predict --runtime onnx --checkpoint "
            f"{checkpoint}` and `tformer serve runtime=onnx checkpoint={checkpoint}` read; for this command pass the "
            f"checkpoint it was made from ({source})")


def not_a_checkpoint(checkpoint: str | Path, key: str = "checkpoint") -> str:
    """Why a checkpoint= path names no checkpoint: nothing there, or a file (e.g. a checkpoint's weights: its folder
    is the checkpoint). (A folder that holds no checkpoint is refused as incomplete when it is loaded.)"""
    p = Path(checkpoint).expanduser()
    fix = f"pass {key}=<run dir> (its best checkpoint) or a checkpoint directory"
    if p.is_file():
        holder = resolve_checkpoint(p.parent)  # (a file of a checkpoint, its weights say: not any folder's file)
        inside = holder is not None and (holder.weights.is_file() or holder.meta.is_file())
        return (f"{key}={checkpoint} is a file; pass the folder that holds it, {key}={p.parent}" if inside
                else f"{key}={checkpoint} is a file, not a run or checkpoint folder; {fix}")
    return f"{key}={checkpoint} does not exist; {fix}"


def locate_export(checkpoint: str | Path | None = None, outputs_dir: str | Path = "outputs") -> ExportDir:
    """An export dir; a run dir (-> the export of its best checkpoint: onnx/, else onnx-int8/); a checkpoint dir of
    a run (-> that checkpoint's export); hf://...: the repository's onnx/; None: the newest run's (a sweep's best job). An export
    found through a run must have been made from the checkpoint's current weights: a newer best saved after
    `tformer export` is refused, not served as the old model."""
    if checkpoint is None:
        ckpt = newest(outputs_dir, instead="<export dir>")
    elif _a_path(checkpoint) and is_ref(str(checkpoint)):
        return ExportDir(download(str(checkpoint), onnx=True))
    else:
        p = Path(checkpoint).expanduser()
        if ExportDir(p).is_export() or ExportDir(p).model.is_file() or ExportDir(p).info.is_file():
            return ExportDir(p)  # (an incomplete one is refused by name when it is verified)
        if not p.exists():
            raise TformerError(f"checkpoint {checkpoint} does not exist; pass an export dir (`tformer export` prints "
                               f"it) or the run dir it was exported from")
        if RunDir(p).checkpoints.is_dir():
            ckpt = RunDir(p).best
        elif CheckpointDir(p).weights.is_file():
            ckpt = CheckpointDir(p)
        else:
            raise TformerError(f"checkpoint={checkpoint} is neither an export dir nor a run dir; pass the folder "
                               f"`tformer export` wrote (<run dir>/export/onnx) or its run dir")
    run = RunDir.of_checkpoint(ckpt)
    found = run.served_export(ckpt)
    if not found.is_export():
        raise TformerError(f"{ckpt} has no ONNX export; run `tformer export checkpoint={ckpt.path}` first (or "
                           f"use the torch runtime: predict --runtime torch, serve runtime=torch)")
    stale = stale_export(found, ckpt)
    if stale:
        raise TformerError(stale)
    return found
