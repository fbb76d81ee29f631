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
