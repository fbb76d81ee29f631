"""A 6-trial Optuna search (hparams_search=small_optuna, tformer's own Optuna sweeper, the study in SQLite in the
sweep dir) killed during its fourth trial and resumed with resume=<sweep dir>: every trial listed once, finished
trials read back (not retrained), the interrupted one resumed from its checkpoint with the same parameters, and
the study ends with exactly the trials asked for."""
import csv

import pytest

from helpers import interrupted_when, run_tformer, tiny, train_config

optuna = pytest.importorskip("optuna")

SEARCH = ["train", "-m", "hparams_search=small_optuna", "model=tiny", "hydra.sweeper.n_trials=6",
          *tiny("data.n_train=1000", "trainer.epochs=2", "trainer.checkpoint_every_steps=10")]


def test_the_study_direction_follows_the_runs_early_stopping_metric():
    """direction: maximize with monitor=val_loss kept the trial of the highest loss as the best."""
    from omegaconf import OmegaConf

    from tformer_cli.errors import ConfigError
    from tformer_cli.sweeps.optuna_sweep import resumable_impl

    def directions(direction, monitor, mode="auto"):
        sweeper = resumable_impl(sampler=None, direction=direction, storage=None, study_name="s", n_trials=1,
                                 n_jobs=1)
        sweeper.config = OmegaConf.create({"trainer": {"early_stopping": {"monitor": monitor, "mode": mode}}})
        return sweeper._get_directions()

    assert directions("auto", "auto") == ["maximize"] and directions("auto", "val_loss") == ["minimize"]
    assert directions("minimize", "my_score", "min") == ["minimize"]
    with pytest.raises(ConfigError, match="direction=maximize with trainer.early_stopping.monitor=val_loss would "
                                          "keep the worst trial as the best; drop it .auto. or pass "
                                          "direction=minimize"):
        directions("maximize", "val_loss")


def test_hparams_search_configs_compose_with_the_resumable_sweeper():
    from hydra import compose, initialize_config_dir

    from tformer_cli.hydra_setup import config_dir

    for name in ("small_optuna", "minilm_optuna"):
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            sweeper = compose("train", overrides=[f"hparams_search={name}"], return_hydra_config=True).hydra.sweeper
        assert sweeper._target_.endswith("tformer_sweepers.resumable_optuna.ResumableOptunaSweeper")
        assert sweeper.storage.endswith("/optuna.db") and sweeper.sampler._target_ == "optuna.samplers.TPESampler"
        assert "optimizer.lr" in sweeper.params
    assert train_config("hparams_search=minilm_optuna").model["pretrained"].endswith("all-MiniLM-L6-v2")


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
@pytest.mark.filterwarnings("ignore::FutureWarning")  # load_study of the plugin's optuna-2 distributions
def test_killed_optuna_search_resumes_where_it_stopped(tmp_path):
    # Ctrl-C once trial 3 has saved a mid-epoch checkpoint
    code, out = interrupted_when("outputs/multirun/*/*/3_*/checkpoints/last", *SEARCH, cwd=tmp_path)
    assert code == 130 and "resume the sweep" in out, out[-3000:]
    (sweep,) = [p for p in (tmp_path / "outputs" / "multirun").glob("*/*") if p.is_dir()]
    assert (sweep / "optuna.db").is_file()
    finished = {j: next(sweep.glob(f"{j}_*")) for j in ("0", "1", "2")}
    stamps = {j: (d / "checkpoints/best/model.safetensors").stat().st_mtime_ns for j, d in finished.items()}
    interrupted = next(sweep.glob("3_*"))

    r = run_tformer(*SEARCH, f"resume={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = list(csv.DictReader(open(sweep / "summary.csv")))
    assert [row["job"] for row in rows] == ["0", "1", "2", "3", "4", "5"] and {row["status"] for row in rows} == {
        "done"}
    assert next(sweep.glob("3_*")) == interrupted  # the same folder, same parameters
    assert "resumed" in (interrupted / "train.log").read_text()
    assert "3 of 6 trials had ended (kept, not rerun); job 3 resumes where it stopped; 3 to go" in r.stdout
    for j, d in finished.items():
        assert (d / "checkpoints/best/model.safetensors").stat().st_mtime_ns == stamps[j]
    study = optuna.load_study(study_name="tformer", storage=f"sqlite:///{sweep / 'optuna.db'}")
    ended = [t for t in study.trials if t.user_attrs.get("tformer_ended")]
    assert len(ended) == 6 and sorted(t.user_attrs["tformer_job"] for t in ended) == list(range(6))
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in ended)
    assert len({tuple(sorted(t.params.items())) for t in ended}) == 6  # the resumed sampler proposes new points
    assert (sweep / "optimization_results.yaml").is_file()
    assert len([p for p in (tmp_path / "outputs" / "multirun").glob("*/*") if p.is_dir()]) == 1
    r = run_tformer(*SEARCH, f"hydra.sweep.dir={sweep}", cwd=tmp_path)  # the same dir without resume=: refused
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is not empty" in r.stderr
    assert f"resume={sweep}" in r.stderr  # the command that continues it
