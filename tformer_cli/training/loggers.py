"""Where a run's metrics go besides metrics.jsonl (which every run writes): the `logger` config group.

A logger receives the records the training loop emits (`{"kind": "step", "step", "loss", "lr",
"samples_per_s"}` every log_every_steps, `mlm_loss` instead of `loss` when pretraining, `{"kind": "epoch", "step", "epoch", "val_...": ...}` every epoch), the
composed config once at the start, the test metrics at the end, and how the run ended. Each optional library
is imported only when its logger is chosen; a missing one is a one-line error naming the extra to install.

    csv          metrics.csv beside metrics.jsonl: one row per epoch, rewritten whole (atomic) each epoch
    tensorboard  event files (<run dir>/tensorboard); a resume purges the events after its checkpoint's step
    mlflow       one MLflow run per training run (a resume continues it): params = the flattened config,
                 metrics by step, test metrics and the run dir as tags; status FINISHED / FAILED / KILLED
    wandb        one Weights & Biases run per training run, offline by default (no account or network needed;
                 `wandb sync` uploads it later); a resume starts a new W&B run in the same group

Adding one: a class with the four methods below, registered with `@logger("name")`, and configs/logger/name.yaml.
"""
from __future__ import annotations

import csv
import importlib
import io
import json
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Callable

from ..errors import TformerError
from ..registry import registrar
from ..safe_text import csv_row
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
    def __init__(self, cfg: LoggerConfig, run_dir: RunDir):
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
    def __init__(self, cfg: LoggerConfig, run_dir: RunDir):
        _need("tensorboard", "tensorboard")
        self.log_dir = Path(cfg.option("log_dir") or run_dir.tensorboard)
        self.writer = None

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


@logger("mlflow")
class MlflowLogger(Logger):
    def __init__(self, cfg: LoggerConfig, run_dir: RunDir):
        _need("mlflow", "mlflow")
        self.run_dir = run_dir
        uri = cfg.option("tracking_uri")
        if not uri:
            db = Path("outputs").resolve() / "mlflow.db"
            db.parent.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{db}"
        self.uri, self.experiment, self.client, self.run_id = uri, str(cfg.option("experiment") or "tformer"), None, None

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
                self.client.search_experiments(max_results=1)  # opens (and creates) the store now
            saved = self.run_dir.mlflow_run_id
            if resume_step is not None and saved.is_file():  # a resume continues the same MLflow run
                self.run_id = saved.read_text().strip()
                self.client.update_run(self.run_id, status="RUNNING")
                return
            found = self.client.get_experiment_by_name(self.experiment)
            experiment = found.experiment_id if found else self.client.create_experiment(self.experiment)
            run = self.client.create_run(experiment, run_name=self.run_dir.root.name,
                                         tags={"tformer.run_dir": str(self.run_dir.root.resolve())})
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
        if self.client is not None and self.run_id is not None:
            self.client.set_terminated(self.run_id, status=status)


@logger("wandb")
class WandbLogger(Logger):
    MODES = ("offline", "online", "disabled")

    def __init__(self, cfg: LoggerConfig, run_dir: RunDir):
        _need("wandb", "wandb")
        self.run_dir, self.cfg, self.run = run_dir, cfg, None
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
        name = self.run_dir.root.name + ("" if resume_step is None else f"-from-step-{resume_step}")
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
        if self.run is not None:
            self.run.finish(exit_code=0 if status == "FINISHED" else 1)


def build_logger(cfg: LoggerConfig, run_dir: RunDir) -> Logger:
    if cfg.name not in LOGGERS:
        raise TformerError(f"logger={cfg.name} is not one of {', '.join(sorted(LOGGERS))}")
    return LOGGERS[cfg.name](cfg, run_dir)
