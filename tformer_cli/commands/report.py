"""`tformer report <run dir>`: what a finished (or interrupted) run did, from the files it left; also a sweep, an
audit or an evaluate run (evaluation/folders.py)."""
from __future__ import annotations

from pathlib import Path

from ..console import screen_console
from ..errors import TformerError
from ..evaluation import artifacts
from ..evaluation.calibration import describe
from ..evaluation.conformal import DEFAULT_LEVEL, key, range_note
from ..evaluation.folders import read_run_json, refuse_other_paths, report_other, shown
from ..evaluation.report import print_history, print_metrics, settings_table
from ..safe_text import markup
from ..store import manifest
from ..store.layout import RunDir, SweepDir, newest_checkpoints
from ..sweeps.summary import summarize


def saved_history(state) -> list:
    """The epoch records a `last` checkpoint's trainer_state.json keeps (none when it is not a mapping of them)."""
    history = state.get("history") if isinstance(state, dict) else None
    return history if isinstance(history, list) else []


def print_best(best: dict, console) -> None:
    nan = float("nan")
    if "val_mlm_loss" in best:  # a `tformer pretrain` run
        console.print(f"best epoch {best.get('epoch')}: val_mlm_loss {best['val_mlm_loss']:.4f}, val_mlm_accuracy "
                      f"{best.get('val_mlm_accuracy', nan):.4f}", highlight=False)
    else:
        console.print(f"best epoch {best.get('epoch')}: val_accuracy {best.get('val_accuracy', nan):.4f}, "
                      f"val_f1 {best.get('val_f1', nan):.4f}, val_loss {best.get('val_loss', nan):.4f}",
                      highlight=False)


def print_refit(fit: dict, console) -> None:
    """A `tformer calibrate` run: what it refitted, on which texts, and what the old calibration did on them."""
    before = fit.get("coverage_before") or {}
    console.print(f"calibrated {markup(str(fit['checkpoint']))} on {fit['texts']:,} texts of "
                  f"{markup(str(fit.get('file') or fit.get('split')))}: temperature "
                  f"{describe(fit['temperature_before'])}"
                  f" -> {describe(fit['temperature'])}, "
                  + (f"log loss {fit['nll_before']:.4f} -> {fit['nll']:.4f}, " if "nll" in fit else "")  # (older runs:
                  + f"ECE {fit['ece_before']:.4f} -> {fit['ece']:.4f}"  # none)
                  + ("; the old label sets covered " + ", ".join(f"{float(v):.4f} at {k}" for k, v in before.items())
                     if before else "") + expected_note(fit), highlight=False)


def expected_note(fit: dict) -> str:
    """The expected range of the old cuts at 0.90, as `tformer calibrate` said it (conformal.range_note)."""
    return range_note((fit.get("coverage_before_expected") or {}).get(key(DEFAULT_LEVEL)))


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print("usage: tformer report [RUN_DIR | SWEEP_DIR | AUDIT_DIR | EVALUATE_DIR]   (default: the newest run "
              "under outputs/)")
        return 0
    if argv:
        refuse_other_paths(Path(argv[0]).expanduser())  # nothing there, a file, a checkpoint: what to pass instead
        run_dir = RunDir(Path(argv[0]).expanduser())
    else:
        runs = newest_checkpoints("outputs", "best") or newest_checkpoints("outputs", "last")
        if not runs:
            raise TformerError(f"no run under {Path('outputs').resolve()}/; pass a run directory")
        run_dir = RunDir.of_checkpoint(runs[-1])
    if SweepDir(run_dir.root).is_sweep():  # a -m sweep: one row per job (running, finished or died)
        summarize(run_dir.root, screen_console())
        return 0
    if report_other(run_dir.root, screen_console()):  # an audit, one of its folds, an evaluate run
        return 0
    ckpts = [c for c in (run_dir.best.existing(), run_dir.last.existing()) if c is not None and c.config.is_file()]
    if not ckpts:
        raise TformerError(f"{run_dir} has no best or last checkpoint and is no sweep, audit or evaluate run: "
                           f"nothing to report (a run stopped before its first checkpoint has none yet)")

    console = screen_console()
    console.print(settings_table(run_dir, ckpts[0]))
    last = run_dir.last.existing()
    source = run_dir.history if run_dir.finished else last.training_json if last else None
    history = read_run_json(run_dir.history, list) if run_dir.finished else \
        saved_history(manifest.read_json(last, last.training_json, allow_nan=True)) \
        if last and last.training_json.is_file() else []
    if history:
        shown(source, print_history, history, console)
    best_ckpt = run_dir.best.existing()
    best = manifest.read_json(best_ckpt, best_ckpt.metrics, allow_nan=True) \
        if best_ckpt and best_ckpt.metrics.is_file() else {}
    if best:
        shown(best_ckpt.metrics, print_best, best, console)
    meta = manifest.read_json(ckpts[0], ckpts[0].meta, allow_nan=True)
    if isinstance(meta, dict) and isinstance(meta.get("calibrated_on"), dict) and run_dir.eval_metrics.is_file():
        shown(run_dir.eval_metrics, print_refit, read_run_json(run_dir.eval_metrics, dict), console)  # (calibrate)
    elif not run_dir.finished:
        console.print(f"[yellow]the run did not finish[/]; resume it with `tformer {ckpts[0].task()} <its overrides> "
                      f"resume={markup(run_dir)}`", highlight=False)
    if run_dir.test_metrics.is_file():
        labels = manifest.read_json(ckpts[0], ckpts[0].labels)
        shown(run_dir.test_metrics, print_metrics, read_run_json(run_dir.test_metrics, dict, len(labels)), labels,
              "test (best checkpoint)", console)
    files = [p for p in (run_dir.training_curves, *artifacts.report_paths(run_dir.test_report).values(),
                         run_dir.best.path) if p.exists()]
    for p in files:
        console.print(f"  {markup(p)}", highlight=False)
    return 0
