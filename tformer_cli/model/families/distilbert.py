"""DistilBERT: BERT's post-norm layers under other names and config keys (dim, n_layers, n_heads, hidden_dim,
activation), no token types, LayerNorm eps fixed at 1e-12 (modeling_distilbert.py ignores any config value).

The position table is in the weights whether it was learned or, with sinusoidal_pos_embds, filled with sinusoids
(there `transformers` keeps it frozen; here it is fine-tuned with the rest, as a learned table).
"""
from __future__ import annotations

import torch

from . import bert
from .base import Family, MlmHead, ModelConfig, Tensors, layer_norm, register


def shape(c: ModelConfig, max_len: int) -> dict:
    c.positions("max_position_embeddings", max_len)
    return {"d_model": c.number("dim"), "n_layers": c.number("n_layers"), "n_heads": c.number("n_heads"),
            "d_ff": c.number("hidden_dim"), "activation": bert.activation(c, "activation"), "norm": "post",
            "positions": "learned", "scale_embeddings": False, "embedding_norm": True, "norm_eps": 1e-12,
            "embedding_dim": 0, "pad_id": c.number("pad_token_id", 0, low=0) if c.get("pad_token_id") is not None
            else 0, "max_len": max_len}


def state(t: Tensors, shape: dict, c: ModelConfig) -> Tensors:
    """Embeddings as BERT's (no token type table); TransformerBlock tensors -> our blocks."""
    out = bert.embeddings(t, shape["max_len"])
    for i in range(shape["n_layers"]):
        b, ours = f"transformer.layer.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            out[ours + "attn.qkv." + kind] = torch.cat([t[f"{b}attention.{n}_lin.{kind}"] for n in "qkv"])
            out[ours + "attn.out." + kind] = t[f"{b}attention.out_lin.{kind}"]
            out[ours + "ff.up." + kind] = t[f"{b}ffn.lin1.{kind}"]
            out[ours + "ff.down." + kind] = t[f"{b}ffn.lin2.{kind}"]
        layer_norm(t, ours + "norm1", f"{b}sa_layer_norm", out)
        layer_norm(t, ours + "norm2", f"{b}output_layer_norm", out)
    return out


DISTILBERT = register(Family(name="DistilBERT", model_types=("distilbert",), prefixes=("distilbert.",), shape=shape,
                             state=state, mlm_heads=(MlmHead("vocab_transform", "vocab_layer_norm",
                                                             ("vocab_projector.bias",), activation="activation"),)))
