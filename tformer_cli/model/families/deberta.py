"""DeBERTa-v2 and v3 (model_type "deberta-v2": microsoft/deberta-v3-small/base/large, mdeberta-v3-base, ...).

Our encoder computes them with the disentangled attention (model/disentangled.py: content and relative-position
scores, one relative table shared by the layers) and post-norm BERT blocks. The embeddings are the word table, an
optional projection to hidden_size, LayerNorm; absolute positions (position_biased_input) and token type 0, when a
model has them, are folded into one learned position table (through the projection, which is linear).
DeBERTa multiplies the embeddings by the padding mask; only padding positions change, which no real token sees.
What is not reproduced is refused: the convolution layer of deberta-v2-xlarge/xxlarge (conv_kernel_size), separate
position projections (share_att_key false), position attention other than c2p+p2c, an unnormalised relative table.
"""
from __future__ import annotations

import torch

from .base import Family, MlmHead, ModelConfig, Tensors, layer_norm, register
from .bert import activation


def _position_types(c: ModelConfig) -> list[str]:
    kinds = c.get("pos_att_type") or []
    if isinstance(kinds, str):  # older configs: "p2c|c2p"
        kinds = kinds.lower().split("|")
    return sorted({str(k).strip() for k in kinds})


def shape(c: ModelConfig, max_len: int) -> dict:
    if not c.get("relative_attention", False):
        raise c.refuse("relative_attention=false (DeBERTa without relative positions) is not supported",
                       "use a DeBERTa-v2/v3 checkpoint with relative_attention=true")
    if c.get("conv_kernel_size", 0):
        raise c.refuse(f"conv_kernel_size={c.get('conv_kernel_size')} (the convolution layer of deberta-v2-xlarge/"
                       f"xxlarge) is not supported", "use a DeBERTa-v3 checkpoint (no convolution)")
    if _position_types(c) != ["c2p", "p2c"]:
        raise c.refuse(f"pos_att_type={c.get('pos_att_type')!r} is not supported", "only c2p+p2c (every "
                       "DeBERTa-v2/v3 release) is")
    if not c.get("share_att_key", False):
        raise c.refuse("share_att_key=false (separate position projections) is not supported",
                       "only DeBERTa-v2/v3's shared ones are")
    if "layer_norm" not in [x.strip() for x in str(c.get("norm_rel_ebd", "none")).lower().split("|")]:
        raise c.refuse(f"norm_rel_ebd={c.get('norm_rel_ebd')!r} is not supported", "only layer_norm is")
    d, heads = c.number("hidden_size"), c.number("num_attention_heads")
    if c.get("attention_head_size") not in (None, d // heads):
        raise c.refuse(f"attention_head_size={c.get('attention_head_size')} differs from hidden_size/"
                       f"num_attention_heads ({d // heads}), which is not supported")
    if c.get("position_biased_input", True):  # absolute positions too: max_len within the table
        c.positions("max_position_embeddings", max_len)
    buckets = c.get("position_buckets", -1)
    max_rel = c.get("max_relative_positions", -1)
    if not isinstance(max_rel, int) or max_rel < 1:
        max_rel = c.number("max_position_embeddings", 512)
    log_buckets = isinstance(buckets, int) and not isinstance(buckets, bool) and buckets > 0
    embedding = c.number("embedding_size", d)
    return {"d_model": d, "n_layers": c.number("num_hidden_layers"), "n_heads": heads,
            "d_ff": c.number("intermediate_size"), "activation": activation(c), "norm": "post",
            "positions": "learned" if c.get("position_biased_input", True) or c.get("type_vocab_size", 0)
            else "none", "scale_embeddings": False, "embedding_norm": True,
            "norm_eps": float(c.number("layer_norm_eps", 1e-7, whole=False, low=0)),
            "embedding_dim": embedding if embedding != d else 0,
            "pad_id": c.number("pad_token_id", 0, low=0) if c.get("pad_token_id") is not None else 0,
            "max_len": max_len, "attention": "disentangled", "relative_buckets": buckets if log_buckets else max_rel,
            "max_relative_positions": max_rel if log_buckets else 0}


def state(t: Tensors, shape: dict, c: ModelConfig) -> Tensors:
    L = shape["max_len"]
    word = t["embeddings.word_embeddings.weight"]
    out: Tensors = {"token_embedding.weight": word}
    if shape["embedding_dim"]:
        out["embedding_projection.weight"] = t["embeddings.embed_proj.weight"]
    if shape["positions"] == "learned":  # absolute positions and token type 0, at the table's width ...
        table = torch.zeros(L, word.shape[1])
        if c.get("position_biased_input", True):
            table = table + t["embeddings.position_embeddings.weight"][:L]
        if "embeddings.token_type_embeddings.weight" in t:
            table = table + t["embeddings.token_type_embeddings.weight"][0]
        # ... then projected as the sum is, before the LayerNorm
        out["position_embedding.weight"] = table @ out["embedding_projection.weight"].T if shape["embedding_dim"] \
            else table
    layer_norm(t, "embedding_norm", "embeddings.LayerNorm", out)
    out["relative_positions.table.weight"] = t["encoder.rel_embeddings.weight"][:2 * shape["relative_buckets"]]
    layer_norm(t, "relative_positions.norm", "encoder.LayerNorm", out)
    for i in range(shape["n_layers"]):
        b, ours = f"encoder.layer.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            out[ours + "attn.qkv." + kind] = torch.cat(
                [t[f"{b}attention.self.{n}_proj.{kind}"] for n in ("query", "key", "value")])
            out[ours + "attn.out." + kind] = t[f"{b}attention.output.dense.{kind}"]
            out[ours + "ff.up." + kind] = t[f"{b}intermediate.dense.{kind}"]
            out[ours + "ff.down." + kind] = t[f"{b}output.dense.{kind}"]
        layer_norm(t, ours + "norm1", f"{b}attention.output.LayerNorm", out)
        layer_norm(t, ours + "norm2", f"{b}output.LayerNorm", out)
    return out


# DebertaV2ForMaskedLM saves its head under BERT's names, or (the original checkpoints' layout) under lm_predictions.
HEADS = (MlmHead("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                 ("cls.predictions.bias", "cls.predictions.decoder.bias")),
         MlmHead("lm_predictions.lm_head.dense", "lm_predictions.lm_head.LayerNorm", ("lm_predictions.lm_head.bias",)))
DEBERTA = register(Family(name="DeBERTa", model_types=("deberta-v2",), prefixes=("deberta.",), shape=shape,
                          state=state, mlm_heads=HEADS))
