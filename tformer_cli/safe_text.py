"""Strings that come from users or files (texts, label names, paths) shown safely: never interpreted as rich
markup, never able to drive the terminal (escape sequences), never parsed as matplotlib mathtext."""
from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls (ESC starts CSI/OSC sequences that move the cursor, clear the
# screen or set the window title).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


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
