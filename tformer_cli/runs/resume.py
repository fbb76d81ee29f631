"""Resuming a run, for every task: which checkpoint `resume=` names, whether the run may go on (finished runs are
only extended, the config must be the same, the data too), and what a job of a resumed `-m` sweep does."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import TformerError
from ..hydra_setup import config_dir, group_defaults
from ..model.encoder import init_shape_keys
from ..store.layout import CheckpointDir, RunDir, SweepDir, newest_checkpoints, resolve_resumable
from ..console import output
from ..data.sources import fingerprint_changes
from ..safe_text import markup
from ..tasks import TASKS
from ..training import recipe

# Keys that may differ between a run and its resumption (where data comes from, how fast, how loud). A
# distillation's unlabeled files are named as typed (a path relative to where it ran) and its teacher cache is a
# folder of files keyed by their content: what they hold is compared instead (its unlabeled texts' fingerprint).
RESUME_IGNORED = ("resume", "resume_ignore_data_change", "trainer.keep_optimizer_state", "trainer.device",
                  "trainer.num_workers", "trainer.log_every_steps", "trainer.checkpoint_every_steps",
                  "trainer.eval_batch_size", "trainer.test_after_fit", "data.dir", "trainer.compile", "trainer.devices",
                  "trainer.micro_batches", "logger", "trainer.calibrate", "trainer.threads", "distill.cache_dir",
                  "distill.unlabeled")


def find_resumable(resume, task: str, outputs_dir: str | Path = "outputs") -> CheckpointDir:
    """resume=true: the newest unfinished run's last checkpoint (of this task: train, pretrain or distill);
    resume=<run dir or checkpoint dir>: that one."""
    pretraining = task == "pretrain"
    what = {"pretrain": "pretraining run", "distill": "distillation run"}.get(task, "run")
    if resume is True:  # (resume=true/yes/...: parsed by TrainConfig, yesno.bool_or_path)
        found = [c for c in newest_checkpoints(outputs_dir, "last", pretraining=pretraining)
                 if c.has_training_state() and not RunDir.of_checkpoint(c).finished and c.task() == task]
        if not found:
            raise TformerError(f"resume=true but no unfinished {what} with a last checkpoint under {outputs_dir}/ "
                               f"(finished runs are never resumed implicitly; a run killed before its first "
                               f"checkpoint has nothing to resume); start a new run or pass resume=<run dir>")
        return found[-1]
    found = resolve_resumable(resume)
    if found is not None and found.path.parent.name != RunDir(".").checkpoints.name:
        raise TformerError(f"resume={resume}: a checkpoint outside its run directory cannot be continued (the run "
                           f"writes next to it); pass the run directory (outputs/{task}/<date>/<time>)")
    if found is None and RunDir(resume).last.existing() is not None:
        raise TformerError(f"resume={resume}: its last checkpoint holds no optimizer state (the run was trained "
                           f"with trainer.keep_optimizer_state=false), so it cannot be continued; start a new run")
    if found is None and RunDir(resume).log(task).is_file():
        raise TformerError(f"resume={resume}: that run stopped before its first checkpoint, so there is nothing to "
                           f"continue; start it again with the same overrides (without resume=)")
    made_by = next((t for t, spec in TASKS.items() if not spec.trains and RunDir(resume).log(t).is_file()), None)
    if found is None and made_by == "audit":
        raise TformerError(f"resume={resume}: that is a `tformer audit` run; continue it with tformer audit ... "
                           f"resume={resume}")
    if found is None and made_by is not None:
        raise TformerError(f"resume={resume}: that is a `tformer {made_by}` run, which trains nothing to continue; "
                           f"resume= takes the run directory of a {task} run (outputs/{task}/<date>/<time>)")
    if found is None and not Path(str(resume)).expanduser().exists():
        raise TformerError(f"resume={resume} does not exist; pass the run directory (outputs/{task}/<date>/<time>), "
                           f"or resume=true for the newest unfinished run")
    if found is None:
        raise TformerError(f"resume={resume}: no last checkpoint with training state there; pass the run directory "
                           f"(outputs/{task}/<date>/<time>)")
    if found.task() != task:
        other = found.task()
        raise TformerError(f"resume={resume}: that is a `tformer {other}` run; continue it with tformer {other} "
                           f"... resume={resume}")
    return found


def check_finished(run: RunDir, saved: dict, tree: dict, task: str) -> bool:
    """Refuses a finished run unless it is asked to train longer; returns whether it is being extended."""
    saved_epochs = get(saved, "trainer.epochs")
    extending = isinstance(saved_epochs, int) and int(get(tree, "trainer.epochs")) > saved_epochs
    if run.finished and not extending:
        what = "pretraining run" if task == "pretrain" else "run"
        raise TformerError(f"{what} {run} has already finished (its history is written), so there is nothing to "
                           f"resume and it is left as it is; start a new run, or pass trainer.epochs=<more than "
                           f"{saved_epochs}> with resume= to train it longer")
    return extending


def check_same_run(run: RunDir, saved: dict, tree: dict, training: dict, extending: bool, typed=()) -> None:
    """The same config as the run's (its place in an epoch depends on data, model and batches), and no extension of
    a run that stopped early (it would stop again at once). typed: the keys typed on the command line."""
    stopper = training.get("early_stopping", {})
    if extending and stopper.get("patience", 0) > 0 and stopper.get("bad_epochs", 0) >= stopper["patience"]:
        raise TformerError(f"run {run} stopped early ({stopper.get('monitor')} did not improve for "
                           f"{stopper['patience']} epochs); more epochs would stop again at once; start a new run")
    built = built_by_init(saved, tree, typed)
    diff = [k for k in config_diff(saved, tree) if not (extending and k == "trainer.epochs") and k not in built]
    if diff:
        shown = ", ".join(f"{k} ({get(saved, k)!r} -> {get(tree, k)!r})" for k in diff[:6])
        raise TformerError(f"cannot resume {run}: the config differs in {shown}; resume with the run's original "
                           f"overrides{_as_it_was(saved, diff)} or start a new run")


def built_by_init(saved: dict, tree: dict, typed) -> set[str]:
    """The model keys a run started from the same model.init did not choose: the pretraining run's encoder decides
    them (its shape, saved as built), whatever the preset composed now says; runs saved before they were written
    as built hold the preset's. A key typed on the command line is compared as any other."""
    init = get(saved, "model.init")
    if not init or init != get(tree, "model.init"):
        return set()
    return {f"model.{k}" for k in init_shape_keys()} - set(typed)


def config_diff(a: dict, b: dict, prefix: str = "", ignored: frozenset | None = None) -> list[str]:
    """Dotted keys whose values differ between two plain (resolved) config dicts: `a` the saved run's, `b` the
    new one. A key the saved config lacks came with a newer tformer (the run used its default): not a change,
    unless ADDED_SINCE says what the runs without it did."""
    if ignored is None:  # (the top level: a run that saved its lr as a number is compared on that number)
        ignored = frozenset(RESUME_IGNORED) | (LR_SOURCES if isinstance(get(a, "optimizer.lr"), (int, float)) else frozenset())
    keys = []
    for k in sorted(set(a) | set(b), key=str):
        dotted = f"{prefix}{k}"
        if dotted in ignored or (k not in a and dotted not in ADDED_SINCE):
            continue
        va, vb = a.get(k, ADDED_SINCE.get(dotted)), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            keys += config_diff(va, vb, dotted + ".", ignored)
        elif va != vb and not (dotted == "model.max_len" and recipe.is_auto({"max_len": vb})):
            keys.append(dotted)  # (model.max_len=auto resumes any run: it keeps the length it trained with)
    return keys


# Keys added since runs were first saved whose new default is not what the runs without them did: their absence
# means this value, so a run resumed under the new default is told which override puts it back.
ADDED_SINCE = {"data.group_column": None}

# What optimizer.lr is chosen from. Once a run's lr is a number, that number is what shapes it (and is compared), so
# a preset whose lr became `auto`, or a changed lr_short_texts, still resumes the runs made before.
LR_SOURCES = frozenset({"model.recommended_lr", "model.lr_texts", "model.lr_short_texts"})


def _as_it_was(saved: dict, keys: list[str]) -> str:
    """' (add: data.long_text=truncate ...)': the overrides that put back the run's values, which is also what a
    run from an older tformer needs when a default has changed since (where the values are plain scalars)."""
    group = []
    name = get(saved, "data.name")
    if "data.name" in keys and isinstance(name, str) and (Path(config_dir()) / "data" / f"{name}.yaml").is_file():
        # another dataset: its config group, then what the run set apart from that group's defaults
        defaults = {**group_defaults("data", "_base"), **group_defaults("data", name)}
        keys = [k for k in keys if not k.startswith("data.") or
                (k not in ("data.name", "data.dir") and get(saved, k) != defaults.get(k.split(".", 1)[1]))]
        group = [f"data={name}", *([f"data.dir={get(saved, 'data.dir')}"] if get(saved, "data.dir") else [])]
    values = [get(saved, k) for k in keys]
    if not all(v is None or isinstance(v, (str, int, float, bool)) for v in values):
        return ""
    return " (add: " + " ".join(group + [f"{k}={v if isinstance(v, str) else json.dumps(v)}"
                                         for k, v in zip(keys, values)]) + ")"


def get(d, dotted: str):
    """A dotted key of a nested dict (None where a part is missing)."""
    for part in dotted.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def check_same_data(run: RunDir, saved: dict | None, label_names: list[str], fingerprint: dict, ignore: bool,
                    console) -> None:
    """Refuse to continue a run on data that differs from what it trained on (its history would mix two datasets),
    unless resume_ignore_data_change=true; a different label set is always refused (the classifier's shape)."""
    labels_now = fingerprint["label_names"]
    if labels_now != list(label_names):
        raise TformerError(f"cannot resume {run}: " + "; ".join(fingerprint_changes(
            {"label_names": list(label_names)}, {"label_names": labels_now})) + "; resume on the run's data or "
            "start a new run")
    check_unchanged(run, saved, fingerprint, ignore, console)


def check_unchanged(run, saved, fingerprint: dict, ignore: bool, console, what: str = "data", began: str = "the run",
                    same: str = "the same data") -> None:
    """The one rule for what a run learns from (a classifier's data, pretraining's texts, distillation's unlabeled
    files): a resume on a changed fingerprint is refused unless resume_ignore_data_change=true, then said. A run
    saved before it was fingerprinted (saved is not a dict) has nothing to compare."""
    changes = fingerprint_changes(saved, fingerprint) if isinstance(saved, dict) else []
    if changes and not ignore:
        raise TformerError(f"cannot resume {run}: the {what} changed since {began} began ({'; '.join(changes)}); "
                           f"resume on {same}, start a new run, or pass resume_ignore_data_change=true to go on "
                           f"anyway")
    if changes:
        console.print(f"[yellow]warning[/]: resuming on changed {what} ({markup('; '.join(changes))})",
                      highlight=False, markup=True)


def resume_plan(resume, run_dir: RunDir, task: str) -> tuple[float | None, CheckpointDir | None]:
    """What a run's resume= asks of `run_dir`: a job of a resumed `-m` sweep as `sweep_job_plan` says, else (None,
    the checkpoint resume= names, or None without one)."""
    if resume and SweepDir(str(resume)).is_sweep():
        return sweep_job_plan(run_dir, task)
    return None, find_resumable(resume, task) if resume else None


def sweep_job_plan(run_dir: RunDir, task: str) -> tuple[float | None, CheckpointDir | None]:
    """(its best value, None) for a job of a resumed sweep that had finished (read, not retrained); (None, its
    `last`) for one interrupted after a checkpoint (resumed); (None, None) for one that never got that far
    (trained afresh in its folder)."""
    if run_dir.finished:
        best = run_dir.best.existing()
        value = None
        if best is not None:
            monitor, _ = best.early_stopping()
            value = json.loads(best.metrics.read_text()).get(monitor)
        line = (f"job {run_dir.root.name} had finished ({monitor} {value:.4f}); not retrained" if value is not None
                else f"job {run_dir.root.name} had finished; not retrained")
        output().print(markup(line), highlight=False)
        with open(run_dir.log(task), "a", encoding="utf-8") as f:
            f.write(f"===== resumed sweep: {line}\n")
        return (float(value) if value is not None else float("nan")), None
    last = run_dir.last.existing()
    if last is not None and last.has_training_state():
        return None, last
    for leftover in (run_dir.metrics_log, run_dir.metrics_csv):  # a job killed before its first checkpoint
        leftover.unlink(missing_ok=True)
    return None, None
