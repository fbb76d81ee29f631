"""Resume and caches that cannot mislead: finished runs are never touched, changed data is named and refused,
a run dir is locked while trained, and data caches follow a file's bytes, not its modification time."""
import hashlib
import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT, TINY_TRAINING, run_tformer, tiny
from tformer_cli.errors import TformerError
from tformer_cli.store.layout import RunDir

FAST = tiny("trainer.batch_size=16", "embedding_init.vocab_size=200", "model.max_len=32", base=TINY_TRAINING)


def write_csv(path, rows):
    import csv

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(rows)


def reviews(n, labels=("bad", "good"), flip=False):
    words = {"bad": "dull boring awful plot", "good": "great moving fine acting", "meh": "so so average film"}
    out = []
    for i in range(n):
        label = labels[i % len(labels)]
        shown = labels[(i + 1) % len(labels)] if flip else label
        out.append((f"{words[label]} number {i}", shown))
    return out


def snapshot(run) -> dict:
    """Every file of a run with its bytes' hash and modification time."""
    return {str(p.relative_to(run)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(run.rglob("*")) if p.is_file() and p.name != ".lock"}


def only_run(work):
    runs = [p for p in (work / "outputs" / "train").glob("*/*") if (p / "checkpoints").is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


@pytest.fixture
def csv_run(tmp_path):
    """A finished run trained on CSV files, and the overrides that made it."""
    data = tmp_path / "data"
    data.mkdir()
    write_csv(data / "train.csv", reviews(120))
    write_csv(data / "test.csv", reviews(20))
    args = ["data=files", f"data.train_file={data / 'train.csv'}", f"data.test_file={data / 'test.csv'}", *FAST]
    r = run_tformer("train", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    return tmp_path, only_run(tmp_path), data, args


@pytest.mark.slow
def test_finished_runs_are_never_resumed_or_rewritten(csv_run):
    work, run, data, args = csv_run
    before = snapshot(run)
    r = run_tformer("train", *args, "resume=true", cwd=work)  # the only run has finished: nothing to pick
    assert r.returncode == 2 and "no unfinished run" in r.stderr and "Traceback" not in r.stderr
    r = run_tformer("train", *args, f"resume={run}", cwd=work)
    assert r.returncode == 2 and "has already finished" in r.stderr and "left as it is" in r.stderr
    assert snapshot(run) == before


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_resume_refuses_changed_data_and_says_what_changed(csv_run):
    work, run, data, args = csv_run
    (run / "history.json").unlink()  # as if it had been killed after its last checkpoint
    before = snapshot(run)
    write_csv(data / "train.csv", reviews(60))
    r = run_tformer("train", *args, f"resume={run}", cwd=work)
    assert r.returncode == 2 and "the data changed since the run began" in r.stderr
    assert "rows" in r.stderr and "resume_ignore_data_change=true" in r.stderr
    write_csv(data / "train.csv", reviews(120, flip=True))  # same size, labels flipped
    r = run_tformer("train", *args, f"resume={run}", cwd=work)
    assert r.returncode == 2 and "same 96 rows, different texts or labels" in r.stderr, r.stderr
    write_csv(data / "train.csv", reviews(120, labels=("bad", "good", "meh")))  # a class added
    r = run_tformer("train", *args, f"resume={run}", cwd=work)
    assert r.returncode == 2 and "labels [bad, good] -> [bad, good, meh]" in r.stderr, r.stderr
    r = run_tformer("train", *args, "data.group_column=text", f"resume={run}", cwd=work)  # (another validation split)
    assert r.returncode == 2 and "the config differs in data.group_column (None -> 'text')" in r.stderr, r.stderr
    assert snapshot(run) == before
    write_csv(data / "train.csv", reviews(120, flip=True))
    r = run_tformer("train", *args, f"resume={run}", "resume_ignore_data_change=true", cwd=work)
    assert r.returncode == 0 and "resuming on changed data" in r.stdout, r.stderr[-2000:]


@pytest.mark.slow
def test_a_locked_run_is_refused(csv_run):
    work, run, data, args = csv_run
    (run / "history.json").unlink()
    before = snapshot(run)
    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom tformer_cli.store.layout import RunDir\n"
                               f"with RunDir({str(run)!r}).lock():\n    print('locked', flush=True)\n"
                               "    sys.stdin.read()"],  # holds the lock until killed, however long train takes
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "locked"
        r = run_tformer("train", *args, f"resume={run}", cwd=work)
        assert r.returncode == 2 and f"is in use by another tformer process (pid {holder.pid})" in r.stderr
        assert "Traceback" not in r.stderr
    finally:
        holder.kill()
        holder.wait()
    assert snapshot(run) == before
    with RunDir(run).lock():  # the dead holder's lock went with its process
        pass


def test_a_second_lock_on_the_same_run_is_refused(tmp_path):
    run = RunDir(tmp_path / "run")
    with run.lock():
        with pytest.raises(TformerError, match=f"in use by another tformer process .pid {os.getpid()}"):
            with run.lock():
                pass
    with run.lock():
        pass


def test_data_cache_follows_the_bytes_not_the_modification_time(tmp_path):
    from helpers import data_config
    from tformer_cli.data import sources

    data = tmp_path / "d"
    data.mkdir()
    write_csv(data / "train.csv", reviews(40))
    write_csv(data / "test.csv", reviews(10))
    cfg = data_config("files", train_file=data / "train.csv", test_file=data / "test.csv")
    assert len(sources.load(cfg).splits["test"]) == 10
    stamp = os.stat(data / "test.csv")
    write_csv(data / "test.csv", reviews(6, flip=True))  # rewritten, then its time put back (cp -p, git, sync)
    os.utime(data / "test.csv", ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    loaded = sources.load(cfg).splits["test"]
    assert len(loaded) == 6
    assert loaded["text"][0] == "dull boring awful plot number 0" and loaded.features["label"].int2str(
        loaded["label"][0]) == "good"


def test_fingerprint_names_each_kind_of_change():
    from tformer_cli.data.sources import fingerprint_changes

    base = {"label_names": ["a", "b"], "train": {"rows": 10, "sha256": "x"}, "validation": {"rows": 2, "sha256": "y"}}
    assert fingerprint_changes(base, json.loads(json.dumps(base))) == []
    changed = {**base, "train": {"rows": 5, "sha256": "z"}, "validation": {"rows": 2, "sha256": "w"}}
    assert fingerprint_changes(base, changed) == ["train: 10 -> 5 rows",
                                                  "validation: same 2 rows, different texts or labels"]


@pytest.mark.slow  # three fresh interpreters
def test_the_vocabulary_is_the_same_in_every_process():
    """The WordPiece trainer breaks ties in hash order; three processes with different hash seeds on the same
    varied texts must still give byte-identical tokenizers (else runs and token caches differ)."""
    import random

    rng = random.Random(0)
    stems = ["act", "plot", "scen", "direct", "music", "charact", "dialog", "camer", "light", "edit", "cast", "stor"]
    ends = ["", "s", "ing", "ed", "er", "ion", "ful", "less", "ly"]
    texts = [" ".join(rng.choice(stems) + rng.choice(ends) for _ in range(rng.randint(5, 40))) for _ in range(600)]
    code = ("import sys, json, hashlib\nfrom tformer_cli.data.tokenization import train_wordpiece\n"
            "tok = train_wordpiece(json.load(sys.stdin), 120, 64)\n"
            "print(tok.get_vocab_size(), hashlib.sha256(tok.to_str().encode()).hexdigest())")
    outputs = {subprocess.run([sys.executable, "-c", code], input=json.dumps(texts), capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": str(seed)}, check=True).stdout.strip()
               for seed in (1, 2, 3)}
    assert len(outputs) == 1, outputs


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_a_finished_run_can_be_trained_longer_and_optimizer_state_can_be_dropped(csv_run):
    from tformer_cli import checkpoint

    work, run, data, args = csv_run
    grown = tiny("trainer.epochs=2", base=args)
    r = run_tformer("train", *grown, f"resume={run}", cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resuming at epoch 2" in r.stdout
    assert [h["epoch"] for h in json.loads((run / "history.json").read_text())] == [1, 2]
    assert [p for p in (work / "outputs" / "train").glob("*/*")] == [run]  # no folder left for the resume call
    assert "resumed: tformer train" in (run / "train.log").read_text()

    r = run_tformer("train", *args, "trainer.keep_optimizer_state=false", cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]
    lean = max((p for p in (work / "outputs" / "train").glob("*/*") if p != run), key=lambda p: p.name)
    last = RunDir(lean).last
    assert not last.has_training_state() and checkpoint.load(last).label_names == ["bad", "good"]
    r = run_tformer("train", *grown, "trainer.keep_optimizer_state=false", f"resume={lean}", cwd=work)
    assert r.returncode == 2 and "holds no optimizer state" in r.stderr


def test_a_folder_in_use_is_never_discarded_and_a_copied_checkpoint_is_not_resumed(tmp_path):
    import shutil

    from test_checkpoint_integrity import make_checkpoint
    from tformer_cli.runs.resume import find_resumable
    from tformer_cli.store.ownership import new_run_dir

    run = RunDir(tmp_path / "run")
    new_run_dir(run.root, "train", resume=None)  # made (and marked) by tformer
    with run.lock():  # another process starting a run in the same folder
        assert run.discard_if_empty() is False and run.root.is_dir()
    assert run.discard_if_empty() is True and not run.root.exists()
    ckpt = make_checkpoint(tmp_path / "r" / "checkpoints" / "last")
    (ckpt.path / "trainer_state.json").write_text("{}")
    shutil.copytree(ckpt.path, tmp_path / "copied" / "last")
    assert find_resumable(str(tmp_path / "r"), "train").path == ckpt.path
    with pytest.raises(TformerError, match="outside its run directory"):
        find_resumable(str(tmp_path / "copied" / "last"), "train")
    calibrated = RunDir(tmp_path / "cal")  # a run of a command that trains nothing
    calibrated.best.path.mkdir(parents=True)
    calibrated.log("calibrate").write_text("calibration ...\n")
    with pytest.raises(TformerError, match="a `tformer calibrate` run, which trains nothing to continue"):
        find_resumable(str(calibrated.root), "train")
    audited = RunDir(tmp_path / "audit")
    audited.root.mkdir()
    audited.log("audit").write_text("audit ...\n")
    with pytest.raises(TformerError, match="continue it with tformer audit ... resume="):
        find_resumable(str(audited.root), "train")


def test_a_resume_of_a_run_on_another_dataset_is_told_its_data_group_not_each_key():
    """resume=true picked an IMDB run and advised `add: data.hub_id=stanfordnlp/imdb data.name=imdb ...`, which then
    read the Hub: the group, its folder, and what the run set apart from the group's defaults."""
    from helpers import compose_config
    from tformer_cli.runs.resume import _as_it_was, config_diff
    from tformer_cli.typed_config import plain

    saved = plain(compose_config("train", "data=imdb", "data.dir=/d/imdb", "data.max_train_samples=300"))
    tree = plain(compose_config("train"))
    assert _as_it_was(saved, config_diff(saved, tree)) == " (add: data=imdb data.dir=/d/imdb data.max_train_samples=300)"


def test_a_run_saved_before_group_column_resumes_only_with_its_random_validation_rows():
    """A 20 Newsgroups run saved without data.group_column carved random rows: resumed under the new default
    (whole threads) its validation split would change, so the key is compared as null and the fix is named."""
    from helpers import compose_config
    from tformer_cli.runs.resume import _as_it_was, config_diff
    from tformer_cli.typed_config import plain

    tree = plain(compose_config("train", "data=twenty_newsgroups"))
    saved = plain(compose_config("train", "data=twenty_newsgroups"))
    del saved["data"]["group_column"]
    assert config_diff(saved, tree) == ["data.group_column"]
    assert _as_it_was(saved, ["data.group_column"]) == " (add: data.group_column=null)"
    assert config_diff(saved, plain(compose_config("train", "data=twenty_newsgroups", "data.group_column=null"))) == []
    files = plain(compose_config("train", "data=files"))
    assert config_diff({**files, "data": {k: v for k, v in files["data"].items() if k != "group_column"}}, files) == []
