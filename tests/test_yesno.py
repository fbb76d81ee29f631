"""One yes/no parser (tformer_cli/yesno.py) for every yes/no tformer reads; resume= means the same with and without
-m; a sweep job's status comes from its job_status.json record, never from its error message's wording."""
import json
from types import SimpleNamespace

import pytest

from helpers import run_tformer, train_config
from tformer_cli.sweeps import job_status
from tformer_cli.errors import ConfigError, TformerError
from tformer_cli.sweeps.summary import jobs, resume_args
from tformer_cli.yesno import FALSE, TRUE, bool_or_path, parse_bool

REFUSED = "must be true or false (or yes/no, on/off, 1/0)"


def test_the_truth_set():
    assert TRUE == ("true", "yes", "1", "on") and FALSE == ("false", "no", "0", "off")
    for word in TRUE:
        for spelled in (word, word.upper(), word.capitalize(), f" {word} "):
            assert parse_bool(spelled, "k") is True
    for word in FALSE:
        for spelled in (word, word.upper(), word.capitalize(), f" {word} "):
            assert parse_bool(spelled, "k") is False
    assert parse_bool(True, "k") is True and parse_bool(False, "k") is False
    assert parse_bool(1, "k") is True and parse_bool(0, "k") is False  # (Hydra parses key=1 as an int)


@pytest.mark.parametrize("value", ["y", "n", "t", "f", "maybe", "", "2", "enabled", None, 1.0, 2, [True]])
def test_anything_else_is_refused_in_one_line_naming_the_key(value):
    with pytest.raises(ConfigError) as err:
        parse_bool(value, "trainer.compile")
    assert str(err.value) == f"trainer.compile={value!r} {REFUSED}" and "\n" not in str(err.value)


def test_every_yes_no_goes_through_it(monkeypatch):
    from tformer_cli import hub
    from tformer_cli.commands import predict, serve

    assert train_config("trainer.compile=yes").trainer.compile is True  # a config key (typed_config)
    assert train_config("trainer.compile=OFF").trainer.compile is False
    with pytest.raises(ConfigError, match="trainer.compile='maybe' must be true or false"):
        train_config("trainer.compile=maybe")
    assert predict.parse_args(["--json=on", "text"])[0]["json"] is True  # a command option
    with pytest.raises(TformerError, match=f"--json='sure' {REFUSED[:22]}"):
        predict.parse_args(["--json=sure", "text"])
    assert serve.parse_args(["access_log=yes"])["access_log"] is True
    with pytest.raises(TformerError, match="access_log='y' must be"):
        serve.parse_args(["access_log=y"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "On")  # an environment variable (huggingface_hub's own yes words)
    assert hub.offline() is True
    monkeypatch.setenv("HF_HUB_OFFLINE", "maybe")
    with pytest.raises(TformerError, match="HF_HUB_OFFLINE='maybe' must be"):
        hub.offline()


def test_resume_is_a_yes_no_or_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert bool_or_path(None, "resume") is None and bool_or_path("", "resume") is None
    assert bool_or_path("yes", "resume") is True and bool_or_path("Off", "resume") is False
    assert bool_or_path("runs/a", "resume") == "runs/a"
    for value, expected in (("yes", True), ("true", True), ("1", True), ("no", False), ("null", None),
                            ("runs/a", "runs/a")):
        assert train_config(f"resume={value}").resume == expected, value
    (tmp_path / "yes").mkdir()  # resume=yes beside a folder named yes: refused, not guessed
    with pytest.raises(ConfigError, match=r"resume=yes is ambiguous: it means true, and \./yes exists; write "
                                          r"resume=true or resume=\./yes"):
        bool_or_path("yes", "resume")
    assert bool_or_path("./yes", "resume") == "./yes"


def test_resume_yes_means_the_same_with_and_without_m(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TformerError, match="resume=yes with -m but there is no `tformer train -m` sweep"):
        resume_args(["-m", "seed=1,2", "resume=yes"])  # yes = true: the newest sweep, as without -m the newest run
    sweep = tmp_path / "outputs" / "multirun" / "2026-01-01" / "00-00-00"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("{}\n")
    expected = ["-m", "seed=1,2", f"resume={sweep}", f"hydra.sweep.dir={sweep}"]
    for value in ("true", "yes", "YES", "1", "on"):
        assert resume_args(["-m", "seed=1,2", f"resume={value}"]) == expected
    for value in ("false", "no", "0", "off", ""):
        assert resume_args(["-m", "seed=1,2", f"resume={value}"]) == ["-m", "seed=1,2", f"resume={value}"]
    (tmp_path / "yes").mkdir()
    with pytest.raises(ConfigError) as with_m:
        resume_args(["-m", "seed=1,2", "resume=yes"])
    with pytest.raises(ConfigError) as without_m:
        train_config("resume=yes")
    assert str(with_m.value) == str(without_m.value) and "ambiguous" in str(with_m.value)


@pytest.mark.slow
def test_resume_yes_from_the_command_line_with_and_without_m(tmp_path):
    alone = run_tformer("train", "resume=yes", cwd=tmp_path)
    swept = run_tformer("train", "-m", "seed=1,2", "resume=yes", cwd=tmp_path)
    for r in (alone, swept):
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "resume=true but no unfinished run" in alone.stderr  # yes is true: the newest run...
    assert "resume=yes with -m but there is no `tformer train -m` sweep" in swept.stderr  # ... and the newest sweep
    (tmp_path / "yes").mkdir()
    alone = run_tformer("train", "resume=yes", cwd=tmp_path)
    swept = run_tformer("train", "-m", "seed=1,2", "resume=yes", cwd=tmp_path)
    assert alone.returncode == swept.returncode == 2 and alone.stderr == swept.stderr
    assert "resume=yes is ambiguous" in alone.stderr
    assert not list(tmp_path.glob("outputs/*/*/*")) and not list(tmp_path.glob("outputs/multirun"))  # no run left


def _job(sweep, name, record=None):
    folder = sweep / name
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(f"- seed={name[0]}\n")
    (folder / "train.log").write_text("error: interrupted, resume with: this wording must not matter\n")
    if record is not None:
        job_status.write(folder, record)
    return folder


def test_a_sweep_jobs_status_comes_from_its_record_not_its_message(tmp_path):
    ended = job_status.JobStatus.ended
    _job(tmp_path, "0_seed=0", ended(2, "interrupted by nothing: a config error whose text says interrupted"))
    _job(tmp_path, "1_seed=1", ended(130, "stopped"))
    _job(tmp_path, "2_seed=2")  # running, or killed before it could write
    _job(tmp_path, "3_seed=3", ended(0))
    (tmp_path / "4_seed=4" / ".hydra").mkdir(parents=True)
    (tmp_path / "4_seed=4" / job_status.FILE).write_text("{not json")
    found = jobs(tmp_path)
    assert [(j.status, j.error) for j in found] == [
        ("failed", "interrupted by nothing: a config error whose text says interrupted"), ("interrupted", "stopped"),
        ("running", None), ("done", None), ("running", None)]
    record = json.loads((tmp_path / "1_seed=1" / job_status.FILE).read_text())
    assert record == {"status": "interrupted", "exit_code": 130, "message": "stopped"}


def test_the_error_guard_writes_a_sweep_jobs_record(tmp_path, monkeypatch):
    from tformer_cli import cli, console

    monkeypatch.setattr(console, "_output", None)  # refused before any run log opened (an in-process run's left
    folder = tmp_path / "0_seed=1"                 # open by an earlier test's refusal is not this job's)
    folder.mkdir()
    job = SimpleNamespace(mode="RunMode.MULTIRUN", runtime=SimpleNamespace(output_dir=str(folder)),
                          job=SimpleNamespace(config_name="train"))
    monkeypatch.setattr(cli, "_hydra_job", lambda: job)
    cli._fail(TformerError("model.n_heads=3 does not divide d_model"))  # a failed job: the sweep goes on
    assert job_status.read(folder) == job_status.JobStatus("failed", 2, "model.n_heads=3 does not divide d_model")
    assert (folder / "train.log").read_text() == "error: model.n_heads=3 does not divide d_model\n"
    (folder / "checkpoints").mkdir()  # (a job with a result is kept)
    with pytest.raises(SystemExit) as stop:
        cli._fail(cli.Stopped())
    assert stop.value.code == 130 and job_status.read(folder).status == "interrupted"
