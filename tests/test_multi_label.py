"""Multi-label classification on generated data with a known answer: each text mentions 0-3 topics, its labels
are exactly the topics it mentions. Labels come as a delimited string column (CSV) and as lists (JSON lines)."""
import csv
import json
import random

import numpy as np
import pytest

from helpers import TINY_TRAINING, tiny
from tformer_cli import Classifier, TformerError, train

TOPICS = {"sports": ["match", "goal", "team", "coach", "league", "stadium"],
          "politics": ["election", "senate", "vote", "minister", "policy", "parliament"],
          "tech": ["software", "chip", "robot", "startup", "code", "laptop"],
          "food": ["recipe", "pasta", "chef", "flavor", "bake", "spicy"]}
FILLER = ["the", "a", "today", "we", "saw", "about", "and", "some", "news", "story", "people", "said", "new"]


def make(n: int, seed: int) -> list[tuple[str, list[str]]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        labels = sorted(rng.sample(sorted(TOPICS), rng.choice([0, 1, 1, 2, 2, 3])))
        words = [w for t in labels for w in rng.sample(TOPICS[t], 2)] + rng.sample(FILLER, rng.randint(4, 8))
        rng.shuffle(words)
        rows.append((" ".join(words), labels))
    return rows


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("multi")
    with open(folder / "train.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "topics"])
        for text, labels in make(1500, 1):
            w.writerow([text, ",".join(labels)])
    with open(folder / "test.jsonl", "w") as f:
        for text, labels in make(300, 2):
            f.write(json.dumps({"text": text, "topics": labels}) + "\n")
    return folder


def overrides(files):
    return ["data=files", f"data.train_file={files / 'train.csv'}", f"data.test_file={files / 'test.jsonl'}",
            "data.multi_label=true", "data.label_column=topics",
            *tiny("trainer.epochs=3", "embedding_init.vocab_size=200", "optimizer.lr=3e-3", base=TINY_TRAINING)]


@pytest.fixture(scope="module")
def result(files, tmp_path_factory):
    return train(overrides(files), run_dir=tmp_path_factory.mktemp("multi_run") / "run")


@pytest.mark.slow  # trains
def test_learns_the_known_label_sets(result):
    m = result.test_metrics
    print({k: m[k] for k in ("accuracy", "f1", "f1_macro", "hamming_loss")})
    assert m["multi_label"] and m["average"] == "micro" and m["n"] == 300
    assert m["f1"] >= 0.9 and m["f1_macro"] >= 0.9 and m["accuracy"] >= 0.7  # subset accuracy: every label right
    assert set(m["per_class"]) >= set(TOPICS)
    # early stopping watched micro-F1 (trainer.early_stopping.monitor=auto), saved as chosen: a resume compares it
    assert result.monitor == "val_f1"
    from tformer_cli.store.layout import CheckpointDir

    assert CheckpointDir(result.best_checkpoint).early_stopping() == ("val_f1", "max")


@pytest.mark.slow
def test_thresholds_are_tuned_stored_and_applied(result):
    clf = Classifier.load(result.run_dir)
    meta = json.loads((result.best_checkpoint / "meta.json").read_text())
    assert clf.multi_label and clf.labels == sorted(TOPICS)
    assert meta["thresholds"] == clf.thresholds == result.test_metrics["thresholds"]
    assert len(clf.thresholds) == 4 and all(0 < t < 1 for t in clf.thresholds)
    # the test metrics are exactly scikit-learn's on the classifier's own label sets
    from sklearn.metrics import f1_score
    from sklearn.preprocessing import MultiLabelBinarizer

    rows = make(300, 2)
    answers = clf.predict([t for t, _ in rows])
    binarize = MultiLabelBinarizer(classes=clf.labels).fit([])
    truth, pred = binarize.transform([ls for _, ls in rows]), binarize.transform([a["labels"] for a in answers])
    assert f1_score(truth, pred, average="micro") == pytest.approx(result.test_metrics["f1"], abs=1e-9)
    probs = clf.predict_proba([t for t, _ in rows])
    assert ((probs >= np.array(clf.thresholds)) == pred.astype(bool)).all()
    assert not np.allclose(probs.sum(1), 1.0)  # independent sigmoids, not a distribution


@pytest.mark.slow
def test_predict_returns_label_sets(result):
    clf = Classifier.load(result.run_dir)
    out = clf.predict(["the coach said the team and the league", "we saw a new recipe about pasta and a robot",
                       "the people said some news", ""], top_k=2)
    assert out[0]["labels"] == ["sports"] and set(out[0]["probabilities"]) == {"sports"}
    assert set(out[1]["labels"]) == {"food", "tech"}
    assert out[2]["labels"] == [] and out[3]["empty"] and out[3]["labels"] == []
    assert len(out[0]["top_k"]) == 2 and out[0]["top_k"][0]["label"] == "sports"


@pytest.mark.slow
def test_a_one_word_text_is_explained_against_the_model_with_no_words(result):
    """Deleting a one-word text's only word leaves the special tokens alone: its weight is how far the model's own
    answer to no words at all is from its answer (a uniform 1/labels means nothing to independent sigmoids)."""
    clf = Classifier.load(result.run_dir)
    [answer] = clf.predict(["goal"], explain=True)
    c = clf.labels.index(answer["explanation"]["label"])
    p = clf.predict_proba(["goal"])[0][c]
    nothing = p - clf._no_words(64)[c]
    assert answer["explanation"]["weights"] == [round(float(nothing), 6)] and nothing > 0.5  # ("goal": sports)
    assert answer["explanation"]["weights"] != [round(float(p - 1 / len(clf.labels)), 6)]  # (not a uniform answer)


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_cli_predict_and_evaluate_on_the_multi_label_run(result, files, tmp_path):
    from helpers import copy_run, run_tformer
    from tformer_cli import checkpoint
    from tformer_cli.store.layout import CheckpointDir

    r = run_tformer("predict", f"--checkpoint={result.run_dir}", "--json", "the senate vote on the new chip policy",
                    cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert set(json.loads(r.stdout)["labels"]) == {"politics", "tech"}
    r = run_tformer("evaluate", f"checkpoint={result.run_dir}", f"hydra.run.dir={tmp_path / 'eval'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["f1"] == pytest.approx(result.test_metrics["f1"], abs=1e-9)
    assert "subset accuracy" in r.stdout and "hamming loss" in r.stdout
    assert (tmp_path / "eval" / "errors.csv").is_file() or (tmp_path / "eval" / "classification_report.json").is_file()
    # tformer calibrate: new temperatures and cuts; the thresholds move with them, so no decision changes
    r = run_tformer("calibrate", f"checkpoint={result.run_dir}", "split=test", f"hydra.run.dir={tmp_path / 'cal'}",
                    cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "cal" / "checkpoints" / "best" / "meta.json").read_text())
    assert meta["conformal"]["method"] == "crc-fnr" and meta["calibrated_on"]["texts"] == 300
    texts = [text for text, _ in make(40, 5)]
    old, new = Classifier.load(result.run_dir), Classifier.load(tmp_path / "cal")
    assert [set(a["labels"]) for a in new.predict(texts)] == [set(a["labels"]) for a in old.predict(texts)]

    # texts with no label at all would fit empty sets: refused in one line; labels a file never shows keep theirs
    def written(name, rows):
        with open(tmp_path / name, "w", newline="") as f:
            csv.writer(f).writerows([("text", "topics"), *((text, ",".join(labels)) for text, labels in rows)])
        return tmp_path / name

    unlabelled = written("none.csv", [(text, []) for text, _ in make(120, 6)])
    r = run_tformer("calibrate", f"checkpoint={result.run_dir}", f"file={unlabelled}",
                    f"hydra.run.dir={tmp_path / 'cal_none'}", cwd=tmp_path)
    assert r.returncode == 2 and "has no labels" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "cal_none").exists()
    r = run_tformer("evaluate", f"checkpoint={result.run_dir}", f"test_file={unlabelled}", cwd=tmp_path)  # (was
    assert r.returncode == 2 and f"{unlabelled} has no labels" in r.stderr, r.stderr  # scored: every metric 0)
    assert f"tformer predict --file {unlabelled}" in r.stderr
    sports = written("sports.csv", [row for row in make(600, 7) if set(row[1]) <= {"sports"}])
    own = copy_run(result.run_dir, tmp_path / "own")  # (temperatures of its own: this data is separable, so 1)
    checkpoint.update_meta(CheckpointDir(own / "checkpoints" / "best"), {"temperature": [2.5, 0.5, 1.5, 3.0]})
    r = run_tformer("calibrate", f"checkpoint={own}", f"file={sports}",
                    f"hydra.run.dir={tmp_path / 'cal_sports'}", cwd=tmp_path)
    assert r.returncode == 0 and "3 of 4 labels are never" in " ".join(r.stdout.split()), r.stdout + r.stderr
    was = json.loads((own / "checkpoints" / "best" / "meta.json").read_text())["temperature"]
    now = json.loads((tmp_path / "cal_sports" / "checkpoints" / "best" / "meta.json").read_text())["temperature"]
    kept = [i for i, name in enumerate(sorted(TOPICS)) if name != "sports"]
    assert [now[i] for i in kept] == [was[i] for i in kept]  # (not reset to 1)


@pytest.mark.slow
def test_onnx_export_keeps_the_label_sets(result):
    pytest.importorskip("onnxruntime")
    from tformer_cli.deploy.export import export_onnx
    from tformer_cli.deploy.onnx_classifier import OnnxClassifier

    exported = export_onnx(result.run_dir)
    assert exported.max_abs_logit_diff <= 1e-4
    texts = ["the coach said the team and the league", "we saw a new recipe about pasta and a robot"]
    a, b = Classifier.load(result.run_dir).predict(texts), OnnxClassifier.load(result.run_dir).predict(texts)
    assert [x["labels"] for x in a] == [x["labels"] for x in b]


def test_multi_label_class_weights_weigh_each_labels_positives():
    """loss.class_weights=balanced (and auto, for multi-label data): BCE's pos_weight sqrt(negatives / positives);
    auto leaves single-label data unweighted."""
    import torch
    from tformer_cli.runs.classify import class_weights
    labels = torch.zeros(100, 3)
    labels[:50, 0], labels[:4, 1] = 1, 1  # label 0 on half the texts, label 1 on 4 of 100, label 2 on none
    for mode in ("balanced", "auto"):
        assert torch.allclose(class_weights(labels, 3, mode), torch.tensor([1.0, (96 / 4) ** 0.5, 10.0]))
    assert class_weights(torch.tensor([0, 1, 1]), 2, "auto") is None
    assert class_weights(labels, 3, None) is None


def test_bad_multi_label_settings_are_one_line(files, tmp_path):
    (tmp_path / "one.csv").write_text("text,topics\nhello,x\nworld,x\nagain,x\nmore,x\nand more,x\n")
    with pytest.raises(TformerError, match="at least two"):
        train(["data=files", f"data.train_file={tmp_path / 'one.csv'}", "data.multi_label=true",
               "data.label_column=topics"], run_dir=tmp_path / "b")


def test_threshold_tuning_finds_the_known_cut():
    from tformer_cli.evaluation.metrics import tune_thresholds

    y = np.array([[1, 0], [1, 0], [1, 0], [0, 0], [0, 0], [0, 0]])
    p = np.array([[0.35, 0.9], [0.4, 0.1], [0.45, 0.2], [0.1, 0.3], [0.2, 0.6], [0.25, 0.7]])
    # label 0: every cut in (0.25, 0.35] separates perfectly; the one nearest 0.5 is kept. label 1: no positive
    assert tune_thresholds(y, p) == [0.35, 0.5]


def test_auto_epochs_follow_the_training_steps():
    """trainer.epochs=auto: ten for single-label data; for multi-label data about STEPS_MULTI_LABEL steps,
    within EPOCHS_MULTI_LABEL, counted in global batches."""
    from tformer_cli.training import recipe
    assert recipe.auto_epochs(20_000, 32, multi_label=False)[0] == 10
    assert recipe.auto_epochs(43_410, 32, multi_label=True)[0] == 3  # GoEmotions: 1,357 steps an epoch
    assert recipe.auto_epochs(1_742, 32, multi_label=True)[0] == 30  # 55 steps: the ceiling
    assert recipe.auto_epochs(10_000_000, 32, multi_label=True)[0] == 2  # the floor
    assert recipe.auto_epochs(43_410, 64, multi_label=True)[0] == 6
    assert recipe.said_auto("Auto") and not recipe.said_auto(3)


@pytest.mark.slow  # trains
def test_auto_epochs_are_saved_as_a_number_and_resumed(files, tmp_path, monkeypatch):
    from tformer_cli.checkpoint import read_config
    from tformer_cli.store.layout import CheckpointDir
    from tformer_cli.training import recipe
    monkeypatch.setattr(recipe, "STEPS_MULTI_LABEL", 114)  # 1,200 rows in batches of 32: 38 steps, 3 epochs
    base = [o for o in overrides(files) if not o.startswith("trainer.epochs=")]
    run = tmp_path / "run"
    result = train([*base, "trainer.epochs=auto"], run_dir=run)
    log = next(run.glob("train*.log")).read_text()
    assert "epochs 3 (trainer.epochs=auto: multi-label data" in log
    assert len(result.history) == 3 and read_config(CheckpointDir(run / "checkpoints" / "last"))["trainer"]["epochs"] == 3
    monkeypatch.setattr(recipe, "STEPS_MULTI_LABEL", 100_000)  # auto would now say 30: the run's own 3 wins
    with pytest.raises(TformerError, match="already finished"):
        train([*base, "trainer.epochs=auto", f"resume={run}"], run_dir=run)
    longer = train([*base, "trainer.epochs=4", f"resume={run}"], run_dir=run)
    assert len(longer.history) == 4


def test_weighted_positives_leave_the_probabilities_calibrated():
    """weighted_bce weighs a label's positives by pos_weight yet its best logit is still the log-odds of the
    label's rate (logit adjustment), so sigmoids stay probabilities; pos_weight alone would move it by log(w)."""
    import torch
    import torch.nn.functional as F
    from tformer_cli.inference import weighted_bce
    targets = (torch.arange(1000) < 100).float()[:, None]  # the label on 10% of the texts
    weight = torch.tensor([9.0])
    for loss_fn, expected in ((lambda z: weighted_bce(z.expand(1000, 1), targets, weight), 0.1),
                              (lambda z: F.binary_cross_entropy_with_logits(z.expand(1000, 1), targets,
                                                                            pos_weight=weight), 0.5)):
        z = torch.zeros(1, requires_grad=True)
        opt = torch.optim.LBFGS([z], max_iter=100)
        opt.step(lambda: (opt.zero_grad(), (loss := loss_fn(z)).backward(), loss)[-1])
        assert abs(torch.sigmoid(z).item() - expected) < 1e-3


def test_pretraining_refuses_auto_epochs(tmp_path):
    from helpers import run_tformer
    r = run_tformer("pretrain", "trainer.epochs=auto", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().startswith("error: trainer.epochs=auto is chosen from labelled "
                                                             "data"), r.stderr[-500:]


def test_multi_label_metrics_are_scikit_learns_counted_a_block_at_a_time():
    """compute_multi_label counts per label and per text in blocks of rows (no texts x labels copies): the same
    figures and report as scikit-learn's, samples average and labels never on (or never predicted) included."""
    from sklearn import metrics as sk

    from tformer_cli.evaluation.metrics import compute_multi_label

    rng = np.random.default_rng(1)
    for trial in range(12):
        n, k = int(rng.integers(1, 40)), int(rng.integers(2, 8))
        y = (rng.random((n, k)) < rng.random()).astype(np.float32)
        if trial % 3 == 0:
            y[: n // 2] = 0  # texts with no label
        if trial % 4 == 0:
            y[:, 0] = 0  # a label never on
        probs, cuts = rng.random((n, k)).astype(np.float32), rng.random(k) * (1.5 if trial % 5 == 0 else 1)
        names = [f"l{i}" for i in range(k)]
        got = compute_multi_label(y, probs, cuts, names, block_entries=7)  # (blocks of one to three texts)
        assert compute_multi_label(y.astype(np.uint8), probs, cuts, names, block_entries=7) == got  # (one byte)
        truth, pred = y.astype(np.int8), (probs >= cuts[None, :]).astype(np.int8)
        labels = list(range(k))
        p, r, f1, _ = sk.precision_recall_fscore_support(truth, pred, average="micro", labels=labels, zero_division=0)
        want = {"accuracy": sk.accuracy_score(truth, pred), "precision": p, "recall": r, "f1": f1,
                "f1_macro": sk.f1_score(truth, pred, average="macro", labels=labels, zero_division=0),
                "hamming_loss": sk.hamming_loss(truth, pred)}
        assert {key: got[key] for key in want} == pytest.approx(want, abs=1e-12)
        report = sk.classification_report(truth, pred, labels=labels, target_names=names, output_dict=True,
                                          zero_division=0)
        assert got["per_class"].keys() == report.keys()
        for name, row in report.items():
            assert got["per_class"][name] == pytest.approx(row, abs=1e-12), (trial, name)


def test_a_streamed_evaluation_counts_what_the_whole_logits_give(tmp_path):
    """Test and `tformer evaluate` stream a multi-label split (rows.LabelRows: a few bits per text and label, the
    blocks in the order batches run): the metrics, the calibration figures, the label sets and errors.csv are
    those of the whole (texts, labels) logits held at once."""
    from tformer_cli.evaluation import artifacts, calibration, conformal
    from tformer_cli.evaluation.metrics import compute_multi_label
    from tformer_cli.evaluation.rows import LabelRows

    rng = np.random.default_rng(3)
    n, k = 300, 11
    z = (rng.normal(size=(n, k)) * 3).astype(np.float32)
    y = (rng.random((n, k)) < 1 / (1 + np.exp(-z / 2))).astype(np.uint8)
    y[:20] = 0  # texts with no label
    temperature, thresholds = list(rng.uniform(0.5, 2.0, k)), list(rng.uniform(0.2, 0.8, k))
    names = [f"label {i}" for i in range(k)]
    probs = calibration.probabilities(z, temperature, True)
    cuts = conformal.fit_cuts(probs[:150], y[:150], True)

    kept = LabelRows.start(y, thresholds, temperature)
    tally = conformal.Tally(cuts, True)
    for block in np.array_split(rng.permutation(n), 13):  # (longest texts first: any order)
        p = calibration.probabilities(z[block], temperature, True)
        kept.add(block, z[block], p)
        tally.add(p, y[block])
    whole = compute_multi_label(y, probs, thresholds, names)
    got = kept.counts.metrics(thresholds, names)
    assert got.keys() == whole.keys() and got["thresholds"] == whole["thresholds"]
    for key, value in whole.items():  # (the per-text averages are summed in another order: equal to 1e-12)
        if key == "per_class":
            assert all(got[key][name] == pytest.approx(row, abs=1e-12) for name, row in value.items())
        elif key != "thresholds":
            assert got[key] == pytest.approx(value, abs=1e-12), key
    figures, want = kept.sums.result(), calibration.metrics(z, y, True, temperature)
    assert figures.pop("temperature") == want.pop("temperature")
    assert figures == pytest.approx(want, abs=1e-12)
    held = conformal.Tally(cuts, True)
    held.add(probs, y)
    flat = lambda table: [(level, key, v) for level, row in table.items() for key, value in row.items()  # noqa: E731
                          for v in np.atleast_1d(value)]
    assert [x[:2] for x in flat(tally.result())] == [x[:2] for x in flat(held.result())]
    np.testing.assert_allclose([x[2] for x in flat(tally.result())], [x[2] for x in flat(held.result())], atol=1e-9)
    for key, (count, conf, acc) in kept.sums.curves().items():
        want = calibration.reliability(probs if key == "calibrated" else calibration.probabilities(z, None, True), y,
                                       True)
        np.testing.assert_allclose(count, want[0])
        np.testing.assert_allclose(conf, want[1], atol=1e-12)
        np.testing.assert_allclose(acc, want[2], atol=1e-12)
    texts = [f"text {i}" for i in range(n)]
    streamed = artifacts.write(tmp_path / "streamed", whole, names, texts, rows=kept, normalize=False, title="t")
    at_once = artifacts.write(tmp_path / "whole", whole, names, texts, y_true=y, probs=probs, normalize=False,
                              title="t")
    assert streamed["errors"].read_text() == at_once["errors"].read_text()
    assert len(streamed["errors"].read_text().splitlines()) > 100  # (most texts have a wrong label here)
    assert kept.predicted.nbytes == n * 2 and kept.pred(np.arange(n)).tolist() == (probs >= np.array(
        thresholds)[None, :]).tolist()


def test_a_streamed_evaluation_of_chunked_documents_counts_what_their_whole_logits_give():
    """Documents read as several windows (long_text=chunks) reach the streamed multi-label evaluation as their
    windows' mean logits, in document order after the pass: every figure equals the one from the whole (documents,
    labels) logits, on a real encoder's forward pass."""
    import torch

    from tformer_cli.data.tokenization import TokenizedSplit
    from tformer_cli.evaluation import calibration, conformal
    from tformer_cli.evaluation.evaluate import score_split
    from tformer_cli.evaluation.metrics import compute_multi_label
    from tformer_cli.hardware import Precision
    from tformer_cli.inference import predict_logits
    from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier

    torch.manual_seed(0)
    rng = np.random.default_rng(4)
    k, documents = 5, 60
    windows = rng.integers(1, 4, documents)  # 1-3 windows a document, windows of 3 to 12 tokens
    docs = np.repeat(np.arange(documents), windows)
    ids = [list(rng.integers(4, 50, rng.integers(3, 13))) for _ in docs]
    doc_labels = (rng.random((documents, k)) < 0.4).astype(np.uint8)
    split = TokenizedSplit.from_ids(ids, doc_labels[docs], docs.tolist())
    assert split.docs is not None and split.n_docs == documents
    model = TransformerClassifier(EncoderConfig(vocab_size=50, num_classes=k, d_model=16, n_heads=2, d_ff=32,
                                                max_len=16, multi_label=True))
    scoring = dict(pad_id=0, device=torch.device("cpu"), precision=Precision("fp32", "cpu"), batch_size=7)
    names, temperature = [f"label {i}" for i in range(k)], list(rng.uniform(0.5, 2.0, k))
    thresholds = list(rng.uniform(0.3, 0.7, k))
    logits, loss = predict_logits(model, split, **scoring)
    z, y = logits.numpy(), split.doc_labels.numpy()
    probs = calibration.probabilities(z, temperature, True)
    cuts = conformal.fit_cuts(probs, y, True)
    got = score_split(model, split, names, thresholds=thresholds, temperature=temperature, label_sets=cuts,
                      progress=None, **scoring)
    assert got.rows is not None and got.logits is None  # (streamed: no (documents, labels) logits kept)
    whole = compute_multi_label(y, probs, thresholds, names, loss)
    whole.update(calibration.metrics(z, y, True, temperature))
    held = conformal.Tally(cuts, True)
    held.add(probs, y)
    want_sets, got_sets = held.result(), got.metrics.pop("label_sets")
    assert got_sets.keys() == want_sets.keys()
    for level, row in want_sets.items():
        assert got_sets[level].pop("expected") == pytest.approx(row.pop("expected"), abs=1e-9), level
        assert got_sets[level] == pytest.approx(row, abs=1e-9), level
    assert got.metrics.keys() == whole.keys()
    for key, value in whole.items():
        if key == "per_class":
            assert all(got.metrics[key][name] == pytest.approx(row, abs=1e-9) for name, row in value.items())
        elif key not in ("thresholds", "temperature"):
            assert got.metrics[key] == pytest.approx(value, abs=1e-9), key
