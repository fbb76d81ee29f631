"""`tformer suggest checkpoint=RUN file=unlabeled.csv n=200`: the texts most worth labelling next, as a CSV to fill in.

Its options are parsed here, like export's and push's (key=value): it reads one file and writes one, so it needs
no run folder, sweep or composed config from Hydra.
"""
from __future__ import annotations

from pathlib import Path

from rich.table import Table

from ..console import output
from ..classifier import MAX_BATCH
from ..errors import TformerError
from ..evaluation.suggestions import readable, suggest
from ..safe_text import csv_cell, markup, rich, terminal
from ..store.atomic import write_with
from ..yesno import bool_or_path, parse_bool
from .options import parse_key_values

USAGE = """usage: tformer suggest file=PATH [checkpoint=PATH] [n=100] [out=PATH] [text_column=NAME]
                       [uncertainty=margin|entropy] [pool_factor=10] [labelled=auto|none|PATH] [show=10]
                       [overwrite=false] [batch_size=64] [device=auto|cpu|cuda] [outputs_dir=DIR]

Picks the n texts of file (csv, tsv, json, jsonl, parquet: its text_column; txt: one text a line) whose labels
would teach the model (checkpoint: a run dir, default the newest run) most: the most uncertain (margin between
the two most probable classes, or entropy), spread over what the model sees as different texts, so they are not
near copies; exact duplicates, empty texts and texts already labelled are never suggested. labelled=auto takes the
run's own data files as labelled; labelled=PATH another file; labelled=none nothing.
Writes out (default: <file>.to_label.csv beside it): text, an empty label column, the model's guess, its
probability and the uncertainty. Fill in the labels, add the rows to the training file and train again."""

DEFAULTS = {"checkpoint": None, "file": None, "n": "100", "out": None, "text_column": None, "uncertainty": "margin",
            "pool_factor": "10", "labelled": "auto", "show": "10", "overwrite": "false", "batch_size": "64",
            "device": "auto", "outputs_dir": "outputs"}
COUNTS = {"n": 1, "pool_factor": 1, "show": 0, "batch_size": 1}  # the whole-number options and their least value


def parse_args(argv: list[str]) -> dict:
    opts = parse_key_values(argv, DEFAULTS, USAGE, "suggest")
    for key, low in COUNTS.items():
        try:
            opts[key] = int(opts[key])
        except ValueError:
            raise TformerError(f"{key}={terminal(opts[key])!r} must be a whole number") from None
        if opts[key] < low:
            raise TformerError(f"{key}={opts[key]} must be at least {low}")
    if opts["batch_size"] > MAX_BATCH:
        raise TformerError(f"batch_size={opts['batch_size']} must be at most {MAX_BATCH}")
    opts["overwrite"] = parse_bool(opts["overwrite"], "overwrite")
    if not opts["file"]:
        raise TformerError("suggest needs file=PATH: the unlabelled texts to choose from (csv, tsv, json, jsonl, "
                           "parquet or txt)")
    if opts["labelled"].strip().lower() in ("none", "null", ""):
        opts["labelled"] = None
    else:  # the yes/no words too (labelled=no, off; yes is auto), refused where a file of that name exists
        meant = bool_or_path(opts["labelled"], "labelled")
        opts["labelled"] = None if meant is False else "auto" if meant is True else meant
    return opts


def out_path(opts: dict) -> Path:
    """Where the CSV goes: out=, else beside the input as <name>.to_label.csv. An existing file is kept (it may
    hold labels already typed in) unless overwrite=true."""
    source = readable(opts["file"])  # (a folder has no name to put beside: `file=.`)
    path = Path(opts["out"]) if opts["out"] else source.with_name(f"{source.stem}.to_label.csv")
    if path.is_dir():
        raise TformerError(f"out={terminal(path)} is a folder; pass the path of the CSV to write")
    if path.exists() and not opts["overwrite"]:
        raise TformerError(f"{terminal(path)} exists (it may hold labels already filled in); pass out=<new path> or "
                           f"overwrite=true")
    if path.resolve() == source.resolve():
        raise TformerError(f"out={terminal(path)} is the input file; pass another out=")
    return path


def print_table(picks, show: int, console) -> None:
    """The first `show` picks: rank, uncertainty, the model's guess and probability, the text's start."""
    text_column = picks.columns[0]
    table = Table(header_style="bold", title=f"the {min(show, len(picks))} most worth labelling of {len(picks)}")
    for name, justify in (("#", "right"), ("row", "right"), ("uncertainty", "right"), ("guess", "left"),
                          ("probability", "right"), (text_column, "left")):
        table.add_column(name, justify=justify, overflow="fold" if name == text_column else "ellipsis")
    for rank, (row, pick) in enumerate(picks.head(show).iterrows(), 1):
        text = " ".join(str(pick[text_column]).split())
        table.add_row(str(rank), str(row), f"{pick['uncertainty']:.3f}", rich(pick["guess"]),
                      f"{pick['probability']:.3f}", rich(text if len(text) <= 120 else text[:117] + "..."))
    console.print(table)


def write_csv(picks, path: Path) -> None:
    """The picks as CSV, cells that a spreadsheet would run as a formula made text (safe_text.csv_cell)."""
    safe = picks.map(csv_cell) if hasattr(picks, "map") else picks.applymap(csv_cell)
    write_with(path, lambda tmp: safe.to_csv(tmp, index=False, encoding="utf-8"))


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    path = out_path(opts)
    console = output()
    picks = suggest(opts["checkpoint"], opts["file"], n=opts["n"], text_column=opts["text_column"],
                    uncertainty=opts["uncertainty"], pool_factor=opts["pool_factor"], labelled=opts["labelled"],
                    batch_size=opts["batch_size"], device=opts["device"], outputs_dir=opts["outputs_dir"])
    if opts["show"]:
        print_table(picks, opts["show"], console)
    write_csv(picks, path)
    label = picks.columns[1]
    console.print(f"wrote {len(picks)} texts to label to {markup(path)}: fill in its `{markup(label)}` column, add "
                  f"the rows to your training file and train again", highlight=False)
    return 0
