"""`tformer report <run dir>`: what a finished (or interrupted) run did, from the files it left."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import TformerError
from ..store.layout import RunDir, SweepDir, newest_checkpoints


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print("usage: tformer report [RUN_DIR | SWEEP_DIR]   (default: the newest run under outputs/)")
        return 0
    if argv:
        run_dir = RunDir(Path(argv[0]).expanduser())
    else:
        runs = newest_checkpoints("outputs", "best") or newest_checkpoints("outputs", "last")
        if not runs:
            raise TformerError(f"no run under {Path('outputs').resolve()}/; pass a run directory")
        run_dir = RunDir.of_checkpoint(runs[-1])
    if not run_dir.root.is_dir():
        raise TformerError(f"run directory {run_dir} does not exist; pass outputs/train/<date>/<time>")
    if SweepDir(run_dir.root).is_sweep():  # a -m sweep: one row per job (running, finished or died)
        from ..console import screen_console
        from ..sweeps.summary import summarize

        summarize(run_dir.root, screen_console())
        return 0
    ckpts = [c for c in (run_dir.best.existing(), run_dir.last.existing()) if c is not None and c.config.is_file()]
    if not ckpts:
        raise TformerError(f"{run_dir} has no best or last checkpoint; is it a `tformer train` run dir?")

    import yaml
    from rich.table import Table

    from ..console import screen_console

    from ..evaluation import artifacts
    from ..evaluation.report import print_history, print_metrics

    console = screen_console()
    cfg = yaml.safe_load(ckpts[0].config.read_text())
    model, data, opt, sched, emb, trainer = (cfg.get(k, {}) for k in ("model", "data", "optimizer", "schedule",
                                                                      "embedding_init", "trainer"))
    from ..safe_text import markup, rich

    summary = Table(title=markup(f"run {run_dir}"), show_header=False)
    summary.add_column(style="bold")
    summary.add_column()
    rows = {
        "data": f"{data.get('name')}" + (f" from {data['dir']}" if data.get("dir") else ""),
        "model": f"{model.get('n_layers')} layers, d_model {model.get('d_model')}, {model.get('n_heads')} heads, d_ff "
                 f"{model.get('d_ff')}, max_len {model.get('max_len')}, {model.get('positions')} positions, "
                 f"{model.get('norm')}-norm, {model.get('pooling')} pooling",
        "embeddings": f"{emb.get('name')}" + (f", frozen {emb.get('freeze_epochs')} epoch(s)"
                                              if emb.get("name") != "random" else ""),
        "optimizer": f"{opt.get('name')} lr {opt.get('lr')}, schedule {sched.get('name')}",
        "trainer": f"{trainer.get('epochs')} epochs, batch {trainer.get('batch_size')}, early stopping on "
                   f"{trainer.get('early_stopping', {}).get('monitor')}, seed {cfg.get('seed')}",
    }
    for key, value in rows.items():
        summary.add_row(key, rich(value))  # values come from a file: shown as written, never as markup
    console.print(summary)
    last = run_dir.last.existing()
    history = json.loads(run_dir.history.read_text()) if run_dir.finished else \
        json.loads(last.training_json.read_text()).get("history", []) if last and last.training_json.is_file() else []
    if history:
        print_history(history, console)
    best_ckpt = run_dir.best.existing()
    best = json.loads(best_ckpt.metrics.read_text()) if best_ckpt and best_ckpt.metrics.is_file() else {}
    if best and "val_mlm_loss" in best:  # a `tformer pretrain` run
        console.print(f"best epoch {best.get('epoch')}: val_mlm_loss {best['val_mlm_loss']:.4f}, val_mlm_accuracy "
                      f"{best.get('val_mlm_accuracy', float('nan')):.4f}", highlight=False)
    elif best:
        console.print(f"best epoch {best.get('epoch')}: val_accuracy {best.get('val_accuracy', float('nan')):.4f}, "
                      f"val_f1 {best.get('val_f1', float('nan')):.4f}, val_loss {best.get('val_loss', float('nan')):.4f}",
                      highlight=False)
    if not run_dir.finished:
        task = "pretrain" if best_ckpt is not None and best_ckpt.is_pretraining() else "train"
        console.print(f"[yellow]the run did not finish[/]; resume it with `tformer {task} <its overrides> "
                      f"resume={run_dir}`", highlight=False)
    if run_dir.test_metrics.is_file():
        labels = json.loads(ckpts[0].labels.read_text())
        print_metrics(json.loads(run_dir.test_metrics.read_text()), labels, "test (best checkpoint)", console)
    files = [p for p in (run_dir.training_curves, *artifacts.report_paths(run_dir.test_report).values(),
                         run_dir.best.path) if p.exists()]
    for p in files:
        console.print(f"  {p}", highlight=False)
    return 0
