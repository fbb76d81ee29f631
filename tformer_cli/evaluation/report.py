"""Rich tables for metrics: the summary, the per-class report and the confusion matrix."""
from __future__ import annotations

from rich.table import Table

from ..console import output
from ..safe_text import markup, rich


def print_metrics(metrics: dict, label_names: list[str], title: str, console=None) -> None:
    console = console or output()
    multi = bool(metrics.get("multi_label"))
    summary = Table(title=markup(title), show_header=True, header_style="bold")
    cols = ["n", "subset accuracy" if multi else "accuracy", f"precision ({metrics['average']})",
            f"recall ({metrics['average']})", f"f1 ({metrics['average']})"]
    cols += ["f1 (macro)", "hamming loss"] if multi else []
    for col in cols + ["loss"]:
        summary.add_column(col, justify="right")
    loss = metrics.get("loss")
    extra = [f"{metrics['f1_macro']:.4f}", f"{metrics['hamming_loss']:.4f}"] if multi else []
    summary.add_row(f"{metrics['n']:,}", f"{metrics['accuracy']:.4f}", f"{metrics['precision']:.4f}",
                    f"{metrics['recall']:.4f}", f"{metrics['f1']:.4f}", *extra,
                    "-" if loss is None else f"{loss:.4f}")
    console.print(summary)

    per_class = Table(title="per label (at its threshold)" if multi else "per class", header_style="bold")
    for col in ("label", "precision", "recall", "f1", "support") + (("threshold",) if multi else ()):
        per_class.add_column(col, justify="left" if col == "label" else "right")
    for i, name in enumerate(label_names):
        row = metrics["per_class"].get(name, {})
        per_class.add_row(rich(name), f"{row.get('precision', 0):.3f}", f"{row.get('recall', 0):.3f}",
                          f"{row.get('f1-score', 0):.3f}", f"{int(row.get('support', 0)):,}",
                          *([f"{metrics['thresholds'][i]:.2f}"] if multi else []))
    console.print(per_class)

    if len(label_names) <= 25 and not multi:  # (labels of a multi-label model are not exclusive: no matrix)
        cm = Table(title="confusion matrix (rows: true, columns: predicted)", header_style="bold")
        cm.add_column("")
        for n in label_names:  # whole names: a terminal narrower than the table folds them, a file keeps them
            cm.add_column(rich(n), justify="right")
        for name, row in zip(label_names, metrics["confusion_matrix"]):
            cm.add_row(rich(name), *[str(v) for v in row])
        console.print(cm)


MLM_COLUMNS = ("epoch", "train_mlm_loss", "val_mlm_loss", "val_mlm_accuracy", "lr", "train_samples_per_s",
               "epoch_seconds")


def print_history(history: list[dict], console=None, columns: tuple[str, ...] | None = None,
                  title: str = "training summary") -> None:
    console = console or output()
    if columns is None and history and "val_mlm_loss" in history[0]:  # a `tformer pretrain` run
        columns, title = MLM_COLUMNS, "pretraining summary"
    table = Table(title=title, header_style="bold")
    cols = list(columns or ("epoch", "train_loss", "val_loss", "val_accuracy", "val_f1", "lr", "train_samples_per_s",
                            "epoch_seconds"))
    names = {"train_samples_per_s": "samples/s", "epoch_seconds": "seconds"}
    shown = {"epoch": str, "lr": lambda v: f"{v:.2e}", "train_samples_per_s": lambda v: f"{v:,.0f}",
             "epoch_seconds": lambda v: f"{v:.1f}"}
    for c in cols:
        table.add_column(names.get(c, c), justify="right")
    for h in history:  # a missing value, or a NaN that strict JSON wrote as null, is "-"; a wrong type raises
        table.add_row(*["-" if h.get(c) is None else shown.get(c, lambda v: f"{v:.4f}")(h[c]) for c in cols])
    console.print(table)
