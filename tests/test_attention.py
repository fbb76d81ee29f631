"""Attention math: SDPA-based attention equals the textbook softmax(QK^T / sqrt(d_k)) V with an explicit mask."""
import math

import torch
import torch.nn.functional as F

from tformer_cli.model.encoder import EncoderConfig, MultiHeadSelfAttention


def textbook_attention(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def test_sdpa_matches_textbook_with_padding_mask():
    torch.manual_seed(0)
    B, H, T, Dh = 3, 4, 7, 16
    q, k, v = (torch.randn(B, H, T, Dh, dtype=torch.float64) for _ in range(3))
    lengths = torch.tensor([7, 4, 1])
    mask = (torch.arange(T)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, T)
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(got, textbook_attention(q, k, v, mask), rtol=1e-10, atol=1e-10)


def test_module_equals_explicit_computation():
    torch.manual_seed(1)
    cfg = EncoderConfig(vocab_size=10, num_classes=2, d_model=32, n_heads=4, d_ff=64)
    attn = MultiHeadSelfAttention(cfg).double().eval()
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)[:, None, None, :]
    weights = attn.attention_weights(x, mask)  # (B, H, T, T) explicit softmax
    q, k, v = attn.qkv(x).view(2, 6, 3, 4, 8).permute(2, 0, 3, 1, 4)
    expected = attn.out((weights @ v).transpose(1, 2).reshape(2, 6, 32))
    torch.testing.assert_close(attn(x, mask), expected, rtol=1e-10, atol=1e-10)
    # masked keys get exactly zero weight and every row is a distribution
    assert torch.all(weights[1, :, :, 3:] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 6, dtype=torch.float64))


def test_d_model_not_divisible_by_heads_is_a_clear_error():
    import pytest

    from tformer_cli.errors import TformerError

    with pytest.raises(TformerError, match="not divisible by model.n_heads"):
        EncoderConfig(vocab_size=10, num_classes=2, d_model=30, n_heads=4)
