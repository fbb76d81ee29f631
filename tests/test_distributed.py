"""DistributedDataParallel on the CPU (gloo, 2 processes started by `tformer train trainer.devices=2` through
torchrun): the same global batches give the same losses and weights as one process (with micro-batches on each
rank too), rank 0 alone writes, and Ctrl-C stops every rank after the same step with a checkpoint the run resumes
from, ending where an uninterrupted single-process run ends."""
import json
import signal
import time
from pathlib import Path

import pytest
import torch

from helpers import TINY_TRAINING, interrupted_when, run_tformer, tformer_reading, tiny
from tformer_cli.errors import TformerError
from tformer_cli.training.distributed import Dist, shard

# Losses agree to LOSS_TOL, not exactly: one process runs its 32-row batch unpadded (model.encoder.RealTokens),
# each rank its own 16 rows, so fp32 sums run in another order and 32 Adam steps amplify it (~2e-5 seen; 2e-7
# with every batch padded). A wrong gradient share between ranks shows up at ~1e-2.
LOSS_TOL = 1e-4
# default vocabulary size (not TINY's): the demo's WordPiece training is then reproducible across processes, so the
# single-process reference reads texts exactly as the DDP run's rank 0 does. DDP updates the whole token table
# each step (no sparse all-reduce), so the reference does too (a single process otherwise updates used rows only).
RUN = tiny("optimizer.embedding_update=dense", "data.n_train=512", "data.n_validation=128", "data.n_test=64",
           "trainer.epochs=2", "trainer.batch_size=32", "model.max_len=32", "trainer.log_every_steps=4",
           "trainer.test_after_fit=false", without=["embedding_init.vocab_size"])


def test_shards_cover_every_row_once_with_equal_step_counts():
    g = torch.Generator().manual_seed(0)
    batches = list(torch.randperm(103, generator=g).split(8))  # the last global batch has 7 rows
    batches.append(torch.tensor([200]))  # one row for two ranks: dropped
    parts = [shard(batches, Dist(rank, 2)) for rank in (0, 1)]
    assert len(parts[0]) == len(parts[1]) == 13
    rows = [int(i) for part in parts for local, _ in part for i in local]
    assert sorted(rows) == list(range(103))  # each sample once; only the 1-row batch is left out
    assert all(len(whole) == len(a) + len(b) for (a, whole), (b, _) in zip(*parts))


@pytest.mark.slow  # three `tformer` processes, each refused before any data is read
def test_ranks_are_refused_where_they_cannot_run(tiny_run, tmp_path):
    """trainer.devices=2000 started 2000 processes (a Ctrl-C did not stop the starting); distill and pretrain,
    which run in one process, recorded devices=2 and trained on one."""
    r = run_tformer("train", "trainer.devices=2000", cwd=tmp_path)
    assert r.returncode == 2 and "trainer.devices=2000 is more processes than this machine can run" in r.stderr
    assert "starting" not in r.stdout
    for task, args in (("pretrain", []), ("distill", [f"teacher={tiny_run.run_dir}"])):
        r = run_tformer(task, *args, "trainer.devices=2", *TINY_TRAINING, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert f"tformer {task} runs in one process (DDP is for tformer train): drop trainer.devices=" in r.stderr
    assert not list(tmp_path.glob("outputs/*/*/*"))


def test_ranks_on_gpus_are_bounded_by_the_gpus_shown(monkeypatch):
    """Each rank takes the GPU of its number: on a one-GPU machine trainer.devices=2 failed in rank 1 on a device
    that is not there (the bound counted CPU cores). No GPU here: torch is told it has one."""
    from tformer_cli import launch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(TformerError, match=r"^trainer.devices=2 starts one process per GPU and this machine shows 1 "
                                           r"\(CUDA_VISIBLE_DEVICES=3\); give trainer.devices=1, or add "
                                           r"trainer.device=cpu to train on the CPU$"):
        launch.distributed_args(["trainer.devices=2"])
    with pytest.raises(TformerError, match="more processes than this machine can run"):  # on the CPU: its cores
        launch.distributed_args(["trainer.devices=2000", "++trainer.device=cpu"])
    assert launch.visible_gpus("cuda:0") == 1 and launch.visible_gpus("cpu") == 0 and launch.visible_gpus("mps") == 0


def history(run):
    return json.loads((run / "history.json").read_text())


def best_weights(run):
    from safetensors.torch import load_file

    return load_file(run / "checkpoints" / "best" / "model.safetensors")


def assert_same_steps(single, run):
    """The DDP run took the single-process run's steps: the same step counts, losses and best weights."""
    one, two = history(single), history(run)
    assert [h["step"] for h in one] == [h["step"] for h in two] == [16, 32]
    for a, b in zip(one, two):
        assert abs(a["train_loss"] - b["train_loss"]) < LOSS_TOL and abs(a["val_loss"] - b["val_loss"]) < LOSS_TOL
    wa, wb = best_weights(single), best_weights(run)
    # fp32 sums in another order, through 32 Adam steps (which divide by tiny second moments for rare tokens):
    # the weights agree to ~4e-4 (the token table's rare rows to ~1.5e-3) where training moved them by ~3e-2
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 5e-3


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    work = tmp_path_factory.mktemp("single")
    r = run_tformer("train", *RUN, "hydra.run.dir=run", cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]
    return work / "run"


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_two_processes_take_the_steps_one_process_takes(single, tmp_path):
    r = run_tformer("train", *RUN, "trainer.devices=2", "hydra.run.dir=run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "distributed 2 processes (DDP, gloo), global batch 32" in r.stdout
    assert_same_steps(single, tmp_path / "run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # rank 1 wrote nothing here
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if s["kind"] == "step"] == [4, 8, 12, 16, 20, 24, 28, 32]  # once, by rank 0


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_micro_batches_on_each_rank_take_the_single_process_steps(single, tmp_path):
    # each rank's 16 rows as two slices of 8: the first backward accumulates locally (no_sync), the second
    # all-reduces the sum; a slice that skipped the all-reduce would leave the ranks' weights apart
    r = run_tformer("train", *RUN, "trainer.devices=2", "trainer.micro_batches=2", "hydra.run.dir=run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_steps(single, tmp_path / "run")


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_ctrl_c_stops_every_rank_and_the_run_resumes_to_the_same_end(single, tmp_path):
    args = [*RUN, "trainer.devices=2", "trainer.checkpoint_every_steps=5", "hydra.run.dir=run"]
    last = tmp_path / "run" / "checkpoints" / "last"
    # as a terminal's Ctrl-C, to the whole process group: the launcher passes it on to the ranks (in their own
    # group), each rank gets it once, however late a busy rank runs its handler
    code, out = interrupted_when("run/checkpoints/last", "train", *args, cwd=tmp_path, group=True)
    assert code == 130, out[-3000:]
    assert "resume with: tformer train" in out and "Traceback" not in out, out[-3000:]
    saved = json.loads((last / "metrics.json").read_text())
    assert saved["step"] < 32

    r = run_tformer("train", *args, f"resume={tmp_path / 'run'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    one, two = history(single), history(tmp_path / "run")
    assert [h["epoch"] for h in two] == [1, 2]
    assert abs(one[-1]["val_loss"] - two[-1]["val_loss"]) < LOSS_TOL
    assert abs(one[-1]["train_loss"] - two[-1]["train_loss"]) < LOSS_TOL


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_ranks_whose_launcher_is_killed_save_and_stop(tmp_path):
    args = [*tiny("trainer.epochs=50", base=RUN), "trainer.devices=2", "trainer.checkpoint_every_steps=5",
            "hydra.run.dir=run"]
    proc, lines, reader = tformer_reading("train", *args, cwd=tmp_path)
    last = tmp_path / "run" / "checkpoints" / "last"
    deadline = time.monotonic() + 600
    while not last.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None and last.exists(), "".join(lines)[-3000:]
    ranks = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]

    def state(pid):  # R, S, T (stopped), Z ... ("X" once gone)
        try:
            return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
        except FileNotFoundError:
            return "X"

    def wait_for(check, seconds=120):
        until = time.monotonic() + seconds
        while not check() and time.monotonic() < until:
            time.sleep(0.05)
        return check()

    proc.send_signal(signal.SIGTSTP)  # Ctrl-Z: the ranks stop with the launcher, and go on with it
    assert wait_for(lambda: all(state(pid) == "T" for pid in [proc.pid, *ranks])), "".join(lines)[-3000:]
    proc.send_signal(signal.SIGCONT)
    assert wait_for(lambda: not any(state(pid) == "T" for pid in [proc.pid, *ranks])), "".join(lines)[-3000:]
    before = json.loads((last / "metrics.json").read_text())["step"]
    proc.send_signal(signal.SIGKILL)  # the launcher alone: nothing forwards a signal to the ranks
    proc.wait()
    assert len(ranks) == 2
    alive = lambda pid: state(pid) not in "ZX"  # noqa: E731
    wait_for(lambda: not any(alive(pid) for pid in ranks))
    reader.join(timeout=30)
    out = "".join(lines)
    assert not any(alive(pid) for pid in ranks), out[-3000:]  # (not training on, unseen, for 50 epochs)
    assert "SIGTERM: finishing this step and saving the last checkpoint" in out and "resume with: tformer train" in out
    assert "Traceback" not in out and "second interrupt" not in out, out[-3000:]
    assert before < json.loads((last / "metrics.json").read_text())["step"] < 50 * 16  # saved when it stopped


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_class_weighted_loss_takes_the_single_process_step_too(tmp_path):
    import csv
    import random

    rng = random.Random(0)
    with open(tmp_path / "train.csv", "w", newline="") as f:  # 3 classes, 70/20/10: unequal weights per shard
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(600):
            label = "a" if i % 10 < 7 else "b" if i % 10 < 9 else "c"
            w.writerow([" ".join(f"w{rng.randrange(40)}" for _ in range(8)) + f" key{label}", label])
    common = ["optimizer.embedding_update=dense", "data=files", "data.train_file=train.csv", "data.test_fraction=0.1",
              "loss.class_weights=balanced",
              *tiny("trainer.batch_size=30", "model.max_len=16", "trainer.test_after_fit=false", base=TINY_TRAINING,
                    without=["embedding_init.vocab_size"])]
    one = run_tformer("train", *common, "hydra.run.dir=one", cwd=tmp_path)
    two = run_tformer("train", *common, "trainer.devices=2", "hydra.run.dir=two", cwd=tmp_path)
    assert one.returncode == 0 and two.returncode == 0, (one.stderr + two.stderr)[-3000:]
    a, b = history(tmp_path / "one")[0], history(tmp_path / "two")[0]
    assert abs(a["val_loss"] - b["val_loss"]) < LOSS_TOL and abs(a["train_loss"] - b["train_loss"]) < LOSS_TOL


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_a_rank_killed_stops_the_others_with_one_line_and_the_resume_command(tmp_path):
    """SIGKILL to rank 1 mid-run (a crash, the OOM killer): rank 0 stops without a gloo traceback, and the launcher
    names the rank and gives the command that continues the run from its last checkpoint."""
    import os
    import signal
    import subprocess
    import threading
    import time
    from pathlib import Path

    from helpers import TFORMER

    args = [*tiny("trainer.epochs=20", base=RUN), "trainer.devices=2", "trainer.checkpoint_every_steps=5",
            "hydra.run.dir=run"]
    proc = subprocess.Popen([TFORMER, "train", *args], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"})
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 600
    while not (tmp_path / "run" / "checkpoints" / "last").is_dir() and proc.poll() is None:
        assert time.monotonic() < deadline, "".join(lines)[-3000:]
        time.sleep(0.05)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    rank1 = next(int(c) for c in children if b"RANK=1" in Path(f"/proc/{c}/environ").read_bytes().split(b"\0"))
    os.kill(rank1, signal.SIGKILL)
    proc.wait(timeout=300)
    reader.join(timeout=30)
    out = "".join(lines)
    assert proc.returncode not in (0, 2), out[-3000:]
    assert "rank 1 stopped (killed by signal 9)" in out and "trainer.devices=2 resume=run" in out, out[-3000:]
    assert "hydra.run.dir" not in out.split("continues with:")[1], out[-3000:]
    assert "Traceback" not in out, out[-3000:]
