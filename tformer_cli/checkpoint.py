"""Checkpoints: a self-contained directory of safetensors weights plus JSON/YAML, written atomically.

What each file holds (their names and places are layout.py's business):
    weights        fp32 weights (safetensors)       tokenizer   the exact tokenizer used
    model_config   EncoderConfig (shapes)           labels      label names, id order
    config         the run's resolved config        metrics     the metrics that made it best/last
    meta           format version, epoch, step      training_tensors + training_json (`last`): resume state

Nothing here is ever unpickled. A write goes to a staged sibling directory, swapped in whole by atomic.py, so a
crash at any moment leaves a complete checkpoint behind (`CheckpointDir.existing()` finds the previous one if the
crash came between the two renames). Every load goes through `load()`, which checks the manifest, then the
weights against model.json, before anything uses them; resuming too. A `checkpoint=` argument (run dir, newest
run, hf://...) is turned into a directory by locate.py.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch
import yaml
from safetensors import SafetensorError

from .errors import ConfigError, TformerError
from .evaluation import conformal
from .evaluation.calibration import checked
from .model.encoder import EncoderConfig, TransformerClassifier
from .typed_config import build
from .store import manifest
from .store.atomic import json_text, staged_dir, write_problem
from .store.layout import OWN_FILE_CAP, PRETRAINING, CheckpointDir, RunDir
from .store.locate import locate

FORMAT_VERSION = 2  # 2: manifest.json (SHA-256 of every file) written and checked
READABLE_VERSIONS = (1, 2)
JSON_CAP = OWN_FILE_CAP  # model.json, labels.json, meta.json, metrics.json, config.yaml (layout.py)


def _write_json(path: Path, obj) -> None:
    """A JSON file of the staged checkpoint; NaN kept (json_text's rule: checkpoints round-trip their numbers)."""
    path.write_text(json_text(obj, allow_nan=True))


def save(target: CheckpointDir | str | Path, model, *, model_config: dict, tokenizer_json: str,
         label_names: list[str], config_yaml: str, metrics: dict, meta: dict,
         training_state: tuple[dict, dict] | None = None) -> CheckpointDir:
    """Write a checkpoint atomically; `training_state` is (tensors, JSON) for a resumable `last`."""
    target = target if isinstance(target, CheckpointDir) else CheckpointDir(target)
    existed = target.existing() is not None  # (what a failed save keeps: the previous one, if there was one)
    try:
        with staged_dir(target.path) as staging:
            tmp = CheckpointDir(staging)
            state = {k: v.detach().float().cpu().contiguous() if v.is_floating_point() else v.detach().cpu().contiguous()
                     for k, v in model.state_dict().items()}
            safetensors.torch.save_file(state, str(tmp.weights), metadata={"format": "pt"})
            _write_json(tmp.model_config, model_config)
            tmp.tokenizer.write_text(tokenizer_json)
            _write_json(tmp.labels, list(label_names))
            tmp.config.write_text(config_yaml)
            _write_json(tmp.metrics, metrics)
            _write_json(tmp.meta, {"format_version": FORMAT_VERSION, "saved_at": time.time(), **meta})
            if training_state is not None:
                tensors, saved = training_state
                safetensors.torch.save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                                            str(tmp.training_tensors))
                _write_json(tmp.training_json, saved)
            manifest.write(tmp)
    except (OSError, SafetensorError) as exc:  # safetensors reports a full disk as its own error type
        raise TformerError(f"could not save checkpoint {target}: {write_problem(exc)}"
                           f"{' (the previous checkpoint is kept)' if existed else ' (none was saved there before)'}"
                           ) from exc
    return target


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

    @property
    def temperature(self) -> float | list[float] | None:
        """The temperature fitted on validation after training (evaluation/calibration.py): a float for a softmax
        model, one per label for a multi-label one; None (T = 1, raw probabilities) for a checkpoint without one
        (saved before calibration existed, with trainer.calibrate=false, or a run's `last`)."""
        return self.meta.get("temperature")

    @property
    def conformal(self) -> dict | None:
        """The label-set cuts fitted on validation after training (evaluation/conformal.py); None for a checkpoint
        without them (trainer.calibrate=false, saved before they existed, or a run's `last`)."""
        return self.meta.get("conformal")

    def saved_config(self) -> dict | None:
        """The run's saved config (None for a checkpoint without one), see `read_config`."""
        return read_config(self.files) if self.files.config.is_file() else None


def read_config(ckpt: CheckpointDir) -> dict:
    """A checkpoint's saved config as plain data: YAML's safe loader (no Python tags) and no interpolation, so a
    `${oc.env:SECRET}` planted in the file stays that literal text and is never resolved or printed resolved."""
    try:
        data = yaml.safe_load(manifest.read_text(ckpt, ckpt.config, JSON_CAP))
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
        raise TformerError(f"checkpoint {ckpt} has an unreadable saved config ({type(exc).__name__}); retrain or "
                           f"use another checkpoint") from None
    if not isinstance(data, dict):
        raise TformerError(f"checkpoint {ckpt} has a saved config that is not a mapping; retrain or use another "
                           f"checkpoint")
    return data


def load(path: str | Path | CheckpointDir, device: str | torch.device = "cpu") -> Loaded:
    """A classifier checkpoint, checked file by file before anything large is allocated; `path` as any
    `checkpoint=` argument (see locate.py)."""
    ckpt = locate(path)
    p = ckpt.path
    missing = ckpt.missing()
    if missing:
        raise TformerError(f"checkpoint {p} is incomplete (missing {', '.join(missing)}); use a directory written "
                           f"by `tformer train`, or pass the run directory")
    meta = manifest.read_json(ckpt, ckpt.meta, cap=JSON_CAP, listed_size=False)  # (its version: how to check the rest)
    # the others only at the size the manifest lists (manifest.read_text), so a grown file is never read
    model_config = manifest.read_json(ckpt, ckpt.model_config, cap=JSON_CAP)
    label_names = manifest.read_json(ckpt, ckpt.labels, cap=JSON_CAP)
    metrics = manifest.read_json(ckpt, ckpt.metrics, allow_nan=True, cap=JSON_CAP) if ckpt.metrics.is_file() else {}
    if not isinstance(metrics, dict):
        raise TformerError(f"checkpoint {p}: {ckpt.metrics.name} is not a mapping of metrics; retrain or use another "
                           f"checkpoint")
    if isinstance(meta, dict) and meta.get("kind") == PRETRAINING:
        raise TformerError(f"checkpoint {p} is a pretraining (masked-LM) checkpoint, not a classifier; fine-tune "
                           f"it with `tformer train model.init={RunDir.of_checkpoint(ckpt)} data=<name>`")
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise TformerError(f"checkpoint {p} has format version {version}, this tformer reads "
                           f"{', '.join(map(str, READABLE_VERSIONS))}; retrain with this version")
    if version >= 2 or ckpt.manifest.exists():  # a manifest that exists is always checked
        manifest.verify_checkpoint(ckpt)
    cfg = _checked_model_config(ckpt, model_config, label_names)
    _check_weights_header(ckpt, cfg)  # shapes checked against the file's header before anything is allocated
    _check_tokenizer(ckpt, cfg.vocab_size)
    _check_thresholds(ckpt, meta.get("thresholds"), cfg)
    _check_temperature(ckpt, meta.get("temperature"), cfg)
    _check_conformal(ckpt, meta.get("conformal"), cfg)
    _check_long_text(ckpt, meta, cfg.max_len)
    try:
        state = safetensors.torch.load_file(str(ckpt.weights))
    except (SafetensorError, OSError) as exc:
        raise TformerError(f"checkpoint {ckpt.weights} is unreadable ({exc}); retrain or use another "
                           f"checkpoint") from exc
    model = TransformerClassifier(cfg)
    model.load_state_dict(state)
    model.to(device).eval()
    return Loaded(model, model_config, ckpt.tokenizer, label_names, metrics, meta, p, ckpt)


def _checked_model_config(ckpt: CheckpointDir, model_config, label_names):
    """model.json as a typed, range-checked EncoderConfig; labels.json as one name per class."""
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
    repeated = sorted({n for n in label_names if label_names.count(n) > 1}) if len(set(label_names)) < len(
        label_names) else []
    if repeated:
        raise TformerError(f"checkpoint {ckpt}: {ckpt.labels.name} names {repeated[0]!r} more than once; each class "
                           f"needs its own name (the file was edited)")
    return cfg


def _check_weights_header(ckpt: CheckpointDir, cfg) -> None:
    """Compare the tensors the config implies (by arithmetic, `EncoderConfig.state_shapes`: nothing built) with the
    names and shapes in the safetensors header, so a doctored model.json cannot make us allocate, or build for
    minutes, first."""
    expected = cfg.state_shapes()
    try:
        with safetensors.safe_open(str(ckpt.weights), framework="pt") as f:
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


def _check_temperature(ckpt: CheckpointDir, temperature, cfg) -> None:
    """meta.json's temperature: what every probability is divided by, so a 0, a negative or a NaN one (an edited
    file) would turn every answer into NaN or flip it; refused by name."""
    wrong = checked(temperature, cfg.num_classes, cfg.multi_label)
    if wrong:
        raise TformerError(f"checkpoint {ckpt}: {ckpt.meta.name} has temperature={temperature!r:.80}, not {wrong}; "
                           f"the file was edited, retrain or use another checkpoint")


def _check_conformal(ckpt: CheckpointDir, table, cfg) -> None:
    """meta.json's label-set cuts (evaluation/conformal.py), when it has them."""
    wrong = None if table is None else conformal.checked(table, cfg.multi_label)
    if wrong:
        raise TformerError(f"checkpoint {ckpt}: {ckpt.meta.name} has conformal={json.dumps(table)[:80]}, not {wrong}; "
                           f"the file was edited, retrain or use another checkpoint")


def update_meta(target: CheckpointDir, changes: dict) -> None:
    """Set (or with None remove) keys of a saved checkpoint's meta.json: the calibration fitted after training
    (temperature, thresholds). Written as `save` writes: a staged copy (the weights hard-linked where the file
    system allows, else copied) with the new meta.json and manifest, swapped in whole."""
    copy_with_meta(target, target, changes)


def copy_with_meta(source: CheckpointDir, target: CheckpointDir, changes: dict) -> None:
    """`source` written as `target` (the same folder: `update_meta`) with keys of its meta.json set or, with None,
    removed; without the training state (a copy starts no resume). Staged and swapped in whole as `save` is, the
    files hard-linked where the file system allows (never written in place: every write is a new file), else
    copied; `source` is never changed."""
    meta = manifest.read_json(source, source.meta, allow_nan=True, cap=JSON_CAP)
    meta = {k: v for k, v in {**meta, **changes}.items() if v is not None or k not in changes}
    skipped = {source.meta.name, source.manifest.name}
    if source.path.resolve() != target.path.resolve():
        skipped |= {source.training_tensors.name, source.training_json.name}
    try:
        with staged_dir(target.path) as staging:
            tmp = CheckpointDir(staging)
            for f in source.path.iterdir():
                if not f.is_file() or f.name in skipped:
                    continue
                try:
                    os.link(f, tmp.path / f.name)
                except OSError:
                    shutil.copy2(f, tmp.path / f.name)
            _write_json(tmp.meta, meta)
            manifest.write(tmp)
    except OSError as exc:
        raise TformerError(f"could not write checkpoint {target}: {write_problem(exc)}"
                           f"{' (the previous checkpoint is kept)' if target.path.exists() else ''}") from exc


def _check_long_text(ckpt: CheckpointDir, meta: dict, max_len: int) -> None:
    """meta.json's long_text, head_tokens and chunk_overlap: what predict and evaluate read texts by."""
    from .data.tokenization import LongText  # (tokenizers: already imported by whoever loads a checkpoint)

    values = {k: meta.get(k) for k in ("head_tokens", "chunk_overlap")}
    wrong = [k for k, v in values.items() if v is not None and (isinstance(v, bool) or not isinstance(v, int))]
    if not isinstance(meta.get("long_text", "truncate"), str):
        wrong.insert(0, "long_text")
    try:
        if not wrong:
            long_text = LongText.from_meta(meta)  # (each mode's own number checked, as training checks it)
            long_text.head(max_len) if long_text.mode == "head_tail" else None
            long_text.overlap(max_len, given=False) if long_text.mode == "chunks" else None
    except ConfigError as exc:
        raise TformerError(f"checkpoint {ckpt}: {ckpt.meta.name} is invalid ({exc}); the file was edited, retrain "
                           f"or use another checkpoint") from None
    if wrong:
        raise TformerError(f"checkpoint {ckpt}: {ckpt.meta.name} has {wrong[0]}={meta.get(wrong[0])!r} of the wrong "
                           f"type; the file was edited, retrain or use another checkpoint")


def _check_tokenizer(ckpt: CheckpointDir, vocab_size: int) -> None:
    """Every id the tokenizer can produce must have a row in the embedding table."""
    tok = manifest.read_json(ckpt, ckpt.tokenizer)
    try:
        vocab = tok["model"]["vocab"]  # token -> id (WordPiece, BPE), or [piece, score] pairs by id (Unigram)
        ids = ([_token_id(i) for i in vocab.values()] if isinstance(vocab, dict) else [len(vocab) - 1] if vocab
               else []) + [_token_id(t["id"]) for t in tok.get("added_tokens", [])]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TformerError(f"checkpoint {ckpt}: {ckpt.tokenizer.name} is unreadable ({type(exc).__name__}); retrain "
                           f"or use another checkpoint") from None
    if ids and (max(ids) >= vocab_size or min(ids) < 0):
        raise TformerError(f"checkpoint {ckpt}: {ckpt.tokenizer.name} produces token ids up to {max(ids)}, but the "
                           f"embedding has {vocab_size} rows; the files are from different runs or edited")


def _token_id(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"token id {value!r} is not a whole number")
    return value


def drop_training_state(ckpt: CheckpointDir) -> None:
    """Remove a finished run's optimizer state from `last`: out of the manifest first, then off the disk
    (`manifest.drop`)."""
    if not ckpt.has_training_state():
        return
    dropped = (ckpt.training_tensors.name, ckpt.training_json.name)
    manifest.drop(ckpt, dropped)
    for name in dropped:
        (ckpt.path / name).unlink(missing_ok=True)


@dataclass
class Pretrained:
    """A `tformer pretrain` checkpoint: its encoder shape, weights (MaskedLM names) and tokenizer."""

    files: CheckpointDir
    model_config: dict
    state: dict  # tensors, named as in model/mlm.py's MaskedLM
    meta: dict

    @property
    def tokenizer_file(self) -> Path:
        return self.files.tokenizer


def load_pretraining(path: str | Path | CheckpointDir, key: str = "checkpoint") -> Pretrained:
    """A pretraining checkpoint, checked as any checkpoint is (manifest), refused by name if it is a classifier;
    `path` as any `checkpoint=` argument (see locate.py), given as `key` (model.init=)."""
    ckpt = locate(path, key=key)
    if not ckpt.meta.is_file() or not ckpt.model_config.is_file():
        raise TformerError(f"checkpoint {ckpt.path} is incomplete (no {ckpt.meta.name} or {ckpt.model_config.name}); "
                           f"pass a `tformer pretrain` run dir")
    meta = manifest.read_json(ckpt, ckpt.meta, cap=JSON_CAP)
    model_config = manifest.read_json(ckpt, ckpt.model_config, cap=JSON_CAP)
    if not isinstance(meta, dict) or meta.get("kind") != PRETRAINING:
        raise TformerError(f"{ckpt.path} is not a `tformer pretrain` checkpoint; model.init takes a pretraining run "
                           f"dir (outputs/pretrain/<date>/<time>); to continue a classifier use resume=")
    manifest.verify_checkpoint(ckpt)
    if not isinstance(model_config, dict):
        raise TformerError(f"checkpoint {ckpt}: {ckpt.model_config.name} is not a mapping; pretrain again")
    try:
        build(EncoderConfig, model_config, ckpt.model_config.name)
    except (ConfigError, TypeError) as exc:
        raise TformerError(f"checkpoint {ckpt} is invalid: {exc}") from None
    try:
        state = safetensors.torch.load_file(str(ckpt.weights))
    except (SafetensorError, OSError, json.JSONDecodeError) as exc:
        raise TformerError(f"checkpoint {ckpt.path} is unreadable ({exc}); pretrain again") from None
    return Pretrained(ckpt, model_config, state, meta)


def read_training_state(ckpt: CheckpointDir) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, JSON) of a `last` checkpoint's training state, as the loop saved them (any task's)."""
    if not ckpt.has_training_state():
        raise TformerError(f"checkpoint {ckpt} has no training state to resume from; pass the run directory")
    saved = manifest.read_json(ckpt, ckpt.training_json, allow_nan=True)  # (an early-stopping best of inf)
    if not isinstance(saved, dict):
        raise TformerError(f"the training state in {ckpt} is not a mapping ({ckpt.training_json.name}); start a new "
                           f"run")
    try:
        return safetensors.torch.load_file(str(ckpt.training_tensors)), saved
    except (SafetensorError, OSError) as exc:
        raise TformerError(f"the training state in {ckpt} is unreadable ({exc}); start a new run") from exc
