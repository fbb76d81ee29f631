"""Typed configs at the command boundary: the composed Hydra tree becomes plain dataclasses here, once, and the
library below (training/, data/, model/) never sees OmegaConf.

Defaults live in the YAML files only: a dataclass field has no default unless the key is optional by nature,
so a key missing from a YAML file, an unknown key (a typo added with `+`), a value of the wrong type and a number
outside its range (a class's `RANGES`) each fail here with one line naming the dotted key, before any data is read.
NaN and infinities are refused for every number here, in one place (`finite`): a NaN compares false with every
bound, so without this rule it would pass each range check and silently act as 0 or as "off".
"""
from __future__ import annotations

import dataclasses
import math
import re
import sys
import types
import typing
from typing import Any, Union

from .errors import ConfigError
from .yesno import is_bool_word, parse_bool

def plain(node: Any) -> Any:
    """An OmegaConf node (or anything) as plain Python containers, interpolations resolved. OmegaConf is looked up,
    not imported: a node can be one of its containers only once it is loaded, and predict's cold start (a saved
    config read as plain JSON) would pay ~0.2 s importing it (and its parser, antlr4) for nothing."""
    omegaconf = sys.modules.get("omegaconf")
    if omegaconf is not None and isinstance(node, (omegaconf.DictConfig, omegaconf.ListConfig)):
        return omegaconf.OmegaConf.to_container(node, resolve=True)
    return node


def build(cls, node: Any, where: str = ""):
    """Dataclass `cls` from a mapping; `where` is the dotted prefix used in messages (e.g. 'trainer').
    A class with a `from_mapping(dict)` classmethod builds itself (e.g. to gather free-form keys)."""
    data = plain(node)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping of keys, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names, key=str)
    if unknown:
        raise ConfigError(f"{_dotted(where, unknown[0])} is not a known key; {where or 'the config'} takes "
                          f"{', '.join(sorted(names))} (check the spelling; a leading + adds keys that nothing reads)")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = _dotted(where, f.name)
        if f.name in data:
            kwargs[f.name] = _coerce(data[f.name], hints[f.name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{key} is missing; add it to the config file or pass +{key}=<value>")
    check_ranges(cls, kwargs, where)
    return cls(**kwargs)


def number_or_auto(value: Any, key: str, number: str = "a number") -> Any:
    """A field that takes a number or the word auto (any case): `auto` normalised, any other word refused in one
    line; a number is returned as it is (its RANGES check it)."""
    if isinstance(value, str):
        if value.strip().lower() != "auto":
            raise ConfigError(f"{key}={value!r} must be {number} or auto")
        return "auto"
    return value


def finite(value: Any, key: str) -> Any:
    """`value` with every number in it (nested lists and mappings too) checked finite: NaN and +-inf refused."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}={value} must be a finite number (NaN and infinity are not allowed)")
    if isinstance(value, dict):
        for k, v in value.items():
            finite(v, _dotted(key, str(k)))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            finite(v, f"{key}[{i}]")
    return value


def check_ranges(cls, values: dict, where: str = "") -> None:
    """A class's RANGES = {field: (low, high, bounds)}: bounds "[]", "[)", "(]" or "()" say whether low and high
    are allowed; None means unbounded on that side. A None value (an optional key left unset) is not checked; a
    NaN or infinite one is always refused (no field of tformer means anything by them)."""
    for name, value in values.items():
        if isinstance(value, float):
            finite(value, _dotted(where, name))
    for name, (low, high, bounds) in getattr(cls, "RANGES", {}).items():
        value = values.get(name)
        if value is None or isinstance(value, str):  # (a word a number field may take, `auto`: its class checks it)
            continue
        too_low = low is not None and (value < low if bounds[0] == "[" else value <= low)
        too_high = high is not None and (value > high if bounds[1] == "]" else value >= high)
        if too_low and high is not None and high >= 1024:  # a size's sanity cap is no news to who gave 0
            raise ConfigError(f"{_dotted(where, name)}={value} must be {_describe(low, None, bounds)}")
        if too_low or too_high:
            raise ConfigError(f"{_dotted(where, name)}={value} must be {_describe(low, high, bounds)}")


def _describe(low, high, bounds: str) -> str:
    if high is None:
        return f"at least {low}" if bounds[0] == "[" else f"greater than {low}"
    if low is None:
        return f"at most {high}" if bounds[1] == "]" else f"less than {high}"
    excluded = [str(v) for v, b in ((low, bounds[0] == "("), (high, bounds[1] == ")")) if b]
    return f"between {low} and {high}" + (f" ({' and '.join(excluded)} excluded)" if excluded else "")


def _dotted(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _coerce(value: Any, tp: Any, key: str) -> Any:
    if value == "???":
        raise ConfigError(f"{key} is required; pass {key}=<value>")
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Union or isinstance(tp, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, option, key)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0] if len(errors) == 1 else ConfigError(f"{key}={value!r} has the wrong type; see its YAML file")
    if tp is Any:
        return finite(value, key)
    if dataclasses.is_dataclass(tp):
        if hasattr(tp, "from_mapping"):
            if not isinstance(value, dict):
                raise ConfigError(f"{key} must be a mapping of keys, got {value!r}")
            return tp.from_mapping(value, key)
        return build(tp, value, key)
    if origin in (list, tuple) or tp in (list, tuple):  # (a bare `list` too: a string would be read a letter a time)
        origin = origin or tp
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}={value!r} must be a list, e.g. {key}=[a,b]")
        item = args[0] if args else Any
        out = [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r} must be a mapping, e.g. {key}={{a: 1}}")
        return finite(dict(value), key)
    if tp is bool:
        return parse_bool(value, key)  # true/yes/1/on or false/no/0/off, as every yes/no of tformer
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}={value!r} must be a whole number")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return finite(float(value), key)
        raise ConfigError(f"{key}={value!r} must be a number")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}={value!r} must be a string")
    return value


def typed_overrides(overrides) -> list[tuple[str, str, str]]:
    """(key, value, the override as typed) of each `key=value` on a command line, in order: `+key=`, `++key=` and
    `~key=` name `key`; options (`-m`, `--cfg`) and words without `=` are none. The one reading of typed keys
    (launch, resume, distillation and the checks below use it): light, as launch.py is imported by every
    command before Hydra."""
    out = []
    for typed in overrides:
        if isinstance(typed, str) and "=" in typed and not typed.startswith("-"):
            key, value = typed.split("=", 1)
            out.append((key.lstrip("+~"), value, typed))
    return out


def typed_keys(overrides) -> list[str]:
    """The keys typed on a command line (`data`, `data.dir`, `model.dropout`, ...): what a run derived from another
    (a teacher's, a pretraining run's) takes from the user rather than from that run."""
    return [key for key, _, _ in typed_overrides(overrides)]


def typed_values(overrides, key: str) -> list[str]:
    """The values typed for `key` (`key=`, `+key=`, `++key=`), in order (not a deletion's, `~key=value`)."""
    return [value for name, value, typed in typed_overrides(overrides) if name == key and typed[:1] != "~"]


def given_twice(overrides, name: str = "") -> None:
    """A key given twice with two values (`checkpoint=A checkpoint=B`, `model=tiny model=small`) would be settled by
    its last value, unsaid: refused, naming both. (The same value twice chooses nothing and passes, as do two
    spellings of one number.) Not in a command that resumes: that is the run's own overrides with changes added
    (`trainer.epochs=<more> resume=...`, what the hints print), and the last value is the change. name: the API
    function the user called, as its errors name it; empty for a command line."""
    typed = typed_overrides(overrides)
    if any(key == "resume" and _resumes(value) for key, value, _ in typed):
        return
    seen: dict[str, tuple[str, str]] = {}  # key -> (value, the override as typed)
    for key, value, override in typed:
        if key in seen and seen[key][0] != value and not same_number(seen[key][0], value):
            where = f"{name}(): " if name else ""
            raise ConfigError(f"{where}{key} is given twice ({seen[key][1]} and {override}); give it once")
        seen[key] = (value, override)


PLAIN_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)")


def same_number(a: str, b: str) -> bool:
    """Two spellings of one plain decimal number (0.9 and 0.90, 3 and 03), which choose nothing between them; not
    inf, nan, or 1e3 against 1000."""
    return bool(PLAIN_NUMBER.fullmatch(a.strip()) and PLAIN_NUMBER.fullmatch(b.strip())) and float(a) == float(b)


def _resumes(value: str) -> bool:
    """Whether `resume=<value>` resumes a run (a yes, or a path), as `yesno.bool_or_path` reads it."""
    word = value.strip()
    return word.lower() not in ("", "null") and (not is_bool_word(word) or parse_bool(word, "resume"))
