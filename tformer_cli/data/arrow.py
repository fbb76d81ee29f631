"""A split's columns read as Arrow, a block of rows at a time: the paths that grow with the data (label encoding,
checks, fingerprints, the vocabulary's sample, length statistics) never hold a Python object per row.

A loaded split is a `datasets.Dataset` over memory-mapped Arrow files, possibly with an index mapping (a carved or
filtered split); `with_format("arrow")` reads it through that mapping, so these functions see exactly the rows the
split has, in its order.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .visible import has_visible

BLOCK_ROWS = 65_536  # rows read at a time


def column(ds, name: str) -> pa.ChunkedArray:
    """The whole column (Arrow: no Python objects; memory-mapped where the split is)."""
    got = ds.with_format("arrow")[name]
    return got if isinstance(got, pa.ChunkedArray) else pa.chunked_array([got])


def blocks(ds, name: str, rows: int = BLOCK_ROWS):
    """(first row, a contiguous Arrow array of the column) for each block of `rows` rows, in order."""
    table = ds.with_format("arrow")
    for start in range(0, len(ds), rows):
        part = table[start:start + rows][name]
        yield start, part.combine_chunks() if isinstance(part, pa.ChunkedArray) else part


def numbers(ds, name: str, dtype=np.int64) -> np.ndarray:
    """A numeric column as one numpy array."""
    return column(ds, name).to_numpy().astype(dtype, copy=False)


def take_texts(ds, rows, name: str = "text") -> list[str]:
    """The texts of a few rows (examples, errors.csv), in the order given."""
    rows = np.asarray(rows, dtype=np.int64)
    if not len(rows):
        return []
    return column(ds, name).take(pa.array(rows)).to_pylist()


def sample_rows(n: int, seed: int, lengths: np.ndarray | None = None, budget: int | None = None) -> np.ndarray:
    """Sorted row numbers of a seeded sample: rows in a random order until their `lengths` add up to `budget`
    (every row when they all fit)."""
    if lengths is None or budget is None or int(lengths.sum()) <= budget:
        return np.arange(n)
    order = np.random.default_rng(seed).permutation(n)
    within = np.cumsum(lengths[order]) <= budget
    return np.sort(order[:max(1, int(within.sum()))])


def visible(ds, name: str = "text") -> np.ndarray:
    """Per row, whether its text has a character that shows (data/visible.py's rule; a missing text has none).
    A printable ASCII character settles it in Arrow; only texts without one are asked one by one."""
    out = np.zeros(len(ds), dtype=bool)
    for start, part in blocks(ds, name):
        if not pa.types.is_string(part.type) and not pa.types.is_large_string(part.type):
            rows = part.to_pylist()
            out[start:start + len(part)] = [isinstance(t, str) and has_visible(t) for t in rows]
            continue
        sure = pc.fill_null(pc.match_substring_regex(part, r"[!-~]"), False).to_numpy(zero_copy_only=False)
        rest = np.flatnonzero(~sure & pc.is_valid(part).to_numpy(zero_copy_only=False))
        if len(rest):
            sure[rest] = [has_visible(t) for t in part.take(pa.array(rest)).to_pylist()]
        out[start:start + len(part)] = sure
    return out


def text_lengths(ds, name: str = "text") -> np.ndarray:
    """Characters per text (int64), read a block at a time."""
    out = np.zeros(len(ds), dtype=np.int64)
    for start, part in blocks(ds, name):
        out[start:start + len(part)] = pc.fill_null(pc.utf8_length(part), 0).to_numpy()
    return out
