"""The on-disk layout of a run and of a checkpoint. This module is the only place that spells their file names;
everything else asks a `RunDir` or a `CheckpointDir` for a path.

    <run dir>/                      a `tformer train` (or evaluate) run
      checkpoints/best/             the best epoch so far            (a CheckpointDir)
      checkpoints/last/             the newest state, with the training state needed to resume
      checkpoints/.last.old         the previous `last`, present only if a crash hit between two renames (atomic.py)
      history.json                  per-epoch metrics, written last, once the reports are (the finished mark)
      test_metrics.json, test_report/, training_curves.png
      metrics.json                  (evaluate runs) the metrics of the evaluated split; (calibrate runs) the fit
      data_report.json              what the data checks found (train and evaluate runs; data/sanity.py)
      train.log / evaluate.log      the composed config, then everything the terminal showed
      metrics.jsonl                 one JSON record per logged step (loss, lr, samples/s) and per epoch
      metrics.csv / tensorboard/ / mlflow_run_id / wandb/   what the chosen logger writes (training/loggers.py)

    <checkpoint dir>/
      model.safetensors  model.json  tokenizer.json  labels.json  config.yaml  metrics.json  meta.json
      manifest.json                 SHA-256 and size of every other file, checked on load
      training_state.safetensors  trainer_state.json          (`last` only: optimizer, schedule, RNG, ...)

    <run dir>/export/onnx/          `tformer export` (an ExportDir; onnx-int8/ when quantized)
      model.onnx  tokenizer.json  labels.json  export.json (how to read texts, parity)  manifest.json

    <Hub model repository>/         `tformer push` (deploy/hub_repo.py); read back by checkpoint=hf://<owner>/<name>
      <checkpoint files>  README.md (the model card)  onnx/ (the run's export, when it had one)

No torch here, and nothing else of the package but errors.py: `tformer report` reads runs without paying for it.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..errors import TformerError
from ..tasks import TASKS

HUB_ONNX_FOLDER = "onnx"  # where a Hub repository keeps the run's export
MARKER = ".tformer"  # in every folder tformer made (run, export, stage): what makes it ours (ownership.py)
KINDS = ("run", "export", "stage")  # what a marker says its folder is
_MAX_MARKER_BYTES = 1 << 20  # a marker lists file names: anything bigger is not ours


# The most a JSON or YAML file tformer wrote (a checkpoint's labels, meta, metrics, config; a run's history and test
# metrics) may hold before it is read back. Above what tformer writes for a million classes (their names are kept
# once in labels.json and once in meta.json's data fingerprint); a file past it is crafted or damaged, and costs a
# stat, not gigabytes of memory. Files that come from elsewhere (config.json of a model folder) have their own caps.
OWN_FILE_CAP = 256 << 20


def read_small(path: Path) -> str:
    """A small text file's contents; ValueError when it is larger than any tformer writes (a sparse or crafted
    file costs a stat, not its size in memory)."""
    if path.stat().st_size > OWN_FILE_CAP:
        raise ValueError(f"{path} is larger than {OWN_FILE_CAP >> 20} MiB")
    return path.read_text()


def temporary_sibling(path: Path) -> Path:
    """Where a file or directory is written before it is renamed into place (hidden, per process)."""
    return path.parent / f".{path.name}.tmp-{os.getpid()}"


def old_sibling(path: Path) -> Path:
    """Where a directory being replaced waits between the two renames of a swap (atomic.swap_in)."""
    return path.parent / f".{path.name}.old"


PRETRAINING = "masked-lm"  # meta.json "kind" of a `tformer pretrain` checkpoint (classifiers have none)
DISTILLED_FROM = "distilled_from"  # meta.json key of a `tformer distill` checkpoint: its teacher checkpoint
TEACHER_WEIGHTS = "teacher_weights_sha256"  # ... and the teacher's weights it learned from (a resume checks them)


class CheckpointDir:
    """Paths inside one checkpoint directory."""

    REQUIRED = ("model.safetensors", "model.json", "tokenizer.json", "labels.json", "meta.json")

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"CheckpointDir({str(self.path)!r})"

    def __str__(self) -> str:
        return str(self.path)

    weights = property(lambda self: self.path / "model.safetensors")
    model_config = property(lambda self: self.path / "model.json")
    tokenizer = property(lambda self: self.path / "tokenizer.json")
    labels = property(lambda self: self.path / "labels.json")
    config = property(lambda self: self.path / "config.yaml")
    metrics = property(lambda self: self.path / "metrics.json")
    meta = property(lambda self: self.path / "meta.json")
    training_tensors = property(lambda self: self.path / "training_state.safetensors")
    training_json = property(lambda self: self.path / "trainer_state.json")
    manifest = property(lambda self: self.path / "manifest.json")

    def is_pretraining(self) -> bool:
        """A `tformer pretrain` (masked-LM) checkpoint, by its meta.json."""
        return self.task() == "pretrain"

    def task(self) -> str:
        """The command that trains this kind of checkpoint (pretrain, distill or train), by its meta.json: what
        resume= continues it with."""
        try:
            meta = json.loads(read_small(self.meta))
        except (OSError, ValueError):
            return "train"
        if not isinstance(meta, dict):
            return "train"
        return "pretrain" if meta.get("kind") == PRETRAINING else "distill" if meta.get(DISTILLED_FROM) else "train"

    def early_stopping(self) -> tuple[str, str]:
        """(monitor, mode) of the run's early stopping, from its saved config; (val_accuracy, max) if unreadable.
        What "best" means for this run: sweeps compare their jobs by it."""
        import yaml  # (~20 ms) only when a sweep's jobs are compared: predict's start imports this module

        try:
            stopping = yaml.safe_load(read_small(self.config))["trainer"]["early_stopping"]
            return str(stopping["monitor"]), str(stopping.get("mode", "max"))
        except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):  # ValueError: undecodable bytes
            return "val_accuracy", "max"

    def missing(self) -> list[str]:
        return [name for name in self.REQUIRED if not (self.path / name).is_file()]

    def has_training_state(self) -> bool:
        return self.training_json.is_file() and self.training_tensors.is_file()

    def existing(self) -> "CheckpointDir | None":
        """This checkpoint, or the previous one a crash left mid-swap (between the two renames), or None."""
        if self.path.is_dir():
            return self
        old = old_sibling(self.path)
        return CheckpointDir(old) if old.is_dir() else None


class ExportDir:
    """Paths inside one exported model directory: everything `predict --runtime onnx` needs, and no torch file."""

    REQUIRED = ("model.onnx", "tokenizer.json", "labels.json", "export.json")

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    model = property(lambda self: self.path / "model.onnx")
    tokenizer = property(lambda self: self.path / "tokenizer.json")
    labels = property(lambda self: self.path / "labels.json")
    info = property(lambda self: self.path / "export.json")
    manifest = property(lambda self: self.path / "manifest.json")

    def is_export(self) -> bool:
        return all((self.path / name).is_file() for name in self.REQUIRED)


def marker(folder: str | Path) -> dict | None:
    """The folder's marker, or None when it has none (or one that is not a marker of ours)."""
    path = Path(folder) / MARKER
    try:
        if not path.is_file() or path.stat().st_size > _MAX_MARKER_BYTES:
            return None
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("kind") not in KINDS or not isinstance(record.get("id"), str):
        return None
    files = record.get("files", [])
    record["files"] = [f for f in files if isinstance(f, str)] if isinstance(files, list) else []
    return record


def made_parents(folder: Path) -> int:
    """How many folders above `folder` were made with it, as its marker (store/ownership.py `mark`) says; 0 when
    unknown."""
    made = (marker(folder) or {}).get("parents", 0)
    return made if isinstance(made, int) and not isinstance(made, bool) and made >= 0 else 0


class RunDir:
    """Paths of one run directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    def __str__(self) -> str:
        return str(self.root)

    checkpoints = property(lambda self: self.root / "checkpoints")
    history = property(lambda self: self.root / "history.json")
    test_metrics = property(lambda self: self.root / "test_metrics.json")
    test_report = property(lambda self: self.root / "test_report")
    training_curves = property(lambda self: self.root / "training_curves.png")
    eval_metrics = property(lambda self: self.root / "metrics.json")
    data_report = property(lambda self: self.root / "data_report.json")  # data/sanity.py: the checks of the data
    timings = property(lambda self: self.root / "timings.json")  # timing.py: each phase's time and peak memory
    metrics_log = property(lambda self: self.root / "metrics.jsonl")  # per logged step and per epoch
    metrics_csv = property(lambda self: self.root / "metrics.csv")  # one row per epoch (whatever the logger)
    tensorboard = property(lambda self: self.root / "tensorboard")  # logger=tensorboard: event files
    mlflow_run_id = property(lambda self: self.root / "mlflow_run_id")  # logger=mlflow: the run a resume continues
    wandb = property(lambda self: self.root / "wandb")  # logger=wandb: W&B's own folder (offline runs to sync)

    # what a run dir holds before any result
    BOOKKEEPING = (".hydra", ".lock", MARKER, "data_report.json",  # (the checks' report: a refusal after them)
                   "timings.json",  # (where the time of a run stopped before its first checkpoint went)
                   *(f"{name}.log" for name, task in TASKS.items() if task.style == "hydra"))

    def discard_if_empty(self) -> bool:
        """Remove this run dir if it holds nothing but bookkeeping (a refused or failed command's folder, or the
        folder Hydra made for a resume that continued elsewhere); runs with any result are never touched. Only a
        folder tformer made (its marker, or a job folder of a sweep) goes; an empty folder the user gave as
        hydra.run.dir gets back to empty."""
        try:
            entries = list(self.root.iterdir())
        except OSError:
            return False
        if any(e.name not in self.BOOKKEEPING for e in entries):
            return False
        lock = self.lock()
        if not lock.try_acquire():  # a folder another process has locked is its run, starting: never removed
            return False
        try:
            if (self.root / MARKER).is_file() or SweepDir(self.root.parent).is_sweep():
                made = made_parents(self.root)
                shutil.rmtree(self.root, ignore_errors=True)
                for parent in self.root.parents[:made]:  # the date and task folders made with it, left empty
                    try:
                        parent.rmdir()
                    except OSError:  # (another run's, or a file the user put there)
                        break
            else:
                for entry in self.root.iterdir():
                    if entry.is_dir():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)
        finally:
            lock.release()
        return True

    def log(self, task: str) -> Path:
        """`train.log` / `evaluate.log`: what the terminal showed, plus the composed config."""
        return self.root / f"{task}.log"

    def export(self, name: str = "onnx") -> ExportDir:
        """`tformer export`'s default destination: onnx, or onnx-int8 for a quantized model."""
        return ExportDir(self.root / "export" / name)

    def export_of(self, ckpt: "CheckpointDir", quantized: bool = False) -> ExportDir:
        """Where a checkpoint of this run is exported by default: export/onnx[-int8] for `best` (what a run dir
        stands for), export/onnx-<name>[-int8] for any other (so exporting `last` never replaces best's)."""
        name = "onnx" if ckpt.path.name == "best" else f"onnx-{ckpt.path.name}"
        return self.export(name + ("-int8" if quantized else ""))

    def served_export(self, ckpt: "CheckpointDir") -> ExportDir:
        """The export that stands for `ckpt` (predict --runtime onnx, serve, push): its fp32 export, else its int8
        one when only `export quantize=int8` was run (not existing when it has neither)."""
        fp32 = self.export_of(ckpt)
        return fp32 if fp32.is_export() or not self.export_of(ckpt, quantized=True).is_export() else \
            self.export_of(ckpt, quantized=True)

    def checkpoint(self, which: str) -> CheckpointDir:
        """`best` or `last`, as written (not necessarily existing)."""
        return CheckpointDir(self.checkpoints / which)

    @property
    def best(self) -> CheckpointDir:
        return self.checkpoint("best")

    @property
    def last(self) -> CheckpointDir:
        return self.checkpoint("last")

    @property
    def finished(self) -> bool:
        """The run ran to its end, reports and all: history.json is its last write (a killed or interrupted run,
        also one stopped while it calibrated or tested its best checkpoint, has none yet)."""
        return self.history.is_file()

    lock_file = property(lambda self: self.root / ".lock")

    def lock(self) -> "RunLock":
        """Held while a process trains into this run: a second `train`/`resume=` of it is refused."""
        return RunLock(self.lock_file)

    hydra_record = property(lambda self: self.root / ".hydra")  # Hydra's record of the job
    hydra_overrides = property(lambda self: self.root / ".hydra" / "overrides.yaml")
    hydra_config = property(lambda self: self.root / ".hydra" / "config.yaml")  # written when the job starts

    def sweep(self) -> Path | None:
        """The `-m` sweep directory this run is a job of, else None."""
        return self.root.parent if SweepDir(self.root.parent).is_sweep() else None

    @classmethod
    def of_checkpoint(cls, ckpt: CheckpointDir) -> "RunDir":
        return cls(ckpt.path.parent.parent)


class RunLock:
    """An exclusive advisory lock (flock) on a run directory's lock file, released when the process ends however
    it ends (the kernel drops it), so a crash never leaves a stale lock behind."""

    def __init__(self, path: Path):
        self.path, self._fd, self.holder = path, None, None

    def try_acquire(self) -> bool:
        """Take the lock if no other process holds it (the holder's pid is then in `self.holder`)."""
        import fcntl  # POSIX only: imported here so that the rest of the layout works everywhere

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(str(self.path), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None

    def __enter__(self) -> "RunLock":
        if not self.try_acquire():
            raise TformerError(f"run {self.path.parent} is in use by another tformer process (pid {self.holder}); "
                               f"wait for it to finish or stop it, or start a new run")
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class SweepDir:
    """A `-m` sweep: Hydra's multirun.yaml, one folder per job, and our summary files."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def __str__(self) -> str:
        return str(self.root)

    summary_csv = property(lambda self: self.root / "summary.csv")
    summary_md = property(lambda self: self.root / "summary.md")
    plan = property(lambda self: self.root / "multirun.yaml")  # the sweep's config and overrides (sweeps/plan.py)

    def is_sweep(self) -> bool:
        return self.plan.is_file()

    def job_dirs(self) -> list[Path]:
        """Job folders (`<n>_<overrides>`, each with Hydra's record), in job-number order."""
        found = [p for p in self.root.iterdir() if RunDir(p).hydra_record.is_dir()] if self.root.is_dir() else []
        number = lambda p: int(p.name.split("_")[0]) if p.name.split("_")[0].isdigit() else 1 << 30
        return sorted(found, key=lambda p: (number(p), p.name))


class AuditDir:
    """A `tformer audit` folder (runs/audit.py): what it audits, what it found, and one training run per fold
    (fold_<k>/, k from 1; an audit begun by an older tformer counted from 0), whose checkpoint is dropped once its
    held-out rows are scored."""

    PLAN = "audit.json"  # what the audit is of (data fingerprint, folds, seed): a resume must match it
    ISSUES = "label_issues.csv"  # written last: an audit folder holding it is finished
    DUPLICATES = "duplicates.csv"
    OUT_OF_FOLD = "out_of_fold.npz"  # in fold_<k>/: the rows it held out and their probabilities
    FOLD = "fold_"

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def __str__(self) -> str:
        return str(self.root)

    plan = property(lambda self: self.root / self.PLAN)
    issues = property(lambda self: self.root / self.ISSUES)
    duplicates = property(lambda self: self.root / self.DUPLICATES)

    def is_audit(self) -> bool:
        return self.plan.is_file()

    def folds(self) -> list[RunDir]:
        """The folds' run folders, in fold order."""
        found = [p for p in self.root.glob(f"{self.FOLD}*") if p.is_dir() and p.name[len(self.FOLD):].isdigit()]
        return [RunDir(p) for p in sorted(found, key=lambda p: int(p.name[len(self.FOLD):]))]

    def scored(self, fold: RunDir) -> bool:
        """The fold's held-out rows are scored (what an interrupted audit keeps)."""
        return (fold.root / self.OUT_OF_FOLD).is_file()

    @classmethod
    def of_fold(cls, path: str | Path) -> "AuditDir | None":
        """The audit a fold folder belongs to, else None."""
        path = Path(path)
        audit = cls(path.parent)
        return audit if path.name[len(cls.FOLD):].isdigit() and path.name.startswith(cls.FOLD) and \
            audit.is_audit() else None


class TeacherCache:
    """A distillation teacher's logits (runs/distill.py), under outputs/teacher_cache/<key>/ where the key names
    the teacher's weights and how it reads texts: one file per shard of texts, named by those texts. Every student
    of the same teacher (a sweep's jobs, a resumed run, a run on more texts that start alike) reads the shards it
    shares instead of running the teacher again, and an interrupted pass keeps the shards it finished."""

    def __init__(self, root: str | Path, key: str):
        self.path = Path(root) / key

    def __str__(self) -> str:
        return str(self.path)

    info = property(lambda self: self.path / "teacher.json")  # which teacher, how it reads (for a person looking)

    def shard(self, texts_key: str) -> Path:
        return self.path / f"logits-{texts_key}.safetensors"


def in_memory_data(content_hash: str, split: str, outputs: str | Path = "outputs") -> Path:
    """Where the Python API keeps data given as a DataFrame or lists (train(data=...)): one parquet file per split
    under outputs/data/<hash of its content>/, so the same data is the same file (the same run config, a resume)."""
    return Path(outputs) / "data" / content_hash / f"{split}.parquet"


def resolve_checkpoint(path: str | Path) -> CheckpointDir | None:
    """A checkpoint dir, or a run dir (-> its best checkpoint); a checkpoint left mid-swap is found by its
    `.old` sibling. None when there is nothing there."""
    p = Path(os.path.expanduser(str(path)))
    run = RunDir(p)
    if run.best.existing() is not None:
        return run.best.existing()
    return CheckpointDir(p).existing()


def resolve_resumable(path: str | Path) -> CheckpointDir | None:
    """The `last` checkpoint (with training state) of a run dir, or the given checkpoint dir itself."""
    p = Path(os.path.expanduser(str(path)))
    for candidate in (RunDir(p).last, CheckpointDir(p / "last"), CheckpointDir(p)):
        found = candidate.existing()
        if found is not None and found.training_json.is_file():
            return found
    return None


def newest_checkpoints(root: str | Path, which: str = "best", pretraining: bool = False) -> list[CheckpointDir]:
    """Every `which` checkpoint under root, oldest first by the time its meta file was written: classifiers, or
    with pretraining=True only `tformer pretrain` checkpoints (which predict, evaluate and resume never pick)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [CheckpointDir(p.parent) for p in root.glob(f"**/checkpoints/{which}/model.safetensors")]
    found = [c for c in found if c.is_pretraining() == pretraining]
    return sorted(found, key=lambda c: c.meta.stat().st_mtime if c.meta.exists() else 0.0)


def newest_best(root: str | Path = "outputs") -> CheckpointDir | None:
    """The newest run's best checkpoint; when that run is a job of a `-m` sweep, the sweep's best job (by the
    metric each job monitored), not whichever job happened to finish last. None when there is none."""
    found = newest_checkpoints(root, "best")
    if not found:
        return None
    sweep = RunDir.of_checkpoint(found[-1]).sweep()
    if sweep is None:
        return found[-1]
    jobs = [c for c in found if RunDir.of_checkpoint(c).sweep() == sweep]
    return max(jobs, key=_monitored_score)


def _monitored_score(ckpt: CheckpointDir) -> float:
    """The value a job's early stopping monitored, signed so that larger is better (-inf when unreadable)."""
    monitor, mode = ckpt.early_stopping()
    try:
        value = float(json.loads(read_small(ckpt.metrics))[monitor])
    except (OSError, ValueError, KeyError, TypeError):
        return float("-inf")
    if value != value or value in (float("inf"), float("-inf")):  # NaN would make max() depend on job order
        return float("-inf")
    return -value if mode == "min" else value


def newest_sweep(root: str | Path = "outputs", keep=None) -> Path | None:
    """The most recently started `-m` sweep under root/multirun, by its multirun.yaml (of those `keep(folder)` keeps,
    when given)."""
    found = sorted(Path(root).glob("multirun/**/multirun.yaml"), key=lambda p: p.stat().st_mtime)
    kept = [p.parent for p in found if keep is None or keep(p.parent)]
    return kept[-1] if kept else None
