"""Padding never changes a sequence's logits, whatever the pooling, norm placement or positions."""
import itertools

import pytest
import torch

from tformer_cli.data.batching import collate
from tformer_cli.data.tokenization import TokenizedSplit
from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier


@pytest.mark.parametrize("pooling,norm,positions", list(itertools.product(["cls", "mean"], ["post", "pre"],
                                                                          ["sinusoidal", "learned"])))
def test_padding_does_not_change_logits(pooling, norm, positions):
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=50, num_classes=3, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=40,
                        pooling=pooling, norm=norm, positions=positions)
    model = TransformerClassifier(cfg).eval()
    text = torch.tensor([2, 17, 9, 33, 8, 3])
    outputs = []
    for total in (6, 7, 15, 40):
        ids = torch.zeros(1, total, dtype=torch.long)
        ids[0, :6] = text
        mask = ids.ne(0)
        outputs.append(model(ids, mask))
    for out in outputs[1:]:
        torch.testing.assert_close(out, outputs[0], rtol=1e-5, atol=1e-5)
    # and the padding really is masked: without the mask the logits do change
    ids = torch.zeros(1, 40, dtype=torch.long)
    ids[0, :6] = text
    unmasked = model(ids, torch.ones_like(ids, dtype=torch.bool))
    assert not torch.allclose(unmasked, outputs[0], atol=1e-4)


def test_batch_of_mixed_lengths_equals_one_at_a_time():
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=50, num_classes=2, d_model=32, n_heads=4, d_ff=64, max_len=20, pooling="mean")
    model = TransformerClassifier(cfg).eval()
    seqs = [[2, 5, 6, 3], [2, 7, 8, 9, 10, 11, 3], [2, 3]]
    split = TokenizedSplit.from_ids(seqs)
    batch = collate(split, torch.arange(3), pad_id=0)
    assert batch["input_ids"].shape == (3, 7)
    assert batch["attention_mask"].sum(1).tolist() == [4, 7, 2]
    together = model(batch["input_ids"], batch["attention_mask"])
    for i, s in enumerate(seqs):
        alone = model(torch.tensor([s]))
        torch.testing.assert_close(together[i:i + 1], alone, rtol=1e-5, atol=1e-5)


def test_padding_rounds_up_but_never_past_the_longest_sequence():
    split = TokenizedSplit.from_ids([[2] * 5, [2] * 19, [2] * 30])
    assert collate(split, torch.tensor([0]), 0, multiple=16, cap=30)["input_ids"].shape[1] == 16
    assert collate(split, torch.tensor([0, 1]), 0, multiple=16, cap=30)["input_ids"].shape[1] == 30  # not 32
    assert collate(split, torch.tensor([2]), 0, multiple=16, cap=30)["input_ids"].shape[1] == 30


@pytest.mark.parametrize("pooling,norm,projection", [("mean", "post", True), ("cls", "pre", False)])
def test_unpadded_batches_train_exactly_as_padded_ones(monkeypatch, pooling, norm, projection):
    """On CPU a batch with much padding runs on its real tokens only between attentions (RealTokens): logits,
    loss and every gradient must be those of the padded layout, with every dropout (embeddings, sub-layers,
    attention probabilities: a fixed keep-all mask, so both runs draw the same) on its training path."""
    import tformer_cli.model.fast_paths as fast_paths
    from tformer_cli.model.encoder import RealTokens

    monkeypatch.setattr(fast_paths, "keep_mask", lambda shape, threshold: torch.ones(shape, dtype=torch.bool))
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=60, num_classes=3, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=40,
                        pooling=pooling, norm=norm, dropout=0.1, attention_dropout=0.1,
                        embedding_dim=24 if projection else 0)
    model = TransformerClassifier(cfg).double().train()
    lengths = torch.tensor([23, 3, 11, 1, 17])
    mask = torch.arange(23)[None, :] < lengths[:, None]
    ids = torch.where(mask, torch.randint(1, 60, mask.shape), 0)
    labels = torch.tensor([0, 2, 1, 1, 0])
    layouts = []  # what the feed-forward of block 0 saw: (N, D) rows or the (B, T, D) batch
    model.blocks[0].ff.register_forward_pre_hook(lambda module, args: layouts.append(tuple(args[0].shape)))

    def run(min_padding):
        monkeypatch.setattr(RealTokens, "MIN_PADDING", min_padding)
        model.zero_grad()
        logits = model(ids, mask)
        torch.nn.functional.cross_entropy(logits, labels).backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    padded_logits, padded_grads = run(2.0)  # never unpad
    logits, grads = run(0.0)  # always unpad
    assert layouts == [(5, 23, 32), (64, 32)]  # 55 real tokens, rounded up to 64 rows
    torch.testing.assert_close(logits, padded_logits, rtol=1e-10, atol=1e-10)
    for name, g in grads.items():
        torch.testing.assert_close(g, padded_grads[name], rtol=1e-9, atol=1e-10, msg=name)


def test_real_token_rows_cover_every_real_token_rounded_to_16():
    from tformer_cli.model.encoder import RealTokens

    mask = torch.arange(32)[None, :] < torch.tensor([30, 2, 9, 1])[:, None]  # 42 real of 128 positions
    rows = RealTokens.of(mask)
    assert rows is not None and rows.index.numel() == 48
    picked = torch.zeros(128, dtype=torch.bool)
    picked[rows.index] = True
    assert picked[mask.flatten()].all() and picked.sum() == 48  # all 42 real tokens, 6 padding positions
    x = torch.randn(4, 32, 5)
    back = rows.scatter(rows.gather(x))
    torch.testing.assert_close(back[mask], x[mask])
    assert RealTokens.of(torch.ones(4, 32, dtype=torch.bool)) is None  # nothing to gain
    assert RealTokens.of(torch.arange(32)[None, :] < torch.tensor([32, 32, 30, 29])[:, None]) is None  # < 15%


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_a_row_of_only_padding_gets_the_padded_layouts_logits(monkeypatch, pooling):
    from tformer_cli.model.encoder import RealTokens

    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=50, num_classes=3, d_model=32, n_heads=4, d_ff=64, max_len=40, pooling=pooling)
    model = TransformerClassifier(cfg).eval()
    ids = torch.zeros(3, 20, dtype=torch.long)
    ids[0, :5] = torch.tensor([2, 17, 9, 33, 3])
    ids[2, :2] = torch.tensor([2, 3])  # row 1: nothing but padding
    mask = ids.ne(0)
    monkeypatch.setattr(RealTokens, "MIN_PADDING", 2.0)
    padded = model(ids, mask)
    monkeypatch.setattr(RealTokens, "MIN_PADDING", 0.0)
    torch.testing.assert_close(model(ids, mask), padded, rtol=1e-5, atol=1e-5)


def test_the_layout_decided_on_the_host_gives_the_models_own_answers():
    """The loops that send batches to a GPU decide the layout from the CPU mask (`Layout.of(mask, device)`): for a
    GPU, a full batch runs with no mask and a padded one padded (never on its real tokens); the logits are the
    same whichever layout runs, and a GPU device is named without one being here."""
    from tformer_cli.model.fast_paths import Layout

    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=60, num_classes=3, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=40,
                        pooling="mean")
    model = TransformerClassifier(cfg).double().eval()
    full = torch.ones(4, 12, dtype=torch.bool)
    mixed = torch.arange(12)[None, :] < torch.tensor([12, 3, 7, 1])[:, None]
    gpu = torch.device("cuda")
    assert (Layout.of(full, gpu).padded, Layout.of(full, gpu).rows) == (False, None)
    assert (Layout.of(mixed, gpu).padded, Layout.of(mixed, gpu).rows) == (True, None)
    assert Layout.of(mixed).rows is not None and Layout.of(mixed, torch.device("cpu")).rows is not None
    assert Layout.of(mixed, torch.device("cpu"), unpad=False).rows is None  # compiled: few shapes
    for mask in (full, mixed):
        ids = torch.where(mask, torch.randint(1, 60, mask.shape), 0)
        own = model(ids, mask)
        for layout in (Layout.of(mask, gpu), Layout.of(mask, torch.device("cpu")), Layout(True)):
            torch.testing.assert_close(model(ids, mask, layout=layout), own, rtol=1e-10, atol=1e-10)
