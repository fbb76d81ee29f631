"""How a `-m` sweep's jobs are named: short folder names, and override values people can read.

Hydra would name each job's folder after all of its overrides (`0_data.n_test=100,data.n_train=300,...`), and an
Optuna trial's values come as 17-digit floats. A job folder is `<n>_<the values that vary>_<hash>` instead (at most
40 characters for a sweep of up to 999 jobs), e.g. `3_lr-0.0003_seed-2_1c9f0e`: the values the sweep varies
(rounded to 4 significant digits), and a hash of every override, so the same job of a resumed sweep
(`resume=<sweep dir>`: same job number, same overrides) finds its own folder again, and a job whose other overrides
changed gets a new one. The summary keeps every override in full (summary.py). No `=`, `,` or `~` in the
name: a job folder given as a value (`checkpoint=<job dir>`, `model.init=<job dir>`) needs no quoting for Hydra.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import ListConfig, OmegaConf

from . import plan

SIGNIFICANT = 4  # digits of the floats shown in job folder names, job lines and the summary
LABEL_CHARS = 28  # of a job folder name's readable part: `<n>_` + this + `_` + 6 hex digits stays within 40
# a float literal (a decimal point or an exponent) standing alone: not a part of a name or a version like v1.2.3
_FLOAT = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+(?=[eE]))(?:[eE][-+]?\d+)?(?![\w.])")
# not in a folder name: '/' would nest folders; '=', ',', '~', spaces and quotes would need quoting in an override
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


_CURRENT = re.compile(r"^\d+_(?:[A-Za-z0-9._+-]*_)?[0-9a-f]{6}$")  # `<n>_[<label>_]<hash>`, as job_dirname makes


def is_current(folder_name: str) -> bool:
    """A job folder named the way this version names them (an earlier one named them after all the overrides)."""
    return bool(_CURRENT.match(folder_name))


def round_floats(text: str, digits: int = SIGNIFICANT) -> str:
    """`optimizer.lr=0.00031415926535897931` -> `optimizer.lr=0.0003142`; integers and names stay as they are."""
    def short(match: re.Match) -> str:
        try:
            return format(float(match.group()), f".{digits}g")
        except ValueError:
            return match.group()

    return _FLOAT.sub(short, text)


def key(override: str) -> str:
    """An override's key without its +, ++ or ~ prefix (`+trainer.x=1` -> `trainer.x`)."""
    return override.split("=", 1)[0].lstrip("+~")


def swept_keys(sweep_dir: str | Path) -> set[str] | None:
    """The keys a sweep varies, from the multirun.yaml its sweeper wrote before the first job: its comma lists and
    sweep functions (`optimizer.lr=1e-4,3e-4`, `seed=range(3)`) and its `hydra.sweeper.params` (an Optuna search
    space). None when the file cannot be read (a sweeper that writes none)."""
    hydra = plan.saved_hydra(sweep_dir)
    if hydra is None:
        return None
    try:
        given = [str(o) for o in (hydra.get("overrides") or {}).get("task") or []]
        params = (hydra.get("sweeper") or {}).get("params") or {}
        given += [f"{k}={v}" for k, v in params.items()]
    except (AttributeError, TypeError):
        return None
    parser, found = OverridesParser.create(), set()
    for override in given:
        try:
            parsed = parser.parse_override(override)
        except Exception:  # (Hydra's parser raises its own error types) a value it cannot read: call it swept
            found.add(key(override))
            continue
        if parsed.is_sweep_override():
            found.add(parsed.key_or_group.lstrip("+~"))
    return found


def varying(overrides, sweep_dir: str | Path) -> list[str]:
    """A job's overrides whose keys the sweep varies (all of them when that cannot be told), floats rounded."""
    if isinstance(overrides, ListConfig):  # (Hydra's own list: a value like x=${oc.env:HOME} stays as written)
        overrides = OmegaConf.to_container(overrides, resolve=False)
    overrides = [str(o) for o in overrides or [] if key(str(o)) not in ("resume", "hydra.sweep.dir")]
    swept = swept_keys(sweep_dir)
    chosen = [o for o in overrides if swept is None or key(o) in swept]
    return [round_floats(o) for o in chosen or overrides]


def job_dirname(override_dirname: str, overrides, sweep_dir: str) -> str:
    """The part of a job's folder name after `<n>_` (the `tformer_job_dirname` resolver of configs/*.yaml):
    `lr-0.0003_seed-2_1c9f0e`. Keys are shortened to their last part where that is unambiguous; when the
    `key-value` list is too long, the values alone, cut to fit."""
    digest = hashlib.sha1(str(override_dirname).encode()).hexdigest()[:6]
    chosen = sorted(varying(overrides, sweep_dir), key=key)
    if not chosen:
        return digest
    last = [key(o).split(".")[-1] for o in chosen]
    pairs = [(short if last.count(short) == 1 else key(o), o.split("=", 1)[1] if "=" in o else "")
             for o, short in zip(chosen, last)]
    label = "_".join(f"{k}-{v}" for k, v in pairs)
    if len(label) > LABEL_CHARS:
        label = "_".join(v for _, v in pairs)
    label = _UNSAFE.sub("-", label)[:LABEL_CHARS]
    return f"{label}_{digest}"
