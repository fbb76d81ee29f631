"""The options of the commands that start without composing Hydra (export, push, serve, predict): Hydra's start-up
and its config tree are more than these few options need, and `predict` is timed by its users.
One parser, so they all answer `-h` and a mistyped key the same way; yes/no values go through
`yesno.parse_bool` (true/yes/1/on, false/no/0/off), as every other yes/no of tformer does.

export, serve and push take `key=value` or `--key=value` (`--max-batch=8` and `--max_batch=8` alike). predict
takes flags only: its positional arguments are texts, which may be anyone's words, `checkpoint=x` included."""
from __future__ import annotations

import re

from ..errors import TformerError
from ..safe_text import argv_text, terminal
from ..typed_config import same_number
from ..yesno import is_bool_word, parse_bool

KEY_VALUE = re.compile(r"^([a-z_][a-z_-]*)=(.*)$", re.S)
FLAG = re.compile(r"^--([A-Za-z][\w-]*)(?:=(.*))?$", re.S)
SHORT_FLAG = re.compile(r"^-[A-Za-z][\w-]*$")  # one word after -: a flag, never a text


def key_of(name: str) -> str:
    """The option key a flag or key names: `top-k` and `top_k` are both top_k."""
    return name.replace("-", "_")


def flag(arg: str, defaults: dict, command: str, extra: tuple[str, ...] = ()) -> tuple[str, str | None] | None:
    """`--top-k=3` -> ('top_k', '3'); `--json` -> ('json', None); None when arg is not `--<word>[=...]`.
    A flag whose key is not in defaults is refused by name (`extra`: more flags to list, e.g. short ones)."""
    m = FLAG.match(arg)
    if not m:
        return None
    key = key_of(m.group(1))
    if key not in defaults:
        raise TformerError(f"unknown flag {terminal(repr(arg.split('=', 1)[0]))}; {command} knows "
                           f"{', '.join([*flag_names(defaults), *extra, '--help'])}")
    return key, m.group(2)


def flag_name(key: str) -> str:
    return "--" + key.replace("_", "-")


def flag_names(defaults: dict) -> list[str]:
    return [flag_name(k) for k in defaults]


def old_style_key(arg: str, defaults: dict) -> str | None:
    """The known key of a `key=value` argument (dash or underscore spelling), else None."""
    m = KEY_VALUE.match(arg)
    return key_of(m.group(1)) if m and key_of(m.group(1)) in defaults else None


def given(opts: dict, typed: dict, key: str, value: str, spelled: str, yes_no: bool = False) -> None:
    """Put a typed value in; a key typed twice with two values (`checkpoint=A checkpoint=B`) is refused rather
    than settled by the last one, unsaid (the same value twice passes, and so do two spellings of one number,
    `--coverage 0.9 --coverage 0.90`, and for a yes/no key, `yes_no`, of one answer: `--json --json=yes`)."""
    if key in typed and not (typed[key][1] == value or same_number(typed[key][1], value)
                             or yes_no and _same_answer(typed[key][1], value)):
        raise TformerError(f"{terminal(key)} is given twice ({terminal(typed[key][0])} and {terminal(spelled)}); "
                           f"give it once")
    typed[key] = (spelled, value)
    opts[key] = value


def _same_answer(a: str, b: str) -> bool:
    return is_bool_word(a) and is_bool_word(b) and parse_bool(a, "") == parse_bool(b, "")


def parse_key_values(argv: list[str], defaults: dict, usage: str, command: str) -> dict:
    """`defaults` with each `key=value` (or `--key=value`) of argv put in (values stay strings: the command checks
    their types)."""
    opts, typed = dict(defaults), {}
    for arg in argv:
        if arg in ("-h", "--help"):
            print(usage)
            raise SystemExit(0)
        found = flag(arg, defaults, command) if arg.startswith("--") else None
        key = old_style_key(arg, defaults)
        if found is not None:
            if found[1] is None:
                raise TformerError(f"{arg} needs a value: write {arg}=VALUE (or {found[0]}=VALUE)")
            given(opts, typed, found[0], found[1], arg, isinstance(defaults[found[0]], bool))
        elif key is not None:
            given(opts, typed, key, arg.split("=", 1)[1], arg, isinstance(defaults[key], bool))
        else:
            raise TformerError(f"unknown argument {terminal(repr(arg))}; {command} takes "
                               f"{', '.join(f'{k}=' for k in defaults)} (or --key=value)")
    return opts


def parse_flags(argv: list[str], defaults: dict, usage: str, command: str, *, short: dict[str, str],
                switches: tuple[str, ...]) -> tuple[dict, list[str]]:
    """(defaults with each flag's value put in, the texts): `--key VALUE`, `--key=VALUE`, a short flag of `short`
    with its value next, a switch of `switches` alone (true) or `--switch=VALUE`; after `--` everything is a text.
    Every other argument is a text (decoded with U+FFFD where its bytes were not UTF-8), except one shaped like an
    old `key=value` option of a known key: that is refused, so a text can never switch the model or name a file."""
    opts, typed, texts, i, only_texts = dict(defaults), {}, [], 0, False
    while i < len(argv):
        arg = argv[i]
        if only_texts:
            texts.append(argv_text(arg))
        elif arg == "--":
            only_texts = True
        elif arg in ("-h", "--help"):
            print(usage)
            raise SystemExit(0)
        elif arg in short or FLAG.match(arg):
            key, value = (short[arg], None) if arg in short else flag(arg, defaults, command, tuple(short))
            if key in switches:
                value = "true" if value is None else value
            elif value is None:
                if i + 1 >= len(argv):
                    raise TformerError(f"{arg} needs a value; see `tformer {command} --help`")
                i += 1
                value = argv[i]
            given(opts, typed, key, value, arg if "=" in arg or key in switches else f"{arg} {value}",
                  key in switches or isinstance(defaults.get(key), bool))
        elif old_style_key(arg, defaults):
            shown = terminal(arg if len(arg) <= 80 else arg[:77] + "...")
            raise TformerError(f"{shown!r} looks like an option: write --{shown}, or put -- before texts to "
                               f"classify it as text")
        elif SHORT_FLAG.match(arg):
            raise TformerError(f"unknown flag {terminal(repr(arg))}; {command} knows "
                               f"{', '.join([*flag_names(defaults), *short, '--help'])} "
                               f"(put `--` before texts that start with '-')")
        else:
            texts.append(argv_text(arg))
        i += 1
    return opts, texts


def switch_or_word(value, words: tuple[str, ...], flag: str, argv: list[str]):
    """A switch that may also name one of `words` after `=` (predict's --explain[=rollout]): the word, or the yes/no
    (yes meaning words[0]). A word of `words` right after the bare switch is a text to parse_flags; it is refused
    with the spelling that names it (or puts it after --): the user meant one or the other, and a guess would be
    wrong half the time."""
    if isinstance(value, str) and value in words:
        return value
    if isinstance(value, str) and not is_bool_word(value):
        raise TformerError(f"{flag}={terminal(value)!r} must be {' or '.join(words)} ({flag} alone: {words[0]})")
    on = parse_bool(value, flag)
    next_arg = next((argv[i + 1] for i in range(len(argv) - 2, -1, -1) if argv[i] == flag), None)  # (the last one)
    if on and next_arg in words:
        raise TformerError(f"{flag} {next_arg} would read {next_arg!r} as a text: say {flag}={next_arg}, or put the "
                           f"texts after -- ({flag} -- {next_arg})")
    return on
