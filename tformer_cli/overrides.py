"""Overrides from Python values: what `train()` and `audit()` (and an audit's folds) hand Hydra's compose API.

A dict {key: value} becomes the key=value strings `tformer train` takes, each value written as Hydra's override
grammar reads it back; in-memory data (a DataFrame, a dict of columns, a (texts, labels) pair) becomes data=files
overrides naming a parquet file of it, stored once under outputs/data/ by its content's hash, so the run's config
names a file that stays and the same data is the same run (and resumes it).
"""
from __future__ import annotations

import hashlib
import io
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import ArgumentTypeError, ConfigError, TformerError
from .typed_config import typed_overrides
from .safe_text import valid_unicode
from .store.atomic import write_with
from .store.layout import in_memory_data as in_memory_data_path


TEXT_KEYS = ("data.label_names", "data.text_column", "data.label_column")  # names from data: strings, whatever they say


def as_overrides(given, name: str = "train") -> list[str]:
    """A list of key=value strings, from one (as the CLI takes them) or from a dict {key: value}. name: the API
    function the user called, as its errors name it."""
    if isinstance(given, dict):
        return [f"{key}={override_value(key, value, text=key in TEXT_KEYS, name=name)}" for key, value in given.items()]
    try:
        overrides = [] if isinstance(given, (str, bytes)) else list(given)
    except TypeError:  # None, a number: not a list at all
        overrides = None
    if overrides is None or isinstance(given, (str, bytes)) or not all(isinstance(o, str) for o in overrides):
        raise ArgumentTypeError(f"{name}() takes a list of key=value strings, e.g. {name}(['model=small']), or a "
                                f"dict, e.g. {name}({{'model': 'small'}}), not {given!r:.80}")
    return overrides


def override_value(key, value, text: bool = False, name: str = "train") -> str:
    """A Python value as Hydra's override grammar reads it back: true/false, null, [a,b], quoted strings. text: the
    strings are data (label names), never read as another type: `null`, `true` or `1e3` stay strings (a word
    given by a user stays unquoted otherwise, so that {"trainer.epochs": "3"} is the 3 it means). A numpy scalar
    (a count from a DataFrame, np.int64) is the number or bool it holds."""
    if not isinstance(key, str) or not key or any(c.isspace() for c in key):
        raise ArgumentTypeError(f"{name}()'s dict keys are config keys like 'trainer.epochs', not {key!r:.80}")
    if "=" in key:  # (Hydra would fail to parse it, with a traceback)
        raise ArgumentTypeError(f"{name}()'s dict keys are config keys like 'trainer.epochs', not {key!r:.80}; put "
                                f"the value in the dict's value: {name}({{{key.split('=')[0]!r}: ...}})")
    if isinstance(value, np.generic):
        value = value.item()  # np.int64 -> int, np.float64 -> float, np.bool_ -> bool
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name}({{{key!r}: {value!r}}}): {value!r} is not a finite number; give a finite number")
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        plain = value and all((c.isascii() and c.isalnum()) or c in "._-/+~" for c in value) and \
            not (text and _another_type(value))  # (Hydra's grammar reads no unquoted é)
        return value if plain else quoted(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_value(key, v, text, name) for v in value) + "]"
    raise ArgumentTypeError(f"{name}({{{key!r}: {value!r:.60}}}): a value must be a string, number, bool, None or "
                            f"list")


def _another_type(value: str) -> bool:
    """Whether Hydra's grammar reads an unquoted word as something else than a string: a bool, null, or a number
    (1e3, 1_000, inf, nan), as a class named `null` or `1e3` would be read."""
    if value.lower() in ("true", "false", "null"):
        return True
    try:
        float(value.replace("_", ""))
    except ValueError:
        return False
    return True


def quoted(value: str) -> str:
    """A string as a quoted override value that Hydra and OmegaConf give back exactly: data, never configuration.
    OmegaConf would resolve `${...}` (a class named `${oc.env:HOME}` would read the environment), so `${` is
    escaped for it; Hydra's quoted strings escape a quote and the backslashes before a quote (or the closing
    quote), and read every other backslash as itself."""
    value = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", value)  # OmegaConf: `${` as text
    value = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)  # Hydra: a quote inside the quotes
    value = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, value)  # Hydra: backslashes before the closing quote
    return "'" + value + "'"


def in_memory_data(overrides: list[str], splits: dict, name: str = "train") -> list[str]:
    """data=files overrides naming parquet files of the in-memory splits (none given: none). name: the API function
    the user called, as its errors name it."""
    given = {split: frame for split, frame in splits.items() if frame is not None}
    if not given:
        return []
    if "train" not in given:
        raise ArgumentTypeError("validation_data= and test_data= go with data= (the train split)")
    clash = [typed for key, _, typed in typed_overrides(overrides)
             if key in ("data", "data.train_file", "data.validation_file", "data.test_file")]
    if clash:
        raise TformerError(f"{name}(data=...) reads the data given; drop {clash[0]} (or drop data=)")
    return ["data=files", *[f"data.{split}_file={override_value('data', str(stored(frame_of(frame, split), split)))}"
                            for split, frame in given.items()]]  # (quoted: a path may hold , = or spaces)


def frame_of(data, split: str) -> pd.DataFrame:
    """A DataFrame of a DataFrame, a dict of columns, or a (texts, labels) pair; one of no rows is refused here,
    where the argument can be named (parquet of no rows fails later, as an unreadable file)."""
    name = "data" if split == "train" else f"{split}_data"
    frame = _frame_of(data, name)
    if not len(frame):
        raise ConfigError(f"{name}= has no rows; give it labelled texts" + ("" if split == "train" else
                                                                              f", or leave {name}= out"))
    return frame


def _frame_of(data, name: str) -> pd.DataFrame:
    if isinstance(data, pd.DataFrame):
        frame = data
        for c in data.columns:  # (by the column's own key: names need not be strings)
            if data[c].dtype == object or pd.api.types.is_string_dtype(data[c]):
                values = data[c].tolist()
                valid = _valid(values)
                if valid != values:  # (only then: an untouched frame is stored as the same bytes)
                    frame = frame.copy() if frame is data else frame
                    frame[c] = pd.Series(valid, index=data.index, dtype=object)
        return frame
    if isinstance(data, dict):
        try:
            return pd.DataFrame({k: _valid(list(v)) if isinstance(v, (list, tuple)) else v for k, v in data.items()})
        except ValueError as exc:
            raise ArgumentTypeError(f"{name}= as a dict of columns: {exc}") from None
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(_column(part) for part in data):
        texts, labels = (_valid(list(part)) for part in data)
        if len(texts) != len(labels):
            raise ArgumentTypeError(f"{name}=(texts, labels) has {len(texts)} texts and {len(labels)} labels; give "
                                    f"one label per text")
        return pd.DataFrame({"text": texts, "label": labels})
    shown = (f"a {type(data).__name__} of {', '.join(sorted({type(v).__name__ for v in data}))}"
             if isinstance(data, (tuple, list)) and len(data) else type(data).__name__)
    raise ArgumentTypeError(f"{name}= takes a pandas DataFrame, a dict of columns or a (texts, labels) pair, e.g. "
                            f"{name}=(['a fine film', 'dull'], ['pos', 'neg']), not {shown}")


def _column(part) -> bool:
    """Whether one half of a (texts, labels) pair is a column of values (a list, an array, a Series), not a
    single text or number: [1, 2] or ['a', 'b'] is no pair."""
    return hasattr(part, "__iter__") and not isinstance(part, (str, bytes, dict))


def _valid(values: list) -> list:
    """The strings of a column with lone surrogates (a broken string from a program, undecodable bytes kept by
    surrogateescape) as U+FFFD, as texts from files and the command line are read: no encoder takes them."""
    return [valid_unicode(v) if isinstance(v, str) else v for v in values]


def stored(frame: pd.DataFrame, split: str) -> Path:
    """The frame as parquet under outputs/data/<its content's hash>/: the same data is the same file (so the same
    run config, and a resume), and the run's config names a file that stays."""
    buffer = io.BytesIO()
    try:
        frame.to_parquet(buffer, index=False)
    except (ValueError, TypeError, ImportError) as exc:  # pyarrow refuses mixed or odd column types
        raise ArgumentTypeError(f"the {split} data cannot be stored as parquet ({str(exc).splitlines()[0]}); give "
                                f"texts as strings and labels as strings or integers") from None
    content = buffer.getvalue()
    path = in_memory_data_path(hashlib.sha256(content).hexdigest()[:16], split).resolve()
    if not path.is_file():
        write_with(path, lambda tmp: tmp.write_bytes(content))
    return path
