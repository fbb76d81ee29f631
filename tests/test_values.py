"""Every value is checked before anything is read or allocated: NaN and infinities in any float setting, sizes
that no machine holds, values in saved files, and the Python API's arguments. Each refusal is one line."""
import dataclasses
import json
import subprocess
import sys
import typing

import pytest
import torch

from helpers import TINY, run_tformer, tiny
from tformer_cli.errors import ConfigError, TformerError
from tformer_cli.hydra_setup import compose_tree
from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier
from tformer_cli.runs.config import ModelOptions, TrainConfig
from test_checkpoint_integrity import make_checkpoint, reseal


def float_keys(cls, prefix: str) -> list[str]:
    """The dotted keys of every float field (float or float | None) under a typed config class, found from the
    dataclasses themselves (a float added later is covered without touching this test)."""
    keys = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = typing.get_type_hints(cls)[f.name]
        options = typing.get_args(tp) or (tp,)
        key = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(tp):
            keys += float_keys(tp, key)
        elif float in options:
            keys.append(key)
    return keys


def train_float_keys() -> list[str]:
    keys = float_keys(TrainConfig, "")
    for cls in (EncoderConfig, ModelOptions):  # `model` is a mapping typed in two parts: the shape and the options
        keys += float_keys(cls, "model")
    return sorted(set(keys))


FLOAT_KEYS = train_float_keys()


def test_the_float_keys_are_found():
    assert {"trainer.grad_clip", "trainer.early_stopping.min_delta", "loss.label_smoothing", "optimizer.lr",
            "model.dropout", "model.norm_eps", "schedule.warmup_ratio", "data.validation_fraction"} <= set(FLOAT_KEYS)


def override(key: str, value: str) -> str:
    """key=value, or +key=value when the composed tiny config does not hold the key."""
    node = compose_tree("train", TINY)
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return f"+{key}={value}"
        node = node[part]
    return f"{key}={value}"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_nan_and_infinity_are_refused_for_every_float_key(key, value):
    with pytest.raises(ConfigError) as err:
        TrainConfig.compose(tiny(override(key, value)))
    message = str(err.value)
    assert "\n" not in message
    assert key in message and "finite" in message


def test_nan_inside_an_optimizer_option_is_refused_by_its_name():
    with pytest.raises(ConfigError, match=r"optimizer\.momentum=nan must be a finite number"):
        TrainConfig.compose(tiny("optimizer=sgd", "optimizer.momentum=nan"))


@pytest.mark.slow
@pytest.mark.parametrize("change", ["trainer.grad_clip=nan", "trainer.early_stopping.min_delta=nan",
                                    "optimizer.lr=inf"])
def test_tformer_train_refuses_nan_in_one_line(tmp_path, change):
    done = run_tformer("train", *tiny(change), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and change.split("=")[0] in errors[0] and "finite" in errors[0]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("change, key", [("trainer.batch_size=1e30", "trainer.batch_size"),
                                         ("model.d_model=1048576", "model.d_model"),
                                         ("model.max_len=1000000000", "model.max_len"),
                                         ("model.n_layers=50000", "model.n_layers"),
                                         ("embedding_init.vocab_size=1e12", "embedding_init.vocab_size")])
def test_absurd_sizes_are_refused_before_the_data_is_read(tmp_path, change, key):
    from tformer_cli.runs.classify import configure

    missing = tmp_path / "no_such_file.csv"  # the data is never looked at: the size is refused first
    tree = compose_tree("train", tiny("data=files", f"data.train_file={missing}", change))
    with pytest.raises(ConfigError, match=key) as err:
        configure(tree)
    assert "\n" not in str(err.value)


def test_a_config_that_cannot_fit_in_memory_names_what_to_lower():
    # Every size is within its bounds, but together they need a TiB (the layers, and a sinusoidal table of
    # 2^20 x 2^16 floats): more than any machine this runs on
    with pytest.raises(ConfigError) as err:
        TrainConfig.compose(tiny("model.max_len=1048576", "model.d_model=65536", "model.n_heads=1",
                                 "model.d_ff=8"))
    message = str(err.value)
    assert "\n" not in message and "GiB" in message and "lower model.d_model" in message


def test_a_long_max_len_is_not_refused_for_memory_it_may_never_use():
    """Batches are padded to their longest text: max_len=65536 on short texts runs, so it is not refused."""
    TrainConfig.compose(tiny("model.max_len=65536"))  # (no ConfigError)


def test_an_encoder_too_large_for_memory_is_refused_by_its_parameters():
    with pytest.raises(ConfigError, match="parameters.*model.d_model, model.n_layers"):
        TrainConfig.compose(tiny("model.d_model=65536", "model.n_layers=64", "model.d_ff=262144", "model.max_len=8"))


@pytest.mark.slow
def test_tformer_train_refuses_an_oversized_model_in_one_line(tmp_path):
    done = run_tformer("train", *tiny("model.d_model=65536", "model.n_layers=64", "model.d_ff=262144",
                                      "model.max_len=8"), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("error:")][0].count("GiB") >= 2


@pytest.mark.parametrize("kw", [{}, {"positions": "learned", "norm": "pre"}, {"head_hidden": 7, "embedding_dim": 12},
                                {"embedding_norm": True, "n_layers": 0, "pooling": "mean"},
                                {"embedding_projection": "after_norm", "embedding_dim": 12, "embedding_norm": True,
                                 "positions": "learned"},
                                {"embedding_projection": "after_norm", "embedding_dim": 12},
                                {"positions": "rotary", "norm": "pre", "bias": False, "feed_forward": "gated",
                                 "first_block_norm": False, "embedding_norm": True, "local_window": 4,
                                 "global_every": 3, "n_layers": 4, "head_hidden": 7},  # ModernBERT's knobs
                                {"feed_forward": "gated", "bias": False, "embedding_dim": 12},
                                {"attention": "disentangled", "positions": "none", "embedding_norm": True,
                                 "relative_buckets": 8, "max_relative_positions": 32, "embedding_dim": 12},  # DeBERTa
                                {"attention": "disentangled", "relative_buckets": 4, "max_relative_positions": 0,
                                 "bias": False, "norm": "pre"}])
def test_state_shapes_are_the_models_state_dict(kw):
    cfg = EncoderConfig(vocab_size=50, num_classes=3, d_model=16, n_heads=2, d_ff=24, max_len=10, **kw)
    model = TransformerClassifier(cfg)
    assert cfg.state_shapes() == {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert cfg.num_parameters() == model.num_parameters()


def test_a_model_json_claiming_50000_layers_is_refused_with_little_memory(tmp_path):
    ckpt = make_checkpoint(tmp_path / "best")
    for layers, d_model in ((50_000, 16), (1000, 4096)):  # past the bound; within it but not the weights' shape
        config = json.loads(ckpt.model_config.read_text())
        ckpt.model_config.write_text(json.dumps({**config, "n_layers": layers, "d_model": d_model}))
        reseal(ckpt)
        code = ("import resource, sys\nfrom tformer_cli import checkpoint\nfrom tformer_cli.errors import "
                "TformerError\ntry:\n    checkpoint.load(sys.argv[1])\nexcept TformerError as e:\n    print(e)\n"
                "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)\n")
        done = subprocess.run([sys.executable, "-c", code, str(ckpt.path)], capture_output=True, text=True,
                              timeout=300)
        message, peak_mb = done.stdout.strip().splitlines()
        assert "n_layers" in message or "do not match model.json" in message, message
        assert int(peak_mb) < 1024, f"peak RSS {peak_mb} MB"  # (importing torch alone is ~300 MB)


def test_a_sparse_1_gib_metrics_file_is_refused_without_being_read(tmp_path):
    ckpt = make_checkpoint(tmp_path / "best")
    listed = json.loads(ckpt.manifest.read_text())
    with open(ckpt.metrics, "r+b") as f:
        f.truncate(1 << 30)  # sparse: no disk used, but reading it would take a GiB of memory
    code = ("import resource, sys\nfrom tformer_cli import checkpoint\nfrom tformer_cli.errors import "
            "TformerError\ntry:\n    checkpoint.load(sys.argv[1])\nexcept TformerError as e:\n    print(e)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)\n")
    for step in ("as written", "manifest claims its size"):
        if step == "manifest claims its size":
            listed["metrics.json"]["bytes"] = 1 << 30
            ckpt.manifest.write_text(json.dumps(listed))
        done = subprocess.run([sys.executable, "-c", code, str(ckpt.path)], capture_output=True, text=True,
                              timeout=300)
        message, peak_mb = done.stdout.strip().splitlines()
        assert "metrics.json" in message and ("changed after it was written" in message
                                              or "more than such a file ever holds" in message), message
        assert int(peak_mb) < 1024, f"peak RSS {peak_mb} MB"


@pytest.mark.parametrize("file, change, expected", [
    ("model.json", lambda c: {**c, "dropout": float("nan")}, "NaN where a number is expected"),
    ("model.json", lambda c: {**c, "norm_eps": float("inf")}, "Infinity where a number is expected"),
    ("meta.json", lambda m: {**m, "head_tokens": "many"}, "head_tokens='many'"),
    ("meta.json", lambda m: {**m, "long_text": "chunks", "chunk_overlap": 500}, "chunk_overlap"),
    ("labels.json", lambda labels: ["neg", "neg"], "names 'neg' more than once"),
    ("tokenizer.json", lambda t: {**t, "added_tokens": [{"id": 1.5}]}, "tokenizer.json is unreadable"),
])
def test_saved_values_of_the_wrong_type_or_range_are_one_line(tmp_path, file, change, expected):
    ckpt = make_checkpoint(tmp_path / "best")
    path = ckpt.path / file
    path.write_text(json.dumps(change(json.loads(path.read_text()))))  # (json.dumps writes NaN and Infinity)
    reseal(ckpt)
    with pytest.raises(TformerError) as err:
        from tformer_cli import checkpoint

        checkpoint.load(ckpt)
    assert expected in str(err.value) and "\n" not in str(err.value)


def bert_like_folder(tmp_path, config: dict):
    folder = tmp_path / config.get("model_type", "bert")
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "tokenizer.json").write_text("{}")
    return folder


@pytest.mark.parametrize("model_type", ["gpt2", "t5"])
def test_a_pretrained_folder_of_an_unread_family_is_refused_by_name(tmp_path, model_type):
    folder = bert_like_folder(tmp_path, {"model_type": model_type, "dim": 768, "n_layers": 6})
    with pytest.raises(TformerError) as err:
        TrainConfig.compose(tiny("model=pretrained", f"model.pretrained={folder}"))
    message = str(err.value)
    assert f"'{model_type}'" in message and "supported model_type values: bert," in message
    assert "distilbert" in message and "xlm-roberta" in message
    assert "\n" not in message


def test_a_pretrained_config_with_a_wrong_value_names_the_key(tmp_path):
    folder = bert_like_folder(tmp_path, {"model_type": "bert", "hidden_size": 384, "num_hidden_layers": "six",
                                         "num_attention_heads": 12, "intermediate_size": 1536})
    with pytest.raises(TformerError, match="num_hidden_layers='six'"):
        TrainConfig.compose(tiny("model=pretrained", f"model.pretrained={folder}"))


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    from tformer_cli import Classifier

    ckpt = make_checkpoint(tmp_path_factory.mktemp("api") / "best")
    return Classifier.load(ckpt.path, device="cpu")


@pytest.mark.parametrize("kwargs, error", [({"top_k": 1.5}, TypeError), ({"top_k": "2"}, TypeError),
                                           ({"top_k": True}, TypeError), ({"batch_size": 2.5}, TypeError),
                                           ({"top_k": 0}, ValueError), ({"batch_size": -1}, ValueError)])
def test_api_arguments_are_checked(classifier, kwargs, error):
    with pytest.raises(error) as err:
        classifier.predict(["a b c"], **kwargs)
    assert list(kwargs)[0] in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, TformerError)  # (the CLI and the server print it as one line too)
    if "batch_size" in kwargs:
        with pytest.raises(error):
            classifier.predict_proba(["a b c"], **kwargs)


def test_api_train_refuses_a_string_of_overrides():
    from tformer_cli import train

    with pytest.raises(TypeError, match="list of key=value strings"):
        train("model=small")


def damaged_run(tmp_path):
    run = tmp_path / "run"
    make_checkpoint(run / "checkpoints" / "best", config_yaml="model: {d_model: 16}\nseed: 1\n")
    return run


@pytest.mark.slow
@pytest.mark.parametrize("file, text", [("history.json", "{not json"),
                                        ("history.json", '[{"epoch": 1, "train_loss": "low"}]'),
                                        ("history.json", '{"epoch": 1}'),
                                        ("test_metrics.json", '{"n": 3}')])
def test_report_on_a_damaged_run_file_is_one_line(tmp_path, file, text):
    run = damaged_run(tmp_path)
    (run / "history.json").write_text("[]")
    (run / file).write_text(text)
    done = run_tformer("report", str(run), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and file in errors[0] and "damaged" in errors[0]


def test_finite_rule_covers_values_given_in_python():
    with pytest.raises(ConfigError, match="model.dropout=nan"):
        EncoderConfig(vocab_size=10, num_classes=2, dropout=float("nan"))
    assert torch.isfinite(torch.tensor(EncoderConfig(vocab_size=10, num_classes=2).norm_eps))


@pytest.mark.parametrize("change", ["optimizer.betas=[0.9,.inf]", "optimizer.eps=abc", "optimizer.betas=[0.9,1.5]"])
def test_an_optimizers_own_keys_are_checked_before_the_data_is_read(change):
    """`.inf` reaches the config as a string, and torch would compare it with a float after the data loaded."""
    with pytest.raises(ConfigError, match="optimizer=adamw refuses its settings"):
        TrainConfig.compose(tiny(change))
