"""The texts `tformer predict` is given in a file: one per line (a .txt file, standard input, anything not a
table), or the text column of a table (.csv, .tsv, .json, .jsonl, .parquet: the cells as written, as training
reads them), one answer per line or row, blank ones included, so that answers line up with the input."""
from __future__ import annotations

import codecs
import json
import sys
from pathlib import Path

from ..errors import TformerError
from ..safe_text import terminal

TABLES = (".csv", ".tsv", ".json", ".jsonl", ".parquet")  # (data/sources.py FORMATS)


def texts_of(source: str, max_lines: int, max_chars: int, column: str | None = None) -> list[str]:
    """The texts of a file (or standard input for "-"): a table's `column` (None: text), else its lines."""
    if source != "-" and Path(source).suffix.lower() in TABLES:
        return table_texts(Path(source), column or "text", max_lines)
    if column is not None:
        raise TformerError(f"--text-column names a column of a table file ({', '.join(TABLES)}); "
                           f"{'standard input' if source == '-' else terminal(source)} is read one text per line")
    return read_lines(source, max_lines, max_chars)


def table_texts(path: Path, column: str, max_lines: int) -> list[str]:
    """Each row's `column` ('' where missing), read with pandas / pyarrow alone: the column only, at most
    max_lines + 1 rows (a parquet file's count from its footer), nothing cached. A CSV read as lines would label
    its header and each row's label with its text."""
    import pandas as pd  # deferred: predict's start-up, for files that are not tables

    shown, kind = terminal(path), path.suffix.lower()
    if path.is_dir():
        raise TformerError(f"--file {shown} is a folder; give a file")
    if not path.is_file():
        raise TformerError(f"cannot read {shown}: no such file; check the path")
    try:
        if kind == ".parquet":
            import pyarrow.parquet as pq

            table = pq.ParquetFile(path)
            names, rows = table.schema_arrow.names, table.metadata.num_rows
            if column not in names:
                raise _no_column(shown, column, names)
            if rows > max_lines:
                raise _too_many(shown, max_lines)
            values = table.read(columns=[column]).column(column).to_pylist()
        elif kind in (".csv", ".tsv"):
            csv = dict(sep="\t", quoting=3) if kind == ".tsv" else dict(sep=",")  # (TSV: quotes are text, as training)
            names = list(pd.read_csv(path, nrows=0, **csv).columns)
            if column not in names:
                raise _no_column(shown, column, names)
            frame = pd.read_csv(path, usecols=[column], dtype=str, keep_default_na=False, na_values=[""],
                                nrows=max_lines + 1, **csv)
            values = frame[column].tolist()
        else:  # .jsonl: JSON lines; .json: one array of objects, or JSON lines too
            frame = None
            if kind == ".json":
                try:
                    frame = pd.read_json(path, dtype=False)
                except ValueError:  # (JSON lines in a .json file, as training reads them too)
                    pass
            if frame is None:
                frame = pd.read_json(path, lines=True, dtype=False, nrows=max_lines + 1)
            if column not in frame.columns:
                raise _no_column(shown, column, list(frame.columns))
            values = frame[column].tolist()
    except (OSError, ValueError, TypeError, UnicodeDecodeError, ImportError) as exc:  # (TypeError: pandas, a line
        if isinstance(exc, TformerError):  # of JSON lines that is not an object)
            raise
        cause = (bad_utf8_line(path) if isinstance(exc, UnicodeDecodeError) else None) or \
            (bad_json_line(path) if kind in (".json", ".jsonl") else None) or str(exc).splitlines()[0][:200]
        raise TformerError(f"could not read {shown} as {kind.lstrip('.')}: {terminal(cause)}; "
                           f"check the file (UTF-8), or give a .txt file of one text per line") from None
    if len(values) > max_lines:
        raise _too_many(shown, max_lines)
    return ["" if v is None or (isinstance(v, float) and v != v) else _text(v, shown) for v in values]


JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "true/false", type(None): "null"}


def bad_utf8_line(path: Path) -> str | None:
    """Where a file stops being UTF-8, by line ("line 52 is not valid UTF-8 (byte 14 of the line)"): the readers
    name a position in a block of the file at most. Read a line at a time; None where every line decodes."""
    try:
        with open(path, "rb") as f:
            for n, line in enumerate(f, 1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as exc:
                    return f"line {n} is not valid UTF-8 (byte {exc.start} of the line)"
    except OSError:
        return None
    return None


def bad_json_line(path: Path) -> str | None:
    """Where a JSON file that datasets could not read goes wrong, by line ("line 500: Expecting value (column 3)"):
    datasets names a byte position at most. A file that opens with `[` is one JSON array, one that opens with an
    object spread over lines one object of columns; any other is JSON lines, each line an object. None where the
    JSON reads (the cause is elsewhere). JSON lines are read a line at a time."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
            f.seek(0)
            if head.startswith(b"{"):  # one object of columns (its first line alone is no JSON), or JSON lines
                try:
                    json.load(f)
                    return None  # (it reads whole: the cause is elsewhere)
                except json.JSONDecodeError as exc:
                    whole = _json_error(exc.lineno, exc)
                except (ValueError, RecursionError):
                    whole = None
                f.seek(0)
                first = next((line for line in f if line.strip()), b"")
                f.seek(0)
                try:
                    json.loads(first)
                except (ValueError, RecursionError):
                    return whole
            if head.startswith(b"["):
                try:
                    json.load(f)
                except json.JSONDecodeError as exc:
                    return _json_error(exc.lineno, exc)
                except (UnicodeDecodeError, ValueError, RecursionError):
                    return None
                return None
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as exc:
                    return _json_error(n, exc)
                except UnicodeDecodeError:
                    return f"line {n} is not UTF-8"
                except (ValueError, RecursionError):
                    return f"line {n} cannot be read as JSON"
                if not isinstance(value, dict):
                    kind = JSON_KINDS.get(type(value), "value")
                    return f"line {n} is a JSON {kind}, not an object of columns ({{\"text\": ...}})"
    except OSError:
        return None
    return None


def _json_error(line: int, exc: json.JSONDecodeError) -> str:
    return f"line {line}: {exc.msg} (column {exc.colno})"


def _text(value, shown: str) -> str:
    if isinstance(value, (bytes, bytearray)):  # (a parquet binary column: decoded as training decodes it)
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TformerError(f"{shown}: a text is bytes that are not UTF-8 ({exc}); decode the file first") from None
    return str(value)


def _no_column(shown: str, column: str, names) -> TformerError:
    return TformerError(f"{shown} has no {terminal(column)!r} column (it has {terminal(', '.join(map(str, names)))}); "
                        f"pass --text-column NAME, or a .txt file of one text per line")


def _too_many(shown: str, max_lines: int) -> TformerError:
    return TformerError(f"{shown} has more than --max-lines={max_lines} rows; split the file or raise --max-lines")


def read_lines(source: str, max_lines: int, max_chars: int) -> list[str]:
    """The lines of a file (or stdin for "-"), read as a stream: at most max_chars + 1 characters of a line are
    kept (main cuts and counts the longer ones), at most max_lines lines are read, so neither an endless line
    (/dev/zero, a binary file) nor an endless stream ever fills memory. A line that goes on for more than 64 MiB
    (or 40 x max_chars bytes, when more) without an end is refused: it is not text."""
    keep = 4 * (max_chars + 1)  # bytes that hold max_chars + 1 characters (UTF-8: 4 bytes at most each)
    give_up = max(10 * keep, 1 << 26)  # (64 MiB at least: a long document is cut, not refused)
    stream = sys.stdin.buffer if source == "-" else None
    try:
        fh = stream or open(source, "rb")
    except OSError as exc:
        raise TformerError(f"cannot read {terminal(source)}: {exc.strerror}; check the path") from exc
    lines, shown = [], "standard input" if source == "-" else terminal(source)
    with fh:
        for n in range(1, max_lines + 2):
            raw = fh.readline(keep)
            if not raw:
                break
            if n > max_lines:
                raise TformerError(f"{shown} has more than --max-lines={max_lines} lines; split "
                                   f"{'it' if source == '-' else 'the file'} or raise --max-lines")
            cut = len(raw) == keep and not raw.endswith(b"\n")
            seen = len(raw)
            while cut:  # the rest of a long line: read in pieces and dropped
                piece = fh.readline(1 << 16)
                seen += len(piece)
                if not piece or piece.endswith(b"\n"):
                    break
                if seen > give_up:
                    raise TformerError(f"{shown} line {n} runs past {give_up:,} bytes without a line end "
                                       f"(--max-chars={max_chars} keeps the start of long lines); pass a text "
                                       f"file with one text per line")
            try:  # a cut line may end inside a character: the incremental decoder leaves that part out
                line = codecs.getincrementaldecoder("utf-8")().decode(raw, final=not cut)
            except UnicodeDecodeError as exc:
                raise TformerError(f"{shown} line {n} is not valid UTF-8 (byte {exc.start}); convert the file, "
                                   f"e.g. `iconv -f latin1 -t utf-8`") from exc
            lines.append(line[: max_chars + 1] if cut else line.rstrip("\r\n"))  # blank ones too: answers line up
    return lines
