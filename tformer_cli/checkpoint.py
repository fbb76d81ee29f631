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

from .errors import TformerError
from .run_dir import CheckpointDir, RunDir, newest_checkpoints, resolve_checkpoint, resolve_resumable

FORMAT_VERSION = 1


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
    from safetensors.torch import save_file

    target = target if isinstance(target, CheckpointDir) else CheckpointDir(target)
    target.path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path, old = target.tmp_sibling(), target.old_sibling()
    if tmp_path.exists():
        shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    tmp = CheckpointDir(tmp_path)
    try:
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
        for f in tmp_path.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(tmp_path)
        if old.exists():
            shutil.rmtree(old)
        if target.path.exists():
            os.replace(target.path, old)
        os.replace(tmp_path, target.path)
        _fsync_dir(target.path.parent)
        if old.exists():
            shutil.rmtree(old)
    except OSError as exc:
        shutil.rmtree(tmp_path, ignore_errors=True)
        hint = "free some disk space" if getattr(exc, "errno", None) == 28 else "check the output directory"
        raise TformerError(f"could not save checkpoint {target}: {exc.strerror or exc}; {hint} "
                           f"(the previous checkpoint is kept)") from exc
    return target


def resolve(path: str | Path) -> CheckpointDir:
    """A checkpoint dir, or a run dir (-> its best checkpoint); falls back to a checkpoint left mid-swap."""
    found = resolve_checkpoint(path)
    if found is None:
        raise TformerError(f"checkpoint {path} does not exist; pass checkpoint=<run dir> (its best checkpoint) or a checkpoint directory")
    return found


def newest(root: str | Path = "outputs") -> CheckpointDir:
    found = newest_checkpoints(root, "best")
    if not found:
        raise TformerError(f"no trained checkpoint under {Path(root).resolve()}/; run `tformer train` first or pass "
                           f"checkpoint=<path>")
    return found[-1]


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

    def saved_config(self):
        """The run's saved config as an OmegaConf tree (None for a checkpoint without one)."""
        from omegaconf import OmegaConf

        return OmegaConf.load(self.files.config) if self.files.config.is_file() else None


def load(path: str | Path | CheckpointDir, device: str | torch.device = "cpu") -> Loaded:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from .model.encoder import EncoderConfig, TransformerClassifier

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
    except json.JSONDecodeError as exc:
        raise TformerError(f"checkpoint {p} has a corrupt JSON file ({exc}); retrain or use another checkpoint") from exc
    if meta.get("format_version") != FORMAT_VERSION:
        raise TformerError(f"checkpoint {p} has format version {meta.get('format_version')}, this tformer reads "
                           f"{FORMAT_VERSION}; retrain with this version")
    cfg = EncoderConfig.from_dict(model_config)
    model = TransformerClassifier(cfg)
    try:
        state = load_file(str(ckpt.weights))
    except (SafetensorError, OSError) as exc:
        raise TformerError(f"checkpoint {ckpt.weights} is unreadable ({exc}); retrain or use another "
                           f"checkpoint") from exc
    expected = model.state_dict()
    missing_keys = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape))
    if missing_keys or unexpected or wrong:
        detail = (f"missing {missing_keys[:3]}" if missing_keys else f"unexpected {unexpected[:3]}" if unexpected
                  else f"shape mismatch in {wrong[:3]}")
        raise TformerError(f"checkpoint weights {ckpt.weights} do not match {ckpt.model_config.name} ({detail}); "
                           f"the files are from different runs or corrupted")
    model.load_state_dict(state)
    model.to(device).eval()
    return Loaded(model, model_config, ckpt.tokenizer, label_names, metrics, meta, p, ckpt)


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


def find_resumable(resume, outputs_dir: str | Path = "outputs") -> CheckpointDir:
    """resume=true: the newest run's last checkpoint; resume=<run dir or checkpoint dir>: that one."""
    if resume is True or str(resume).lower() == "true":
        found = [c for c in newest_checkpoints(outputs_dir, "last") if c.training_json.is_file()]
        if not found:
            raise TformerError(f"resume=true but no run with a last checkpoint under {outputs_dir}/; start a run "
                               f"first or pass resume=<run dir>")
        return found[-1]
    found = resolve_resumable(resume)
    if found is None:
        raise TformerError(f"resume={resume}: no last checkpoint with training state there; pass the run directory "
                           f"(outputs/train/<date>/<time>)")
    return found


def load_training_state(ckpt: CheckpointDir, device: str | torch.device = "cpu") -> ResumeState:
    from omegaconf import OmegaConf
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
    config = OmegaConf.to_container(OmegaConf.load(ckpt.config), resolve=True) if ckpt.config.is_file() else {}
    return ResumeState(RunDir.of_checkpoint(ckpt), loaded, config, tensors, state)
