"""`tformer suggest` and `tformer_cli.suggest(...)`: a run and unlabelled texts in, the N to label next out, as a
table ready to fill in (selection.py chooses them).

    from tformer_cli import suggest
    picks = suggest("outputs/train/2026-11-22/10-00-00-000000", "unlabeled.csv", n=200)
    picks.to_csv("to_label.csv", index=False)      # text, label (empty), guess, probability, uncertainty

The model scores the whole pool (class probabilities, the calibrated ones when the checkpoint has them: whatever
`Classifier.predict_proba` gives), then runs its encoder again on the uncertain candidates only, for the features
that spread the picks. The texts the run was trained on (its local train / validation / test files, when it read
any) seed that spread and are never suggested again, so the loop train -> suggest -> label -> train again does not
ask twice for a label it has.
"""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import datasets
import numpy as np
import pandas as pd

from ..classifier import MAX_BATCH, Classifier, whole_number
from ..console import output, progress
from ..data import sources
from ..data.visible import has_visible
from ..errors import ArgumentTypeError, ConfigError, TformerError
from ..safe_text import terminal, valid_unicode
from . import selection

POOL_CHUNK = 512  # texts per predict_proba call: the progress bar moves, and memory holds one chunk of windows
MAX_SEEDS = 5000  # labelled texts whose features seed the spread (a seeded sample of more): enough to cover them
TEXT_FORMATS = (".txt",)  # one text per line, besides sources.FORMATS (csv, tsv, json, jsonl, parquet)
READABLE = (*sources.FORMATS, *TEXT_FORMATS)


def read_texts(path: str | Path, text_column: str = "text") -> list[str]:
    """The texts of a CSV / TSV / JSON(L) / parquet file's text column, or of a .txt file's lines. A missing cell
    is an empty text (never suggested); a non-string one (a number) is read as its string."""
    path = readable(path)
    if path.suffix.lower() in TEXT_FORMATS:
        try:
            return path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as exc:
            raise TformerError(f"{terminal(path)} is not valid UTF-8 (byte {exc.start}); convert the file, e.g. "
                               f"`iconv -f latin1 -t utf-8`") from None
    if path.suffix.lower() in (".csv", ".tsv") and _header_only(path):
        return []
    datasets.disable_progress_bars()  # (its 'Generating train split' bar: ours is the reading bar)
    ds = sources.load_files({"pool": path}, text_columns=[text_column])["pool"]
    if text_column not in ds.column_names:
        raise TformerError(f"column {text_column!r} not found in {terminal(path)}; it has columns "
                           f"{', '.join(map(terminal, ds.column_names))}; pass text_column=<name>")
    return ["" if t is None else sources.as_text(t, terminal(path)) for t in ds[text_column][:]]


def readable(path: str | Path) -> Path:
    """A file of texts that exists and is of a format read here, checked before the model loads."""
    path = Path(os.path.expanduser(str(path)))
    if path.is_dir():
        raise TformerError(f"{terminal(path)} is a folder; pass one file of texts ({', '.join(READABLE)})")
    if not path.is_file():
        raise TformerError(f"no such file: {terminal(path)}; check the path")
    if path.suffix.lower() not in READABLE:
        raise TformerError(f"{terminal(path)}: tformer reads texts from {', '.join(READABLE)} files, not "
                           f"{terminal(path.suffix) or 'a file without an extension'}")
    return path


def _header_only(path: Path) -> bool:
    """A CSV / TSV of no rows (empty, or a header alone): datasets refuses it as 'no data', which says less."""
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
    return len(head) < 1 << 16 and sum(bool(line.strip()) for line in head.splitlines()) <= 1


def _as_texts(given, text_column: str, what: str) -> list[str]:
    """Texts from a list of strings, a pandas DataFrame's text column (or a dict of columns, read as train(data=)
    reads one, not as its keys), or a file path."""
    if isinstance(given, (str, Path)):
        return read_texts(given, text_column)
    if isinstance(given, dict):
        try:
            given = pd.DataFrame(given)
        except ValueError as exc:
            raise ArgumentTypeError(f"{what}= as a dict of columns: {exc}") from None
    if hasattr(given, "columns"):  # a pandas DataFrame
        if text_column not in given.columns:
            raise TformerError(f"column {text_column!r} not in the {what} DataFrame; it has "
                               f"{', '.join(map(str, given.columns))}; pass text_column=<name>")
        given = given[text_column]
    if isinstance(given, pd.Series):  # a column: its missing cells are empty texts, as in a DataFrame
        return ["" if _missing(t) else valid_unicode(sources.as_text(t, what)) for t in given]
    try:
        texts = list(given)
    except TypeError:
        raise ArgumentTypeError(f"{what} must be a list of strings, a DataFrame, a dict of columns or a file path, "
                                f"not {type(given).__name__}") from None
    if not all(isinstance(t, str) for t in texts):
        raise ArgumentTypeError(f"{what} must be strings")
    return [valid_unicode(t) for t in texts]  # (a lone surrogate: U+FFFD, as predict reads it)


def _missing(cell) -> bool:
    """A DataFrame cell with no text: None, NaN, or pandas' NA of a `string` column (convert_dtypes() makes them),
    which refuses to be compared as a bool."""
    return pd.api.types.is_scalar(cell) and bool(pd.isna(cell))


def run_data(clf) -> dict:
    """The data settings the run trained with (its saved config's `data`), {} for a checkpoint without one."""
    saved = clf._loaded.saved_config() or {}
    return saved.get("data") or {}


def run_files(data: dict) -> list[Path]:
    """The run's own labelled local files that still exist (train / validation / test), found as its training
    found them: data=files' paths, or a named dataset's folder (data.dir or $TFORMER_DATA_ROOT/<name>)."""
    if not data:
        return []
    try:  # (only the keys that locate files: a config saved by an older version lacks others)
        files = sources.local_files(SimpleNamespace(**{key: data.get(key) for key in sources.LOCATION_KEYS}))
    except TformerError:  # (its folder moved, a file was renamed: nothing of it can be read here)
        return []
    return [path for path in files.values() if path.is_file() and path.suffix.lower() in sources.FORMATS]


def labelled_texts(labelled, clf, text_column: str, quiet: bool = True) -> list[str]:
    """labelled='auto': the run's own files' texts (none for a run that read a named or Hub dataset); None or
    False: none; else texts, a DataFrame or a file, as for the pool."""
    if labelled is None or labelled is False:
        return []
    if isinstance(labelled, str) and labelled == "auto":
        data = run_data(clf)
        column = data.get("text_column") if isinstance(data.get("text_column"), str) else "text"
        texts, files = [], run_files(data)
        for path in files:
            try:
                texts += read_texts(path, column)
            except TformerError:  # a run's file that changed shape since: it only seeds, so it is skipped
                continue
        if not files and not quiet:  # (said, so that no one takes "auto" for "the run's texts are excluded")
            output().print(f"labelled=auto: the run's training data ({terminal(data.get('name') or 'unknown')}) is not "
                           f"in local files here, so no text is excluded as labelled; pass labelled=<its file> to "
                           f"exclude them", highlight=False, markup=False)
        return texts
    return _as_texts(labelled, text_column, "labelled")


def _scored(clf, texts: list[str], batch_size: int, quiet: bool, method: str, thresholds) -> np.ndarray:
    """(len(texts),) uncertainty of each text (NaN: empty), a chunk at a time under a progress bar: a chunk's
    probabilities are reduced to their scores at once (a pool of 100,000 texts over 10,000 classes would be 4 GB)."""
    out = np.full(len(texts), np.nan)
    with progress(total=len(texts), desc="scoring the pool", unit="text", enabled=not quiet) as bar:
        for start in range(0, len(texts), POOL_CHUNK):
            chunk = texts[start:start + POOL_CHUNK]
            out[start:start + len(chunk)] = selection.uncertainty(clf.predict_proba(chunk, batch_size=batch_size),
                                                                  method, thresholds)
            bar.update(len(chunk))
    return out


def _features(clf, texts: list[str], batch_size: int, quiet: bool, desc: str) -> np.ndarray:
    parts = []
    with progress(total=len(texts), desc=desc, unit="text", enabled=not quiet) as bar:
        for start in range(0, len(texts), POOL_CHUNK):
            chunk = texts[start:start + POOL_CHUNK]
            parts.append(clf.embed(chunk, batch_size=batch_size))
            bar.update(len(chunk))
    return np.concatenate(parts) if parts else np.zeros((0, 1), dtype=np.float32)


def _key(text: str) -> str:
    """A text as duplicates are found: ends trimmed, and without the quote a CSV written by suggest put before a
    leading = + - @ (safe_text.csv_cell), so a suggested text labelled and trained on is recognised again."""
    key = text.strip()
    return key[1:] if key[:1] == "'" and key[1:2] in ("=", "+", "-", "@") else key


def suggest(run=None, texts=None, *, n: int = 100, text_column: str | None = None, uncertainty: str = "margin",
            pool_factor: int = 10, labelled="auto", batch_size: int = 64, device: str = "auto",
            outputs_dir: str | Path = "outputs", quiet: bool = False, classifier=None):
    """The n texts most worth labelling next, as a pandas DataFrame in pick order, indexed by each text's row in
    the input (`row`): the text column, an empty label column (named as the run's data had them: text / label by
    default), guess, probability and uncertainty (multi-label: guess is the set over the thresholds, joined by
    the run's label separator, and `closest_label` / `probability` name the label nearest its threshold).

    run: a run dir or checkpoint dir (None: the newest under outputs_dir); classifier: an already loaded
    Classifier instead. texts: a file (csv, tsv, json, jsonl, parquet, txt), a list of strings, a DataFrame or a
    dict of columns (read as train(data=) reads one).
    uncertainty: margin | entropy (selection.py). pool_factor: uncertain candidates per pick that diversity
    chooses among (1: uncertainty only). labelled: 'auto' (the run's own data files), None, or texts / a file:
    never suggested, and the picks keep away from them."""
    n = whole_number(n, "n")
    pool_factor = whole_number(pool_factor, "pool_factor")
    batch_size = whole_number(batch_size, "batch_size", high=MAX_BATCH)
    if uncertainty not in selection.UNCERTAINTY:
        raise ConfigError(f"uncertainty={uncertainty!r} is not one of {', '.join(selection.UNCERTAINTY)}")
    if texts is None:
        raise ArgumentTypeError("suggest() needs texts: a file path, a list of strings or a DataFrame")
    for given in (texts, labelled):  # (files: checked before the model loads)
        if isinstance(given, Path) or (isinstance(given, str) and given != "auto"):
            readable(given)
    clf = classifier or Classifier.load(run, device=device, outputs_dir=outputs_dir)
    data = run_data(clf)
    own_text = data.get("text_column") if isinstance(data.get("text_column"), str) else "text"
    own_label = data.get("label_column") or "label"
    column = text_column or own_text
    pool = _as_texts(texts, column, "texts")
    if not pool:
        raise TformerError("no texts to choose from: the pool is empty")
    seen = labelled_texts(labelled, clf, column, quiet)
    keep = selection.eligible([_key(t) for t in pool], [_key(t) for t in seen], has_visible)
    if not len(keep) and seen and isinstance(labelled, str) and labelled == "auto":
        raise ConfigError(f"none of the {len(pool):,} texts in the pool can be suggested: each is empty, repeated or "
                          f"already in the run's labelled data; add new texts, or pass labelled=none (None from "
                          f"Python) to choose among the labelled ones too")
    if not len(keep):
        raise ConfigError(f"none of the {len(pool):,} texts in the pool can be suggested (each is empty, repeated or "
                          f"in labelled=); add texts")
    if n > len(keep):
        dropped = len(pool) - len(keep)
        raise ConfigError(f"n={n} is more than the {len(keep)} texts that can be suggested ({len(pool)} in the pool, "
                          f"{dropped} of them empty, repeated or already labelled); ask for n={max(len(keep), 1)} "
                          f"or fewer, or add texts")
    thresholds = clf.thresholds if clf.multi_label else None
    if not quiet:  # (a big pool's first progress line comes a while later in a log)
        output().print(f"scoring the {len(pool):,} texts of the pool ({len(keep):,} of them can be suggested)",
                       highlight=False)
    pool_scores = _scored(clf, pool, batch_size, quiet, uncertainty, thresholds)
    seeds = None
    if seen and pool_factor > 1:
        rng = np.random.default_rng(0)
        sample = [seen[i] for i in sorted(rng.choice(len(seen), min(len(seen), MAX_SEEDS), replace=False))]
        seeds = _features(clf, sample, batch_size, quiet, "features of the labelled texts")
        seeds = seeds[np.isfinite(seeds).all(1)]
    features = lambda rows: _features(clf, [pool[i] for i in rows], batch_size, quiet, "features of the candidates")
    picks = selection.select_scored(pool_scores, n, features=features, labelled_features=seeds,
                                    pool_factor=pool_factor, among=keep)
    scores = pool_scores[picks]
    picked = clf.predict_proba([pool[i] for i in picks], batch_size=batch_size)  # (n, C): the picks' own, again
    # named as the run's training file names them, so labelled rows append to it as they are
    rows = {own_text: [pool[i] for i in picks], own_label: [None] * len(picks)}
    labels = clf.labels
    if clf.multi_label:
        separator = data.get("label_separator") or "|"
        p, t = picked, np.asarray(thresholds)[None, :]
        closest = np.argmin(np.abs(p - t) / np.where(p >= t, 1.0 - t, t).clip(min=1e-12), axis=1)
        rows["guess"] = [separator.join(labels[c] for c in np.argsort(-r, kind="stable") if r[c] >= t[0, c])
                         for r in p]
        rows["closest_label"] = [labels[c] for c in closest]
        rows["probability"] = [round(float(r[c]), 6) for r, c in zip(p, closest)]
    else:
        best = picked.argmax(1)
        rows["guess"] = [labels[c] for c in best]
        rows["probability"] = [round(float(picked[j, c]), 6) for j, c in enumerate(best)]
    rows["uncertainty"] = [round(float(s), 6) for s in scores]
    return pd.DataFrame(rows, index=pd.Index(picks, name="row"))
