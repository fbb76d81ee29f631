"""The Python API: train() and Classifier, in-process, with the same configs and checkpoints as the CLI."""
import json

import numpy as np
import pandas as pd
import pytest

import tformer_cli
from tformer_cli import Classifier, TformerError, audit, distill, train
from tformer_cli.overrides import as_overrides


@pytest.fixture(scope="module")
def result(tiny_run):
    """train()'s answer: the session's shared tiny run (conftest.py), trained with this API."""
    return tiny_run


@pytest.mark.slow
def test_train_returns_the_run(result):
    assert result.run_dir.is_dir() and (result.best_checkpoint / "model.safetensors").is_file()
    assert [h["epoch"] for h in result.history] == [1, 2]  # TINY_RUN trains 2 epochs
    assert result.monitor == "val_accuracy"
    assert result.best_value == max(h["val_accuracy"] for h in result.history)
    assert result.test_metrics["n"] == 100 and 0 <= result.test_metrics["accuracy"] <= 1
    assert json.loads((result.run_dir / "history.json").read_text()) == result.history
    assert "trainer:" in (result.run_dir / "train.log").read_text()


@pytest.mark.slow
def test_classifier_predicts_in_order_with_empty_texts_marked(result):
    clf = result.classifier()
    assert isinstance(clf, Classifier) and clf.labels == ["negative", "positive"]
    texts = ["the film was great", "   ", "the film was never boring"]
    out = clf.predict(texts, top_k=2)
    assert [r["text"] for r in out] == texts and out[1]["empty"] and out[1]["label"] is None
    for r in (out[0], out[2]):
        assert r["label"] in clf.labels and len(r["top_k"]) == 2 and r["top_k"][0]["label"] == r["label"]
    probs = clf.predict_proba(texts)
    assert probs.shape == (3, 2) and np.isnan(probs[1]).all()
    np.testing.assert_allclose(probs[[0, 2]].sum(axis=1), 1.0, atol=1e-5)
    assert out[0]["probability"] == pytest.approx(float(probs[0].max()), abs=1e-5)
    explained = clf.explain(["the film was great"], method="rollout")[0]["explanation"]
    assert sum(explained["rollout"]) == pytest.approx(1.0, abs=1e-4)
    assert len(explained["tokens"]) == len(explained["last_layer"])
    frame = pd.DataFrame({"text": texts, "label": [1, 0, 1]})
    assert [r["text"] for r in clf.predict(frame["text"])] == texts  # a Series is texts; a frame or a dict is not:
    for wrong, words in ((frame, "not a DataFrame, whose iteration gives its column names or keys: pass its text "
                                 "column"), ({"a": "b"}, "not a dict"),
                         (None, "not NoneType"), (["ok", None], r"texts\[1\] is NoneType \(None\), not a string"),
                         ([b"bytes"], r"texts\[0\] is bytes")):  # (they were labelled as if texts, or a TypeError)
        with pytest.raises(TformerError, match=words):
            clf.predict(wrong)
        with pytest.raises(TformerError, match=words):
            clf.predict_proba(wrong)


@pytest.mark.slow  # a `tformer` process
def test_the_cli_and_the_api_give_the_same_answers(result, tmp_path):
    from helpers import run_tformer

    r = run_tformer("predict", f"--checkpoint={result.run_dir}", "--json", "--top-k", "2", "the film was great",
                    cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {k: v for k, v in result.classifier().predict(["the film was great"], top_k=2)[0]
                                    .items()}


def test_errors_are_tformer_errors_with_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TformerError, match="trainer.epochs"):
        train(["trainer.epochs=0"])
    with pytest.raises(TformerError, match="does not exist"):
        Classifier.load(tmp_path / "nowhere")
    with pytest.raises(TformerError, match="only"):
        train(["-m", "trainer.epochs=1,2"])
    with pytest.raises(TformerError, match=r"^train\(\): trainer.epochs is given twice \(trainer.epochs=1 and "
                                           r"trainer.epochs=2\); give it once$"):
        train(["trainer.epochs=1", "trainer.epochs=2"])
    assert not list(tmp_path.glob("outputs/train/*/*"))  # refused runs leave no folder


def test_wrong_types_are_one_line_errors_naming_the_function_called(tmp_path, monkeypatch):
    """Each refused before any training, as a TformerError of one line, never a TypeError or Hydra's traceback."""
    monkeypatch.chdir(tmp_path)
    df = pd.DataFrame({"text": ["a fine film", "dull"], "label": ["pos", "neg"]})
    cases = [(lambda: train(None, data=df), "train() takes a list of key=value strings"),
             (lambda: audit(None, data=df), "audit() takes a list of key=value strings"),
             (lambda: train({"trainer.epochs=1": 2}, data=df),
              "put the value in the dict's value: train({'trainer.epochs': ...})"),
             (lambda: audit({"trainer.epochs=1": 2}, data=df), "audit({'trainer.epochs': ...})"),
             (lambda: train(["trainer.epochz=1"], data=df), "did you mean trainer.epochs?"),  # Hydra's, in one line
             (lambda: train(["trainer.epochs"], data=df), "could not read an override"),
             (lambda: audit(["trainer.epochz=1"], data=df), "audit(): trainer.epochz is not a setting"),
             (lambda: Classifier.load(5), "checkpoint=5 must be a path (str or pathlib.Path)"),
             (lambda: train(["trainer.devices=2"], data=df), "start it from a shell, `tformer train ... trainer.dev"),
             (lambda: train([f"resume={tmp_path / 'gone'}"], data=df), "gone does not exist; pass the run directory"),
             (lambda: train(data=[1, 2]), "(texts, labels) pair, e.g. data=(['a fine film'"),
             (lambda: audit(data=[1, 2]), "not a list of int"),
             (lambda: train({"optimizer.lr": float("nan")}, data=df), "nan is not a finite number"),
             (lambda: audit({"trainer.epochs": object()}, data=df), "audit({'trainer.epochs'"),
             (lambda: distill({"optimizer.lr": float("inf")}), "distill({'optimizer.lr': inf}): inf is not a finite"),
             (lambda: audit(["data=files"], data=df), "audit(data=...) reads the data given"),
             (lambda: train(data=df.iloc[:0]), "data= has no rows"),
             (lambda: train(data=df, validation_data={"text": [], "label": []}), "validation_data= has no rows")]
    for call, message in cases:
        with pytest.raises(TformerError) as caught:
            call()
        assert message in str(caught.value) and "\n" not in str(caught.value), (message, str(caught.value))
    assert not [p for task in ("train", "audit", "distill") for p in tmp_path.glob(f"outputs/{task}/*/*")]


def test_a_word_beyond_ascii_is_quoted_for_hydra():
    """Hydra's grammar reads no unquoted é or ü: a class named café failed as an unparsable override."""
    assert as_overrides({"data.label_names": ["café", "tea"], "data.text_column": "Überschrift"}) == [
        "data.label_names=['café',tea]", "data.text_column='Überschrift'"]


def test_numpy_scalars_are_the_numbers_and_bools_they_hold(tmp_path, monkeypatch):
    given = {"trainer.epochs": np.int64(3), "optimizer.lr": np.float64(0.5), "trainer.test_after_fit": np.bool_(False),
             "data.label_names": [np.str_("null"), "b"]}
    assert as_overrides(given) == ["trainer.epochs=3", "optimizer.lr=0.5", "trainer.test_after_fit=false",
                                   "data.label_names=['null',b]"]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TformerError, match="trainer.epochs=0 must be at least 1"):  # read as 0, past the types
        train({"trainer.epochs": np.int64(0)}, data=pd.DataFrame({"text": ["a", "b"], "label": ["x", "y"]}))


@pytest.mark.slow  # a fresh interpreter
def test_the_package_import_stays_light():
    import subprocess
    import sys

    code = "import sys, tformer_cli; print(sorted(m for m in ('torch', 'hydra', 'datasets') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "[]"
    assert tformer_cli.__version__
