"""`tformer audit`: a planted wrong label is found, an interrupted audit resumes to the same answer, checkpoint=
scores with an existing model, copies are listed, and bad input is one line."""
import random
import re
import sys

import datasets
import pandas as pd
import pytest

from helpers import TINY_TRAINING, interrupted_when, run_tformer, tiny
from tformer_cli import TformerError, audit, train
from tformer_cli.data.sources import LoadedData
from tformer_cli.errors import ConfigError
from tformer_cli.runs.audit import INSTALL, duplicates

SPORTS = "goal match team score player coach league stadium referee striker".split()
COOKING = "recipe oven flour sugar bake kitchen pan butter dough whisk".split()
PLANTED = 10  # a sports text labelled cooking
FOLDS = tiny("trainer.epochs=3", "audit.folds=3", base=TINY_TRAINING)
GROUPED = "data.group_column=author"  # two texts an author: a fold holds both or neither


def separable_rows() -> pd.DataFrame:
    """160 texts of two vocabularies that share no word: any model tells them apart, so the one flipped label is
    the one error."""
    rng = random.Random(0)
    rows = []
    for i in range(160):
        label = "sports" if i % 2 == 0 else "cooking"
        rows.append({"text": " ".join(rng.choice(SPORTS if label == "sports" else COOKING) for _ in range(8)),
                     "label": label, "author": f"author {i // 4 * 2 + i % 2}"})
    rows[PLANTED]["label"] = "cooking"
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def labelled_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("audit_data") / "labelled.csv"
    separable_rows().to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def audited(labelled_csv, tmp_path_factory):
    """One whole k-fold audit of the CSV (the Python API)."""
    out = tmp_path_factory.mktemp("audit_run")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(out)
        return audit([*FOLDS, "data=files", f"data.train_file={labelled_csv}"], run_dir=out / "audit")


@pytest.mark.slow
def test_planted_label_error_is_ranked_first(audited):
    planted = separable_rows().iloc[PLANTED]
    first = audited.issues.iloc[0]
    assert (first.text, first.given_label, first.suggested_label) == (planted.text, "cooking", "sports")
    saved = pd.read_csv(audited.files["label_issues"])
    assert saved["text"].tolist() == audited.issues["text"].tolist()
    assert {"text", "given_label", "suggested_label", "score", "fold"} <= set(saved.columns)
    assert saved["score"].is_monotonic_increasing
    assert len(audited.scores) == 160 and sorted(audited.scores["fold"].unique()) == [1, 2, 3]
    for i in range(3):  # each fold keeps its held-out probabilities, not its checkpoint
        assert (audited.run_dir / f"fold_{i + 1}" / "out_of_fold.npz").is_file()
        assert not (audited.run_dir / f"fold_{i + 1}" / "checkpoints").exists()


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_an_interrupted_audit_resumes_with_its_finished_folds(audited, labelled_csv, tmp_path):
    args = ["audit", *FOLDS, "data=files", f"data.train_file={labelled_csv}"]
    code, shown = interrupted_when("outputs/audit/*/*/fold_1/out_of_fold.npz", *args, cwd=tmp_path)
    assert code == 130, shown
    folder = next(tmp_path.glob("outputs/audit/*/*/fold_1")).parent
    assert f"resume={folder}" in shown and not (folder / "label_issues.csv").exists()
    resumed = run_tformer(*args, f"resume={folder}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "fold 1/3: done earlier" in resumed.stdout
    assert len(re.findall(r"^epoch +1/3 ", resumed.stdout, re.M)) == 2  # (folds 2 and 3 show their epochs)
    assert "flagged by cleanlab (prune_by_noise_rate," in " ".join(resumed.stdout.split())
    assert pd.read_csv(folder / "label_issues.csv")["text"].tolist() == audited.issues["text"].tolist()
    assert len(list(tmp_path.glob("outputs/audit/*/*"))) == 1  # the resume's own new folder was not left behind


@pytest.mark.slow
def test_an_audit_by_groups_keeps_each_group_in_one_fold(labelled_csv, tmp_path, monkeypatch):
    """data.group_column: a fold holds all of an author's texts or none (and each fold model carves its own
    validation split by the same groups); the planted error is still found."""
    monkeypatch.chdir(tmp_path)
    result = audit([*FOLDS, "data=files", f"data.train_file={labelled_csv}", GROUPED], run_dir=tmp_path / "grouped")
    author = dict(zip(separable_rows()["text"], separable_rows()["author"]))
    assert result.scores.groupby(result.scores["text"].map(author))["fold"].nunique().max() == 1
    assert sorted(result.scores["fold"].unique()) == [1, 2, 3]
    assert result.issues.iloc[0].text == separable_rows().iloc[PLANTED].text
    assert "groups by group (a group's texts stay on one side)" in (tmp_path / "grouped" / "fold_1" / "train.log"
                                                                     ).read_text()


@pytest.mark.slow
def test_checkpoint_mode_scores_with_an_existing_model(labelled_csv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = train([*tiny("trainer.epochs=3", base=TINY_TRAINING), "data=files", f"data.train_file={labelled_csv}",
                 "data.validation_fraction=0.25"], quiet=True)
    result = audit([f"checkpoint={run.run_dir}"], run_dir=tmp_path / "quick")
    assert result.mode == "checkpoint" and len(result.scores) == 160
    assert (result.scores["split"] == "validation").sum() == 40  # the run's own split
    assert result.issues["fold"].isna().all()
    log = (tmp_path / "quick" / "audit.log").read_text()
    assert "may have trained on" in log
    # data=<the run's own dataset> typed again keeps the split the run carved (as evaluate does)
    again = audit([f"checkpoint={run.run_dir}", "data=files", f"data.train_file={labelled_csv}"],
                  run_dir=tmp_path / "typed")
    validation = lambda r: set(r.scores.loc[r.scores["split"] == "validation", "text"])  # noqa: E731
    assert validation(again) == validation(result)
    for unused in ("audit.folds=9", "model=static", "trainer.epochs=7", "optimizer.lr=0.1"):  # (no fold is trained)
        with pytest.raises(ConfigError, match=f"{unused.split('=')[0]}= is for the fold models, which "
                                              f"checkpoint= does not train"):
            audit([f"checkpoint={run.run_dir}", unused], run_dir=tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def test_folds_keep_groups_whole_and_stay_stratified():
    """assign_folds with groups: every group in one fold, each class spread over the folds by its groups' rows."""
    import numpy as np

    from tformer_cli.runs.audit import assign_folds

    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(300), rng.integers(1, 8, 300))
    labels = (groups % 3).astype(np.int64)  # a group's texts share a class
    fold_of = assign_folds(labels, 5, seed=0, groups=groups)
    assert all(len(set(fold_of[groups == g])) == 1 for g in range(300))
    for c in range(3):
        share = np.bincount(fold_of[labels == c], minlength=5) / (labels == c).sum()
        assert np.abs(share - 0.2).max() < 0.04  # (half the largest group either way)
    assert not np.array_equal(fold_of, assign_folds(labels, 5, seed=1, groups=groups))
    with pytest.raises(TformerError, match=r"^audit.folds=5: the rows fall in 3 groups \(data.group_column\), too few "
                                           r"to fill 5 folds; lower audit.folds"):
        assign_folds(np.array([0, 0, 1, 1, 1, 0]), 5, seed=0, groups=np.array([0, 0, 1, 1, 2, 2]))
    lone = np.r_[labels, [3, 3, 3]]  # a class whose 3 rows share one group: one fold model would never see it
    with pytest.raises(TformerError, match=r"^audit.folds=5: every row of class 'd' \(3, in 1 group of "
                                           r"data.group_column\) falls in one fold, whose model would never see"):
        assign_folds(lone, 5, seed=0, names=list("abcd"), groups=np.r_[groups, [300, 300, 300]])
    unseen = np.where(labels == 1, 2, labels)  # (a class with no audited row, only test rows: nothing to refuse)
    assert len(set(assign_folds(unseen, 5, seed=0, names=list("abc"), groups=groups))) == 5
    two = np.repeat(np.arange(100), 3)  # (classes of 2 equal groups: always in 2 folds, whatever the seed)
    for seed in range(10):
        assert len(set(assign_folds(two // 2, 5, seed=seed, groups=two)[two // 2 == 7])) == 2


def test_copies_within_and_across_splits_are_listed():
    split = lambda texts, labels: datasets.Dataset.from_dict({"text": texts, "label": labels})
    data = LoadedData(datasets.DatasetDict({
        "train": split(["A fine film", "a  FINE film", "dull", "unique"], [1, 0, 0, 1]),
        "test": split(["dull", "something else"], [0, 1])}), ["neg", "pos"], "test")
    found = duplicates(data)
    groups = {g: set(zip(rows["split"], rows["row"])) for g, rows in found.groupby("group")}
    assert sorted(groups.values(), key=len) == [{("train", 2), ("test", 0)}, {("train", 0), ("train", 1)}]
    leak = found[found["across_splits"]]
    assert set(leak["kind"]) == {"exact"} and not leak["labels_differ"].any()
    near = found[~found["across_splits"]]
    assert set(near["kind"]) == {"near"} and near["labels_differ"].all()


def test_without_cleanlab_the_audit_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "cleanlab", None)  # as if not installed: `import cleanlab` fails
    monkeypatch.setitem(sys.modules, "cleanlab.filter", None)
    with pytest.raises(TformerError) as exc:
        audit(["audit.folds=3"])
    assert str(exc.value) == INSTALL and "tformer[audit]" in INSTALL


@pytest.mark.slow
@pytest.mark.parametrize("args,expected", [
    (["audit.folds=1"], "audit.folds"),
    (["data=files", "data.train_file=texts.csv"], "label"),
    (["audit.splits=[train,train]"], "names a split twice"),
    (["audit.folds=1000", "data.n_train=200"], "class 'negative' has"),  # (refused after its plan is written)
])
def test_bad_input_is_one_line(tmp_path, args, expected):
    pd.DataFrame({"text": ["one text", "another text", "a third"]}).to_csv(tmp_path / "texts.csv", index=False)
    done = run_tformer("audit", *args, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], done.stderr
    assert not list(tmp_path.glob("outputs/audit/*/*")), "a refused audit left its folder"


def test_a_resumed_audit_with_other_fold_settings_is_refused(tmp_path):
    """The plan holds what shapes the fold models: a resume that changes any of it names the keys; one that only
    changes where or how fast it runs goes on."""
    from tformer_cli.runs.audit import _check_plan

    training = {"model": {"name": "tiny", "d_model": 64}, "optimizer": {"lr": 3e-4}, "trainer": {"epochs": 3,
                                                                                                  "device": "cpu"}}
    plan = {"mode": "folds", "folds": 3, "seed": 0, "data": "abc", "rows": 240, "training": training,
            "reading": {"validation_fraction": 0.2, "seed": 0}}
    path = tmp_path / "audit_plan.json"
    _check_plan(path, plan, resuming=False)
    _check_plan(path, {**plan, "training": {**training, "trainer": {"epochs": 3, "device": "cuda"}}}, resuming=True)
    changed = {**training, "optimizer": {"lr": 0.5}, "trainer": {"epochs": 1, "device": "cpu"}}
    with pytest.raises(TformerError, match=r"optimizer.lr \(0.0003 -> 0.5\), trainer.epochs \(3 -> 1\)"):
        _check_plan(path, {**plan, "training": changed}, resuming=True)
    with pytest.raises(TformerError, match="the data differs \\(as many rows, other texts, labels or splits"):
        _check_plan(path, {**plan, "data": "other"}, resuming=True)
    with pytest.raises(TformerError, match="the data differs \\(240 -> 230 rows audited\\)"):
        _check_plan(path, {**plan, "rows": 230}, resuming=False)
    with pytest.raises(TformerError, match=r"data.validation_fraction \(0.2 -> 0.3\) differs from the audit"):
        _check_plan(path, {**plan, "reading": {"validation_fraction": 0.3, "seed": 0}}, resuming=True)
    with pytest.raises(TformerError, match=r": folds \(3 -> 5\) differs from the audit being resumed"):
        _check_plan(path, {**plan, "folds": 5}, resuming=True)
    with pytest.raises(TformerError, match=r": folds \(3 -> 5\), seed \(0 -> 1\) differ from"):
        _check_plan(path, {**plan, "folds": 5, "seed": 1}, resuming=True)
    _check_plan(path, {**plan, "group_column": None}, resuming=True)
    # a plan that kept groups without naming its column (its fingerprint holds them): the same data resumes
    _check_plan(path, {**plan, "group_column": "thread"}, resuming=True)
    with pytest.raises(TformerError, match=r"the data differs .* \(an audit begun by an older tformer kept no "
                                           r"groups: add data.group_column=null\)"):
        _check_plan(path, {**plan, "data": "other", "group_column": "thread"}, resuming=True)
    grouped = tmp_path / "grouped_plan.json"
    _check_plan(grouped, {**plan, "group_column": "thread"}, resuming=False)
    with pytest.raises(TformerError, match=r"data.group_column differs \('thread' -> None\); resume with "
                                           r"data.group_column=thread"):
        _check_plan(grouped, {**plan, "data": "other", "group_column": None}, resuming=True)


def test_resume_true_continues_the_newest_unfinished_audit(tmp_path, monkeypatch):
    import os

    from tformer_cli.runs.audit import ISSUES, PLAN, _resumed_audit

    monkeypatch.chdir(tmp_path)
    stopped, finished = (tmp_path / "outputs" / "audit" / "2026-01-01" / t for t in ("00-00-00", "00-00-01"))
    for folder in (stopped, finished):
        folder.mkdir(parents=True)
        (folder / PLAN).write_text("{}")
    (finished / ISSUES).write_text("split,row\n")  # (a finished audit: nothing to continue)
    os.utime(stopped / PLAN, (1, 1))  # the older one
    assert _resumed_audit(True).resolve() == stopped.resolve()
    (stopped / ISSUES).write_text("split,row\n")
    with pytest.raises(TformerError, match="no unfinished audit"):
        _resumed_audit(True)
