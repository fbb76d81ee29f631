"""ELECTRA discriminators (google/electra-small-discriminator, ...): BERT's layers under an embedding that is
embedding_size wide: word + position + token type 0 -> LayerNorm, all E-wide, then `embeddings_project`, a
Linear(E, H) with bias, when E != hidden_size (our embedding_projection=after_norm).

A generator checkpoint (ElectraForMaskedLM) has the same encoder and loads too; its head tensors are dropped, and
`tformer pretrain` continues with its head where that head is d_model wide (an embedding_size as wide as hidden_size).
"""
from __future__ import annotations

from . import bert
from .base import Family, MlmHead, ModelConfig, Tensors, register


def shape(c: ModelConfig, max_len: int) -> dict:
    out = bert.shape(c, max_len)
    width = c.number("embedding_size", out["d_model"])
    if width != out["d_model"]:
        out.update(embedding_dim=width, embedding_projection="after_norm")
    return out


def state(t: Tensors, shape: dict, c: ModelConfig) -> Tensors:
    out = {**bert.embeddings(t, shape["max_len"]), **bert.layers(t, shape["n_layers"])}
    if shape["embedding_dim"]:
        out["embedding_projection.weight"] = t["embeddings_project.weight"]
        out["embedding_projection.bias"] = t["embeddings_project.bias"]
    return out


# ElectraForMaskedLM (a generator): its head's activation is always exact GELU.
HEADS = (MlmHead("generator_predictions.dense", "generator_predictions.LayerNorm", ("generator_lm_head.bias",),
                 activation=None),)
ELECTRA = register(Family(name="ELECTRA", model_types=("electra",), prefixes=("electra.",), shape=shape, state=state,
                          mlm_heads=HEADS))
