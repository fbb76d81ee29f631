"""The logger group, read back with each tool's own reader: csv (the csv module), TensorBoard (its event
accumulator), MLflow (its client, on a real SQLite tracking store) and W&B (its offline run file, decoded with
W&B's own protobuf records: this wandb release ships no Python reader for it)."""
import csv
import json
import os
import socket

import pytest

from helpers import config_options, run_tformer, tiny
from tformer_cli import train
from tformer_cli.store.layout import RunDir
from tformer_cli.training.loggers import LOGGERS, NAME_WIDTH, run_name

# 2 epochs of 10 steps (300 texts, batches of 32), a step line every 2 steps
TINY = tiny("trainer.epochs=2", "trainer.log_every_steps=2")


def test_every_logger_option_has_a_class_and_back():
    assert set(config_options("logger")) == set(LOGGERS)


@pytest.mark.slow  # trains
def test_csv_logger_writes_one_row_per_epoch(tmp_path):
    result = train(TINY, run_dir=tmp_path / "run")
    rows = list(csv.DictReader(open(result.run_dir / "metrics.csv")))
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    for row, h in zip(rows, result.history):
        assert float(row["val_accuracy"]) == pytest.approx(h["val_accuracy"])
        assert float(row["train_loss"]) == pytest.approx(h["train_loss"])


@pytest.mark.slow  # trains
def test_tensorboard_events_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = train(TINY + ["logger=tensorboard"], run_dir=tmp_path / "run")
    rows = list(csv.DictReader(open(result.run_dir / "metrics.csv")))  # csv is the base, whatever the logger
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    events = EventAccumulator(str(result.run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"epoch/val_accuracy", "epoch/val_loss", "train/loss", "train/lr", "test/accuracy"} <= tags
    val = events.Scalars("epoch/val_accuracy")
    assert [e.step for e in val] == [h["step"] for h in result.history]
    assert [e.value for e in val] == pytest.approx([h["val_accuracy"] for h in result.history], abs=1e-6)
    assert events.Scalars("test/accuracy")[0].value == pytest.approx(result.test_metrics["accuracy"], abs=1e-6)
    assert len(events.Scalars("train/loss")) >= 2


@pytest.mark.slow  # trains
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_mlflow_run_reads_back_and_a_resume_continues_it(tmp_path):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = train(TINY + ["logger=mlflow", f"logger.tracking_uri={uri}", "logger.experiment=tests"],
                   run_dir=tmp_path / "run")
    client = MlflowClient(tracking_uri=uri)
    run_id = (result.run_dir / "mlflow_run_id").read_text().strip()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["trainer.epochs"] == "2"
    assert run.data.params["logger.name"] == "mlflow" and run.data.tags["tformer.run_dir"].endswith("run")
    history = client.get_metric_history(run_id, "val_accuracy")
    assert [(m.step, m.value) for m in history] == [(h["step"], pytest.approx(h["val_accuracy"]))
                                                   for h in result.history]
    assert run.data.metrics["test_accuracy"] == pytest.approx(result.test_metrics["accuracy"])
    assert client.get_metric_history(run_id, "step_loss")
    assert client.get_experiment(run.info.experiment_id).name == "tests"

    longer = train(tiny("trainer.epochs=3", base=TINY) + ["logger=mlflow", f"logger.tracking_uri={uri}",
                                                          "logger.experiment=tests", f"resume={result.run_dir}"])
    assert (longer.run_dir / "mlflow_run_id").read_text().strip() == run_id  # the same MLflow run goes on
    epochs = client.get_metric_history(run_id, "epoch")
    assert sorted(int(m.value) for m in epochs) == [1, 2, 3]
    assert client.get_run(run_id).info.status == "FINISHED"


def wandb_records(path):
    """The records of a W&B run file (`run-<id>.wandb`): a LevelDB-style log (a 7-byte ':W&B' header, 32 KiB blocks
    of [crc32, length, type] chunks) of wandb_internal_pb2.Record messages."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1
    pos, block, pending, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zero padding at a block's end
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk  # full | first | middle | last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def finished_wandb_records(path, timeout=300):
    """The records of a W&B run file once its exit record is in: W&B's service process may still be writing the
    file when run.finish() has returned (seen under load: the last history row and the exit record came seconds
    later). `timeout` only ends a hung writer."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            records = wandb_records(path)
        except Exception:  # noqa: BLE001 (a record still being written: read again)
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        time.sleep(0.1)
    return wandb_records(path)


@pytest.mark.slow  # trains
def test_wandb_offline_run_reads_back_and_a_resume_is_a_new_run_in_its_group(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    result = train(TINY + ["logger=wandb", "logger.project=tests"], run_dir=tmp_path / "run")
    (run_file,) = (result.run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    records = finished_wandb_records(run_file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    name = run_name(TINY + ["logger=wandb", "logger.project=tests"], RunDir(result.run_dir))
    assert name.startswith("data.n_train=300,") and "logger" not in name
    assert run.display_name == name and run.run_group == f"{tmp_path.name}/run" and run.project == "tests"
    files = run_file.parent / "files"  # the run's files, uploaded by `wandb sync` with the run
    assert (files / "training_curves.png").is_file()
    assert (files / "test_report" / "classification_report.json").is_file()
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert config["trainer"]["epochs"] == 2 and config["logger"]["name"] == "wandb"
    key = lambda item: item.key or "/".join(item.nested_key)  # ("epoch/val_accuracy" is stored as a path)
    rows = [{key(i): json.loads(i.value_json) for i in r.history.item} for r in records
            if r.WhichOneof("record_type") == "history"]
    epochs = [(row["trainer/step"], row["epoch/val_accuracy"]) for row in rows if "epoch/val_accuracy" in row]
    assert epochs == [(h["step"], pytest.approx(h["val_accuracy"])) for h in result.history]
    assert any("train/loss" in row for row in rows)
    summary = {key(i): json.loads(i.value_json) for r in records if r.WhichOneof("record_type") == "summary"
               for i in r.summary.update}
    assert summary["test/accuracy"] == pytest.approx(result.test_metrics["accuracy"])
    assert [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"] == [0]

    again = tiny("trainer.epochs=3", base=TINY) + ["logger=wandb", "logger.project=tests", f"resume={result.run_dir}"]
    train(again)
    runs = sorted(result.run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(runs) == 2
    names = [[r.run for r in finished_wandb_records(f) if r.WhichOneof("record_type") == "run"][0] for f in runs]
    group = f"{tmp_path.name}/run"
    resumed = f"{run_name(again, RunDir(result.run_dir))} (from step 20)"  # (its own overrides: trainer.epochs=3)
    assert sorted((n.display_name, n.run_group) for n in names) == [(name, group), (resumed, group)]


def test_a_missing_logger_package_or_name_is_one_line(tmp_path):
    from tformer_cli import TformerError

    with pytest.raises(TformerError, match="logger"):
        train(TINY + ["logger=csv", "logger.name=nope"], run_dir=tmp_path / "run")
    assert json.dumps(LOGGERS["csv"].__name__)


def test_a_tensorboard_folder_that_cannot_be_made_is_one_line_before_the_data_is_read(tmp_path):
    from tformer_cli import TformerError

    (tmp_path / "a_file").write_text("")
    for where, why in ((tmp_path / "a_file", "File exists"), (tmp_path / "a_file" / "x", "Not a directory")):
        with pytest.raises(TformerError, match=f"logger.log_dir={where} cannot be a folder of event files .{why}"):
            train(TINY + ["logger=tensorboard", f"logger.log_dir={where}"], run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # (a traceback left the run folder: its rerun was then refused)


def test_an_unreachable_tracking_server_is_one_line_before_the_data_is_read(tmp_path):
    from tformer_cli import TformerError

    """MLflow's client retried a refused connection for about 250 s (seven warnings), after the data was read."""
    pytest.importorskip("mlflow")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # a port nothing listens on (bound, never listened: refused at once)
    port = closed.getsockname()[1]
    try:
        with pytest.raises(TformerError, match=f"logger=mlflow: cannot reach the tracking server \\(127.0.0.1:{port}: "
                                               r"Connection refused\); start it, or fix logger.tracking_uri"):
            train(TINY + ["logger=mlflow", f"logger.tracking_uri=http://127.0.0.1:{port}/"], run_dir=tmp_path / "run")
    finally:
        closed.close()
    assert not (tmp_path / "run").exists()


def test_a_tracking_server_that_accepts_but_never_answers_is_one_line_soon(tmp_path, monkeypatch):
    """It held the run for minutes of MLflow's retries (a 120 s read timeout each)."""
    pytest.importorskip("mlflow")
    from tformer_cli import TformerError
    from tformer_cli.training import loggers

    monkeypatch.setattr(loggers, "FIRST_CONTACT", {**loggers.FIRST_CONTACT, "MLFLOW_HTTP_REQUEST_TIMEOUT": "1"})
    for key in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(key, raising=False)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # (connections are accepted by the kernel; nothing ever answers)
    try:
        with pytest.raises(TformerError, match="logger=mlflow: the tracking server at .* accepted the connection but "
                                               "did not answer within 1 s; .*set MLFLOW_HTTP_REQUEST_TIMEOUT"):
            train(TINY + ["logger=mlflow", f"logger.tracking_uri=http://127.0.0.1:{silent.getsockname()[1]}/"],
                  run_dir=tmp_path / "run")
    finally:
        silent.close()
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ and not (tmp_path / "run").exists()


def test_a_tracking_uri_that_is_a_folder_is_one_line_before_the_data_is_read(tmp_path, monkeypatch):
    """MLflow 3 refuses its file store with a paragraph about migrating, which was cut mid-sentence."""
    pytest.importorskip("mlflow")
    from tformer_cli import TformerError

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(TformerError, match=r"logger.tracking_uri='not a uri' is a folder \(MLflow's file store\), "
                                           r"which this MLflow refuses; give a database \(sqlite:///mlflow.db\)"):
        train(TINY + ["logger=mlflow", "logger.tracking_uri='not a uri'"], run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists() and not (tmp_path / "not a uri").exists()


def test_reachability_is_not_judged_through_a_proxy_and_a_bad_port_is_named(monkeypatch):
    from tformer_cli import network

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{closed.getsockname()[1]}/"
    try:
        for key in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY"):
            monkeypatch.delenv(key, raising=False)
        assert "Connection refused" in network.unreachable(url, 2)
        monkeypatch.setenv("http_proxy", "http://proxy.invalid:3128")  # (the library goes through it)
        assert network.unreachable(url, 2) is None
    finally:
        closed.close()
    assert network.unreachable("http://host:abc/", 2) == "'http://host:abc/' has no valid port"
    assert network.unreachable("file:///x", 2) is None and network.unreachable("sqlite:///x.db", 2) is None


def test_run_names_are_the_overrides_cut_whole():
    run_dir = RunDir("/x/outputs/2024-01-01/12-00-00")
    assert run_name(["model=small", "optimizer.lr=0.0003", "logger=mlflow", "logger.experiment=a"], run_dir) \
        == "model=small,optimizer.lr=0.0003"
    assert run_name([], run_dir) == run_name(["logger=mlflow", "resume=true"], run_dir) == "12-00-00"
    assert run_name(["data=files", "data.train_file=/home/me/reviews/train.csv"], run_dir) \
        == "data=files,data.train_file=train.csv"
    many = [f"model.key_{i}={i * 1000}" for i in range(30)]
    name = run_name(many, run_dir)
    assert len(name) <= NAME_WIDTH + len(",+30 more") and name.startswith("model.key_0=0,model.key_1=1000,")
    kept = name.split(",+")[0].split(",")
    assert kept == many[:len(kept)] and name.endswith(f",+{30 - len(kept)} more")


@pytest.mark.slow  # trains (in a `tformer` process: the default store under its working dir's outputs/)
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_mlflow_keeps_the_runs_files_under_outputs_and_says_how_to_open_them(tmp_path):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    from mlflow.tracking import MlflowClient

    overrides = ["optimizer.lr=0.0003", *TINY, "logger=mlflow", "logger.log_model=true"]
    done = run_tformer("train", *overrides, "hydra.run.dir=outputs/run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    uri = f"sqlite:///{tmp_path.resolve() / 'outputs' / 'mlflow.db'}"
    assert f"mlflow ui --backend-store-uri {uri}" in " ".join(done.stdout.split())
    assert not (tmp_path / "mlruns").exists()  # (MLflow's own default: ./mlruns wherever the run started)

    run_dir = tmp_path / "outputs" / "run"
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run((run_dir / "mlflow_run_id").read_text().strip())
    assert run.info.run_name == run_name(overrides, RunDir(run_dir))
    assert run.info.run_name.startswith("optimizer.lr=0.0003,data.n_train=300,") and "logger" not in run.info.run_name
    assert run.info.artifact_uri.startswith((tmp_path.resolve() / "outputs" / "mlruns").as_uri())
    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"training_curves.png", "history.json", "test_metrics.json", "metrics.csv", "test_report",
            "checkpoints"} <= top
    report = {a.path for a in client.list_artifacts(run.info.run_id, "test_report")}
    assert {"test_report/classification_report.json", "test_report/errors.csv"} <= report
    assert any(p.endswith(".png") for p in report)
    model = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints/best")}
    assert "checkpoints/best/model.safetensors" in model
    stored = client.download_artifacts(run.info.run_id, "test_metrics.json", str(tmp_path / "dl"))
    assert json.loads(open(stored).read()) == json.loads((run_dir / "test_metrics.json").read_text())


def test_optuna_study_stores_the_current_distributions(tmp_path):
    import warnings

    import optuna
    from optuna import distributions as d

    from tformer_cli.sweeps.optuna_sweep import current_distributions, kinds_of_study

    with warnings.catch_warnings():  # the classes Hydra's Optuna plugin builds (deprecated since Optuna 3)
        warnings.simplefilter("ignore", FutureWarning)
        old = {"lr": d.LogUniformDistribution(1e-5, 1e-2), "drop": d.UniformDistribution(0, 0.5),
               "layers": d.IntUniformDistribution(1, 5), "pool": d.CategoricalDistribution(["mean", "cls"])}
    new = current_distributions(old)
    assert {k: type(d).__name__ for k, d in new.items()} == {
        "lr": "FloatDistribution", "drop": "FloatDistribution", "layers": "IntDistribution",
        "pool": "CategoricalDistribution"}
    assert new["lr"].log and (new["lr"].low, new["lr"].high) == (1e-5, 1e-2)
    assert (new["layers"].low, new["layers"].high) == (old["layers"].low, old["layers"].high)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=storage, study_name="s")
    def suggest(study, distributions):  # as the plugin's _configure_trials asks (Optuna converts only in ask())
        trial = study.ask()
        for name, distribution in distributions.items():
            trial._suggest(name, distribution)
        study.tell(trial, 1.0)

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # nothing Optuna 6 removes, written or read back
        suggest(study, new)
        stored = optuna.load_study(study_name="s", storage=storage).trials[0].distributions
    assert {k: type(d).__name__ for k, d in stored.items()} == {k: type(d).__name__ for k, d in new.items()}

    legacy = optuna.create_study(storage=storage, study_name="legacy")  # begun by an earlier tformer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        suggest(legacy, old)
        with pytest.raises(ValueError, match="different distribution kind"):
            suggest(legacy, new)
        kept = kinds_of_study(legacy, new)
        suggest(legacy, kept)  # Optuna refuses a class change within a study: the study goes on with its own
    assert type(kept["lr"]) is type(old["lr"]) and type(kept["pool"]) is type(new["pool"])
