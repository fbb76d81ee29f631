"""`tformer suggest` / tformer_cli.suggest: which unlabelled texts to label next (evaluation/selection.py: the
math on hand-made matrices; the rest with the shared tiny run)."""
import csv

import numpy as np
import pandas as pd
import pytest

from tformer_cli.errors import TformerError
from tformer_cli.evaluation import selection

from helpers import run_tformer


def test_uncertainty_prefers_low_margin_rows():
    probs = np.array([[0.99, 0.01], [0.52, 0.48], [0.80, 0.20], [0.45, 0.55], [0.95, 0.05]])
    picks = selection.select(probs, 2, pool_factor=1)
    assert sorted(picks.tolist()) == [1, 3]
    scores = selection.uncertainty(probs)
    assert scores[1] > scores[2] > scores[0] and 0 <= scores.min() and scores.max() <= 1


def test_entropy_counts_every_class():
    # the same top two, but the second row's rest is spread over the other classes: entropy ranks it less sure,
    # margin ties them
    probs = np.array([[0.5, 0.3, 0.2, 0.0, 0.0], [0.5, 0.3, 0.1, 0.05, 0.05]])
    margin, entropy = selection.uncertainty(probs, "margin"), selection.uncertainty(probs, "entropy")
    assert margin[0] == pytest.approx(margin[1])
    assert entropy[1] > entropy[0]
    assert selection.select(probs, 1, method="entropy", pool_factor=1).tolist() == [1]


def test_multi_label_uncertainty_is_closeness_to_each_threshold():
    thresholds = [0.5, 0.9]
    probs = np.array([[0.99, 0.01],    # both labels decided
                      [0.50, 0.01],    # label 0 at its threshold
                      [0.99, 0.85]])   # label 1 just under its (high) threshold
    scores = selection.uncertainty(probs, "margin", thresholds)
    assert scores[1] == pytest.approx(1.0)
    assert scores[2] > 0.9 > 0.1 > scores[0]
    assert sorted(selection.select(probs, 2, thresholds=thresholds, pool_factor=1).tolist()) == [1, 2]


def clusters(rng, centres, per_cluster):
    """(len(centres) * per_cluster, d) features around the centres, and each row's cluster."""
    feats = np.concatenate([c + 0.01 * rng.standard_normal((per_cluster, len(c))) for c in centres])
    return feats, np.repeat(np.arange(len(centres)), per_cluster)


def test_diversity_spreads_picks_across_clusters():
    rng = np.random.default_rng(0)
    feats, cluster = clusters(rng, np.eye(3, 8), 10)  # 3 well-separated clusters of 10
    margin = np.where(cluster == 0, 0.02, 0.2) + 0.001 * rng.random(30)  # cluster 0: the 10 most uncertain
    probs = np.stack([0.5 + margin / 2, 0.5 - margin / 2], 1)
    alone = selection.select(probs, 3, pool_factor=1)
    assert set(cluster[alone]) == {0}  # uncertainty alone: three near copies
    spread = selection.select(probs, 3, features=feats, pool_factor=10)
    assert sorted(cluster[spread]) == [0, 1, 2]
    assert spread[0] in np.flatnonzero(cluster == 0)  # the first pick is the most uncertain
    # features as a function of the candidate rows (what suggest passes: the model runs on candidates only)
    asked = []
    lazily = selection.select(probs, 3, features=lambda rows: asked.append(rows) or feats[rows], pool_factor=2)
    assert len(asked[0]) == 6 and set(lazily) <= set(asked[0])


def test_labelled_features_keep_picks_away_from_what_is_labelled():
    rng = np.random.default_rng(1)
    feats, cluster = clusters(rng, np.eye(2, 8), 10)
    probs = np.stack([np.full(20, 0.55), np.full(20, 0.45)], 1)  # equally uncertain
    labelled = feats[cluster == 0][:3] + 0.001
    picks = selection.select(probs, 1, features=feats, labelled_features=labelled, pool_factor=20)
    assert cluster[picks[0]] == 1


def test_a_runs_own_files_are_found_as_its_training_found_them(tmp_path):
    """labelled=auto of a named dataset read from its folder (data=trec data.dir=...) excluded nothing."""
    from dataclasses import asdict

    from tformer_cli.evaluation.suggestions import run_files
    from tformer_cli.runs.config import data_config

    saved = lambda **keys: asdict(data_config({}, **keys))  # (a checkpoint's config.yaml holds the whole tree)
    for name in ("train.parquet", "test.csv", "labels.txt"):
        (tmp_path / name).write_text("")
    (tmp_path / "extra.csv").write_text("")
    assert run_files(saved(name="trec", dir=str(tmp_path))) == [tmp_path / "train.parquet", tmp_path / "test.csv"]
    assert run_files(saved(name="files", train_file=str(tmp_path / "extra.csv"), test_file=str(tmp_path / "test.csv"))
                     ) == [tmp_path / "extra.csv", tmp_path / "test.csv"]
    assert run_files(saved(name="demo")) == [] and run_files({}) == []
    assert run_files({"name": "trec", "dir": str(tmp_path)}) == [tmp_path / "train.parquet", tmp_path / "test.csv"]
    # (a config saved by an older version, without keys added since: its files are still found)
    assert run_files(saved(name="trec", dir=str(tmp_path / "moved"))) == []  # (a folder gone: nothing, no error)


def test_eligible_drops_duplicates_empty_and_labelled():
    texts = ["same", "other", "same", "", "   ", " same ", "known", "new"]
    keep = selection.eligible(texts, labelled=["known"])
    assert keep.tolist() == [0, 1, 7]


def test_more_than_the_pool_is_refused():
    with pytest.raises(TformerError, match="n=3 is more than the 2 texts"):
        selection.select(np.full((4, 2), 0.5), 3, among=np.array([0, 1]))


def pool_texts():
    """A pool where one uncertain-looking text is repeated many times, with blanks and a few distinct texts."""
    distinct = ["a gripping, beautifully shot film", "dull from start to end", "the plot made no sense at all",
                "i laughed and cried", "an instant classic", "two hours i will never get back", "fine, i guess",
                "the acting was wooden but the music was lovely"]
    return ["it was a movie"] * 20 + ["", "   "] + distinct + [" it was a movie"] * 5


@pytest.mark.slow
def test_suggest_never_picks_copies_or_blanks(tiny_run):
    from tformer_cli import suggest

    texts = pool_texts()
    picks = suggest(tiny_run.run_dir, texts, n=8, quiet=True)
    chosen = picks["text"].str.strip().tolist()
    assert len(chosen) == 8 and len(set(chosen)) == 8  # the repeated text at most once
    assert chosen.count("it was a movie") <= 1 and all(chosen)
    assert list(picks.columns) == ["text", "label", "guess", "probability", "uncertainty"]
    assert picks["label"].isna().all()
    assert (picks.index.to_numpy() < len(texts)).all()
    assert [texts[i] for i in picks.index] == picks["text"].tolist()
    with pytest.raises(TformerError, match="n=10 is more than the 9 texts"):
        suggest(tiny_run.run_dir, texts, n=10, quiet=True)
    # texts already labelled are not suggested again: of the 9 that can be, the one not chosen above is left
    again = suggest(tiny_run.run_dir, texts, n=1, labelled=chosen, quiet=True)
    left = {t.strip() for t in texts if t.strip()} - set(chosen)
    assert again["text"].str.strip().tolist() == sorted(left)


@pytest.mark.slow
def test_embed_is_the_pooled_encoder_per_text(tiny_run):
    from tformer_cli import Classifier

    clf = Classifier.load(tiny_run.run_dir)
    long = " ".join(["a long review that goes on"] * 20)  # several windows at max_len 24 (long_text=chunks)
    feats = clf.embed(["short one", "", long])
    d_model = clf._loaded.model.cfg.d_model
    assert feats.shape == (3, d_model)
    assert np.isnan(feats[1]).all() and np.isfinite(feats[[0, 2]]).all()
    alone = clf.embed(["short one"])  # the same vector whatever its batch's padding
    np.testing.assert_allclose(alone[0], feats[0], atol=1e-5)


@pytest.mark.slow
def test_cli_writes_a_csv_to_label(tiny_run, tmp_path):
    pool = tmp_path / "pool.csv"
    with open(pool, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["review", "id"])
        writer.writerows([t, i] for i, t in enumerate(pool_texts()))
    done = run_tformer("suggest", f"checkpoint={tiny_run.run_dir}", f"file={pool}", "n=4", "text_column=review",
                       cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "pool.to_label.csv"
    rows = list(csv.DictReader(open(out, newline="")))
    assert list(rows[0]) == ["text", "label", "guess", "probability", "uncertainty"]
    assert len(rows) == 4 and all(r["label"] == "" for r in rows)
    assert {r["guess"] for r in rows} <= set(tiny_run.classifier().labels)
    assert all(0 <= float(r["uncertainty"]) <= 1 and 0 < float(r["probability"]) <= 1 for r in rows)
    assert "most worth labelling" in done.stdout and "pool.to_label.csv" in done.stdout
    assert "labelled=auto: the run's training data (demo)" in done.stdout  # (generated: nothing to exclude, said)
    # a second run keeps the file (labels may be filled in already)
    again = run_tformer("suggest", f"checkpoint={tiny_run.run_dir}", f"file={pool}", "n=4", "text_column=review",
                        cwd=tmp_path)
    assert again.returncode == 2 and "overwrite=true" in again.stderr


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it): a `tformer suggest` process per bad input
def test_cli_bad_input_is_one_line(tiny_run, tmp_path):
    (tmp_path / "pool.csv").write_text("text\nfirst review\nsecond review\n")
    (tmp_path / "empty.csv").write_text("text\n")
    (tmp_path / "notes.dat").write_text("a note\n")
    run = f"checkpoint={tiny_run.run_dir}"
    cases = {("file=pool.csv", "text_column=review"): "column 'review' not found",
             ("file=pool.csv", "n=5"): "n=5 is more than the 2 texts",
             ("file=empty.csv",): "the pool is empty",
             ("file=missing.csv",): "no such file",
             ("file=.",): ". is a folder; pass one file of texts",
             ("file=pool.csv", "labelled=notes.dat"): "notes.dat: tformer reads texts from .parquet, .csv",
             ("file=pool.csv", "n=two"): "must be a whole number",
             ("n=2",): "needs file=PATH"}
    for args, message in cases.items():
        done = run_tformer("suggest", run, *args, *(["out=picked.csv"] if args != ("file=.",) else []), cwd=tmp_path)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], \
            (args, done.stderr)
    assert not (tmp_path / "picked.csv").exists()


@pytest.mark.slow
def test_a_pool_with_nothing_new_says_so_and_not_n_1(tiny_run):
    from tformer_cli import suggest

    with pytest.raises(TformerError, match="none of the 2 texts in the pool can be suggested"):
        suggest(tiny_run.run_dir, ["seen one", "seen two"], n=1, labelled=["seen one", "seen two"], quiet=True)


@pytest.mark.slow
def test_pandas_missing_texts_dicts_of_columns_and_numpy_counts(tiny_run):
    """A `string` column's pd.NA is an empty text, as None and NaN of an object column are; a dict is read as
    columns (as train(data=) reads it), never as its keys; n may be the np.int64 an array's arithmetic gives."""
    import pandas as pd

    from tformer_cli import suggest

    texts = ["a gripping film", None, "dull from start to end", "", "i laughed and cried"]
    frame = pd.DataFrame({"text": pd.array(texts, dtype="string")})
    assert frame["text"].isna().sum() == 1
    picks = suggest(tiny_run.run_dir, frame, n=3, quiet=True)
    assert sorted(picks.index) == [0, 2, 4]
    with pytest.raises(TformerError, match="n=4 is more than the 3 texts"):  # the missing one counted as empty
        suggest(tiny_run.run_dir, frame, n=4, quiet=True)
    from_dict = suggest(tiny_run.run_dir, {"review": texts[2:], "id": [1, 2, 3]}, n=2, text_column="review",
                        quiet=True)
    assert sorted(from_dict["text"]) == ["dull from start to end", "i laughed and cried"]
    assert len(suggest(tiny_run.run_dir, texts[2:], n=np.int64(2), pool_factor=np.int64(1), quiet=True)) == 2
    column = pd.Series(["a gripping film", np.nan, "dull from start to end"])  # a column taken alone
    assert sorted(suggest(tiny_run.run_dir, column, n=2, quiet=True).index) == [0, 2]
    encoded = pd.DataFrame({"text": [t.encode() for t in texts[2:]]})  # bytes: read as the texts they encode
    assert sorted(suggest(tiny_run.run_dir, encoded, n=2, quiet=True, pool_factor=1)["text"]) == [
        "dull from start to end", "i laughed and cried"]
