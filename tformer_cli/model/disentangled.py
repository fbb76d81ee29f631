"""DeBERTa's disentangled self-attention (He et al. 2021), as transformers' DebertaV2Model computes it.

A token's content attends to another's content and to their relative position, in both directions:

    score(i, j) = (q_i . k_j  +  q_i . Kr[d(i, j)]  +  k_j . Qr[d(i, j)]) / sqrt(3 Dh)
                   content       content->position   position->content
    d(i, j) = bucket(i - j)       (a row of the relative table, 2S rows shared by every layer)
    Kr, Qr = the table through this layer's own key and query projections (DeBERTa-v2/v3's share_att_key)

Distances up to S/2 have a row each; longer ones share rows on a log scale up to `max_relative_positions`,
beyond which they are clamped (make_log_bucket_position in transformers).

transformers computes q_i . Kr for all 2S rows, (B*H, T, 2S), then gathers the (T, T) scores with a
(B*H, T, T) index (and its backward scatters). Here only the 2T+1 distances a T-token batch can have are projected,
and the (T, T) scores are read from the (T, 2T) products as a strided view (Transformer-XL's "relative shift"):
row i of the products lists the distances in order, so score(i, j) sits at a fixed offset from i * (2T - 1) + j.
No gather, no scatter, and for T < S only T/S of the reference's multiplications for the relative terms.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

from . import fast_paths
from .fast_paths import Dropout, RealTokens

if TYPE_CHECKING:  # (encoder.py imports this module: the config class is only named in annotations here)
    from .encoder import EncoderConfig


class RelativePositions(NamedTuple):
    """What every layer's disentangled attention takes from `TransformerClassifier.position_context(T)`."""

    table: torch.Tensor  # (2S, D): the relative-position embeddings, LayerNorm applied
    rows: torch.Tensor  # (2T + 1,) long: the table row of distance d = i - j, at index d + T (d = -T .. T)


def log_bucket(distance: torch.Tensor, buckets: int, max_distance: int) -> torch.Tensor:
    """Relative distances -> signed buckets: exact for |d| <= buckets / 2, then logarithmic, reaching
    +-(buckets - 1) at |d| = max_distance - 1 (transformers' make_log_bucket_position, the same float ops, so
    the same integers)."""
    sign = torch.sign(distance)
    mid = buckets // 2
    near = (distance < mid) & (distance > -mid)
    abs_pos = torch.where(near, torch.tensor(mid - 1).type_as(distance), distance.abs())
    log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_distance - 1) / mid)) * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, distance.type_as(log_pos), log_pos * sign).long()


class RelativePositionTable(nn.Module):
    """The relative-position embeddings shared by all layers (DeBERTa's encoder.rel_embeddings + LayerNorm), and
    the row of every distance a sequence of up to max_len tokens can have (a constant, so ONNX traces a slice)."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        S, L = cfg.relative_buckets, cfg.max_len
        self.table = nn.Embedding(2 * S, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        nn.init.normal_(self.table.weight, std=0.02)  # DeBERTa's initializer_range
        distance = torch.arange(-L, L + 1)  # i - j
        bucket = log_bucket(distance, S, cfg.max_relative_positions) if cfg.max_relative_positions else distance
        self.register_buffer("rows", (bucket + S).clamp(0, 2 * S - 1), persistent=False)  # (2L + 1,)
        self.max_len = L

    def forward(self, T: int) -> RelativePositions:
        L = self.max_len
        return RelativePositions(self.norm(self.table.weight), self.rows[L - T:L + T + 1])


def diagonals(m: torch.Tensor) -> torch.Tensor:
    """m (..., T, 2T) -> out (..., T, T), out[r, s] = m[r, s - r + T - 1]: each row's relative terms by column.

    m is contiguous, so m[r, s - r + T - 1] sits at flat offset r * (2T - 1) + s + T - 1: row r of `out` is the
    window of the flat tensor that starts at r * (2T - 1) + T - 1, and `out` a view (its backward a plain copy)."""
    *lead, T, W = m.shape  # W = 2T
    flat = m.reshape(*lead, T * W)
    return flat[..., T - 1:T - 1 + T * (W - 1)].view(*lead, T, W - 1)[..., :T]


class DisentangledSelfAttention(nn.Module):
    """DeBERTa-v2/v3 attention: content-content + content->position + position->content scores (module docstring);
    `context` is the shared `RelativePositions`. Weights: qkv (Q, K, V stacked, as MultiHeadSelfAttention's; the
    relative table goes through the same Q and K projections) and out."""

    def __init__(self, cfg: EncoderConfig, layer: int = 0):
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.attention_dropout = Dropout(cfg.attention_dropout)  # on the attention probabilities
        self.position_dropout = Dropout(cfg.dropout)  # on the relative table, each layer its own draw (DeBERTa's)
        self.scale = (3 * self.d_head) ** -0.5  # three score terms: 1 / sqrt(Dh * 3)

    def scores(self, qkv: torch.Tensor, attn_mask: torch.Tensor | None, context: RelativePositions):
        """qkv (B, T, 3D) -> scores (H, B, T, T) with padded keys at the dtype's lowest value, and v (H*B, T, Dh).

        Heads lead the batch so that the relative terms are one matmul per head over all B*T tokens."""
        B, T, _ = qkv.shape
        H, Dh, D = self.n_heads, self.d_head, self.n_heads * self.d_head
        q, k, v = qkv.view(B, T, 3, H, Dh).permute(2, 3, 0, 1, 4).reshape(3, H * B, T, Dh).unbind(0)  # (H*B, T, Dh)
        k = k * self.scale  # the scale folded into the keys (two of the three terms) ...
        rel = self.position_dropout(context.table)[context.rows]  # (2T + 1, D): distance -T .. T
        bias = self.qkv.bias[:2 * D] if self.qkv.bias is not None else None
        pos = nn.functional.linear(rel, self.qkv.weight[:2 * D], bias)  # (2T + 1, 2D): the positions' Q and K
        pos_q, pos_k = pos.view(2 * T + 1, 2, H, Dh).permute(1, 2, 3, 0).unbind(0)  # (H, Dh, 2T + 1)
        pos_k = pos_k[..., :2 * T].flip(-1) * self.scale  # ... and the position keys; column c: d = T - 1 - c
        pos_q = pos_q[..., 1:]  # column c: d = c - T + 1
        # content->position: c2p[i, c] = q_i . Kr[d], then score(i, j) at c = j - i + T - 1 (d = i - j)
        c2p = torch.bmm(q.view(H, B * T, Dh), pos_k).view(H * B, T, 2 * T)
        # position->content: p2c[j, c] = k_j . Qr[d], then score(i, j) at row j, c = i - j + T - 1 (d = i - j)
        p2c = torch.bmm(k.view(H, B * T, Dh), pos_q).view(H * B, T, 2 * T)
        s = torch.baddbmm(diagonals(c2p), q, k.transpose(1, 2))  # (H*B, T, T): content + content->position
        s = s.add_(diagonals(p2c).transpose(1, 2)).view(H, B, T, T)
        if attn_mask is not None:  # (B, 1, 1, T), True = may attend
            s = s.masked_fill_(~attn_mask.view(1, B, 1, T), torch.finfo(s.dtype).min)
        return s, v

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, rows: RealTokens | None = None,
                context: RelativePositions | None = None) -> torch.Tensor:
        """x (B, T, D), or (N, D) holding only `rows` of the batch -> the same shape."""
        qkv = self.qkv(x)  # (B, T, 3D) or (N, 3D)
        if rows is not None:
            qkv = rows.scatter(qkv)  # (B, T, 3D)
        B, T, _ = qkv.shape
        s, v = self.scores(qkv, attn_mask, context)
        probs = s.softmax(dim=-1).view(-1, T, T)  # (H*B, T, T)
        drop, rescale = self.attention_dropout, 1.0
        if self.training and probs.device.type == "cpu" and drop.threshold > 0:
            # byte keep-mask (fast_paths.keep_mask); 1/(1-p) goes on the (.., Dh) output, not the (.., T) probabilities
            probs, rescale = torch.where(fast_paths.keep_mask(probs.shape, drop.threshold), probs, 0.0), drop.scale
        else:
            probs = drop(probs)  # eval: identity; GPU: F.dropout
        y = torch.bmm(probs, v)  # (H*B, T, Dh)
        if rescale != 1.0:
            y = y.mul_(rescale)
        y = y.view(self.n_heads, B, T, self.d_head).permute(1, 2, 0, 3).reshape(B, T, -1)  # (B, T, D)
        return self.out(rows.gather(y) if rows is not None else y)

    def attention_weights(self, x: torch.Tensor, attn_mask: torch.Tensor | None,
                          context: RelativePositions | None = None) -> torch.Tensor:
        """The softmax matrix (B, H, T, T), for explanations and tests."""
        s, _ = self.scores(self.qkv(x), attn_mask, context)
        return s.softmax(dim=-1).transpose(0, 1)

