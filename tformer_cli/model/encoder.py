"""The Transformer encoder classifier, written out so the math is visible.

Shapes: B = batch, T = tokens, D = d_model, H = heads, Dh = D / H, F = d_ff, C = classes.

    ids (B, T) -> token embedding (B, T, E) -> [projection E -> D] -> [* sqrt(D)] + positions (B, T, D)
      -> [LayerNorm] -> N x EncoderBlock -> pooling (B, D) -> head -> logits (B, C)

The bracketed steps are knobs: the from-scratch models scale by sqrt(D) (Vaswani et al.) and have no embedding
LayerNorm; BERT-family encoders loaded whole (model/pretrained.py) have learned positions, an embedding
LayerNorm, no scale, exact GELU and LayerNorm eps 1e-12, and so run here with the very same math as in
`transformers` (a parity test checks the hidden states).

A padding mask (B, T) with True at real tokens keeps padding out of attention and out of mean pooling,
so a text's logits do not depend on how much padding its batch needed. On a CPU, batches with much padding run
"unpadded" between attentions (`RealTokens`): the linear layers see only the N real tokens, (N, D). Batches with
no padding run with no mask at all, on a GPU too, where the loops decide it on the host (`fast_paths.Layout`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..registry import registrar
from ..typed_config import check_ranges
from . import fast_paths, rotary
from .disentangled import DisentangledSelfAttention, RelativePositionTable
from .fast_paths import Dropout, Layout, RealTokens


# The keys of an encoder's config that a classifier built on a saved encoder (a pretraining run's, a teacher's) takes
# from its own model config; every other key is the saved encoder's shape (`init_shape_keys`).
CLASSIFIER_KEYS = ("pooling", "head_hidden", "dropout", "attention_dropout", "max_len", "pair_buckets",
                   "token_dropout")


def init_shape_keys() -> tuple[str, ...]:
    """The config keys a saved encoder decides (d_model, n_layers, positions...): what model.init builds."""
    return tuple(f.name for f in fields(EncoderConfig) if f.name not in CLASSIFIER_KEYS + ("num_classes", "multi_label"))


@dataclass
class EncoderConfig:
    vocab_size: int
    num_classes: int
    d_model: int = 256
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 1024
    max_len: int = 256
    dropout: float = 0.1
    attention_dropout: float = 0.0
    positions: str = "sinusoidal"  # sinusoidal | learned | rotary (ModernBERT) | none (relative: in attention)
    norm: str = "post"  # post (as in the notebooks and the original paper) | pre
    activation: str = "relu"  # relu | gelu
    pooling: str = "cls"  # cls | mean
    head_hidden: int = 0  # 0: linear head; >0: Linear -> activation -> dropout -> Linear
    embedding_dim: int = 0  # width of the token table; 0 means d_model (no projection)
    pad_id: int = 0
    scale_embeddings: bool = True  # token vectors * sqrt(d_model) (Vaswani et al.); BERT-family: false
    embedding_norm: bool = False  # LayerNorm over token + position embeddings (BERT-family: true)
    norm_eps: float = 1e-5  # every LayerNorm's eps (BERT-family: 1e-12)
    multi_label: bool = False  # the logits are independent per label (sigmoid), not one distribution (softmax)
    # Where a token table narrower than d_model is projected: table (first, no bias) | after_norm (ELECTRA: token +
    # positions and the embedding LayerNorm stay embedding_dim wide, then a Linear with bias maps them to d_model)
    embedding_projection: str = "table"
    attention: str = "standard"  # the self-attention variant (ATTENTIONS): standard | disentangled (DeBERTa)
    relative_buckets: int = 256  # attention=disentangled: the relative table has 2x this many rows (DeBERTa)
    # attention=disentangled: distances past relative_buckets / 2 share rows on a log scale reaching this distance;
    # 0: each distance its own row, clamped at +-relative_buckets (DeBERTa's max_relative_positions)
    max_relative_positions: int = 512
    bias: bool = True  # the blocks' linear layers and every LayerNorm have biases (ModernBERT: false)
    feed_forward: str = "plain"  # plain: down(act(up x)) | gated: down(act(a) * g), [a, g] = up x (ModernBERT GeGLU)
    first_block_norm: bool = True  # pre-norm: block 0 normalises its input (ModernBERT: no, the embeddings are)
    rotary_theta: float = 10000.0  # positions=rotary: base of the rotation angles (ModernBERT's global layers: 160000)
    local_window: int = 0  # >0: all but every global_every-th layer see only keys within local_window // 2 (ModernBERT)
    global_every: int = 1  # layers 0, n, 2n, ... attend globally, the others locally (ModernBERT: 3)
    local_rotary_theta: float = 10000.0  # positions=rotary: the local layers' rotary base (ModernBERT: 10000)
    # Static models (n_layers=0) only: >0 adds a table of this many rows for pairs of adjacent tokens, hashed
    # (`pair_ids`); a text's vector is then the mean of its tokens' vectors plus the mean of its pairs' vectors
    pair_buckets: int = 0
    # Static models only: in training, each token (with its pairs) is left out of the text's mean with this
    # probability (word dropout, Iyyer et al. 2015): no answer can hang on one rare token of a training text
    token_dropout: float = 0.0

    # Upper bounds far past any real model, so a typo or a crafted model.json fails here, not as an allocation; what
    # fits this machine is estimated from the whole config (runs/config.py: memory_check).
    RANGES = {"vocab_size": (1, 1 << 24, "[]"), "num_classes": (2, 1 << 20, "[]"), "d_model": (1, 1 << 16, "[]"),
              "n_layers": (0, 1024, "[]"), "n_heads": (1, 1 << 16, "[]"), "d_ff": (1, 1 << 20, "[]"),
              "max_len": (2, 1 << 20, "[]"), "dropout": (0, 1, "[)"), "attention_dropout": (0, 1, "[)"),
              "head_hidden": (0, 1 << 20, "[]"), "embedding_dim": (0, 1 << 16, "[]"), "norm_eps": (0, 1, "(]"),
              "pad_id": (0, None, "[)"), "rotary_theta": (1, None, "(]"), "local_rotary_theta": (1, None, "(]"),
              "local_window": (0, 1 << 20, "[]"), "global_every": (1, 1024, "[]"),
              "relative_buckets": (2, 1 << 16, "[]"), "max_relative_positions": (0, 1 << 20, "[]"),
              "pair_buckets": (0, 1 << 26, "[]"), "token_dropout": (0, 1, "[)")}

    def __post_init__(self) -> None:
        check_ranges(type(self), asdict(self), "model")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ConfigError(f"model.pad_id={self.pad_id} must be a token id, 0..vocab_size-1 ({self.vocab_size - 1})")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}; "
                "pick n_heads that divides d_model (e.g. model.n_heads=4)"
            )
        for key, allowed in (("positions", ("sinusoidal", "learned", "rotary", "none")), ("norm", ("post", "pre")),
                             ("activation", tuple(ACTIVATIONS)), ("pooling", tuple(POOLINGS)),
                             ("attention", tuple(ATTENTIONS)), ("embedding_projection", ("table", "after_norm"))):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"model.{key}={getattr(self, key)!r} is not one of {', '.join(allowed)}")
        if self.feed_forward not in ("plain", "gated"):
            raise ConfigError(f"model.feed_forward={self.feed_forward!r} is not one of plain, gated")
        if self.positions == "rotary" and (self.d_model // self.n_heads) % 2:
            raise ConfigError(f"model.positions=rotary needs an even head width, not d_model/n_heads="
                              f"{self.d_model // self.n_heads}; pick n_heads so that d_model/n_heads is even")
        if not self.first_block_norm and self.norm != "pre":
            raise ConfigError("model.first_block_norm=false applies to pre-norm blocks only; set model.norm=pre or "
                              "model.first_block_norm=true")
        if self.attention != "standard" and (self.positions == "rotary" or self.local_window):
            raise ConfigError(f"model.attention={self.attention} has positions of its own: it takes neither "
                              f"model.positions=rotary nor model.local_window; use model.attention=standard")
        if not self.n_layers and self.pooling != "mean":
            raise ConfigError(f"model.n_layers=0 (a static model) needs model.pooling=mean: with "
                              f"pooling={self.pooling} and no layers every text would get the same answer")
        if self.token_dropout and self.n_layers:
            raise ConfigError(f"model.token_dropout={self.token_dropout} is for static models (model.n_layers=0); "
                              f"an encoder's dropout is model.dropout")
        if self.pair_buckets and self.n_layers:
            raise ConfigError(f"model.pair_buckets={self.pair_buckets} (hashed token pairs) is for static models "
                              f"(model.n_layers=0), not a {self.n_layers}-layer encoder, which sees word order "
                              f"already; set model.pair_buckets=0 or use model=static")
        if self.positions == "none" and self.attention == "standard" and self.n_layers:
            raise ConfigError("model.positions=none gives standard attention no position information; use sinusoidal, "
                              "learned or rotary (positions=none is for model.attention=disentangled, or a static "
                              "model: n_layers=0)")
        if self.attention == "disentangled" and self.max_relative_positions and \
                self.max_relative_positions <= self.relative_buckets // 2 + 1:
            raise ConfigError(f"model.max_relative_positions={self.max_relative_positions} must exceed "
                              f"model.relative_buckets/2+1 ({self.relative_buckets // 2 + 1}) for log buckets, or be 0")

    @classmethod
    def from_dict(cls, d: dict) -> "EncoderConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_dict(self) -> dict:
        return asdict(self)

    def is_local(self, layer: int) -> bool:
        """Whether block `layer` attends within `local_window` only (every global_every-th block attends to all)."""
        return self.local_window > 0 and layer % self.global_every != 0

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """The name and shape of every tensor in `TransformerClassifier(self).state_dict()`, by arithmetic: a saved
        model's weights header is compared with it, and a config's memory estimated, before anything is built (a
        test holds it to the real model's state_dict)."""
        D, F, E = self.d_model, self.d_ff, self.embedding_dim or self.d_model
        W = E if self.embedding_projection == "after_norm" else D  # the width of positions and the embedding norm
        out: dict[str, tuple[int, ...]] = {"token_embedding.weight": (self.vocab_size, E)}
        if E != D:
            out["embedding_projection.weight"] = (D, E)
            if W != D:
                out["embedding_projection.bias"] = (D,)
        if self.positions == "learned":
            out["position_embedding.weight"] = (self.max_len, W)
        norms = ["embedding_norm"] if self.embedding_norm else []
        U = 2 * F if self.feed_forward == "gated" else F  # gated: the value and the gate halves
        for i in range(self.n_layers):
            b = f"blocks.{i}."
            for name, rows, cols in (("attn.qkv", 3 * D, D), ("attn.out", D, D), ("ff.up", U, D), ("ff.down", D, F)):
                out[f"{b}{name}.weight"], out[f"{b}{name}.bias"] = (rows, cols), (rows,)
            norms += [b + "norm1", b + "norm2"] if i or self.first_block_norm else [b + "norm2"]
        norms += ["final_norm"] if self.norm == "pre" else []
        if self.attention == "disentangled":  # DeBERTa's relative-position table and its norm, shared by all blocks
            out["relative_positions.table.weight"] = (2 * self.relative_buckets, D)
            norms.append("relative_positions.norm")
        for name in norms:
            out[f"{name}.weight"], out[f"{name}.bias"] = (D,), (D,)
        if W != D:  # (ELECTRA's embedding norm works at the table's width)
            out |= {k: (W,) for k in ("embedding_norm.weight", "embedding_norm.bias") if k in out}
        if not self.bias:  # none in the blocks and LayerNorms (the head and embedding projection keep theirs)
            out = {k: v for k, v in out.items()
                   if not (k.endswith(".bias") and k.startswith(("blocks.", "embedding_norm.", "final_norm.")))}
        if self.pair_buckets:
            out["pair_embedding.weight"] = (self.pair_buckets, D)
        layers = ((("head.0", self.head_hidden, D), ("head.3", self.num_classes, self.head_hidden)) if self.head_hidden
                  else (("head", self.num_classes, D),))
        for name, rows, cols in layers:
            out[f"{name}.weight"], out[f"{name}.bias"] = (rows, cols), (rows,)
        return out

    def num_parameters(self) -> int:
        """`TransformerClassifier(self).num_parameters()` without building it."""
        return sum(math.prod(shape) for shape in self.state_shapes().values())


# Poolings: (hidden states (B, T, D), mask (B, T) bool, True at real tokens) -> (B, D). `explain` pools the
# attention matrix (B, T, T) with the same function, so a new pooling is explained by what it really does.
POOLINGS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {}
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,  # exact (erf), as BERT's "gelu"
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # BERT-family "gelu_new" / "gelu_pytorch_tanh"
}

pooling = registrar(POOLINGS)


@pooling("cls")
def cls_pool(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return h[:, 0]  # the first token ([CLS]) summarises the sequence


@pooling("mean")
def mean_pool(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(h.dtype)  # (B, T, 1)
    return (h * m).sum(1) / m.sum(1).clamp(min=1.0)  # mean over real tokens only


PAIR_PRIME = 1_000_003  # any prime well above the vocabulary sizes in use spreads the pairs over the buckets


def pair_ids(input_ids: torch.Tensor, buckets: int) -> torch.Tensor:
    """(B, T) token ids -> (B, T-1) bucket of each adjacent pair, (a * p + b) mod buckets: integer arithmetic
    that torch, ONNX and int8 exports compute alike, so a pair lands in the same row everywhere."""
    return (input_ids[:, :-1] * PAIR_PRIME + input_ids[:, 1:]) % buckets


def sinusoidal_table(max_len: int, d_model: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(p / 10000^(2i/D)); shape (max_len, D)."""
    position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)  # (T, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))  # (D/2,)
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])
    return table


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig, layer: int = 0):
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)  # one matmul for Q, K and V
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.attention_dropout = Dropout(cfg.attention_dropout)  # on the attention probabilities (BERT's)
        self.local = cfg.is_local(layer)  # attends within cfg.local_window only

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, rows: RealTokens | None = None,
                context=None) -> torch.Tensor:
        """x (B, T, D), or (N, D) holding only `rows` of the batch -> the same shape."""
        qkv = self.qkv(x)  # (B, T, 3D) or (N, 3D)
        if rows is not None:
            qkv = rows.scatter(qkv)  # (B, T, 3D)
        B, T, _ = qkv.shape
        D = self.n_heads * self.d_head
        q, k, v = qkv.view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, Dh)
        q, k, attn_mask = self.positioned(q, k, attn_mask, context)
        on_cpu = x.device.type == "cpu"
        if self.training and on_cpu and self.attention_dropout.threshold > 0:
            y = self.dropped_attention(q, k, v, attn_mask)
        else:  # softmax(Q K^T / sqrt(Dh) + mask) V; attn_mask (B, 1, 1 or T, T) bool, True = may attend.
            p = self.attention_dropout.p if self.training and not on_cpu else 0.0  # CPU: p < 1/512 is none
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)  # (B, H, T, Dh)
        y = y.transpose(1, 2).reshape(B, T, D)
        return self.out(rows.gather(y) if rows is not None else y)

    def positioned(self, q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None,
                   context) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Rotary positions applied to q and k (B, H, T, Dh) and, in a local layer, its window ANDed into the
        padding mask: (B, 1, 1, T) -> (B, 1, T, T). Nothing to do for absolute positions (`embed` added them)."""
        if not isinstance(context, rotary.Context):
            return q, k, attn_mask
        tables = context.tables.get(self.local)
        if tables is not None:
            q, k = rotary.rotate(q, *tables), rotary.rotate(k, *tables)
        if self.local:
            # (| eye: a padding query whose window holds only padding still sees itself, so no row of the local
            # mask is empty: some GPU kernels return NaN for an empty row, and a NaN value poisons its neighbours)
            attn_mask = context.band[None, None] if attn_mask is None else (attn_mask & context.band) | context.eye
        return q, k, attn_mask

    def probabilities(self, q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """softmax(Q K^T / sqrt(Dh) + mask): q, k (B, H, T, Dh), attn_mask (B or 1, 1, 1 or T, T) -> (B * H, T, T).
        The mask is an additive bias (the dtype's lowest value at padding) added inside the score matmul
        (beta = 1); masked keys get exactly 0."""
        B, H, T, Dh = q.shape
        q, k = q.reshape(B * H, T, Dh), k.reshape(B * H, T, Dh)
        if attn_mask is None:
            return (torch.bmm(q, k.transpose(1, 2)) * Dh ** -0.5).softmax(dim=-1)
        attn_mask = attn_mask.expand(B, -1, -1, -1)  # (B, 1, 1 or T, T)
        bias = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~attn_mask,
                                                                                          torch.finfo(q.dtype).min)
        scores = torch.baddbmm(bias.repeat_interleave(H, dim=0).view(B * H, -1, T), q, k.transpose(1, 2),
                               alpha=Dh ** -0.5)
        return scores.softmax(dim=-1)

    def dropped_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          attn_mask: torch.Tensor | None) -> torch.Tensor:
        """Drop(softmax(Q K^T / sqrt(Dh) + mask)) V, written out for CPU training. SDPA's CPU flash kernel has no
        dropout, so with attention dropout it falls back to its math path, which draws the (B, H, T, T) mask with
        `bernoulli_` and screens fully masked rows: ~30% of a MiniLM step at 256 tokens. Here the mask is random
        bytes (`keep_mask`), 1/(1-p) is applied to the (B, H, T, Dh) output rather than the (B, H, T, T)
        probabilities, and no row is fully masked (the bias keeps them finite), so nothing needs screening. Under
        bf16 autocast it computes in fp32, as SDPA's math path does: bf16 scores had 1.3-1.7x its error."""
        B, H, T, Dh = q.shape
        dtype = q.dtype
        exact = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
        with torch.autocast("cpu", enabled=False):
            probs = self.probabilities(q.to(exact), k.to(exact), attn_mask)  # (B * H, T, T)
            dropped = torch.where(fast_paths.keep_mask(probs.shape, self.attention_dropout.threshold), probs, 0.0)
            y = (dropped @ v.to(exact).reshape(B * H, T, Dh)).mul_(self.attention_dropout.scale)
        return y.view(B, H, T, Dh).to(dtype)

    def attention_weights(self, x: torch.Tensor, attn_mask: torch.Tensor | None, context=None) -> torch.Tensor:
        """The explicit softmax(QK^T/sqrt(Dh)) matrix (B, H, T, T), for explanations and tests."""
        B, T, _ = x.shape
        q, k, _ = self.qkv(x).view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        q, k, attn_mask = self.positioned(q, k, attn_mask, context)
        return self.probabilities(q, k, attn_mask).view(B, self.n_heads, T, T)


# Self-attention variants by `EncoderConfig.attention`: a class built as cls(cfg, layer_index), called as
# attn(x, attn_mask, rows, context) where `context` is what `TransformerClassifier.position_context` made for this
# forward (None for plain attention). A variant whose math differs lives in its own file.
ATTENTIONS: dict[str, type] = {"standard": MultiHeadSelfAttention, "disentangled": DisentangledSelfAttention}


class FeedForward(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.gated = cfg.feed_forward == "gated"
        self.up = nn.Linear(cfg.d_model, 2 * cfg.d_ff if self.gated else cfg.d_ff, bias=cfg.bias)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.act = ACTIVATIONS[cfg.activation]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # No dropout inside: the paper drops only sub-layer outputs and embeddings, and on CPU a dropout mask
        # over the (B, T, F) activation costs about as much as the two matmuls around it.
        if self.gated:  # GLU (Shazeer 2020; ModernBERT's GeGLU): the second half of up(x) gates the first
            value, gate = self.up(x).chunk(2, dim=-1)  # 2 x (..., F)
            return self.down(self.act(value) * gate)
        return self.down(self.act(self.up(x)))  # (..., D) -> (..., F) -> (..., D), per token


class EncoderBlock(nn.Module):
    """post: x = LN(x + Drop(Attn(x))); x = LN(x + Drop(FF(x)))   (Vaswani et al., the notebooks)
    pre:  x = x + Drop(Attn(LN(x))); x = x + Drop(FF(LN(x)))      (stabler for deep stacks)"""

    def __init__(self, cfg: EncoderConfig, layer: int = 0):
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        self.attn = ATTENTIONS[cfg.attention](cfg, layer)
        self.ff = FeedForward(cfg)
        # ModernBERT's block 0 (first_block_norm=false) reads the embeddings as they are: they were just normalised.
        self.norm1 = (nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias) if layer or cfg.first_block_norm
                      else nn.Identity())
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, rows: RealTokens | None = None,
                context=None) -> torch.Tensor:
        """x (B, T, D), or (N, D) holding only `rows` of the batch: everything but attention works per token."""
        if self.pre_norm:
            x = x + self.dropout(self.attn(self.norm1(x), attn_mask, rows, context))
            return x + self.dropout(self.ff(self.norm2(x)))
        x = self.norm1(x + self.dropout(self.attn(x, attn_mask, rows, context)))
        return self.norm2(x + self.dropout(self.ff(x)))


class TransformerClassifier(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        emb_dim = cfg.embedding_dim or cfg.d_model
        self.token_embedding = nn.Embedding(cfg.vocab_size, emb_dim, padding_idx=cfg.pad_id)
        # Static models: hashed pairs of adjacent tokens ("not good", "n't recommend"), the word order a bag of
        # tokens misses, at d_model wide; zeros at first, so a new model starts as the bag of tokens it extends.
        self.pair_embedding = nn.Embedding(cfg.pair_buckets, cfg.d_model) if cfg.pair_buckets else None
        # A pretrained table narrower or wider than d_model is mapped by a learned linear projection
        # (initialised semi-orthogonal, so it keeps the per-dimension scale of the table): the table itself, or
        # (ELECTRA, embedding_projection=after_norm) the normalised sum of table and positions, with a bias.
        self.project_last = cfg.embedding_projection == "after_norm" and emb_dim != cfg.d_model
        W = self.embedding_width = emb_dim if self.project_last else cfg.d_model  # where positions and norm work
        self.embedding_projection = nn.Linear(emb_dim, cfg.d_model, bias=self.project_last) \
            if emb_dim != cfg.d_model else None
        if cfg.positions == "learned":
            self.position_embedding = nn.Embedding(cfg.max_len, W)
        elif cfg.positions == "sinusoidal":
            self.register_buffer("position_table", sinusoidal_table(cfg.max_len, W), persistent=False)
        self.embedding_norm = nn.LayerNorm(W, eps=cfg.norm_eps, bias=cfg.bias) if cfg.embedding_norm else None
        self.embedding_dropout = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(EncoderBlock(cfg, i) for i in range(cfg.n_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias) if cfg.norm == "pre" else None
        # DeBERTa's relative-position embeddings, one table for every block's disentangled attention
        self.relative_positions = RelativePositionTable(cfg) if cfg.attention == "disentangled" else None
        if cfg.head_hidden:
            act = ACTIVATIONS[cfg.activation]()
            self.head = nn.Sequential(nn.Linear(cfg.d_model, cfg.head_hidden), act, nn.Dropout(cfg.dropout),
                                      nn.Linear(cfg.head_hidden, cfg.num_classes))
        else:
            self.head = nn.Linear(cfg.d_model, cfg.num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        # N(0, 1/D): after the sqrt(D) scale, token vectors have unit per-dimension variance, like the positions.
        nn.init.normal_(self.token_embedding.weight, std=self.cfg.d_model ** -0.5)
        with torch.no_grad():
            self.token_embedding.weight[self.cfg.pad_id].zero_()
        if self.embedding_projection is not None:
            nn.init.orthogonal_(self.embedding_projection.weight)
        if self.pair_embedding is not None:
            nn.init.zeros_(self.pair_embedding.weight)
        if self.cfg.positions == "learned":
            nn.init.normal_(self.position_embedding.weight, std=0.02)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        T = input_ids.shape[1]
        if T > self.cfg.max_len:
            raise ConfigError(f"sequence of {T} tokens exceeds model.max_len={self.cfg.max_len}")
        x = self.token_embedding(input_ids)  # (B, T, E)
        if self.embedding_projection is not None and not self.project_last:
            x = self.embedding_projection(x)  # (B, T, D)
        if self.cfg.scale_embeddings:
            x = x * math.sqrt(self.embedding_width)
        if self.cfg.positions == "learned":
            x = x + self.position_embedding.weight[:T]
        elif self.cfg.positions == "sinusoidal":
            x = x + self.position_table[:T].to(x.dtype)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        if self.project_last:  # (ELECTRA drops out before this projection, we after it: the same in evaluation)
            x = self.embedding_projection(x)  # (B, T, E) -> (B, T, D)
        return x  # (B, T, D); `encode` applies the embedding dropout

    def position_context(self, T: int):
        """What the attention layers need of positions beyond the embeddings, made once per forward for all layers
        (None for absolute positions, which `embed` adds). Rotary positions and local windows: a `rotary.Context`
        with the cos/sin tables of each kind of layer (global, local) and the local window's (T, T) band."""
        cfg = self.cfg
        if self.relative_positions is not None:  # DeBERTa: the normed table and each distance's row
            return self.relative_positions(T)
        if cfg.positions == "rotary" or cfg.local_window:
            device = self.token_embedding.weight.device
            kinds = {cfg.is_local(i) for i in range(cfg.n_layers)}  # False: global layers, True: local ones
            theta = {False: cfg.rotary_theta, True: cfg.local_rotary_theta}
            tables = ({local: rotary.tables(T, cfg.d_model // cfg.n_heads, theta[local], device) for local in kinds}
                      if cfg.positions == "rotary" else {})
            return rotary.Context(tables, rotary.band(T, cfg.local_window, device) if True in kinds else None)
        return None

    def layers(self) -> list[list[nn.Module]]:
        """The model bottom to top: [embeddings], block 0, ..., block N-1, [final norm, head]. Layer-wise learning
        rates and freezing the lower layers walk this list."""
        bottom = [self.token_embedding, self.pair_embedding, self.embedding_projection,
                  getattr(self, "position_embedding", None), self.embedding_norm, self.relative_positions]
        top = [self.final_norm, self.head]
        return [[m for m in bottom if m is not None], *([b] for b in self.blocks), [m for m in top if m is not None]]

    def pool(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T, X) -> (B, X) by the configured pooling (X = D for hidden states, T for attention rows)."""
        return POOLINGS[self.cfg.pooling](h, mask)

    def encode(self, input_ids: torch.Tensor, mask: torch.Tensor, layout: Layout | None = None,
               with_qkv: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """input_ids (B, T), mask (B, T) bool with True at real tokens -> final hidden states (B, T, D). `layout`
        (fast_paths.Layout) is how the batch runs, decided on the host by the loops that send batches to a GPU;
        without one it is decided here from the mask, for CPU tensors only. with_qkv: (hidden states, the last
        block's queries, keys and values (B, T, 3D) before any position term), which attention distillation
        compares; one more projection of the last block's input, so the blocks themselves stay as they are."""
        layout = layout if layout is not None else Layout.of(mask)
        attn_mask = mask[:, None, None, :] if layout.padded else None  # (B, 1, 1, T); None: SDPA's fastest kernel
        rows = layout.rows
        x = self.embed(input_ids)
        x = self.embedding_dropout(rows.gather(x) if rows is not None else x)  # (N, D) or (B, T, D)
        context = self.position_context(input_ids.shape[1])
        qkv = None
        for i, block in enumerate(self.blocks):
            if with_qkv and i == len(self.blocks) - 1:
                qkv = block.attn.qkv(block.norm1(x) if block.pre_norm else x)  # what the block's attention reads
                qkv = rows.scatter(qkv) if rows is not None else qkv
            x = block(x, attn_mask, rows, context)
        if self.final_norm is not None:
            x = self.final_norm(x)
        hidden = rows.scatter(x) if rows is not None else x
        if with_qkv and qkv is None:
            raise ConfigError("a static model (model.n_layers=0) has no attention to compare")
        return (hidden, qkv) if with_qkv else hidden

    def features(self, input_ids: torch.Tensor, mask: torch.Tensor, layout: Layout | None = None,
                 with_qkv: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """input_ids (B, T), mask (B, T) bool -> the pooled vector (B, D) the head reads: the pooled hidden states,
        plus the mean of the hashed token pairs' vectors in a static model with `pair_buckets`; with_qkv: and the
        last block's queries, keys and values (`encode`)."""
        if with_qkv:
            hidden, qkv = self.encode(input_ids, mask, layout, with_qkv=True)
            return self.pool(hidden, mask), qkv  # (a model with blocks: no static-only terms below)
        hidden = self.encode(input_ids, mask, layout)
        if self.training and self.cfg.token_dropout:
            kept = mask & (torch.rand(mask.shape, device=mask.device) >= self.cfg.token_dropout)
            mask = torch.where(kept.any(1, keepdim=True), kept, mask)  # a text left with no token keeps them all
        pooled = self.pool(hidden, mask)
        if self.pair_embedding is None:
            return pooled
        pairs = self.embedding_dropout(self.pair_embedding(pair_ids(input_ids, self.cfg.pair_buckets)))  # (B, T-1, D)
        if self.cfg.scale_embeddings:  # as the token vectors are (`embed`): a step moves both alike
            pairs = pairs * math.sqrt(self.cfg.d_model)
        return pooled + mean_pool(pairs, mask[:, 1:] & mask[:, :-1])  # a pair counts where both tokens are kept

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                layout: Layout | None = None, with_features: bool = False,
                with_qkv: bool = False) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """input_ids (B, T) long, attention_mask (B, T) bool/int with 1 at real tokens -> logits (B, C); with
        `with_features`, (logits, the pooled vectors (B, D) the head read); with `with_qkv`, (logits, pooled
        vectors, the last block's queries, keys and values (B, T, 3D)). A distillation student matches its
        teacher's through this call, so that DDP and torch.compile see one forward."""
        if attention_mask is None:
            attention_mask = input_ids.ne(self.cfg.pad_id)
        if with_qkv:
            features, qkv = self.features(input_ids, attention_mask.bool(), layout, with_qkv=True)
            return self.head(features), features, qkv
        features = self.features(input_ids, attention_mask.bool(), layout)
        return (self.head(features), features) if with_features else self.head(features)

    @torch.no_grad()
    def explain(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Token weights (B, T), each row summing to 1 over real tokens (padding gets 0):

        last     attention from the pooled position in the last layer, averaged over heads;
        rollout  attention rollout (Abnar & Zuidema 2020): per layer A = 0.5 * mean-head attention + 0.5 * I
                 (the residual path), rows renormalised, multiplied through the layers; the pooled row.
        The pooled row is what `pool` makes of the attention matrix's rows: the [CLS] row for cls pooling, the
        average over real tokens' rows for mean pooling."""
        mask = attention_mask.bool()
        attn_mask = mask[:, None, None, :]  # (B, 1, 1, T)
        B, T = input_ids.shape
        eye = torch.eye(T, device=input_ids.device)
        x = self.embed(input_ids)
        context = self.position_context(T)
        rollout = eye.expand(B, T, T)
        for block in self.blocks:
            attn = block.attn.attention_weights(block.norm1(x) if block.pre_norm else x, attn_mask, context).mean(1)
            mixed = 0.5 * attn + 0.5 * eye * mask[:, None, :]  # attn: (B, T, T)
            rollout = (mixed / mixed.sum(-1, keepdim=True)) @ rollout
            x = block(x, attn_mask, None, context)
        return {"last": self.pool(attn, mask), "rollout": self.pool(rollout, mask)}

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
