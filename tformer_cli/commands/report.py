"""`tformer report <run dir>`: what a finished (or interrupted) run did, from the files it left."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import TformerError


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: tformer report [RUN_DIR]   (default: the newest run under outputs/)")
        return 0 if argv else 2
    run_dir = Path(argv[0]).expanduser()
    if not run_dir.is_dir():
        raise TformerError(f"run directory {run_dir} does not exist; pass outputs/train/<date>/<time>")
    ckpts = [run_dir / "checkpoints" / w for w in ("best", "last") if (run_dir / "checkpoints" / w / "config.yaml").is_file()]
    if not ckpts:
        raise TformerError(f"{run_dir} has no checkpoints/best or checkpoints/last; is it a `tformer train` run dir?")

    import yaml
    from rich.console import Console
    from rich.table import Table

    from ..evaluation.report import print_history, print_metrics

    console = Console()
    cfg = yaml.safe_load((ckpts[0] / "config.yaml").read_text())
    model, data, opt, sched, emb, trainer = (cfg.get(k, {}) for k in ("model", "data", "optimizer", "schedule",
                                                                      "embedding_init", "trainer"))
    summary = Table(title=f"run {run_dir}", show_header=False)
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("data", f"{data.get('name')}" + (f" from {data['dir']}" if data.get("dir") else ""))
    summary.add_row("model", f"{model.get('n_layers')} layers, d_model {model.get('d_model')}, {model.get('n_heads')} "
                             f"heads, d_ff {model.get('d_ff')}, max_len {model.get('max_len')}, {model.get('positions')}"
                             f" positions, {model.get('norm')}-norm, {model.get('pooling')} pooling")
    summary.add_row("embeddings", f"{emb.get('name')}" + (f", frozen {emb.get('freeze_epochs')} epoch(s)"
                                                           if emb.get("name") != "random" else ""))
    summary.add_row("optimizer", f"{opt.get('name')} lr {opt.get('lr')}, schedule {sched.get('name')}")
    summary.add_row("trainer", f"{trainer.get('epochs')} epochs, batch {trainer.get('batch_size')}, early stopping on "
                               f"{trainer.get('early_stopping', {}).get('monitor')}, seed {cfg.get('seed')}")
    console.print(summary)
    history_file = run_dir / "history.json"
    history = json.loads(history_file.read_text()) if history_file.is_file() else \
        json.loads((run_dir / "checkpoints" / "last" / "trainer_state.json").read_text()).get("history", [])
    if history:
        print_history(history, console)
    best = json.loads((run_dir / "checkpoints" / "best" / "metrics.json").read_text()) \
        if (run_dir / "checkpoints" / "best" / "metrics.json").is_file() else {}
    if best:
        console.print(f"best epoch {best.get('epoch')}: val_accuracy {best.get('val_accuracy', float('nan')):.4f}, "
                      f"val_f1 {best.get('val_f1', float('nan')):.4f}, val_loss {best.get('val_loss', float('nan')):.4f}",
                      highlight=False)
    if not history_file.is_file():
        console.print("[yellow]the run did not finish[/]; resume it with `tformer train <its overrides> "
                      f"resume={run_dir}`", highlight=False)
    test_file = run_dir / "test_metrics.json"
    if test_file.is_file():
        labels = json.loads((ckpts[0] / "labels.json").read_text())
        print_metrics(json.loads(test_file.read_text()), labels, "test (best checkpoint)", console)
    files = [p for p in (run_dir / "training_curves.png", run_dir / "test_report" / "confusion_matrix.png",
                         run_dir / "test_report" / "classification_report.json", run_dir / "test_report" / "errors.csv",
                         run_dir / "checkpoints" / "best") if p.exists()]
    for p in files:
        console.print(f"  {p}", highlight=False)
    return 0
