"""The fast paths every attention variant shares (model/encoder.py, model/disentangled.py): on a CPU, dropout drawn
as random bytes and batches carried on their real tokens only between attentions; on any device, full batches run
without a mask (`Layout`). All compute the plain math (tests/test_attention.py, tests/test_masking.py hold them to
it); the CPU ones exist because there the plain way costs as much as the matmuls around it."""
from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F
from torch import nn


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


class Layout:
    """How a batch runs through the encoder: with no padding at all (no mask, so scaled_dot_product_attention may
    pick its fastest kernel: flash attention on a GPU), on its real tokens between attentions (`RealTokens`, CPU
    only), or padded with a mask.

    Deciding needs the mask's values. Read from a mask on the GPU, they would stall the pipeline every step; the
    classification train step and the inference loop therefore decide on the host, from the batch's CPU mask
    before it is sent (`Layout.of(cpu_mask, device)`), and hand the layout to the model. Called with no device, on the mask the
    model got, it decides only for CPU tensors and leaves GPU batches padded.

    On a GPU a batch with padding stays padded: carried on its real tokens it trained 15 to 26% slower (32 texts
    of 40 to 100% of 128 or 512 tokens, MiniLM and BERT-base shapes, H200, bf16: the gathers and the matmuls' new
    shapes cost more than the padding rows they save), while leaving the mask out of full batches sped BERT-base
    steps up 1.07x (512 tokens) to 1.23x (128); docs/results-and-benchmarks.md has the table."""

    __slots__ = ("padded", "rows")

    def __init__(self, padded: bool, rows: RealTokens | None = None):
        self.padded, self.rows = padded, rows

    @classmethod
    def of(cls, mask: torch.Tensor, device: torch.device | None = None, unpad: bool = True) -> "Layout":
        """mask (B, T) bool on the CPU (or the model's own mask when device is None); unpad=False keeps a padded
        batch in the padded layout (torch.compile, whose graphs want few shapes)."""
        if mask.device.type != "cpu" or torch.jit.is_tracing():
            return cls(True)  # a GPU mask is not read; an ONNX graph keeps the mask for every batch it will see
        if bool(mask.all()):
            return cls(False)
        on_cpu = device is None or device.type == "cpu"
        return cls(True, RealTokens.of(mask) if unpad and on_cpu else None)
