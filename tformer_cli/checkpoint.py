"""Checkpoints: a self-contained directory of safetensors weights plus JSON/YAML, written atomically.

    model.safetensors   fp32 weights                 tokenizer.json   the exact tokenizer used
    model.json          EncoderConfig (shapes)       labels.json      label names, id order
    config.yaml         the run's resolved config    metrics.json     the metrics that made it best/last
    meta.json           format version, epoch, step  [training_state.safetensors + trainer_state.json]

Nothing here is ever unpickled. A write goes to a temporary sibling directory, is fsynced, then renamed over
the old one, so a crash at any moment leaves a complete checkpoint behind.
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

FORMAT_VERSION = 1
REQUIRED = ("model.safetensors", "model.json", "tokenizer.json", "labels.json", "meta.json")


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


def save(directory: Path, model, *, model_config: dict, tokenizer_json: str, label_names: list[str],
         config_yaml: str, metrics: dict, meta: dict, extra_tensors: dict | None = None,
         extra_json: dict | None = None) -> Path:
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.parent / f".{directory.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        state = {k: v.detach().float().cpu().contiguous() if v.is_floating_point() else v.detach().cpu().contiguous()
                 for k, v in model.state_dict().items()}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        _write_json(tmp / "model.json", model_config)
        (tmp / "tokenizer.json").write_text(tokenizer_json)
        _write_json(tmp / "labels.json", list(label_names))
        (tmp / "config.yaml").write_text(config_yaml)
        _write_json(tmp / "metrics.json", metrics)
        _write_json(tmp / "meta.json", {"format_version": FORMAT_VERSION, "saved_at": time.time(), **meta})
        if extra_tensors:
            save_file({k: v.detach().cpu().contiguous() for k, v in extra_tensors.items()},
                      str(tmp / "training_state.safetensors"))
        if extra_json is not None:
            _write_json(tmp / "trainer_state.json", extra_json)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        old = directory.parent / f".{directory.name}.old"
        if old.exists():
            shutil.rmtree(old)
        if directory.exists():
            os.replace(directory, old)
        os.replace(tmp, directory)
        _fsync_dir(directory.parent)
        if old.exists():
            shutil.rmtree(old)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        hint = "free some disk space" if getattr(exc, "errno", None) == 28 else "check the output directory"
        raise TformerError(f"could not save checkpoint {directory}: {exc.strerror or exc}; {hint} "
                           f"(the previous checkpoint is kept)") from exc
    return directory


def resolve(path: str | Path) -> Path:
    """A checkpoint dir, or a run dir (-> its best checkpoint); falls back to a checkpoint left mid-swap."""
    p = Path(os.path.expanduser(str(path)))
    if (p / "checkpoints" / "best").is_dir() or (p / "checkpoints" / ".best.old").is_dir():
        p = p / "checkpoints" / "best"
    if not p.is_dir():
        old = p.parent / f".{p.name}.old"
        if old.is_dir():
            return old
        raise TformerError(f"checkpoint {p} does not exist; pass checkpoint=<run dir>/checkpoints/best")
    return p


def newest(root: str | Path = "outputs") -> Path:
    root = Path(root)
    candidates = [p.parent for p in root.glob("**/checkpoints/best/model.safetensors")] if root.is_dir() else []
    if not candidates:
        raise TformerError(f"no trained checkpoint under {root.resolve()}/; run `tformer train` first or pass "
                           f"checkpoint=<path>")
    return max(candidates, key=lambda p: (p / "meta.json").stat().st_mtime if (p / "meta.json").exists() else 0)


@dataclass
class Loaded:
    model: torch.nn.Module
    model_config: dict
    tokenizer_file: Path
    label_names: list[str]
    metrics: dict
    meta: dict
    path: Path


def load(path: str | Path, device: str | torch.device = "cpu") -> Loaded:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from .model.encoder import EncoderConfig, TransformerClassifier

    p = resolve(path)
    missing = [f for f in REQUIRED if not (p / f).is_file()]
    if missing:
        raise TformerError(f"checkpoint {p} is incomplete (missing {', '.join(missing)}); use a directory written "
                           f"by `tformer train`, e.g. <run dir>/checkpoints/best")
    try:
        meta = json.loads((p / "meta.json").read_text())
        model_config = json.loads((p / "model.json").read_text())
        label_names = json.loads((p / "labels.json").read_text())
        metrics = json.loads((p / "metrics.json").read_text()) if (p / "metrics.json").is_file() else {}
    except json.JSONDecodeError as exc:
        raise TformerError(f"checkpoint {p} has a corrupt JSON file ({exc}); retrain or use another checkpoint") from exc
    if meta.get("format_version") != FORMAT_VERSION:
        raise TformerError(f"checkpoint {p} has format version {meta.get('format_version')}, this tformer reads "
                           f"{FORMAT_VERSION}; retrain with this version")
    cfg = EncoderConfig.from_dict(model_config)
    model = TransformerClassifier(cfg)
    try:
        state = load_file(str(p / "model.safetensors"))
    except (SafetensorError, OSError) as exc:
        raise TformerError(f"checkpoint {p}/model.safetensors is unreadable ({exc}); retrain or use another "
                           f"checkpoint") from exc
    expected = model.state_dict()
    missing_keys = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape))
    if missing_keys or unexpected or wrong:
        detail = (f"missing {missing_keys[:3]}" if missing_keys else f"unexpected {unexpected[:3]}" if unexpected
                  else f"shape mismatch in {wrong[:3]}")
        raise TformerError(f"checkpoint {p} does not match its model.json ({detail}); the files are from different "
                           f"runs or corrupted")
    model.load_state_dict(state)
    model.to(device).eval()
    return Loaded(model, model_config, p / "tokenizer.json", label_names, metrics, meta, p)
