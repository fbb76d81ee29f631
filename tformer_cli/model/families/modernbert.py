"""ModernBERT (Warner et al. 2024; answerdotai/ModernBERT-base, -large): 8,192 positions.

Our encoder computes it with these knobs: no absolute positions but rotary ones (`positions=rotary`, global layers
with theta 160,000, local layers their own), local attention in all but every third layer (a window of
`local_attention` tokens: local_attention // 2 on each side), a GeGLU feed-forward (`feed_forward=gated`),
pre-norm blocks whose first one reads the normalised embeddings as they are (`first_block_norm=false`), and no
biases in the linear layers or LayerNorms (`bias=false`). Configs saved by transformers >= 5 name the layer kinds
(`layer_types`) and rotary bases (`rope_parameters`); older ones `global_attn_every_n_layers` and
`global_rope_theta` / `local_rope_theta`: both are read.
"""
from __future__ import annotations

from .base import Family, MlmHead, ModelConfig, Tensors, layer_norm, register
from .bert import activation

LAYER_KINDS = ("full_attention", "sliding_attention")


def _global_every(c: ModelConfig, n_layers: int) -> int:
    """n such that layers 0, n, 2n, ... attend globally and the others locally (n_layers: all global)."""
    kinds = c.get("layer_types")
    if kinds is None:
        return c.number("global_attn_every_n_layers", 3)
    if not isinstance(kinds, list) or len(kinds) != n_layers or any(k not in LAYER_KINDS for k in kinds):
        raise c.refuse(f"layer_types={kinds!r} is not {n_layers} of {', '.join(LAYER_KINDS)}",
                       "the config.json is damaged or not a ModernBERT model's")
    every = next((i for i in range(1, n_layers) if kinds[i] == "full_attention"), n_layers)
    if [k == "full_attention" for k in kinds] != [i % every == 0 for i in range(n_layers)]:
        raise c.refuse(f"layer_types {kinds} are not global attention every n-th layer from layer 0",
                       "tformer reproduces ModernBERT's regular global/local pattern only")
    return every


def _rope_theta(c: ModelConfig, kind: str, legacy: str, default: float) -> float:
    """A layer kind's rotary base, from rope_parameters (transformers >= 5) or the older flat key."""
    if c.get("rope_scaling") is not None:
        raise c.refuse(f"rope_scaling={c.get('rope_scaling')!r} is not supported", "only plain rotary positions are")
    params = (c.get("rope_parameters") or {}).get(kind) or {}
    if params.get("rope_type", "default") != "default":
        raise c.refuse(f"rope_parameters.{kind}.rope_type={params['rope_type']!r} is not supported",
                       "only plain (default) rotary positions are")
    theta = params.get("rope_theta", c.get(legacy, default))
    return float(ModelConfig({legacy: theta}, c.folder).number(legacy, whole=False, low=1))


def shape(c: ModelConfig, max_len: int) -> dict:
    c.positions("max_position_embeddings", max_len, default=8192)
    d, heads, n_layers = c.number("hidden_size"), c.number("num_attention_heads"), c.number("num_hidden_layers")
    biases = {key: bool(c.get(key, False)) for key in ("norm_bias", "attention_bias", "mlp_bias")}
    if len(set(biases.values())) > 1:
        raise c.refuse(f"biases differ between layers ({', '.join(f'{k}={v}' for k, v in biases.items())})",
                       "tformer has one switch for all of them (ModernBERT has none)")
    if c.get("head_dim") not in (None, d // heads):
        raise c.refuse(f"head_dim={c.get('head_dim')} is not hidden_size / num_attention_heads ({d // heads})")
    every = _global_every(c, n_layers)
    return {"d_model": d, "n_layers": n_layers, "n_heads": heads, "d_ff": c.number("intermediate_size"),
            "activation": activation(c, "hidden_activation"), "feed_forward": "gated", "norm": "pre",
            "first_block_norm": False, "positions": "rotary", "scale_embeddings": False, "embedding_norm": True,
            "bias": biases["norm_bias"], "norm_eps": float(c.number("norm_eps", 1e-5, whole=False, low=0)),
            "rotary_theta": _rope_theta(c, "full_attention", "global_rope_theta", 160_000.0),
            "local_rotary_theta": _rope_theta(c, "sliding_attention", "local_rope_theta", 10_000.0),
            "local_window": c.number("local_attention", 128) if every > 1 else 0, "global_every": every,
            "embedding_dim": 0, "pad_id": c.number("pad_token_id", 0, low=0) if c.get("pad_token_id") is not None
            else 0, "max_len": max_len}


def state(t: Tensors, shape: dict, c: ModelConfig) -> Tensors:
    """ModernBertModel tensors -> ours: Wqkv is already Q, K and V stacked; Wi is [value; gate], as our gated up."""
    out = {"token_embedding.weight": t["embeddings.tok_embeddings.weight"]}
    layer_norm(t, "embedding_norm", "embeddings.norm", out)
    for i in range(shape["n_layers"]):
        b, ours = f"layers.{i}.", f"blocks.{i}."
        for mine, theirs in (("attn.qkv", "attn.Wqkv"), ("attn.out", "attn.Wo"), ("ff.up", "mlp.Wi"),
                             ("ff.down", "mlp.Wo")):
            out[f"{ours}{mine}.weight"] = t[f"{b}{theirs}.weight"]
            if shape["bias"]:
                out[f"{ours}{mine}.bias"] = t[f"{b}{theirs}.bias"]
        if i:  # layer 0's attn_norm is the identity
            layer_norm(t, ours + "norm1", b + "attn_norm", out)
        layer_norm(t, ours + "norm2", b + "mlp_norm", out)
    layer_norm(t, "final_norm", "final_norm", out)
    return out


# ModernBertForMaskedLM: head (dense, activation, norm; biases as configured) then the decoder tied to the table.
HEADS = (MlmHead("head.dense", "head.norm", ("decoder.bias",), activation="classifier_activation"),)
MODERNBERT = register(Family(name="ModernBERT", model_types=("modernbert",), prefixes=("model.",), shape=shape,
                             state=state, mlm_heads=HEADS))
