"""Strings that come from users or files (texts, label names, paths) shown safely: never interpreted as rich
markup, never able to drive the terminal (escape sequences), never parsed as matplotlib mathtext, never run as a
spreadsheet formula, never a raw control character inside a JSON line."""
from __future__ import annotations

import json
import re

# C0 controls but tab and newline, DEL, C1 controls (ESC and U+009B start CSI/OSC sequences that move the cursor,
# clear the screen or set the window title), the bidirectional embeddings, overrides and isolates (U+202A-202E,
# U+2066-2069: a label holding one shows the rest of its line reversed, "Trojan Source"; the marks U+200E/200F
# stay), and lone surrogates (undecodable bytes of a command line or a file name: printing one raises
# UnicodeEncodeError).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
# What json.dumps(ensure_ascii=False) leaves raw that a terminal or a line-based reader acts on: DEL, C1 controls,
# the Unicode line/paragraph separators (a line break to JavaScript and some log tools), lone surrogates.
_JSON_RAW = re.compile(r"[\x7f-\x9f\u2028\u2029\ud800-\udfff]")
# A spreadsheet reads a cell that starts with one of these as a formula (OWASP CSV injection).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def terminal(s: object) -> str:
    """The string with control characters replaced by U+FFFD, so printing it cannot change the terminal."""
    return _CONTROL.sub("\ufffd", str(s))


def rich(s: object):
    """A rich Text of the (terminal-safe) string: shown as written, its brackets never read as markup."""
    from rich.text import Text  # deferred: console imports this module on predict's path, which needs no rich

    return Text(terminal(s))


def markup(s: object) -> str:
    """The string escaped for inclusion inside a rich markup string."""
    from rich.markup import escape  # deferred: as in rich()

    return escape(terminal(s))


def mathtext(s: object) -> str:
    """The string for matplotlib labels: dollar signs escaped, so `$x$` is not parsed as TeX."""
    return terminal(s).replace("$", r"\$")


def json_line(obj) -> str:
    """One JSON line whose every control character is a \\uXXXX escape (json.dumps escapes C0 only): `--json`
    output piped to a terminal or a line reader cannot drive it. Other non-ASCII characters stay readable."""
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False)
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def csv_cell(value):
    """A CSV cell a spreadsheet shows as text: a string starting with = + - @, a tab or a carriage return gets a
    leading single quote (OWASP), unless it is a plain number (-0.5 stays a number). Non-strings are unchanged."""
    if not isinstance(value, str) or not value.startswith(_FORMULA_START):
        return value
    try:
        float(value)
        return value
    except ValueError:
        return "'" + value


def csv_row(row):
    """`csv_cell` on each cell of a row (a list, or a dict for csv.DictWriter)."""
    if isinstance(row, dict):
        return {k: csv_cell(v) for k, v in row.items()}
    return [csv_cell(v) for v in row]


def valid_unicode(s: str) -> str:
    """The text with lone surrogates (undecodable bytes kept by Python's surrogateescape, or a broken string from a
    program) replaced by U+FFFD: tokenizers and UTF-8 output cannot encode them."""
    return _SURROGATE.sub("\ufffd", s) if _SURROGATE.search(s) else s


def argv_text(arg: str) -> str:
    """A command-line argument as text: bytes that were not UTF-8 (kept by Python as lone surrogates) decoded with
    replacement (U+FFFD), as a file line is not."""
    try:
        return arg.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a surrogate that surrogateescape did not make
        return valid_unicode(arg)
