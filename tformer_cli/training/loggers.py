"""Where a run's metrics go besides metrics.jsonl (which every run writes): the `logger` config group.

A logger receives the records the training loop emits (`{"kind": "step", "step", "loss", "lr",
"samples_per_s"}` every log_every_steps, `mlm_loss` instead of `loss` when pretraining, `{"kind": "epoch", "step", "epoch", "val_...": ...}` every epoch), the
composed config once at the start, the test metrics at the end, and how the run ended. Each optional library
is imported only when its logger is chosen; a missing one is a one-line error naming the extra to install.

    csv          metrics.csv beside metrics.jsonl: one row per epoch, rewritten whole (atomic) each epoch; always
                 on (the other loggers add to it: a run's folder reads the same whichever tracker was chosen)
    tensorboard  event files (<run dir>/tensorboard); a resume purges the events after its checkpoint's step
    mlflow       one MLflow run per training run (a resume continues it): params = the flattened config,
                 metrics by step, test metrics and the run dir as tags; status FINISHED / FAILED / KILLED; the
                 run's files (curves, reports, history, test metrics, the best checkpoint if asked) as artifacts
    wandb        one Weights & Biases run per training run, offline by default (no account or network needed;
                 `wandb sync` uploads it later); a resume starts a new W&B run in the same group; the same files

Trackers name a run after its overrides (`model=small,optimizer.lr=0.0003`), which is what tells the runs of a
sweep apart; at the end each says where it wrote and the command that opens it.
Adding one: a class with the methods below, registered with `@logger("name")`, and configs/logger/name.yaml.
"""
from __future__ import annotations

import contextlib
import csv
import importlib
import io
import json
import logging
import os
import shlex
import time
import warnings
from pathlib import Path
from typing import Callable

from .. import network
from ..errors import TformerError
from ..registry import registrar
from ..safe_text import csv_row, markup
from ..store.atomic import write_text
from ..store.layout import RunDir
from .config import LoggerConfig

LOGGERS: dict[str, Callable] = {}
logger = registrar(LOGGERS)


class Logger:
    def start(self, config: dict, resume_step: int | None) -> None: ...
    def log(self, record: dict) -> None: ...
    def log_test(self, metrics: dict) -> None: ...
    def finish(self, status: str) -> None: ...  # FINISHED | FAILED | KILLED
    def where(self) -> str | None: ...  # where it wrote and how to open it (rich markup), once finished


class Loggers(Logger):
    """The csv logger plus the chosen one, as one: metrics.csv never depends on which tracker is on. `say` gets
    each tracker's location line after it finished."""

    def __init__(self, loggers: list[Logger], say: Callable | None = None):
        self.loggers, self.say = loggers, say

    def start(self, config: dict, resume_step: int | None) -> None:
        for one in self.loggers:
            one.start(config, resume_step)

    def log(self, record: dict) -> None:
        for one in self.loggers:
            one.log(record)

    def log_test(self, metrics: dict) -> None:
        for one in self.loggers:
            one.log_test(metrics)

    def finish(self, status: str) -> None:
        for one in self.loggers:
            try:
                one.finish(status)
                line = one.where()
            except Exception as exc:  # a tracker's upload is not the run, which is complete on disk: a warning
                said = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
                line = f"[yellow]warning[/]: the tracker could not finish ({markup(said)})"
            if line and self.say is not None:
                self.say(line, highlight=False)

    def where(self) -> str | None:
        return "\n".join(filter(None, (one.where() for one in self.loggers))) or None


NAME_WIDTH = 100  # characters of a tracker's run name (the full overrides are kept as a tag / in the config)
REACH_TIMEOUT_S = 5.0  # a tracking server's host given this long to accept a connection
FIRST_CONTACT = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "15", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"}  # and to answer
# (one retry: a busy server's brief 429 or 503 is not a wrong address)
UNNAMED = ("logger", "hydra", "resume", "resume_ignore_data_change")  # same for every run compared, or bookkeeping


def run_name(overrides, run_dir: RunDir) -> str:
    """A run's name in a tracker: its overrides (`model=small,optimizer.lr=0.0003`), a path value by its file
    name, cut whole at NAME_WIDTH with a count of what was left out; the run dir's name when none."""
    parts = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+~").split(".")[0] in UNNAMED:
            continue
        if "/" in value.rstrip("/") and not value.startswith(("[", "{")):
            value = value.rstrip("/").rsplit("/", 1)[-1]
        parts.append(f"{key}={value}" if _ else key)
    if not parts:
        return run_dir.root.name
    name, kept = "", 0
    for part in parts:
        more = f",+{len(parts) - kept - 1} more" if kept + 1 < len(parts) else ""
        if kept and len(name) + 1 + len(part) + len(more) > NAME_WIDTH:
            break
        name, kept = f"{name},{part}" if kept else part[:NAME_WIDTH], kept + 1
    return name + (f",+{len(parts) - kept} more" if kept < len(parts) else "")


def artifacts(run_dir: RunDir) -> list[tuple[Path, str | None]]:
    """What a finished run wrote that a tracker keeps: (file or folder, its folder in the tracker)."""
    found = [(p, None) for p in (run_dir.training_curves, run_dir.history, run_dir.test_metrics,
                                 run_dir.metrics_csv, run_dir.data_report) if p.is_file()]
    return found + ([(run_dir.test_report, run_dir.test_report.name)] if run_dir.test_report.is_dir() else [])


def shown(path) -> str:
    """A path as a shell argument inside a rich line."""
    return markup(shlex.quote(str(path)))


def scalars(record: dict) -> dict[str, float]:
    """The numeric entries of a record (lists, strings and flags left out)."""
    return {k: float(v) for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "kind")}


def flatten(tree: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, dict)) else str(v)
    return out


def _need(module: str, extra: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise TformerError(f"logger={extra} needs the {extra} package: pip install 'tformer[{extra}]' (or choose "
                           f"logger=csv)") from None


@logger("csv")
class CsvLogger(Logger):
    def __init__(self, cfg: LoggerConfig, run_dir: RunDir, overrides=()):
        self.run_dir = run_dir

    def log(self, record: dict) -> None:
        if record.get("kind") != "epoch":
            return
        rows = []
        if self.run_dir.metrics_log.is_file():
            for line in self.run_dir.metrics_log.read_text(encoding="utf-8").splitlines():
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if r.get("kind") == "epoch":
                    row = {"epoch": r.get("epoch"), "step": r.get("step"), **scalars(r)}
                    rows.append({**row, "epoch": r.get("epoch")})  # (whole numbers, first columns)
        columns = list(dict.fromkeys(k for r in rows for k in r))
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns)
        writer.writeheader()
        writer.writerows(csv_row(r) for r in rows)
        write_text(self.run_dir.metrics_csv, buffer.getvalue())


@logger("tensorboard")
class TensorBoardLogger(Logger):
    def __init__(self, cfg: LoggerConfig, run_dir: RunDir, overrides=()):
        _need("tensorboard", "tensorboard")
        self.log_dir = Path(cfg.option("log_dir") or run_dir.tensorboard)
        self.writer = None
        if cfg.option("log_dir"):  # a folder of the user's: made (or found unusable) before any data is read
            try:
                self.log_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise TformerError(f"logger.log_dir={self.log_dir} cannot be a folder of event files "
                                   f"({exc.strerror or type(exc).__name__}); pass a folder you can write") from None

    def start(self, config: dict, resume_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # deferred: needs the optional tensorboard extra

        # purge_step: events a resumed run will log again (after its checkpoint) are dropped, not doubled
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=resume_step)
        if resume_step is None:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)

    def log(self, record: dict) -> None:
        group = "train" if record.get("kind") == "step" else "epoch"
        for k, v in scalars(record).items():
            self.writer.add_scalar(f"{group}/{k}", v, int(record.get("step", 0)))
        self.writer.flush()

    def log_test(self, metrics: dict) -> None:
        for k, v in scalars(metrics).items():
            self.writer.add_scalar(f"test/{k}", v, 0)

    def finish(self, status: str) -> None:
        if self.writer is not None:
            self.writer.close()

    def where(self) -> str | None:
        if self.writer is None:
            return None
        folder = self.log_dir.resolve()
        return (f"[bold]tensorboard[/] events in {markup(folder)}; open with: tensorboard --logdir {shown(folder)} "
                f"(or a folder above it, e.g. outputs, to compare runs)")


@contextlib.contextmanager
def first_contact():
    """MLflow's first request with a short timeout and one retry (unless the user set them): a server that
    accepts connections but does not answer (hung, or something else on its port) held the run for many minutes
    (a 120 s timeout, retried seven times) before it was refused. Later requests keep MLflow's own patience
    (an artifact upload may take minutes)."""
    given = {key: os.environ.get(key) for key in FIRST_CONTACT}
    os.environ.update({key: value for key, value in FIRST_CONTACT.items() if given[key] is None})
    try:
        yield
    finally:
        for key, value in given.items():
            if value is None:
                os.environ.pop(key, None)


def file_store(uri: str) -> None:
    """A tracking URI that is a folder (`mlruns`, `file:///...`, or a word that is no URI at all, `not a uri`) is
    MLflow's file store, which MLflow 3 refuses with a paragraph about migrating: refused here in one line, before
    the data is read. (Building the client opens the store; it writes nothing when it refuses.)"""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(tracking_uri=uri)
    except OSError as exc:  # (a store MLflow accepts, in a folder it cannot make)
        raise TformerError(f"logger.tracking_uri={uri!r}: {exc.strerror or exc}; fix logger.tracking_uri") from None
    except MlflowException as exc:
        if "MLFLOW_ALLOW_FILE_STORE" not in str(exc):
            raise TformerError(f"logger=mlflow: {str(exc).splitlines()[0][:200]} (tracking_uri {uri}); check "
                               f"logger.tracking_uri") from None
        raise TformerError(f"logger.tracking_uri={uri!r} is a folder (MLflow's file store), which this MLflow "
                           f"refuses; give a database (sqlite:///mlflow.db), a server (http://host:5000), or no "
                           f"tracking_uri (outputs/mlflow.db); MLFLOW_ALLOW_FILE_STORE=true keeps a file "
                           f"store") from None


@logger("mlflow")
class MlflowLogger(Logger):
    def __init__(self, cfg: LoggerConfig, run_dir: RunDir, overrides=()):
        _need("mlflow", "mlflow")
        self.run_dir, self.overrides, self.log_model = run_dir, list(overrides), bool(cfg.option("log_model"))
        uri, artifacts_at = cfg.option("tracking_uri"), cfg.option("artifact_location")
        if not uri:
            db = Path("outputs").resolve() / "mlflow.db"
            db.parent.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{db}"
        if not artifacts_at and str(uri).startswith("sqlite:///"):
            # beside the database (MLflow's own default is ./mlruns in whatever folder the run started from)
            artifacts_at = Path(str(uri)[len("sqlite:///"):]).resolve().parent / "mlruns"
        self.artifacts_at = Path(artifacts_at).resolve().as_uri() if artifacts_at and "://" not in str(
            artifacts_at) else artifacts_at
        self.uri, self.experiment, self.client, self.run_id = uri, str(cfg.option("experiment") or "tformer"), None, None
        self.name = run_name(self.overrides, run_dir)
        why = network.unreachable(str(uri), REACH_TIMEOUT_S)  # (MLflow's client would retry for minutes)
        if why is not None:
            raise TformerError(f"logger=mlflow: cannot reach the tracking server ({why}); start it, or fix "
                               f"logger.tracking_uri")
        if ("://" not in str(uri) or str(uri).startswith("file:")) and not str(uri).startswith("databricks") \
                and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() not in ("true", "1", "yes"):
            file_store(str(uri))

    def start(self, config: dict, resume_step: int | None) -> None:
        # deferred (mlflow, here and in _metrics): the optional mlflow extra
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        for name in ("mlflow", "alembic"):  # their INFO lines (creating tables, ...) are not the user's business
            logging.getLogger(name).setLevel(logging.WARNING)
        try:
            with warnings.catch_warnings():  # SQLAlchemy's deprecation notices about MLflow's own store code
                warnings.simplefilter("ignore", DeprecationWarning)
                self.client = MlflowClient(tracking_uri=self.uri)
                with first_contact():
                    try:
                        self.client.search_experiments(max_results=1)  # opens (and creates) the store now
                    except MlflowException as exc:
                        if "timed out" in str(exc).lower():
                            waited = os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"]
                            raise TformerError(f"logger=mlflow: the tracking server at {self.uri} accepted the "
                                               f"connection but did not answer within {waited} s; check that it is "
                                               f"an MLflow server (logger.tracking_uri), or set "
                                               f"MLFLOW_HTTP_REQUEST_TIMEOUT to wait longer") from None
                        raise
            saved = self.run_dir.mlflow_run_id
            if resume_step is not None and saved.is_file():  # a resume continues the same MLflow run
                self.run_id = saved.read_text().strip()
                self.client.update_run(self.run_id, status="RUNNING")
                return
            found = self.client.get_experiment_by_name(self.experiment)
            experiment = found.experiment_id if found else self.client.create_experiment(
                self.experiment, artifact_location=self.artifacts_at or None)
            tags = {"tformer.run_dir": str(self.run_dir.root.resolve()),
                    "tformer.overrides": " ".join(self.overrides)[:5000]}
            run = self.client.create_run(experiment, run_name=self.name, tags=tags)
            self.run_id = run.info.run_id
            write_text(saved, self.run_id + "\n")
            params = [Param(k, v[:6000]) for k, v in flatten(config).items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
                self.client.log_batch(self.run_id, params=params[i:i + 100])
        except MlflowException as exc:
            raise TformerError(f"logger=mlflow: {str(exc).splitlines()[0][:200]} (tracking_uri {self.uri}); check "
                               f"logger.tracking_uri") from None

    def _metrics(self, values: dict, step: int, prefix: str = "") -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(prefix + k, v, now, step) for k, v in values.items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def log(self, record: dict) -> None:
        self._metrics(scalars(record), int(record.get("step", 0)), "" if record.get("kind") == "epoch" else "step_")

    def log_test(self, metrics: dict) -> None:
        self._metrics(scalars(metrics), 0, "test_")

    def finish(self, status: str) -> None:
        if self.client is None or self.run_id is None:
            return
        if status == "FINISHED":  # (an interrupted run uploads when its resume finishes)
            from mlflow.exceptions import MlflowException

            try:
                for path, folder in artifacts(self.run_dir):
                    (self.client.log_artifacts if path.is_dir() else self.client.log_artifact)(
                        self.run_id, str(path), folder)
                if self.log_model and self.run_dir.best.path.is_dir():
                    self.client.log_artifacts(self.run_id, str(self.run_dir.best.path),
                                              self.run_dir.best.path.relative_to(self.run_dir.root).as_posix())
            except (MlflowException, OSError) as exc:
                why = str(exc).splitlines()[0][:200]
                self.client.set_terminated(self.run_id, status=status)
                raise TformerError(f"logger=mlflow: the run's files could not be stored ({why}); the run itself is "
                                   f"complete in {self.run_dir}") from None
        self.client.set_terminated(self.run_id, status=status)

    def where(self) -> str | None:
        if self.run_id is None:
            return None
        if self.uri.startswith(("http://", "https://")):
            experiment = self.client.get_run(self.run_id).info.experiment_id
            opened = f"open {markup(self.uri.rstrip('/'))}/#/experiments/{experiment}/runs/{self.run_id}"
        else:
            opened = f"open with: mlflow ui --backend-store-uri {shown(self.uri)}"
        return (f"[bold]mlflow[/] run {markup(self.name)} in experiment {markup(self.experiment)} "
                f"({markup(self.uri)}); {opened}")


@logger("wandb")
class WandbLogger(Logger):
    MODES = ("offline", "online", "disabled")

    def __init__(self, cfg: LoggerConfig, run_dir: RunDir, overrides=()):
        _need("wandb", "wandb")
        self.run_dir, self.cfg, self.run, self.name = run_dir, cfg, None, run_name(overrides, run_dir)
        self.log_model, self.sync_dir, self.url = bool(cfg.option("log_model")), None, None
        self.mode = str(cfg.option("mode") or "offline")
        if self.mode not in self.MODES:
            raise TformerError(f"logger.mode={self.mode} is not one of {', '.join(self.MODES)}")

    def start(self, config: dict, resume_step: int | None) -> None:
        os.environ.setdefault("WANDB_SILENT", "true")  # its banner and sync hints would interleave with ours
        import wandb  # deferred: the optional wandb extra (and it reads WANDB_SILENT when imported)

        # the run's place under outputs/ (<date>/<time>, or <date>/<time>/<job> for a sweep's job: job folders
        # alone repeat from sweep to sweep)
        parts = self.run_dir.root.resolve().parts
        group = "/".join(parts[-3:] if self.run_dir.sweep() is not None else parts[-2:])
        # W&B steps only go forward, and offline runs cannot be resumed: a resumed run (which logs again from
        # its checkpoint's step) is a new W&B run in the run's group, named after where it starts
        name = self.name + ("" if resume_step is None else f" (from step {resume_step})")
        try:
            self.run = wandb.init(project=str(self.cfg.option("project") or "tformer"),
                                  entity=self.cfg.option("entity"), name=name, group=group,
                                  dir=str(self.run_dir.root), mode=self.mode, config=config,
                                  settings=wandb.Settings(silent=True, console="off"))
        except Exception as exc:  # (wandb's errors have no common base: auth, network, bad settings)
            raise TformerError(f"logger=wandb: {(str(exc).splitlines() or [type(exc).__name__])[0][:200]} (mode "
                               f"{self.mode}; logger.mode=offline needs no account or network)") from None
        self.run.define_metric("trainer/step")
        self.run.define_metric("*", step_metric="trainer/step")  # x axis: our optimizer step, as other loggers

    def log(self, record: dict) -> None:
        group = "train" if record.get("kind") == "step" else "epoch"
        self.run.log({**{f"{group}/{k}": v for k, v in scalars(record).items()},
                      "trainer/step": int(record.get("step", 0))})

    def log_test(self, metrics: dict) -> None:
        for k, v in scalars(metrics).items():
            self.run.summary[f"test/{k}"] = v

    def finish(self, status: str) -> None:
        if self.run is None:
            return
        try:
            if status == "FINISHED":  # the run's files (its Files tab) and the best checkpoint as a model artifact
                import wandb

                for path, folder in artifacts(self.run_dir):
                    self.run.save(str(path / "*" if path.is_dir() else path), base_path=str(self.run_dir.root),
                                  policy="now")
                if self.log_model and self.run_dir.best.path.is_dir():
                    model = wandb.Artifact(f"model-{self.run.id}", type="model",
                                           metadata={"run_dir": str(self.run_dir)})
                    model.add_dir(str(self.run_dir.best.path))
                    self.run.log_artifact(model, aliases=["best"])
        finally:  # (an upload that failed still ends the W&B run)
            self.sync_dir = Path(self.run.settings.sync_dir) if self.mode == "offline" else None
            self.url = self.run.url if self.mode == "online" else None
            self.run.finish(exit_code=0 if status == "FINISHED" else 1)

    def where(self) -> str | None:
        if self.sync_dir is not None:
            return (f"[bold]wandb[/] offline run {markup(self.name)} in {markup(self.sync_dir)}; upload with: "
                    f"wandb sync {shown(self.sync_dir)}")
        return f"[bold]wandb[/] run {markup(self.name)}: {markup(self.url)}" if self.url else None


def build_logger(cfg: LoggerConfig, run_dir: RunDir, overrides=(), say: Callable | None = None) -> Logger:
    """The csv logger and the chosen one; `overrides` name the run in a tracker, `say` prints where it wrote."""
    if cfg.name not in LOGGERS:
        raise TformerError(f"logger={cfg.name} is not one of {', '.join(sorted(LOGGERS))}")
    chosen = [LOGGERS[cfg.name](cfg, run_dir, overrides)] if cfg.name != "csv" else []
    return Loggers([CsvLogger(cfg, run_dir), *chosen], say)
