"""A grid sweep killed half-way and resumed with resume=<sweep dir>: every job listed once, finished jobs read
back (not retrained), the interrupted job resumed from its checkpoint, the missing ones run; a resume that would
run other jobs under the same numbers is refused, and the report of a sweep that died counts only finished jobs."""
import csv
import statistics

import pytest

from helpers import interrupted_when, run_tformer, tiny

pytestmark = pytest.mark.slow

SWEEP = ["train", "-m", "model.n_heads=2,4", "seed=1,2",
         *tiny("data.n_train=2000", "data.n_validation=200", "data.n_test=200", "trainer.epochs=2",
               "trainer.checkpoint_every_steps=10")]


@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_killed_grid_sweep_resumes_without_retraining_finished_jobs(tmp_path):
    # Ctrl-C once job 2 has saved a mid-epoch checkpoint
    code, out = interrupted_when("outputs/multirun/*/*/2_*/checkpoints/last", *SWEEP, cwd=tmp_path)
    assert code == 130, out[-2000:]
    assert "resume the sweep" in out
    (sweep,) = [p for p in (tmp_path / "outputs" / "multirun").glob("*/*") if p.is_dir()]
    jobs = sorted(p.name.split("_")[0] for p in sweep.iterdir() if p.is_dir())
    assert jobs == ["0", "1", "2"]
    finished = {j: [p for p in sweep.glob(f"{j}_*")][0] for j in ("0", "1")}
    stamps = {j: {f: (d / f).stat().st_mtime_ns for f in ("history.json", "checkpoints/best/model.safetensors",
                                                          "test_metrics.json")} for j, d in finished.items()}

    r = run_tformer(*SWEEP, f"resume={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = list(csv.DictReader(open(sweep / "summary.csv")))
    assert [row["job"] for row in rows] == ["0", "1", "2", "3"] and {row["status"] for row in rows} == {"done"}
    assert not any("resume=" in row["overrides"] for row in rows)
    for j, d in finished.items():  # read, not retrained
        assert {f: (d / f).stat().st_mtime_ns for f in stamps[j]} == stamps[j]
        assert "not retrained" in (d / "train.log").read_text()
    job2 = [p for p in sweep.glob("2_*")][0]
    assert "resumed" in (job2 / "train.log").read_text() and (job2 / "history.json").is_file()
    assert (sweep.parent.parent / sweep.parent.name).exists()
    assert len([p for p in (tmp_path / "outputs" / "multirun").glob("*/*") if p.is_dir()]) == 1  # no new sweep


def test_resume_with_m_must_name_a_sweep(tmp_path):
    r = run_tformer("train", "-m", "seed=1,2", f"resume={tmp_path}", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "sweep directory" in r.stderr
    r = run_tformer("train", "-m", "seed=1,2", "resume=true", cwd=tmp_path)
    assert r.returncode == 2 and "no `tformer train -m` sweep" in r.stderr


def test_a_resume_continues_a_sweep_of_its_own_command_only(tmp_path, monkeypatch):
    from tformer_cli.errors import TformerError
    from tformer_cli.sweeps.summary import resume_args

    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "outputs" / "multirun" / "2026-01-01" / "00-00-00"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra:\n  job:\n    config_name: train\n  overrides:\n    task: [seed=1,2]\n")
    with pytest.raises(TformerError, match="no `tformer distill -m` sweep under outputs/multirun/"):
        resume_args(["-m", "seed=1,2", "resume=true"], "distill")  # (the newest sweep is a train sweep)
    with pytest.raises(TformerError, match=r"is a `tformer train -m` sweep; continue it with `tformer train -m"):
        resume_args(["-m", "seed=1,2", f"resume={sweep}"], "distill")
    assert resume_args(["-m", "seed=1,2", "resume=true"], "train")[-1] == f"hydra.sweep.dir={sweep.resolve()}"


# a sweep that dies in job 2: 20 epochs leave time to stop it after its first best epoch, before it ends
DIED = ["train", "-m", "seed=1,2,3,4", *tiny("trainer.epochs=20", "trainer.early_stopping.patience=100")]


@pytest.fixture(scope="module")
def died_sweep(tmp_path_factory):
    """Ctrl-C once job 2 has a best epoch: jobs 0 and 1 done, job 2 interrupted (a best so far), job 3 never
    started."""
    work = tmp_path_factory.mktemp("died_sweep")
    code, out = interrupted_when("outputs/multirun/*/*/2_*/checkpoints/best", *DIED, cwd=work)
    assert code == 130, out[-2000:]
    (sweep,) = [p for p in (work / "outputs" / "multirun").glob("*/*") if p.is_dir()]
    return work, sweep


@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_a_died_sweep_reports_its_interrupted_job_apart_and_its_unstarted_job(died_sweep):
    work, sweep = died_sweep
    r = run_tformer("report", str(sweep), cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = list(csv.DictReader(open(sweep / "summary.csv")))
    assert [(row["job"], row["overrides"], row["status"]) for row in rows] == [
        ("0", "seed=1", "done"), ("1", "seed=2", "done"), ("2", "seed=3", "interrupted"),
        ("3", "seed=4", "not started")]
    assert rows[2]["best"] and not rows[2]["best_job"]  # its best so far: shown, never the sweep's best
    done = [float(row["best"]) for row in rows[:2]]
    line = next(line for line in (sweep / "summary.md").read_text().splitlines() if line.startswith("(defaults)"))
    assert line.startswith(f"(defaults): val_accuracy {statistics.fmean(done):.4f} ± {statistics.stdev(done):.4f} "
                           f"over 2 seeds"), line
    assert line.endswith("; left out: job 2 interrupted, job 3 not started"), line
    assert "over 2 seeds" in r.stdout and "not started" in r.stdout


@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_a_resume_with_other_swept_values_is_refused_in_one_line(died_sweep):
    work, sweep = died_sweep
    before = sorted(p.name for p in sweep.iterdir())
    other = [a if a != "seed=1,2,3,4" else "seed=4,5" for a in DIED]
    r = run_tformer(*other, f"resume={sweep}", cwd=work)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-2000:]
    assert "seed=4,5 (the sweep ran seed=1,2,3,4)" in r.stderr
    assert f"`tformer {' '.join(DIED)} resume={sweep}`" in r.stderr  # the command that continues it
    assert sorted(p.name for p in sweep.iterdir()) == before  # no job started, no folder made
