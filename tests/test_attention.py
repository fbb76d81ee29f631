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


def _attention_and_input(mask_lengths, attention_dropout=0.1):
    torch.manual_seed(2)
    cfg = EncoderConfig(vocab_size=10, num_classes=2, d_model=32, n_heads=4, d_ff=64,
                        attention_dropout=attention_dropout)
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


def _fixed_keep_mask(monkeypatch, keep_all=False):
    """keep_mask replaced by a seeded mask (or all True), remembered so the reference can apply the same."""
    import tformer_cli.model.fast_paths as fast_paths

    drawn = []

    def fixed(shape, threshold):
        g = torch.Generator().manual_seed(len(drawn))
        keep = torch.ones(shape, dtype=torch.bool) if keep_all else torch.rand(shape, generator=g) >= threshold / 256
        drawn.append(keep)
        return keep

    monkeypatch.setattr(fast_paths, "keep_mask", fixed)
    return drawn


@pytest.mark.parametrize("lengths", [[9, 9], [9, 5, 1]])
def test_cpu_training_attention_is_textbook_dropout_forward_and_backward(monkeypatch, lengths):
    """CPU training with attention dropout runs its own attention (byte-mask dropout, 1/(1-p) on the output); with
    the same keep-mask it must be (softmax(QK^T/sqrt(d) + mask) * keep / (1 - p)) V, forward and backward, padded
    or not (SDPA's attention is the textbook one: test above)."""
    attn, x, mask = _attention_and_input(lengths, attention_dropout=0.3)
    drawn = _fixed_keep_mask(monkeypatch)
    got, grads = _output_and_grads(attn.train(), x, mask)
    assert len(drawn) == 1 and not drawn[0].all()  # the explicit path ran and dropped something
    keep = drawn[0].view(len(lengths), 4, 9, 9)
    p = attn.attention_dropout.threshold / 256

    class Textbook(torch.nn.Module):  # the same weights (attn's own parameters), attention by the formula
        def __init__(self):
            super().__init__()
            self.attn = attn

        def forward(self, x, mask):
            B, T, _ = x.shape
            q, k, v = self.attn.qkv(x).view(B, T, 3, 4, 8).permute(2, 0, 3, 1, 4)
            scores = q @ k.transpose(-2, -1) / math.sqrt(8)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            y = (torch.softmax(scores, dim=-1) * keep / (1 - p)) @ v
            return self.attn.out(y.transpose(1, 2).reshape(B, T, 32))

    expected, expected_grads = _output_and_grads(Textbook(), x, mask)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-10)


def test_cpu_training_attention_under_bf16_autocast_is_as_accurate_as_sdpa(monkeypatch):
    """Under CPU bf16 autocast the written-out attention computes in fp32, as SDPA's math path does: its error
    against float64 must not exceed SDPA's. (Scores rounded to bf16 had 1.3x SDPA's error at this size: heads of
    32, 128 tokens, scores of a few units.)"""
    torch.manual_seed(2)
    attn = MultiHeadSelfAttention(EncoderConfig(vocab_size=10, num_classes=2, d_model=64, n_heads=2, d_ff=64,
                                                attention_dropout=0.1)).double()
    x = torch.randn(3, 128, 64, dtype=torch.float64) * 3
    mask = (torch.arange(128)[None, :] < torch.tensor([128, 85, 25])[:, None])[:, None, None, :]
    _fixed_keep_mask(monkeypatch, keep_all=True)
    with torch.no_grad():
        exact = attn.eval()(x, mask)  # float64 SDPA
        attn.float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours = attn.train()(x.float(), mask)
            sdpa = attn.eval()(x.float(), mask)
    assert ours.dtype == torch.bfloat16
    # keep-all: ours is the attention times 1/(1-p) before the output projection; undo that through `out`
    bias = attn.out.bias.double()
    ours_unscaled = (ours.double() - bias) / attn.attention_dropout.scale + bias
    real = mask.squeeze(1).squeeze(1)  # (B, T): outputs at padding positions are unused
    ours_error = (ours_unscaled - exact)[real].abs().mean()
    sdpa_error = (sdpa.double() - exact)[real].abs().mean()
    assert ours_error <= 1.1 * sdpa_error, (float(ours_error), float(sdpa_error))


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
    from tformer_cli.model.fast_paths import keep_mask

    torch.manual_seed(3)
    keep = keep_mask((700, 1000), threshold=26)  # P(drop) = 26 / 256, BERT's p = 0.1 as rounded on CPU
    assert keep.dtype == torch.bool and keep.shape == (700, 1000)
    flat = keep.flatten()
    assert abs(1 - flat.float().mean().item() - 26 / 256) < 0.002
    for lane in range(7):  # each of the 7 bytes taken from one 64-bit draw is uniform
        assert abs(1 - flat[lane::7].float().mean().item() - 26 / 256) < 0.004
    torch.manual_seed(3)
    assert torch.equal(keep_mask((700, 1000), threshold=26), keep)
    assert keep_mask((5,), threshold=0).all()


def test_dropout_probabilities_at_the_ends_of_the_range():
    from tformer_cli.model.fast_paths import Dropout

    nearly_all = Dropout(0.999).train()  # rounds to 256/256 on CPU: capped at 255/256, no division by zero
    assert nearly_all.threshold == 255
    kept = nearly_all(torch.ones(100_000))
    assert 0 < int(kept.count_nonzero()) < 1000 and torch.all(kept[kept != 0] == 256)
    tiny = Dropout(0.001).train()  # rounds to 0/256: no dropout, and no explicit attention path either
    x = torch.randn(1000)
    assert tiny(x) is x
    attn, xs, mask = _attention_and_input([9, 4], attention_dropout=0.001)
    with torch.no_grad():
        torch.testing.assert_close(attn.train()(xs, mask), attn.eval()(xs, mask))
