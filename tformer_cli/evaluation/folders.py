"""`tformer report` of the folders tformer writes that are not a training run: an audit and its folds, an evaluate
run, and one line for a checkpoint, an export or a file given instead of the run that holds it. Someone holding
any folder of outputs/ should learn from `report` what it is and where its results are, not that it is no train
run."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from ..errors import TformerError
from ..safe_text import markup
from ..store.locate import exported_from
from ..store.layout import OWN_FILE_CAP, AuditDir, CheckpointDir, ExportDir, RunDir, SweepDir
from . import artifacts
from .report import print_history, print_metrics

PER_CLASS_BYTES = 4096  # test_metrics.json grows by a per-class entry (its name and four numbers) per class
# classification_report's entries after the classes (single-label, multi-label): not class names
AGGREGATES = ("accuracy", "macro avg", "weighted avg", "micro avg", "samples avg")


def read_run_json(path: Path, kind: type, classes: int = 0):
    """A run's JSON file, its size bounded before it is read (above anything tformer writes for `classes`
    classes: layout.OWN_FILE_CAP plus PER_CLASS_BYTES a class) and its shape checked: one line naming it
    otherwise."""
    try:
        if path.stat().st_size > OWN_FILE_CAP + PER_CLASS_BYTES * classes:
            raise ValueError(f"{path.stat().st_size:,} bytes")
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TformerError(f"{path} is damaged ({str(exc).splitlines()[0][:100]}); the run's other files are "
                           f"intact, retrain or evaluate its checkpoint again to rewrite it") from None
    if not isinstance(value, kind) or (kind is list and not all(isinstance(v, dict) for v in value)):
        raise TformerError(f"{path} is damaged (not a {'list of epoch records' if kind is list else 'mapping'}); "
                           f"retrain or evaluate its checkpoint again to rewrite it")
    return value


def shown(path: Path, show, *args) -> None:
    """`show(*args)` of a file's values, a value of the wrong type or a missing key being one line naming it."""
    try:
        show(*args)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise TformerError(f"{path} is damaged ({type(exc).__name__}: {str(exc)[:80]}); retrain or evaluate its "
                           f"checkpoint again to rewrite it") from None


def refuse_other_paths(path: Path) -> None:
    """One line for what `report` cannot read, naming what to pass instead: nothing there, a file, a checkpoint
    or an export (the run that holds it)."""
    if not path.exists():
        raise TformerError(f"{path} does not exist; pass a run folder (outputs/<command>/<date>/<time>) or a sweep "
                           f"folder (outputs/multirun/<date>/<time>)")
    if not path.is_dir():
        folder = f"; its folder {path.parent} is {kind}: `tformer report {path.parent}`" \
            if (kind := what(path.parent)) else ""
        raise TformerError(f"{path} is a file; tformer report reads the folder of a run, a sweep, an audit or an "
                           f"evaluate run{folder}")
    ckpt, export = CheckpointDir(path), ExportDir(path)
    if not (ckpt.weights.is_file() or ckpt.meta.is_file() or export.is_export()):
        return
    name = "an ONNX export" if export.is_export() else f"the `{path.name.lstrip('.')}` checkpoint"
    run = RunDir(path.parent.parent)
    if what(run.root):
        raise TformerError(f"{path} is {name} of the run {run}; report the run: `tformer report {run}`")
    if export.is_export():  # (exported elsewhere with out=: export.json names the checkpoint it was made from)
        source = exported_from(export)
        owner = RunDir.of_checkpoint(CheckpointDir(source)) if source is not None else None
        if owner is not None and what(owner.root):
            raise TformerError(f"{path} is an ONNX export of the run {owner}; report the run: `tformer report "
                               f"{owner}`")
        raise TformerError(f"{path} is an ONNX export, not a run: it keeps no history to report; `tformer predict "
                           f"--runtime onnx --checkpoint {path}` reads it")
    raise TformerError(f"{path} is a model folder, not a run: it keeps no history to report; `tformer evaluate "
                       f"checkpoint={path}` measures it")


def what(folder: Path) -> str | None:
    """What kind of folder of tformer's this is, in words (None: none that report reads)."""
    run = RunDir(folder)
    if run.best.existing() is not None or run.last.existing() is not None:
        return "a run"
    if SweepDir(folder).is_sweep():
        return "a sweep"
    if AuditDir(folder).is_audit():
        return "an audit"
    if AuditDir.of_fold(folder) is not None:
        return "a fold of an audit"
    return "an evaluate run" if run.eval_metrics.is_file() else None


def report_other(folder: Path, console) -> bool:
    """An audit, a fold of one, or an evaluate run reported (True); False for any other folder."""
    run = RunDir(folder)
    trained = run.best.existing() is not None or run.last.existing() is not None  # (a run: the caller's to report)
    if AuditDir(folder).is_audit():
        report_audit(AuditDir(folder), console)
    elif AuditDir.of_fold(folder) is not None and not trained:  # (audit.keep_checkpoints=true keeps a run)
        report_fold(run, AuditDir.of_fold(folder), console)
    elif run.eval_metrics.is_file() and not trained:
        report_evaluation(run, console)
    else:
        return False
    return True


def report_audit(audit: AuditDir, console) -> None:
    """What `tformer audit` printed at its end, from its files: the label issues and copies it found."""
    plan = read_run_json(audit.plan, dict)
    rows, classes = plan.get("rows"), plan.get("classes")
    if not isinstance(rows, int) or not isinstance(classes, list):
        raise TformerError(f"{audit.plan} is damaged (no count of rows or list of classes); run the audit again")
    how = (f"{plan.get('folds')} folds (seed {plan.get('seed')})" if plan.get("mode") == "folds" else
           f"the probabilities of {markup(plan.get('checkpoint'))}")
    console.print(f"[bold]audit[/] {markup(audit.root)}: {rows:,} labelled rows of "
                  f"{markup(', '.join(map(str, plan.get('splits') or [])))}, {len(classes):,} classes, scored by {how}",
                  highlight=False)
    if not audit.issues.is_file():
        scored = sum(audit.scored(f) for f in audit.folds())
        folds = f" ({scored} of {plan.get('folds')} folds scored)" if plan.get("mode") == "folds" else ""
        console.print(f"[yellow]the audit did not finish[/]{folds}; continue it with `tformer audit <its overrides> "
                      f"resume={markup(audit.root)}`", highlight=False)
        return
    issues = sum(1 for _ in _rows(audit.issues))
    console.print(f"[bold]label issues[/] {issues:,} of {rows:,} rows ({100 * issues / max(rows, 1):.1f}%) flagged; "
                  f"most suspicious first in {markup(audit.issues)}", highlight=False)
    copies, groups = 0, {}
    for r in _rows(audit.duplicates) if audit.duplicates.is_file() else ():
        copies += 1
        groups[r.get("group")] = (r.get("across_splits") == "True", r.get("labels_differ") == "True")
    if groups:
        across, differ = (sum(g[i] for g in groups.values()) for i in (0, 1))
        console.print(f"[bold]duplicates[/] {len(groups):,} groups of copies ({copies:,} rows): {across:,} across "
                      f"splits (leakage), {differ:,} with different labels; {markup(audit.duplicates)}",
                      highlight=False)
    else:
        console.print("[bold]duplicates[/] none: no text appears twice (exact or up to case, spacing and Unicode "
                      "form)", highlight=False)


def _rows(path: Path):
    """The rows of a CSV file the audit wrote, one at a time (a text may be longer than csv's default limit)."""
    csv.field_size_limit(OWN_FILE_CAP)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            yield from csv.DictReader(f)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise TformerError(f"{path} is damaged ({str(exc)[:100]}); run the audit again to rewrite it") from None


def report_fold(fold: RunDir, audit: AuditDir, console) -> None:
    """A fold's training summary; its checkpoint is gone by design, the audit holds the results."""
    if fold.history.is_file():
        history = read_run_json(fold.history, list)
        shown(fold.history, print_history, history, console, None, f"training summary of {fold.root.name}")
    state = "scored its held-out rows" if audit.scored(fold) else "has not scored its held-out rows yet"
    console.print(f"{markup(fold.root)} is a fold of the audit {markup(audit.root)}: a model trained on the other "
                  f"folds, which {state} (its checkpoint is dropped then); the audit's results: `tformer report "
                  f"{markup(audit.root)}`", highlight=False)


def report_evaluation(run: RunDir, console) -> None:
    """What `tformer evaluate` printed, from its metrics.json, and where its report files are."""
    metrics = read_run_json(run.eval_metrics, dict)
    per_class = metrics.get("per_class")
    names = [k for k, v in per_class.items() if isinstance(v, dict) and k not in AGGREGATES] \
        if isinstance(per_class, dict) else []
    title = f"evaluation of {metrics.get('checkpoint')} on {metrics.get('data')} {metrics.get('split')}"
    shown(run.eval_metrics, print_metrics, metrics, names, title, console)
    for p in (run.eval_metrics, *artifacts.report_paths(run.root).values()):
        if p.exists():
            console.print(f"  {markup(p)}", highlight=False)
