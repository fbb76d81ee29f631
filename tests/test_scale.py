"""Cost that grows with texts plus classes: the confusion matrix dense or its top cells, metrics from a few numbers
per text (the same as from every probability), vectorised label work and checks that give what the per-row code
gave, the vocabulary's sample rule, progress for quiet library calls, and a many-class run end to end."""
import csv
import hashlib
import json
import random
import unicodedata

import datasets
import numpy as np
import pytest
from rich.console import Console
from sklearn.metrics import confusion_matrix, f1_score

from helpers import data_config, run_tformer
from tformer_cli.data import arrow, sanity, sources, tokenization
from tformer_cli.evaluation import calibration, metrics, rows
from tformer_cli.errors import TformerError
from tformer_cli.evaluation.report import ConfusionMatrix, print_metrics
from tformer_cli.store.atomic import json_text


def names(k):
    return [f"class {i:03d}" for i in range(k)]


def test_the_whole_matrix_up_to_50_classes_then_its_most_frequent_mistakes():
    rng = np.random.default_rng(0)
    y, pred = rng.integers(0, 6, 500), rng.integers(0, 6, 500)
    dense = metrics.compute(y, pred, names(6))
    assert dense["confusion_matrix"] == confusion_matrix(y, pred, labels=range(6)).tolist()
    assert "top_confusions" not in dense
    k = 400
    y = rng.integers(0, k, 20_000)
    pred = np.where(rng.random(20_000) < 0.5, y, rng.integers(0, k, 20_000))
    pred[:300] = 7  # one frequent mistake: many classes taken for class 7
    y[:300] = 3
    sparse = metrics.compute(y, pred, names(k))
    assert "confusion_matrix" not in sparse and len(sparse["top_confusions"]) == metrics.TOP_CONFUSIONS
    assert sparse["top_confusions"][0] == ["class 003", "class 007", 300 + int(((y == 3) & (pred == 7))[300:].sum())]
    counts = [c for _, _, c in sparse["top_confusions"]]
    assert counts == sorted(counts, reverse=True)
    assert sparse["errors"] == int((y != pred).sum()) and sparse["confusion_pairs"] >= metrics.TOP_CONFUSIONS
    assert len(sparse["per_class"]) == k + 3  # every class, and accuracy, macro avg, weighted avg
    # both forms read back the same way; the screen shows the top confusions and says where the rest is
    assert metrics.top_confusions(dense, names(6))[0][2] == max(
        c for t, row in enumerate(dense["confusion_matrix"]) for p, c in enumerate(row) if t != p)
    assert metrics.top_confusions(sparse, names(k))[0] == (3, 7, sparse["top_confusions"][0][2])
    out = Console(width=120, record=True)
    out.print(ConfusionMatrix(names(k), sparse))
    text = out.export_text()
    assert "top confusions (10 of" in text and "class 003" in text and "400 classes" in text


def test_a_many_class_report_is_compact_and_its_table_short():
    k = 3000
    rng = np.random.default_rng(1)
    y = rng.integers(0, k, 10_000)
    m = metrics.compute(y, np.where(rng.random(10_000) < 0.3, y, (y + 1) % k), names(k))
    text = json_text(m)
    assert len(text.splitlines()) < k + 1100  # a line per class (and per top confusion), not six
    assert json.loads(text)["per_class"]["class 000"] == m["per_class"]["class 000"]
    out = Console(width=150, record=True)
    print_metrics(m, names(k), "test", out)
    shown = out.export_text()
    assert "the 15 lowest F1 of 3,000" in shown and len(shown.splitlines()) < 80


def test_single_label_scores_from_a_few_numbers_a_text_match_every_probability():
    rng = np.random.default_rng(2)
    z = rng.normal(size=(700, 30)) * 3
    y = rng.integers(0, 30, 700)
    for t in (None, 1.7):
        got = rows.reduce([(np.arange(300), z[:300]), (np.arange(300, 700), z[300:])], y, t)
        want = calibration.metrics(z, y, False, t)
        figures = got.figures()
        for key in ("ece", "brier", "nll", "ece_raw", "brier_raw", "nll_raw"):
            assert figures[key] == pytest.approx(want[key], rel=1e-9, abs=1e-12), key
        assert (got.pred == calibration.probabilities(z, t).argmax(-1)).all()


def test_thresholds_and_temperatures_of_many_labels_at_once_match_one_at_a_time():
    rng = np.random.default_rng(3)
    y = (rng.random((80, 12)) < 0.3).astype(float)
    y[:, 5] = 0  # a label never on: cut 0.5, temperature 1
    p = np.round(rng.random((80, 12)), 2)
    want = []
    for c in range(12):
        if not y[:, c].any():
            want.append(0.5)
            continue
        scores = [f1_score(y[:, c] > 0.5, p[:, c] >= t, zero_division=0) for t in metrics.THRESHOLD_GRID]
        best = max(range(len(scores)), key=lambda i: (round(scores[i], 12), -abs(metrics.THRESHOLD_GRID[i] - 0.5)))
        want.append(float(metrics.THRESHOLD_GRID[best]))
    assert metrics.tune_thresholds(y, p, block_entries=50) == want
    z = rng.normal(size=(80, 12)) * rng.uniform(0.3, 5, 12)
    together = calibration.fit_temperature(z, y, multi_label=True)
    alone = [calibration.fit_temperature(z[:, [c]], y[:, [c]], multi_label=True)[0] for c in range(12)]
    assert together == pytest.approx(alone, rel=1e-5) and together[5] == 1.0


def test_the_temperature_of_many_classes_is_fitted_on_a_seeded_sample():
    assert calibration.fit_rows(1000, 20) is None  # (every shipped dataset: all rows)
    sample = calibration.fit_rows(10_000, 10_000, seed=4)
    assert len(sample) == calibration.FIT_ENTRIES // 10_000 and (np.diff(sample) > 0).all()
    assert (sample == calibration.fit_rows(10_000, 10_000, seed=4)).all()


def _old_fingerprint(ds):
    h = hashlib.sha256()
    for text in ds["text"][:]:
        h.update(text.encode("utf-8") + b"\0")
    labels = ds["label"][:]
    h.update(json.dumps(labels).encode() if labels and isinstance(labels[0], list) else
             np.asarray(labels, dtype=np.int64).tobytes())
    return h.hexdigest()


def test_fingerprints_from_arrow_are_the_row_by_row_ones():
    """Checkpoints written before keep resuming: the digest is the same bytes, hashed a block at a time."""
    texts = ["héllo", "a\0b", "x" * 100, "日本語"] * 40_000
    single = datasets.Dataset.from_dict({"text": texts, "label": [0, 1, 0, 1] * 40_000}).cast_column(
        "label", datasets.ClassLabel(names=["a", "b"]))
    multi = datasets.Dataset.from_dict({"text": texts[:999], "label": [[0, 1], [], [1]] * 333}).cast_column(
        "label", datasets.Sequence(datasets.ClassLabel(names=["a", "b"])))
    for ds in (single, single.select(range(7, 100_000, 3)), multi, single.select([])):
        loaded = sources.LoadedData({"train": ds}, ["a", "b"], "test")
        assert sources.fingerprint(loaded, ("train",))["train"]["sha256"] == _old_fingerprint(ds)


def test_copies_across_splits_are_found_as_the_per_text_rule_finds_them():
    norm = lambda t: " ".join(unicodedata.normalize("NFKC", t).casefold().split())  # noqa: E731
    r = random.Random(5)
    alphabet = list("abcABC  \t\n\x1c.") + ["é", "É", "ß", "ﬁ", "\u00a0", "\u2003", "Ⅻ"]
    text = lambda: "".join(r.choice(alphabet) for _ in range(r.randint(0, 8)))  # noqa: E731
    train = [text() for _ in range(4000)]
    other = [text() for _ in range(4000)] + train[:50]
    found = sanity.overlap(sanity.TrainTexts(datasets.Dataset.from_dict({"text": train})),
                           datasets.Dataset.from_dict({"text": other}))
    exact, folded = set(train), {norm(t) for t in train}
    assert found["exact"] == sum(t in exact for t in other)
    assert found["normalized"] == sum(t not in exact and norm(t) in folded for t in other)
    assert len(found["exact_examples"]) == sanity.EXAMPLES


def test_visible_texts_are_told_in_arrow_as_one_by_one(tmp_path):
    from tformer_cli.data.visible import has_visible

    texts = ["a", " ", "\u200b", "\u0301", "日本", "\u3000x", "", None, "\t\n", "\U0001fae8", " ."]
    ds = datasets.Dataset.from_dict({"text": texts})
    assert arrow.visible(ds).tolist() == [isinstance(t, str) and has_visible(t) for t in texts]


def test_the_vocabulary_of_a_big_split_is_learned_from_a_seeded_sample(monkeypatch):
    texts = [f"w{i % 97} w{i % 13} text number {i}" for i in range(5000)]
    ds = datasets.Dataset.from_dict({"text": texts})
    whole, n, total = tokenization.vocabulary_sample(ds, seed=0)
    assert n == total == 5000 and list(whole) == texts  # small: every text, in order
    monkeypatch.setattr(tokenization, "VOCABULARY_CHARS", 30_000)
    sampled, n, total = tokenization.vocabulary_sample(ds, seed=0)
    sampled = list(sampled)
    assert total == 5000 and n == len(sampled) < 5000 and sum(map(len, sampled)) <= 30_000
    assert sum(map(len, sampled)) > 30_000 - max(map(len, texts))  # filled up to the budget
    assert sampled == list(tokenization.vocabulary_sample(ds, seed=0)[0])  # seeded: the same sample
    assert sampled != list(tokenization.vocabulary_sample(ds, seed=1)[0])
    streamed = tokenization.train_wordpiece(iter(sampled), 300, 16, total=n)
    assert streamed.to_str() == tokenization.train_wordpiece(sampled, 300, 16).to_str()


def test_a_quiet_library_call_still_gets_progress_lines(monkeypatch, capsys):
    from tformer_cli import console

    monkeypatch.setenv("TFORMER_PROGRESS_SECONDS", "0")
    grown = iter(range(1, 1000))
    with console.heartbeat("reading data.csv", lambda: next(grown)):
        import time

        time.sleep(2.5)
    err = capsys.readouterr().err
    assert err.count("reading data.csv:") >= 2 and "MBs" in err and "elapsed" in err


def test_string_and_integer_labels_are_encoded_from_arrow(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a", "b", "c", "d"], "label": ["pos", "neg", "pos", "mid"]}), tmp_path / "s.parquet")
    pq.write_table(pa.table({"text": ["e", "f"], "label": ["neg", "new"]}), tmp_path / "t.parquet")
    pq.write_table(pa.table({"text": ["g", "h"], "label": [2, 0]}), tmp_path / "i.parquet")
    data = sources.load(data_config("files", train_file=tmp_path / "s.parquet", validation_file=tmp_path / "s.parquet"))
    assert data.label_names == ["mid", "neg", "pos"] and data.splits["train"]["label"][:] == [2, 1, 2, 0]
    with pytest.raises(TformerError, match="the validation split has labels not seen in training: 0, 2"):
        sources.load(data_config("files", train_file=tmp_path / "s.parquet", validation_file=tmp_path / "i.parquet"))
    with pytest.raises(TformerError, match=r"the test split \(t.parquet\) has labels not seen in training: new"):
        sources.load(data_config("files", train_file=tmp_path / "s.parquet", test_file=tmp_path / "t.parquet"))


@pytest.mark.slow  # trains a tiny model on 120 classes
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_a_run_with_many_classes_writes_small_files_and_reports(tmp_path):
    k, rng = 120, np.random.default_rng(6)
    for split, n in (("train", 1200), ("validation", 240), ("test", 240)):
        labels = rng.permutation(np.arange(n) % k)
        with open(tmp_path / f"{split}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            for c in labels:
                w.writerow([f"topic{c} word{rng.integers(0, 50)} and some more words", f"name {c:03d}"])
    files = [f"data.{s}_file={tmp_path / f'{s}.csv'}" for s in ("train", "validation", "test")]
    run = tmp_path / "run"
    r = run_tformer("train", "data=files", *files, "model=tiny", "trainer.epochs=1", f"hydra.run.dir={run}",
                    cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    m = json.loads((run / "test_metrics.json").read_text())
    assert "confusion_matrix" not in m and m["top_confusions"] and len(m["per_class"]) == k + 3
    assert json.loads((run / "timings.json").read_text())[0]["phase"] == "load"
    assert "per class: the 15 lowest F1 of 120" in r.stdout and "time: load" in r.stdout
    for path in run.rglob("*"):
        assert not path.is_file() or path.stat().st_size < 2 << 20, path
    assert (run / "test_report" / "confusion_matrix.png").read_bytes()[:4] == b"\x89PNG"
    report = run_tformer("report", str(run), cwd=tmp_path)
    assert report.returncode == 0 and "top confusions" in report.stdout, report.stderr
    evaluated = run_tformer("evaluate", f"checkpoint={run}", f"hydra.run.dir={tmp_path / 'eval'}", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["top_confusions"] == m["top_confusions"]


def test_the_many_class_audit_rule_flags_what_cleanlab_flags():
    cleanlab_filter = pytest.importorskip("cleanlab.filter")
    from tformer_cli.evaluation.confident import confident_learning_issues

    rng = np.random.default_rng(7)
    for _ in range(15):
        n, k = int(rng.integers(30, 300)), int(rng.integers(2, 25))
        p = np.exp(rng.normal(size=(n, k)) * rng.uniform(0.5, 4))
        p /= p.sum(1, keepdims=True)
        y = rng.integers(0, k, n)
        y[:k] = np.arange(k)  # (cleanlab wants every class given at least once)
        want = cleanlab_filter.find_label_issues(y, p, filter_by="confident_learning", n_jobs=1)
        assert (confident_learning_issues(y, p, block_entries=int(rng.integers(1, 400))) == want).all()
