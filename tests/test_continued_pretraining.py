"""`tformer pretrain` of a pretrained encoder (domain-adaptive pretraining): the masked-LM head of each family's
checkpoint computes what `transformers`' *ForMaskedLM computes, a folder without one gets a new head, and a run
changes the encoder's weights, keeps its tokenizer, resumes to identical weights and hands its encoder to
`tformer train model.init=` with the chain named. Small random model folders saved by transformers: no download."""
import json

import pytest
import torch
from safetensors.torch import load_file

import hf_folders
from helpers import compose_config, ctrl_c_at_step, tiny, train_config
from tformer_cli import TformerError, train
from tformer_cli.console import output
from tformer_cli.model.encoder import EncoderConfig
from tformer_cli.model.mlm import continued, encoder_state
from tformer_cli.model.pretrained import load_encoder
from tformer_cli.runs.classify import prepare
from tformer_cli.runs.pretraining import MaskedLanguageModeling, pretrain
from tformer_cli.store.layout import RunDir
from tformer_cli.training.loop import Interrupted
from tformer_cli.typed_config import plain

transformers = pytest.importorskip("transformers")
transformers.utils.logging.set_verbosity_error()

HEADED = [("bert", "BertForMaskedLM", {}), ("roberta", "RobertaForMaskedLM", {}),
          ("xlm-roberta", "XLMRobertaForMaskedLM", {}), ("distilbert", "DistilBertForMaskedLM", {}),
          ("deberta-v2", "DebertaV2ForMaskedLM", {}),  # its head under cls.predictions (legacy, the default)
          ("deberta-v2", "DebertaV2ForMaskedLM", {"legacy": False}),  # under lm_predictions.lm_head
          ("modernbert", "ModernBertForMaskedLM", {}),
          ("electra", "ElectraForMaskedLM", {"embedding_size": hf_folders.SMALL["hidden"]})]  # (a d-wide generator)


def masked_lm(folder, max_len: int = 32):
    enc = load_encoder(str(folder), None, max_len)
    cfg = EncoderConfig(**enc.shape, num_classes=2, dropout=0.0, attention_dropout=0.0)
    return continued(cfg, enc).eval(), enc


def padded(vocab: int, pad: int, lengths=(12, 5, 9, 3)):
    torch.manual_seed(1)
    T = max(lengths)
    ids = torch.randint(5, vocab, (len(lengths), T))
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~mask, pad), mask


@pytest.mark.parametrize("family,task_class,changes", HEADED, ids=[f + "-" * bool(c) for f, _, c in HEADED])
def test_each_family_s_masked_lm_head_gives_transformers_logits(family, task_class, changes, tmp_path):
    folder, reference = hf_folders.reference(family, tmp_path, task_class, **changes)
    model, enc = masked_lm(folder)
    assert enc.mlm_head, enc.mlm_head_note
    ids, mask = padded(enc.shape["vocab_size"], enc.shape["pad_id"])
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask.long()).logits
        got = model(ids, mask)
    diff = (expected - got).abs()[mask].max().item()
    print(f"{family}: max abs difference of masked-LM logits (real tokens): {diff:.2e}")
    assert diff <= 1e-4


@pytest.mark.parametrize("family,task_class,why", [
    ("bert", "AutoModel", "no masked-LM head"),  # a sentence encoder (all-MiniLM-L6-v2 is one)
    ("electra", "ElectraForMaskedLM", "another shape"),  # a generator narrower than its embeddings
    ("bert", "BertForMaskedLM", "relu"),  # not exact GELU
    ("bert", "BertForMaskedLM", "tie_word_embeddings"),  # an output layer of its own
    ("modernbert", "ModernBertForSequenceClassification", "no masked-LM head")])  # a `head` that is a classifier's
def test_a_checkpoint_without_a_head_ours_computes_gets_a_new_tied_head(family, task_class, why, tmp_path):
    changes = {"relu": {"hidden_act": "relu"}, "tie_word_embeddings": {"tie_word_embeddings": False}}.get(why, {})
    folder, _ = hf_folders.reference(family, tmp_path, task_class, **changes)
    model, enc = masked_lm(folder)
    assert enc.mlm_head == {} and why in enc.mlm_head_note and "new head" in enc.mlm_head_note
    assert torch.equal(model.output_bias, torch.zeros_like(model.output_bias))
    assert torch.equal(model.encoder.token_embedding.weight, enc.state["token_embedding.weight"])


@pytest.mark.parametrize("family", list(hf_folders.FAMILIES))
def test_every_family_can_be_pretrained_further(family, tmp_path):
    folder, _ = hf_folders.reference(family, tmp_path / "model", "AutoModel")
    run = RunDir(tmp_path / "run")
    pretrain(plain(compose_config("pretrain", *tiny("model=pretrained", f"model.pretrained={folder}",
                                                    "model.max_len=32", "trainer.epochs=1", "data.n_train=60",
                                                    "data.n_validation=20"))), run)
    assert json.loads(run.best.meta.read_text())["continued_from"].endswith(str(folder))


@pytest.mark.slow  # pretrains three times, fine-tunes once
def test_pretraining_a_loaded_encoder_changes_it_keeps_its_tokenizer_resumes_and_feeds_model_init(tmp_path,
                                                                                                   monkeypatch):
    folder, _ = hf_folders.reference("bert", tmp_path / "model", "BertForMaskedLM")
    model = ["model=pretrained", f"model.pretrained={folder}", "model.max_len=32"]
    overrides = tiny(*model, "trainer.epochs=2", "trainer.batch_size=16", "data.n_train=200")
    whole, stopped = RunDir(tmp_path / "whole"), RunDir(tmp_path / "stopped")
    pretrain(plain(compose_config("pretrain", *overrides)), whole)

    before, after = load_file(str(folder / "model.safetensors")), load_file(str(whole.best.weights))
    assert not torch.equal(before["bert.encoder.layer.0.attention.self.query.weight"],
                           after["encoder.blocks.0.attn.qkv.weight"][:hf_folders.SMALL["hidden"]])
    assert not torch.equal(before["cls.predictions.bias"], after["output_bias"])  # its own head, trained further
    saved = json.loads(whole.best.tokenizer.read_text())
    assert saved["model"]["vocab"] == json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]

    ctrl_c_at_step(monkeypatch, MaskedLanguageModeling)  # in the middle of the first epoch
    with pytest.raises(Interrupted, match=f"resume={stopped}"):
        pretrain(plain(compose_config("pretrain", *overrides)), stopped)
    monkeypatch.undo()
    pretrain(plain(compose_config("pretrain", *tiny(*overrides, "model.max_len=auto", f"resume={stopped}"))),
             RunDir(tmp_path / "unused"))
    a, b = load_file(str(whole.last.weights)), load_file(str(stopped.last.weights))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    config = train_config(*tiny(*model), f"model.init={whole.root}")
    prepared = prepare(config, None, output())
    expected = encoder_state(load_file(str(whole.best.weights)))
    got = prepared.model.state_dict()
    assert expected and all(torch.equal(got[k], v) for k, v in expected.items())
    result = train([*tiny(*model), f"model.init={whole.root}"], run_dir=tmp_path / "ft")
    log = (result.run_dir / "train.log").read_text()
    assert f"continued from the BERT model {folder}" in log and str(whole.root) in log
    import shutil

    moved = shutil.copytree(folder, tmp_path / "moved")  # the same model elsewhere (another venv, another machine)
    train([*tiny("model=pretrained", f"model.pretrained={moved}"), f"model.init={whole.root}"], run_dir=tmp_path / "mv")
    other, _ = hf_folders.reference("bert", tmp_path / "other", "AutoModel")  # (another file: no MLM head)
    with pytest.raises(TformerError, match="continued from the BERT model .* but model.pretrained names "):
        train([*tiny("model=pretrained", f"model.pretrained={other}"), f"model.init={whole.root}"],
              run_dir=tmp_path / "mixed")
    # no model=: the default preset's from-scratch recipe (lr 1e-3) would undo the pretraining; the fix is named
    with pytest.raises(TformerError, match=f"without a model= preset .* add model=pretrained "
                                           f"model.pretrained={folder}, the preset it was pretrained with"):
        train([*tiny(), f"model.init={whole.root}"], run_dir=tmp_path / "default")
    assert not (tmp_path / "default").exists()


def test_head_warmup_moves_the_new_head_and_nothing_of_the_encoder(tmp_path, monkeypatch):
    """mlm.head_warmup_steps: while it lasts, gradients reach the head's transform and output bias only (not the
    blocks, not the token table the output layer is tied to): a run stopped within it has the encoder exactly as
    loaded; resumed, it ends as the same run uninterrupted, with the encoder trained after the warm-up. A warm-up
    as long as the run, and a from-scratch model, are refused in one line."""
    folder, _ = hf_folders.reference("bert", tmp_path / "model", "AutoModel")  # no MLM head: a new one
    model, enc = masked_lm(folder)
    model.train()
    ids, mask = padded(enc.shape["vocab_size"], enc.shape["pad_id"])
    labels = ids.masked_fill(~mask, -100)
    model.loss(model(ids, mask, labels, head_only=True), labels).backward()
    moved = {name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert moved == {"transform.0.weight", "transform.0.bias", "transform.2.weight", "transform.2.bias",
                     "output_bias"}, moved

    overrides = tiny("model=pretrained", f"model.pretrained={folder}", "model.max_len=32", "trainer.epochs=1",
                     "trainer.batch_size=8", "data.n_train=60", "data.n_validation=20", "mlm.head_warmup_steps=4")
    loaded = encoder_state({f"encoder.{k}": v for k, v in masked_lm(folder)[0].encoder.state_dict().items()})
    changed = lambda weights: [k for k in loaded if not torch.equal(encoder_state(weights)[k], loaded[k])]  # noqa: E731
    whole, stopped = RunDir(tmp_path / "whole"), RunDir(tmp_path / "stopped")
    pretrain(plain(compose_config("pretrain", *overrides)), whole)
    ctrl_c_at_step(monkeypatch, MaskedLanguageModeling, at=2)  # steps 0, 1, 2 done: all within the warm-up
    with pytest.raises(Interrupted):
        pretrain(plain(compose_config("pretrain", *overrides)), stopped)
    monkeypatch.undo()
    during = load_file(str(stopped.last.weights))
    assert changed(during) == [] and not torch.equal(during["output_bias"], torch.zeros_like(during["output_bias"]))
    pretrain(plain(compose_config("pretrain", *overrides, f"resume={stopped}")), RunDir(tmp_path / "unused"))
    a, b = load_file(str(whole.last.weights)), load_file(str(stopped.last.weights))
    assert a.keys() == b.keys() and [k for k in a if not torch.equal(a[k], b[k])] == []
    assert len(changed(a)) > len(loaded) // 2  # after the warm-up the encoder trains

    steps = json.loads(whole.history.read_text())[-1]["step"]  # (one epoch's)
    late = RunDir(tmp_path / "late")  # the first epoch ends as the warm-up does: it cannot be the best checkpoint,
    pretrain(plain(compose_config("pretrain", *tiny(*overrides, "trainer.epochs=2",  # whatever its loss
                                                    f"mlm.head_warmup_steps={steps}"))), late)
    assert json.loads(late.best.meta.read_text())["epoch"] == 2
    log = (late.root / "pretrain.log").read_text()
    assert f"the first {steps} steps train the head alone" in log and log.count("head warm-up: the encoder as") == 1

    with pytest.raises(TformerError, match="mlm.head_warmup_steps=1000 is at least the run's .* would never train"):
        pretrain(plain(compose_config("pretrain", *tiny(*overrides, "mlm.head_warmup_steps=1000"))),
                 RunDir(tmp_path / "all_head"))
    with pytest.raises(TformerError, match="mlm.head_warmup_steps=5 .* starts from scratch"):
        pretrain(plain(compose_config("pretrain", *tiny("mlm.head_warmup_steps=5"))), RunDir(tmp_path / "scratch"))
