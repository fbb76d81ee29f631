"""RoBERTa, XLM-RoBERTa, DistilBERT and ELECTRA inside our encoder: final hidden states equal `transformers`' own
model's on a right-padded batch of different lengths (fp32, max abs diff <= 1e-4), padding never changes a text's
logits, and a folder is read as the family its config.json names: never as another, never from a pickle.
Reference models are small, random-initialised (every weight perturbed, so zero-initialised biases are checked too)
and saved as safetensors in tmp folders: nothing is downloaded."""
import json
import pickle
from pathlib import Path

import pytest
import torch

import hf_folders
from helpers import TINY_DATA, run_tformer
from tformer_cli.errors import TformerError
from tformer_cli.model.encoder import EncoderConfig, RealTokens, TransformerClassifier
from tformer_cli.model.pretrained import load_encoder, load_into

transformers = pytest.importorskip("transformers")
transformers.utils.logging.set_verbosity_error()

def hf_folder(family: str, folder: Path, task_class: str = "AutoModel", **changes) -> tuple[Path, torch.nn.Module]:
    return hf_folders.reference(family, folder, task_class, **changes)


def ours(folder: Path, max_len: int = 32) -> tuple[TransformerClassifier, object]:
    enc = load_encoder(str(folder), None, max_len)
    model = TransformerClassifier(EncoderConfig(**enc.shape, num_classes=3, dropout=0.0, attention_dropout=0.0))
    load_into(model, enc)
    return model.eval(), enc


def padded_batch(vocab: int, pad: int, lengths=(12, 5, 9, 3)) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded random ids (never the pad id at a real token), mask True at real tokens."""
    torch.manual_seed(1)
    T = max(lengths)
    ids = torch.randint(5, vocab, (len(lengths), T))
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~mask, pad), mask


@pytest.mark.parametrize("family,name", [("roberta", "RoBERTa"), ("xlm-roberta", "XLM-RoBERTa"),
                                         ("distilbert", "DistilBERT"), ("electra", "ELECTRA")])
def test_hidden_states_match_transformers_on_a_padded_batch(family, name, tmp_path):
    folder, reference = hf_folder(family, tmp_path)
    model, enc = ours(folder)
    assert enc.family == name
    ids, mask = padded_batch(enc.shape["vocab_size"], enc.shape["pad_id"])
    assert RealTokens.of(mask) is not None  # >= 15% padding: the unpadded CPU path is the one compared
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        got = model.encode(ids, mask)
        logits = model(ids, mask)
        alone = torch.cat([model(ids[i:i + 1, :n]) for i, n in enumerate(mask.sum(1).tolist())])
    diff = (expected - got).abs()[mask].max().item()
    print(f"{name}: max abs difference of final hidden states (real tokens): {diff:.2e}")
    assert diff <= 1e-4
    assert (logits - alone).abs().max().item() <= 1e-5  # a text's logits do not depend on its batch's padding


def test_roberta_positions_are_transformers_numbering_for_real_tokens(tmp_path):
    """Our table starts at row padding_idx + 1; transformers numbers real tokens padding_idx + 1, + 2, ..."""
    folder, reference = hf_folder("roberta", tmp_path)
    model, enc = ours(folder)
    pad = enc.shape["pad_id"]
    ids, mask = padded_batch(enc.shape["vocab_size"], pad)
    theirs = reference.embeddings.create_position_ids_from_input_ids(ids, pad)  # (B, T)
    table = reference.embeddings.position_embeddings.weight  # (max_position_embeddings, D)
    ours_rows = torch.arange(ids.shape[1]).expand_as(ids)  # row t of our table for token t
    type0 = reference.embeddings.token_type_embeddings.weight[0]
    assert torch.equal(theirs[mask], (ours_rows + pad + 1)[mask])
    assert torch.allclose(model.position_embedding.weight[ours_rows[mask]], table[theirs[mask]] + type0)
    usable = json.loads((folder / "config.json").read_text())["max_position_embeddings"] - pad - 1
    with pytest.raises(TformerError, match=f"exceeds the {usable} positions"):
        load_encoder(str(folder), None, usable + 1)


def test_electra_projects_after_the_embedding_norm_with_a_bias(tmp_path):
    folder, reference = hf_folder("electra", tmp_path, task_class="ElectraForPreTraining")
    model, enc = ours(folder)
    assert enc.shape["embedding_projection"] == "after_norm" and enc.shape["embedding_dim"] == 16
    assert model.embedding_norm.weight.shape == (16,) and model.embedding_projection.bias.shape == (32,)
    assert torch.equal(model.embedding_projection.bias, reference.electra.embeddings_project.bias.detach())
    ids, mask = padded_batch(enc.shape["vocab_size"], enc.shape["pad_id"])
    with torch.no_grad():  # the pretraining model's encoder, its discriminator head dropped
        expected = reference.electra(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        assert (expected - model.encode(ids, mask)).abs()[mask].max().item() <= 1e-4


@pytest.mark.parametrize("family,task_class,base", [
    ("roberta", "RobertaForSequenceClassification", "roberta"), ("xlm-roberta", "XLMRobertaForMaskedLM", "roberta"),
    ("distilbert", "DistilBertForMaskedLM", "distilbert"),
    ("distilbert", "DistilBertForSequenceClassification", "distilbert"),
    ("electra", "ElectraForMaskedLM", "electra"), ("electra", "ElectraForMultipleChoice", "electra")])
def test_task_checkpoints_load_their_encoder_and_drop_their_heads(family, task_class, base, tmp_path):
    folder, reference = hf_folder(family, tmp_path, task_class=task_class)
    model, enc = ours(folder)  # (load_into refuses any tensor it does not place)
    ids, mask = padded_batch(enc.shape["vocab_size"], enc.shape["pad_id"])
    with torch.no_grad():
        expected = getattr(reference, base)(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        assert (expected - model.encode(ids, mask)).abs()[mask].max().item() <= 1e-4


def test_a_roberta_checkpoint_labelled_bert_is_refused_naming_both(tmp_path):
    folder, _ = hf_folder("roberta", tmp_path, task_class="RobertaForMaskedLM")
    assert load_encoder(str(folder), None, 32).family == "RoBERTa"  # as saved: read as RoBERTa, its lm_head dropped
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    with pytest.raises(TformerError) as refused:
        load_encoder(str(folder), None, 32)
    message = str(refused.value)
    assert "\n" not in message
    assert "'bert' (BERT)" in message and "RoBERTa" in message and "'roberta.'" in message, message


def test_an_unknown_model_type_is_refused_listing_the_supported_ones(tmp_path):
    folder, _ = hf_folder("bert", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(TformerError) as refused:
        load_encoder(str(folder), None, 32)
    message = str(refused.value)
    assert "\n" not in message and "'gpt2'" in message
    for model_type in ("bert", "distilbert", "electra", "roberta", "xlm-roberta"):
        assert model_type in message.split("supported model_type values:")[1], message


class _Payload:
    """Unpickling this touches `path`: the proof that a pickle was (or was not) loaded."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return Path.touch, (self.path,)


def test_a_folder_with_only_pytorch_model_bin_is_refused_unread(tmp_path):
    folder, _ = hf_folder("distilbert", tmp_path / "model")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(tmp_path / "unpickled")))
    with pytest.raises(TformerError, match="pytorch_model.bin.*never loads"):
        load_encoder(str(folder), None, 32)
    assert not (tmp_path / "unpickled").exists()


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_a_distilbert_folder_trains_evaluates_and_predicts_with_the_cli(tmp_path):
    folder, _ = hf_folder("distilbert", tmp_path / "distilbert")
    train = run_tformer("train", "model=pretrained", f"model.pretrained={folder}", "model.max_len=32", *TINY_DATA,
                        "trainer.epochs=1", "trainer.precision=fp32", "optimizer.lr=1e-3", cwd=tmp_path)
    assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-2000:]
    [run] = (tmp_path / "outputs" / "train").glob("*/*")
    log = (run / "train.log").read_text()
    assert f"DistilBERT model {folder}" in log, log[:2000]
    model_json = json.loads((run / "checkpoints" / "best" / "model.json").read_text())
    assert (model_json["d_model"], model_json["n_layers"], model_json["norm_eps"]) == (32, 2, 1e-12)
    evaluate = run_tformer("evaluate", f"checkpoint={run}", cwd=tmp_path)
    assert evaluate.returncode == 0, evaluate.stderr[-2000:]
    assert "confusion matrix" in evaluate.stdout
    best = run / "checkpoints" / "best"
    predict = run_tformer("predict", "--json", f"--checkpoint={best}", "the film was never dull", cwd=tmp_path)
    assert predict.returncode == 0, predict.stderr[-2000:]
    [row] = [json.loads(line) for line in predict.stdout.splitlines()]
    assert row["text"] == "the film was never dull" and 0.5 <= row["probability"] <= 1
