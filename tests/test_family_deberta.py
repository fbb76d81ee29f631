"""DeBERTa-v2/v3 inside our encoder: numerical parity with `transformers`' DebertaV2Model (disentangled attention,
log-bucketed relative positions past position_buckets) on small random models, padded; the unpadded CPU path,
attention-dropout training, explanations, ONNX tracing, and the settings we refuse."""
import pytest
import torch

from tformer_cli.errors import TformerError
from tformer_cli.model.disentangled import RelativePositionTable, diagonals
from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier
from tformer_cli.model.pretrained import encoder_shape, load_encoder, load_into

transformers = pytest.importorskip("transformers")

VOCAB, PAD = 200, 0
V3 = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
          max_position_embeddings=64, relative_attention=True, position_biased_input=False,
          pos_att_type=["p2c", "c2p"], position_buckets=16, max_relative_positions=-1, norm_rel_ebd="layer_norm",
          share_att_key=True, type_vocab_size=0, hidden_act="gelu", pad_token_id=PAD)
# DeBERTa-v2-like: absolute positions and token types too, a narrower table, distances clamped (no log buckets)
V2 = {**V3, "position_biased_input": True, "type_vocab_size": 2, "embedding_size": 32, "position_buckets": -1,
      "max_relative_positions": 24, "pos_att_type": "p2c|c2p", "hidden_act": "gelu_new"}


def write_folder(folder, **config):
    """A random DebertaV2Model saved by transformers (safetensors) with a small tokenizer.json beside it."""
    from tokenizers import Tokenizer, models

    torch.manual_seed(0)
    reference = transformers.DebertaV2Model(transformers.DebertaV2Config(**config)).eval()
    reference.save_pretrained(folder, safe_serialization=True)
    Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t1")).save(str(folder / "tokenizer.json"))
    return reference


def ours(folder, max_len=64, **kw):
    enc = load_encoder(str(folder), None, max_len)
    model = TransformerClassifier(EncoderConfig(**{**enc.shape, "num_classes": 3, "dropout": 0.0,
                                                   "attention_dropout": 0.0, **kw}))
    load_into(model, enc)
    return model.eval(), enc


def batch(lengths, T=None, seed=1):
    """Right-padded random ids (B, T) and the mask, True at real tokens."""
    torch.manual_seed(seed)
    T = T or max(lengths)
    ids = torch.randint(3, VOCAB, (len(lengths), T))
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~mask, PAD), mask


@pytest.fixture(scope="module", params=["v3", "v2"])
def folder(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"deberta_{request.param}")
    return folder, write_folder(folder, **(V3 if request.param == "v3" else V2))


def test_relative_rows_are_transformers_log_buckets():
    """Every distance of a 300-token text maps to the row transformers gathers (DeBERTa-v3: 256 buckets, 512)."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    T, S = 300, 256
    table = RelativePositionTable(EncoderConfig(vocab_size=10, num_classes=2, d_model=8, n_heads=2, max_len=512,
                                                attention="disentangled", relative_buckets=S,
                                                max_relative_positions=512))
    rows = table(T).rows  # (2T + 1,): distance -T .. T
    x = torch.zeros(1, T, 1)
    theirs = (build_relative_position(x, x, bucket_size=S, max_position=512)[0] + S).clamp(0, 2 * S - 1)  # (T, T)
    i, j = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    assert torch.equal(rows[i - j + T], theirs)
    assert len(set(rows.tolist())) < 2 * T + 1  # the long distances really share buckets


def test_diagonals_reads_each_rows_relative_terms():
    T = 5
    m = torch.randn(2, T, 2 * T)
    out = diagonals(m)
    expected = torch.stack([torch.stack([m[:, r, s - r + T - 1] for s in range(T)], -1) for r in range(T)], 1)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("lengths", [[40, 9, 25], [64, 3, 17, 50]], ids=["mixed", "full_length"])
def test_hidden_states_match_transformers_deberta(folder, lengths):
    folder, reference = folder
    model, _ = ours(folder)
    ids, mask = batch(lengths)
    assert not bool(mask.all()) and max(lengths) > 16  # padded, and past the exact buckets
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        got = model.encode(ids, mask)
    diff = (expected - got).abs()[mask].max().item()
    print(f"max abs difference of final hidden states (real tokens): {diff:.2e}")
    assert diff <= 1e-4


def test_the_shape_comes_from_config_json_and_only_the_head_is_new(folder):
    folder, _ = folder
    model, enc = ours(folder, max_len=48)
    assert enc.shape["attention"] == "disentangled" and enc.family == "DeBERTa"
    assert (enc.shape["d_model"], enc.shape["n_layers"], enc.shape["n_heads"]) == (64, 3, 4)
    assert {k for k in model.state_dict() if k not in enc.state} == {"head.weight", "head.bias"}
    assert model.cfg.state_shapes() == {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_padded_and_unpadded_logits_are_equal(folder):
    """The batch is a third padding, so the CPU path carries only the real tokens between attentions."""
    folder, _ = folder
    model, _ = ours(folder)
    ids, mask = batch([40, 9, 25, 12])
    assert 1 - mask.float().mean() >= 0.15
    with torch.no_grad():
        together = model(ids, mask)
        alone = torch.cat([model(ids[i:i + 1, :n], mask[i:i + 1, :n]) for i, n in enumerate(mask.sum(1).tolist())])
    assert (together - alone).abs().max().item() <= 1e-5


def test_training_with_attention_dropout_runs_a_backward_step(folder):
    folder, _ = folder
    model, _ = ours(folder, dropout=0.1, attention_dropout=0.1)
    model.train()
    ids, mask = batch([40, 9, 25])
    first = model(ids, mask)
    assert not torch.allclose(first, model(ids, mask))  # the dropout masks are really drawn
    torch.nn.functional.cross_entropy(first, torch.tensor([0, 1, 2])).backward()
    table = model.relative_positions.table.weight.grad
    assert table is not None and torch.isfinite(table).all() and table.abs().sum() > 0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_explanations_are_distributions_over_real_tokens(folder):
    folder, _ = folder
    model, _ = ours(folder)
    ids, mask = batch([40, 9])
    weights = model.explain(ids, mask)
    for kind in ("last", "rollout"):
        assert torch.allclose(weights[kind].sum(-1), torch.ones(2), atol=1e-5)
        assert weights[kind][~mask].abs().max() == 0


def test_onnx_tracing_keeps_the_relative_positions_dynamic(folder, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    folder, _ = folder
    model, _ = ours(folder)
    ids, mask = batch([20, 7])
    path = tmp_path / "model.onnx"
    torch.onnx.export(model, (ids, mask), str(path), dynamo=False, opset_version=17,
                      input_names=["input_ids", "attention_mask"], output_names=["logits"],
                      dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                                    "attention_mask": {0: "batch", 1: "sequence"}})
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids, mask = batch([50, 9, 31], seed=2)  # another batch size and length than traced
    got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    with torch.no_grad():
        expected = model(ids, mask).numpy()
    assert abs(got - expected).max() <= 1e-4


@pytest.mark.parametrize("change, message", [
    ({"conv_kernel_size": 3}, "conv_kernel_size=3"),
    ({"share_att_key": False}, "share_att_key=false"),
    ({"pos_att_type": ["c2p"]}, "pos_att_type"),
    ({"norm_rel_ebd": "none"}, "norm_rel_ebd"),
    ({"relative_attention": False}, "relative_attention=false"),
])
def test_settings_we_do_not_reproduce_are_refused_in_one_line(tmp_path, change, message):
    import json

    write_folder(tmp_path, **{**V3, "num_hidden_layers": 1})
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(TformerError, match=message) as err:
        encoder_shape(tmp_path, 32)
    assert "\n" not in str(err.value)


def test_absolute_positions_bound_max_len_only_when_the_model_has_them(tmp_path):
    write_folder(tmp_path / "v2", **{**V2, "num_hidden_layers": 1})
    with pytest.raises(TformerError, match="exceeds the 64 positions"):
        encoder_shape(tmp_path / "v2", 128)
    write_folder(tmp_path / "v3", **{**V3, "num_hidden_layers": 1})
    assert encoder_shape(tmp_path / "v3", 128)["positions"] == "none"  # relative positions only: any length
