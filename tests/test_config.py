"""Real Hydra composition of every option of every config group, checked against what the code builds."""
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tformer_cli.cli import config_dir
from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier
from tformer_cli.training import optim, schedules

GROUPS = {g: sorted(p.stem for p in (Path(config_dir()) / g).glob("*.yaml"))
          for g in ("model", "data", "optimizer", "schedule", "embedding_init", "trainer")}


def compose_train(*overrides):
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides), return_hydra_config=False)


def test_every_group_has_the_promised_options():
    assert GROUPS["model"] == ["base", "small", "tiny"]
    assert GROUPS["data"] == ["ag_news", "demo", "files", "imdb", "news_category", "sst2", "twenty_newsgroups"]
    assert GROUPS["optimizer"] == ["adam", "adamw", "sgd"]
    assert GROUPS["schedule"] == ["constant", "cosine", "linear_warmup", "noam"]
    assert GROUPS["embedding_init"] == ["bert", "minilm", "random"]


def test_defaults_are_the_demo_setup():
    cfg = compose_train()
    assert (cfg.model.d_model, cfg.data.name, cfg.optimizer.name, cfg.embedding_init.name) == (64, "demo", "adamw", "random")
    assert cfg.optimizer.lr == cfg.model.recommended_lr


@pytest.mark.parametrize("name", GROUPS["model"])
def test_model_options_build_the_described_encoder(name):
    cfg = compose_train(f"model={name}")
    m = EncoderConfig.from_dict({**OmegaConf.to_container(cfg.model), "vocab_size": 100, "num_classes": 2})
    expected = {"tiny": (2, 64, 4, 128), "small": (2, 256, 4, 1024), "base": (6, 512, 8, 2048)}[name]
    assert (m.n_layers, m.d_model, m.n_heads, m.d_ff) == expected
    model = TransformerClassifier(m)
    assert len(model.blocks) == expected[0]
    assert model.blocks[0].ff.up.weight.shape == (expected[3], expected[1])
    if name == "small":  # the notebook's IMDB model
        assert (m.max_len, m.dropout, m.norm, m.positions, m.pooling) == (256, 0.1, "post", "sinusoidal", "cls")


@pytest.mark.parametrize("name", GROUPS["optimizer"])
def test_optimizer_options(name):
    cfg = compose_train(f"optimizer={name}", "model=small")
    opt = optim.build(torch.nn.Linear(3, 3), cfg.optimizer, 1.0, torch.device("cpu"))
    assert type(opt).__name__.lower() == name
    if name == "adamw":
        assert opt.param_groups[0]["betas"] == (0.9, 0.999) and cfg.optimizer.weight_decay == 1e-5


def test_optimizer_lr_override_wins_over_model_recommendation():
    assert compose_train("optimizer.lr=5e-5").optimizer.lr == 5e-5


@pytest.mark.parametrize("name", GROUPS["schedule"])
def test_schedule_options(name):
    cfg = compose_train(f"schedule={name}")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = schedules.build(opt, cfg.schedule, total_steps=100)
    assert 0 < sched.get_last_lr()[0] <= 1.0


@pytest.mark.parametrize("name", GROUPS["data"])
def test_data_options(name):
    cfg = compose_train(f"data={name}")
    assert cfg.data.name == name
    if name == "twenty_newsgroups":
        assert list(cfg.data.remove) == ["headers", "footers", "quotes"]
    if name == "imdb":
        assert cfg.data.hub_id == "stanfordnlp/imdb" and cfg.data.validation_fraction == 0.2


@pytest.mark.parametrize("name", GROUPS["embedding_init"])
def test_embedding_init_options(name):
    cfg = compose_train(f"embedding_init={name}")
    assert cfg.embedding_init.name == name
    if name != "random":
        assert cfg.embedding_init.freeze_epochs == 1


def test_evaluate_config_composes_with_and_without_data():
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        assert compose(config_name="evaluate").get("data") is None
        assert compose(config_name="evaluate", overrides=["data=imdb"]).data.name == "imdb"
