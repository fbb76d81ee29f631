"""`tformer audit`: which labels in a labelled dataset are likely wrong, and which texts are copies of each other.

A model scores every labelled row it did not train on: the data is cut into k stratified, seeded folds and fold i
is scored by a model trained (as `tformer train` would, same model / optimizer / trainer overrides) on the other
k-1. A row whose given label gets little probability from a model that never saw it is a suspect; cleanlab's
confident learning (`cleanlab.filter.find_label_issues`) decides which suspects are flagged, from per-class
thresholds rather than one cut-off, and `cleanlab.rank.get_label_quality_scores` orders them. `checkpoint=<run>`
skips the training: one existing model scores the rows, quick but on texts it may have trained on (a model agrees
with the labels it memorised, so errors among its own training rows are under-reported).

Each fold is a training run in its own sub-folder (fold_<k>/, k from 1) of the audit's folder, like the jobs of a sweep; its
held-out probabilities are kept as a small file (fold_<k>/out_of_fold.npz) and its checkpoint dropped once they are
written, so an interrupted audit continues with `resume=<audit dir>` from the first unfinished fold.

Copies are found the way the data checks at the start of every run find them (data/sanity.py: exact text, or the
same once case, spacing and Unicode forms are folded), here per row and within every split too: duplicates.csv.
"""
from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException, OverrideParseException
from rich.table import Table
from sklearn.model_selection import StratifiedKFold

from ..classifier import Classifier
from ..console import output, progress
from ..data import arrow, sanity, sources
from ..evaluation import confident
from ..errors import ArgumentTypeError, ConfigError, TformerError, hydra_error_line, interrupted_by
from ..hydra_setup import compose_tree
from ..overrides import as_overrides, in_memory_data, override_value
from ..safe_text import markup, rich
from .. import checkpoint as ckpt
from ..store.atomic import write_json, write_with
from ..typed_config import given_twice, typed_keys
from ..store.layout import AuditDir, RunDir, resolve_checkpoint, resolve_resumable
from ..store.locate import locate
from ..store.ownership import is_ours, new_run_dir
from ..sweeps.job_output import QuietJob
from ..training.loop import Interrupted
from ..typed_config import build
from ..yesno import bool_or_path
from .classify import configure
from .config import data_config
from .in_process import train_overrides
from .resume import config_diff, get
from .session import log_header

# the audit folder's files, named in store/layout.py (AuditDir): what it is of (a resume must match it), the issues
# (written last: an audit holding them is finished), copies found, each fold's held-out probabilities (no pickle)
PLAN, ISSUES, DUPLICATES, OUT_OF_FOLD = AuditDir.PLAN, AuditDir.ISSUES, AuditDir.DUPLICATES, AuditDir.OUT_OF_FOLD
FILTERS = ("prune_by_noise_rate", "prune_by_class", "both", "confident_learning", "predicted_neq_given",
           "low_normalized_margin", "low_self_confidence")
SCORES = ("self_confidence", "normalized_margin", "confidence_weighted_entropy")
SHOWN_CHARS = 200  # of a text in the table (the CSV has it whole)
INSTALL = "tformer audit needs cleanlab: pip install 'tformer[audit]' (or pip install 'cleanlab>=2.9')"


@dataclass
class AuditOptions:
    folds: int
    splits: list[str]
    top: int
    filter_by: str
    score: str
    keep_checkpoints: bool
    batch_size: int

    RANGES = {"folds": (2, None, "[)"), "top": (0, None, "[)"), "batch_size": (1, 1 << 20, "[]")}


@dataclass
class AuditResult:
    run_dir: Path
    issues: pd.DataFrame  # label_issues.csv: the flagged rows, most suspicious first
    scores: pd.DataFrame  # every audited row: split, row, text, label, suggested, score, fold, flagged
    duplicates: pd.DataFrame  # duplicates.csv: one row per text in a group of copies
    mode: str  # "folds" (out-of-fold probabilities) or "checkpoint" (one model, on texts it may have seen)
    files: dict = field(default_factory=dict)  # name -> path (label_issues, duplicates, audit plan)


def _cleanlab():
    """cleanlab, the optional audit extra: imported here so that its absence is the one-line INSTALL message."""
    try:
        import cleanlab.filter
        import cleanlab.rank
    except ImportError:
        raise TformerError(INSTALL) from None
    return cleanlab


def options_of(tree: dict) -> AuditOptions:
    options = build(AuditOptions, tree.get("audit") or {}, "audit")
    if options.filter_by not in FILTERS:
        raise ConfigError(f"audit.filter_by={options.filter_by} is not one of {', '.join(FILTERS)}")
    if options.score not in SCORES:
        raise ConfigError(f"audit.score={options.score} is not one of {', '.join(SCORES)}")
    wrong = [s for s in options.splits if s not in ("train", "validation", "test")]
    if wrong or not options.splits:
        raise ConfigError(f"audit.splits={options.splits} must list train, validation and/or test")
    if len(set(options.splits)) < len(options.splits):  # (a row audited twice: its copy could train its fold)
        raise ConfigError(f"audit.splits={options.splits} names a split twice; list each once")
    return options


def run_audit(tree: dict, overrides: list[str], run_dir: RunDir) -> AuditResult:
    """The audit of the composed `configs/audit.yaml` tree into `run_dir` (or, with resume=, into the audit it
    names; `run_dir` is then discarded if empty). Shared by the Hydra command and the Python API."""
    cleanlab = _cleanlab()  # before anything is trained: a missing extra is one line, not a lost hour
    options = options_of(tree)
    checkpoint = tree.get("checkpoint")
    if checkpoint:
        _refuse_fold_keys(overrides)
    resume = bool_or_path(tree.get("resume"), "resume")
    train_tree = {k: v for k, v in tree.items() if k not in ("audit", "checkpoint")}
    train_tree["resume"] = None
    config, train_tree = configure(train_tree, overrides)  # every train key checked now, not after a fold's data load
    if resume not in (None, False):
        target = _resumed_audit(resume)
        if target.resolve() != run_dir.root.resolve():
            run_dir.discard_if_empty()
        run_dir = RunDir(target)
    console = output()
    console.open_log(run_dir.log("audit"), log_header("audit", overrides, tree, resumed=resume not in (None, False)))
    mode = "checkpoint" if checkpoint else "folds"
    if mode == "checkpoint":
        loaded_path, data_cfg, seed = _checkpoint_data(str(checkpoint), config, overrides)
    else:
        loaded_path, data_cfg, seed = None, config.data, config.seed
    if data_cfg.multi_label:
        raise TformerError("tformer audit finds errors in single labels; data.multi_label=true is not supported")
    data = sources.load(data_cfg, seed=seed, keep_groups=mode == "folds")  # (folds keep data.group_column's groups)
    sanity.check(data, run_dir.data_report)  # copies between splits (leakage), as every run checks
    rows = _audited_rows(data, options.splits)
    names = list(data.label_names)
    plan = _plan(mode, options, seed, rows, names, loaded_path, train_tree, data_cfg)
    fresh = not (run_dir.root / PLAN).is_file()
    _check_plan(run_dir.root / PLAN, plan, resume not in (None, False))
    try:
        console.print(f"[bold]audit[/] {len(rows):,} labelled rows of {markup(data_cfg.name)} "
                      f"({', '.join(f'{s} {n:,}' for s, n in rows['split'].value_counts(sort=False).items())}), "
                      f"{len(names)} classes; run dir {markup(run_dir.root)}", highlight=False)
        if mode == "folds":
            probs, folds = _out_of_fold(rows, names, options, config, overrides, run_dir)
        else:
            probs, folds = _checkpoint_probs(loaded_path, rows, names, options, config), None
        labels = rows["label"].to_numpy()
        rule = options.filter_by
        if len(names) > confident.CLEANLAB_CLASSES:  # cleanlab's K x K matrices: gigabytes at 10,000 classes
            rule = "confident learning's rule, row by row"
            console.print(f"[bold]label issues[/] of {len(names):,} classes by confident learning's rule, row by "
                          f"row (audit.filter_by={markup(options.filter_by)} applies up to "
                          f"{confident.CLEANLAB_CLASSES:,} classes: cleanlab builds {len(names):,} x {len(names):,} "
                          f"matrices)", highlight=False)
            flagged = confident.confident_learning_issues(labels, probs)
        else:
            flagged = cleanlab.filter.find_label_issues(labels, probs, filter_by=options.filter_by, n_jobs=1)
        quality = cleanlab.rank.get_label_quality_scores(labels, probs, method=options.score)
        scores = pd.DataFrame({
            "split": rows["split"], "row": rows["row"], "text": rows["text"],
            "given_label": [names[i] for i in labels], "suggested_label": [names[i] for i in probs.argmax(1)],
            "score": quality,  # (not rounded: at thousands of classes the lowest scores differ past 6 decimals)
            "given_probability": probs[np.arange(len(labels)), labels],
            "fold": folds if folds is not None else pd.array([pd.NA] * len(rows), dtype="Int64"),
            "flagged": flagged})
        order = np.lexsort((scores["row"].to_numpy(), quality))  # lowest quality first; ties in row order
        scores = scores.iloc[order].reset_index(drop=True)
        issues = scores[scores["flagged"]].drop(columns="flagged").reset_index(drop=True)
        dups = duplicates(data)
        write_with(run_dir.root / DUPLICATES, lambda tmp: dups.to_csv(tmp, index=False))
        write_with(run_dir.root / ISSUES, lambda tmp: issues.to_csv(tmp, index=False))
        console.open_log(run_dir.log("audit"))  # (a fold's training had the log)
        _report(issues, len(rows), dups, options, mode, loaded_path, run_dir, rule)
        return AuditResult(run_dir.root, issues, scores, dups, mode,
                           {"label_issues": run_dir.root / ISSUES, "duplicates": run_dir.root / DUPLICATES,
                            "plan": run_dir.root / PLAN})
    except TformerError as exc:  # refused before any fold's answers: the plan goes, and the folder with it
        stopped = isinstance(exc, Interrupted) or interrupted_by(exc)
        if fresh and not stopped and not any(run_dir.root.glob(f"fold_*/{OUT_OF_FOLD}")):
            (run_dir.root / PLAN).unlink(missing_ok=True)
        raise


def _resumed_audit(resume) -> Path:
    """The audit folder resume= names (true: the newest under outputs/audit)."""
    if resume is True:
        plans = Path("outputs/audit").glob(f"*/*/{PLAN}")  # (unfinished ones: a finished audit has its issues)
        found = sorted((p.parent for p in plans if not (p.parent / ISSUES).is_file()), key=lambda p: p.stat().st_mtime)
        if not found:
            raise TformerError("resume=true: no unfinished audit under outputs/audit to continue; pass "
                               "resume=<audit dir>")
        return found[-1]
    path = Path(str(resume)).expanduser()
    if not (path / PLAN).is_file():
        raise TformerError(f"resume={resume} is not an audit folder (it has no {PLAN}); pass the folder an earlier "
                           f"`tformer audit` printed")
    return path


FOLD_KEYS = ("audit.folds", "audit.keep_checkpoints")  # what only a fold model reads, with these groups
FOLD_GROUPS = ("model", "optimizer", "schedule", "embedding_init", "loss", "trainer")
SCORING_KEYS = ("trainer.device",)  # (what checkpoint mode reads of these groups: where the model runs)


def _plan(mode: str, options: AuditOptions, seed: int, rows: pd.DataFrame, names: list[str], loaded_path,
          train_tree: dict, data_cfg) -> dict:
    """What an audit's answers depend on (audit_plan.json, checked on resume by `_check_plan`)."""
    folds = mode == "folds"
    return {"mode": mode, "folds": options.folds if folds else None, "seed": seed,
            "splits": options.splits, "rows": len(rows), "classes": names, "data": _fingerprint(rows),
            "checkpoint": str(loaded_path) if loaded_path else None,
            # what shapes each fold's model (checked key by key on resume, as train's resume checks its config)
            "training": {k: v for k, v in train_tree.items() if k not in PLAN_UNTRAINED} if folds else None,
            "reading": fold_reading(data_cfg) if folds else None,
            "group_column": data_cfg.group_column if folds else None}


def _refuse_fold_keys(overrides) -> None:
    """checkpoint= scores the rows with that checkpoint's model and trains none: a typed key that only a fold
    model's training reads would be ignored without a word."""
    unused = [k for k in typed_keys(overrides) if k not in SCORING_KEYS and (
        k in FOLD_KEYS or k.split(".", 1)[0] in FOLD_GROUPS)]
    if unused:
        raise ConfigError(f"{unused[0]}= is for the fold models, which checkpoint= does not train (it scores the rows "
                          f"with that checkpoint's model); drop {unused[0]}=, or drop checkpoint= to audit by folds")


def _checkpoint_data(checkpoint: str, config, overrides):
    """(checkpoint dir, data config, seed) of checkpoint mode: the run's own data and seed (so its train and
    validation rows are the rows it had); data.<key>=value replaces a key, seed= the seed. data=<the run's own
    dataset> (or data=files) keeps how the run split its rows (sources.SPLIT_KEYS), as evaluate does; data=<another
    dataset> is that dataset as its YAML says."""
    found = locate(checkpoint)  # (refused before the data is read: no folder left behind for a wrong path)
    saved = ckpt.read_config(found) if found.config.is_file() else None
    typed = set(typed_keys(overrides))
    if saved is None or not saved.get("data"):
        return found.path, config.data, config.seed
    seed = config.seed if "seed" in typed else int(saved.get("seed", config.seed))
    if "data" in typed:
        if saved["data"].get("name") != config.data.name:
            return found.path, config.data, config.seed
        own = data_config(saved["data"])
        kept = {k: getattr(own, k) for k in sources.SPLIT_KEYS if f"data.{k}" not in typed}
        return found.path, replace(config.data, **kept), seed
    keys = {k.split(".", 1)[1] for k in typed if k.startswith("data.")}
    return found.path, data_config(saved["data"], **{k: getattr(config.data, k) for k in keys}), seed


def _audited_rows(data, splits: list[str]) -> pd.DataFrame:
    missing = [s for s in splits if s not in data.splits]
    if missing:
        raise ConfigError(f"audit.splits: the data has no {missing[0]} split; it has {', '.join(data.splits)}")
    parts = []
    for split in splits:
        ds = data.splits[split]
        parts.append(pd.DataFrame({"split": split, "row": np.arange(len(ds)), "text": ds["text"][:],
                                   "label": np.asarray(ds["label"][:], dtype=np.int64)}))
    rows = pd.concat(parts, ignore_index=True)
    grouped = [s for s in splits if "group" in data.splits[s].column_names]
    if grouped:  # (a split read from its own file has no groups: each of its rows is one)
        rows["group"] = sources.group_codes(pa.concat_arrays([
            arrow.column(data.splits[s], "group").cast(pa.large_string()).combine_chunks() if s in grouped else
            pa.nulls(len(data.splits[s]), pa.large_string()) for s in splits]))
    return rows


def _fingerprint(rows: pd.DataFrame) -> str:
    digest = hashlib.sha256()
    for split, text, label in zip(rows["split"], rows["text"], rows["label"]):
        digest.update(f"{split}\0{label}\0{len(text)}\0".encode())
        digest.update(text.encode("utf-8", "surrogatepass"))
    if "group" in rows:  # (which rows share a group decides the folds)
        digest.update(b"groups\0" + rows["group"].to_numpy(dtype=np.int64).tobytes())
    return digest.hexdigest()


def _check_plan(path: Path, plan: dict, resuming: bool) -> None:
    """An audit resumed with anything that shapes its scores changed (the data, the folds, the model, optimizer
    or trainer settings of the fold models, the groups that keep rows in one fold) is refused: its rows would be
    ranked by models of different quality. A key an older plan lacks was not recorded: not a change."""
    if path.is_file():
        before = json.loads(path.read_text(encoding="utf-8"))
        changed = [k for k in plan if k in before and before[k] != plan[k]]
        if changed:
            if "group_column" in changed:  # (which also changes the data's fingerprint)
                what = (f"data.group_column differs ({before['group_column']!r} -> {plan['group_column']!r}); "
                        f"resume with data.group_column={override_value('group_column', before['group_column'])}, "
                        f"or start a new audit (drop resume=)")
                raise TformerError(f"resume={path.parent}: {what}")
            if {"splits", "seed", "reading"} & set(changed):  # (which rows are audited: their count and fingerprint
                changed = [k for k in changed if k not in ("rows", "data")]  # follow; the key typed is named)
            if "data" in changed or "rows" in changed:  # (the rows audited: their splits, texts and labels)
                was, now = before.get("rows"), plan.get("rows")
                what = (f"the data differs ({was:,} -> {now:,} rows audited)" if "rows" in changed and
                        isinstance(was, int) and isinstance(now, int) else
                        "the data differs (as many rows, other texts, labels or splits: a file changed since?)")
            elif changed == ["training"] and isinstance(before["training"], dict) and plan["training"]:
                keys = config_diff(before["training"], plan["training"])
                if not keys:
                    return
                what = "the fold models' settings differ in " + ", ".join(
                    f"{k} ({get(before['training'], k)!r} -> {get(plan['training'], k)!r})" for k in keys[:4])
            else:  # (a sub-tree by its keys that differ, a list by name; a value with both sides)
                named = [_changes(k, before[k], plan[k]) for k in changed]
                what = ", ".join(named) + (" differ" if len(changed) > 1 or "), " in named[0] else " differs")
            # a plan without the key was written by a tformer that kept no groups (or by one that did but did not
            # record it: then its data fingerprint, which holds the groups, matched and nothing was refused)
            older = "data" in changed and "group_column" not in before and plan.get("group_column") is not None
            hint = " (an audit begun by an older tformer kept no groups: add data.group_column=null)" if older else ""
            raise TformerError(f"resume={path.parent}: {what} from the audit being resumed; resume with the same "
                               f"overrides{hint}, or start a new audit (drop resume=)")
        return
    if resuming:
        raise TformerError(f"{path.parent} has no {PLAN}; start a new audit (drop resume=)")
    write_json(path, plan)


def _changes(key: str, was, now) -> str:
    """'reading.validation_fraction (0.2 -> 0.3)' of a plan key that differs ('key' alone for a list, or a
    sub-tree whose differences are not of keys)."""
    if isinstance(was, dict) and isinstance(now, dict) and (keys := config_diff(was, now)):
        named = {"reading": "data.", "training": ""}.get(key, f"{key}.")  # (as typed: data.<key>, optimizer.lr)
        return ", ".join(f"{named}{k} ({get(was, k)!r} -> {get(now, k)!r})" for k in keys[:4])
    return key if isinstance(now, (dict, list)) or isinstance(was, (dict, list)) else f"{key} ({was!r} -> {now!r})"


# Top-level keys of the composed config that do not shape a fold model (where it is written, how it is resumed,
# which tracker watches it); the data is checked by its own fingerprint.
PLAN_UNTRAINED = ("data", "resume", "resume_ignore_data_change", "hydra", "checkpoint", "audit", "logger")


def fold_reading(data_cfg) -> dict:
    """The data keys a fold model is trained with besides its rows: how texts are read and its validation split."""
    return {k: getattr(data_cfg, k) for k in ("truncation", "long_text", "head_tokens", "chunk_overlap",
                                              "validation_fraction")}


def fold_overrides(overrides: list[str], data_cfg, names: list[str]) -> list[str]:
    """The train overrides of a fold: the user's model / optimizer / trainer / ... overrides, the data replaced by
    the fold's file (data=files) with the keys that decide how texts are read kept, and no test pass."""
    dropped = ("checkpoint", "resume", "audit", "data", "hydra")
    kept = [o for o in overrides
            if o.lstrip("+~").split("=", 1)[0].split(".", 1)[0].split("/", 1)[0] not in dropped]
    reading = {"label_names": names, **fold_reading(data_cfg)}
    return [*kept, *[f"data.{k}={override_value(k, v, text=True)}" for k, v in reading.items() if v is not None],
            "trainer.test_after_fit=false"]


def assign_folds(labels: np.ndarray, k: int, seed: int, names=None, groups: np.ndarray | None = None) -> np.ndarray:
    """Each row's fold, stratified by class and seeded; every class needs k rows (one in each fold). With groups
    (data.group_column, as codes 0..G-1) a group's rows share a fold, the one its place falls in
    (sources.group_places: each class's groups spread around the folds), so that a fold model never scores a reply
    to a thread it trained on; a class all of whose rows would share one fold is refused (that fold's model would
    never see it)."""
    if groups is not None:
        place, _ = sources.group_places(groups, labels, seed)
        fold_of = np.minimum((k * place).astype(np.int64), k - 1)[groups]
        if (np.bincount(fold_of, minlength=k) == 0).any():
            raise TformerError(f"audit.folds={k}: the rows fall in {int(groups.max()) + 1:,} groups "
                               f"(data.group_column), too few to fill {k} folds; lower audit.folds")
        classes = int(labels.max()) + 1
        spread = np.bincount(labels * k + fold_of, minlength=classes * k).reshape(classes, k)
        alone = np.flatnonzero((spread.sum(axis=1) > 0) & (spread.max(axis=1) == spread.sum(axis=1)))
        if len(alone) and k > 1:
            c = int(alone[0])
            which = f"class {names[c]!r}" if names is not None else f"class id {c}"
            shared = len(np.unique(groups[labels == c]))
            raise TformerError(f"audit.folds={k}: every row of {which} ({int(spread[c].sum()):,}, in {shared:,} "
                               f"group{'s' if shared != 1 else ''} of data.group_column) falls in one fold, whose "
                               f"model would never see the class; add its rows from more groups, or audit with "
                               f"data.group_column=null")
        return fold_of
    counts = np.bincount(labels)
    short = [int(c) for c in np.flatnonzero((counts > 0) & (counts < k))]
    if short:
        which = f"class {names[short[0]]!r}" if names is not None else f"class id {short[0]}"
        raise TformerError(f"audit.folds={k}: {which} has {counts[short[0]]} row(s), fewer than the folds; lower "
                           f"audit.folds or add rows of that class")
    fold_of = np.empty(len(labels), dtype=np.int64)
    for i, (_, held) in enumerate(StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
                                  .split(np.zeros(len(labels)), labels)):
        fold_of[held] = i
    return fold_of


def check_fold_splits(labels: np.ndarray, fold_of: np.ndarray, names: list[str], fraction: float) -> None:
    """Every fold model must be able to carve its stratified validation split from the rows outside its fold (as
    sources._carve does): at least 2 rows of each class there, and a validation part and a rest with every class.
    Checked for all folds before the first trains, so an audit is never refused after hours of fold 1."""
    k_classes = len(names)
    for i in range(int(fold_of.max()) + 1):
        rest = labels[fold_of != i]
        counts = np.bincount(rest, minlength=k_classes)
        short = np.flatnonzero((counts > 0) & (counts < 2))
        if len(short):
            c = int(short[0])
            total = int((labels == c).sum())
            raise TformerError(f"audit: class {names[c]!r} has {total} row(s); a fold model trains on the rows outside "
                               f"its fold and carves its validation split from them, which needs 2 rows of each class "
                               f"there (fold {i + 1} leaves {counts[c]}); add rows of that class or lower audit.folds")
        if sources.too_few_to_carve(len(rest), fraction, k_classes):
            raise TformerError(f"audit: fold {i + 1}'s model would train on {len(rest):,} rows, too few to carve a "
                               f"validation split of data.validation_fraction={fraction} with all {k_classes} classes "
                               f"on both sides; add rows, lower audit.folds or change the fraction")


def check_grouped_fold_splits(labels: np.ndarray, groups: np.ndarray, fold_of: np.ndarray, fraction: float,
                              seed: int) -> None:
    """Every fold model must be able to carve its validation split by groups from the rows outside its fold, as its
    data loading will (the same codes, labels and seed): checked for all folds before the first trains."""
    for i in range(int(fold_of.max()) + 1):
        rest = fold_of != i
        codes = sources.group_codes(pa.chunked_array([pa.array(groups[rest])]))
        if not sources.carved_rows(codes, labels[rest], fraction, seed).any():
            raise TformerError(f"audit: fold {i + 1}'s model would train on {int(rest.sum()):,} rows in "
                               f"{int(codes.max()) + 1:,} groups (data.group_column), none of which its validation "
                               f"split can take without leaving a class no train rows; add rows from more groups or "
                               f"lower audit.folds")


def _out_of_fold(rows, names, options, config, overrides, run_dir: RunDir):
    """(rows, classes) probabilities, each row's from the fold model that did not train on it, and each row's fold."""
    console = output()
    labels = rows["label"].to_numpy()
    k = options.folds
    groups = rows["group"].to_numpy() if "group" in rows else None
    fold_of = assign_folds(labels, k, config.seed, names, groups)
    if groups is None:
        check_fold_splits(labels, fold_of, names, config.data.validation_fraction)
    else:  # (a grouped fold carves its validation split by group: no class need be on both sides)
        check_grouped_fold_splits(labels, groups, fold_of, config.data.validation_fraction, config.seed)
    probs = np.full((len(rows), len(names)), np.nan, dtype=np.float32)
    base = fold_overrides(overrides, config.data, names) + (["data.group_column=group"] if groups is not None else [])
    first = 0 if (run_dir.root / "fold_0").is_dir() else 1  # (an audit begun by an older tformer counted from 0)
    hint = shlex.join(["tformer", "audit", *[o for o in overrides if not o.startswith("resume=")],
                       f"resume={override_value('resume', str(run_dir.root))}"])  # (quoted for Hydra, then the shell)
    i = 0
    try:
        for i in range(k):
            held = np.flatnonzero(fold_of == i)
            fold = RunDir(run_dir.root / f"fold_{i + first}")
            done = fold.root / OUT_OF_FOLD
            started, seen = time.monotonic(), None
            if done.is_file():
                with np.load(done, allow_pickle=False) as saved:
                    if not np.array_equal(saved["rows"], held):
                        raise TformerError(f"{done} scored other rows than fold {i} holds now; start a new audit")
                    probs[held] = saved["probs"]
                console.print(f"fold {i + 1}/{k}: done earlier ({len(held):,} rows scored)", highlight=False)
                continue
            data_file = run_dir.root / "data" / f"fold_{i + first}_train.parquet"
            if not data_file.is_file():
                train_rows = rows.iloc[np.flatnonzero(fold_of != i)][[c for c in FOLD_COLUMNS if c in rows]]
                data_file.parent.mkdir(parents=True, exist_ok=True)
                write_with(data_file, lambda tmp: train_rows.to_parquet(tmp, index=False))
            args = [*base, "data=files", f"data.train_file={override_value('data', str(data_file.resolve()))}"]
            best = fold.best.existing() if fold.finished else None
            if best is None:
                if resolve_resumable(fold.root) is not None:
                    args.append(f"resume={override_value('resume', str(fold.root.resolve()))}")
                elif fold.root.exists() and is_ours(fold.root, "run"):  # stopped before its first checkpoint
                    shutil.rmtree(fold.root)
                console.print(f"fold {i + 1}/{k}: training on {len(rows) - len(held):,} rows ...", highlight=False)
                # the screen shows the fold's progress and epoch lines, as a sweep's job does (a fold of a million
                # rows would be silent for its whole training otherwise); its train.log has everything
                with _composable(), console.filtered(QuietJob()) as seen:
                    best = resolve_checkpoint(train_overrides(args, fold.root).run_dir)
            clf = Classifier.load(best.path, device=config.trainer.device)
            fold_probs = scored(clf, rows["text"].iloc[held].tolist(), options.batch_size)
            write_with(done, lambda tmp: _save_arrays(tmp, rows=held, probs=fold_probs))
            probs[held] = fold_probs
            if not options.keep_checkpoints:
                shutil.rmtree(fold.checkpoints, ignore_errors=True)
            data_file.unlink(missing_ok=True)
            console.open_log(run_dir.log("audit"))  # the fold's training had the log; the audit's continues
            accuracy = float((fold_probs.argmax(1) == labels[held]).mean())
            hidden = f"; {seen.warned(str(fold.log('train')))}" if seen is not None and seen.warnings else ""
            console.print(f"fold {i + 1}/{k}: {len(held):,} held-out rows scored, agreement with their labels "
                          f"{accuracy:.3f} ({time.monotonic() - started:.0f} s){hidden}", highlight=False)
    except (Exception, KeyboardInterrupt) as exc:  # Ctrl-C (also one that Hydra, composing the next fold's
        if not isinstance(exc, Interrupted) and not interrupted_by(exc):  # config, turned into an error of its
            raise  # own): finished folds are whole (atomic writes), so the audit continues there
        raise Interrupted(f"audit stopped in fold {i + 1}/{k} (finished folds are kept); continue with: {hint}") \
            from None
    shutil.rmtree(run_dir.root / "data", ignore_errors=True)
    return probs, fold_of + 1  # (numbered as the progress lines and the folders number them: from 1)


FOLD_COLUMNS = ("text", "label", "group")  # a fold model's train file (group: data.group_column=group)


def _save_arrays(path: Path, **arrays) -> None:
    with open(path, "wb") as f:  # (np.savez on a path would add .npz to the temporary name)
        np.savez(f, **arrays)


@contextmanager
def _composable():
    """Hydra's compose API (what runs/in_process.py composes a fold's config with) inside the running `tformer
    audit` job: Hydra allows one initialised instance, so the job's is set aside while a fold composes, then put
    back."""
    held = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    try:
        yield
    finally:
        GlobalHydra.instance().clear()
        if held is not None:
            GlobalHydra.instance().initialize(held)


def _checkpoint_probs(path, rows, names, options, config):
    clf = Classifier.load(path, device=config.trainer.device)
    if list(clf.labels) != list(names):
        raise TformerError(f"the data's labels {names[:5]} differ from the checkpoint's {clf.labels[:5]}; audit "
                           f"the dataset the model was trained on, or use audit.folds=k without checkpoint=")
    output().print(f"[yellow]note:[/] probabilities of {markup(path)} on rows it may have trained on: a model agrees "
                   f"with labels it memorised, so errors among its training rows are under-reported; for an honest "
                   f"audit drop checkpoint= (k-fold, out-of-fold probabilities)", highlight=False)
    return scored(clf, rows["text"].tolist(), options.batch_size)


SCORE_CHUNK = 2048  # texts per predict_proba call: a chunk's windows and probabilities at a time in memory


def scored(clf, texts: list[str], batch_size: int) -> np.ndarray:
    """(len(texts), C) float32 probabilities, a chunk of texts at a time under a progress bar."""
    out = np.empty((len(texts), len(clf.labels)), dtype=np.float32)
    with progress(total=len(texts), desc="scoring", unit="text") as bar:
        for start in range(0, len(texts), SCORE_CHUNK):
            out[start:start + SCORE_CHUNK] = clf.predict_proba(texts[start:start + SCORE_CHUNK], batch_size=batch_size)
            bar.update(len(texts[start:start + SCORE_CHUNK]))
    return out


def duplicates(data) -> pd.DataFrame:
    """Every text that has a copy (exact, or the same up to case, spacing and Unicode form: data/sanity.py's
    rule), within a split or across splits, one row each, grouped. Groups that cross splits (a test text that is
    also a train text: leakage) and groups whose copies carry different labels (one of them is wrong) come first."""
    groups = defaultdict(list)
    names = list(data.label_names)
    for split, ds in data.splits.items():
        for row, (text, label) in enumerate(zip(ds["text"][:], ds["label"][:])):
            groups[hash(sanity.normalized_text(text))].append((split, row, text, names[label]))
    found = [g for g in groups.values() if len(g) > 1]
    found.sort(key=lambda g: (-len({m[0] for m in g}), -len({m[3] for m in g}), -len(g), g[0][0], g[0][1]))
    out = [{"group": n, "kind": "exact" if len({m[2] for m in g}) == 1 else "near",
            "across_splits": len({m[0] for m in g}) > 1, "labels_differ": len({m[3] for m in g}) > 1,
            "split": split, "row": row, "label": label, "text": text}
           for n, g in enumerate(found) for split, row, text, label in g]
    columns = ["group", "kind", "across_splits", "labels_differ", "split", "row", "label", "text"]
    return pd.DataFrame(out, columns=columns)


def _report(issues, n_rows, dups, options, mode, checkpoint, run_dir: RunDir, rule: str) -> None:
    console = output()
    share = 100 * len(issues) / max(n_rows, 1)
    source = "out-of-fold probabilities" if mode == "folds" else f"probabilities of {checkpoint}"
    by = f"cleanlab ({markup(rule)}, " if rule in FILTERS else f"{markup(rule)} ("  # (above CLEANLAB_CLASSES: ours)
    if len(issues) and options.top:
        shown = issues.head(options.top)
        table = Table(title=rich(f"suspected label errors ({len(shown)} of {len(issues):,}, most suspicious first)"),
                      header_style="bold")
        table.add_column("#", justify="right")
        table.add_column("split:row")
        table.add_column("text", overflow="fold", max_width=70)
        table.add_column("given")
        table.add_column("suggested")
        table.add_column("score", justify="right")
        if mode == "folds":
            table.add_column("fold", justify="right")
        for n, r in enumerate(shown.itertuples(index=False), 1):
            text = r.text if len(r.text) <= SHOWN_CHARS else r.text[:SHOWN_CHARS - 3] + "..."
            cells = [str(n), f"{r.split}:{r.row}", rich(text), rich(r.given_label), rich(r.suggested_label),
                     f"{r.score:.3f}"]
            table.add_row(*cells, *([str(int(r.fold))] if mode == "folds" else []))
        console.print(table)
    console.print(f"[bold]label issues[/] {len(issues):,} of {n_rows:,} rows ({share:.1f}%) flagged by "
                  f"{by}from {markup(source)}); all in {markup(run_dir.root / ISSUES)}",
                  highlight=False)
    if len(dups):
        g = dups.groupby("group").agg(across=("across_splits", "first"), differ=("labels_differ", "first"))
        console.print(f"[bold]duplicates[/] {len(g):,} groups of copies ({len(dups):,} rows): "
                      f"{int(g['across'].sum()):,} across splits (leakage), {int(g['differ'].sum()):,} with different "
                      f"labels; {markup(run_dir.root / DUPLICATES)}", highlight=False)
    else:
        console.print("[bold]duplicates[/] none: no text appears twice (exact or up to case, spacing and Unicode "
                      "form)", highlight=False)


def audit(overrides=(), *, run_dir: str | Path | None = None, data=None, quiet: bool = True) -> AuditResult:
    """`tformer audit` from Python: the same overrides (a list of key=value strings or a dict); data= a DataFrame
    (text, label columns), a dict of columns or a (texts, labels) pair to audit instead of a configured dataset."""
    overrides = as_overrides(overrides, "audit")
    given_twice(overrides, "audit")
    if not isinstance(quiet, bool):
        raise ArgumentTypeError(f"quiet={quiet!r:.80} must be True or False")
    overrides += in_memory_data(overrides, {"train": data, "validation": None, "test": None}, "audit")
    _cleanlab()
    try:  # (a typo in a key, a missing config: the CLI's one line, not Hydra's traceback)
        tree = compose_tree("audit", overrides)
    except (ConfigCompositionException, OverrideParseException) as exc:
        raise ConfigError(f"audit(): {hydra_error_line('audit', exc)}") from None
    if run_dir is None:
        stamp = time.strftime("%Y-%m-%d/%H-%M-%S") + f"-{time.time_ns() // 1000 % 1_000_000:06d}"
        run_dir = Path("outputs") / "audit" / stamp
    start = RunDir(Path(run_dir).resolve())
    new_run_dir(start.root, "audit", bool_or_path(tree.get("resume"), "resume"), key="run_dir")
    screen = output().screen
    was_quiet, screen.quiet = screen.quiet, screen.quiet or quiet
    try:
        return run_audit(tree, overrides, start)
    except BaseException:
        output().close_log()
        start.discard_if_empty()
        raise
    finally:
        screen.quiet = was_quiet
