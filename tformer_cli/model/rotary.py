"""Rotary positions (Su et al. 2021, RoFormer) and local attention windows, as ModernBERT uses them.

Rotary positions add nothing to the embeddings: each layer rotates its queries and keys, pair of dimensions
(i, i + Dh/2) by the angle p * theta^(-2i/Dh) at position p, so Q K^T sees only the difference of two positions.
`positions=rotary` makes `TransformerClassifier.position_context` build the cos/sin tables once per forward for
each kind of layer (global and local layers may have their own theta); the attention applies them to q and k.

A local layer (`local_window` > 0, every layer but each `global_every`-th) lets a token attend only to the tokens
within local_window // 2 positions on either side: a (T, T) band, ANDed into the padding mask.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def tables(T: int, d_head: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotation angles, each (T, Dh) in fp32; both halves of Dh repeat the Dh/2 angles."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, d_head, 2, dtype=torch.float32, device=device) / d_head))  # (Dh/2,)
    angles = torch.arange(T, dtype=torch.float32, device=device)[:, None] * inv_freq  # (T, Dh/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, Dh)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, Dh) rotated by the (T, Dh) tables: x * cos + rotate_half(x) * sin, computed in fp32 (angles of
    thousands of radians lose their phase in bf16) and returned in x's dtype."""
    x32 = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)  # rotate_half: (x1, x2) -> (-x2, x1)
    return (x32 * cos + rotated * sin).to(x.dtype)


def band(T: int, window: int, device: torch.device) -> torch.Tensor:
    """(T, T) bool, True where |query - key| <= window // 2: what a local layer may attend to."""
    p = torch.arange(T, device=device)
    return (p[:, None] - p[None, :]).abs() <= window // 2


@dataclass
class Context:
    """What `TransformerClassifier.position_context` makes once per forward for rotary positions or local layers."""

    tables: dict[bool, tuple[torch.Tensor, torch.Tensor]]  # by "is a local layer": cos, sin (T, Dh); {} if none
    band: torch.Tensor | None  # (T, T) bool, the local layers' window; None without local layers

    @property
    def eye(self) -> torch.Tensor:
        """(T, T) bool, True on the diagonal: each query may always attend to itself."""
        p = torch.arange(self.band.shape[0], device=self.band.device)
        return p[:, None] == p[None, :]  # (not torch.eye: ONNX Runtime has no bool EyeLike)
