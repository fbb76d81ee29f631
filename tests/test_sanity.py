"""The data checks at the start of every train and evaluate (data/sanity.py), texts and labels read as written, and
the one rule for a text with nothing to classify."""
import csv
import json

import pytest

from helpers import TINY_RUN, TINY_TRAINING, data_config, run_tformer, train_config
from tformer_cli import Classifier
from tformer_cli.data import sanity, sources, visible
from tformer_cli.errors import TformerError

ZERO_WIDTH = "\u200b\u200d\u0301 \u2060"  # zero-width space and joiner, a combining accent, a word joiner


def write_csv(path, rows, header=("text", "label")):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def reviews(n, start=0):
    return [(f"{'great fine' if i % 2 else 'dull awful'} review number {i}", "None" if i % 2 else "NA")
            for i in range(start, start + n)]


def test_visible_characters_are_what_counts():
    for empty in ("", "   \t\n", ZERO_WIDTH, "\u0301\u0302", "\x00\x7f", "\u3000\u00a0"):
        assert not visible.has_visible(empty), repr(empty)
    for text in ("a", " 7 ", "\u200b.", "e\u0301", "\u4e2d", "\U0001f600", "null"):
        assert visible.has_visible(text), repr(text)


def test_pandas_missing_value_words_are_real_labels_and_texts(tmp_path):
    rows = [(f"text number {i}", ("None", "NA", "null")[i % 3]) for i in range(60)]
    rows += [("null", "None"), ("NaN", "NA"), ("N/A", "null"), ("", "NA"), ("only a label missing", "")]
    path = write_csv(tmp_path / "train.csv", rows)
    with pytest.raises(TformerError, match=r"the train split has an empty label \(row 65\)"):  # the empty cell, only
        sources.load(data_config("files", train_file=str(path)))
    write_csv(path, rows[:-1])
    data = sources.load(data_config("files", train_file=str(path)))
    assert data.label_names == ["NA", "None", "null"]
    texts = set(data.splits["train"]["text"][:]) | set(data.splits["validation"]["text"][:])
    assert {"null", "NaN", "N/A"} <= texts and len(texts) == 63  # only the empty text is dropped
    assert data.dropped == {"train": 1}
    report = sanity.build(data)
    assert report["label_names_read_as_missing_by_pandas"] == ["NA", "None", "null"]
    assert any("'NA', 'None', 'null' are real classes here" in w for w in report["warnings"])


def test_class_names_alike_up_to_case_space_or_unicode_form_are_warned_about(tmp_path):
    names = ["caf\u00e9", "cafe\u0301", "Pos", "pos", " neg", "neg", "other"]  # (NFC and NFD: they look the same)
    path = write_csv(tmp_path / "train.csv", [(f"text number {i}", names[i % 7]) for i in range(70)])
    report = sanity.build(sources.load(data_config("files", train_file=str(path))))
    assert sorted(map(sorted, report["classes_alike"])) == [[" neg", "neg"], ["Pos", "pos"],
                                                            ["cafe\u0301", "caf\u00e9"]]
    assert any("3 group(s) of class names differ only in case, spacing or Unicode form" in w
               for w in report["warnings"])
    assert any("'cafe\\u0301' / 'caf\\xe9'" in w for w in report["warnings"])  # (they print alike: code points)
    scored = sanity.build(sources.load(data_config("files", train_file=str(path))), evaluated="validation")
    assert scored["classes_alike"] == report["classes_alike"] and scored["warnings"] == []  # (evaluate: recorded;
    # only a retrain can act on them, so they are not said there)


def test_class_names_that_are_numbers_among_names_are_warned_about(tmp_path):
    """A CSV label column with `1` among `ENTY`, `HUM` trained a class named "1", unsaid."""
    path = write_csv(tmp_path / "train.csv", [(f"text number {i}", ["ENTY", "HUM", "1"][i % 3]) for i in range(60)])
    report = sanity.build(sources.load(data_config("files", train_file=str(path))))
    assert report["class_names_that_are_numbers"] == ["1"]
    assert any("class name(s) '1' are numbers among names (e.g. 'ENTY')" in w for w in report["warnings"])
    path = write_csv(tmp_path / "ids.csv", [(f"text number {i}", i % 3) for i in range(60)])
    assert sanity.build(sources.load(data_config("files", train_file=str(path))))["warnings"] == []  # (ids alone)


def test_a_text_column_of_numbers_is_read_as_written(tmp_path):
    path = write_csv(tmp_path / "train.csv", [("007", 0), ("1.50", 1)] * 10)
    data = sources.load(data_config("files", train_file=str(path), validation_fraction=0.5))
    assert set(data.splits["train"]["text"][:]) == {"007", "1.50"}
    assert data.label_names == ["0", "1"]  # whole-number labels are still class ids


@pytest.mark.parametrize("names, message", [
    ("neg\npos\nneutral\n", r"labels.txt names 3 classes but the labels use ids 0..1 only \(no row has 'neutral'\)"),
    ("neg\nneg\n", "labels.txt names the class 'neg' more than once"),
])
def test_labels_txt_must_name_each_class_once(tmp_path, names, message):
    write_csv(tmp_path / "train.csv", [(f"text {i}", i % 2) for i in range(20)])
    (tmp_path / "labels.txt").write_text(names)
    with pytest.raises(TformerError, match=message) as caught:
        sources.load(data_config("imdb", dir=str(tmp_path)))
    assert "\n" not in str(caught.value)
    with pytest.raises(TformerError, match=message.replace("labels.txt", "data.label_names")):
        sources.load(data_config("files", train_file=str(tmp_path / "train.csv"),
                                 label_names="[" + ",".join(names.split()) + "]"))


def test_copies_between_splits_are_counted_exact_and_normalized(tmp_path):
    train = [(f"Review number {i} of the set", i % 2) for i in range(40)]
    test = train[:5] + [(f"  REVIEW   number {i} of the set ", i % 2) for i in range(5, 8)] + \
        [(f"fresh text {i}", i % 2) for i in range(12)]
    cfg = data_config("files", train_file=str(write_csv(tmp_path / "train.csv", train)),
                      test_file=str(write_csv(tmp_path / "test.csv", test)),
                      validation_file=str(write_csv(tmp_path / "dev.csv", [(f"new {i}", i % 2) for i in range(8)])))
    report = sanity.build(sources.load(cfg))
    test_overlap = report["overlap_with_train"]["test"]
    assert (test_overlap["rows"], test_overlap["exact"], test_overlap["normalized"]) == (20, 5, 3)
    assert test_overlap["exact_examples"] == ["Review number 0 of the set", "Review number 1 of the set",
                                              "Review number 2 of the set"]
    assert report["overlap_with_train"]["validation"]["exact"] == 0
    assert [w.split(":")[0] for w in report["warnings"]] == ["test", "test"]
    assert "5 of 20 rows (25%) are copies of train texts" in report["warnings"][0]
    evaluated = sanity.build(sources.load(cfg), evaluated="test")  # evaluate compares its one split
    assert list(evaluated["overlap_with_train"]) == ["test"]


def test_the_same_file_twice_is_refused_for_training_and_warned_about_in_evaluation(tmp_path):
    path = write_csv(tmp_path / "train.csv", [(f"text {i}", i % 2) for i in range(20)])
    copy = tmp_path / "copy.csv"
    copy.write_bytes(path.read_bytes())
    for test_file in (path, copy):  # the same path, or the same bytes elsewhere
        data = sources.load(data_config("files", train_file=str(path), test_file=str(test_file)))
        with pytest.raises(TformerError, match=f"data.test_file {test_file} is the train file; .* give a separate "
                                               f"test file, or leave data.test_file out"):
            sanity.build(data)
        report = sanity.build(data, evaluated="test")
        assert report["same_file_as_train"] == ["test"] and "is the training file" in report["warnings"][0]


@pytest.mark.slow
def test_train_prints_and_saves_the_data_report(tmp_path):
    """A real `tformer train`: test rows copied from train are a warning on screen and in data_report.json, and
    classes named None and NA, and texts `null`, train as themselves."""
    train = reviews(80) + [("null", "None"), ("null", "NA"), (ZERO_WIDTH, "NA")]
    write_csv(tmp_path / "train.csv", train)
    write_csv(tmp_path / "test.csv", train[:20] + reviews(10, start=1000))
    write_csv(tmp_path / "dev.csv", reviews(20, start=2000))
    r = run_tformer("train", "data=files", "data.train_file=train.csv", "data.test_file=test.csv",
                    "data.validation_file=dev.csv", *TINY_TRAINING, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "data check 2 warning(s):" in r.stdout
    assert "warning: test: 20 of 30 rows (67%) are copies of train texts (e.g. 'dull awful review number 0')" \
        in r.stdout
    assert "train: skipped 1 text with no visible character" in r.stdout
    run = next(tmp_path.glob("outputs/train/*/*"))
    report = json.loads((run / "data_report.json").read_text())
    assert report["overlap_with_train"]["test"]["exact"] == 20
    assert report["splits"]["train"]["rows"] == 82  # both `null` texts
    assert report["splits"]["train"]["dropped_texts_without_visible_characters"] == 1
    assert Classifier.load(run).labels == ["NA", "None"]


@pytest.mark.slow
def test_train_refuses_the_train_file_as_test_file_in_one_line(tmp_path):
    write_csv(tmp_path / "train.csv", reviews(40))
    r = run_tformer("train", "data=files", "data.train_file=train.csv", "data.test_file=train.csv",
                    *TINY_TRAINING, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout
    assert r.stderr.startswith("error: data.test_file ") and r.stderr.count("\n") == 1, r.stderr
    assert "is the train file" in r.stderr and not list(tmp_path.glob("outputs/train/*/*/data_report.json"))


@pytest.mark.slow
def test_evaluate_warns_about_test_texts_seen_in_training(tiny_run, tmp_path):
    config = train_config(*TINY_RUN)
    data = sources.load(config.data, seed=config.seed)  # what tiny_run trained on
    train = data.splits["train"][:12]
    write_csv(tmp_path / "seen.csv", zip(train["text"], train["label"]))
    r = run_tformer("evaluate", f"checkpoint={tiny_run.run_dir}", f"test_file={tmp_path / 'seen.csv'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "warning: test: 12 of 12 rows (100%) are copies of train texts" in r.stdout
    report = json.loads(next(tmp_path.glob("outputs/evaluate/*/*/data_report.json")).read_text())
    assert report["checked"] == "evaluate test" and report["overlap_with_train"]["test"]["exact"] == 12


@pytest.mark.slow
def test_a_text_of_invisible_characters_is_empty_in_predict(tiny_run, tmp_path):
    answers = tiny_run.classifier().predict([ZERO_WIDTH, "e\u0301", "\u0301"])
    assert [a.get("empty", False) for a in answers] == [True, False, True]
    assert answers[0]["label"] is None and answers[1]["label"] in tiny_run.classifier().labels
    r = run_tformer("predict", "--json", f"--checkpoint={tiny_run.run_dir}", ZERO_WIDTH, "a fine film",
                    cwd=tmp_path)
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert r.returncode == 0, r.stderr[-2000:]
    assert rows[0]["empty"] is True and rows[0]["label"] is None and "empty" not in rows[1]
    assert "[tformer] 1 empty text(s) have no label (marked empty)" in r.stderr
