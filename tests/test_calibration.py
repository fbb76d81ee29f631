"""Calibrated probabilities (evaluation/calibration.py): the temperature fit, ECE / Brier / NLL against hand
computations, and end to end: training saves T in the best checkpoint, and every consumer (Classifier, predict,
evaluate, serve's classifier, the ONNX runtime) gives softmax(logits / T), with a way back to the raw numbers."""
import json
import math
import shutil

import numpy as np
import pytest

from helpers import TINY_TRAINING, copy_run, run_tformer, tiny
from tformer_cli import Classifier, TformerError, train
from tformer_cli.evaluation import artifacts, calibration
from tformer_cli import checkpoint
from tformer_cli.store.layout import RunDir


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def calibrated_set(n=4000, k=3, seed=0):
    """Logits and labels drawn from softmax(logits): a perfectly calibrated model (T = 1) on a hand-made set."""
    rng = np.random.default_rng(seed)
    z = rng.normal(scale=1.5, size=(n, k))
    y = np.array([rng.choice(k, p=p) for p in softmax(z)])
    return z, y


def test_temperature_undoes_a_deliberately_overconfident_model():
    z, y = calibrated_set()
    loud = 10 * z  # the same model, its logits scaled x10: right as often, far too sure
    t = calibration.fit_temperature(loud, y, multi_label=False)
    assert 8.5 < t < 11.5, t
    before, after = calibration.metrics(loud, y, False, None), calibration.metrics(loud, y, False, t)
    assert after["nll"] < 0.5 * before["nll"]
    assert after["ece"] < 0.05 < 0.2 < before["ece"]
    assert after["brier"] < before["brier"]
    assert before["ece"] == after["ece_raw"] and before["nll"] == after["nll_raw"]
    # a temperature never changes the decision
    assert (calibration.probabilities(loud, t).argmax(1) == loud.argmax(1)).all()
    # the calibrated model itself is left about where it is
    assert 0.9 < calibration.fit_temperature(z, y, multi_label=False) < 1.1


def test_per_label_temperatures_for_a_multi_label_model():
    rng = np.random.default_rng(1)
    z = rng.normal(scale=2.0, size=(3000, 3))
    y = (rng.random(z.shape) < 1 / (1 + np.exp(-z))).astype(int)
    t = calibration.fit_temperature(z * np.array([10.0, 1.0, 0.25]), y, multi_label=True)
    assert isinstance(t, list) and len(t) == 3
    assert 8 < t[0] < 12 and 0.85 < t[1] < 1.15 and 0.2 < t[2] < 0.3, t
    y[:, 1] = 0  # a label never on in this split says nothing about its scale: left at 1
    assert calibration.fit_temperature(z, y, multi_label=True)[1] == 1.0


def test_the_fit_is_bounded_and_finite_where_nll_has_no_minimum():
    z = np.array([[3.0, -3.0], [-2.0, 2.0], [4.0, 0.0]])
    y = np.array([0, 1, 0])  # all right: the NLL falls for ever as T -> 0, saying nothing of how sure to be
    t = calibration.fit_temperature(z, y, multi_label=False)
    assert t == 1.0 and calibration.fit_temperature(z, y, False, keep=2.5) == 2.5  # (as trained; a refit: its own)
    assert calibration.fit_temperature(np.vstack([z, [[1.0, 0.0]]]), np.array([0, 1, 0, 1]), False) != 1.0  # (a miss)
    tied = np.array([[5.0, 5.0, 0.0], [0.0, 4.0, 1.0], [3.0, 0.0, 0.0]])  # (all right, one tie at the top: still)
    assert calibration.fit_temperature(tied, np.array([0, 1, 0]), False, keep=1.7) == 1.7
    assert calibration.kept_note(tied, np.array([0, 1, 0]), False).startswith(" (kept as it was: every text answered")
    assert calibration.kept_note(np.tile([[0.1, 0.0]], (100, 1)), np.r_[np.zeros(99, int), 1], False) == ""
    timid = np.tile([[0.1, 0.0]], (100, 1))  # right 99 times in 100 but unsure: much surer is right (T at its bound)
    assert calibration.fit_temperature(timid, np.r_[np.zeros(99, int), 1], False) == calibration.T_MIN
    separable = np.array([[2.0, -1.0], [-3.0, 0.5], [1.0, 2.0], [-1.0, -2.0]])  # label 0 split at 0; label 1 not
    got = calibration.fit_temperature(separable, np.array([[1, 0], [0, 1], [1, 0], [0, 1]]), True, keep=[3.0, 3.0])
    assert got[0] == 3.0 and got[1] != 3.0
    assert calibration.fit_temperature(np.zeros((0, 2)), np.zeros(0, dtype=int), False) == 1.0
    assert calibration.fit_temperature(np.array([[np.nan, 0.0]]), np.array([0]), False) == 1.0
    same = calibration.fit_temperature(np.zeros((5, 2)), np.array([0, 1, 0, 1, 1]), False)
    assert math.isfinite(same) and calibration.T_MIN <= same <= calibration.T_MAX
    assert calibration.fit_temperature(z, y, False) == t  # deterministic


def test_ece_and_brier_match_hand_computations():
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.45, 0.55]])
    y = np.array([0, 1, 1, 0])
    # top-class confidences 0.9, 0.8, 0.7, 0.55 in 15 bins of width 1/15: (0.8667, 0.9333] holds 0.9;
    # (0.7333, 0.8] holds 0.8; (0.6667, 0.7333] holds 0.7; (0.5333, 0.6] holds 0.55 -- one each
    # |acc - conf|: |1 - 0.9|, |0 - 0.8|, |1 - 0.7|, |0 - 0.55|, each weighing 1/4
    assert calibration.ece(probs, y) == pytest.approx((0.1 + 0.8 + 0.3 + 0.55) / 4)
    # ||p - onehot||^2: 0.1^2 + 0.1^2, 0.8^2 + 0.8^2, 0.3^2 + 0.3^2, 0.55^2 + 0.55^2
    assert calibration.brier(probs, y) == pytest.approx((0.02 + 1.28 + 0.18 + 0.605) / 4)
    # two texts in one bin, (0.8, 1]: |mean acc - mean conf| = |1/2 - 0.875|; 0.8 itself is the bin below's
    assert calibration.ece(np.array([[0.9, 0.1], [0.85, 0.15]]), np.array([0, 1]), bins=5) == pytest.approx(0.375)
    assert calibration.ece(np.array([[0.9, 0.1], [0.8, 0.2]]), np.array([0, 1]), bins=5) == pytest.approx(0.45)
    # multi-label: every label's probability is an event (p, y)
    p = np.array([[0.9, 0.2], [0.6, 0.1]])
    on = np.array([[1, 0], [0, 0]])
    # bins of 15: 0.9, 0.6, 0.2, 0.1 each alone: |1-0.9|, |0-0.6|, |0-0.2|, |0-0.1|
    assert calibration.ece(p, on, multi_label=True) == pytest.approx((0.1 + 0.6 + 0.2 + 0.1) / 4)
    assert calibration.brier(p, on, multi_label=True) == pytest.approx((0.01 + 0.04 + 0.36 + 0.01) / 4)
    # NLL from logits, as by hand
    z = np.log(probs)
    assert calibration.nll(z, y, False) == pytest.approx(-np.mean(np.log([0.9, 0.2, 0.7, 0.45])))
    assert calibration.nll(np.array([[0.0]]), np.array([[1]]), True) == pytest.approx(math.log(2))


def test_saved_temperatures_are_checked():
    assert calibration.checked(None, 3, False) is None
    assert calibration.checked(1.5, 3, False) is None
    assert calibration.checked([1.0, 2.0, 0.5], 3, True) is None
    for bad in (0, -1.0, float("nan"), float("inf"), True, "2", [1.0]):
        assert calibration.checked(bad, 3, False) is not None, bad
    for bad in ([1.0, 2.0], [1.0, 0.0, 1.0], 1.5, [1.0, float("nan"), 1.0]):
        assert calibration.checked(bad, 3, True) is not None, bad


def test_reliability_diagram_is_written(tmp_path):
    z, y = calibrated_set(n=500)
    curves = {"raw": calibration.reliability(calibration.probabilities(10 * z), y, False),
              "calibrated": calibration.reliability(softmax(z), y, False)}
    path = artifacts.reliability_diagram_png(tmp_path / "r.png", curves, False, "test $x$", temperature=10.0)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- end to end: the shared tiny run (conftest.tiny_run: long_text=chunks, 2 epochs) ----

@pytest.mark.slow  # trains
def test_training_saves_t_and_classifier_applies_it(tiny_run):
    best = checkpoint.load(tiny_run.best_checkpoint)
    t = best.temperature
    assert isinstance(t, float) and calibration.T_MIN <= t <= calibration.T_MAX
    log = RunDir(tiny_run.run_dir).log("train").read_text()
    assert f"temperature {calibration.describe(t)}" in log and "validation ECE" in log
    assert checkpoint.load(RunDir(tiny_run.run_dir).last).temperature is None  # (only best is calibrated)

    clf = Classifier.load(tiny_run.run_dir, device="cpu")
    texts = ["a gripping, beautifully shot film", "dull and far too long " * 12, "   "]
    calibrated = clf.predict_proba(texts)
    raw = clf.predict_proba(texts, calibrated=False)
    # the document logits (windows averaged), and exactly softmax(logits / T)
    _, filled, windows = clf._encode(texts)
    logits = clf._document_logits(windows, 64)
    np.testing.assert_allclose(raw[filled], softmax(logits), atol=1e-6)
    np.testing.assert_allclose(calibrated[filled], softmax(logits / t), atol=1e-6)
    assert np.isnan(calibrated[2]).all()
    assert not np.allclose(calibrated[filled], raw[filled], atol=1e-4)
    same, unscaled = clf.predict(texts[:2], top_k=2), clf.predict(texts[:2], top_k=2, calibrated=False)
    assert [r["label"] for r in same] == [r["label"] for r in unscaled]
    assert [r["probability"] for r in same] == [round(float(p), 6) for p in calibrated[:2].max(1)]
    assert [r["probability"] for r in unscaled] == [round(float(p), 6) for p in raw[:2].max(1)]
    clf.calibrated = False  # the attribute: raw unless a call asks otherwise
    np.testing.assert_array_equal(clf.predict_proba(texts[:2]), raw[:2])
    np.testing.assert_array_equal(clf.predict_proba(texts[:2], calibrated=True), calibrated[:2])
    with pytest.raises(TformerError, match="calibrated"):
        clf.predict_proba(texts[:1], calibrated="no")

    m = tiny_run.test_metrics
    assert m["temperature"] == t
    for key in ("ece", "brier", "nll", "ece_raw", "brier_raw", "nll_raw"):
        assert math.isfinite(m[key]), key
    assert m["nll_raw"] == pytest.approx(m["loss"], rel=1e-5)
    assert (RunDir(tiny_run.run_dir).test_report / "reliability_diagram.png").is_file()


@pytest.mark.slow  # trains, runs the CLI
def test_predict_raw_flag(tiny_run, tmp_path):
    text = "a gripping, beautifully shot film"
    args = ("predict", text, "--json", "--checkpoint", str(tiny_run.run_dir), "--device", "cpu")
    default, raw = (run_tformer(*args, *extra, cwd=tmp_path) for extra in ((), ("--raw",)))
    assert default.returncode == 0 and raw.returncode == 0, default.stderr + raw.stderr
    a, b = json.loads(default.stdout), json.loads(raw.stdout)
    clf = Classifier.load(tiny_run.run_dir, device="cpu")
    assert a["label"] == b["label"]
    assert a["probability"] == pytest.approx(float(clf.predict_proba([text]).max()), abs=1e-6)
    assert b["probability"] == pytest.approx(float(clf.predict_proba([text], calibrated=False).max()), abs=1e-6)
    assert a["probability"] != b["probability"]


@pytest.mark.slow  # trains, exports
def test_onnx_runtime_gives_the_calibrated_probabilities(tiny_run, tmp_path):
    pytest.importorskip("onnxruntime")
    from tformer_cli.deploy.export import export_onnx
    from tformer_cli.deploy.onnx_classifier import OnnxClassifier

    run = copy_run(tiny_run.run_dir, tmp_path / "run")
    export_onnx(run)
    onnx, torch_clf = OnnxClassifier.load(run), Classifier.load(run, device="cpu")
    assert onnx.temperature == torch_clf.temperature is not None
    texts = ["a gripping, beautifully shot film", "dull and far too long " * 12, "fine", ""]
    for calibrated in (True, False):
        got = onnx.predict_proba(texts, calibrated=calibrated)
        want = torch_clf.predict_proba(texts, calibrated=calibrated)
        np.testing.assert_allclose(got, want, atol=1e-4, equal_nan=True)
    assert not np.allclose(onnx.predict_proba(texts[:3]), onnx.predict_proba(texts[:3], calibrated=False), atol=1e-3)
    # an edited export.json temperature is refused by name (its manifest entry edited too: past the digest check)
    from tformer_cli.store.atomic import sha256_file
    from tformer_cli.store.layout import ExportDir

    export = ExportDir(onnx.path)
    info = json.loads(export.info.read_text())
    export.info.write_text(json.dumps({**info, "temperature": -1.0}))
    listed = json.loads(export.manifest.read_text())
    listed[export.info.name] = {"sha256": sha256_file(export.info), "bytes": export.info.stat().st_size}
    export.manifest.write_text(json.dumps(listed))
    with pytest.raises(TformerError, match="temperature"):
        OnnxClassifier.load(run)


@pytest.mark.slow  # trains
def test_edited_temperature_is_refused_and_missing_means_t_1(tiny_run, tmp_path):
    run = copy_run(tiny_run.run_dir, tmp_path / "run")
    best = RunDir(run).best
    checkpoint.update_meta(best, {"temperature": 0.0})
    with pytest.raises(TformerError, match="temperature=0.0"):
        checkpoint.load(best)
    checkpoint.update_meta(best, {"temperature": None})  # removed: an older checkpoint's meta
    loaded = checkpoint.load(best)
    assert "temperature" not in loaded.meta and loaded.temperature is None
    clf = Classifier.load(run, device="cpu")
    text = ["a gripping, beautifully shot film"]
    np.testing.assert_array_equal(clf.predict_proba(text), clf.predict_proba(text, calibrated=False))


@pytest.mark.slow  # trains
def test_calibrate_false_saves_no_temperature(tmp_path):
    result = train(tiny("trainer.calibrate=false"), run_dir=tmp_path / "run", quiet=True)
    assert checkpoint.load(result.best_checkpoint).temperature is None
    m = result.test_metrics
    assert m["temperature"] is None and m["ece"] == m["ece_raw"] and m["nll"] == m["nll_raw"]


@pytest.mark.slow  # trains
def test_with_many_classes_the_temperature_takes_a_sample_and_the_cuts_every_text(tmp_path, monkeypatch):
    monkeypatch.setattr(calibration, "FIT_ENTRIES", 20)  # (2 classes: a sample of 10 validation texts)
    result = train(tiny(), run_dir=tmp_path / "run", quiet=True)
    n = checkpoint.load(result.best_checkpoint).conformal["n"]
    log = (result.run_dir / "train.log").read_text()
    assert n > 10 and f"a seeded sample of 10 of the {n:,} validation texts" in log


@pytest.mark.slow  # trains
def test_multi_label_gets_one_temperature_per_label_and_the_same_label_sets(tmp_path):
    from test_multi_label import make

    rows = make(400, 1)
    data = {"text": [t for t, _ in rows], "label": [ls for _, ls in rows]}
    result = train(["data.multi_label=true", *tiny("trainer.epochs=2", "embedding_init.vocab_size=200",
                                                   "optimizer.lr=3e-3", base=TINY_TRAINING)],
                   data=data, run_dir=tmp_path / "run", quiet=True)
    loaded = checkpoint.load(result.best_checkpoint)
    t = loaded.temperature
    assert isinstance(t, list) and len(t) == len(loaded.label_names)
    assert all(calibration.T_MIN <= x <= calibration.T_MAX for x in t)
    clf = Classifier.load(result.run_dir, device="cpu")
    texts = [t for t, _ in make(20, 7)]
    cal, raw = clf.predict(texts), clf.predict(texts, calibrated=False)
    # the same sets (each listed most probable first by the numbers it shows: per-label T may reorder them)
    assert [sorted(r["labels"]) for r in cal] == [sorted(r["labels"]) for r in raw]
    assert any(r["labels"] for r in cal)
    probs = clf.predict_proba(texts)
    for r, p in zip(cal, probs):  # the label set is cut at the thresholds on calibrated probabilities
        assert r["labels"] == [n for n, c in sorted(zip(clf.labels, p), key=lambda x: -x[1])
                               if c >= clf.thresholds[clf.labels.index(n)]]


@pytest.mark.slow  # trains, starts a server process
def test_serve_is_calibrated_unless_raw_is_asked(tiny_run, tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from test_serve import Server

    text = ["a gripping, beautifully shot film"]
    clf = Classifier.load(tiny_run.run_dir, device="cpu")
    calibrated, raw = (float(clf.predict_proba(text, calibrated=c).max()) for c in (True, False))
    server = Server(f"checkpoint={tiny_run.run_dir}", cwd=tmp_path)
    try:
        answer = lambda path, body: server.request(path, body)[1]["predictions"][0]["probability"]
        assert answer("/predict", text) == pytest.approx(calibrated, abs=1e-5)
        assert answer("/predict", {"texts": text, "raw": True}) == pytest.approx(raw, abs=1e-5)
        assert answer("/predict?raw=true", text) == pytest.approx(raw, abs=1e-5)
        assert answer("/predict?raw=0", {"texts": text, "raw": False}) == pytest.approx(calibrated, abs=1e-5)
        status, body = server.request("/predict", {"texts": text, "raw": "yes"})
        assert status == 400 and "raw" in body["error"]
        status, body = server.request("/predict?raw=true", {"texts": text, "raw": False})
        assert status == 400 and "disagree" in body["error"]
        assert server.request("/health")[1]["temperature"] == clf.temperature
    finally:
        server.stop()


@pytest.mark.slow  # trains, runs the CLI
def test_evaluate_reports_calibration_before_and_after(tiny_run, tmp_path):
    r = run_tformer("evaluate", f"checkpoint={tiny_run.run_dir}", "split=test", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = sorted((tmp_path / "outputs" / "evaluate").glob("*/*/metrics.json"))[-1]
    m = json.loads(out.read_text())
    assert m["temperature"] == checkpoint.load(tiny_run.best_checkpoint).temperature
    for key in ("brier", "nll", "brier_raw", "nll_raw"):  # the test split, as training scored it (other batches:
        assert m[key] == pytest.approx(tiny_run.test_metrics[key], abs=1e-3), key  # float noise; ECE's bins are
    assert 0 <= m["ece"] <= 1 and 0 <= m["ece_raw"] <= 1  # discontinuous in it, so only its range)
    assert m["nll"] < m["nll_raw"]  # fitted on validation, and better on test here too
    assert (out.parent / "reliability_diagram.png").is_file()
    assert "calibration (temperature" in r.stdout


def test_thresholds_move_with_the_temperature_and_decide_the_same_labels():
    rng = np.random.default_rng(0)
    z = rng.normal(0, 4, size=(500, 3))
    raw_cuts, temps = [0.3, 0.5, 0.8], [2.5, 0.7, 9.0]
    moved = calibration.rescaled_thresholds(raw_cuts, temps)
    raw_sets = 1 / (1 + np.exp(-z)) >= np.array(raw_cuts)
    calibrated_sets = 1 / (1 + np.exp(-z / np.array(temps))) >= np.array(moved)
    assert (raw_sets == calibrated_sets).all() and moved != raw_cuts
    refit = calibration.rescaled_thresholds(moved, [1.5, 1.5, 1.5], temps)  # a refit starts from the raw cuts
    np.testing.assert_allclose(refit, calibration.rescaled_thresholds(raw_cuts, [1.5, 1.5, 1.5]), atol=1e-12)
    np.testing.assert_allclose(calibration.rescaled_thresholds(moved, None, temps), raw_cuts, atol=1e-12)


@pytest.mark.parametrize("multi_label, temperature", [(False, 1.7), (True, [0.5, 1.0, 2.0, 1.3, 0.9])])
def test_probabilities_taken_a_block_of_rows_at_a_time_are_the_whole_arrays(monkeypatch, multi_label, temperature):
    """A multi-label evaluation's texts x labels would be copied several times over in float64: probabilities are
    taken a block of rows at a time past BLOCK_ENTRIES numbers, with the same result."""
    logits = np.random.default_rng(0).normal(size=(23, 5)) * 4
    whole = calibration.probabilities(logits, temperature, multi_label)
    monkeypatch.setattr(calibration, "BLOCK_ENTRIES", 12)  # (blocks of 2 rows)
    blocked = calibration.probabilities(logits, temperature, multi_label)
    assert blocked.dtype == np.float32 and np.array_equal(blocked, whole)
