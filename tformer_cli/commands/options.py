"""The `key=value` options of the commands that start without composing Hydra (export, push, serve, predict):
Hydra's start-up and its config tree are more than these few options need, and `predict` is timed by its users.
One parser, so they all answer `-h` and a mistyped key the same way; yes/no values go through
`yesno.parse_bool` (true/yes/1/on, false/no/0/off), as every other yes/no of tformer does."""
from __future__ import annotations

import re

from ..errors import TformerError

KEY_VALUE = re.compile(r"^([a-z_]+)=(.*)$", re.S)


def parse_key_values(argv: list[str], defaults: dict, usage: str, command: str) -> dict:
    """`defaults` with each `key=value` of argv put in (values stay strings: the command checks their types)."""
    opts = dict(defaults)
    for arg in argv:
        if arg in ("-h", "--help"):
            print(usage)
            raise SystemExit(0)
        m = KEY_VALUE.match(arg)
        if not m or m.group(1) not in defaults:
            raise TformerError(f"unknown argument {arg!r}; {command} takes {', '.join(f'{k}=' for k in defaults)}")
        opts[m.group(1)] = m.group(2)
    return opts
