"""Conformal label sets (evaluation/conformal.py): the coverage promise on generated data with fixed seeds, the
multi-label false-negative control, and the sets a trained checkpoint gives through predict, evaluate and the
Python API."""
import json
import os
import subprocess

import numpy as np
import pytest

from helpers import TFORMER
from tformer_cli.errors import TformerError
from tformer_cli.evaluation import conformal


def _softmax_data(rng, n, classes=10, spread=2.0):
    z = rng.normal(size=(n, classes)) * spread
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    y = (p.cumsum(axis=1) > rng.uniform(size=(n, 1))).argmax(axis=1)  # y drawn from p: a calibrated model
    return p, y


@pytest.mark.parametrize("spread", [0.5, 2.0, 6.0])  # unsure, middling, very sure (sets of one label or none)
def test_single_label_sets_cover_at_the_level_within_the_finite_sample_bound(spread):
    rng = np.random.default_rng(7)
    cal_p, cal_y = _softmax_data(rng, 4000, spread=spread)
    test_p, test_y = _softmax_data(rng, 40000, spread=spread)
    table = conformal.fit_cuts(cal_p, cal_y, False, seed=3)
    tally = conformal.Tally(table, False, seed=11)
    for start in range(0, len(test_p), 1000):
        tally.add(test_p[start:start + 1000], test_y[start:start + 1000])
    result = tally.result()
    for level in (0.8, 0.9, 0.95):
        # coverage given the calibration draw is Beta-distributed around the level (sd ~ sqrt(L(1-L)/n) = 0.005 at
        # n = 4000), plus the test sample's own error (0.0015): 4 sd of both
        assert abs(result[conformal.key(level)]["coverage"] - level) < 0.025, (level, result[conformal.key(level)])
    sizes = [result[conformal.key(x)]["mean_set_size"] for x in (0.8, 0.9, 0.95)]
    assert sizes == sorted(sizes)  # a higher level never gives smaller sets


def test_sets_are_the_most_probable_labels_and_grow_where_the_model_is_unsure():
    rng = np.random.default_rng(0)
    cal_p, cal_y = _softmax_data(rng, 2000)
    cut = conformal.fit_cuts(cal_p, cal_y, False)["cuts"]["0.90"]
    sure = np.array([[0.97, 0.01, 0.01, 0.01]])
    unsure = np.array([[0.3, 0.28, 0.22, 0.2]])
    u = np.array([0.5])
    for p in (sure, unsure):  # a set is a prefix of the ranking
        inside = conformal.sets(p, cut, False, u)[0]
        order = np.argsort(-p[0])
        assert list(inside[order]) == sorted(inside[order], reverse=True)
    assert conformal.sets(unsure, cut, False, u).sum() > conformal.sets(sure, cut, False, u).sum()
    assert conformal.sets(unsure, None, False, u).all()  # no cut (too few texts for the level): every label
    u = conformal.token_uniforms([[([2, 7, 3], None)], [([2, 7, 3], None)], [([2, 8, 3], None)]])
    assert u[0] == u[1] != u[2] and 0 < u.min() and u.max() < 1  # the same reading, the same draw


def test_too_few_calibration_texts_give_every_label_at_high_levels():
    p, y = _softmax_data(np.random.default_rng(0), 9)
    cuts = conformal.fit_cuts(p, y, False)["cuts"]
    assert cuts["0.90"] is not None and cuts["0.95"] is None  # ceil(10 x 0.95) = 10 > 9 texts


def test_a_level_with_too_few_texts_counts_every_label_in_evaluate_as_predict_gives_it():
    rng = np.random.default_rng(2)
    p = rng.uniform(size=(30, 5))
    y = (rng.uniform(size=p.shape) < p).astype(np.int64)
    table = conformal.fit_cuts(p, y, True)
    assert table["cuts"]["0.99"] is None
    tally = conformal.Tally(table, True)
    tally.add(p, y)
    assert tally.result()["0.99"]["mean_set_size"] == 5 and tally.result()["0.99"]["coverage"] == 1.0
    assert conformal.sets(p, None, True).all()


def test_multi_label_sets_keep_the_share_of_true_labels_at_the_level():
    rng = np.random.default_rng(1)

    def draw(n):
        p = rng.uniform(size=(n, 12)) ** 2
        return p, (rng.uniform(size=p.shape) < p).astype(np.int64)

    table = conformal.fit_cuts(*draw(3000), True)
    tally = conformal.Tally(table, True)
    tally.add(*draw(30000))
    for level in (0.8, 0.9, 0.95):
        got = tally.result()[conformal.key(level)]["coverage"]
        assert level - 0.02 < got < level + 0.03, (level, got)  # risk control: at least the level, up to noise
    cuts = [table["cuts"][conformal.key(x)] for x in (0.8, 0.9, 0.95)]
    assert cuts == sorted(cuts, reverse=True)  # a higher level lowers the cut


@pytest.mark.parametrize("multi_label", [False, True])
def test_the_expected_range_holds_the_coverage_of_95_in_100_draws(multi_label):
    """Coverage measured on a few hundred texts drawn like a few hundred calibration texts falls inside the range
    evaluate prints about 95 times in 100 (over 300 seeded draws of both), so a coverage below it is news."""
    rng = np.random.default_rng(5)
    inside = []
    for _ in range(300):
        if multi_label:
            draw = lambda n: (lambda p: (p, (rng.uniform(size=p.shape) < p).astype(np.int64)))(  # noqa: E731
                rng.uniform(size=(n, 6)) ** 2)
        else:
            draw = lambda n: _softmax_data(rng, n, classes=6)  # noqa: E731
        table = conformal.fit_cuts(*draw(500), multi_label, seed=int(rng.integers(1 << 30)))
        tally = conformal.Tally(table, multi_label, seed=int(rng.integers(1 << 30)))
        tally.add(*draw(400))
        row = tally.result()["0.90"]
        inside.append(row["expected"][0] <= row["coverage"] <= row["expected"][1])
    assert 0.9 <= np.mean(inside) <= 0.99, np.mean(inside)
    assert conformal.expected_range(0.95, 9, 100, False) == (1.0, 1.0)  # no cut: every label, coverage 1
    low, high = conformal.expected_range(0.9, 545, 499, False)  # a calibration and a test split of ~500 texts
    assert 0.86 < low < 0.87 and 0.93 < high < 0.94  # (several points wide: one seed is one draw)
    # the exact Beta-binomial range of 100 calibration texts is skewed: longer below the level than above it
    low, high = conformal.expected_range(0.95, 100, 5000, False)
    assert 0.95 - low > high - 0.95 > 0


def test_a_coverage_below_its_range_is_said_once_with_the_fix():
    rows = {"0.80": {"coverage": 0.79, "expected": [0.75, 0.85]}, "0.90": {"coverage": 0.84, "expected": [0.86, 0.94]},
            "0.95": {"coverage": 0.90, "expected": [0.92, 0.98]}}
    line = conformal.below_expected(rows)
    assert "coverage at 0.90 is 0.8400, below the 0.860 to 0.940" in line and "tformer calibrate" in line
    # one level is judged (0.90): three would tell texts drawn like the calibration texts they differ 1 time in 14
    assert conformal.below_expected({**rows, "0.90": {"coverage": 0.87, "expected": [0.86, 0.94]}}) is None
    assert conformal.below_expected({"0.90": {"coverage": 0.5}}) is None  # (a table without ranges: nothing said)


@pytest.mark.parametrize("value, words", [(0.905, "two decimals"), (1.0, "two decimals"), ("x", "a number"),
                                          (10 ** 400, "a number"),
                                          (True, "two decimals"), (float("nan"), "two decimals")])
def test_a_level_off_the_grid_is_refused_by_name(value, words):
    assert words in conformal.level_of(value)


def test_a_table_edited_into_nonsense_is_named():
    whole = {conformal.key(x): 0.8 for x in conformal.LEVELS}
    assert conformal.checked({"method": "aps", "cuts": whole}, False) is None
    assert conformal.checked({"method": "aps", "cuts": whole | {"0.90": "x"}}, False)
    assert conformal.checked({"method": "aps", "cuts": {"0.90": 0.8}}, False)  # levels missing
    assert conformal.checked({"method": "aps", "cuts": whole}, True)  # a single-label table
    assert conformal.checked([1, 2], False)


def test_a_static_model_must_pool_by_the_mean():
    from tformer_cli.errors import ConfigError
    from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier

    with pytest.raises(ConfigError, match="pooling=mean"):
        TransformerClassifier(EncoderConfig(vocab_size=20, num_classes=2, n_layers=0, positions="none",
                                            pooling="cls"))


@pytest.mark.slow
def test_a_trained_run_saves_its_cuts_and_predict_and_evaluate_use_them(tiny_run):
    from tformer_cli import Classifier

    run = tiny_run.run_dir
    meta = json.loads((run / "checkpoints" / "best" / "meta.json").read_text())
    assert meta["conformal"]["method"] == "aps" and meta["conformal"]["n"] > 0
    clf = Classifier.load(run)
    texts = ["a gripping, beautifully shot film", "dull and lifeless", "a film"]
    answers = clf.predict(texts, coverage=0.9)
    assert all(set(a["label_set"]) <= set(clf.labels) and a["coverage"] == 0.9 for a in answers)
    assert clf.predict(texts, coverage=0.9) == answers  # the same text, the same set
    assert all(len(a["label_set"]) == 2 for a in clf.predict(texts, coverage=0.99)) or \
        meta["conformal"]["cuts"]["0.99"] is not None
    assert "label_set" not in clf.predict(texts)[0]  # the default answer stays one label
    blank = clf.predict(["", "dull"], coverage=0.9)[0]  # (a reader of label_set finds the key on every answer)
    assert blank["empty"] and blank["label_set"] is None and blank["coverage"] == 0.9
    metrics = json.loads((run / "test_metrics.json").read_text())
    assert set(metrics["label_sets"]["0.90"]) == {"coverage", "mean_set_size", "empty", "expected"}
    low, high = metrics["label_sets"]["0.90"]["expected"]
    assert low < 0.9 < high
    assert (run / "test_report" / "label_sets.png").is_file()
    r = subprocess.run([TFORMER, "predict", f"--checkpoint={run}", "--coverage", "0.8", "--json", *texts],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["label_set"] for line in r.stdout.splitlines()] == [
        a["label_set"] for a in clf.predict(texts, coverage=0.8)]
    r = subprocess.run([TFORMER, "predict", f"--checkpoint={run}", "--coverage", "0.905", "x"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "two decimals" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_evaluate_counts_the_sets_predict_gives_whatever_the_order_of_the_rows(tiny_run):
    """evaluate's coverage, set sizes and empty sets are those of the sets predict gives the same texts (the same
    random share, a hash of the token ids each text is read as: long texts as several windows here), in any row
    order; a seeded draw in row order gave a file and its shuffled copy different figures."""
    import datasets
    import torch

    from tformer_cli import Classifier, checkpoint
    from tformer_cli.data import demo
    from tformer_cli.data.tokenization import LongText, pad_id
    from tformer_cli.evaluation.evaluate import score_split
    from tformer_cli.hardware import Precision
    from tformer_cli.runs.scoring import tokenized

    loaded = checkpoint.load(tiny_run.run_dir / "checkpoints" / "best")
    texts, labels = demo.splits(seed=5)["test"]
    texts, labels = texts[:300], labels[:300]
    long_text = LongText.from_meta(loaded.meta)
    assert long_text.mode == "chunks"
    answers = Classifier.load(tiny_run.run_dir).predict(texts, coverage=0.8)
    names = loaded.label_names
    covered = np.mean([names[y] in a["label_set"] for a, y in zip(answers, labels)])
    size = np.mean([len(a["label_set"]) for a in answers])

    def evaluated(order):
        ds = datasets.Dataset.from_dict({"text": [texts[i] for i in order], "label": [labels[i] for i in order]})
        tok, split = tokenized(loaded, ds, "test", int(loaded.model_config["max_len"]), long_text, None)
        assert split.docs is not None  # (some texts are read as several windows)
        return score_split(loaded.model, split, names, pad_id=pad_id(tok), device=torch.device("cpu"),
                           precision=Precision("fp32", "cpu"), batch_size=32, temperature=loaded.temperature,
                           label_sets=loaded.conformal, progress=None).metrics["label_sets"]["0.80"]

    forward, backward = evaluated(range(300)), evaluated(range(299, -1, -1))
    assert forward == backward
    assert forward["coverage"] == pytest.approx(covered, abs=1e-12)
    assert forward["mean_set_size"] == pytest.approx(size, abs=1e-12)
    assert 0 < forward["empty"] < 1 or forward["mean_set_size"] > 1  # (sets of several sizes: u matters)


@pytest.mark.slow
def test_a_big_files_answers_are_written_a_chunk_at_a_time_in_order(tiny_run, tmp_path):
    from tformer_cli import Classifier
    from tformer_cli.commands.predict import CHUNK

    texts = [f"review {i}: " + ("a gripping film" if i % 3 else "dull and lifeless") for i in range(CHUNK + 5)]
    (tmp_path / "many.txt").write_text("\n".join(texts) + "\n")
    r = subprocess.run([TFORMER, "predict", f"--checkpoint={tiny_run.run_dir}", "--coverage", "0.8", "--json",
                        "--file", str(tmp_path / "many.txt")], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "TFORMER_PROGRESS_SECONDS": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    got = [json.loads(line) for line in r.stdout.splitlines()]
    assert [a["text"] for a in got] == texts  # N lines in, N answers out, in order, across the chunks
    want = Classifier.load(tiny_run.run_dir).predict([texts[0], texts[-1]], coverage=0.8)
    assert [(a["label"], a["label_set"]) for a in (got[0], got[-1])] == [(a["label"], a["label_set"]) for a in want]
    assert f"labelling: {CHUNK:,}/{len(texts):,} texts" in r.stderr  # (stdout is a pipe: progress on stderr)


@pytest.mark.slow
def test_the_onnx_export_carries_the_cuts_and_gives_the_same_sets(tiny_run, tmp_path):
    pytest.importorskip("onnxruntime")
    from tformer_cli import Classifier
    from tformer_cli.deploy.onnx_classifier import OnnxClassifier

    r = subprocess.run([TFORMER, "export", f"checkpoint={tiny_run.run_dir}", f"out={tmp_path / 'onnx'}"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    texts = ["a gripping, beautifully shot film", "dull and lifeless", "a film", "never boring"]
    want = [a["label_set"] for a in Classifier.load(tiny_run.run_dir).predict(texts, coverage=0.8)]
    onnx = OnnxClassifier.load(tmp_path / "onnx")
    assert [a["label_set"] for a in onnx.predict(texts, coverage=0.8)] == want
    onnx.conformal = None  # (an export of a checkpoint without cuts): the fix names its checkpoint, not the export
    best = (tiny_run.run_dir / "checkpoints" / "best").resolve()
    with pytest.raises(TformerError, match=f"export {best} again \\(if it has none either, .*tformer calibrate "
                                           f"checkpoint={best} split=validation, then export the calibrate run"):
        onnx.predict(texts, coverage=0.8)


def test_a_float32_level_is_read_as_its_two_decimals():
    assert [conformal.level(np.float32(x)) for x in (0.8, 0.9, 0.95)] == [0.8, 0.9, 0.95]
    with pytest.raises(TformerError, match="two decimals"):
        conformal.level(0.905)


def test_calibration_texts_too_few_for_the_highest_levels_are_said():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(4), size=200)
    labels = rng.integers(0, 4, size=200)
    few = conformal.fit_cuts(probs[:32], labels[:32], False)  # (n + 1) L <= n up to L = 32 / 33
    assert "32 calibration texts" in conformal.too_few(few) and "sets above 0.96 hold every label" in \
        conformal.too_few(few)
    assert conformal.too_few(conformal.fit_cuts(probs, labels, False)) is None


@pytest.mark.parametrize("multi_label", [False, True])
def test_cuts_fitted_a_block_at_a_time_in_any_order_are_the_cuts_of_all_texts(multi_label):
    """A calibration on a sample of its texts (many classes) fits its cuts on every text in blocks, as the forward
    pass makes them: the same cuts as one fit on all of them, whatever order the blocks come in."""
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(500, 12)) * 3
    if multi_label:
        probs, labels = 1 / (1 + np.exp(-logits)), (rng.random((500, 12)) < 0.2).astype(np.float32)
    else:
        probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        labels = np.array([rng.choice(12, p=p) for p in probs])
    whole = conformal.fit_cuts(probs, labels, multi_label, seed=5)
    fit, order = conformal.CutFit(500, multi_label, seed=5), rng.permutation(500)
    for block in np.array_split(order, 7):
        fit.add(block, probs[block], labels[block])
    assert fit.result() == whole and whole["n"] == 500
    assert all(c is not None for c in whole["cuts"].values())


def test_an_empty_set_on_screen_says_what_it_means(capsys):
    """A sure text's set may be empty (randomised APS): the table says once what {} means, and only when one shows."""
    from tformer_cli.evaluation.answers import print_table

    answer = {"text": "a gripping film", "label": "pos", "probability": 0.99, "coverage": 0.9, "top_k": []}
    print_table([{**answer, "label_set": []}, {**answer, "label_set": []}], 1, False)
    shown = " ".join(capsys.readouterr().out.split())
    assert shown.count("{}: an empty set: the model is surer than the level 0.90 needs") == 1
    assert "its label is the answer" in shown
    print_table([{**answer, "label_set": ["pos"]}], 1, False)
    assert "empty set" not in capsys.readouterr().out
    multi = {"text": "a", "labels": [], "probabilities": {}, "coverage": 0.9, "top_k": [], "label_set": []}
    print_table([multi], 1, False)  # (no label reached the cut: nothing to explain as randomised)
    assert "empty set" not in capsys.readouterr().out


def test_multi_label_cuts_hold_on_new_texts_when_each_label_has_its_own_temperature():
    """A multi-label model's temperatures (one per label) and its cuts are fitted on separate halves of the
    validation texts: fitted on the same ones, 300 rare labels' temperatures chosen on 2 or 3 positives each made
    those texts look better covered than new ones, and the sets promised at 0.90 covered far less."""
    from tformer_cli.evaluation import calibration

    rng = np.random.default_rng(0)

    def draw(m):  # an uninformative model of rare labels: only the temperatures can move anything
        return (rng.normal(size=(m, 300)) - 3).astype(np.float32), (rng.random((m, 300)) < 0.01).astype(np.uint8)

    changes = calibration.fitted(*draw(600), True, seed=0, thresholds=[0.5] * 300)
    assert changes["conformal"]["n"] == 300  # (the half its temperatures were not fitted on)
    z, y = draw(20000)
    tally = conformal.Tally(changes["conformal"], True)
    tally.add(calibration.probabilities(z, changes["temperature"], True), y)
    got = tally.result()["0.90"]
    assert got["expected"][0] <= got["coverage"], got
    fit, cut = calibration.halves(600, 0)
    assert len(fit) == len(cut) == 300 and not set(fit) & set(cut)


def test_with_many_labels_the_temperature_sample_and_the_cut_pass_read_separate_halves(monkeypatch):
    """Past FIT_ENTRIES logits a multi-label model's temperatures are fitted on a sample of one half and its cuts,
    in one more pass over the split, on every text of the other half (a softmax model's: on every text)."""
    import torch

    from tformer_cli.evaluation import calibration, evaluate

    rng = np.random.default_rng(4)
    n, k = 103, 5
    z, y = rng.normal(size=(n, k)).astype(np.float32), (rng.random((n, k)) < 0.4).astype(np.uint8)
    monkeypatch.setattr(calibration, "FIT_ENTRIES", 100)
    fit, cut = calibration.fit_rows(n, k, 2, True), calibration.cut_rows(n, k, 2, True)
    first, second = calibration.halves(n, 2)
    assert set(fit) <= set(first) and len(fit) == 20 and (cut == second).all()
    assert calibration.cut_rows(n, k, 2, False) is None and len(calibration.fit_rows(n, k, 2, False)) == 20

    class Split:  # what every_text_cuts reads of a tokenized split
        n_docs, doc_labels = n, torch.from_numpy(y)

    def blocks(model, split, **kwargs):  # the order batches run in: any
        for part in np.array_split(rng.permutation(n), 7):
            yield torch.from_numpy(part), torch.from_numpy(z[part])

    monkeypatch.setattr(evaluate, "logit_blocks", blocks)
    temperature = [0.8, 1.0, 1.3, 2.0, 0.6]
    got = evaluate.every_text_cuts(None, Split(), True, 2, cut)(temperature)
    want = conformal.fit_cuts(calibration.probabilities(z[cut], temperature, True), y[cut], True)
    assert got["n"] == len(second) == 51 and got["cuts"] == pytest.approx(want["cuts"])


def test_a_multi_label_refit_with_no_label_in_its_cut_half_is_refused():
    from tformer_cli.evaluation import calibration
    from tformer_cli.runs.recalibrate import _refuse_unfittable

    labels = np.zeros((60, 3), np.uint8)
    labels[calibration.halves(60, 0)[0][:2], 1] = 1  # two labelled texts, both in the temperatures' half
    with pytest.raises(TformerError, match="only 2 texts of f.csv have a label, none of them in the seeded half"):
        _refuse_unfittable(labels, True, "f.csv", ["a", "b", "c"], "labels", 0)
    labels[calibration.halves(60, 0)[1][0], 2] = 1
    _refuse_unfittable(labels, True, "f.csv", ["a", "b", "c"], "labels", 0)
    for same in ([1, 0, 0], [1, 1, 1]):  # every text one label set (one label, or all of them): refused as one class is
        with pytest.raises(TformerError, match=f"all 60 texts of f.csv carry the same labels "
                                               f"\\({', '.join(n for n, on in zip('abc', same) if on)}\\)"):
            _refuse_unfittable(np.tile(np.array(same, np.uint8), (60, 1)), True, "f.csv", ["a", "b", "c"], "labels", 0)
    ten_times = np.tile(np.arange(2), 30)  # 60 texts that are 10 texts, each 6 times: 10 texts
    with pytest.raises(TformerError, match=r"60 texts \(10 distinct\) of f.csv are too few to calibrate on"):
        _refuse_unfittable(ten_times, False, "f.csv", ["a", "b"], "label", 0, distinct=10)
    _refuse_unfittable(ten_times, False, "f.csv", ["a", "b"], "label", 0, distinct=60)

