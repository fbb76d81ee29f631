"""What surrounds a run: output that reads well in files and pipes, a complete run log, Ctrl-C clean in every
phase, and no folders left behind by refused commands."""
import csv
import json
import os
import re
import signal
import subprocess
import time

import pytest

from helpers import TFORMER, TINY_TRAINING, copy_run, ctrl_c_reaches_it, run_tformer, tiny

pytestmark = pytest.mark.slow  # subprocess runs of the installed command

FAST = tiny("trainer.batch_size=32", "model.max_len=32", base=TINY_TRAINING)  # for any data (data=files too)
DEMO = tiny(*FAST)  # the same on TINY's demo data: 300 texts, 10 batches an epoch
ANSI = re.compile(r"\x1b\[")
# a plain progress line on stderr (console.PlainProgress): how many depends on how fast the machine is
PROGRESS = re.compile(r"^[^:]+: [\d,]+(/[\d,]+)? \w+.*\d+ (s|min) elapsed")


def run_dirs(work, task="train"):
    return sorted(p for p in (work / "outputs" / task).glob("*/*") if p.is_dir())


def test_piped_output_is_full_width_plain_and_kept_in_train_log(tmp_path):
    names = [f"category_with_a_long_name_{i:02d}" for i in range(20)]
    with open(tmp_path / "train.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(400):
            w.writerow([f"word{i % 20} token{i % 20} filler text {i}", names[i % 20]])
    r = run_tformer("train", "data=files", f"data.train_file={tmp_path / 'train.csv'}", "data.test_fraction=0.2",
                    *FAST, cwd=tmp_path, env={"COLUMNS": "80"})  # stdout is a pipe: must not wrap at 80
    assert r.returncode == 0, r.stderr[-2000:]
    run = run_dirs(tmp_path)[-1]
    out = r.stdout
    assert not ANSI.search(out) and "…" not in out
    assert f"best checkpoint: {run / 'checkpoints' / 'best'} (epoch" in out  # a long path, on one line
    matrix = [line for line in out.splitlines() if line.split()[:3] == ["true", "1", "2"]]  # numbered columns
    assert matrix and len(matrix[0]) <= 120  # the 20-class matrix, whole, in a plain text's width
    header = next(line for line in out.splitlines() if "train loss" in line and "val acc" in line)
    assert "samples per s" in header
    for name in names:
        assert name in out
    assert "%|" not in r.stderr and "it/s]" not in r.stderr and "examples/s" not in r.stderr  # no library bars
    log = (run / "train.log").read_text()
    assert log.startswith("===== ") and "\ntrainer:\n" in log and "\ndata:\n" in log
    for line in out.splitlines():
        assert line in log, f"missing from train.log: {line!r}"


@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_refused_and_failed_commands_leave_no_run_directory(tmp_path):
    r = run_tformer("train", "trainer.epochs=0", cwd=tmp_path)
    assert r.returncode == 2 and "trainer.epochs" in r.stderr
    r = run_tformer("train", "data=files", f"data.train_file={tmp_path / 'missing.csv'}", cwd=tmp_path)
    assert r.returncode == 2 and "not found" in r.stderr
    r = run_tformer("evaluate", f"checkpoint={tmp_path / 'nowhere'}", cwd=tmp_path)
    assert r.returncode == 2
    assert run_dirs(tmp_path) == [] and run_dirs(tmp_path, "evaluate") == []


def test_a_run_that_failed_before_its_first_checkpoint_gets_one_answer(tmp_path):
    """Neither the folder's refusal nor resume= sends the user to the other: both say there is nothing to resume."""
    args = tiny("optimizer.lr=1e30", "trainer.grad_clip=0", "trainer.log_every_steps=1")
    r = run_tformer("train", *args, "hydra.run.dir=run", cwd=tmp_path)
    assert r.returncode == 2 and "try a lower learning rate" in r.stderr and (tmp_path / "run" / "train.log").is_file()
    again = run_tformer("train", *args, "hydra.run.dir=run", cwd=tmp_path)
    assert again.returncode == 2 and "stopped before its first checkpoint" in again.stderr
    assert "resume=" not in again.stderr
    resumed = run_tformer("train", *args, f"resume={tmp_path / 'run'}", cwd=tmp_path)
    assert resumed.returncode == 2 and "nothing to continue; start it again" in resumed.stderr


def test_matplotlib_s_first_run_notice_is_not_shown(tmp_path):
    """A fresh matplotlib cache (a new machine, a CI runner) builds its font list and logs it at INFO, which Hydra's
    logging would print as a [HYDRA] line in the middle of the run's output."""
    r = run_tformer("train", *tiny(), cwd=tmp_path, env={"MPLCONFIGDIR": str(tmp_path / "matplotlib")})
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "matplotlib").is_dir() and "fontManager" not in r.stdout + r.stderr


def interrupt_when(args, cwd, ready, *, stream="stdout", env=None):
    """Start `tformer <args>`, send SIGINT once `ready(<stream> so far)` holds; (rc, stdout, stderr)."""
    import threading

    proc = subprocess.Popen([TFORMER, *args], cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200", **(env or {})},
                            preexec_fn=ctrl_c_reaches_it)
    seen: dict[str, list[str]] = {"stdout": [], "stderr": []}
    readers = [threading.Thread(target=lambda name=name, f=f: seen[name].extend(iter(f.readline, "")), daemon=True)
               for name, f in (("stdout", proc.stdout), ("stderr", proc.stderr))]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + 1800  # only ends a hung run, as a failure
    while proc.poll() is None and not ready("".join(seen[stream])):
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"not ready after 30 min: {''.join(seen[stream])[-2000:]}")
        time.sleep(0.02)
    assert proc.poll() is None, f"finished before it could be interrupted: {''.join(seen['stdout'])[-500:]}"
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    for reader in readers:
        reader.join(timeout=10)
    return proc.returncode, "".join(seen["stdout"]), "".join(seen["stderr"])


def messages(err):
    """stderr's lines but the progress lines (their number depends on the machine's speed, not on tformer)."""
    return [line for line in err.splitlines() if line.strip() and not PROGRESS.match(line)]


def assert_clean_stop(rc, err):
    assert rc == 130, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    lines = messages(err)
    assert len(lines) == 1 and lines[0].startswith("interrupted"), lines


def wait_until_stdin_is_read(proc, timeout=300):
    """Until `proc` has read all that was written to its stdin pipe (it then waits for more): no sleep that a
    slow start-up could outlast."""
    import fcntl
    import struct
    import termios

    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        unread = struct.unpack("i", fcntl.ioctl(proc.stdin.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
        if unread == 0:
            return
        time.sleep(0.02)
    raise AssertionError(f"stdin not read (exit code {proc.poll()})")


def test_ctrl_c_during_data_preparation_is_one_line_and_leaves_nothing(tmp_path):
    args = ["train", *tiny("data.n_train=120000", "embedding_init.vocab_size=2000", base=DEMO)]
    rc, out, err = interrupt_when(args, tmp_path, lambda seen: "data demo" in seen)  # vocabulary and tokens next
    assert_clean_stop(rc, err)
    assert run_dirs(tmp_path) == []


def test_ctrl_c_during_evaluate_and_predict_is_one_line(tiny_run, tmp_path):
    copy_run(tiny_run.run_dir, tmp_path / "outputs" / "train" / "2000-01-01" / "00-00-00")  # the newest run here
    rc, out, err = interrupt_when(["evaluate", "data=demo", "data.n_test=100000"], tmp_path,
                                  lambda seen: "checkpoint" in seen)
    assert_clean_stop(rc, err)
    assert run_dirs(tmp_path, "evaluate") == []
    proc = subprocess.Popen([TFORMER, "predict"], cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches_it)  # waits for stdin
    proc.stdin.write("a first line\n")
    proc.stdin.flush()
    wait_until_stdin_is_read(proc)  # (the pipe stays open: it waits for more lines)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert_clean_stop(proc.returncode, err)


# sitecustomize for the process under test: every network connect it attempts, one line each, to a file
COUNT_CONNECTS = """
import os, socket
_connect = socket.socket.connect
def connect(self, address):
    if isinstance(address, tuple):  # (host, port): not a Unix socket
        with open(os.environ["TFORMER_TEST_CONNECTS"], "a") as f:
            f.write(repr(address) + "\\n")
    return _connect(self, address)
socket.socket.connect = connect
"""


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {"HF_HUB_OFFLINE": "", "HF_ENDPOINT": "http://127.0.0.1:9"}])
def test_no_network_fails_fast_with_one_line(tmp_path, env):
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "sitecustomize.py").write_text(COUNT_CONNECTS)
    connects = tmp_path / "connects.txt"
    path = os.pathsep.join(p for p in (str(tmp_path / "probe"), os.environ.get("PYTHONPATH")) if p)
    env = {"TFORMER_DATA_ROOT": str(tmp_path), **env, "PYTHONPATH": path, "TFORMER_TEST_CONNECTS": str(connects)}
    r = run_tformer("train", "data=imdb", cwd=tmp_path, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "could not load stanfordnlp/imdb" in lines[0] and "data.dir=" in lines[0], lines
    # fast: one quick reachability check at most, not half a minute of retries (counted, not timed: a loaded
    # machine's slow start-up is no retry)
    tried = connects.read_text().splitlines() if connects.exists() else []
    assert len(tried) <= (0 if env["HF_HUB_OFFLINE"] else 1), tried
    assert run_dirs(tmp_path) == []


def keyword_csv(path, n=2000, seed=0):
    """A task one epoch at a useful lr learns and a near-zero lr cannot: the label is which of two keywords sits
    among 20 random filler words (the demo's word-order task needs many epochs, so two barely-trained jobs would
    be ranked by chance)."""
    import random

    rng = random.Random(seed)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(n):
            words = [f"filler{rng.randrange(60)}" for _ in range(20)]
            words.insert(rng.randrange(21), "splendid" if i % 2 else "dreadful")
            w.writerow([" ".join(words), "pos" if i % 2 else "neg"])


@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_after_a_sweep_the_default_checkpoint_is_its_best_job(tmp_path):
    keyword_csv(tmp_path / "train.csv")
    r = run_tformer("train", "-m", "optimizer.lr=0.003,0.0000001", "data=files", "data.train_file=train.csv",
                    "data.test_fraction=0.1", "trainer.test_after_fit=false", *tiny("trainer.epochs=2", base=FAST),
                    cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    jobs = sorted((tmp_path / "outputs" / "multirun").glob("*/*/*/checkpoints/best"))
    assert len(jobs) == 2
    scores = {j: json.loads((j / "metrics.json").read_text())["val_accuracy"] for j in jobs}
    best = max(scores, key=scores.get)
    job = best.parent.parent
    assert job.name.startswith("0_") and "optimizer.lr=0.003" in (job / ".hydra" / "overrides.yaml").read_text()
    assert scores[best] > min(scores.values()), scores  # the sweep's first job, not its last
    r = run_tformer("evaluate", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"checkpoint {best.relative_to(tmp_path)}" in r.stdout


def test_shell_completion_registers_tformer_and_completes_each_command(tmp_path):
    r = run_tformer("-sc", "install=bash", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("-F hydra_bash_completion tformer")
    answers = {}
    for line in ("tformer tr", "tformer train model=", "tformer train trainer.ep", "tformer evaluate spl"):
        r = run_tformer("-sc", "query=bash", cwd=tmp_path, env={"COMP_LINE": line})
        assert r.returncode == 0, r.stderr[-1000:]
        answers[line] = r.stdout.split()
    assert answers["tformer tr"] == ["train"]
    assert "model=small" in answers["tformer train model="] and "model=minilm_l6" in answers["tformer train model="]
    assert answers["tformer train trainer.ep"] == ["trainer.epochs="]
    assert answers["tformer evaluate spl"] == ["split="]
    import os

    read, write = os.pipe()
    os.close(read)  # (`tformer -sc install=bash | true`: no reader; Hydra printed the BrokenPipeError's traceback)
    try:
        r = subprocess.run([TFORMER, "-sc", "install=bash"], stdout=write, stderr=subprocess.PIPE, cwd=tmp_path,
                           timeout=120)
    finally:
        os.close(write)
    assert r.returncode == 141 and r.stderr == b"", r.stderr[-1000:]


def test_help_shows_resolved_values_with_their_descriptions(tmp_path):
    r = run_tformer("train", "--help", "model=small", cwd=tmp_path)
    assert r.returncode == 0 and "${" not in r.stdout
    lines = r.stdout.splitlines()
    lr = next(line for line in lines if line.strip().startswith("optimizer.lr ="))
    assert lr.split("=")[1].split("#")[0].strip() == "0.0005" and "peak lr" in lr  # model=small's resolved lr
    assert any(line.startswith("  model:") and "small*" in line for line in lines)
    patience = next(line for line in lines if "trainer.early_stopping.patience =" in line)
    assert "epochs without improvement" in patience
    r = run_tformer("train", "--help", "model=nope", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Could not find 'model/nope'" in r.stderr


@pytest.mark.heavy  # make test-heavy (CI runs it); test_evaluate_files scores new files in make test
def test_evaluate_scores_a_new_file_with_the_runs_data_settings(tmp_path):
    rows = [(f"{'great fine' if i % 2 else 'dull awful'} review {i}", "good" if i % 2 else "bad") for i in range(200)]
    for name, part in (("train.csv", rows), ("new.csv", rows[:30])):
        with open(tmp_path / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["review", "verdict"])
            w.writerows(part)
    r = run_tformer("train", "data=files", "data.train_file=train.csv", "data.text_column=review",
                    "data.label_column=verdict", "data.test_fraction=0.2", *FAST, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = run_tformer("evaluate", f"checkpoint={run_dirs(tmp_path)[-1]}", f"test_file={tmp_path / 'new.csv'}",
                    cwd=elsewhere)  # no column names, no training file: the run's settings are reused
    assert r.returncode == 0, r.stderr[-2000:]
    metrics = json.loads(next((elsewhere / "outputs" / "evaluate").glob("*/*/metrics.json")).read_text())
    assert metrics["n"] == 30


@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_ctrl_c_during_validation_saves_and_says_how_to_resume(tmp_path):
    args = ["train", *tiny("data.n_train=64", "data.n_validation=40000", "trainer.epochs=2",
                           "trainer.eval_batch_size=512", base=DEMO)]
    # 2 steps, then 79 validation batches: Ctrl-C once validation says (a progress line after every batch) it has
    # begun, not after a guessed delay
    rc, out, err = interrupt_when(args, tmp_path, lambda seen: "\nvalidating: " in "\n" + seen, stream="stderr",
                                  env={"TFORMER_PROGRESS_SECONDS": "0"})
    assert rc == 130 and "Traceback" not in err, err[-2000:]
    lines = [line for line in messages(err) if not line.startswith("[tformer]")]
    assert len(lines) == 1 and "resume with: tformer train" in lines[0], lines
    run = run_dirs(tmp_path)[-1]
    assert (run / "checkpoints" / "last" / "trainer_state.json").is_file() and not (run / "history.json").exists()


def test_a_sweep_ends_with_a_summary_and_a_failed_job_does_not_stop_it(tmp_path):
    r = run_tformer("train", "-m", "model.n_heads=4,3", "seed=1,2", *DEMO, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    sweep = next((tmp_path / "outputs" / "multirun").glob("*/*"))
    rows = list(csv.DictReader(open(sweep / "summary.csv")))
    assert [(row["overrides"], row["status"]) for row in rows] == [
        ("model.n_heads=4 seed=1", "done"), ("model.n_heads=4 seed=2", "done"),
        ("model.n_heads=3 seed=1", "failed"), ("model.n_heads=3 seed=2", "failed")]
    assert all("n_heads" in row["error"] for row in rows[2:]) and not any(row["error"] for row in rows[:2])
    done = rows[:2]
    assert [row["best_job"] for row in rows].count("*") == 1
    assert max(done, key=lambda row: float(row["best"]))["best_job"] == "*"
    assert all(row["test_accuracy"] and row["best_epoch"] == "1" and row["monitor"] == "val_accuracy" for row in done)
    md = (sweep / "summary.md").read_text()
    assert "model.n_heads=4: val_accuracy" in md and "over 2 seeds" in md and "Errors:" in md
    assert "sweep " in r.stdout and "failed" in r.stdout and "over 2 seeds" in r.stdout  # the table at the end
    again = run_tformer("report", str(sweep), cwd=tmp_path)
    assert again.returncode == 0 and "model.n_heads=3 seed=2" in again.stdout and "failed" in again.stdout


def test_progress_in_a_log_file_is_plain_lines_on_stderr(tmp_path):
    """No terminal (nohup, a batch job): tqdm's bar would be off, so each long phase says how far it is in plain
    lines on stderr (here every 0 s), none in stdout or train.log, no carriage returns."""
    r = run_tformer("train", *DEMO, cwd=tmp_path, env={"TFORMER_PROGRESS_SECONDS": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stderr.splitlines()
    assert "\r" not in r.stderr
    for phase in ("tokenizing train", "epoch 1/1", "validating", "evaluating"):
        assert any(line.startswith(f"{phase}: ") and "elapsed" in line for line in lines), (phase, r.stderr[-2000:])
    ten = [line for line in lines if line.startswith("epoch 1/1: ")]
    assert ten[-1].startswith("epoch 1/1: 10/10 batches (100%)"), ten  # 300 texts in batches of 32
    assert "elapsed" not in r.stdout and "elapsed" not in (run_dirs(tmp_path)[-1] / "train.log").read_text()
