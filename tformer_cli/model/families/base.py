"""What a model family is: how a Hugging Face `config.json` and its safetensors tensors become our encoder.

One family per module (bert.py, roberta.py, ...), each registering a `Family` under the `model_type` values its
config.json may carry. `model/pretrained.py` reads the folder, picks the family by `model_type` (never by guessing
from the weights), checks that the weights are that family's, and asks the family for two things: the
`EncoderConfig` keys that make our encoder compute what the original computes, and its tensors under our names.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ...errors import TformerError

Tensors = dict[str, torch.Tensor]


class ModelConfig:
    """A model folder's config.json, each value read with the check that names the key when it is wrong."""

    def __init__(self, values: dict, folder: Path):
        self.values, self.folder = values, folder

    def get(self, key: str, default=None):
        return self.values.get(key, default)

    def number(self, key: str, default=None, whole: bool = True, low: float = 1):
        """`key` as a whole number (or, whole=False, a finite float) >= low; one line naming it otherwise."""
        value = self.values.get(key, default)
        ok = (isinstance(value, int) if whole else isinstance(value, (int, float))) and not isinstance(value, bool) \
            and math.isfinite(value) and value >= low
        if not ok:
            raise TformerError(f"model.pretrained: {self.folder / 'config.json'} has {key}={value!r}, not a "
                               f"{'whole number' if whole else 'finite number'} >= {low}; the file is damaged or "
                               f"not this model's config")
        return value

    def refuse(self, what: str, fix: str = "") -> TformerError:
        """The one-line refusal of a setting this family's loader does not reproduce."""
        return TformerError(f"model.pretrained={self.folder}: {what}" + (f"; {fix}" if fix else ""))

    def positions(self, key: str, max_len: int, offset: int = 0, default=512) -> int:
        """The model's usable positions (its table's rows less `offset`), max_len checked against them."""
        usable = self.number(key, default) - offset
        if max_len > usable:
            raise TformerError(f"model.max_len={max_len} exceeds the {usable} positions {self.folder.name} was "
                               f"trained with; use model.max_len<={usable} (and data.long_text for longer documents)")
        return usable


@dataclass(frozen=True)
class Family:
    name: str  # as the run log and the README say it: "RoBERTa"
    model_types: tuple[str, ...]  # config.json `model_type` values read by this family
    prefixes: tuple[str, ...]  # what the task models of this family put before the encoder's tensor names
    shape: Callable[[ModelConfig, int], dict]  # (config, max_len) -> EncoderConfig keys (vocab_size excluded)
    state: Callable[[Tensors, dict, ModelConfig], Tensors]  # (tensors, shape, config) -> our parameter names
    needs: str = ""  # what it needs installed beyond tformer's own packages, for the README table
    mlm_heads: tuple["MlmHead", ...] = ()  # where its masked-LM checkpoints keep the prediction head


@dataclass(frozen=True)
class MlmHead:
    """Where a family's masked-LM checkpoint keeps its prediction head, which is model/mlm.py's head: dense (d->d),
    an activation, a LayerNorm, then the output layer tied to the token table plus a bias. `activation` names the
    config.json key of the head's activation (None: always exact GELU, as RoBERTa's)."""

    dense: str
    norm: str
    bias: tuple[str, ...]  # the output bias, by each name it is saved under
    activation: str | None = "hidden_act"


FAMILIES: dict[str, Family] = {}  # by model_type


def register(family: Family) -> Family:
    for model_type in family.model_types:
        FAMILIES[model_type] = family
    return family


def layer_norm(t: Tensors, ours: str, theirs: str, state: Tensors) -> None:
    """Copy a LayerNorm's weight (and bias, when the checkpoint has one), gamma/beta spellings read as well."""
    for kind, old in (("weight", "gamma"), ("bias", "beta")):
        value = t.get(f"{theirs}.{kind}", t.get(f"{theirs}.{old}"))
        if value is not None:
            state[f"{ours}.{kind}"] = value
        elif kind == "weight":
            raise KeyError(f"{theirs}.weight")


def mlm_head(t: Tensors, c: ModelConfig, heads: tuple[MlmHead, ...], d_model: int, vocab: int) -> tuple[Tensors, str]:
    """(model/mlm.py's head tensors, what the log says of them): the checkpoint's own head when it has one that our
    head computes exactly (same shapes, exact GELU), else ({}, why a new head is made). A bias the checkpoint leaves
    out (ModernBERT's) is zero, which is what it computes. Without its output bias a head is taken only from a
    checkpoint whose config.json names a masked-LM model: ModernBERT's classifiers have a `head` too."""
    if c.get("tie_word_embeddings", True) is False:  # (ours is always the token table)
        return {}, "its output layer is not the token table (tie_word_embeddings=false): a new head tied to it"
    masked_lm = any(isinstance(a, str) and a.endswith(("ForMaskedLM", "ForPreTraining"))
                    for a in (c.get("architectures") or []))
    for head in heads:
        if f"{head.dense}.weight" not in t or not (masked_lm or any(b in t for b in head.bias)):
            continue
        name, act = head.dense.rsplit(".", 1)[0], "gelu" if head.activation is None else c.get(head.activation, "gelu")
        if act != "gelu":
            return {}, f"its {name} head uses {act}, not exact GELU: a new head"
        zeros = torch.zeros(d_model)
        out = {"transform.0.weight": t[f"{head.dense}.weight"], "transform.0.bias": t.get(f"{head.dense}.bias", zeros),
               "transform.2.weight": t.get(f"{head.norm}.weight", t.get(f"{head.norm}.gamma")),
               "transform.2.bias": t.get(f"{head.norm}.bias", t.get(f"{head.norm}.beta", zeros)),
               "output_bias": next((t[b] for b in head.bias if b in t), torch.zeros(vocab))}
        wanted = {"transform.0.weight": (d_model, d_model), "transform.0.bias": (d_model,),
                  "transform.2.weight": (d_model,), "transform.2.bias": (d_model,), "output_bias": (vocab,)}
        if any(v is None or tuple(v.shape) != wanted[k] for k, v in out.items()):
            return {}, f"its {name} head has another shape than ours: a new head"
        return {k: v.float().contiguous() for k, v in out.items()}, f"its masked-LM head ({name})"
    return {}, "no masked-LM head in the checkpoint: a new head tied to the token table"
