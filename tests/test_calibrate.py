"""`tformer calibrate`: a checkpoint's temperature and label-set cuts refitted on labelled texts it never trained on,
written as a new checkpoint beside an untouched original; refusals in one line."""
import csv
import json

import numpy as np
import pytest

from helpers import compose_config, run_tformer
from tformer_cli.data import demo
from tformer_cli.errors import ConfigError
from tformer_cli.runs.config import CalibrateConfig


def typed(*overrides):
    return CalibrateConfig.from_hydra(compose_config("calibrate", *overrides), overrides)


@pytest.mark.parametrize("spelling", ["file=recent.csv", "test_file=recent.csv", "data.test_file=recent.csv"])
def test_a_file_under_any_of_its_spellings_is_what_it_fits_on(spelling):
    config = typed(spelling)
    assert (config.split, config.test_file) == ("test", "recent.csv")
    assert config.data_config({"name": "files", "train_file": "t.csv"}, "run").test_file.endswith("recent.csv")
    assert typed("split=validation").split == "validation" and typed("split=validation").test_file is None


@pytest.mark.parametrize("overrides, words", [
    ((), "say which texts to calibrate on"),  # training calibrated on validation already: no silent default
    (("file=",), "file= is empty"),
    (("split=train",), "split=train is what the model learned from"),
    (("file=a.csv", "split=validation"), "file= and split=validation both say"),
    (("file=a.csv", "split=test"), "file= and split=test both say"),  # (the run's test split is not the file)
    (("file=a.csv", "test_file=b.csv"), "give file= alone"),
    (("file=a.csv", "+long_text=chunks"), "not a calibrate key"),
])
def test_what_cannot_be_fitted_on_is_refused_in_one_line(overrides, words):
    with pytest.raises(ConfigError, match=words):
        typed(*overrides)


def _write(path, texts, labels):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(zip(texts, labels))
    return path


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_a_refit_is_a_new_checkpoint_with_the_same_answers_and_the_original_untouched(tiny_run, tmp_path):
    from tformer_cli import Classifier

    run = tiny_run.run_dir
    best = run / "checkpoints" / "best"
    before = {f.name: f.read_bytes() for f in best.iterdir()}
    texts, labels = demo.splits(300, 100, 200, seed=11)["test"]  # drawn like the run's data, texts it never saw
    recent = _write(tmp_path / "recent.csv", texts, labels)
    r = run_tformer("calibrate", f"checkpoint={run}", f"file={recent}", "precision=fp32",
                    f"hydra.run.dir={tmp_path / 'cal'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "calibration on 200 texts" in r.stdout and "new checkpoint" in r.stdout
    assert {f.name: f.read_bytes() for f in best.iterdir()} == before  # the original is as it was

    meta = json.loads((tmp_path / "cal" / "checkpoints" / "best" / "meta.json").read_text())
    assert meta["calibrated_on"]["texts"] == 200 and meta["calibrated_on"]["file"].endswith("recent.csv")
    assert meta["conformal"]["n"] == 200 and meta["temperature"] > 0
    assert not (tmp_path / "cal" / "checkpoints" / "best" / "trainer_state.json").exists()  # no resume state
    old, new = Classifier.load(run), Classifier.load(tmp_path / "cal")
    probe = ["a gripping, beautifully shot film", "dull and lifeless", "not bad at all", "a film"]
    assert [a["label"] for a in new.predict(probe)] == [a["label"] for a in old.predict(probe)]  # same answers
    raw_old, raw_new = old.predict_proba(probe, calibrated=False), new.predict_proba(probe, calibrated=False)
    np.testing.assert_allclose(raw_new, raw_old, atol=1e-6)  # the same weights: only the temperature moved
    scaled = np.exp(np.log(raw_new) / meta["temperature"])
    np.testing.assert_allclose(new.predict_proba(probe), scaled / scaled.sum(axis=1, keepdims=True), atol=1e-5)
    assert all("label_set" in a for a in new.predict(probe, coverage=0.9))

    # what it reports the old cuts covered is what evaluate reports for the old checkpoint on the same file
    fit = json.loads((tmp_path / "cal" / "metrics.json").read_text())
    assert fit["nll"] <= fit["nll_before"] + 1e-9  # (what the fit lowers on these texts; ECE may move either way)
    r = run_tformer("evaluate", f"checkpoint={run}", f"test_file={recent}", "precision=fp32",
                    f"hydra.run.dir={tmp_path / 'ev'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    evaluated = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert fit["coverage_before"]["0.90"] == evaluated["label_sets"]["0.90"]["coverage"]
    assert fit["coverage_before_expected"]["0.90"] == evaluated["label_sets"]["0.90"]["expected"]
    assert "expected (95%)" in r.stdout
    # evaluate names what a refitted checkpoint's sets were fitted on
    r = run_tformer("evaluate", f"checkpoint={tmp_path / 'cal'}", "split=validation", "precision=fp32",
                    f"hydra.run.dir={tmp_path / 'ev2'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "fitted on 200 texts of recent.csv (tformer calibrate)" in " ".join(r.stdout.split())

    # `tformer report` of the refit says what it did
    r = run_tformer("report", str(tmp_path / "cal"), cwd=tmp_path)
    assert r.returncode == 0 and "on 200 texts of recent.csv" in " ".join(r.stdout.split()), r.stdout[-2000:]
    assert f"log loss {fit['nll_before']:.4f} -> {fit['nll']:.4f}" in " ".join(r.stdout.split())
    low, high = fit["coverage_before_expected"]["0.90"]
    assert f"fitted on: {low:.3f} to {high:.3f} at 0.90" in " ".join(r.stdout.split())
    assert "did not finish" not in r.stdout

    # what it must not fit on: one line each, and no folder left behind
    train_texts, train_labels = demo.splits(300, 100, 100, 0)["train"]
    bad = {"other labels": (["a text"] * 60, ["spam", "ham"] * 30),
           "too few": (texts[:20], labels[:20]),
           "training texts": (train_texts[:80], train_labels[:80]),
           "one class": ([t for t, y in zip(texts, labels) if y == labels[0]], [labels[0]] * 200)}
    for name, (rows, ys) in bad.items():
        path = _write(tmp_path / f"{name.replace(' ', '_')}.csv", rows, ys)
        r = run_tformer("calibrate", f"checkpoint={run}", f"file={path}", f"hydra.run.dir={tmp_path / 'cal2'}",
                        cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, name
        assert not (tmp_path / "cal2").exists(), name
        assert {"other labels": "not seen in training", "too few": "too few to calibrate on",
                "training texts": "the model's training texts", "one class": "are of one class"}[name] in r.stderr, \
            r.stderr
