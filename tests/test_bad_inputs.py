"""One table per kind of bad input, tried on every job that reads it: each is refused in one line that names the
problem and the fix (a TformerError from Python; exit 2 and one stderr line from the command), or read safely where
that is the documented behaviour (a lone surrogate is U+FFFD everywhere). The tables are the cases; the jobs are
generated from them, not written out per job."""
import json
import shutil

import numpy as np
import pandas as pd
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

import hf_folders
from helpers import TINY_TRAINING, copy_run, run_tformer
from tformer_cli import Classifier, TformerError, audit, distill, suggest, train
from tformer_cli.deploy.export import export_onnx
from tformer_cli.deploy.serve import BadRequest, ServeLimits, parse_request
from tformer_cli import checkpoint
from tformer_cli.store import manifest

FAST = [*TINY_TRAINING, "trainer.test_after_fit=false"]


# ---------------------------------------------------------------------------------------------------------------
# Labels: every job that reads labelled rows (train, audit, distill from Python; evaluate from the command line)

def _rows(labels) -> pd.DataFrame:
    n = len(labels)
    return pd.DataFrame({"text": [f"text number {i} about {'ab'[i % 2]}" for i in range(n)], "label": labels})


BAD_LABELS = {  # name: (file, labels, multi-label, what the line says)
    "empty string label, parquet": ("empty.parquet", ["a", "b", ""] * 10, False, "has an empty label (row 3"),
    "blank string label, json lines": ("blank.jsonl", ["a", "b", "  "] * 10, False, "has an empty label (row 3"),
    "null in a column of label lists": ("null_set.jsonl", [["a"], ["b"], None] * 10, True, "null label (row 3)"),
    "empty name inside a label list": ("empty_name.parquet", [["a"], ["b"], ["a", ""]] * 10, True,
                                       "empty or null label name in row 3"),
}


def _write(folder, name, labels):
    path = folder / name
    frame = _rows(labels)
    if name.endswith(".parquet"):
        frame.to_parquet(path, index=False)
    else:
        frame.to_json(path, orient="records", lines=True)
    return path


def _labelled_jobs(path, multi, teacher):
    data = ["data=files", f"data.train_file={path}", f"data.multi_label={str(multi).lower()}"]
    jobs = {"train": lambda: train([*data, *FAST], quiet=True)}
    if not multi:  # (the audit reads single labels; multi-label data is refused as such, in one line)
        jobs["audit"] = lambda: audit([*data, *FAST, "audit.folds=2"], quiet=True)
    if teacher is not None:
        jobs["distill"] = lambda: distill([f"teacher={teacher}", *data, *FAST], quiet=True)
    return jobs


@pytest.mark.parametrize("case", list(BAD_LABELS))
def test_bad_labels_are_one_line_in_every_job(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name, labels, multi, message = BAD_LABELS[case]
    path = _write(tmp_path, name, labels)
    for job, run in _labelled_jobs(path, multi, None).items():
        with pytest.raises(TformerError, match=message.replace("(", r"\(").replace(")", r"\)")):
            run()
    assert not list(tmp_path.glob("outputs/*/*/*/checkpoints"))  # (nothing trained)


@pytest.mark.slow  # the shared tiny run as teacher and as the checkpoint evaluated
def test_bad_labels_are_one_line_in_distill_and_evaluate(tiny_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for case, (name, labels, multi, message) in BAD_LABELS.items():
        path = _write(tmp_path, name, labels)
        with pytest.raises(TformerError, match=message.replace("(", r"\(").replace(")", r"\)")):
            _labelled_jobs(path, multi, tiny_run.run_dir)["distill"]()
        if not multi:  # (the tiny run is single-label: a multi-label file is refused as such first)
            r = run_tformer("evaluate", f"checkpoint={tiny_run.run_dir}", f"test_file={path}", cwd=tmp_path)
            assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# ---------------------------------------------------------------------------------------------------------------
# Values saved in a checkpoint (an edited or damaged meta.json): every job that loads a checkpoint

BAD_META = {  # name: (meta.json keys, what the line says)
    "temperature 1e308 (every probability equal)": ({"temperature": 1e308}, "temperature=1e+308, not a number from"),
    "temperature below the fitted range": ({"temperature": 1e-9}, "not a number from 0.05 to 50"),
    "negative temperature": ({"temperature": -1.0}, "not a number from 0.05 to 50"),
    "temperature that is a string": ({"temperature": "2"}, "not a number from 0.05 to 50"),
}


@pytest.mark.slow
def test_bad_checkpoint_values_are_one_line_in_every_job(tiny_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = copy_run(tiny_run.run_dir, tmp_path / "run")
    best = run / "checkpoints" / "best"
    original = json.loads((best / "meta.json").read_text())
    jobs = {"API Classifier.load (predict, serve)": lambda: Classifier.load(run),
            "export": lambda: export_onnx(best, tmp_path / "onnx"),
            "distill (a teacher)": lambda: distill([f"teacher={run}", *FAST], quiet=True),
            "suggest": lambda: suggest(run, ["some text"], n=1, quiet=True)}
    for case, (keys, message) in BAD_META.items():
        checkpoint.update_meta(checkpoint.CheckpointDir(best), {**original, **keys})
        for job, load in jobs.items():
            with pytest.raises(TformerError, match=message.replace("+", r"\+")):
                load()
    checkpoint.update_meta(checkpoint.CheckpointDir(best), {**original, "temperature": 1e308})
    for command in (["predict", f"--checkpoint={run}", "a text"], ["serve", f"checkpoint={run}", "port=0"],
                    ["evaluate", f"checkpoint={run}"]):
        r = run_tformer(*command, cwd=tmp_path)
        assert r.returncode == 2 and "temperature=1e+308" in r.stderr, (command, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


# ---------------------------------------------------------------------------------------------------------------
# Texts a program can hold but no encoder can write: a lone surrogate is read as U+FFFD, as predict reads it

LONE = "a \ud800 review"


@pytest.mark.slow
def test_lone_surrogates_are_replaced_in_every_job(tiny_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    texts = [f"good film {i}" for i in range(20)] + [LONE]
    labels = ["pos", "neg"] * 10 + ["neg"]
    for given in ((texts, labels), {"text": texts, "label": labels}):
        assert train(FAST, data=given, quiet=True).run_dir.is_dir()
    stored = [pd.read_parquet(p) for p in tmp_path.glob("outputs/data/**/*.parquet")]
    assert stored and all("a \ufffd review" in frame["text"].tolist() for frame in stored)
    picked = suggest(tiny_run.run_dir, [LONE, "another text"], n=2, quiet=True, labelled=None)
    assert "a \ufffd review" in picked.iloc[:, 0].tolist()
    assert Classifier.load(tiny_run.run_dir).predict([LONE])[0]["label"] in Classifier.load(tiny_run.run_dir).labels
    texts, _ = parse_request(json.dumps([LONE]).encode(), ServeLimits(), 2)
    assert texts == ["a \ufffd review"]


@pytest.mark.slow  # the shared tiny run, loaded
def test_a_batch_size_torch_cannot_index_is_refused_from_python(tiny_run):
    """10**20 overflowed torch's split: a traceback from predict and suggest, a 500 from every request served."""
    from tformer_cli.deploy.serve import create_app

    clf = Classifier.load(tiny_run.run_dir)
    for call in (lambda: clf.predict(["a text"], batch_size=10 ** 20),
                 lambda: clf.embed(["a text"], batch_size=10 ** 20),
                 lambda: suggest(tiny_run.run_dir, ["a", "b"], n=1, quiet=True, labelled=None, batch_size=10 ** 20),
                 lambda: create_app(clf, max_batch=10 ** 20)):
        with pytest.raises(TformerError, match="must be at most 1048576"):
            call()
    answer = clf.predict(["a text"], top_k=np.int64(2), batch_size=np.int32(8))[0]  # (a count from numpy arithmetic)
    assert len(answer["top_k"]) == 2


def test_a_bad_top_k_is_shown_safely():
    for body in (b'{"texts": ["a"], "top_k": "\\ud800"}', b'{"texts": ["a"], "top_k": ' + b"9" * 4000 + b"}"):
        with pytest.raises(BadRequest) as caught:
            parse_request(body, ServeLimits(max_body_bytes=1 << 20), 2)
        json.dumps(str(caught.value)).encode("utf-8")  # (the answer's body: no lone surrogate, a short line)
        assert len(str(caught.value)) < 120 and "\ud800" not in str(caught.value)


def test_a_number_too_long_to_read_is_a_400_not_a_500():
    for body in (b'{"texts": ["a"], "top_k": ' + b"9" * 4984 + b"}", b"[" + b"1" * 5000 + b"]"):
        with pytest.raises(BadRequest, match="a number too long to read") as caught:
            parse_request(body, ServeLimits(max_body_bytes=1 << 20), 2)
        assert caught.value.status == 400


# ---------------------------------------------------------------------------------------------------------------
# Tokenizers and pretrained folders that cannot work: refused when loaded, not at the first batch

def _unigram_without_unk() -> Tokenizer:
    tok = Tokenizer(models.Unigram([("<pad>", 0.0), ("a", -1.0), ("b", -2.0)], unk_id=None))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


@pytest.mark.slow  # writes a BERT folder with transformers
def test_broken_tokenizers_and_tables_are_one_line(tiny_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = hf_folders.write("bert", tmp_path / "bert")
    grown = Tokenizer.from_file(str(folder / "tokenizer.json"))
    grown.add_tokens([f"newword{i}" for i in range(50)])
    grown.save(str(folder / "tokenizer.json"))
    with pytest.raises(TformerError, match="the tokenizer gives ids up to .* but the embedding table has only"):
        train(["model=pretrained", f"model.pretrained={folder}", *FAST], quiet=True)
    run = copy_run(tiny_run.run_dir, tmp_path / "run")
    _unigram_without_unk().save(str(run / "checkpoints" / "best" / "tokenizer.json"))
    shutil.rmtree(run / "checkpoints" / "last", ignore_errors=True)
    manifest.write(checkpoint.CheckpointDir(run / "checkpoints" / "best"))  # (as if written so: not an edit)
    for load in (lambda: Classifier.load(run), lambda: suggest(run, ["x y"], n=1, quiet=True)):
        with pytest.raises(TformerError, match="cannot encode a character outside its vocabulary"):
            load()
    r = run_tformer("predict", f"--checkpoint={run}", "a text", cwd=tmp_path)
    assert r.returncode == 2 and "unk_id" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_distillation_settings_that_would_overflow_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for value in ("1e30", "0.01", "nan"):
        with pytest.raises(TformerError, match="distill.temperature"):
            distill(["teacher=nowhere", f"distill.temperature={value}"], quiet=True)


def test_fold_splits_are_checked_before_the_first_fold_trains(tmp_path, monkeypatch):
    """A class with too few rows outside a fold to carve that fold model's validation split is refused up front."""
    monkeypatch.chdir(tmp_path)
    labels = ["a"] * 20 + ["b"] * 20 + ["rare"] * 3
    frame = pd.DataFrame({"text": [f"text {i} {labels[i]}" for i in range(len(labels))], "label": labels})
    with pytest.raises(TformerError, match="class 'rare' has 3 row"):
        audit([*FAST, "audit.folds=2"], data=frame, quiet=True)
    assert not list(tmp_path.glob("outputs/audit/*/*/fold_*"))


def test_a_column_of_label_lists_without_multi_label_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, "sets.jsonl", [["a", "b"], ["a"]] * 15)
    for run in (lambda: train(["data=files", f"data.train_file={path}", *FAST], quiet=True),
                lambda: audit(["data=files", f"data.train_file={path}", *FAST], quiet=True)):
        with pytest.raises(TformerError, match="holds lists .* add data.multi_label=true"):
            run()


@pytest.mark.slow  # two commands
def test_a_file_that_is_not_utf8_is_one_line_naming_the_byte_in_train_and_pretrain(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes(("text,label\n" + "".join(f"film {i},{'ab'[i % 2]}\n" for i in range(20))).encode()
                     + b"caf\xe9 cr\xe8me,a\n")
    for command in ("train", "pretrain"):
        r = run_tformer(command, "data=files", f"data.train_file={path}", *FAST[:1], cwd=tmp_path)
        assert r.returncode == 2 and "line 22 is not valid UTF-8 (byte 3 of the line)" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "warning" not in r.stdout, r.stdout + r.stderr
