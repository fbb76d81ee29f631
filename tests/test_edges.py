"""The small things a newcomer meets in the first hour: the loss in the first epoch's bar, a hint for labels
numbered from 1, Ctrl-C said as a stop (not an error), --explain's weights in a file, pretraining's curves, and
the Python API's dict overrides, in-memory data and quiet mode."""
import random
import re

import pandas as pd
import pytest

from helpers import TINY_TRAINING, compose_config, data_config, run_tformer, tiny
from tformer_cli import TformerError, cli, train
from tformer_cli.console import output
from tformer_cli.data import sources
from tformer_cli.evaluation.answers import plain_explanation
from tformer_cli.runs.pretraining import pretrain
from tformer_cli.store.layout import RunDir
from tformer_cli.training.loop import Interrupted
from tformer_cli.typed_config import plain


def write_csv(path, labels):
    rows = [f"text {i} {'good' if y % 2 else 'bad'} words,{y}" for i, y in enumerate(labels)]
    path.write_text("text,label\n" + "\n".join(rows) + "\n")
    return path


def test_labels_numbered_from_one_suggest_label_offset(tmp_path):
    p = write_csv(tmp_path / "train.csv", [1, 2, 3] * 20)
    with pytest.raises(TformerError, match=r"numbered from 1; add data\.label_offset=1") as refused:
        sources.load(data_config("files", train_file=str(p)))
    assert "\n" not in str(refused.value)
    data = sources.load(data_config("files", train_file=str(p), label_offset=1))  # the hint, taken, works
    assert data.label_names == ["0", "1", "2"] and set(data.splits["train"]["label"][:]) == {0, 1, 2}


def test_labels_with_a_gap_are_not_told_to_shift(tmp_path):
    p = write_csv(tmp_path / "train.csv", [1, 3] * 20)  # 1..K with a hole: an offset would not fix it
    with pytest.raises(TformerError, match="renumber the label column") as refused:
        sources.load(data_config("files", train_file=str(p)))
    assert "label_offset" not in str(refused.value)


@pytest.mark.parametrize("stop", [cli.Stopped(), Interrupted("interrupted at epoch 1, step 3; the last checkpoint "
                                                              "is saved; resume with: tformer train resume=x")])
def test_ctrl_c_is_a_plain_line_with_exit_code_130(stop, capsys):
    with pytest.raises(SystemExit) as ended:
        cli._fail(stop)
    err = capsys.readouterr().err.splitlines()
    assert ended.value.code == 130
    assert len(err) == 1 and err[0].startswith("interrupted") and "error" not in err[0], err


def test_a_user_error_keeps_its_error_prefix(capsys):
    with pytest.raises(SystemExit) as ended:
        cli._fail(TformerError("trainer.epochs=0 must be at least 1"))
    assert ended.value.code == 2 and capsys.readouterr().err == "error: trainer.epochs=0 must be at least 1\n"


def test_a_redirected_explanation_carries_each_words_weight():
    result = {"label": "positive", "probability": 0.91,
              "explanation": {"tokens": ["[CLS]", "super", "##b", "film", "[SEP]"], "rollout": [0.1, 0.3, 0.2, 0.3, 0.1]}}
    assert plain_explanation(result).plain == "positive 0.910 [rollout]: superb(0.50) film(0.30)"
    result["explanation"] = {"method": "occlusion", "words": ["superb", "film", "!"], "weights": [0.4, -0.05, 0.0]}
    assert plain_explanation(result).plain == "positive 0.910 [occlusion]: superb(+0.40) film(-0.05) !(+0.00)"


@pytest.mark.slow  # a `tformer predict` process
def test_predict_explain_into_a_file_prints_the_weights(tiny_run, tmp_path):
    r = run_tformer("predict", "--explain", f"--checkpoint={tiny_run.run_dir}", "the film was great", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    w = r"\([+-]\d\.\d\d\)"
    assert re.search(rf"\d\.\d{{3}} \[occlusion\]: the{w} film{w} was{w} great{w}", r.stdout), r.stdout


@pytest.mark.slow  # trains in a `tformer` process
def test_the_first_epochs_bar_shows_the_loss_on_small_data(tmp_path):
    """10 batches, a loss logged every 20 steps: the bar still shows a loss from its first step."""
    r = run_tformer("train", *TINY_TRAINING, "data.n_train=300", "data.n_validation=50", "data.n_test=50",
                    "trainer.test_after_fit=false", cwd=tmp_path, env={"TFORMER_PROGRESS_SECONDS": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    bar = [line for line in r.stderr.splitlines() if line.startswith("epoch 1/1: ")]
    assert bar[0].startswith("epoch 1/1: 1/10 batches") and re.search(r"loss \d+\.\d{4}", bar[0]), bar


@pytest.mark.slow  # pretrains
def test_pretraining_writes_training_curves(tmp_path):
    run = RunDir(tmp_path / "run")
    pretrain(plain(compose_config("pretrain", *tiny("model=tiny", "data.n_train=200", "data.n_validation=50"))), run)
    assert run.training_curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def reviews(n=160, seed=0):
    rng = random.Random(seed)
    words = {"pos": ["great", "superb", "lovely", "fine"], "neg": ["awful", "dull", "boring", "bad"]}
    labels = ["pos" if i % 2 else "neg" for i in range(n)]
    return [" ".join(rng.choice(words[y]) for _ in range(6)) for y in labels], labels


@pytest.mark.slow  # trains twice in-process
def test_the_api_takes_a_dict_lists_or_a_dataframe_and_can_be_quiet(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    overrides = dict(o.split("=", 1) for o in TINY_TRAINING)
    texts, labels = reviews()
    result = train(overrides, data=(texts, labels), test_data=reviews(40, seed=1), quiet=True)
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # quiet: nothing on the screen; the run log still has it all
    assert "epoch   1/1" in (result.run_dir / "train.log").read_text()
    assert result.test_metrics["n"] == 40 and [h["epoch"] for h in result.history] == [1]
    config = (result.best_checkpoint / "config.yaml").read_text()
    assert "name: files" in config and "train.parquet" in config  # a data=files run like any other
    # the same data as a DataFrame: the same stored file
    again = train({**overrides, "trainer.epochs": 2}, data=pd.DataFrame({"text": texts, "label": labels}))
    assert [h["epoch"] for h in again.history] == [1, 2]
    assert not output().screen.quiet  # quiet=True lasted for its own call only
    assert len(list((tmp_path / "outputs" / "data").glob("*/train.parquet"))) == 1


@pytest.mark.parametrize("call, message", [
    (lambda: train({"trainer.epochs": object()}), "a value must be a string"),
    (lambda: train(data=(["a", "b"], [0])), "2 texts and 1 labels"),
    (lambda: train(data="reviews.csv"), "takes a pandas DataFrame"),
    (lambda: train(["data=imdb"], data=(["a", "b"], [0, 1])), "drop data=imdb"),
    (lambda: train(test_data=(["a"], [0])), "go with data="),
    (lambda: train(quiet="yes"), "must be True or False"),
])
def test_the_api_refuses_what_it_cannot_take_in_one_line(call, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TformerError, match=message) as refused:
        call()
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "outputs").exists()  # refused before anything was written
