"""Checkpoints that cannot mislead: corrupted, mismatched or crafted files are refused on load with one line,
before anything large is allocated, and nothing in a checkpoint's YAML is ever resolved."""
import json
import os
import resource

import pytest

from tformer_cli import checkpoint
from tformer_cli.store import manifest
from tformer_cli.errors import TformerError
from tformer_cli.store.layout import CheckpointDir


def make_checkpoint(path, vocab_size=30, num_classes=2, config_yaml="seed: 1\n", labels=("neg", "pos")):
    from tformer_cli.data.tokenization import train_wordpiece
    from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier

    cfg = EncoderConfig(vocab_size=vocab_size, num_classes=num_classes, d_model=16, n_heads=2, d_ff=32, max_len=8)
    tok = train_wordpiece(["a b c d", "a b c d", "e f g"], 30, 8).to_str()
    return checkpoint.save(path, TransformerClassifier(cfg), model_config=cfg.to_dict(), tokenizer_json=tok,
                           label_names=list(labels), config_yaml=config_yaml, metrics={"val_accuracy": 0.5},
                           meta={"epoch": 1})


def reseal(ckpt: CheckpointDir) -> None:
    """Recompute the manifest, as someone crafting a checkpoint would: only the field checks stand in the way."""
    ckpt.manifest.write_text(json.dumps(manifest.digests(ckpt)))


def edit_json(path, change):
    obj = json.loads(path.read_text())
    path.write_text(json.dumps(change(obj)))


def test_a_clean_checkpoint_loads_and_lists_every_file_in_its_manifest(tmp_path):
    ckpt = make_checkpoint(tmp_path / "best")
    listed = json.loads(ckpt.manifest.read_text())
    assert set(listed) == {f.name for f in ckpt.path.iterdir()} - {ckpt.manifest.name}
    assert checkpoint.load(ckpt).label_names == ["neg", "pos"]


@pytest.mark.parametrize("damage", ["flip_weight_byte", "truncate_tokenizer", "edit_n_heads", "drop_manifest"])
def test_changed_files_are_refused_by_the_manifest(tmp_path, damage):
    ckpt = make_checkpoint(tmp_path / "best")
    if damage == "flip_weight_byte":
        data = bytearray(ckpt.weights.read_bytes())
        data[-5] ^= 0xFF  # inside the last tensor: loads fine, gives different (or NaN) outputs
        ckpt.weights.write_bytes(bytes(data))
    elif damage == "truncate_tokenizer":
        ckpt.tokenizer.write_text(ckpt.tokenizer.read_text()[:-40])
    elif damage == "edit_n_heads":  # same shapes, different outputs: only the manifest can tell
        edit_json(ckpt.model_config, lambda c: {**c, "n_heads": 4})
    else:
        ckpt.manifest.unlink()
    with pytest.raises(TformerError) as err:
        checkpoint.load(ckpt)
    message = str(err.value)
    assert "\n" not in message
    assert ("changed after it was written" in message if damage != "drop_manifest"
            else "missing or unreadable manifest.json" in message)


@pytest.mark.parametrize("labels, expected", [(["a", "b", "c", "d"], "must list 2 label names"),
                                              (["a"], "must list 2 label names"),
                                              ([1, 2], "must list 2 label names"),
                                              ({"0": "a"}, "must list 2 label names")])
def test_label_names_must_match_the_classes(tmp_path, labels, expected):
    ckpt = make_checkpoint(tmp_path / "best")
    ckpt.labels.write_text(json.dumps(labels))
    reseal(ckpt)
    with pytest.raises(TformerError, match=expected):
        checkpoint.load(ckpt)


def test_a_doctored_vocab_size_is_refused_before_allocating(tmp_path):
    ckpt = make_checkpoint(tmp_path / "best")
    edit_json(ckpt.model_config, lambda c: {**c, "vocab_size": 8_000_000})  # would be 8e6 x 16 floats, then more
    reseal(ckpt)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(TformerError, match="do not match model.json .shape mismatch"):
        checkpoint.load(ckpt)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 200, f"peak memory grew by {grown_mb:.0f} MB"


@pytest.mark.parametrize("field, value, expected", [("n_heads", 3, "n_heads"), ("d_model", -16, "d_model"),
                                                    ("dropout", 1.5, "dropout"), ("vocab_size", "many", "vocab_size"),
                                                    ("surprise", 1, "surprise"), ("pad_id", 30, "pad_id")])
def test_model_json_fields_are_typed_and_range_checked(tmp_path, field, value, expected):
    ckpt = make_checkpoint(tmp_path / "best")
    edit_json(ckpt.model_config, lambda c: {**c, field: value})
    reseal(ckpt)
    with pytest.raises(TformerError, match=expected) as err:
        checkpoint.load(ckpt)
    assert "\n" not in str(err.value)


def test_a_tokenizer_with_ids_beyond_the_embedding_is_refused(tmp_path):
    ckpt = make_checkpoint(tmp_path / "best")
    edit_json(ckpt.tokenizer, lambda t: {**t, "model": {**t["model"], "vocab": {**t["model"]["vocab"], "zz": 500}}})
    reseal(ckpt)
    with pytest.raises(TformerError, match="token ids up to 500, but the embedding has 30 rows"):
        checkpoint.load(ckpt)


def test_saved_config_is_never_interpolated_or_unsafely_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("TFORMER_TEST_SECRET", "hunter2")
    ckpt = make_checkpoint(tmp_path / "best", config_yaml="data:\n  name: ${oc.env:TFORMER_TEST_SECRET}\nseed: 3\n")
    config = checkpoint.load(ckpt).saved_config()
    assert config["data"]["name"] == "${oc.env:TFORMER_TEST_SECRET}" and "hunter2" not in json.dumps(config)
    ckpt.config.write_text("!!python/object/apply:os.system ['true']\n")
    reseal(ckpt)
    with pytest.raises(TformerError, match="unreadable saved config"):
        checkpoint.load(ckpt).saved_config()


def test_a_failed_weights_write_is_one_line_and_leaves_no_temporary_files(tmp_path, monkeypatch):
    """safetensors reports a full disk as SafetensorError, not OSError; the previous checkpoint must survive."""
    import safetensors.torch
    from safetensors import SafetensorError

    ckpt = make_checkpoint(tmp_path / "checkpoints" / "last")
    good = ckpt.weights.read_bytes()

    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              "\"No space left on device\" })")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(TformerError, match="free some disk space .the previous checkpoint is kept"):
        make_checkpoint(tmp_path / "checkpoints" / "last")
    assert ckpt.weights.read_bytes() == good
    assert sorted(p.name for p in ckpt.path.parent.iterdir()) == ["last"]
    with pytest.raises(TformerError, match="free some disk space .none was saved there before"):  # (a first save
        make_checkpoint(tmp_path / "checkpoints" / "best")  # had no previous one to keep)


def test_an_output_path_that_cannot_be_a_directory_is_one_line(tmp_path):
    from tformer_cli.store.atomic import write_json

    blocker = tmp_path / "outputs"
    blocker.write_text("a file where the run directory should go")
    with pytest.raises(TformerError, match="could not save checkpoint .*check the output directory"):
        make_checkpoint(blocker / "checkpoints" / "best")
    with pytest.raises(TformerError, match="could not write .*history.json: .*check the output directory"):
        write_json(blocker / "history.json", [{"epoch": 1}])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_output_directory_is_one_line(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(TformerError, match="make the output directory writable"):
            make_checkpoint(locked / "checkpoints" / "best")
    finally:
        locked.chmod(0o700)
    assert list(locked.iterdir()) == []


def test_json_reports_are_strict(tmp_path):
    from tformer_cli.store.atomic import write_json

    path = write_json(tmp_path / "m.json", {"f1": float("nan"), "loss": [1.0, float("inf")]})
    assert json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}")) == \
        {"f1": None, "loss": [1.0, None]}


def test_metrics_log_drops_what_a_resumed_run_logs_again(tmp_path):
    from tformer_cli.store.atomic import JsonLines

    log = JsonLines(tmp_path / "metrics.jsonl")
    for step in (10, 20, 30):
        log({"kind": "step", "step": step, "loss": float("nan") if step == 30 else 0.5})
    with open(log.path, "a") as f:
        f.write('{"kind": "step", "st')  # cut by a crash
    assert json.loads(log.path.read_text().splitlines()[2])["loss"] is None  # strict JSON, NaN as null
    log.truncate_after(20)
    assert [json.loads(line)["step"] for line in log.path.read_text().splitlines()] == [10, 20]
    log({"kind": "epoch", "step": 25})
    assert [json.loads(line)["step"] for line in log.path.read_text().splitlines()] == [10, 20, 25]


def test_undecodable_json_and_a_downgraded_format_version_are_still_refused(tmp_path):
    ckpt = make_checkpoint(tmp_path / "a")
    ckpt.labels.write_bytes(b'["neg", "p\xffs"]')
    reseal(ckpt)
    with pytest.raises(TformerError, match="corrupt JSON file"):
        checkpoint.load(ckpt)
    ckpt = make_checkpoint(tmp_path / "b")
    data = bytearray(ckpt.weights.read_bytes())
    data[-5] ^= 0xFF
    ckpt.weights.write_bytes(bytes(data))
    edit_json(ckpt.meta, lambda m: {**m, "format_version": 1})  # claims to predate the manifest
    with pytest.raises(TformerError, match="changed after it was written"):
        checkpoint.load(ckpt)
    edit_json(ckpt.meta, lambda m: {**m, "format_version": True})
    with pytest.raises(TformerError, match="format version True"):
        checkpoint.load(ckpt)
