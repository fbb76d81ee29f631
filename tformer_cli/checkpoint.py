"""Checkpoints: a self-contained directory of safetensors weights plus JSON/YAML, written atomically.

What each file holds (their names and places are `run_dir.py`'s business):
    weights        fp32 weights (safetensors)       tokenizer   the exact tokenizer used
    model_config   EncoderConfig (shapes)           labels      label names, id order
    config         the run's resolved config        metrics     the metrics that made it best/last
    meta           format version, epoch, step      training_tensors + training_json (`last`): resume state

Nothing here is ever unpickled. A write goes to a temporary sibling directory, is fsynced, then renamed over
the old one, so a crash at any moment leaves a complete checkpoint behind (`CheckpointDir.existing()` finds
the previous one if the crash came between the two renames). Every load goes through `load()`, which checks
the weights against model.json before anything uses them; resuming too.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .atomic import sha256_file, write_problem
from .errors import TformerError
from .run_dir import PRETRAINING, CheckpointDir, RunDir, newest_best, newest_checkpoints, resolve_checkpoint, resolve_resumable

FORMAT_VERSION = 2  # 2: manifest.json (SHA-256 of every file) written and checked
READABLE_VERSIONS = (1, 2)


def _fsync_dir(path: Path) -> None:
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


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, default=str) + "\n")


def save(target: CheckpointDir | str | Path, model, *, model_config: dict, tokenizer_json: str,
         label_names: list[str], config_yaml: str, metrics: dict, meta: dict,
         training_state: tuple[dict, dict] | None = None) -> CheckpointDir:
    """Write a checkpoint atomically; `training_state` is (tensors, JSON) for a resumable `last`."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    target = target if isinstance(target, CheckpointDir) else CheckpointDir(target)
    tmp_path, old = target.tmp_sibling(), target.old_sibling()
    tmp = CheckpointDir(tmp_path)
    try:
        target.path.parent.mkdir(parents=True, exist_ok=True)
        if tmp_path.exists():
            shutil.rmtree(tmp_path)
        tmp_path.mkdir()
        state = {k: v.detach().float().cpu().contiguous() if v.is_floating_point() else v.detach().cpu().contiguous()
                 for k, v in model.state_dict().items()}
        save_file(state, str(tmp.weights), metadata={"format": "pt"})
        _write_json(tmp.model_config, model_config)
        tmp.tokenizer.write_text(tokenizer_json)
        _write_json(tmp.labels, list(label_names))
        tmp.config.write_text(config_yaml)
        _write_json(tmp.metrics, metrics)
        _write_json(tmp.meta, {"format_version": FORMAT_VERSION, "saved_at": time.time(), **meta})
        if training_state is not None:
            tensors, saved = training_state
            save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp.training_tensors))
            _write_json(tmp.training_json, saved)
        _write_json(tmp.manifest, _digests(tmp))
        for f in tmp_path.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(tmp_path)
        if target.path.exists():  # (with no target, `old` is the only copy: it stays until tmp is in place)
            if old.exists():
                shutil.rmtree(old)
            os.replace(target.path, old)
        os.replace(tmp_path, target.path)
        _fsync_dir(target.path.parent)
        if old.exists():
            shutil.rmtree(old)
    except (OSError, SafetensorError) as exc:  # safetensors reports a full disk as its own error type
        shutil.rmtree(tmp_path, ignore_errors=True)
        raise TformerError(f"could not save checkpoint {target}: {write_problem(exc)} "
                           f"(the previous checkpoint is kept)") from exc
    return target


def _digests(ckpt: CheckpointDir) -> dict:
    return {f.name: {"sha256": sha256_file(f), "bytes": f.stat().st_size}
            for f in sorted(ckpt.path.iterdir()) if f.is_file() and f != ckpt.manifest}


def verify_manifest(ckpt: CheckpointDir) -> None:
    """Every file the manifest lists must be there with the same size and SHA-256, and every file the checkpoint
    needs must be listed: a flipped byte, a truncated copy or a file swapped in from another run is refused here
    instead of producing NaN or wrong labels later. (Integrity, not authenticity: the field checks in `load`
    are what stop a deliberately crafted checkpoint.)"""
    try:
        listed = json.loads(ckpt.manifest.read_text())
        entries = {str(name): (str(e["sha256"]), int(e["bytes"])) for name, e in listed.items()}
    except (OSError, json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
        raise TformerError(f"checkpoint {ckpt} has a missing or unreadable {ckpt.manifest.name}; retrain or use "
                           f"another checkpoint") from None
    unlisted = [n for n in CheckpointDir.REQUIRED if n not in entries]
    if unlisted:
        raise TformerError(f"checkpoint {ckpt}: {ckpt.manifest.name} does not list {', '.join(unlisted)}; the "
                           f"checkpoint was assembled by hand or corrupted")
    for name, (digest, size) in entries.items():
        f = ckpt.path / name
        if "/" in name or "\\" in name or name.startswith("."):
            raise TformerError(f"checkpoint {ckpt}: {ckpt.manifest.name} names an invalid file; retrain or use "
                               f"another checkpoint")
        if not f.is_file():
            raise TformerError(f"checkpoint {ckpt} is incomplete (missing {name}); retrain or use another checkpoint")
        if f.stat().st_size != size or sha256_file(f) != digest:
            raise TformerError(f"checkpoint {ckpt}: {name} changed after it was written (size or SHA-256 differs "
                               f"from {ckpt.manifest.name}); the file is corrupted or was edited, retrain or use "
                               f"another checkpoint")


def resolve(path: str | Path) -> CheckpointDir:
    """A checkpoint dir, or a run dir (-> its best checkpoint); falls back to a checkpoint left mid-swap;
    hf://<owner>/<name>[@revision]: a pushed checkpoint, downloaded (or from the Hub cache)."""
    from . import hub_repo

    if hub_repo.is_ref(str(path)):
        return CheckpointDir(hub_repo.download(str(path)))
    found = resolve_checkpoint(path)
    if found is None:
        raise TformerError(f"checkpoint {path} does not exist; pass checkpoint=<run dir> (its best checkpoint) or a checkpoint directory")
    return found


def newest(root: str | Path = "outputs") -> CheckpointDir:
    """The newest run's best checkpoint (a sweep's best job), see `run_dir.newest_best`."""
    found = newest_best(root)
    if found is None:
        raise TformerError(f"no trained checkpoint under {Path(root).resolve()}/; run `tformer train` first or pass "
                           f"checkpoint=<path>")
    return found


@dataclass
class Loaded:
    model: torch.nn.Module
    model_config: dict
    tokenizer_file: Path
    label_names: list[str]
    metrics: dict
    meta: dict
    path: Path
    files: CheckpointDir

    @property
    def thresholds(self) -> list[float] | None:
        """A multi-label model's per-label probability cuts (tuned on validation when the checkpoint was saved;
        0.5 each for one saved before any validation); None for a single-label model."""
        if not self.model.cfg.multi_label:
            return None
        return self.meta.get("thresholds") or [0.5] * len(self.label_names)

    def saved_config(self) -> dict | None:
        """The run's saved config (None for a checkpoint without one), see `read_config`."""
        return read_config(self.files) if self.files.config.is_file() else None


def read_config(ckpt: CheckpointDir) -> dict:
    """A checkpoint's saved config as plain data: YAML's safe loader (no Python tags) and no interpolation, so a
    `${oc.env:SECRET}` planted in the file stays that literal text and is never resolved or printed resolved."""
    import yaml

    try:
        data = yaml.safe_load(ckpt.config.read_text())
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
        raise TformerError(f"checkpoint {ckpt} has an unreadable saved config ({type(exc).__name__}); retrain or "
                           f"use another checkpoint") from None
    if not isinstance(data, dict):
        raise TformerError(f"checkpoint {ckpt} has a saved config that is not a mapping; retrain or use another "
                           f"checkpoint")
    return data


def load(path: str | Path | CheckpointDir, device: str | torch.device = "cpu") -> Loaded:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from .model.encoder import TransformerClassifier

    ckpt = path if isinstance(path, CheckpointDir) else resolve(path)
    p = ckpt.path
    missing = ckpt.missing()
    if missing:
        raise TformerError(f"checkpoint {p} is incomplete (missing {', '.join(missing)}); use a directory written "
                           f"by `tformer train`, or pass the run directory")
    try:
        meta = json.loads(ckpt.meta.read_text())
        model_config = json.loads(ckpt.model_config.read_text())
        label_names = json.loads(ckpt.labels.read_text())
        metrics = json.loads(ckpt.metrics.read_text()) if ckpt.metrics.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        raise TformerError(f"checkpoint {p} has a corrupt JSON file ({type(exc).__name__}); retrain or use another "
                           f"checkpoint") from None
    if isinstance(meta, dict) and meta.get("kind") == PRETRAINING:
        raise TformerError(f"checkpoint {p} is a pretraining (masked-LM) checkpoint, not a classifier; fine-tune "
                           f"it with `tformer train model.init={RunDir.of_checkpoint(ckpt)} data=<name>`")
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise TformerError(f"checkpoint {p} has format version {version}, this tformer reads "
                           f"{', '.join(map(str, READABLE_VERSIONS))}; retrain with this version")
    if version >= 2 or ckpt.manifest.exists():  # a manifest that exists is always checked
        verify_manifest(ckpt)
    cfg = _checked_model_config(ckpt, model_config, label_names)
    _check_weights_header(ckpt, cfg)  # shapes checked against the file's header before anything is allocated
    _check_tokenizer(ckpt, cfg.vocab_size)
    _check_thresholds(ckpt, meta.get("thresholds"), cfg)
    try:
        state = load_file(str(ckpt.weights))
    except (SafetensorError, OSError) as exc:
        raise TformerError(f"checkpoint {ckpt.weights} is unreadable ({exc}); retrain or use another "
                           f"checkpoint") from exc
    model = TransformerClassifier(cfg)
    model.load_state_dict(state)
    model.to(device).eval()
    return Loaded(model, model_config, ckpt.tokenizer, label_names, metrics, meta, p, ckpt)


def _checked_model_config(ckpt: CheckpointDir, model_config, label_names):
    """model.json as a typed, range-checked EncoderConfig; labels.json as one name per class."""
    from .errors import ConfigError
    from .model.encoder import EncoderConfig
    from .typed_config import build

    if not isinstance(model_config, dict):
        raise TformerError(f"checkpoint {ckpt}: {ckpt.model_config.name} is not a mapping; retrain or use another "
                           f"checkpoint")
    try:
        cfg = build(EncoderConfig, model_config, ckpt.model_config.name)
    except (ConfigError, TypeError) as exc:
        raise TformerError(f"checkpoint {ckpt} is invalid: {exc}") from None
    if not (isinstance(label_names, list) and all(isinstance(n, str) for n in label_names)
            and len(label_names) == cfg.num_classes):
        raise TformerError(f"checkpoint {ckpt}: {ckpt.labels.name} must list {cfg.num_classes} label names (one per "
                           f"class of {ckpt.model_config.name}); the files are from different runs or edited")
    return cfg


def _check_weights_header(ckpt: CheckpointDir, cfg) -> None:
    """Compare the tensors the config implies (a model built on the meta device: no memory) with the names and
    shapes in the safetensors header, so a doctored model.json cannot make us allocate gigabytes first."""
    from safetensors import SafetensorError, safe_open

    from .model.encoder import TransformerClassifier

    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in TransformerClassifier(cfg).state_dict().items()}
    try:
        with safe_open(str(ckpt.weights), framework="pt") as f:
            header = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError) as exc:
        raise TformerError(f"checkpoint {ckpt.weights} is unreadable ({exc}); retrain or use another "
                           f"checkpoint") from exc
    missing, unexpected = sorted(set(expected) - set(header)), sorted(set(header) - set(expected))
    wrong = sorted(k for k in expected if k in header and header[k] != expected[k])
    if missing or unexpected or wrong:
        detail = (f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}" if unexpected
                  else f"shape mismatch in {wrong[:3]}")
        raise TformerError(f"checkpoint weights {ckpt.weights} do not match {ckpt.model_config.name} ({detail}); "
                           f"the files are from different runs or corrupted")


def _check_thresholds(ckpt: CheckpointDir, thresholds, cfg) -> None:
    """A multi-label checkpoint's thresholds: one probability in (0, 1) per label, or none saved yet."""
    if thresholds is None:
        return
    if not (cfg.multi_label and isinstance(thresholds, list) and len(thresholds) == cfg.num_classes
            and all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < 1 for t in thresholds)):
        raise TformerError(f"checkpoint {ckpt}: {ckpt.meta.name} has invalid thresholds (one probability in (0, 1) "
                           f"per label of a multi-label model); the files are from different runs or edited")


def _check_tokenizer(ckpt: CheckpointDir, vocab_size: int) -> None:
    """Every id the tokenizer can produce must have a row in the embedding table."""
    try:
        tok = json.loads(ckpt.tokenizer.read_text())
        ids = [int(i) for i in tok["model"]["vocab"].values()] + [int(t["id"]) for t in tok.get("added_tokens", [])]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TformerError(f"checkpoint {ckpt}: {ckpt.tokenizer.name} is unreadable ({type(exc).__name__}); retrain "
                           f"or use another checkpoint") from None
    if ids and (max(ids) >= vocab_size or min(ids) < 0):
        raise TformerError(f"checkpoint {ckpt}: {ckpt.tokenizer.name} produces token ids up to {max(ids)}, but the "
                           f"embedding has {vocab_size} rows; the files are from different runs or edited")


def drop_training_state(ckpt: CheckpointDir) -> None:
    """Remove a finished run's optimizer state from `last`. The manifest is rewritten first (atomically), then the
    files go: a crash in between leaves unlisted extra files, which loading ignores, never a listed missing one."""
    from .atomic import write_json

    if not ckpt.has_training_state():
        return
    dropped = (ckpt.training_tensors.name, ckpt.training_json.name)
    if ckpt.manifest.is_file():
        listed = json.loads(ckpt.manifest.read_text())
        write_json(ckpt.manifest, {k: v for k, v in listed.items() if k not in dropped})
    for name in dropped:
        (ckpt.path / name).unlink(missing_ok=True)


@dataclass
class ResumeState:
    """A `last` checkpoint ready to continue from: the model (loaded and checked by `load`), the run's saved
    config, and the training state as saved by the loop (tensors + JSON)."""

    run_dir: RunDir
    checkpoint: Loaded
    config: dict  # the run's saved config, resolved
    tensors: dict[str, torch.Tensor]
    state: dict

    @property
    def epoch(self) -> int:
        return int(self.state["epoch_index"])

    @property
    def step(self) -> int:
        return int(self.state["step"])


@dataclass
class Pretrained:
    """A `tformer pretrain` checkpoint: its encoder shape, weights (MaskedLM names), tokenizer and training state."""

    files: CheckpointDir
    model_config: dict
    state: dict  # tensors, named as in model/mlm.py's MaskedLM
    meta: dict
    training: tuple[dict, dict] | None  # (tensors, JSON) when it is a resumable `last`

    @property
    def tokenizer_file(self) -> Path:
        return self.files.tokenizer


def load_pretraining(path: str | Path | CheckpointDir, with_training_state: bool = False) -> Pretrained:
    """A pretraining checkpoint, checked as any checkpoint is (manifest), refused by name if it is a classifier."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    ckpt = path if isinstance(path, CheckpointDir) else resolve(path)
    try:
        meta = json.loads(ckpt.meta.read_text())
        model_config = json.loads(ckpt.model_config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        raise TformerError(f"checkpoint {ckpt.path} is incomplete or corrupt ({type(exc).__name__}); pass a "
                           f"`tformer pretrain` run dir") from None
    if not isinstance(meta, dict) or meta.get("kind") != PRETRAINING:
        raise TformerError(f"{ckpt.path} is not a `tformer pretrain` checkpoint; model.init takes a pretraining run "
                           f"dir (outputs/pretrain/<date>/<time>); to continue a classifier use resume=")
    verify_manifest(ckpt)
    try:
        state = load_file(str(ckpt.weights))
        training = None
        if with_training_state and ckpt.has_training_state():
            training = (load_file(str(ckpt.training_tensors)), json.loads(ckpt.training_json.read_text()))
    except (SafetensorError, OSError, json.JSONDecodeError) as exc:
        raise TformerError(f"checkpoint {ckpt.path} is unreadable ({exc}); pretrain again") from None
    return Pretrained(ckpt, model_config, state, meta, training)


def find_resumable(resume, outputs_dir: str | Path = "outputs") -> CheckpointDir:
    """resume=true: the newest unfinished run's last checkpoint; resume=<run dir or checkpoint dir>: that one."""
    if resume is True or str(resume).lower() == "true":
        found = [c for c in newest_checkpoints(outputs_dir, "last")
                 if c.training_json.is_file() and not RunDir.of_checkpoint(c).finished]
        if not found:
            raise TformerError(f"resume=true but no unfinished run with a last checkpoint under {outputs_dir}/ "
                               f"(finished runs are never resumed implicitly; a run killed before its first "
                               f"checkpoint has nothing to resume); start a new run or pass resume=<run dir>")
        return found[-1]
    found = resolve_resumable(resume)
    if found is not None and found.path.parent.name != RunDir(".").checkpoints.name:
        raise TformerError(f"resume={resume}: a checkpoint outside its run directory cannot be continued (the run "
                           f"writes next to it); pass the run directory (outputs/train/<date>/<time>)")
    if found is None and RunDir(resume).last.existing() is not None:
        raise TformerError(f"resume={resume}: its last checkpoint holds no optimizer state (the run was trained "
                           f"with trainer.keep_optimizer_state=false), so it cannot be continued; start a new run")
    if found is None:
        raise TformerError(f"resume={resume}: no last checkpoint with training state there; pass the run directory "
                           f"(outputs/train/<date>/<time>)")
    return found


def load_training_state(ckpt: CheckpointDir, device: str | torch.device = "cpu") -> ResumeState:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    loaded = load(ckpt, device)
    if not ckpt.has_training_state():
        raise TformerError(f"checkpoint {ckpt} has no training state to resume from; pass the run directory")
    try:
        tensors = load_file(str(ckpt.training_tensors))
        state = json.loads(ckpt.training_json.read_text())
    except (SafetensorError, OSError, json.JSONDecodeError) as exc:
        raise TformerError(f"the training state in {ckpt} is unreadable ({exc}); start a new run") from exc
    config = read_config(ckpt) if ckpt.config.is_file() else {}
    return ResumeState(RunDir.of_checkpoint(ckpt), loaded, config, tensors, state)
