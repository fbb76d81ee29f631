"""A -m sweep reads as a sweep: each job shows its epoch lines and one final line (its train.log keeps the rest),
job folders get short names that a resumed sweep finds again (a resume must give the sweep's own overrides), and
floats are rounded where people read them."""
import csv
import hashlib
import re

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from helpers import TINY, run_tformer
from tformer_cli.sweeps.naming import job_dirname, round_floats
from tformer_cli.sweeps.plan import planned_jobs, resume_changes

OPTUNA_LR = "0.00031415926535897931"  # a value as an Optuna trial gives it


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_a_four_job_sweep_prints_a_line_per_epoch_and_one_per_job(tmp_path):
    r = run_tformer("train", "-m", f"optimizer.lr=0.003,{OPTUNA_LR}", "seed=1,2", *TINY, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert len(lines) < 40, r.stdout
    for hidden in ("training summary", "per class", "confusion matrix", "best checkpoint:", "reports:"):
        assert hidden not in r.stdout, hidden
    assert len([line for line in lines if re.match(r"epoch +1/1 ", line)]) == 4  # trainer.epochs=1, four jobs
    (sweep,) = (tmp_path / "outputs" / "multirun").glob("*/*")
    rows = list(csv.DictReader(open(sweep / "summary.csv")))
    assert [row["overrides"] for row in rows] == ["optimizer.lr=0.003 seed=1", "optimizer.lr=0.003 seed=2",
                                                  "optimizer.lr=0.0003142 seed=1", "optimizer.lr=0.0003142 seed=2"]
    folders = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name.rsplit("_", 1)[0] for p in folders] == ["0_lr-0.003_seed-1", "1_lr-0.003_seed-2",
                                                           "2_lr-0.0003142_seed-1", "3_lr-0.0003142_seed-2"]
    for n, (row, folder) in enumerate(zip(rows, folders)):
        assert len(folder.name) <= 40
        final = next(line for line in lines if line.startswith(f"job {n} "))
        assert final.startswith(f"job {n} done: {row['overrides']}; val_accuracy {row['best']} (epoch 1); "
                                f"test accuracy {row['test_accuracy']}; "), final
        assert final.endswith(str(folder.relative_to(tmp_path))), final
        log = (folder / "train.log").read_text()  # the whole output is in the job's log
        assert "confusion matrix" in log and "per class" in log and "best checkpoint:" in log


@pytest.mark.slow
def test_a_failed_job_of_a_sweep_ends_with_its_final_line(tmp_path):
    r = run_tformer("train", "-m", "model.n_heads=3,5", *TINY, cwd=tmp_path)  # d_model 64: no head size fits
    assert r.returncode == 0, r.stderr[-2000:]
    finals = [line for line in r.stdout.splitlines() if line.startswith("job ")]
    assert finals[0].startswith("job 0 failed: model.n_heads=3; ") and finals[1].startswith("job 1 failed: "), finals
    assert r.stderr.count("error: ") == 2 and "n_heads" in r.stderr


def test_floats_are_rounded_to_four_significant_digits_and_nothing_else_changes():
    assert round_floats(f"optimizer.lr={OPTUNA_LR} seed=12345 data.n_train=300") == \
        "optimizer.lr=0.0003142 seed=12345 data.n_train=300"
    assert round_floats("x=1e-7 y=[0.9,0.999] z=-2.50000001 w=0.123456") == "x=1e-07 y=[0.9,0.999] z=-2.5 w=0.1235"
    assert round_floats("data.train_file=v1.2.3.csv model=minilm_l6") == "data.train_file=v1.2.3.csv model=minilm_l6"


def sweep_dir(tmp_path, task=(), params=None):
    """A sweep dir as its sweeper leaves it before the first job: multirun.yaml with the sweep's overrides."""
    OmegaConf.save(OmegaConf.create({"hydra": {"overrides": {"task": list(task)}, "sweeper": {"params": params}}}),
                   tmp_path / "multirun.yaml")
    return str(tmp_path)


def test_job_folders_name_the_swept_values_and_are_the_same_on_resume(tmp_path):
    sweep = sweep_dir(tmp_path, ["optimizer.lr=0.003,1e-4", "seed=range(2)", "data.n_train=300", "model=tiny"])
    job = ["model=tiny", "seed=1", "data.n_train=300", f"optimizer.lr={OPTUNA_LR}"]
    dirname = "data.n_train=300,model=tiny,optimizer.lr=" + OPTUNA_LR + ",seed=1"  # Hydra's, keys sorted
    name = job_dirname(dirname, job, sweep)
    assert name == f"lr-0.0003142_seed-1_{hashlib.sha1(dirname.encode()).hexdigest()[:6]}"
    # a resumed sweep (resume= is no setting) in another order: the same folder
    assert job_dirname(dirname, [*reversed(job), f"resume={sweep}"], sweep) == name
    # a job whose other overrides changed gets a folder of its own
    assert job_dirname(dirname.replace("300", "400"), job, sweep) != name


def test_an_optuna_trials_folder_name_is_short(tmp_path):
    params = {"optimizer.lr": "tag(log, interval(1e-4, 3e-3))", "optimizer.weight_decay": "choice(0.0, 0.01, 0.1)",
              "model.dropout": "choice(0.0, 0.1, 0.2)", "schedule.warmup_ratio": "interval(0.0, 0.2)",
              "trainer.batch_size": "choice(16, 32, 64)"}
    sweep = sweep_dir(tmp_path, ["hparams_search=small_optuna", "model=tiny", "data.n_train=1000"], params)
    job = ["hparams_search=small_optuna", "model=tiny", "data.n_train=1000", f"optimizer.lr={OPTUNA_LR}",
           "optimizer.weight_decay=0.01", "model.dropout=0.1", "schedule.warmup_ratio=0.18181818181818182",
           "trainer.batch_size=32"]
    name = job_dirname(",".join(sorted(job)), job, sweep)
    # too long as key-value pairs: the values, in key order (dropout, lr, weight_decay, warmup_ratio, batch_size)
    assert name.startswith("0.1_0.0003142_0.01_0.1818_32_") and len(f"999_{name}") <= 40, name


def test_a_job_folder_name_is_one_folder_that_hydra_reads_as_a_plain_value(tmp_path):
    sweep = sweep_dir(tmp_path, ["data.train_file=a/x.csv,b/y z.csv", "optimizer.betas=[0.9,0.99],[0.8,0.9]"])
    job = ["data.train_file=b/y z.csv", "optimizer.betas=[0.8,0.9]"]
    name = job_dirname(",".join(job), job, sweep)
    assert name.startswith("b-y-z.csv_-0.8-0.9-_") and "/" not in name, name
    # `tformer evaluate checkpoint=<job dir>/checkpoints/best`, unquoted: one plain value, not a sweep
    path = f"outputs/multirun/2026-01-01/00-00-00/3_{name}/checkpoints/best"
    parsed = OverridesParser.create().parse_override(f"checkpoint={path}")
    assert not parsed.is_sweep_override() and parsed.value() == path
    # a sweeper that writes no multirun.yaml: the job's overrides, cut to fit
    name = job_dirname("x", ["trainer.epochs=2", "data.n_train=300", "model.d_model=48"], str(tmp_path / "none"))
    assert name.startswith("300_48_2_"), name


def test_a_resume_must_give_the_jobs_the_sweep_began_with():
    ran = ["seed=1,2,3", "optimizer.lr=0.001,0.003", "data.dir=/data/a", "trainer.epochs=2"]
    # the same jobs, spelled otherwise or with the data moved: nothing to say
    assert resume_changes(ran, ["-m", "trainer.epochs=2", "seed=range(1,4)", "optimizer.lr=1e-3,3e-3",
                                "data.dir=/data/b", "resume=x", "hydra.sweep.dir=y"]) == []
    assert resume_changes(ran, ["seed=3,4", "optimizer.lr=0.001,0.003", "trainer.epochs=2"]) == [
        "seed=3,4 (the sweep ran seed=1,2,3)"]
    assert resume_changes(ran, ["seed=1,2,3", "optimizer.lr=0.001,0.003", "trainer.epochs=3", "+trainer.x=1"]) == [
        "trainer.epochs=3 (the sweep ran trainer.epochs=2)", "+trainer.x=1 (not in the sweep)"]
    assert resume_changes(ran, ["seed=1,2,3", "optimizer.lr=0.001,0.003"]) == ["trainer.epochs=2 left out"]
    # the same values in another order: other jobs under each number of a grid (an Optuna search numbers none)
    reordered = ["optimizer.lr=0.001,0.003", "seed=1,2,3", "trainer.epochs=2"]
    assert resume_changes(ran, reordered)[0].startswith("the swept keys in another order")
    assert resume_changes(ran, reordered, grid=False) == []
    # what a job's resume advises, and spellings Hydra reads alike, pass; a value is shown as it was typed
    assert resume_changes(ran, [*ran, "resume_ignore_data_change=true"]) == []
    search = ["hparams_search=small_optuna", "model.dropout=interval(0, 0.2)", "seed=shuffle(1,2,3)", "x=true"]
    assert resume_changes(search, ["seed=shuffle(1,2,3)", "model.dropout=interval(0,0.2)", "x=true",
                                   "hparams_search=small_optuna"], grid=False) == []
    assert resume_changes(search, [*search[:3], "x=false"], grid=False) == ["x=false (the sweep ran x=true)"]


def test_the_plan_of_a_grid_sweep_lists_each_jobs_overrides(tmp_path):
    OmegaConf.save(OmegaConf.create({"hydra": {
        "overrides": {"task": ["seed=1,2", "model=tiny", "optimizer.lr=0.1,0.2", f"resume={tmp_path}"]},
        "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper", "params": None}}}),
        tmp_path / "multirun.yaml")
    assert planned_jobs(tmp_path) == [["seed=1", "model=tiny", "optimizer.lr=0.1"],
                                      ["seed=1", "model=tiny", "optimizer.lr=0.2"],
                                      ["seed=2", "model=tiny", "optimizer.lr=0.1"],
                                      ["seed=2", "model=tiny", "optimizer.lr=0.2"]]
    OmegaConf.save(OmegaConf.create({"hydra": {  # an Optuna search picks its values as it goes
        "overrides": {"task": ["hparams_search=small_optuna", "seed=1,2"]},
        "sweeper": {"_target_": "hydra_plugins.tformer_sweepers.resumable_optuna.ResumableOptunaSweeper",
                    "params": {"optimizer.lr": "tag(log, interval(1e-4, 1e-2))"}}}}), tmp_path / "multirun.yaml")
    assert planned_jobs(tmp_path) is None


def test_the_keys_a_resume_may_change_are_the_ones_job_folder_names_leave_out():
    """A key free to change on resume but in the folder's hash would send each job to a new folder."""
    import yaml

    from helpers import ROOT
    from tformer_cli.sweeps.plan import FREE

    train = yaml.safe_load((ROOT / "configs" / "train.yaml").read_text())
    assert set(train["hydra"]["job"]["config"]["override_dirname"]["exclude_keys"]) == set(FREE)
