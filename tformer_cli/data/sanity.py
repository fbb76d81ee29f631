"""What is wrong with a dataset that loads fine: the checks that run on the loaded splits at the start of every
`train` and `evaluate`, before any token is computed (the rule for a text that says nothing: data/visible.py).

A model scored on texts it trained on reports a skill it does not have, and nothing in the metrics shows it; a
class no row has is trained as a phantom; a class named `None` is a real class that other tools read as missing.
These are cheap to find (64-bit hashes of the texts, read from Arrow a block at a time and kept as sorted arrays:
8 bytes a text, never a pairwise comparison) and expensive to find later, so every run checks, prints a short
block, and keeps the findings in its run dir (data_report.json). A mistake that makes the run meaningless is
refused in one line; the rest are warnings.
"""
from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..console import output, progress
from ..errors import TformerError
from ..safe_text import markup
from ..store.atomic import sha256_file, write_json
from . import arrow


# pandas.read_csv's default missing-value strings: tformer reads them as text, other tools as "no value".
PANDAS_NA_STRINGS = frozenset({"#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                               "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})
EXAMPLES = 3  # texts shown (and saved) per finding
SHOWN_CHARS = 80


def check_label_names(names: list[str], where: str, classes: int) -> None:
    """Refuse class names (labels.txt, data.label_names) that would train a class no row can have, or that
    cannot tell two classes apart. `classes`: the highest class id the labels use, plus one."""
    seen: set[str] = set()
    twice = [n for n in names if n in seen or seen.add(n)]
    if twice:
        raise TformerError(f"{where} names the class {twice[0]!r} more than once; give every class one name, "
                           f"in class id order (line 1 is class 0)")
    if len(names) > classes:
        extra = ", ".join(repr(n) for n in names[classes:classes + 5]) + (", ..." if len(names) > classes + 5 else "")
        raise TformerError(f"{where} names {len(names)} classes but the labels use ids 0..{classes - 1} only (no row "
                           f"has {extra}); remove the extra names or add rows of those classes")


def normalized_text(text: str) -> str:
    """The text as a reader sees it: compatibility forms folded (NFKC), case folded, runs of whitespace as one."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def classes_alike(names: list[str]) -> list[list[str]]:
    """Groups of class names a reader takes for one (`Pos`/`pos`, `" neg"`/`neg`, an NFC and an NFD `café`): a
    stray case or space in a label column trains two classes that split one class's examples."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(normalized_text(str(name)), []).append(str(name))
    return [group for group in groups.values() if len(group) > 1]


def _print_alike(names: list[str]) -> bool:
    """Whether some of the names look the same on a screen (an NFC and an NFD `café`): shown as code points."""
    return len({unicodedata.normalize("NFC", n) for n in names}) < len(names)


def _shown(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def _same_file(a: Path, b: Path) -> bool:
    """The same path, or another path to the same bytes (a copy): sizes first, so big files are hashed only when
    they could be equal."""
    try:
        if a.resolve() == b.resolve():
            return True
        return a.stat().st_size == b.stat().st_size and sha256_file(a) == sha256_file(b)
    except OSError:
        return False


ASCII_SPACE = r"[ \t\n\r\x0b\x0c\x1c-\x1f]+"  # what str.split() splits ASCII text at
UNEVEN_SPACE = r"[\t\n\r\x0b\x0c\x1c-\x1f]|  |^ | $"  # ... where " ".join(text.split()) changes an ASCII text


def _hashes(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(exact, normalized) 64-bit hashes of a block of texts. `normalized_text` of an ASCII text is its lower case
    with whitespace runs as one space and none at the ends: done by Arrow, the whitespace only where it is uneven
    (few texts); other texts go through `normalized_text` one by one."""
    exact = pd.util.hash_array(texts.to_numpy(zero_copy_only=False), categorize=False)
    folded = pc.ascii_lower(texts)
    uneven = np.flatnonzero(pc.fill_null(pc.match_substring_regex(texts, UNEVEN_SPACE), False).to_numpy(
        zero_copy_only=False))
    folded = folded.to_numpy(zero_copy_only=False)
    if len(uneven):
        part = pa.array(folded[uneven], type=texts.type)
        folded[uneven] = pc.utf8_trim(pc.replace_substring_regex(part, ASCII_SPACE, " "), " ").to_numpy(
            zero_copy_only=False)
    others = np.flatnonzero(~pc.string_is_ascii(texts).to_numpy(zero_copy_only=False))
    if len(others):
        folded[others] = [normalized_text(t) for t in texts.take(pa.array(others)).to_pylist()]
    return exact, pd.util.hash_array(folded, categorize=False)


class TrainTexts:
    """The train texts as two sorted arrays of hashes (exact, normalized), asked about every other split: 64 bits,
    so a false match needs billions of texts, and no copy of the texts is kept."""

    def __init__(self, splits, bar=None):
        """splits: a split (datasets.Dataset), or a list of them whose texts all count."""
        parts = []
        for ds in splits if isinstance(splits, (list, tuple)) else [splits]:
            for _, texts in arrow.blocks(ds, "text"):
                parts.append(_hashes(texts))
                if bar is not None:
                    bar.update(len(texts))
        self.exact = np.sort(np.concatenate([p[0] for p in parts])) if parts else np.zeros(0, np.uint64)
        self.normalized = np.sort(np.concatenate([p[1] for p in parts])) if parts else np.zeros(0, np.uint64)

    def kinds(self, texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """(is a train text, is a train text up to case, spacing and Unicode form but not exactly) per text."""
        exact, normalized = _hashes(texts)
        same = _within(exact, self.exact)
        return same, ~same & _within(normalized, self.normalized)


    def known(self, texts: list[str]) -> np.ndarray:
        """Per text of a list, whether it is one of these texts, exactly or up to case, spacing and Unicode form."""
        exact, normalized = self.kinds(pa.array(texts, type=pa.large_string())) if texts else (np.zeros(0, bool),) * 2
        return exact | normalized


def _within(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    at = np.searchsorted(sorted_set, values).clip(max=max(len(sorted_set) - 1, 0))
    return (sorted_set[at] == values) if len(sorted_set) else np.zeros(len(values), dtype=bool)


def overlap(train: TrainTexts, ds, bar=None) -> dict:
    """How many texts of the split `ds` are train texts, exact and normalized (not exact), with a few examples."""
    out = {"rows": len(ds), "exact": 0, "normalized": 0, "exact_examples": [], "normalized_examples": []}
    for _, texts in arrow.blocks(ds, "text"):
        if bar is not None:
            bar.update(len(texts))
        for kind, found in zip(("exact", "normalized"), train.kinds(texts)):
            out[kind] += int(found.sum())
            room = EXAMPLES - len(out[f"{kind}_examples"])
            if room > 0 and found.any():
                picked = texts.take(pa.array(np.flatnonzero(found)[:room])).to_pylist()
                out[f"{kind}_examples"] += [_shown(t) for t in picked]
    return out


def _class_counts(ds) -> np.ndarray:
    """Rows per class id (a multi-label row counts once for each of its labels)."""
    labels = arrow.column(ds, "label")
    if pa.types.is_list(labels.type) or pa.types.is_large_list(labels.type):
        labels = pc.list_flatten(labels)
    values = labels.to_numpy() if len(labels) else np.zeros(0, dtype=np.int64)
    return np.bincount(values.astype(np.int64)) if len(values) else np.zeros(0, dtype=np.int64)


def _percent(n: int, total: int) -> str:
    share = 100 * n / max(total, 1)
    return f"{n:,} of {total:,} rows ({share:.0f}%)" if share >= 1 else f"{n:,} of {total:,} rows ({share:.1g}%)"


def build(data, evaluated: str | None = None) -> dict:
    """The findings on loaded data (sources.LoadedData): for `train` (evaluated=None) validation and test against
    train, and the same file given for train and another split refused; for `evaluate` the evaluated split against
    train, a same file only warned about (scoring on training data can be deliberate). Raises TformerError for a
    refusal; returns the report (its `warnings`: one line each, as written; `check` escapes them to print)."""
    splits = data.splits
    compared = [s for s in ("validation", "test") if s in splits] if evaluated is None else \
        [evaluated] if evaluated != "train" else []
    report: dict = {"checked": "train" if evaluated is None else f"evaluate {evaluated}", "splits": {},
                    "same_file_as_train": [], "overlap_with_train": {}, "classes_without_train_rows": [],
                    "label_names_read_as_missing_by_pandas": [], "classes_alike": [],
                    "class_names_that_are_numbers": [], "warnings": []}
    warnings = report["warnings"]
    for split, ds in splits.items():
        report["splits"][split] = {"rows": len(ds), "dropped_texts_without_visible_characters":
                                   int(getattr(data, "dropped", {}).get(split, 0))}
        if len(ds) == 0:
            raise TformerError(f"the {split} split has no rows; give it rows, or leave its file out to carve it from "
                               f"train")
    files = {s: Path(p) for s, p in (getattr(data, "files", None) or {}).items()}
    for split in [s for s in files if s != "train"]:
        if "train" in files and _same_file(files["train"], files[split]):
            report["same_file_as_train"].append(split)
            if evaluated is None:
                raise TformerError(f"data.{split}_file {files[split]} is the train file; a model scored on the texts "
                                   f"it trained on looks better than it is: give a separate {split} file, or leave "
                                   f"data.{split}_file out to carve one from train")
            if split == evaluated:
                warnings.append(f"{split}: {files[split]} is the training file: these scores are on texts the model "
                                f"trained on")
    rows = len(splits["train"]) + sum(len(splits[s]) for s in compared) if compared else 0
    with progress(total=rows, desc="checking for train texts in other splits", unit="text") as bar:
        train = TrainTexts(splits["train"], bar) if compared else None
        found_in = {split: overlap(train, splits[split], bar) for split in compared}
    for split in compared:
        found = found_in[split]
        report["overlap_with_train"][split] = found
        rows = found["rows"]
        if found["exact"]:
            warnings.append(f"{split}: {_percent(found['exact'], rows)} are copies of train texts (e.g. "
                            f"{found['exact_examples'][0]!r}); their scores overstate the model: "
                            f"drop them from one of the splits")
        if found["normalized"]:
            warnings.append(f"{split}: {_percent(found['normalized'], rows)} are train texts up to case, spacing or "
                            f"Unicode form (e.g. {found['normalized_examples'][0]!r})")
    names = list(data.label_names)
    # what follows is about the training data: recorded for evaluate too, but said only where a run can act on it
    warnings = warnings if evaluated is None else []
    if "train" in splits:
        counts = np.pad(_class_counts(splits["train"]), (0, len(names)))
        missing = [names[i] for i in np.flatnonzero(counts[:len(names)] == 0)]
        report["classes_without_train_rows"] = missing
        if missing:
            warnings.append(f"train: no rows of class(es) {', '.join(map(repr, missing[:5]))}; the model cannot "
                            f"learn them: add rows of them or drop their names")
    alike = classes_alike(names)
    report["classes_alike"] = alike
    if alike:
        shown = "; ".join(" / ".join(map(ascii if _print_alike(group) else repr, group)) for group in alike[:3])
        warnings.append(f"{len(alike)} group(s) of class names differ only in case, spacing or Unicode form ({shown}"
                        f"{'; ...' if len(alike) > 3 else ''}): each is a class of its own; if they are one, write "
                        f"its name one way in the label column")
    numbers = [n for n in names if isinstance(n, str) and n.strip().isdigit()]
    report["class_names_that_are_numbers"] = numbers if numbers and len(numbers) < len(names) else []
    if report["class_names_that_are_numbers"]:  # (a CSV's `1` among `ENTY`, `HUM`: a class of its own, or an id?)
        warnings.append(f"class name(s) {', '.join(map(repr, numbers[:5]))} are numbers among names (e.g. "
                        f"{next(n for n in names if n not in numbers)!r}): each is a class of its own here; if they "
                        f"are ids of the named classes, write the names")
    na_like = [n for n in names if n in PANDAS_NA_STRINGS]
    report["label_names_read_as_missing_by_pandas"] = na_like
    if na_like:
        warnings.append(f"class name(s) {', '.join(map(repr, na_like))} are real classes here, but pandas "
                        f"and spreadsheets read them as missing values: rename them if the predictions go there")
    return report


def check(data, out: Path | None = None, evaluated: str | None = None) -> dict:
    """`build`, the block it prints (through the one console), and data_report.json at `out` (None: not saved,
    e.g. a DDP rank that does not write)."""
    report = build(data, evaluated)
    console = output()
    if report["warnings"]:
        console.print(f"[bold]data check[/] {len(report['warnings'])} warning(s):", highlight=False)
        for line in report["warnings"]:
            console.print(f"  [yellow]warning:[/] {markup(line)}", highlight=False)
    else:
        compared = ", ".join(report["overlap_with_train"]) or "no other split"
        console.print(f"[bold]data check[/] ok: no train text in {compared}", highlight=False)
    if out is not None:
        write_json(out, report)
    return report
