"""Turn a `data` config into train / validation / test splits with a `text` and an integer `label` column.

Every named dataset has two paths: the Hugging Face Hub (or scikit-learn's fetcher) for users with a network,
and a local directory (`data.dir`, or `$TFORMER_DATA_ROOT/<name>`) of parquet / csv / tsv / json / jsonl files
for everyone else. `data=files` takes any local files with configurable column names.
"""
from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import hub
from ..console import heartbeat, output, progress
from ..errors import TformerError
from ..safe_text import markup, terminal
from ..store.atomic import sha256_file
from . import arrow, demo
from .given import bad_json_line, bad_utf8_line
from .config import DataConfig
from .newsgroups import clean, thread
from .sanity import check_label_names, normalized_text
from .visible import has_visible

# How a run carved its validation and test splits: read again from its checkpoint, never from a dataset config
# composed later (evaluate split=validation must score the rows that run held out).
SPLIT_KEYS = ("validation_fraction", "test_fraction", "group_column")
SPLIT_ALIASES = {"train": ["train"], "validation": ["validation", "valid", "val", "dev"], "test": ["test"]}
FORMATS = {".parquet": "parquet", ".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json"}


@dataclass
class LoadedData:
    splits: Any  # datasets.DatasetDict with train / validation / test, columns text (str) and label (ClassLabel)
    label_names: list[str]
    source: str  # where it came from, for the log
    files: dict = field(default_factory=dict)  # split -> the local file it was read from (data/sanity.py compares)
    dropped: dict = field(default_factory=dict)  # split -> texts dropped for having no visible character


def resolve_dir(cfg: DataConfig) -> Path | None:
    """data.dir if set, else $TFORMER_DATA_ROOT/<name> when that folder exists."""
    if cfg.dir:
        path = Path(os.path.expanduser(str(cfg.dir)))
        if not path.is_dir():
            raise TformerError(f"data.dir={cfg.dir} is not a directory; point it at the folder holding "
                               f"train/test files (parquet, csv, tsv, json or jsonl)")
        return path
    root = os.environ.get("TFORMER_DATA_ROOT")
    if root and (Path(root) / str(cfg.name)).is_dir():
        return Path(root) / str(cfg.name)
    return None


def absolute_locations(cfg: DataConfig) -> dict:
    """The data config's local paths made absolute (data.dir, or the folder $TFORMER_DATA_ROOT gave it, and files
    given relative to the working directory), so a checkpoint's saved config finds its data from any directory.
    Files named relative to data.dir stay so."""
    out = {}
    if cfg.dir:
        out["dir"] = str(Path(os.path.expanduser(cfg.dir)).resolve())
    else:
        found = resolve_dir(cfg) if cfg.name not in LOADERS else None  # ($TFORMER_DATA_ROOT/<name>: saved too, so
        if found is not None:  # that evaluate and a resume find it where the variable is not set)
            out["dir"] = str(found.resolve())
        for key in ("train_file", "validation_file", "test_file"):
            value = getattr(cfg, key)
            if value and Path(os.path.expanduser(value)).exists():
                out[key] = str(Path(os.path.expanduser(value)).resolve())
    return out


def _find_split_file(folder: Path, split: str, cfg: DataConfig) -> Path | None:
    explicit = getattr(cfg, f"{split}_file")
    if explicit:
        path = folder / str(explicit)
        if path.is_dir():
            raise TformerError(f"data.{split}_file={explicit} is a folder ({path}); name one file of it")
        if not path.is_file():
            raise TformerError(f"data file not found: {path} (data.{split}_file); check the path, or put the file "
                               f"there")
        return path
    # data.split_names, when set, is the whole mapping (sst2: test <- dev): a split it leaves out is not read
    # from a file (validation is then carved from train), so dev.tsv is not taken as validation as well.
    mapping = cfg.split_names
    aliases = ([mapping[split]] if mapping.get(split) else []) if mapping else SPLIT_ALIASES[split]
    for alias in aliases:
        for ext in FORMATS:
            candidate = folder / f"{alias}{ext}"
            if candidate.is_file():
                return candidate
    return None


def _text_columns(cfg: DataConfig) -> list[str]:
    return [cfg.text_column] if isinstance(cfg.text_column, str) else list(cfg.text_column)


def load_files(files: dict[str, Path], csv_header: bool = True, csv_names: list[str] | None = None,
               text_columns: list[str] = ()):
    """{split: Dataset} of local files. CSV/TSV cells are read as written: pandas would read a class named `None`
    or `NA` and a text `null` as missing values (and a text column of numbers as numbers), so only an empty cell
    is missing and the text columns stay strings, and a column of true / false (a binary label) stays the words
    written. (JSON and parquet keep their own nulls and types.)"""
    datasets.disable_progress_bars()  # (its per-file bars: the one below says which file is read)
    # its file readers log why a file failed, then raise: the one error line below says it (with the cause)
    logging.getLogger("datasets.packaged_modules").setLevel(logging.CRITICAL)
    out = {}
    with progress(total=len(files), desc="reading data files", unit="file") as bar:  # a first read converts to
        for split, path in files.items():  # Arrow, seconds a file: said on a terminal (cached: gone in a blink)
            bar.set_postfix(file=Path(path).name)
            path = Path(path)
            if not path.is_file():
                raise TformerError(f"data file not found: {path}; check the path (relative paths are resolved "
                                   f"from the directory you ran tformer in)")
            fmt = FORMATS.get(path.suffix.lower())
            if fmt is None:
                raise TformerError(f"unsupported data file type {path.suffix!r} for {path}; use one of "
                                   f"{', '.join(FORMATS)}")
            kwargs: dict[str, Any] = {}
            if fmt == "csv":
                kwargs["delimiter"] = "\t" if path.suffix.lower() == ".tsv" else ","
                kwargs.update(keep_default_na=False, na_values=[""], converters={c: str for c in text_columns})
                if path.suffix.lower() == ".tsv":
                    kwargs["quoting"] = 3  # csv.QUOTE_NONE: TSV corpora (GLUE) keep quote characters as text
                if not csv_header:
                    if not csv_names:  # (datasets would name the columns after pandas' index levels)
                        raise TformerError(f"data.header=false: {path.name} has no header line to name its columns; "
                                           f"give them in the file's order, e.g. data.column_names=[text,label]")
                    kwargs["column_names"] = list(csv_names)
                    kwargs["header"] = None
            if fmt == "csv" and csv_header and (twice := _repeated_column(path, kwargs["delimiter"])):
                raise TformerError(f"the header of {path} names the column {twice!r} twice (pandas would read the "
                                   f"second as {twice + '.1'!r}); give each column its own name")
            cache = [None]
            try:
                with heartbeat(f"reading {path.name}", lambda: _megabytes(cache[0])):  # (big files: minutes)
                    cache[0] = Path(_content_cache_dir(path))  # (hashing the file: seconds a GB)
                    out[split] = datasets.load_dataset(fmt, data_files=str(path.resolve()), split="train",
                                                       cache_dir=str(cache[0]), **kwargs)
                    if fmt == "csv" and (flags := [c for c, f in out[split].features.items()
                                                   if getattr(f, "dtype", None) == "bool"]):
                        # pandas reads a column of True / false as booleans: read again as written
                        kwargs["converters"] = {**kwargs["converters"], **{c: str for c in flags}}  # (class names)
                        out[split] = datasets.load_dataset(fmt, data_files=str(path.resolve()), split="train",
                                                           cache_dir=str(cache[0]), **kwargs)
            except Exception as exc:  # datasets raises many types for unreadable files
                if fmt in ("csv", "json") and _no_rows(path, header=fmt == "csv" and csv_header):
                    raise TformerError(f"{path} has no rows{' (a header at most)' if fmt == 'csv' else ''}; give "
                                       f"a file of texts") from exc
                cause = (bad_utf8_line(path) if fmt in ("csv", "json") and _not_utf8(exc) else None) or \
                    (bad_json_line(path) if fmt == "json" else None) or _first_cause(exc)
                raise TformerError(f"could not read {path} as {fmt}: {cause}; check the file's "
                                   f"format and encoding (UTF-8)") from exc
            bar.update(1)
    return out


def _repeated_column(path: Path, delimiter: str) -> str | None:
    """The first column name a CSV/TSV header gives twice (None: none; an empty name is no name). Reads one line."""
    try:
        with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
            header = next(csv.reader(f, delimiter=delimiter), [])
    except (OSError, csv.Error):
        return None
    names = [n.strip() for n in header if n.strip()]
    return next((n for i, n in enumerate(names) if n in names[:i]), None)


def _no_rows(path: Path, header: bool) -> bool:
    """Whether a text file holds no data rows (blank lines aside; its header line when it has one): what datasets
    says as "corresponds to no data". Reads a few lines, whatever the file's size."""
    try:
        with open(path, "rb") as f:
            lines = [line for _, line in zip(range(3), (line for line in f if line.strip()))]
    except OSError:
        return False
    return len(lines) <= (1 if header else 0)


def _chain(exc: BaseException) -> list[BaseException]:
    """An error and the ones under it (datasets wraps the reader's: "An error occurred while generating the
    dataset"), outermost first; a chain that loops back is cut where it does."""
    out = [exc]
    while (inner := out[-1].__cause__ or out[-1].__context__) is not None and inner not in out:
        out.append(inner)
    return out


def _not_utf8(exc: BaseException) -> bool:
    """Whether a reader's error comes from bytes that are not UTF-8."""
    return any(isinstance(e, UnicodeDecodeError) for e in _chain(exc))


def _first_cause(exc: BaseException) -> str:
    """The reason under datasets' wrapper: a byte that is not UTF-8, a malformed line. One line."""
    inner = _chain(exc)[-1]
    shown = (str(inner).strip().splitlines() or [type(inner).__name__])[0]
    return shown if inner is exc else f"{type(inner).__name__}: {shown}"


def _megabytes(folder: Path) -> float:
    """MB of the files under `folder` (what datasets has written of a file's Arrow copy so far)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6 if folder and folder.is_dir() else 0.0


def _content_cache_dir(path: Path) -> str:
    """A datasets cache folder keyed by the file's bytes. datasets keys local files by path and modification time,
    so a file rewritten with its time restored (`cp -p`, `touch -d`, a git checkout, a synced folder) would be
    served from the old cache; under a folder named by the content's SHA-256 it cannot be. The token cache lives
    beside it, so it follows."""
    return str(Path(datasets.config.HF_DATASETS_CACHE) / "tformer" / sha256_file(path)[:32])


def fingerprint(data: LoadedData, splits=("train", "validation")) -> dict:
    """What a run trained on, compact enough for a checkpoint's meta.json: per split the row count and a SHA-256
    of every text and label in order, plus the label names. Resume compares it to refuse changed data. Hashed from
    Arrow a block at a time (the texts joined by NUL, then the labels): no Python string per row."""
    out: dict = {"label_names": list(data.label_names)}
    for split in splits:
        ds = data.splits[split]
        h = hashlib.sha256()
        for _, texts in arrow.blocks(ds, "text"):
            if len(texts):  # each text then a NUL, as text.encode("utf-8") + b"\0" row by row
                one = pa.ListArray.from_arrays(pa.array([0, len(texts)], pa.int32()), texts.cast(pa.large_string()))
                h.update(pc.binary_join(one, pa.scalar("\0", pa.large_string()))[0].as_buffer() or b"")
                h.update(b"\0")
        if _is_label_sets(ds):  # multi-label: the JSON of every row's list of ids, as json.dumps(all rows)
            parts = [json.dumps(labels.to_pylist())[1:-1] for _, labels in arrow.blocks(ds, "label") if len(labels)]
            h.update(("[" + ", ".join(parts) + "]").encode())
        else:
            h.update(arrow.numbers(ds, "label").tobytes())
        out[split] = {"rows": len(ds), "sha256": h.hexdigest()}
    return out


def texts_fingerprint(texts: list[str]) -> dict:
    """The count and SHA-256 of texts held as a list (pretraining's, distillation's unlabeled ones), each then a
    NUL, as `fingerprint` hashes a split's texts: resumes compare it."""
    h = hashlib.sha256()
    for text in texts:
        h.update(text.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return {"rows": len(texts), "sha256": h.hexdigest()}


def _is_label_sets(ds) -> bool:
    return hasattr(ds.features["label"], "feature")  # Sequence(ClassLabel): multi-label


def fingerprint_changes(before: dict, after: dict) -> list[str]:
    """What differs between two fingerprints, in words ('train: 600 -> 300 rows', ...)."""
    changes = []
    if before.get("label_names") != after.get("label_names"):
        shown = lambda names: ", ".join(map(str, (names or [])[:6])) + (", ..." if len(names or []) > 6 else "")
        changes.append(f"labels [{shown(before.get('label_names'))}] -> [{shown(after.get('label_names'))}]")
    for split in sorted(set(before) - {"label_names"}):
        old, new = before[split], after.get(split, {})
        if old.get("rows") != new.get("rows"):
            changes.append(f"{split}: {old.get('rows')} -> {new.get('rows')} rows")
        elif old.get("sha256") != new.get("sha256"):
            changes.append(f"{split}: same {old.get('rows')} rows, different texts or labels")
    return changes


def _read_label_names(folder: Path | None) -> list[str] | None:
    if folder is not None and (folder / "labels.txt").is_file():
        names = [line.strip() for line in (folder / "labels.txt").read_text().splitlines() if line.strip()]
        return names or None
    return None


def _load_hub(cfg: DataConfig):
    hub.offline()  # one quick check instead of half a minute of retries
    try:
        loaded = datasets.load_dataset(str(cfg.hub_id), cfg.hub_config)
        mapping = cfg.hub_split_names
        if mapping:
            loaded = {s: loaded[h] for s, h in mapping.items() if h and h in loaded}
    except Exception as exc:
        raise TformerError(
            f"could not load {cfg.hub_id} from the Hugging Face Hub ({hub.why_unavailable()}: "
            f"{type(exc).__name__}); download the files and pass data.dir=<folder with train/test files>"
        ) from exc
    names = None
    features = loaded[next(iter(loaded))].features
    label_feature = features.get(cfg.hub_label_column or cfg.label_column)
    if label_feature is not None and hasattr(label_feature, "names"):
        names = list(label_feature.names)
    return dict(loaded), names


def _load_newsgroups_sklearn(cfg: DataConfig):
    from sklearn.datasets import fetch_20newsgroups  # (deferred: 1 s of every start, for users with a network)

    out, names = {}, None
    for split in ("train", "test"):
        try:
            bunch = fetch_20newsgroups(subset=split, remove=())
        except Exception as exc:
            raise TformerError(f"could not download 20 Newsgroups ({type(exc).__name__}); with no network, "
                               f"pass data.dir=<folder with train/test parquet files>") from exc
        out[split] = datasets.Dataset.from_dict({"text": list(bunch.data), "label": [int(x) for x in bunch.target]})
        names = list(bunch.target_names)
    return out, names, "scikit-learn fetch_20newsgroups"


def _load_demo(cfg: DataConfig):
    parts = demo.splits(cfg.n_train, cfg.n_validation, cfg.n_test, cfg.seed)
    out = {s: datasets.Dataset.from_dict({"text": t, "label": lab}) for s, (t, lab) in parts.items()}
    return out, list(demo.LABELS), f"generated demo sentences (seed {cfg.seed})"


def _load_listed_files(cfg: DataConfig):
    if not cfg.train_file:
        raise TformerError("data=files needs data.train_file=<path> (and optionally data.validation_file, "
                           "data.test_file)")
    train = Path(os.path.expanduser(str(cfg.train_file)))
    return load_files({"train": train}, cfg.header, cfg.column_names, _text_columns(cfg)), None, "local files"


def _load_folder(cfg: DataConfig, folder: Path):
    files = {s: _find_split_file(folder, s, cfg) for s in SPLIT_ALIASES}
    files = {s: f for s, f in files.items() if f is not None}
    if "train" not in files:
        raise TformerError(f"no train file in {folder}; expected train.parquet, train.csv, train.tsv, "
                           f"train.json or train.jsonl")
    return (load_files(files, cfg.header, cfg.column_names, _text_columns(cfg)), _read_label_names(folder),
            str(folder))


def _load_from_hub(cfg: DataConfig):
    if not cfg.hub_id:
        raise TformerError(f"data={cfg.name} has neither data.dir nor data.hub_id; set data.dir=<folder>")
    out, names = _load_hub(cfg)
    return out, names, f"hub:{cfg.hub_id}"


# A loader returns ({split: Dataset}, label names or None, a description of the source).
Loader = Callable[[DataConfig], tuple[dict, "list[str] | None", str]]
# Datasets that are not files: data.name picks the loader.
LOADERS: dict[str, Loader] = {"demo": _load_demo, "files": _load_listed_files}
# Every other name is a named dataset, read from its local folder (data.dir or $TFORMER_DATA_ROOT/<name>) when
# there is one, else fetched: by its fetcher here, or from the Hugging Face Hub (data.hub_id).
FETCHERS: dict[str, Loader] = {"twenty_newsgroups": _load_newsgroups_sklearn}


def _located(name, folder: Path | None) -> Path:
    """A split file as given: relative names are looked up in data.dir first (like the dataset's own files),
    then in the working directory."""
    path = Path(os.path.expanduser(str(name)))
    if folder is not None and not path.is_absolute() and (folder / path).is_file():
        return folder / path
    return path


def _local_files(cfg: DataConfig, folder: Path | None) -> dict[str, Path]:
    """The files the splits are read from (none for generated, fetched or Hub data)."""
    if cfg.name == "files" and cfg.train_file:
        return {"train": Path(os.path.expanduser(str(cfg.train_file)))}
    if cfg.name in LOADERS or folder is None:
        return {}
    return {s: f for s in SPLIT_ALIASES if (f := _find_split_file(folder, s, cfg)) is not None}


LOCATION_KEYS = ("name", "dir", "train_file", "validation_file", "test_file", "split_names")  # what local_files reads


def local_files(cfg: DataConfig) -> dict[str, Path]:
    """{split: file} of the local files a data config reads, found as loading finds them (a named dataset's
    folder included) but not read: what a run trained on, for `tformer suggest labelled=auto`. Generated,
    fetched and Hub data have none. cfg may be any object with the LOCATION_KEYS (a saved config of an older
    version lacks keys a DataConfig needs)."""
    if not cfg.name:
        return {}
    folder = None if cfg.name in LOADERS else resolve_dir(cfg)
    return {**_local_files(cfg, folder), **_listed(cfg, folder)}


def _listed(cfg: DataConfig, folder: Path | None) -> dict[str, Path]:
    """data.validation_file / data.test_file, where given."""
    return {s: _located(getattr(cfg, f"{s}_file"), folder) for s in ("validation", "test") if getattr(cfg, f"{s}_file")}


# The keys that say how one file is laid out: `tformer evaluate test_file=new.csv data.text_column=body` reads the
# new file with them while the run's own splits keep the run's layout (`load(file_layouts=)`).
FILE_LAYOUT_KEYS = ("text_column", "label_column", "text_separator", "header", "column_names", "label_separator")


DEMO_SIZES = ("n_train", "n_validation", "n_test")


def _read_here(cfg: DataConfig, folder: Path | None) -> None:
    """Settings this data would not read, refused rather than dropped: a train file beside generated or fetched
    data (the run would train on those instead), the demo's sizes beside another dataset (every row trained on)."""
    fetched = folder is None and cfg.name not in LOADERS and (cfg.hub_id or cfg.name in FETCHERS)
    if cfg.train_file and (cfg.name == "demo" or fetched):  # (without a folder or a Hub id: _load_from_hub says so)
        where = "generates its own sentences" if cfg.name == "demo" else "is fetched, not read from a folder"
        raise TformerError(f"data.train_file={cfg.train_file} is read with data=files (data={cfg.name} {where}): "
                           f"add data=files")
    if cfg.dir and cfg.name in LOADERS:  # (a named dataset's folder: data=files reads the files it names)
        fix = "name the files with data.train_file / data.test_file" if cfg.name == "files" else "drop it"
        raise TformerError(f"data.dir={cfg.dir} is the folder of a named dataset (data=imdb, ...); data={cfg.name} "
                           f"does not read it: {fix}")
    sized = [k for k in DEMO_SIZES if getattr(cfg, k, None) is not None]
    if sized and cfg.name != "demo":
        cut = {"n_train": "max_train_samples"}.get(sized[0], "max_eval_samples")
        raise TformerError(f"data.{sized[0]} sizes the generated demo data (data=demo); to use part of "
                           f"data={cfg.name} pass data.{cut}=N")


def _raw_splits(cfg: DataConfig, file_cfgs: dict | None = None) -> tuple[dict, list[str] | None, str, dict]:
    """{split: Dataset} with the configured columns, label names if known, a description of the source, and
    {split: file} of the local files read; a file given for a split of `file_cfgs` is read with that config's
    layout."""
    folder = None if cfg.name in LOADERS else resolve_dir(cfg)
    _read_here(cfg, folder)
    raw, names, source = (LOADERS[cfg.name](cfg) if cfg.name in LOADERS else _load_folder(cfg, folder)
                          if folder is not None else FETCHERS.get(cfg.name, _load_from_hub)(cfg))
    listed = _listed(cfg, folder)
    if listed and _from_hub(source):
        raise TformerError(f"data.validation_file / data.test_file replace splits of local data only; {cfg.name} "
                           f"came from the Hub: download it and pass data.dir=<folder>")
    # data.validation_file / data.test_file: given splits of data=files, or replacements in any local dataset
    # (e.g. `tformer evaluate test_file=new.csv` scores a new file with the training run's data settings)
    files = {**_local_files(cfg, folder), **listed}
    for split, path in listed.items():
        own = (file_cfgs or {}).get(split, cfg)
        raw.update(load_files({split: path}, own.header, own.column_names, _text_columns(own)))
    return raw, names, source, {s: str(p) for s, p in files.items()}


def read_texts(path: Path, columns: list[str] = ("text",), separator: str = " ", key: str = "mlm.extra_files"
               ) -> list[str]:
    """The texts of a parquet / csv / tsv / json / jsonl file: its `columns` joined with `separator` (texts with no
    visible character dropped). Unlabeled text for `tformer pretrain` (mlm.extra_files) and `tformer distill`."""
    if not path.is_file() or path.suffix.lower() not in FORMATS:
        raise TformerError(f"{key}: {path} is not a readable {'/'.join(FORMATS)} file")
    ds = load_files({"unlabeled": path}, text_columns=list(columns))["unlabeled"]
    how = "with the labelled data's text column (data.text_column)" if key == UNLABELED_KEY else "by that column"
    return _joined_texts(ds, list(columns), separator, str(path),
                         lambda column: f"{key} files are read {how}: name the file's column {column!r}")


def _joined_texts(ds, columns: list[str], separator: str, where: str, fix=lambda column: "set data.text_column"
                  ) -> list[str]:
    """The texts of `columns` joined; a missing column refused in one line ending with fix(the column)."""
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise TformerError(f"{where} has no {missing[0]!r} column (it has {', '.join(ds.column_names)}); "
                           f"{fix(missing[0])}")
    rows = zip(*(_column(ds, c) for c in columns))
    texts = [separator.join(str(v) for v in vals if v is not None and str(v).strip()) for vals in rows]
    return [t for t in texts if has_visible(t)]


UNLABELED_KEY = "distill.unlabeled"


def unlabeled_texts(cfg: DataConfig, entry: str) -> tuple[list[str], str]:
    """(texts, where they came from) of one `distill.unlabeled` entry: a file, or a split of the dataset that has no
    labels (IMDB's `unsupervised`), read from the dataset's local folder, else from the Hub. The data config's text
    column(s) and data.remove apply, as to its labelled texts; texts with no visible character are dropped."""
    path = Path(os.path.expanduser(str(entry)))
    folder = None if cfg.name in LOADERS else resolve_dir(cfg)
    if path.suffix.lower() in FORMATS or path.is_file():
        located = _located(entry, folder)
        if not located.is_file():
            raise TformerError(f"distill.unlabeled: {located} does not exist; give a file (parquet, csv, tsv, json, "
                               f"jsonl) or the name of a split of data={cfg.name}")
        texts, where = read_texts(located, _text_columns(cfg), cfg.text_separator, UNLABELED_KEY), str(located)
    elif folder is not None:
        found = next((folder / f"{entry}{ext}" for ext in FORMATS if (folder / f"{entry}{ext}").is_file()), None)
        if found is None:
            raise TformerError(f"distill.unlabeled={entry}: no {entry}.parquet (or .csv, .tsv, .json, .jsonl) in "
                               f"{folder}; give a file or a split name the folder has")
        texts, where = read_texts(found, _text_columns(cfg), cfg.text_separator, UNLABELED_KEY), str(found)
    elif cfg.hub_id and cfg.name not in LOADERS:
        hub.offline()
        try:
            ds = datasets.load_dataset(str(cfg.hub_id), cfg.hub_config, split=str(entry))
        except Exception as exc:
            raise TformerError(f"could not load split {entry!r} of {cfg.hub_id} from the Hugging Face Hub "
                               f"({hub.why_unavailable()}: {type(exc).__name__}); download it and pass "
                               f"distill.unlabeled=<file>") from exc
        column = cfg.hub_text_column or cfg.text_column
        columns = [column] if isinstance(column, str) else list(column)
        texts, where = _joined_texts(ds, columns, cfg.text_separator, f"{cfg.hub_id} {entry}"), f"hub:{cfg.hub_id}:{entry}"
    else:
        raise TformerError(f"distill.unlabeled={entry} is neither a file nor a split of data={cfg.name} (which has no "
                           f"folder or Hub copy to hold one); give a file")
    if cfg.remove:
        texts = [t for t in (clean(t, list(cfg.remove)) for t in texts) if has_visible(t)]
    return texts, where


def _from_hub(source: str) -> bool:
    return source.startswith("hub:")


def _to_text_label(ds, cfg, split: str, from_hub: bool = False, texts_only: bool = False, grouped: bool = False):
    """Rename/derive the configured columns to `text` and `label` (`text` alone: `texts_only`), with a clear error
    for unknown names. Hub copies may name columns differently from the original files (hub_text_column /
    hub_label_column). `grouped`: data.group_column's values too, as `group` (the split is carved, or audited)."""
    text_column = (from_hub and cfg.hub_text_column) or cfg.text_column
    label_column = (from_hub and cfg.hub_label_column) or cfg.label_column
    text_columns = list(text_column) if not isinstance(text_column, str) else [text_column]
    missing = [c for c in text_columns + ([] if texts_only else [label_column]) if c not in ds.column_names]
    if missing:
        raise TformerError(
            f"column {missing[0]!r} not found in the {split} split; it has columns {', '.join(ds.column_names)}; "
            f"set data.text_column{'' if texts_only else ' / data.label_column'}"
        )
    group = cfg.group_column if grouped else None
    if group is not None and group not in ds.column_names and group != "thread":
        if split != "train":  # (audit's folds: a split read from its own file may have no groups; a row is one)
            group = None
        else:
            raise TformerError(f"data.group_column={terminal(repr(group))}: no such column in the train split; it "
                               f"has columns {', '.join(ds.column_names)}; name the column whose rows stay together "
                               f"(or thread: a post's Subject line)")
    if group is not None and group in ds.column_names:  # (a column of that name wins over a derived thread)
        values = arrow.column(ds, group)
        if pa.types.is_nested(values.type):
            raise TformerError(f"data.group_column={terminal(repr(group))}: its cells are lists or mappings; give "
                               f"one value a row (a thread, an author or a customer's name or id)")
        ds = ds.add_column("__group", values)  # (a copy: the group may be the text or the label)
    separator, where = cfg.text_separator, f"the {split} split"
    if text_columns != ["text"]:
        ds = ds.map(lambda b: {"__text": [separator.join(t for t in (as_text(v, where) for v in vals if v is not None)
                                                         if t.strip())
                                          for vals in zip(*(b[c] for c in text_columns))]},
                    batched=True, desc=f"joining text columns ({split})")
    else:
        ds = ds.rename_column("text", "__text")
    if group is not None and "__group" not in ds.column_names:  # thread: derived before headers are removed
        ds = ds.map(lambda b: {"__group": [None if t is None else thread(as_text(t, where)) for t in b["__text"]]},
                    batched=True, features=datasets.Features({**ds.features, "__group": datasets.Value("string")}),
                    desc=f"reading each post's thread ({split})")
        if len(ds) and arrow.column(ds, "__group").null_count == len(ds):
            output().print(f"data.group_column=thread: no text of the {split} split has a Subject: header (read "
                           f"before data.remove strips headers): each row is a group of its own")
    kept = {"__text": "text", **({} if texts_only else {"__label": "label"}), "__group": "group"}
    if not texts_only and label_column != "__label":
        ds = ds.rename_column(label_column, "__label")
    ds = ds.select_columns([c for c in kept if c in ds.column_names]).rename_columns(
        {c: name for c, name in kept.items() if c in ds.column_names})
    feature = ds.features["text"]  # (numbers in a parquet column; a JSON column of mixed cells: datasets' Json)
    if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")):
        ds = ds.map(lambda b: {"text": [None if t is None else as_text(t, where) for t in b["text"]]}, batched=True,
                    features=datasets.Features({**ds.features, "text": datasets.Value("string")}),
                    desc=f"reading texts as strings ({split})")
    return ds


def as_text(value, where: str) -> str:
    """A cell of a text column as a string (`where`: the split or file, for the error). Bytes (a parquet `binary`
    column, a DataFrame of encoded texts) are decoded as UTF-8: str() would train on "b'...'" while predict reads
    the plain text."""
    if isinstance(value, (bytes, bytearray)):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TformerError(f"{where}: its texts are bytes that are not UTF-8 ({exc}); decode them to "
                               f"strings with their encoding first") from None
    if isinstance(value, (list, tuple, dict)):  # (a JSON cell: one text a row, never a structure's repr)
        kind = "a mapping" if isinstance(value, dict) else "a list"
        raise TformerError(f"{where}: a text is {kind} ({terminal(repr(value)[:60])}), not a string; give each row "
                           f"one text (data.text_column names the column; a list of columns joins them)")
    return str(value)


def _labelled(splits: dict, cfg: DataConfig, texts_only: bool, named_files: str) -> dict:
    """The splits that have labels (`load`): one without is left out and said, or, read from a file the user named
    for it, refused (named_files="refuse"), left out and said ("drop") or left out for the caller to say ("quiet")."""
    if texts_only:
        return splits
    kept = {s: ds for s, ds in splits.items() if not _unlabelled(ds, cfg.multi_label)}
    for split in [s for s in splits if s not in kept and s != "train"]:  # (train: refused by the caller)
        named = getattr(cfg, f"{split}_file", None)
        if named and named_files == "refuse":
            carved = " (a validation split is then carved from train)" if split == "validation" else ""
            raise TformerError(f"data.{split}_file={named} has no labels (every label cell is empty or -1); give "
                               f"labelled texts (or the right data.label_column), or drop data.{split}_file={carved}")
        if not named or named_files == "drop":  # ("quiet": the caller says it in its own words)
            output().print(f"{split}: no labels (every label cell is empty or -1), left out")
    return kept


def _unlabelled(ds, multi_label: bool = False) -> bool:
    """A split whose labels are all missing, blank or -1 (GLUE's hidden test labels) cannot be evaluated on. (With
    multi-label data a blank CSV cell is an empty label set, a real answer, but not every one of a split's: that is
    a file without labels, whose every score would be about saying no label.)"""
    if len(ds) == 0:
        return False
    labels = arrow.column(ds, "label")
    if multi_label:
        empty = pc.is_null(labels)
        if _arrow_kind(labels.type) == "str":
            empty = pc.or_(empty, _blank(labels))
        elif pa.types.is_list(labels.type) or pa.types.is_large_list(labels.type):
            empty = pc.or_(empty, pc.equal(pc.list_value_length(labels), 0))
        if bool(pc.all(pc.fill_null(empty, True)).as_py()):
            return True
    hidden = pc.fill_null(pc.equal(labels, -1), False) if _numeric(labels.type) else \
        _blank(labels) if _arrow_kind(labels.type) == "str" and not multi_label else \
        pa.array(np.zeros(len(labels), dtype=bool))
    if not multi_label:
        hidden = pc.or_(hidden, pc.is_null(labels))
    return bool(pc.all(hidden).as_py())


def unseen_labels(split: str, unseen: list, known, fix: str) -> TformerError:
    """The refusal of labels training never saw: the first five and how many more, and a hint when one of them is
    a training class written another way (`hum` for `HUM`, `" neg"` for `neg`)."""
    shown = ", ".join(map(str, unseen[:5])) + (f" and {len(unseen) - 5:,} more" if len(unseen) > 5 else "")
    forms = {normalized_text(k): k for k in known or [] if isinstance(k, str)}
    alike = next(((u, forms[normalized_text(u)]) for u in unseen
                  if isinstance(u, str) and forms.get(normalized_text(u), u) != u), None)
    hint = f" ({alike[0]!r} is the class {alike[1]!r} written another way: fix its case, spacing or Unicode form)" \
        if alike else ""
    return TformerError(f"the {split} split has labels not seen in training: {shown}; {fix}{hint}")


def _numeric(t) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _column(ds, name: str) -> list:
    """A column as one list: iterating `ds[name]` reads row by row (datasets >= 4 returns a lazy Column), ~12 s
    of IMDB's start-up spent before the first line."""
    return ds[name][:]


def _as_int(x):
    """An integer label (int, whole float, or digit string), or None for anything else."""
    try:
        value = int(x) if not isinstance(x, str) else int(x.strip())
    except (TypeError, ValueError):
        return None
    return value if not isinstance(x, float) or float(x).is_integer() else None


def _named_by_source(where: str) -> bool:
    """Names a dataset publishes with itself (a Hub dataset's class names) may list classes no row has; names the
    user wrote (labels.txt, data.label_names) must not."""
    return where.startswith("the label names of")


def _classes_used(splits: dict, names, where: str) -> int:
    """The highest class id any split uses, plus one (what user-written names are checked against)."""
    if _named_by_source(where):
        return len(names)
    highest = [pc.max(labels).as_py() for labels in (arrow.column(ds, "label") for ds in splits.values())
               if _numeric(labels.type) and len(labels)]
    highest = [int(x) for x in highest if x is not None]
    return max(highest) + 1 if highest else 0


def _encode_labels(splits: dict, names: list[str] | None, where: str) -> tuple[dict, list[str]]:
    """Map string labels to ids (sorted names) or validate integer ids against 0..K-1 (K: the names given in
    `where`, if any). Read as Arrow columns (no Python object per row) when the train labels are strings or
    integers, as every loader gives them; anything else takes the general path, which says what is wrong."""
    kind = _arrow_kind(arrow.column(splits["train"], "label").type)
    if kind is None:
        return _encode_labels_listed(splits, names, where)
    train = arrow.column(splits["train"], "label")
    if train.null_count:
        raise TformerError("the train split has rows with no label; drop them or fill the label column")
    distinct = pc.unique(train)
    if len(distinct) < 2:
        raise TformerError(f"the train split has a single class ({train[0].as_py()}); a classifier needs examples "
                           f"of at least two classes")
    if kind == "str":
        names = sorted(distinct.to_pylist())
        value_set = pa.array(names, type=train.type)
        for split, ds in splits.items():
            labels = arrow.column(ds, "label")
            ids = pc.index_in(labels, value_set=value_set) if _arrow_kind(labels.type) == "str" else None
            if ids is None or ids.null_count:
                seen = set(names)
                unseen = sorted({x for x in (pc.unique(labels).to_pylist()) if x not in seen}, key=str)
                raise unseen_labels(split, unseen, names, "add them to the train data or drop those rows")
            splits[split] = _with_labels(ds, ids.to_numpy().astype(np.int64))
    else:
        values = np.unique(train.to_numpy())
        if names:
            check_label_names(list(names), where, _classes_used(splits, names, where))
        k = len(names) if names else len(values)
        _check_ids(values.tolist(), k)
        names = list(names) if names else [str(i) for i in range(k)]
        allowed = set(values.tolist())
        classes = ", ".join(names[int(i)] for i in sorted(allowed)[:8]) + (", ..." if len(allowed) > 8 else "")
        for split, ds in splits.items():
            labels = arrow.column(ds, "label")
            if _arrow_kind(labels.type) == "int" and not labels.null_count and np.isin(labels.to_numpy(), values).all():
                continue
            if _arrow_kind(labels.type) == "str" and not labels.null_count:  # class names where train has ids (a
                ids = pc.index_in(labels, value_set=pa.array(names, type=labels.type))  # labelled file given to a
                if not ids.null_count and np.isin(ids.to_numpy(), values).all():  # model with named classes)
                    splits[split] = _with_labels(ds, ids.to_numpy().astype(np.int64))
                    continue
            words = _arrow_kind(labels.type) == "str" and not labels.null_count and \
                set(pc.unique(pc.utf8_lower(labels)).to_pylist()) <= {"true", "false"} and \
                not {str(n).lower() for n in names} & {"true", "false"}  # (classes named so: another case, said below)
            if pa.types.is_boolean(labels.type) or words:  # (true/false: which of the classes each is, is a guess)
                raise TformerError(f"the {split} split's labels are true/false, which name none of the classes "
                                   f"{classes}; write the class names or their ids")
            if labels.null_count:  # (an empty cell of a file whose other labels are written)
                row = int(np.flatnonzero(pc.is_null(labels).to_numpy(zero_copy_only=False))[0])
                more = labels.null_count - 1
                raise TformerError(f"the {split} split has an empty label (row {row + 1}" + (
                    f", and {more:,} more" if more else "") + "); drop those rows or fill the label column")
            known = {names[int(i)] for i in allowed if 0 <= int(i) < len(names)}  # (a class's name is seen too)
            unseen = sorted({str(x) for x in pc.unique(labels).to_pylist() if _as_int(x) not in allowed
                             and x not in known}, key=lambda v: (len(v), v))
            if not unseen:  # (whole numbers of another type: 1.0)
                continue
            raise unseen_labels(split, unseen, names, f"the classes are {classes} (or their ids); check the split "
                                                      f"files")
    feature = datasets.ClassLabel(names=names)
    return {s: ds.cast_column("label", feature) for s, ds in splits.items()}, names


def _refuse_empty_names(splits: dict) -> None:
    """An empty or blank string label is a missing label, as an empty CSV cell is (read as null), not a class named
    '': refused the same way whatever the file format (an empty cell among word labels too)."""
    for split, ds in splits.items():
        labels = arrow.column(ds, "label")
        if _arrow_kind(labels.type) != "str":
            continue
        blank = pc.or_(pc.is_null(labels), _blank(labels))
        if pc.any(blank).as_py():
            row = int(np.flatnonzero(blank.to_numpy(zero_copy_only=False))[0])
            more = pc.sum(blank).as_py() - 1
            raise TformerError(f"the {split} split has an empty label (row {row + 1}" + (f", and {more:,} more" if more
                               else "") + "); drop those rows or fill the label column")


def _blank(labels):
    """Which string labels are empty or only spaces (a missing label, as an empty CSV cell is)."""
    return pc.fill_null(pc.equal(pc.utf8_trim_whitespace(labels), ""), False)


def _arrow_kind(t) -> str | None:
    """'str' or 'int' for a label column of strings or integers, None for anything else."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    return "int" if pa.types.is_integer(t) else None


def _with_labels(ds, ids: np.ndarray):
    """The split with its label column replaced by `ids` (no rewrite of its texts unless it is a filtered view)."""
    return ds.remove_columns("label").add_column("label", ids)


def _check_ids(values: list[int], k: int) -> None:
    """Integer labels (sorted, distinct) must be 0..k-1; numbered from 1 is named as such."""
    if values and (values[0] < 0 or values[-1] >= k):
        shown = ", ".join(map(str, values[:8])) + (", ..." if len(values) > 8 else "")
        if values == list(range(1, len(values) + 1)):  # numbered from 1 (AG News, Yelp, many CSV exports)
            raise TformerError(f"labels must be 0..{k - 1} for {k} classes, found {shown}: numbered from 1; add "
                               f"data.label_offset=1 to shift them to 0..{len(values) - 1}")
        raise TformerError(f"labels must be 0..{k - 1} for {k} classes, found {shown}; renumber the label column, "
                           f"add a labels.txt naming every class, or use string labels")


def _encode_labels_listed(splits: dict, names: list[str] | None, where: str) -> tuple[dict, list[str]]:
    """`_encode_labels` of labels that are neither strings nor integers (floats, booleans, nested values), read
    as Python values: whole floats are class ids; anything else is refused in one line."""
    train_labels = _column(splits["train"], "label")
    kinds = {type(x).__name__ for x in train_labels if x is not None}
    if any(x is None for x in train_labels):
        raise TformerError("the train split has rows with no label; drop them or fill the label column")
    if len(kinds) > 1:
        raise TformerError(f"the label column mixes types ({', '.join(sorted(kinds))}); use all strings or all "
                           f"integers")
    if len({str(x) for x in train_labels}) < 2:
        raise TformerError(f"the train split has a single class ({train_labels[0]}); a classifier needs examples "
                           f"of at least two classes")
    if kinds & {"list", "tuple", "ndarray"}:
        raise TformerError("the label column holds lists (several labels per text): add data.multi_label=true, or "
                           "give each text one label")
    if kinds - {"str", "int", "float"}:
        raise TformerError(f"labels must be integers or strings, found {', '.join(sorted(kinds))}; convert the "
                           f"label column")
    if kinds == {"float"}:
        fractional = [x for x in train_labels if not float(x).is_integer()]
        if fractional:
            raise TformerError(f"labels must be whole numbers or strings, found {fractional[0]}; tformer classifies "
                               f"(it does not regress): use class ids or names")
    if kinds == {"str"}:
        names = sorted(set(train_labels))
        index = {n: i for i, n in enumerate(names)}
        for split, ds in splits.items():
            unseen = sorted({x for x in _column(ds, "label") if x not in index}, key=str)
            if unseen:
                raise unseen_labels(split, unseen, names, "add them to the train data or drop those rows")
            splits[split] = ds.map(lambda b: {"label": [index[x] for x in b["label"]]}, batched=True,
                                   desc=f"encoding labels ({split})")
    else:
        values = sorted({int(x) for x in train_labels})
        if names:
            check_label_names(list(names), where, _classes_used(splits, names, where))
        k = len(names) if names else len(values)
        _check_ids(values, k)
        names = list(names) if names else [str(i) for i in range(k)]
        for split, ds in splits.items():
            unseen = sorted({str(x) for x in _column(ds, "label") if _as_int(x) not in values}, key=lambda v: (len(v), v))
            if unseen:
                raise TformerError(f"the {split} split has labels not seen in training: "
                                   f"{', '.join(map(str, unseen[:5]))}; check the split files")
    feature = datasets.ClassLabel(names=names)
    splits = {s: ds.cast_column("label", feature) for s, ds in splits.items()}
    return splits, names


def _label_set(value, separator: str, split: str, row: int, listed: bool) -> list:
    """One row's labels as a list: a list as is, a string split on the separator ('' or an empty CSV cell -> no
    label). In a column of lists (JSON, parquet) a null is not a list, and an empty name is not a class: both are
    refused rather than read as "none of the classes"."""
    if value is None:
        if listed:
            raise TformerError(f"the {split} split has a null label (row {row + 1}) in its column of label lists; "
                               f"give [] for a text with none of the classes, or drop the row")
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split(separator) if part.strip()]
    if isinstance(value, (list, tuple)):
        if any(x is None or (isinstance(x, str) and not x.strip()) for x in value):
            raise TformerError(f"the {split} split has an empty or null label name in row {row + 1} "
                               f"({json.dumps(list(value), ensure_ascii=False, default=str)[:80]}); remove it from "
                               f"the list ([] means none of the classes)")
        return list(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value]
    raise TformerError(f"the {split} split has a label of type {type(value).__name__}; with data.multi_label=true "
                       f"give each row a list of labels or a string like 'a{separator}b'")


def _encode_label_sets(splits: dict, names: list[str] | None, separators: dict[str, str], where: str
                       ) -> tuple[dict, list[str]]:
    """Multi-label: every row's label set as a sorted list of ids (a row may have none). String labels are named
    in sorted order; integer labels are checked against 0..K-1 (K from labels.txt / data.label_names if given).
    separators: each split's label_separator (a new file given to evaluate may have its own)."""
    listed = {s: pa.types.is_list(t) or pa.types.is_large_list(t)
              for s, t in ((s, arrow.column(ds, "label").type) for s, ds in splits.items())}
    sets = {s: [_label_set(v, separators[s], s, i, listed[s]) for i, v in enumerate(_column(ds, "label"))]
            for s, ds in splits.items()}
    every = [x for rows in sets.values() for row in rows for x in row]
    if every and all(isinstance(x, str) and x.strip().isdigit() for x in every):  # "0,2": class ids in a string
        sets = {s: [[int(x) for x in row] for row in rows] for s, rows in sets.items()}
    seen = [x for rows in sets["train"] for x in rows]
    kinds = {type(x).__name__ for x in seen}
    if len(kinds) > 1 or kinds - {"str", "int", "float"}:
        raise TformerError(f"labels must be all strings or all integers, found {', '.join(sorted(kinds))}; convert "
                           f"the label column")
    if kinds == {"float"} and any(not float(x).is_integer() for x in seen):
        raise TformerError("labels must be whole numbers or strings; tformer classifies (it does not regress)")
    if kinds == {"str"}:
        names = sorted(set(seen))
        index = {n: i for i, n in enumerate(names)}
    else:
        values = sorted({int(x) for x in seen})
        if names and values:
            used = [int(x) for rows in sets.values() for row in rows for x in row]
            check_label_names(list(names), where, len(names) if _named_by_source(where) else max(used) + 1)
        k = len(names) if names else (values[-1] + 1 if values else 0)
        if values and (values[0] < 0 or values[-1] >= k):
            raise TformerError(f"labels must be 0..{k - 1} for {k} classes, found {values[0]}..{values[-1]}; "
                               f"renumber them, add a labels.txt naming every class, or use string labels")
        names = list(names) if names else [str(i) for i in range(k)]
        index = {i: i for i in range(k)}
    if len(names) < 2:
        raise TformerError(f"the train split uses {len(names)} label(s) ({', '.join(map(str, names))}); a "
                           f"multi-label classifier needs at least two")
    for split, rows in sets.items():
        unseen = sorted({str(x) for row in rows for x in row if (x if kinds == {"str"} else _as_int(x)) not in index})
        if unseen:
            raise TformerError(f"the {split} split has labels not seen in training: {', '.join(unseen[:5])}; add "
                               f"them to the train data or drop those rows")
    feature = datasets.Sequence(datasets.ClassLabel(names=names))
    out = {}
    for split, ds in splits.items():
        ids = [sorted({index[x if kinds == {"str"} else int(x)] for x in row}) for row in sets[split]]
        ds = ds.remove_columns("label").add_column("label", ids)
        out[split] = ds.cast_column("label", feature)
    return out, names


def too_few_to_carve(rows: int, fraction: float, classes: int) -> bool:
    """Whether `fraction` of `rows` cannot be carved with every class on both sides (`_carve`'s stratified rule)."""
    part = int(round(fraction * rows))
    return part < classes or rows - part < classes


def _carve(ds, fraction: float, seed: int, name: str, group: str | None = None):
    """(rest, a stratified seeded `fraction` of ds) with a clear error when ds is too small to split.
    Label sets (multi-label) cannot be stratified, nor texts without labels: their split is random (seeded).
    With a `group` column (data.group_column) whole groups are carved: `_carve_groups`."""
    if "group" in ds.column_names:
        return _carve_groups(ds, fraction, seed, name, group)
    if not hasattr(ds.features.get("label"), "names"):
        if too_few_to_carve(len(ds), fraction, 1):
            raise TformerError(f"the train split has {len(ds)} rows: too few to carve a {name} split of "
                               f"data.{name}_fraction={fraction}; add data or give a {name} file (data.{name}_file)")
        parts = ds.train_test_split(test_size=fraction, seed=seed)
        return parts["train"], parts["test"]
    k = len(ds.features["label"].names)
    if too_few_to_carve(len(ds), fraction, k):
        raise TformerError(f"the train split has {len(ds)} rows: too few to carve a {name} split of "
                           f"data.{name}_fraction={fraction} with every one of its {k} classes on both sides; add "
                           f"data, change the fraction, or give a {name} file (data.{name}_file)")
    labels = arrow.numbers(ds, "label")
    lone = np.bincount(labels, minlength=k)[labels] < 2
    # A class seen once cannot be on both sides: its row stays in train (where the model can learn it) and the
    # rest is stratified as usual. Splits of data without such classes are unchanged by this.
    rest = ds.select(np.flatnonzero(~lone)) if lone.any() else ds
    try:
        parts = rest.train_test_split(test_size=int(round(fraction * len(ds))) if lone.any() else fraction,
                                      seed=seed, stratify_by_column="label")
    except ValueError as exc:  # too few rows of some class for the sizes asked
        raise TformerError(f"cannot carve a stratified {name} split from the train split ({exc}); add examples of "
                           f"the rare classes, change data.{name}_fraction or give a {name} file "
                           f"(data.{name}_file)") from exc
    if not lone.any():
        return parts["train"], parts["test"]
    singles = sorted({markup(ds.features["label"].names[i]) for i in labels[lone]})  # (names are data, not markup)
    output().print(f"{name} split: {len(singles)} class{'es' if len(singles) != 1 else ''} with a single train "
                   f"example kept in train only ({', '.join(singles[:5])}{', ...' if len(singles) > 5 else ''}); "
                   f"the {name} split has none of {'them' if len(singles) != 1 else 'it'}")
    return datasets.concatenate_datasets([parts["train"], ds.select(np.flatnonzero(lone))]), parts["test"]


def group_codes(values: pa.ChunkedArray) -> np.ndarray:
    """Each row's group as 0..G-1, the values numbered in order of first appearance, then a group for each row
    whose value is missing or blank (Arrow's dictionary encoding of one contiguous array: no Python object per row;
    strings as large_string, past 2 GiB)."""
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        values = values.cast(pa.large_string())
        values = pc.if_else(pc.equal(pc.utf8_trim_whitespace(values), ""), pa.scalar(None, values.type), values)
    # (combined first: a split selected from a bigger one reads as a chunk a row, and a dictionary each)
    whole = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    out = pc.fill_null(pc.dictionary_encode(whole).indices, -1).to_numpy().astype(np.int64)
    lone = out < 0
    if lone.any():
        out[lone] = out.max(initial=-1) + 1 + np.arange(int(lone.sum()))
    return out


def group_places(codes: np.ndarray, labels: np.ndarray | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(each group's place in [0, 1), its class), for groups 0..G-1: each class's groups, in a seeded order, laid
    end to end around a circle of that class's rows, turned by a seeded amount of its own; a group's place is where
    its middle row falls. A carve of a fraction f takes the groups placed below f, and k folds give a group the
    fold floor(k x place): every class gives each side its share in expectation, however few or uneven its groups
    (groups of one size spread evenly). A group counts for the class of its first row (labels None: one class)."""
    n_groups = int(codes.max()) + 1 if len(codes) else 0
    sizes = np.bincount(codes, minlength=n_groups).astype(np.float64)
    _, first = np.unique(codes, return_index=True)
    stratum = labels[first] if labels is not None else np.zeros(n_groups, dtype=np.int64)
    rng = np.random.default_rng([seed, 0x6B0])
    order = np.lexsort((rng.random(n_groups), stratum))
    totals = np.bincount(stratum, weights=sizes)
    before = np.empty(n_groups)
    before[order] = np.cumsum(sizes[order]) - sizes[order] - (np.cumsum(totals) - totals)[stratum[order]]
    turn = rng.random(len(totals))
    return ((before + sizes / 2) / np.maximum(totals[stratum], 1) + turn[stratum]) % 1.0, stratum


def carved_rows(codes: np.ndarray, labels: np.ndarray | None, fraction: float, seed: int) -> np.ndarray:
    """Which rows a grouped carve of `fraction` takes (`group_places`). A group holding more than half of its
    class's rows stays in train (one draw would otherwise take most of the class); if no group was placed below
    the fraction, the lowest placed one that may go goes (few groups: a carve does not hang on the seed). Every
    class keeps rows in train: where all of a class's groups were taken its last one stays, and a class whose rows
    all went with other classes' groups gets one of those groups back."""
    place, stratum = group_places(codes, labels, seed)
    sizes = np.bincount(codes, minlength=len(place))
    may = sizes <= np.bincount(stratum, weights=sizes)[stratum] / 2
    chosen = (place < fraction) & may
    if not chosen.any() and may.any():
        chosen[np.flatnonzero(may)[np.argmin(place[may])]] = True
    whole = np.bincount(stratum, weights=chosen) == np.bincount(stratum)  # (per class: every group taken)
    if whole.any():
        groups = np.flatnonzero(whole[stratum])
        groups = groups[np.lexsort((place[groups], stratum[groups]))]
        chosen[groups[np.r_[stratum[groups][1:] != stratum[groups][:-1], True]]] = False  # each class's last
    held = chosen[codes]
    if labels is not None:
        k = int(labels.max()) + 1 if len(labels) else 0
        lost = (np.bincount(labels, minlength=k) > 0) & (np.bincount(labels[~held], minlength=k) == 0)
        if lost.any():
            rows = np.flatnonzero(lost[labels])
            _, first = np.unique(labels[rows], return_index=True)
            chosen[codes[rows[first]]] = False
            held = chosen[codes]
    return held


def _carve_groups(ds, fraction: float, seed: int, name: str, column: str | None):
    """(rest, about `fraction` of ds's rows) with every group (data.group_column) wholly on one side: rows that
    share a thread, an author or a customer would let the model score texts it has nearly seen, and the split
    that chooses the epoch, fits the temperature and the label-set cuts would promise more than new groups get.
    Stratified as far as groups allow (`carved_rows`)."""
    codes = group_codes(arrow.column(ds, "group"))
    names = getattr(ds.features.get("label"), "names", None)
    labels = arrow.numbers(ds, "label") if names else None
    held = carved_rows(codes, labels, fraction, seed)
    n_groups = int(codes.max()) + 1 if len(codes) else 0
    what = f"data.group_column={terminal(repr(column))}" if column else "data.group_column"
    if not held.any():
        raise TformerError(f"{what}: the train split's {len(codes):,} rows fall in {n_groups:,} group"
                           f"{'s' if n_groups != 1 else ''}, none of which can go to a {name} split without leaving "
                           f"a class no train rows (or taking most of them); add rows from more groups, give a "
                           f"{name} file (data.{name}_file) or set data.group_column=null")
    rest, part = ds.select(np.flatnonzero(~held)), ds.select(np.flatnonzero(held))
    note = ""
    if names:
        missing = int(((np.bincount(labels[held], minlength=len(names)) == 0) &
                       (np.bincount(labels, minlength=len(names)) > 0)).sum())
        if missing:
            note = (f"; {missing:,} class{'es' if missing != 1 else ''} with too few groups "
                    f"{'have' if missing != 1 else 'has'} no text in it")
    output().print(f"{name} split: {int(held.sum()):,} texts, {len(np.unique(codes[held])):,} of {n_groups:,} groups "
                   f"by {markup(column or 'group')} (a group's texts stay on one side){note}")
    return rest, part


def load(cfg: DataConfig, seed: int = 0, file_layouts: dict | None = None, texts_only: bool = False,
         keep_groups: bool = False, unlabelled_files: str = "refuse") -> LoadedData:
    """Load, clean, validate and split the dataset named by the `data` config. A refusal that names the test split
    read from a file given for it names the file too: `evaluate test_file=` and `calibrate file=` read theirs as
    the test split, which is not what their user called it. `file_layouts` ({split: {FILE_LAYOUT_KEYS key: value}})
    says how the file given for a split (data.validation_file / data.test_file) is laid out, where that differs from
    the rest of the data. `texts_only` (masked-LM pretraining) reads the text columns alone: a corpus without labels,
    or of one class, is data too; the validation split is carved at random. `keep_groups` (audit's folds) keeps
    data.group_column's values as a `group` column in the splits that have them. A split whose labels are all missing
    (GLUE's hidden test labels) is left out, said in the log; one read from a file the user named
    (data.validation_file / data.test_file) is refused, as a run would otherwise carve or skip it unasked, unless
    `unlabelled_files` is "drop" (a resumed run, which had it left out when it began: said) or "quiet" (evaluate and
    calibrate, which say it in their own words)."""
    unknown = sorted({k for layout in (file_layouts or {}).values() for k in layout} - set(FILE_LAYOUT_KEYS))
    if unknown:
        raise ValueError(f"file_layouts take {', '.join(FILE_LAYOUT_KEYS)}, not {unknown[0]}")
    file_cfgs = {split: dataclasses.replace(cfg, **layout) for split, layout in (file_layouts or {}).items()}
    try:
        return _load(cfg, seed, file_cfgs, texts_only, keep_groups, unlabelled_files)
    except TformerError as exc:
        said = str(exc)
        if type(exc) is not TformerError or not cfg.test_file or "the test split" not in said:
            raise
        raise TformerError(said.replace("the test split", f"the test split ({Path(str(cfg.test_file)).name})", 1)
                           ) from exc


def _load(cfg: DataConfig, seed: int = 0, file_cfgs: dict | None = None, texts_only: bool = False,
          keep_groups: bool = False, unlabelled_files: str = "refuse") -> LoadedData:
    datasets.disable_progress_bars()  # its per-step bars (casting, filtering) would spam terminals and logs
    # its file readers log why a file failed, then raise: the one error line below says it (with the cause)
    logging.getLogger("datasets.packaged_modules").setLevel(logging.CRITICAL)
    raw, names, source, files = _raw_splits(cfg, file_cfgs)
    from_hub = _from_hub(source)
    where = ("data.label_names" if names is None else f"{Path(source) / 'labels.txt'}" if files else
             f"the label names of {source}")  # for the one line that refuses names that do not fit the labels
    splits = {s: _to_text_label(ds, (file_cfgs or {}).get(s, cfg), s, from_hub, texts_only,  # (train: it may be
                                grouped=cfg.group_column is not None and (keep_groups or s == "train"))  # carved)
              for s, ds in raw.items() if s in SPLIT_ALIASES}
    if texts_only:
        cfg, names = dataclasses.replace(cfg, label_offset=0, label_names=None), []  # (no labels to read)
    offset = 0 if from_hub else cfg.label_offset
    if offset and cfg.multi_label:
        raise TformerError("data.label_offset applies to single labels; with data.multi_label=true give label ids "
                           "from 0 or label names")
    if offset:  # e.g. AG News files number classes 1..4
        splits = {s: ds.map(lambda b: {"label": [None if x is None else int(x) - offset for x in b["label"]]},
                            batched=True, desc=f"shifting labels ({s})") for s, ds in splits.items()}
    if names is None and cfg.label_names:
        names = [str(n) for n in cfg.label_names]
    splits = _labelled(splits, cfg, texts_only, unlabelled_files)
    if "train" in raw and "train" not in splits and not texts_only:
        raise TformerError(f"the train split of {source} has no labels (every label cell is empty or -1); check "
                           f"data.label_column")
    if not cfg.multi_label and not texts_only:
        _refuse_empty_names(splits)  # (before any row is dropped: the row named is the file's)
    if "train" not in splits:
        raise TformerError(f"{source} has no train split; it has {', '.join(raw)}")
    remove = list(cfg.remove)
    if remove:
        splits = {s: ds.map(lambda b: {"text": [clean(t, remove) for t in b["text"]]}, batched=True,
                            desc=f"removing {'/'.join(remove)} ({s})") for s, ds in splits.items()}
    dropped = {}
    for split in list(splits):
        ds = splits[split]
        before = len(ds)
        keep = arrow.visible(ds)
        if not keep.all():  # (a split that is all visible, as most are, stays as it was read: no index mapping)
            ds = ds.select(np.flatnonzero(keep))
        if len(ds) == 0:
            raise TformerError(f"the {split} split is empty after dropping empty texts (none of its {before} rows has "
                               f"a visible character); check data.text_column")
        if len(ds) < before:
            dropped[split] = before - len(ds)
            n = dropped[split]
            output().print(f"{split}: skipped {n} text{'s' if n != 1 else ''} with no visible character (empty, or "
                           f"only spaces, zero-width or combining characters)")
        splits[split] = ds
    if texts_only:
        pass
    elif cfg.multi_label:
        separators = {split: (file_cfgs or {}).get(split, cfg).label_separator for split in splits}
        splits, names = _encode_label_sets(splits, names, separators, where)
    else:
        splits, names = _encode_labels(splits, names, where)
    if "test" not in splits and cfg.test_fraction:  # datasets without an official split
        splits["train"], splits["test"] = _carve(splits["train"], cfg.test_fraction, seed, "test", cfg.group_column)
    if "validation" not in splits:
        splits["train"], splits["validation"] = _carve(splits["train"], cfg.validation_fraction, seed, "validation",
                                                       cfg.group_column)
    splits = {s: ds.remove_columns("group") if "group" in ds.column_names and not keep_groups else ds
              for s, ds in splits.items()}
    for split, limit_key in (("train", "max_train_samples"), ("validation", "max_eval_samples"),
                             ("test", "max_eval_samples")):
        limit = getattr(cfg, limit_key)
        if split in splits and limit and len(splits[split]) > int(limit):
            splits[split] = splits[split].shuffle(seed=seed).select(range(int(limit)))
    return LoadedData(datasets.DatasetDict(splits), names, source, files, dropped)
