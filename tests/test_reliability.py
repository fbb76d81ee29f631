"""Resumable runs, atomic checkpoints, no code execution from checkpoint files, determinism."""
import json
import os
import pickle
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import TFORMER, ctrl_c_reaches_it, run_tformer, tiny

# 94 steps an epoch: room for mid-epoch checkpoints
SMALL = tiny("data.n_train=3000", "data.n_validation=200", "data.n_test=200", "embedding_init.vocab_size=400",
             "trainer.batch_size=32", "trainer.test_after_fit=false")


def run_dir_of(work: Path) -> Path:
    runs = sorted((work / "outputs" / "train").glob("*/*"))
    assert runs, "no run directory"
    return runs[-1]


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_sigkill_mid_epoch_then_resume_gives_identical_weights(tmp_path):
    args = tiny("trainer.epochs=3", "trainer.checkpoint_every_steps=10", "trainer.early_stopping.patience=0",
                base=SMALL)
    straight = tmp_path / "straight"
    straight.mkdir()
    r = run_tformer("train", *args, cwd=straight)
    assert r.returncode == 0, r.stderr[-2000:]
    ref = run_dir_of(straight)

    killed = tmp_path / "killed"
    killed.mkdir()
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen([TFORMER, "train", *args], cwd=killed, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    state = None
    deadline = time.time() + 1800  # only ends a hung run
    while time.time() < deadline and proc.poll() is None:
        for f in killed.glob("outputs/train/*/*/checkpoints/last/trainer_state.json"):
            try:
                s = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if s["epoch_index"] >= 1 and s["batches_done"] > 0:  # a mid-epoch checkpoint in epoch 2
                state = s
        if state:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait()
    assert state is not None and proc.returncode == -signal.SIGKILL, "could not kill the run mid-epoch"
    run = run_dir_of(killed)
    assert not (run / "history.json").exists()  # it really died before finishing

    r = run_tformer("train", *args, f"resume={run}", cwd=killed)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resuming at epoch 2" in r.stdout
    for which in ("last", "best"):
        a = (ref / "checkpoints" / which / "model.safetensors").read_bytes()
        b = (run / "checkpoints" / which / "model.safetensors").read_bytes()
        assert a == b, f"{which} weights differ after resume"
    h_ref = json.loads((ref / "history.json").read_text())
    h_res = json.loads((run / "history.json").read_text())
    keys = ["epoch", "step", "train_loss", "val_loss", "val_accuracy", "val_f1"]
    assert [{k: h[k] for k in keys} for h in h_ref] == [{k: h[k] for k in keys} for h in h_res]
    # the resumed epoch's time includes the part trained before the kill, and its rate covers all its samples
    assert 0 < state["epoch_seconds"] < h_res[1]["epoch_seconds"]
    samples = lambda h: h["train_samples_per_s"] * h["epoch_seconds"]
    assert samples(h_res[1]) == pytest.approx(samples(h_ref[1]), rel=1e-9)
    # metrics.jsonl: what was logged after the checkpoint and before the kill is dropped and logged again
    timeless = lambda run: [{k: v for k, v in json.loads(line).items() if k not in ("samples_per_s", "epoch_seconds",
                                                                                  "train_samples_per_s")}
                            for line in (run / "metrics.jsonl").read_text().splitlines()]
    logged_ref, logged_res = timeless(ref), timeless(run)
    assert [r["kind"] for r in logged_ref].count("epoch") == 3 and len(logged_ref) > 3
    assert logged_res == logged_ref


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_two_runs_with_the_same_seed_give_identical_metrics(tmp_path):
    out = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        r = run_tformer("train", *tiny("trainer.epochs=2", "data.n_train=800", base=SMALL), cwd=tmp_path / name)
        assert r.returncode == 0, r.stderr[-2000:]
        out.append(json.loads((run_dir_of(tmp_path / name) / "history.json").read_text()))
    strip = lambda h: [{k: v for k, v in e.items() if k not in ("epoch_seconds", "train_samples_per_s")} for e in h]
    assert strip(out[0]) == strip(out[1])


@pytest.mark.slow
def test_sigint_saves_and_prints_the_resume_command(tmp_path):
    args = tiny("trainer.epochs=50", "trainer.early_stopping.patience=0", base=SMALL)
    proc = subprocess.Popen([TFORMER, "train", *args],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "300"}, preexec_fn=ctrl_c_reaches_it)
    deadline = time.time() + 1800  # only ends a hung run
    while time.time() < deadline and not list(tmp_path.glob("outputs/train/*/*/checkpoints/last/meta.json")):
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    run = run_dir_of(tmp_path)
    assert f"resume={run}" in err and "tformer train" in err and "Traceback" not in err
    state = json.loads((run / "checkpoints" / "last" / "trainer_state.json").read_text())
    assert state["step"] > 0
    r = run_tformer("train", *args, "optimizer.lr=0.1", f"resume={run}", cwd=tmp_path)
    assert r.returncode == 2 and "config differs in optimizer.lr" in r.stderr
    assert "(add: optimizer.lr=0.001)" in r.stderr  # the override that puts the run's value back


def test_a_resumed_epoch_s_rate_counts_its_time_before_the_resume_and_only_timed_samples():
    from tformer_cli.training.early_stopping import EarlyStopping
    from tformer_cli.training.state import TrainingState

    state = TrainingState(EarlyStopping())
    state.epoch_seen, state.epoch_seconds = 640, 8.0  # saved mid-epoch: 640 samples in 8 s
    tensors, saved = state.state_dict()
    resumed = TrainingState(EarlyStopping())
    resumed.load_state_dict(tensors, saved)
    resumed.epoch_seen, resumed.epoch_seconds = resumed.epoch_seen + 320, resumed.epoch_seconds + 2.0
    assert resumed.samples_per_s() == 96.0  # 960 samples in 10 s, not 960 in the 2 s after the resume
    # a checkpoint from before the time was saved: the rate is the resumed part's own
    older = TrainingState(EarlyStopping())
    older.load_state_dict(tensors, {k: v for k, v in saved.items() if k not in ("epoch_seconds", "epoch_untimed")})
    older.epoch_seen, older.epoch_seconds = older.epoch_seen + 320, older.epoch_seconds + 2.0
    assert older.samples_per_s() == 160.0
    older.start_epoch()
    assert (older.epoch_seconds, older.epoch_untimed) == (0.0, 0)


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    import torch

    from tformer_cli import checkpoint
    from tformer_cli.errors import TformerError
    from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier

    cfg = EncoderConfig(vocab_size=30, num_classes=2, d_model=16, n_heads=2, d_ff=32, max_len=8)
    model = TransformerClassifier(cfg)
    from tformer_cli.data.tokenization import train_wordpiece

    tokenizer_json = train_wordpiece(["a b c", "a b c"], 30, 8).to_str()
    kw = dict(model_config=cfg.to_dict(), tokenizer_json=tokenizer_json, label_names=["a", "b"], config_yaml="x: 1\n",
              metrics={"val_accuracy": 0.5}, meta={"epoch": 1})
    target = tmp_path / "checkpoints" / "last"
    checkpoint.save(target, model, **kw)
    good = (target / "model.safetensors").read_bytes()

    with torch.no_grad():
        model.head.weight.add_(1.0)
    real = checkpoint._write_json
    calls = {"n": 0}

    def failing(path, obj):  # the weights are written, then the disk "fills up"
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        real(path, obj)

    monkeypatch.setattr(checkpoint, "_write_json", failing)
    with pytest.raises(TformerError, match="No space left on device; free some disk space"):
        checkpoint.save(target, model, **kw)
    assert (target / "model.safetensors").read_bytes() == good
    assert not list(target.parent.glob(".last.tmp-*"))
    monkeypatch.undo()
    loaded = checkpoint.load(target)
    assert loaded.metrics == {"val_accuracy": 0.5}


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.slow
def test_malicious_pickles_are_never_loaded(tiny_run_copy, tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    best = tiny_run_copy / "checkpoints" / "best"
    marker = tmp_path / "pwned"
    for name in ("pytorch_model.bin", "model.pt", "optimizer.pt", "training_args.bin"):
        (best / name).write_bytes(pickle.dumps(Payload(marker)))
    r = run_tformer("predict", f"--checkpoint={best}", "--json", "fine film", cwd=work)
    assert r.returncode == 0 and json.loads(r.stdout)["label"] in ("negative", "positive")
    (best / "model.safetensors").write_bytes(pickle.dumps(Payload(marker)))  # weights replaced by a pickle
    for cmd in (["predict", f"--checkpoint={best}", "x"], ["evaluate", f"checkpoint={best}"]):
        r = run_tformer(*cmd, cwd=work)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert "changed after it was written" in r.stderr  # the manifest catches it before safetensors reads it
    assert not marker.exists(), "a pickle payload ran"
