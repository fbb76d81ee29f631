"""The Transformer encoder classifier, written out so the math is visible.

Shapes: B = batch, T = tokens, D = d_model, H = heads, Dh = D / H, F = d_ff, C = classes.

    ids (B, T) -> token embedding (B, T, E) -> [projection E -> D] -> [* sqrt(D)] + positions (B, T, D)
      -> [LayerNorm] -> N x EncoderBlock -> pooling (B, D) -> head -> logits (B, C)

The bracketed steps are knobs: the from-scratch models scale by sqrt(D) (Vaswani et al.) and have no embedding
LayerNorm; BERT-family encoders loaded whole (model/pretrained.py) have learned positions, an embedding
LayerNorm, no scale, exact GELU and LayerNorm eps 1e-12, and so run here with the very same math as in
`transformers` (a parity test checks the hidden states).

A padding mask (B, T) with True at real tokens keeps padding out of attention and out of mean pooling,
so a text's logits do not depend on how much padding its batch needed. On CPU, batches with much padding run
"unpadded" between attentions (`RealTokens`): the linear layers see only the N real tokens, (N, D).
"""
from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, fields
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..registry import registrar
from ..typed_config import check_ranges


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
    positions: str = "sinusoidal"  # sinusoidal | learned
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

    # Upper bounds far past any real model, so a typo or a crafted model.json fails here, not as an allocation; what
    # fits this machine is estimated from the whole config (runs/config.py: memory_check).
    RANGES = {"vocab_size": (1, 1 << 24, "[]"), "num_classes": (2, 1 << 20, "[]"), "d_model": (1, 1 << 16, "[]"),
              "n_layers": (0, 1024, "[]"), "n_heads": (1, 1 << 16, "[]"), "d_ff": (1, 1 << 20, "[]"),
              "max_len": (2, 1 << 20, "[]"), "dropout": (0, 1, "[)"), "attention_dropout": (0, 1, "[)"),
              "head_hidden": (0, 1 << 20, "[]"), "embedding_dim": (0, 1 << 16, "[]"), "norm_eps": (0, 1, "(]"),
              "pad_id": (0, None, "[)")}

    def __post_init__(self) -> None:
        check_ranges(type(self), asdict(self), "model")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ConfigError(f"model.pad_id={self.pad_id} must be a token id, 0..vocab_size-1 ({self.vocab_size - 1})")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}; "
                "pick n_heads that divides d_model (e.g. model.n_heads=4)"
            )
        for key, allowed in (("positions", ("sinusoidal", "learned")), ("norm", ("post", "pre")),
                             ("activation", tuple(ACTIVATIONS)), ("pooling", tuple(POOLINGS))):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"model.{key}={getattr(self, key)!r} is not one of {', '.join(allowed)}")

    @classmethod
    def from_dict(cls, d: dict) -> "EncoderConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_dict(self) -> dict:
        return asdict(self)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """The name and shape of every tensor in `TransformerClassifier(self).state_dict()`, by arithmetic: a saved
        model's weights header is compared with it, and a config's memory estimated, before anything is built (a
        test holds it to the real model's state_dict)."""
        D, F, E = self.d_model, self.d_ff, self.embedding_dim or self.d_model
        out: dict[str, tuple[int, ...]] = {"token_embedding.weight": (self.vocab_size, E)}
        if E != D:
            out["embedding_projection.weight"] = (D, E)
        if self.positions == "learned":
            out["position_embedding.weight"] = (self.max_len, D)
        norms = ["embedding_norm"] if self.embedding_norm else []
        for i in range(self.n_layers):
            b = f"blocks.{i}."
            for name, rows, cols in (("attn.qkv", 3 * D, D), ("attn.out", D, D), ("ff.up", F, D), ("ff.down", D, F)):
                out[f"{b}{name}.weight"], out[f"{b}{name}.bias"] = (rows, cols), (rows,)
            norms += [b + "norm1", b + "norm2"]
        norms += ["final_norm"] if self.norm == "pre" else []
        for name in norms:
            out[f"{name}.weight"], out[f"{name}.bias"] = (D,), (D,)
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


def sinusoidal_table(max_len: int, d_model: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(p / 10000^(2i/D)); shape (max_len, D)."""
    position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)  # (T, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))  # (D/2,)
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])
    return table


def keep_mask(shape: torch.Size | tuple[int, ...], threshold: int) -> torch.Tensor:
    """A CPU dropout keep-mask: True where a random byte is >= threshold, so P(drop) = threshold / 256.

    Torch's CPU generators are serial, one call per element: `bernoulli_` costs as much as a matmul over the same
    tensor, and even `random_` on bytes is slow. One 64-bit draw gives 7 uniform bytes (its top byte holds only 7
    random bits: torch keeps int64 draws in [0, 2^63]), so the mask needs one draw per 7 elements: about 2x faster
    than `random_` on bytes, 7x faster than `bernoulli_` (measured), and reproducible under torch.manual_seed."""
    n = math.prod(shape)
    words = torch.empty(n // 7 + 1, dtype=torch.int64).random_()
    lanes = slice(0, 7) if sys.byteorder == "little" else slice(1, 8)  # every byte but the draw's top one
    random_bytes = words.view(torch.uint8).view(-1, 8)[:, lanes].reshape(-1)[:n]
    return (random_bytes >= threshold).view(shape)


class Dropout(nn.Module):
    """Inverted dropout. On CPU the keep-mask is drawn as random bytes (`keep_mask`), p thus rounded to 1/256;
    elsewhere it is `F.dropout`."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p
        self.threshold = min(round(p * 256), 255)  # on CPU; p > 255/256 is taken as 255/256
        self.scale = 256 / (256 - self.threshold)  # 1 / (1 - p): expectations unchanged

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        if self.threshold == 0:  # p < 1/512 rounds to no dropout
            return x
        return torch.where(keep_mask(x.shape, self.threshold), x, 0.0) * self.scale


class RealTokens:
    """The real tokens of a padded (B, T) batch, as rows of its B*T flattened positions.

    The linear layers, LayerNorms, dropout and feed-forward cost as much per padding position as per real token,
    and a batch of short texts of mixed lengths is often a third to half padding. Between attentions the encoder
    can carry only these rows, (N, D) instead of (B, T, D); attention, which needs the (B, T) layout, scatters them
    back (padding as zero vectors, masked out as keys) and gathers its output again. Every real token sees the
    same keys as in the padded layout, so its outputs are the same. N is rounded up to a multiple of 16 with
    padding positions (computed as the padded layout would compute them), so the matmuls see few distinct shapes;
    a row that is all padding (never in training data) is kept whole, so it too gets the padded layout's logits.
    """

    MIN_PADDING = 0.15  # below this share of padding positions the gathers cost about what they save (measured)

    def __init__(self, mask: torch.Tensor, multiple: int = 16):
        B, T = mask.shape
        keep = (mask.bool() | ~mask.bool().any(dim=1, keepdim=True)).reshape(-1)
        real = keep.nonzero().squeeze(1)
        extra = min(-real.numel() % multiple, B * T - real.numel())
        self.index = torch.cat([real, (~keep).nonzero().squeeze(1)[:extra]]) if extra else real  # (N,)
        self.shape = (B, T)

    @classmethod
    def of(cls, mask: torch.Tensor) -> "RealTokens | None":
        """Rows for a CPU batch with enough padding; None for the padded layout (no padding to speak of; GPUs, where
        reading the mask would stall the pipeline; ONNX tracing and torch.compile, which need static shapes)."""
        if mask.device.type != "cpu" or torch.jit.is_tracing() or torch.compiler.is_compiling():
            return None
        return cls(mask) if 1 - mask.float().mean().item() >= cls.MIN_PADDING else None

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, X) -> (N, X)."""
        return x.reshape(-1, x.shape[-1]).index_select(0, self.index)

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        """(N, X) -> (B, T, X), zeros at the positions not in the rows."""
        B, T = self.shape
        return x.new_zeros(B * T, x.shape[-1]).index_copy(0, self.index, x).view(B, T, -1)


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)  # one matmul for Q, K and V
        self.out = nn.Linear(cfg.d_model, cfg.d_model)
        self.attention_dropout = Dropout(cfg.attention_dropout)  # on the attention probabilities (BERT's)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, rows: RealTokens | None = None) -> torch.Tensor:
        """x (B, T, D), or (N, D) holding only `rows` of the batch -> the same shape."""
        qkv = self.qkv(x)  # (B, T, 3D) or (N, 3D)
        if rows is not None:
            qkv = rows.scatter(qkv)  # (B, T, 3D)
        B, T, _ = qkv.shape
        D = self.n_heads * self.d_head
        q, k, v = qkv.view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, Dh)
        on_cpu = x.device.type == "cpu"
        if self.training and on_cpu and self.attention_dropout.threshold > 0:
            y = self.dropped_attention(q, k, v, attn_mask)
        else:  # softmax(Q K^T / sqrt(Dh) + mask) V; attn_mask (B, 1, 1, T) bool, True = may attend.
            p = self.attention_dropout.p if self.training and not on_cpu else 0.0  # CPU: p < 1/512 is none
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)  # (B, H, T, Dh)
        y = y.transpose(1, 2).reshape(B, T, D)
        return self.out(rows.gather(y) if rows is not None else y)

    def probabilities(self, q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """softmax(Q K^T / sqrt(Dh) + mask): q, k (B, H, T, Dh), attn_mask (B, 1, 1, T) -> (B * H, T, T). The mask
        is an additive bias (the dtype's lowest value at padding) added inside the score matmul (beta = 1);
        masked keys get exactly 0."""
        B, H, T, Dh = q.shape
        q, k = q.reshape(B * H, T, Dh), k.reshape(B * H, T, Dh)
        if attn_mask is None:
            return (torch.bmm(q, k.transpose(1, 2)) * Dh ** -0.5).softmax(dim=-1)
        bias = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~attn_mask,
                                                                                          torch.finfo(q.dtype).min)
        scores = torch.baddbmm(bias.repeat_interleave(H, dim=0).view(B * H, 1, T), q, k.transpose(1, 2),
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
            dropped = torch.where(keep_mask(probs.shape, self.attention_dropout.threshold), probs, 0.0)
            y = (dropped @ v.to(exact).reshape(B * H, T, Dh)).mul_(self.attention_dropout.scale)
        return y.view(B, H, T, Dh).to(dtype)

    def attention_weights(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """The explicit softmax(QK^T/sqrt(Dh)) matrix (B, H, T, T), for explanations and tests."""
        B, T, _ = x.shape
        q, k, _ = self.qkv(x).view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        return self.probabilities(q, k, attn_mask).view(B, self.n_heads, T, T)


class FeedForward(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.d_ff)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model)
        self.act = ACTIVATIONS[cfg.activation]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # No dropout inside: the paper drops only sub-layer outputs and embeddings, and on CPU a dropout mask
        # over the (B, T, F) activation costs about as much as the two matmuls around it.
        return self.down(self.act(self.up(x)))  # (..., D) -> (..., F) -> (..., D), per token


class EncoderBlock(nn.Module):
    """post: x = LN(x + Drop(Attn(x))); x = LN(x + Drop(FF(x)))   (Vaswani et al., the notebooks)
    pre:  x = x + Drop(Attn(LN(x))); x = x + Drop(FF(LN(x)))      (stabler for deep stacks)"""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        self.attn = MultiHeadSelfAttention(cfg)
        self.ff = FeedForward(cfg)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, rows: RealTokens | None = None) -> torch.Tensor:
        """x (B, T, D), or (N, D) holding only `rows` of the batch: everything but attention works per token."""
        if self.pre_norm:
            x = x + self.dropout(self.attn(self.norm1(x), attn_mask, rows))
            return x + self.dropout(self.ff(self.norm2(x)))
        x = self.norm1(x + self.dropout(self.attn(x, attn_mask, rows)))
        return self.norm2(x + self.dropout(self.ff(x)))


class TransformerClassifier(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        emb_dim = cfg.embedding_dim or cfg.d_model
        self.token_embedding = nn.Embedding(cfg.vocab_size, emb_dim, padding_idx=cfg.pad_id)
        # A pretrained table narrower or wider than d_model is mapped by a learned linear projection
        # (initialised semi-orthogonal, so it keeps the per-dimension scale of the table).
        self.embedding_projection = nn.Linear(emb_dim, cfg.d_model, bias=False) if emb_dim != cfg.d_model else None
        if cfg.positions == "learned":
            self.position_embedding = nn.Embedding(cfg.max_len, cfg.d_model)
        else:
            self.register_buffer("position_table", sinusoidal_table(cfg.max_len, cfg.d_model), persistent=False)
        self.embedding_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps) if cfg.embedding_norm else None
        self.embedding_dropout = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.n_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps) if cfg.norm == "pre" else None
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
        if self.cfg.positions == "learned":
            nn.init.normal_(self.position_embedding.weight, std=0.02)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        T = input_ids.shape[1]
        if T > self.cfg.max_len:
            raise ConfigError(f"sequence of {T} tokens exceeds model.max_len={self.cfg.max_len}")
        x = self.token_embedding(input_ids)  # (B, T, E)
        if self.embedding_projection is not None:
            x = self.embedding_projection(x)  # (B, T, D)
        if self.cfg.scale_embeddings:
            x = x * math.sqrt(self.cfg.d_model)
        if self.cfg.positions == "learned":
            x = x + self.position_embedding.weight[:T]
        else:
            x = x + self.position_table[:T].to(x.dtype)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        return x  # (B, T, D); `encode` applies the embedding dropout

    def layers(self) -> list[list[nn.Module]]:
        """The model bottom to top: [embeddings], block 0, ..., block N-1, [final norm, head]. Layer-wise learning
        rates and freezing the lower layers walk this list."""
        bottom = [self.token_embedding, self.embedding_projection, getattr(self, "position_embedding", None),
                  self.embedding_norm]
        top = [self.final_norm, self.head]
        return [[m for m in bottom if m is not None], *([b] for b in self.blocks), [m for m in top if m is not None]]

    def pool(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T, X) -> (B, X) by the configured pooling (X = D for hidden states, T for attention rows)."""
        return POOLINGS[self.cfg.pooling](h, mask)

    def encode(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """input_ids (B, T), mask (B, T) bool with True at real tokens -> final hidden states (B, T, D)."""
        # With no padding in the batch, passing no mask lets SDPA pick its fastest kernel. The check reads the
        # mask on the host, so it is only made for CPU tensors (on CUDA it would stall the pipeline every step),
        # and never while tracing for ONNX export, where the graph must keep the mask for every batch it will see.
        no_padding = not mask.is_cuda and not torch.jit.is_tracing() and bool(mask.all())
        attn_mask = None if no_padding else mask[:, None, None, :]  # (B, 1, 1, T)
        rows = None if no_padding else RealTokens.of(mask)
        x = self.embed(input_ids)
        x = self.embedding_dropout(rows.gather(x) if rows is not None else x)  # (N, D) or (B, T, D)
        for block in self.blocks:
            x = block(x, attn_mask, rows)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return rows.scatter(x) if rows is not None else x

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids (B, T) long, attention_mask (B, T) bool/int with 1 at real tokens -> logits (B, C)."""
        if attention_mask is None:
            attention_mask = input_ids.ne(self.cfg.pad_id)
        mask = attention_mask.bool()
        return self.head(self.pool(self.encode(input_ids, mask), mask))

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
        rollout = eye.expand(B, T, T)
        for block in self.blocks:
            attn = block.attn.attention_weights(block.norm1(x) if block.pre_norm else x, attn_mask).mean(1)  # (B,T,T)
            mixed = 0.5 * attn + 0.5 * eye * mask[:, None, :]
            rollout = (mixed / mixed.sum(-1, keepdim=True)) @ rollout
            x = block(x, attn_mask)
        return {"last": self.pool(attn, mask), "rollout": self.pool(rollout, mask)}

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
