"""model.max_len=auto (training/recipe.py): the length fitted to the training texts, its ceilings, and an explicit
number always winning over it."""
import json
import re

import pytest
import yaml

from helpers import run_tformer, tiny, train_config
from tformer_cli.errors import ConfigError
from tformer_cli.training import recipe


def test_the_99th_percentile_is_kept_and_one_outlier_in_a_hundred_is_cut():
    assert recipe.fitted_length([10] * 99 + [200], cap=512) == 16  # 99% fit in 10, rounded up to 16
    assert recipe.fitted_length([10] * 98 + [200] * 2, cap=512) == 200  # 2% long: they are kept


@pytest.mark.parametrize("lengths, cap, expected", [
    ([17, 17, 17], 512, 24),  # rounded up to a multiple of 8
    ([3, 4], 512, 8),  # never below 8
    ([300] * 10, 256, 256),  # never above the ceiling (model.max_len_limit / the model's positions)
    ([], 64, 64),  # no texts: the ceiling
])
def test_fitted_length_rounds_up_within_its_bounds(lengths, cap, expected):
    assert recipe.fitted_length(lengths, cap) == expected


def test_token_lengths_count_special_tokens_and_ignore_the_tokenizers_truncation():
    from tformer_cli.data import tokenization

    tok = tokenization.train_wordpiece(["a b c d e f g h"] * 20, 100, 4)  # truncates to 4 tokens
    tok.enable_truncation(max_length=4)
    assert list(recipe.token_lengths(tok, ["a b c d e f g h", "a"])) == [10, 3]  # [CLS] .. [SEP] included


def test_the_minilm_preset_is_auto_and_an_explicit_number_wins():
    assert recipe.is_auto(train_config("model=minilm_l6").model)
    cfg = train_config("model=minilm_l6", "model.max_len=128")
    assert cfg.model["max_len"] == 128 and not recipe.is_auto(cfg.model)
    assert recipe.planned_max_len(cfg, ["a text"], None, console=None) == (128, False)


def test_a_limit_below_one_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="model.max_len_limit=0 must be a whole number >= 1"):
        train_config("model=minilm_l6", "model.max_len_limit=0")


@pytest.mark.parametrize("family, table, usable", [("BertConfig", 40, 40), ("RobertaConfig", 42, 40)])
def test_auto_stays_within_a_pretrained_models_positions(tmp_path, family, table, usable):
    import transformers

    config = getattr(transformers, family)(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                           intermediate_size=64, max_position_embeddings=table, pad_token_id=1)
    config.save_pretrained(tmp_path)  # config.json is all the family reads to say its positions
    assert recipe.usable_positions(tmp_path, 256) == usable  # RoBERTa's table holds 2 rows it never uses
    assert recipe.usable_positions(tmp_path, 24) == 24


@pytest.mark.slow  # trains
def test_a_run_with_auto_saves_the_fitted_length_in_model_json(tmp_path):
    r = run_tformer("train", *tiny("model.max_len=auto"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    said = re.search(r"max_len (\d+) \(model\.max_len=auto: the 99th percentile", r.stdout)
    assert said, r.stdout[-2000:]
    best = next((tmp_path / "outputs" / "train").glob("*/*/checkpoints/best"))
    saved = json.loads((best / "model.json").read_text())["max_len"]
    assert saved == int(said.group(1)) and saved % 8 == 0 and saved < 64  # demo sentences are short
    assert yaml.safe_load((best / "config.yaml").read_text())["model"]["max_len"] == "auto"  # the setting as given


def test_auto_lr_is_the_short_text_lr_only_for_short_single_label_texts():
    options = train_config("model=minilm_l6").model_options
    assert recipe.auto_lr(options, [20] * 99 + [500], multi_label=False)[0] == options.lr_short_texts == 2e-4
    assert recipe.auto_lr(options, [20] * 98 + [500] * 2, multi_label=False)[0] == options.lr_texts == 1e-4
    assert recipe.auto_lr(options, [20] * 100, multi_label=True)[0] == 1e-4  # multi-label: measured at lr_texts
    tiny_options = train_config().model_options  # a preset without the two: its recommended_lr
    assert recipe.auto_lr(tiny_options, [20] * 100, multi_label=False)[0] == tiny_options.recommended_lr
    assert recipe.said_auto("Auto") and not recipe.said_auto(1e-4)
    lr, why = recipe.auto_lr(options, [200] * 100, multi_label=False)
    assert lr == 1e-4 and why == "99% of the train texts are at most 200 tokens; model.lr_texts"


def test_the_minilm_preset_chooses_its_lr_and_a_typed_one_wins():
    assert train_config("model=minilm_l6").optimizer.lr == "auto"
    assert train_config("model=minilm_l6", "optimizer.lr=3e-4").optimizer.lr == 3e-4
    assert train_config("model=minilm_l6", "model.recommended_lr=5e-5").optimizer.lr == 5e-5
    for override, message in (("optimizer.lr=fast", "optimizer.lr='fast' must be a number or auto"),
                              ("model.recommended_lr=fast", "='fast' must be a number or auto"),
                              ("model.lr_short_texts=0", "model.lr_short_texts=0.0 must be greater than 0")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            train_config("model=minilm_l6", override)
    with pytest.raises(ConfigError, match="optimizer.lr=auto needs the model's lr"):
        recipe.base_lr(train_config("model=minilm_l6", "model.lr_texts=null").model_options)


@pytest.mark.slow  # trains
def test_auto_lr_is_saved_as_a_number_and_resumed(tmp_path, monkeypatch):
    from tformer_cli import TformerError, train
    from tformer_cli.checkpoint import read_config
    from tformer_cli.store.layout import CheckpointDir
    base = tiny("optimizer.lr=auto", "+model.lr_texts=1e-3", "+model.lr_short_texts=3e-3")
    run = tmp_path / "run"
    train(base, run_dir=run)
    log = next(run.glob("train*.log")).read_text()
    assert "lr 0.003 (optimizer.lr=auto: short texts: 99% of the train texts are at most" in log  # demo sentences
    assert read_config(CheckpointDir(run / "checkpoints" / "last"))["optimizer"]["lr"] == 0.003
    cut = tmp_path / "cut"  # texts longer than SHORT_TEXT_TOKENS read through a shorter max_len are not short
    monkeypatch.setattr(recipe, "SHORT_TEXT_TOKENS", 12)  # (demo sentences: 99% within 17 tokens)
    train(tiny("model.max_len=8", base=base), run_dir=cut)
    assert "lr 0.001 (optimizer.lr=auto: 99% of the train texts are at most" in next(cut.glob("train*.log")).read_text()
    monkeypatch.setattr(recipe, "SHORT_TEXT_TOKENS", 0)  # auto would now say 1e-3: the run's own 3e-3 wins
    with pytest.raises(TformerError, match="already finished"):
        train([*base, f"resume={run}"], run_dir=run)
    longer = train([*tiny("trainer.epochs=2", base=base), f"resume={run}"], run_dir=run)
    assert len(longer.history) == 2 and read_config(CheckpointDir(run / "checkpoints" / "last"))["optimizer"]["lr"] \
        == 0.003


@pytest.mark.slow  # trains
def test_a_run_saved_with_a_number_resumes_under_a_preset_whose_lr_became_auto(tmp_path):
    from tformer_cli import train
    run = tmp_path / "run"
    train(tiny(), run_dir=run)  # the tiny preset's lr, 1e-3, as a number
    longer = train([*tiny("trainer.epochs=2"), "model.recommended_lr=auto", "++model.lr_texts=1e-3",
                    "++model.lr_short_texts=3e-3", f"resume={run}"], run_dir=run)
    assert len(longer.history) == 2  # the run's own 1e-3, though auto would choose 3e-3 for its short texts
    assert "lr 0.003" not in next(run.glob("train*.log")).read_text()
