"""The one yes/no parser: every yes/no value tformer reads (a config key such as trainer.compile, a command option
such as predict's json= or push's private=, TFORMER_DEBUG, HF_HUB_OFFLINE, and resume=) goes through
`parse_bool`, so a spelling means the same thing everywhere.

    yes: true, yes, 1, on        no: false, no, 0, off        (any case, surrounding blanks ignored)

Anything else is refused with one line naming the key, never read as "no".
"""
from __future__ import annotations

import os

from .errors import ConfigError

TRUE = ("true", "yes", "1", "on")
FALSE = ("false", "no", "0", "off")
SPELLINGS = "true or false (or yes/no, on/off, 1/0)"


def parse_bool(value, name: str) -> bool:
    """`value` as a yes/no: a bool is itself; true/yes/1/on mean yes and false/no/0/off mean no, in any case (an
    int 1 or 0, as Hydra parses `key=1`, too). Anything else raises ConfigError (a TformerError: one line, exit
    code 2) naming `name`, the key or option the value was given for."""
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower() if isinstance(value, (str, int)) else None
    if word in TRUE:
        return True
    if word in FALSE:
        return False
    raise ConfigError(f"{name}={value!r} must be {SPELLINGS}")


def is_bool_word(value) -> bool:
    """Whether `parse_bool` reads `value` as a yes/no (rather than refusing it)."""
    return isinstance(value, bool) or (isinstance(value, (str, int)) and str(value).strip().lower() in TRUE + FALSE)


def bool_or_path(value, name: str) -> bool | str | None:
    """A key that takes a yes/no or a path (`resume=`): None or '' (unset) -> None; a `parse_bool` word -> that
    bool (resume=yes is resume=true); anything else -> the path, as a string. A yes/no word that is also an
    existing file or folder here (`resume=yes` beside a folder `yes/`) is refused with one line naming both
    spellings, rather than guessed."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not is_bool_word(value):
        return str(value)
    meant = parse_bool(value, name)
    if not isinstance(value, bool) and os.path.exists(str(value).strip()):
        raise ConfigError(f"{name}={value} is ambiguous: it means {str(meant).lower()}, and ./{str(value).strip()} "
                          f"exists; write {name}={str(meant).lower()} or {name}=./{str(value).strip()}")
    return meant
