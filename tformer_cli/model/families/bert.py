"""BERT and the checkpoints that share its tensors and math (MiniLM, bge, e5, ...).

Our encoder computes BERT with four knobs: an embedding LayerNorm, no sqrt(d) scaling, learned positions and exact
GELU with LayerNorm eps 1e-12. Token type 0 (the only one a single text uses) is folded into the position table.
RoBERTa and ELECTRA reuse `embeddings` and `layers` (roberta.py, electra.py).
"""
from __future__ import annotations

import torch

from .base import Family, MlmHead, ModelConfig, Tensors, layer_norm, register

ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


def activation(c: ModelConfig, key: str = "hidden_act") -> str:
    act = ACTIVATIONS.get(str(c.get(key, "gelu")))
    if act is None:
        raise c.refuse(f"activation {c.get(key)!r} is not one of {', '.join(ACTIVATIONS)}")
    return act


def shape(c: ModelConfig, max_len: int, offset: int = 0) -> dict:
    """EncoderConfig keys of a BERT-shaped config.json; `offset` rows of the position table come before the first
    real position (RoBERTa: padding_idx + 1)."""
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise c.refuse(f"{c.get('position_embedding_type')} positions are not supported",
                       "only absolute (BERT-style) positions are")
    c.positions("max_position_embeddings", max_len, offset)
    return {"d_model": c.number("hidden_size"), "n_layers": c.number("num_hidden_layers"),
            "n_heads": c.number("num_attention_heads"), "d_ff": c.number("intermediate_size"),
            "activation": activation(c), "norm": "post", "positions": "learned", "scale_embeddings": False,
            "embedding_norm": True, "norm_eps": float(c.number("layer_norm_eps", 1e-12, whole=False, low=0)),
            "embedding_dim": 0, "pad_id": c.number("pad_token_id", 0, low=0) if c.get("pad_token_id") is not None
            else 0, "max_len": max_len}


def embeddings(t: Tensors, max_len: int, offset: int = 0, prefix: str = "embeddings.") -> Tensors:
    """Word table, positions `offset`..`offset + max_len` (+ token type 0 when the model has types), LayerNorm."""
    positions = t[f"{prefix}position_embeddings.weight"][offset:offset + max_len]
    types = t.get(f"{prefix}token_type_embeddings.weight")
    state = {"token_embedding.weight": t[f"{prefix}word_embeddings.weight"],
             "position_embedding.weight": positions + types[0] if types is not None else positions}
    layer_norm(t, "embedding_norm", f"{prefix}LayerNorm", state)
    return state


def layers(t: Tensors, n_layers: int) -> Tensors:
    """BertLayer tensors -> our blocks (Q, K and V stacked into one (3D, D) matrix)."""
    state: Tensors = {}
    for i in range(n_layers):
        b, ours = f"encoder.layer.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            state[ours + "attn.qkv." + kind] = torch.cat(
                [t[f"{b}attention.self.{n}.{kind}"] for n in ("query", "key", "value")])
            state[ours + "attn.out." + kind] = t[f"{b}attention.output.dense.{kind}"]
            state[ours + "ff.up." + kind] = t[f"{b}intermediate.dense.{kind}"]
            state[ours + "ff.down." + kind] = t[f"{b}output.dense.{kind}"]
        layer_norm(t, ours + "norm1", f"{b}attention.output.LayerNorm", state)
        layer_norm(t, ours + "norm2", f"{b}output.LayerNorm", state)
    return state


def state(t: Tensors, shape: dict, c: ModelConfig) -> Tensors:
    return {**embeddings(t, shape["max_len"]), **layers(t, shape["n_layers"])}


# BertForMaskedLM / BertForPreTraining: the head BERT was pretrained with (its decoder tied to the word table).
MLM_HEAD = MlmHead("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                   ("cls.predictions.bias", "cls.predictions.decoder.bias"))
BERT = register(Family(name="BERT", model_types=("bert",), prefixes=("bert.",), shape=shape, state=state,
                       mlm_heads=(MLM_HEAD,)))
