"""Attention math: SDPA-based attention equals the textbook softmax(QK^T / sqrt(d_k)) V with an explicit mask."""
import math

import pytest
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


def _attention_and_input(mask_lengths):
    torch.manual_seed(2)
    cfg = EncoderConfig(vocab_size=10, num_classes=2, d_model=32, n_heads=4, d_ff=64, attention_dropout=0.1)
    attn = MultiHeadSelfAttention(cfg).double()
    x = torch.randn(len(mask_lengths), 9, 32, dtype=torch.float64)
    mask = (torch.arange(9)[None, :] < torch.tensor(mask_lengths)[:, None])[:, None, None, :]
    return attn, x, None if all(n == 9 for n in mask_lengths) else mask


def _output_and_grads(attn, x, mask):
    x = x.clone().requires_grad_()
    y = attn(x, mask)
    (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
    grads = [x.grad] + [p.grad.clone() for p in attn.parameters()]
    attn.zero_grad()
    return y.detach(), grads


@pytest.mark.parametrize("lengths", [[9, 9], [9, 5, 1]])
def test_cpu_training_attention_equals_sdpa_when_nothing_is_dropped(lengths):
    """CPU training with attention dropout runs its own attention (byte-mask dropout); with a keep-all mask it must
    be SDPA's attention exactly, forward and backward, padded or not."""
    attn, x, mask = _attention_and_input(lengths)
    expected, expected_grads = _output_and_grads(attn.eval(), x, mask)  # SDPA, no dropout
    attn.train()
    attn.attention_dropout.threshold, attn.attention_dropout.scale = 0, 1.0  # keep everything, path unchanged
    got, grads = _output_and_grads(attn, x, mask)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-10)


def test_attention_dropout_keeps_the_expectation():
    """Averaged over many dropout draws, training-mode attention converges to the deterministic one: the kept
    probabilities are rescaled by 1 / (1 - p), and padding stays out."""
    attn, x, mask = _attention_and_input([9, 4])
    attn.attention_dropout = type(attn.attention_dropout)(0.5)
    with torch.no_grad():
        expected = attn.eval()(x, mask)
        attn.train()
        mean = sum(attn(x, mask) for _ in range(3000)) / 3000
    torch.testing.assert_close(mean, expected, rtol=0, atol=0.03)
    assert not torch.allclose(attn(x, mask), expected)  # it does drop


def test_keep_mask_drops_threshold_over_256_in_every_byte_lane_and_is_seeded():
    from tformer_cli.model.encoder import keep_mask

    torch.manual_seed(3)
    keep = keep_mask((700, 1000), threshold=64)  # P(drop) = 64 / 256 = 0.25
    assert keep.dtype == torch.bool and keep.shape == (700, 1000)
    flat = keep.flatten()
    assert abs(1 - flat.float().mean().item() - 0.25) < 0.003
    for lane in range(7):  # each of the 7 bytes taken from one 64-bit draw is uniform
        assert abs(1 - flat[lane::7].float().mean().item() - 0.25) < 0.006
    torch.manual_seed(3)
    assert torch.equal(keep_mask((700, 1000), threshold=64), keep)
    assert keep_mask((5,), threshold=0).all()
