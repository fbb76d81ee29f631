"""Rich tables for metrics: the summary, the per-class report and the confusion matrix."""
from __future__ import annotations

from pathlib import Path

import yaml
from rich.measure import Measurement
from rich.table import Table

from ..console import WIDE, fitting_width, output
from ..errors import TformerError
from ..safe_text import markup, rich
from ..store import manifest
from .calibration import describe
from .conformal import REPORTED as REPORTED_LEVELS, below_expected
from .metrics import top_confusions


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
    note = absent_classes_note(metrics, label_names)
    if note:
        console.print(rich(note), highlight=False)
    if "ece" in metrics:
        console.print(calibration_table(metrics))
    if metrics.get("label_sets"):
        console.print(label_sets_table(metrics["label_sets"], multi, metrics.get("calibrated_on")))
        drifted = below_expected(metrics["label_sets"])
        if drifted:
            console.print(rich(drifted), highlight=False)

    console.print(per_class_table(metrics, label_names))
    if not multi:  # (labels of a multi-label model are not exclusive: no matrix)
        console.print(ConfusionMatrix(label_names, metrics))


def absent_classes_note(metrics: dict, label_names: list[str]) -> str | None:
    """A macro average counts a class with no text in the split as 0 (scikit-learn's convention): said, with the
    average over the classes that are there, so a low macro-F1 is not misread."""
    multi = bool(metrics.get("multi_label"))
    per_class = metrics.get("per_class", {})
    absent = [n for n in label_names if not per_class.get(n, {}).get("support", 0)]
    if not absent or not (multi or metrics.get("average") == "macro"):
        return None
    present = [per_class[n]["f1-score"] for n in label_names if per_class.get(n, {}).get("support", 0)]
    shown = ", ".join(repr(n) for n in absent[:3]) + (", ..." if len(absent) > 3 else "")
    return (f"macro averages count the {len(absent):,} {'label' if multi else 'class'}{'s' if len(absent) != 1 else ''} with no text in this "
            f"split ({shown}) as 0, as scikit-learn does; macro f1 over the {len(present):,} present: "
            f"{sum(present) / max(len(present), 1):.4f}")


PER_CLASS_SHOWN = 50  # more classes: the table shows the PER_CLASS_WORST lowest F1 (the file has every class)
PER_CLASS_WORST = 15


def per_class_table(metrics: dict, label_names: list[str]) -> Table:
    """Precision, recall, F1 and support per class (and threshold per label); above PER_CLASS_SHOWN classes only
    the PER_CLASS_WORST classes with texts and the lowest F1 (classification_report.json holds them all)."""
    multi = bool(metrics.get("multi_label"))
    rows = [(i, metrics["per_class"].get(name, {})) for i, name in enumerate(label_names)]
    title = "per label (at its threshold)" if multi else "per class"
    if len(rows) > PER_CLASS_SHOWN:
        with_texts = [(i, r) for i, r in rows if r.get("support", 0)]
        rows = sorted(with_texts, key=lambda ir: (ir[1].get("f1-score", 0), -ir[1].get("support", 0), ir[0])
                      )[:PER_CLASS_WORST]
        title = (f"{title}: the {len(rows)} lowest F1 of {len(label_names):,} (every {'label' if multi else 'class'} "
                 f"in classification_report.json)")
    table = Table(title=title, header_style="bold")
    for col in ("label", "precision", "recall", "f1", "support") + (("threshold",) if multi else ()):
        table.add_column(col, justify="left" if col == "label" else "right",
                         overflow="fold" if col == "label" else "ellipsis")  # a long name wraps, whole
    for i, row in rows:
        table.add_row(rich(label_names[i]), f"{row.get('precision', 0):.3f}", f"{row.get('recall', 0):.3f}",
                      f"{row.get('f1-score', 0):.3f}", f"{int(row.get('support', 0)):,}",
                      *([f"{metrics['thresholds'][i]:.2f}"] if multi else []))
    return table


def calibration_table(metrics: dict) -> Table:
    """ECE, Brier and NLL of the raw model and at the checkpoint's temperature (evaluation/calibration.py)."""
    t = metrics.get("temperature")
    table = Table(title=f"calibration (temperature {describe(t)}; lower is better)", header_style="bold")
    for col in ("probabilities", "ECE", "Brier", "NLL"):
        table.add_column(col, justify="left" if col == "probabilities" else "right")
    shown = lambda v: "-" if v is None or v != v else f"{v:.4f}"
    table.add_row("raw", *(shown(metrics.get(f"{k}_raw")) for k in ("ece", "brier", "nll")))
    if t is not None:
        table.add_row("calibrated", *(shown(metrics.get(k)) for k in ("ece", "brier", "nll")))
    return table


def _fitted_on(calibrated_on) -> str:
    """'validation', or what a `tformer calibrate` run fitted on, from the checkpoint's meta (read as data)."""
    if not isinstance(calibrated_on, dict):
        return "validation"
    texts, where = calibrated_on.get("texts"), calibrated_on.get("file") or calibrated_on.get("split")
    count = f"{texts:,} texts of " if isinstance(texts, int) and not isinstance(texts, bool) else ""
    return f"{count}{Path(str(where)).name if where else 'labelled texts'} (tformer calibrate)"


def label_sets_table(label_sets: dict, multi_label: bool, calibrated_on: dict | None = None) -> Table:
    """Coverage and mean set size of the conformal label sets at the usual levels (evaluation/conformal.py); the
    title says what they were fitted on: validation, or the texts of a `tformer calibrate` run."""
    where = _fitted_on(calibrated_on)
    if multi_label:  # (calibration.halves: its temperatures were fitted on the other half)
        where = "half the validation texts" if where == "validation" else f"half of {where}"
    table = Table(title=f"label sets (predict --coverage LEVEL; conformal, fitted on {markup(where)})",
                  header_style="bold")
    ranged = any("expected" in (label_sets.get(f"{x:.2f}") or {}) for x in REPORTED_LEVELS)
    for col in ("level", "true labels in the set" if multi_label else "coverage",
                *(["expected (95%)"] if ranged else []), "mean set size", "empty sets"):
        table.add_column(col, justify="right")
    for level in REPORTED_LEVELS:
        row = label_sets.get(f"{level:.2f}")
        if row is not None:
            low, high = row.get("expected") or (None, None)
            expected = [f"{low:.3f}-{high:.3f}" if low is not None else "-"] if ranged else []
            table.add_row(f"{level:.2f}", f"{row['coverage']:.4f}", *expected, f"{row['mean_set_size']:.2f}",
                          f"{row['empty']:.1%}")
    return table


MATRIX_MAX_CLASSES = 25  # more classes: only the top confusions (the PNG holds the whole matrix)
TOP_CONFUSIONS = 10


class ConfusionMatrix:
    """The confusion matrix, laid out when a console renders it, for that console's width (the terminal's; a file's
    PLAIN_WIDTH): whole label names as column headers when they fit; else numbered columns, the numbers beside the
    rows' whole names; when even that is too wide (or the metrics hold only the top confusions: many classes), the
    most frequent confusions (true, predicted, count) and a pointer to confusion_matrix.png. A label name is never
    cut: a cut `comp...` could be any of five classes."""

    def __init__(self, label_names, metrics: dict):
        self.names = [str(n) for n in label_names]
        dense = metrics.get("confusion_matrix")
        self.matrix = [[int(v) for v in row] for row in dense] if dense is not None else None
        self.pairs = top_confusions(metrics, self.names)
        self.pair_count = len(self.pairs) if dense is not None else int(metrics.get("confusion_pairs", len(self.pairs)))
        self.support = {i: int(metrics.get("per_class", {}).get(n, {}).get("support", 0))
                        for i, n in enumerate(self.names)} if dense is None else None

    def __rich_console__(self, console, options):
        width = fitting_width(options.max_width)
        if self.matrix is not None and len(self.names) <= MATRIX_MAX_CLASSES:
            for table in (self.named(), self.numbered()):
                if Measurement.get(console, options.update_width(WIDE), table).maximum <= width:
                    yield table
                    return
        yield self.top()

    def named(self) -> Table:
        cm = Table(title="confusion matrix (rows: true, columns: predicted)", header_style="bold")
        cm.add_column("", no_wrap=True)
        for n in self.names:
            cm.add_column(rich(n), justify="right", no_wrap=True)
        for name, row in zip(self.names, self.matrix):
            cm.add_row(rich(name), *[str(v) for v in row])
        return cm

    def numbered(self) -> Table:
        cm = Table(title="confusion matrix (rows: true, columns: predicted, numbered as the rows)", header_style="bold",
                   box=None, padding=(0, 0, 0, 1), pad_edge=False)  # a column: its digits and one space
        cm.add_column("", justify="right", no_wrap=True)
        cm.add_column("true", no_wrap=True)
        for i in range(len(self.names)):
            cm.add_column(str(i + 1), justify="right", no_wrap=True)
        for i, (name, row) in enumerate(zip(self.names, self.matrix)):
            cm.add_row(str(i + 1), rich(name), *[str(v) for v in row])
        return cm

    def top(self) -> Table:
        k = len(self.names)
        where = (f"the whole {k}x{k} matrix: confusion_matrix.png in the reports" if self.matrix is not None else
                 f"{k:,} classes: the most confused in confusion_matrix.png, the top "
                 f"{len(self.pairs):,} in the metrics file")
        table = Table(title=f"top confusions ({min(len(self.pairs), TOP_CONFUSIONS)} of {self.pair_count:,}; {where})",
                      header_style="bold")
        table.add_column("true", overflow="fold")  # (a name longer than the screen wraps, whole)
        table.add_column("predicted", overflow="fold")
        table.add_column("count", justify="right")
        table.add_column("% of true", justify="right")
        for t, p, v in self.pairs[:TOP_CONFUSIONS]:
            total = sum(self.matrix[t]) if self.matrix is not None else self.support[t]
            table.add_row(rich(self.names[t]), rich(self.names[p]), f"{v:,}", f"{100 * v / max(total, 1):.1f}")
        return table


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
    # headers a narrow terminal can wrap between words (`train_...` would say nothing); the metrics' own names
    # stay in history.json and metrics.csv
    names = {"train_samples_per_s": "samples per s", "epoch_seconds": "seconds", "val_accuracy": "val acc",
             "val_mlm_accuracy": "val mlm acc"}
    shown = {"epoch": str, "lr": lambda v: f"{v:.2e}", "train_samples_per_s": lambda v: f"{v:,.0f}",
             "epoch_seconds": lambda v: f"{v:.1f}"}
    for c in cols:
        table.add_column(names.get(c, c.replace("_", " ")), justify="right")
    for h in history:  # a missing value, or a NaN that strict JSON wrote as null, is "-"; a wrong type raises
        table.add_row(*["-" if h.get(c) is None else shown.get(c, lambda v: f"{v:.4f}")(h[c]) for c in cols])
    console.print(table)


def settings_table(run_dir: RunDir, ckpt):
    """The run's settings (data, model, embeddings, optimizer, trainer, and a distilled run's teacher) as a table,
    from the checkpoint's saved config."""
    try:
        cfg = yaml.safe_load(manifest.read_text(ckpt, ckpt.config))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise TformerError(f"{ckpt.config} is unreadable ({type(exc).__name__}); use another checkpoint") from None
    if not isinstance(cfg, dict):
        raise TformerError(f"{ckpt.config} is not a mapping of settings; use another checkpoint")
    model, data, opt, sched, emb, trainer = (cfg.get(k) if isinstance(cfg.get(k), dict) else {}
                                             for k in ("model", "data", "optimizer", "schedule", "embedding_init",
                                                       "trainer"))
    summary = Table(title=markup(f"run {run_dir}"), show_header=False)
    summary.add_column(style="bold")
    summary.add_column()
    try:  # the model as built (a pretrained family's shape comes from its folder, not from the config)
        arch = manifest.read_json(ckpt, ckpt.model_config)
    except (OSError, ValueError, TformerError):
        arch = None
    arch = arch if isinstance(arch, dict) else model
    source = (f", pretrained {model['pretrained']}" if model.get("pretrained") else
              f", continued from the pretraining run {model['init']}" if model.get("init") else "")
    decay = model.get("layer_lr_decay")
    rows = {
        "data": f"{data.get('name')}" + (f" from {data['dir']}" if data.get("dir") else ""),
        "model": f"{arch.get('n_layers')} layers, d_model {arch.get('d_model')}, {arch.get('n_heads')} heads, d_ff "
                 f"{arch.get('d_ff')}, max_len {arch.get('max_len')}, {arch.get('positions')} positions, "
                 f"{arch.get('norm')}-norm, {arch.get('pooling')} pooling"
                 + (f", {arch['pair_buckets']} buckets of token pairs" if arch.get("pair_buckets") else "") + source,
        "embeddings": _embeddings(cfg, model, emb),
        "optimizer": f"{opt.get('name')} lr {opt.get('lr')}"
                     + (f" (top layers; x{decay} per layer below)" if isinstance(decay, (int, float)) and decay != 1
                        else "") + f", schedule {sched.get('name')}",
        "trainer": f"{trainer.get('epochs')} epochs, batch {trainer.get('batch_size')}, early stopping on "
                   f"{trainer.get('early_stopping', {}).get('monitor')}, seed {cfg.get('seed')}",
    }
    if isinstance(cfg.get("distill"), dict):  # a `tformer distill` run
        kd = cfg["distill"]
        rows["teacher"] = (f"{cfg.get('teacher')} (temperature {kd.get('temperature')}, alpha {kd.get('alpha')}, "
                           f"embeddings {kd.get('embeddings')}, unlabeled {kd.get('unlabeled') or 'none'})")
    for key, value in rows.items():
        summary.add_row(key, rich(value))  # values come from a file: shown as written, never as markup
    return summary


def _embeddings(cfg: dict, model: dict, emb: dict) -> str:
    """Where the run's token table came from, as the run built it (runs/distill.teacher_table's rule for a
    student): the pretrained model's, the pretraining run's, the teacher's, or embedding_init's."""
    if model.get("pretrained"):
        return "the pretrained model's own"
    if model.get("init"):
        return "the pretraining run's"
    kd = cfg.get("distill")
    own_table = emb.get("name") not in (None, "random")  # (embedding_init=<a pretrained table>)
    if isinstance(kd, dict) and (kd.get("embeddings") == "teacher" or (kd.get("embeddings") == "auto" and not own_table)):
        return "the teacher's token table and tokenizer (projected to the student's width where it differs)"
    return f"{emb.get('name')}" + (f", frozen {emb.get('freeze_epochs')} epoch(s)" if emb.get("name") != "random"
                                   else "")
