"""`tformer calibrate`'s work: a checkpoint's temperature and label-set cuts fitted again on labelled texts it never
trained on, written as a new checkpoint; the model's weights, and so its answers, stay exactly what they were.

Why: both are fitted after training on the validation split, and they hold only for texts drawn like it. Texts
that drift (later posts, another source, a new product) make a model less accurate than its validation split
said; its probabilities are then too sure and its label sets cover less than their level. A few hundred labelled
texts like the ones it serves put both right without training again. The original checkpoint is never changed:
the new one (the run's checkpoints/best, with the original's weights hard-linked where the file system allows)
is what predict, evaluate, export, serve and push read with checkpoint=<the run dir>.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from .. import checkpoint
from ..data import arrow, sanity, tokenization
from ..errors import TformerError
from ..evaluation import calibration, conformal
from ..safe_text import markup
from ..store.atomic import sha256_file, write_json
from ..store.layout import RunDir
from ..store.locate import locate
from ..evaluation.evaluate import every_text_cuts, uniforms
from .classify import sampled_logits
from .config import CalibrateConfig
from .scoring import checked_data, reading, tokenized

MIN_TEXTS = 50  # fewer are refused: one temperature and 50 cuts fitted on a handful of texts are noise


def refit(config: CalibrateConfig, run_dir: RunDir, console, device, precision) -> float:
    """The refit into run_dir (checkpoints/best, metrics.json, data_report.json); returns the ECE after it."""
    loaded = checkpoint.load(locate(config.checkpoint or None, config.outputs_dir), device)
    saved = loaded.saved_config()
    data_cfg = config.data_config((saved or {}).get("data"), f"{loaded.path} ({loaded.files.config.name})")
    if config.max_samples is None and "max_eval_samples" not in config.data_typed:
        data_cfg.max_eval_samples = None  # every text given is fitted on, not the run's evaluation cap
    read = getattr(data_cfg, f"{config.split}_file", None)  # a file given for this split is what is fitted on
    what = Path(read).name if read else f"{data_cfg.name} {config.split}"
    if config.file and read and Path(read).is_dir():
        raise TformerError(f"file={config.file}: {read} is a folder; give the labelled file to calibrate on")
    if config.file and read and not Path(read).is_file():  # (split= files are found as training found them)
        raise TformerError(f"file={config.file or read}: no such file ({read}); give the labelled texts to "
                           f"calibrate on")
    console.print(f"[bold]checkpoint[/] {markup(loaded.path)}  [bold]texts[/] {markup(what)}  [bold]device[/] "
                  f"{device} ({precision.name})", highlight=False)
    max_len = int(loaded.model_config["max_len"])
    long_text, side = reading(tokenization.LongText.from_meta(loaded.meta), config, max_len, data_cfg.truncation)
    seed = int((saved or {}).get("seed", 0))
    data = checked_data(config, loaded, data_cfg, seed, "calibrate on texts labelled with the model's own labels")
    checked = sanity.check(data, None, evaluated=config.split)  # (saved with the new checkpoint: a refusal leaves
    _refuse_training_texts(checked, config.split, what)         # no folder behind)
    tok, split = tokenized(loaded, data.splits[config.split], config.split, max_len, long_text, side)
    multi = bool(loaded.model.cfg.multi_label)
    rows = calibration.fit_rows(split.n_docs, len(loaded.label_names), seed, multi)
    labels = split.doc_labels.numpy()
    # (refused before the model's pass)
    distinct = pc.count_distinct(arrow.column(data.splits[config.split], "text")).as_py()
    _refuse_unfittable(labels, multi, what, loaded.label_names, data_cfg.label_column, seed, distinct)
    if distinct < len(labels):  # (copies count as texts: the promise is then over texts repeated as these are)
        console.print(f"[yellow]warning:[/] {len(labels) - distinct:,} of the {_texts(len(labels))} of {markup(what)} "
                      f"repeat another text; each copy counts in the fit (drop them unless new texts repeat so "
                      f"too)", highlight=False)
    # what the checkpoint's own cuts cover of these texts, counted as `tformer evaluate` counts (the sets predict gives)
    tally = conformal.Tally(loaded.conformal, multi) if loaded.conformal is not None else None
    u = uniforms(split) if tally is not None and not multi else None
    count = None if tally is None else (lambda index, block: tally.add(
        calibration.probabilities(block, loaded.temperature, multi), labels[index], None if u is None else u[index]))
    logits = sampled_logits(loaded.model, split, rows, count, batch_size=config.batch_size,
                            pad_id=tokenization.pad_id(tok), device=device, precision=precision)
    y = labels if rows is None else labels[rows]
    every_text = None if rows is None else every_text_cuts(
        loaded.model, split, multi, seed, calibration.cut_rows(split.n_docs, len(loaded.label_names), seed, multi),
        device=device, pad_id=tokenization.pad_id(tok), precision=precision, batch_size=config.batch_size)
    changes = calibration.fitted(logits, y, multi, seed, loaded.thresholds, loaded.temperature, refit=True,
                                 every_text=every_text)
    changes["calibrated_on"] = {"checkpoint": str(loaded.path.resolve()), "data": data_cfg.name, "split": config.split,
                                "file": Path(read).name if read else None,
                                "file_sha256": sha256_file(Path(read)) if read else None, "texts": int(len(labels))}
    write_json(run_dir.data_report, checked)
    checkpoint.copy_with_meta(loaded.files, run_dir.best, changes)
    checkpoint.load(run_dir.best)  # (what predict will read: checked as it checks it)
    summary = _summary(logits, y, multi, loaded, changes, tally)
    write_json(run_dir.eval_metrics, summary)
    kept = calibration.kept_note(logits, y, multi, seed, every_text is not None)
    _report(console, loaded, changes, summary, y, rows, seed, run_dir, kept)
    return float(summary["ece"])


def _report(console, loaded, changes: dict, summary: dict, y, rows, seed: int, run_dir: RunDir, kept: str = ""
            ) -> None:
    """What a refit says: on which texts the temperature and the cuts were fitted (`y`: the labels of the texts the
    temperature was fitted on; `rows` not None: a sample of the split), what they did, what the old cuts covered;
    `kept`: calibration.kept_note."""
    multi, texts = bool(loaded.model.cfg.multi_label), changes["calibrated_on"]["texts"]
    if multi:  # (calibration.halves)
        sample = " (the temperatures on a seeded half of them, the label-set cuts on the other half)" if rows is None \
            else (f" (the temperatures and the figures here on a seeded sample of {len(y):,} of one half: "
                  f"{len(loaded.label_names):,} labels; the label-set cuts on every text of the other half)")
    else:
        sample = "" if rows is None else (f" (the temperature and the figures here on a seeded sample of {len(y):,}: "
                                          f"{len(loaded.label_names):,} classes; the label-set cuts on every text)")
    console.print(f"calibration on {_texts(texts)}{sample}: temperature "
                  f"{calibration.describe(loaded.temperature)} -> {calibration.describe(changes['temperature'])}"
                  f"{calibration.at_the_edge(changes['temperature'])}{kept}; on these texts log loss "
                  f"{summary['nll_before']:.4f} -> {summary['nll']:.4f}, ECE {summary['ece_before']:.4f} -> "
                  f"{summary['ece']:.4f} (binned: on few texts it may move either way)", highlight=False)
    if multi:  # (counted on the texts the temperatures were fitted on)
        silent = int((~calibration.told(y if rows is not None else y[calibration.halves(len(y), seed)[0]])).sum())
        if silent:
            kept = "keep their temperatures" if isinstance(loaded.temperature, list) else "get temperature 1"
            console.print(f"{silent:,} of {len(loaded.label_names):,} labels are never (or always) on in these "
                          f"texts: they {kept}", highlight=False)
    before = summary["coverage_before"]
    if before:
        shown = ", ".join(f"{before[conformal.key(x)]:.4f} at {x:.2f}" for x in conformal.REPORTED)
        drawn = conformal.range_note(summary["coverage_before_expected"].get(conformal.key(conformal.DEFAULT_LEVEL)))
        console.print(f"label sets: the checkpoint's cuts covered {shown} of these texts{drawn}; refitted on them for "
                      f"the levels 0.50 to 0.99", highlight=False)
    else:
        console.print("label sets: fitted on these texts for the levels 0.50 to 0.99 (the checkpoint had none)",
                      highlight=False)
    if (few := conformal.too_few(changes["conformal"])) is not None:
        console.print(f"[yellow]warning:[/] {few}", highlight=False)
    console.print(f"new checkpoint: {markup(run_dir.best)} (weights unchanged; {markup(loaded.path)} is as it was); "
                  f"use checkpoint={markup(run_dir.root)}", highlight=False)


def _refuse_unfittable(labels, multi: bool, what: str, names: list[str], label_column: str, seed: int = 0,
                       distinct: int | None = None) -> None:
    """Labelled texts no temperature or label-set cuts can be fitted on, refused in one line: texts of one class
    (the fit would learn to be surer of it alone) or, multi-label, of one label set, too few, or for a multi-label
    model none with a label in the half its cuts are fitted on (calibration.halves: every text would count as
    covered by an empty set). distinct: how many of the texts differ (copies of a few texts are few texts)."""
    if not multi and len(labels) and len(np.unique(labels)) < 2:
        raise TformerError(f"all {_texts(len(labels))} of {what} are of one class ({names[int(labels[0])]}): a "
                           f"temperature and label sets fitted on them would describe that class alone; give "
                           f"labelled texts of the classes the model answers with")
    if min(len(labels), len(labels) if distinct is None else distinct) < MIN_TEXTS:
        copies = f" ({distinct:,} distinct)" if distinct is not None and distinct < len(labels) else ""
        raise TformerError(f"{_texts(len(labels))}{copies} of {what} are too few to calibrate on: a temperature and "
                           f"label-set cuts fitted on them would be noise; give at least {MIN_TEXTS} different "
                           f"labelled texts (a few hundred make the 0.90 level steady)")
    if multi and len(labels) and not np.asarray(labels).any():
        raise TformerError(f"none of the {_texts(len(labels))} of {what} has a label: label sets fitted on them would "
                           f"always be empty; give texts with their labels in the `{label_column}` column")
    if multi and len(labels) > 1 and bool((np.asarray(labels).min(axis=0) == np.asarray(labels).max(axis=0)).all()):
        held = [names[int(c)] for c in np.flatnonzero(np.asarray(labels)[0])]
        held = ", ".join(held[:5]) + (f" and {len(held) - 5:,} more" if len(held) > 5 else "")
        raise TformerError(f"all {_texts(len(labels))} of {what} carry the same labels ({held}): "
                           f"temperatures and label sets fitted on them would describe that set alone; give labelled "
                           f"texts of the label sets the model answers with")
    cut = calibration.halves(len(labels), seed)[1]
    if multi and len(labels) and not np.asarray(labels)[cut].any():
        labelled = int(np.asarray(labels).any(axis=1).sum())
        raise TformerError(f"only {_texts(labelled)} of {what} ha{'s' if labelled == 1 else 've'} a label, none of "
                           f"them in the seeded half the label-set cuts are fitted on (the other half fits the "
                           f"temperatures): the sets would always be empty; give more texts with their labels")


def _texts(n: int) -> str:
    return f"{n:,} text{'s' if n != 1 else ''}"


def _refuse_training_texts(report: dict, split: str, what: str) -> None:
    """Texts the model trained on make it look surer than it is on new ones: a fit on them would undo calibration.
    The training file itself, or a set of texts mostly copied from training, is refused (a few copies are only
    the data check's warning)."""
    if split in report.get("same_file_as_train", []):
        raise TformerError(f"{what} is the model's training file; calibrate on labelled texts it never trained on")
    found = report.get("overlap_with_train", {}).get(split) or {}
    copies, rows = int(found.get("exact", 0)) + int(found.get("normalized", 0)), int(found.get("rows", 0))
    if rows and copies * 2 > rows:
        raise TformerError(f"{copies:,} of the {rows:,} texts of {what} are the model's training texts (the data "
                           f"check above shows one); calibrated on them, it would be surer than it is on new texts: "
                           f"give labelled texts it never trained on")


def _summary(logits, y, multi: bool, loaded, changes: dict, tally) -> dict:
    """metrics.json of the run: log loss and ECE on the texts read (a multi-label model's temperatures were fitted
    on half of them: calibration.halves) before (the checkpoint's temperature) and after (the temperature is the
    one of least log loss on the texts it was fitted on; ECE, counted in bins, is the figure users know), and what
    the checkpoint's own label-set cuts covered of them (all of them, counted as evaluate counts): how far these
    texts had drifted from its validation split (after the refit it is the level by construction: not reported)."""
    old, new = (calibration.probabilities(logits, t, multi) for t in (loaded.temperature, changes["temperature"]))
    result = {} if tally is None else tally.result()
    coverage = {conformal.key(x): result[conformal.key(x)]["coverage"] for x in conformal.REPORTED if result}
    expected = {k: result[k]["expected"] for k in coverage if "expected" in result[k]}
    return {**changes["calibrated_on"], "temperature_before": loaded.temperature,
            "temperature": changes["temperature"], "ece_before": calibration.ece(old, y, multi),
            "ece": calibration.ece(new, y, multi), "coverage_before": coverage,
            "coverage_before_expected": expected,
            "nll_before": calibration.nll(logits, y, multi, loaded.temperature),
            "nll": calibration.nll(logits, y, multi, changes["temperature"]),
            "accuracy": None if multi else float(np.mean(np.asarray(logits).argmax(axis=1) == y))}
