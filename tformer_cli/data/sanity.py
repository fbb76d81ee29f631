"""What is wrong with a dataset that loads fine: the checks that run on the loaded splits at the start of every
`train` and `evaluate`, before any token is computed, and the one rule for a text that says nothing.

A model scored on texts it trained on reports a skill it does not have, and nothing in the metrics shows it; a
class no row has is trained as a phantom; a class named `None` is a real class that other tools read as missing.
These are cheap to find (hashes, never pairwise comparisons: IMDB's 50,000 reviews take about a second) and
expensive to find later, so every run checks, prints a short block, and keeps the findings in its run dir
(data_report.json). A mistake that makes the run meaningless is refused in one line; the rest are warnings.

Imports nothing heavy: `classifier.py` (predict's cold start) takes `has_visible` from here.
"""
from __future__ import annotations

import unicodedata
from collections import Counter
from pathlib import Path

from ..console import output
from ..errors import TformerError
from ..safe_text import markup
from ..store.atomic import sha256_file, write_json

# Unicode categories that draw nothing on their own: separators (Zs, Zl, Zp: spaces, line breaks), controls (Cc),
# format characters (Cf: U+200B ZERO WIDTH SPACE, ...), surrogates (Cs) and non-spacing or enclosing marks (Mn, Me:
# combining accents, which decorate a character that is not there). Unassigned (Cn: an emoji newer than Python's
# Unicode tables), private-use (Co) and spacing marks (Mc) may well show, so they count as visible.
_INVISIBLE_CATEGORIES = frozenset({"Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Mn", "Me"})

# pandas.read_csv's default missing-value strings: tformer reads them as text, other tools as "no value".
PANDAS_NA_STRINGS = frozenset({"#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                               "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})
EXAMPLES = 3  # texts shown (and saved) per finding
SHOWN_CHARS = 80


def has_visible(text: str) -> bool:
    """True when the text has a character that shows: anything but spaces, controls, format characters and
    combining marks. A text without one carries nothing to classify: the loaders drop it, predict marks it empty.
    Stops at the first visible character, so long texts cost next to nothing."""
    return any(unicodedata.category(ch) not in _INVISIBLE_CATEGORIES for ch in text)


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


class TrainTexts:
    """The train texts as two sets of hashes (exact, normalized), built once and asked about every other split.
    Python's string hash: 64 bits, so a false match needs billions of texts, and no copy of the texts is kept."""

    def __init__(self, texts):
        self.exact, self.normalized = set(), set()
        for t in texts:
            self.exact.add(hash(t))
            self.normalized.add(hash(normalized_text(t)))

    def kind(self, text: str) -> str | None:
        """'exact', 'normalized' (the same as a train text once case, spacing and Unicode forms are ignored), or
        None for a text training never saw."""
        if hash(text) in self.exact:
            return "exact"
        return "normalized" if hash(normalized_text(text)) in self.normalized else None


def overlap(train: TrainTexts, texts) -> dict:
    """How many of `texts` are train texts, exact and normalized (not exact), with a few examples of each."""
    out = {"rows": len(texts), "exact": 0, "normalized": 0, "exact_examples": [], "normalized_examples": []}
    for text in texts:
        kind = train.kind(text)
        if kind:
            out[kind] += 1
            if len(out[f"{kind}_examples"]) < EXAMPLES:
                out[f"{kind}_examples"].append(_shown(text))
    return out


def _column(ds, name: str) -> list:
    """A column as a list, read in one go (iterating a datasets column reads it row by row: seconds on IMDB)."""
    column = ds[name]
    return column[:] if not isinstance(column, list) else column


def _class_counts(labels) -> Counter:
    counts: Counter = Counter()
    for label in labels:
        counts.update(label if isinstance(label, list) else [label])
    return counts


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
                    "label_names_read_as_missing_by_pandas": [], "warnings": []}
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
    train = TrainTexts(_column(splits["train"], "text")) if compared else None
    for split in compared:
        found = overlap(train, _column(splits[split], "text"))
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
    if "train" in splits:
        counts = _class_counts(_column(splits["train"], "label"))
        missing = [names[i] for i in range(len(names)) if not counts.get(i)]
        report["classes_without_train_rows"] = missing
        if missing:
            warnings.append(f"train: no rows of class(es) {', '.join(map(repr, missing[:5]))}; the model cannot "
                            f"learn them: add rows of them or drop their names")
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
