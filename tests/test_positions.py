import math

import pytest
import torch

from tformer_cli.errors import TformerError
from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier, sinusoidal_table


def test_sinusoidal_table_matches_the_paper_formula():
    table = sinusoidal_table(50, 16)
    for pos, i in [(0, 0), (1, 0), (7, 3), (49, 7)]:
        angle = pos / 10000 ** (2 * i / 16)
        assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
        assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)
    assert torch.all(table[0, 1::2] == 1) and torch.all(table[0, 0::2] == 0)


def test_positions_make_order_matter_and_learned_table_is_a_parameter():
    torch.manual_seed(0)
    for positions in ("sinusoidal", "learned"):
        cfg = EncoderConfig(vocab_size=20, num_classes=2, d_model=16, n_heads=2, d_ff=32, max_len=8,
                            positions=positions, pooling="mean")
        model = TransformerClassifier(cfg).eval()
        if positions == "learned":
            torch.nn.init.normal_(model.position_embedding.weight)
        a = model(torch.tensor([[2, 5, 6, 7, 3]]))
        b = model(torch.tensor([[2, 7, 6, 5, 3]]))  # same bag of tokens, other order
        assert not torch.allclose(a, b, atol=1e-4)
        names = dict(model.named_parameters())
        assert ("position_embedding.weight" in names) == (positions == "learned")


def test_sequence_longer_than_max_len_is_refused():
    cfg = EncoderConfig(vocab_size=20, num_classes=2, d_model=16, n_heads=2, d_ff=32, max_len=4)
    with pytest.raises(TformerError, match="exceeds model.max_len=4"):
        TransformerClassifier(cfg)(torch.ones(1, 5, dtype=torch.long))
