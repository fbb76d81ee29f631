"""`tformer evaluate` on a new labelled file: read with the run's own data settings unless a data.<key> says
otherwise, under either spelling (test_file= or data.test_file=); a file whose columns differ is one line."""
import csv
import json

import pandas as pd
import pytest

from helpers import compose_config, run_tformer
from tformer_cli.data import demo
from tformer_cli.errors import ConfigError
from tformer_cli.runs.config import EvaluateConfig

# A run trained on files with its own column names (what `tformer train data=files ...` saves in its config)
SAVED = {"name": "files", "train_file": "/data/train.csv", "text_column": "review", "label_column": "sentiment",
         "label_names": None, "text_separator": " | ", "label_offset": 1}


def write_csv(path, columns, n=30, seed=7):
    """`n` labelled demo sentences (their integer labels) under the given (text, label) column names."""
    texts, labels = demo.splits(300, 100, n, seed)["test"]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(zip(texts, labels))
    return path


def typed(*overrides):
    return EvaluateConfig.from_hydra(compose_config("evaluate", *overrides), overrides)


@pytest.mark.parametrize("overrides", [
    ("data.test_file=new.csv",),
    ("test_file=new.csv",),
    ("data=files", "data.train_file=/data/train.csv", "data.test_file=new.csv"),
])
def test_a_new_file_is_read_with_the_runs_column_settings(overrides):
    cfg = typed(*overrides).data_config(SAVED, "run")
    assert (cfg.name, cfg.text_column, cfg.label_column, cfg.text_separator, cfg.label_offset) == (
        "files", "review", "sentiment", " | ", 1)
    assert cfg.test_file.endswith("new.csv") and cfg.train_file == "/data/train.csv"


def test_a_runs_splits_are_carved_as_it_carved_them():
    """data=<the run's dataset> does not bring that config's split keys over the run's: a 20 Newsgroups run saved
    without data.group_column (random validation rows) is evaluated on those rows, not on whole threads some of
    which it trained on; a typed key still wins."""
    saved = {"name": "twenty_newsgroups", "dir": "/d/ng", "remove": ["headers", "footers", "quotes"],
             "validation_fraction": 0.3}
    assert typed("data=twenty_newsgroups", "split=validation").data_config(saved, "run").group_column is None
    assert typed("split=validation").data_config(saved, "run").validation_fraction == 0.3
    assert typed("data=twenty_newsgroups").data_config({**saved, "group_column": "thread"}, "run").group_column == \
        "thread"
    assert typed("data=twenty_newsgroups", "data.group_column=thread").data_config(saved, "run").group_column == \
        "thread"


def test_typed_data_keys_win_over_the_runs():
    config = typed("data.test_file=new.csv", "data.text_column=body", "data.header=false", "+data.column_names=[b,y]",
                   "data.label_offset=0")
    cfg = config.data_config(SAVED, "run")
    assert (cfg.label_column, cfg.label_offset) == ("sentiment", 0)
    # how the new file is laid out is that file's alone: the run's train split (read too) keeps its own columns
    assert (cfg.text_column, cfg.header) == ("review", True)
    assert config.file_layout(SAVED) == {"text_column": "body", "header": False, "column_names": ["b", "y"]}
    config = typed("data=files", "data.train_file=t.csv", "data.label_column=y")
    cfg = config.data_config(SAVED, "run")
    assert (cfg.text_column, cfg.label_column, cfg.train_file) == ("review", "y", "t.csv")
    assert config.file_layout(SAVED) == {}  # (new training data too: the keys are the whole data's)
    assert typed("data.text_column=body").file_layout(SAVED) == {}  # (no new file: the run's own splits)
    assert typed("test_file=new.csv", "data.text_column=body").file_layouts(SAVED) == {"test": {"text_column": "body"}}


def test_a_new_files_layout_reads_that_file_alone_not_the_runs_validation_file(tmp_path):
    """The run's own data.validation_file is one of the files given for a split too: read with the run's layout."""
    from helpers import data_config
    from tformer_cli.data import sources

    train = write_csv(tmp_path / "train.csv", ["text", "label"], n=60, seed=1)
    val = write_csv(tmp_path / "val.csv", ["text", "label"], n=20, seed=2)
    new = write_csv(tmp_path / "new.csv", ["body", "label"], n=20, seed=3)
    cfg = data_config("files", train_file=str(train), validation_file=str(val), test_file=str(new))
    data = sources.load(cfg, file_layouts={"test": {"text_column": "body"}})
    assert {s: len(data.splits[s]) for s in ("train", "validation", "test")} == {"train": 60, "validation": 20,
                                                                                  "test": 20}


def test_a_new_multi_label_files_label_separator_is_that_files_alone(tmp_path):
    """label_separator parsed every split: a new file written with ";" could not be read beside a run's ","."""
    from helpers import data_config
    from tformer_cli.data import sources

    rows = lambda n, sep: pd.DataFrame({"text": [f"text {i}" for i in range(n)],  # noqa: E731
                                        "labels": [sep.join(["a", "b"][: 1 + i % 2]) for i in range(n)]})
    rows(60, ",").to_csv(tmp_path / "train.csv", index=False)  # (the default separator)
    rows(20, ";").to_csv(tmp_path / "new.csv", index=False)
    cfg = data_config("files", train_file=str(tmp_path / "train.csv"), test_file=str(tmp_path / "new.csv"),
                      label_column="labels", multi_label=True)
    data = sources.load(cfg, file_layouts={"test": {"label_separator": ";"}})
    assert data.label_names == ["a", "b"] and data.splits["test"]["label"][:2] == [[0], [0, 1]]
    assert typed("test_file=new.csv", "data.label_separator=';'").file_layouts(SAVED) == {
        "test": {"label_separator": ";"}}


def test_both_spellings_name_the_same_file_and_score_it_whole(tmp_path, monkeypatch):
    """data.test_file=rel.csv was looked up in the run's data.dir first (test_file= in the working directory), and
    the run's max_eval_samples scored a seeded part of the new file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "new.csv").write_text("review,sentiment\n")
    saved = {**SAVED, "dir": "/data", "max_eval_samples": 100}
    for key in ("test_file", "data.test_file"):
        cfg = typed(f"{key}=new.csv").data_config(saved, "run")
        assert (cfg.test_file, cfg.max_eval_samples) == (str(tmp_path / "new.csv"), None)
    assert typed("test_file=new.csv", "max_samples=50").data_config(saved, "run").max_eval_samples == 50
    assert typed("data.dir=/data").data_config(saved, "run").max_eval_samples == 100  # (the run's own test split)


def test_another_dataset_is_read_as_its_own_config_says():
    cfg = typed("data=ag_news").data_config(SAVED, "run")
    assert cfg.name == "ag_news" and cfg.text_column != "review"


def test_both_spellings_with_different_files_are_refused():
    with pytest.raises(ConfigError, match="test_file=a.csv and data.test_file=b.csv disagree"):
        typed("test_file=a.csv", "data.test_file=b.csv").data_config(SAVED, "run")


def test_no_saved_config_asks_for_the_data():
    with pytest.raises(ConfigError, match="pass data=<name>"):
        typed("data.test_file=new.csv").data_config(None, "run")


@pytest.mark.slow
def test_both_spellings_score_a_new_csv_with_the_run(tiny_run, tmp_path):
    new = write_csv(tmp_path / "new.csv", ["text", "label"])
    metrics = []
    for n, key in enumerate(("test_file", "data.test_file")):
        out = tmp_path / f"eval{n}"
        result = run_tformer("evaluate", f"checkpoint={tiny_run.run_dir}", f"{key}={new}", f"hydra.run.dir={out}",
                             cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "new.csv (30 examples" in result.stdout  # (the title names the file scored)
        metrics.append(json.loads((out / "metrics.json").read_text()))
    assert metrics[0]["n"] == metrics[1]["n"] == 30
    assert metrics[0]["accuracy"] == metrics[1]["accuracy"]
    assert metrics[0]["confusion_matrix"] == metrics[1]["confusion_matrix"]


@pytest.mark.slow
def test_a_new_file_with_its_own_columns_is_scored_with_the_runs_data_read_as_trained(tiny_run, tmp_path):
    """The documented `data.test_file=new.csv data.text_column=body` applied the column to the run's train split
    too (read for the overlap checks), which has no such column."""
    same = write_csv(tmp_path / "same.csv", ["text", "label"])
    other = write_csv(tmp_path / "other.csv", ["body", "category"])
    metrics = []
    for n, args in enumerate(([f"test_file={same}"],
                              [f"data.test_file={other}", "data.text_column=body", "data.label_column=category"])):
        out = tmp_path / f"eval{n}"
        result = run_tformer("evaluate", f"checkpoint={tiny_run.run_dir}", *args, f"hydra.run.dir={out}",
                             cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        metrics.append(json.loads((out / "metrics.json").read_text()))
    assert metrics[0]["n"] == metrics[1]["n"] == 30
    assert metrics[0]["confusion_matrix"] == metrics[1]["confusion_matrix"]


@pytest.mark.slow
def test_a_file_without_labels_is_sent_to_predict(tiny_run, tmp_path):
    blank = tmp_path / "blank.csv"
    blank.write_text("text,label\na good film,\na dull film,\n")
    refused = run_tformer("evaluate", f"checkpoint={tiny_run.run_dir}", f"test_file={blank}", cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert f"{blank} has no labels (every label cell is empty or -1)" in refused.stderr
    assert f"tformer predict --file {blank}" in refused.stderr


@pytest.mark.slow
def test_a_file_with_other_columns_is_refused_in_one_line_naming_them(tiny_run, tmp_path):
    new = write_csv(tmp_path / "other.csv", ["review", "label"])
    refused = run_tformer("evaluate", f"checkpoint={tiny_run.run_dir}", f"data.test_file={new}",
                          f"hydra.run.dir={tmp_path / 'refused'}", cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.strip().count("\n") == 0 and "Traceback" not in refused.stderr
    assert "it has columns review, label" in refused.stderr and "data.text_column" in refused.stderr
    assert not (tmp_path / "refused" / "metrics.json").exists()


def test_a_demo_runs_sizes_do_not_follow_it_to_files():
    """evaluate of a demo run with data=files kept the demo's data.n_train, which files data refuses."""
    from tformer_cli.typed_config import plain

    saved = plain(compose_config("train"))["data"]
    cfg = typed("data=files", "data.train_file=/data/train.csv", "data.test_file=new.csv").data_config(saved, "run")
    assert (cfg.name, cfg.n_train, cfg.n_validation, cfg.n_test) == ("files", None, None, None)
    assert typed("test_file=new.csv").data_config(saved, "run").n_train == saved["n_train"]  # (the demo's own)
