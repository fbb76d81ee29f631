"""ModernBERT inside our encoder: numerical parity with `transformers`' ModernBertModel (rotary positions, local
attention windows, GeGLU, bias-free pre-norm blocks) on a small random model, with padding and past the local
window; the unpadded CPU path, dropout training and ONNX tracing with the same knobs."""
import io
import json

import pytest
import torch

from tformer_cli.errors import TformerError
from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier
from tformer_cli.model.pretrained import encoder_shape, load_encoder, load_into

transformers = pytest.importorskip("transformers")

VOCAB, PAD, WINDOW = 200, 3, 16
SMALL = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
             max_position_embeddings=512, global_attn_every_n_layers=3, local_attention=WINDOW,
             global_rope_theta=160_000.0, local_rope_theta=10_000.0, pad_token_id=PAD, bos_token_id=1,
             eos_token_id=2, cls_token_id=1, sep_token_id=2,
             initializer_range=0.1)  # 5x the default, so that a wrong window or rotary base moves the states by > 1e-2


def write_folder(folder, masked_lm: bool = False, **overrides):
    """A random ModernBERT saved by transformers (safetensors) with a small tokenizer.json beside it."""
    from tokenizers import Tokenizer, models

    config = transformers.ModernBertConfig(**{**SMALL, **overrides}, attn_implementation="sdpa")
    torch.manual_seed(0)
    cls = transformers.ModernBertForMaskedLM if masked_lm else transformers.ModernBertModel
    reference = cls(config).eval()
    reference.save_pretrained(folder, safe_serialization=True)
    Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0")).save(str(folder / "tokenizer.json"))
    return reference


def ours(folder, max_len=128, **kw):
    enc = load_encoder(str(folder), None, max_len)
    model = TransformerClassifier(EncoderConfig(**{**enc.shape, "num_classes": 3, "dropout": 0.0,
                                                   "attention_dropout": 0.0, **kw}))
    load_into(model, enc)
    return model.eval(), enc


def batch(lengths, T=None):
    """Right-padded random ids (B, T) and the mask, True at real tokens."""
    torch.manual_seed(1)
    T = T or max(lengths)
    ids = torch.randint(4, VOCAB, (len(lengths), T))
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~mask, PAD), mask


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("modernbert")
    return folder, write_folder(folder)


@pytest.mark.parametrize("lengths", [[11, 5, 9], [60, 23, 41]], ids=["short", "past_the_window"])
def test_hidden_states_match_transformers_modernbert(folder, lengths):
    path, reference = folder
    model, enc = ours(path)
    assert (enc.shape["local_window"], enc.shape["global_every"], enc.shape["rotary_theta"]) == (WINDOW, 3, 160_000.0)
    ids, mask = batch(lengths)
    assert not bool(mask.all())
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        got = model.encode(ids, mask)
        unpadded = model.encode(ids[:1, :lengths[0]], mask[:1, :lengths[0]])  # the longest text alone
    diff = (expected - got).abs()[mask].max().item()
    print(f"max abs difference of final hidden states (real tokens, lengths {lengths}): {diff:.2e}")
    assert diff <= 1e-4
    assert (unpadded[0] - expected[0, :lengths[0]]).abs().max().item() <= 1e-4


def test_the_local_window_really_limits_what_a_token_sees(folder):
    """Changing the last token changes the first token's state only through the global layer: with the global
    layer made local too, the first token (60 positions away, window 16 over 3 layers) does not see it at all."""
    path, _ = folder
    model, _ = ours(path, global_every=4)  # blocks 1, 2, 3 local; block 0 global
    local_only, _ = ours(path, global_every=4)
    local_only.blocks[0].attn.local = True
    ids, mask = batch([60])
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % VOCAB
    with torch.no_grad():
        assert (model.encode(ids, mask)[0, 0] - model.encode(changed, mask)[0, 0]).abs().max() > 1e-6
        assert torch.equal(local_only.encode(ids, mask)[0, 0], local_only.encode(changed, mask)[0, 0])


def test_logits_of_a_text_do_not_depend_on_its_batchs_padding(folder):
    """The unpadded CPU path (RealTokens: >= 15% padding) with rotary positions and local windows."""
    path, _ = folder
    model, _ = ours(path, pooling="mean")
    ids, mask = batch([60, 12, 7, 30])
    assert 1 - mask.float().mean().item() >= 0.15
    with torch.no_grad():
        together = model(ids, mask)
        alone = torch.cat([model(ids[i:i + 1, :n], mask[i:i + 1, :n]) for i, n in enumerate([60, 12, 7, 30])])
        explained = model.explain(ids, mask)
    assert (together - alone).abs().max().item() <= 1e-5
    assert torch.allclose(explained["rollout"].sum(-1), torch.ones(4))


def test_dropout_training_takes_a_step_on_cpu(folder):
    """Dropout everywhere, attention dropout through the written-out CPU path, a padded batch (RealTokens)."""
    path, _ = folder
    model, _ = ours(path, dropout=0.1, attention_dropout=0.1)
    model.train()
    ids, mask = batch([60, 12, 7, 30])
    before = model.blocks[1].attn.qkv.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.nn.functional.cross_entropy(model(ids, mask), torch.tensor([0, 1, 2, 0]))
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and not torch.equal(before, model.blocks[1].attn.qkv.weight)


def test_the_masked_lm_checkpoint_loads_without_its_head(tmp_path):
    write_folder(tmp_path, masked_lm=True)
    model, enc = ours(tmp_path)
    assert not any(k.startswith(("head.", "decoder.")) for k in enc.state)
    new = {k for k in model.state_dict() if k not in enc.state}
    assert new == {"head.weight", "head.bias"}  # our classifier head only
    assert "blocks.0.norm1.weight" not in model.state_dict() and "blocks.1.attn.qkv.bias" not in model.state_dict()


def test_layer_types_and_rope_parameters_of_transformers_5_configs_are_read(tmp_path):
    """A config.json saved by transformers 5 names layer kinds and rotary bases per kind; the older flat keys too."""
    write_folder(tmp_path, global_attn_every_n_layers=2, local_rope_theta=5_000.0)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "layer_types" in saved
    shape = encoder_shape(tmp_path, 64)
    assert (shape["global_every"], shape["local_rotary_theta"], shape["rotary_theta"]) == (2, 5_000.0, 160_000.0)
    legacy = {k: v for k, v in saved.items() if k not in ("layer_types", "rope_parameters")}
    (tmp_path / "config.json").write_text(json.dumps({**legacy, "global_attn_every_n_layers": 2,
                                                      "local_rope_theta": 5_000.0}))
    assert encoder_shape(tmp_path, 64) == shape


@pytest.mark.parametrize("change, message", [
    ({"hidden_activation": "silu"}, "activation 'silu'"),
    ({"layer_types": ["full_attention", "full_attention", "sliding_attention"]}, "every n-th layer"),
    ({"mlp_bias": True}, "biases differ"),
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1.0}}}, "rope_type='yarn'"),
])
def test_settings_we_do_not_reproduce_are_refused_in_one_line(folder, tmp_path, change, message):
    path, _ = folder
    for name in ("model.safetensors", "tokenizer.json"):
        (tmp_path / name).write_bytes((path / name).read_bytes())
    saved = json.loads((path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, **change}))
    with pytest.raises(TformerError, match=message) as info:
        encoder_shape(tmp_path, 64)
    assert "\n" not in str(info.value)


def test_max_len_reaches_the_models_positions_and_no_further(folder):
    path, _ = folder
    assert encoder_shape(path, 512)["max_len"] == 512
    with pytest.raises(TformerError, match="exceeds the 512 positions"):
        encoder_shape(path, 513)


def test_the_model_traces_to_onnx(folder):
    """torch.onnx tracing (as `tformer export` does) keeps the rotary tables and the local band dynamic in T."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    path, _ = folder
    model, _ = ours(path)
    ids, mask = batch([20, 9])
    buffer = io.BytesIO()
    torch.onnx.export(model, (ids, mask.long()), buffer, dynamo=False, opset_version=17,
                      input_names=["input_ids", "attention_mask"], output_names=["logits"],
                      dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                                    "attention_mask": {0: "batch", 1: "sequence"}})
    session = ort.InferenceSession(buffer.getvalue())
    for lengths in ([20, 9], [60, 41, 5]):  # a longer sequence than the one traced
        ids, mask = batch(lengths)
        got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.long().numpy()})[0]
        with torch.no_grad():
            expected = model(ids, mask).numpy()
        assert abs(got - expected).max() <= 1e-4
