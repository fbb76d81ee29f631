"""The texts `tformer predict` is given in a file: one per line (a .txt file, standard input, anything not a
table), or the text column of a table (.csv, .tsv, .json, .jsonl, .parquet, read as training reads them), one
answer per line or row, blank ones included, so that answers line up with the input."""
from __future__ import annotations

import codecs
import sys
from pathlib import Path

from ..errors import TformerError
from ..safe_text import terminal

TABLES = (".csv", ".tsv", ".json", ".jsonl", ".parquet")  # (data/sources.py FORMATS: read as training reads them)


def texts_of(source: str, max_lines: int, max_chars: int, column: str = "text") -> list[str]:
    """The texts of a file (or standard input for "-"): a table's `column`, else its lines."""
    if source != "-" and Path(source).suffix.lower() in TABLES:
        return table_texts(Path(source), column, max_lines)
    return read_lines(source, max_lines, max_chars)


def table_texts(path: Path, column: str, max_lines: int) -> list[str]:
    """Each row's `column` ('' where missing). A CSV read as lines would label its header and each row's label
    with its text."""
    from .sources import as_text, load_files  # deferred: `datasets`, a second of start-up predict spends on a table

    shown = terminal(path)
    if path.is_dir():
        raise TformerError(f"--file {shown} is a folder; give a file")
    ds = load_files({"file": path}, text_columns=[column])["file"]
    if column not in ds.column_names:
        raise TformerError(f"{shown} has no {terminal(column)!r} column (it has {terminal(', '.join(ds.column_names))})"
                           f"; pass --text-column NAME, or a .txt file of one text per line")
    if len(ds) > max_lines:
        raise TformerError(f"{shown} has more than --max-lines={max_lines} rows; split the file or raise --max-lines")
    return ["" if value is None else as_text(value, shown) for value in ds[column]]


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
    lines, shown = [], terminal(source)
    with fh:
        for n in range(1, max_lines + 2):
            raw = fh.readline(keep)
            if not raw:
                break
            if n > max_lines:
                raise TformerError(f"{shown} has more than --max-lines={max_lines} lines; split the file or raise "
                                   f"--max-lines")
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
