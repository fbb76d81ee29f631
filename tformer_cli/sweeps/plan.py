"""What a `-m` sweep was asked to run, from the multirun.yaml its sweeper writes before the first job.

A grid's jobs are numbered by their place in the product of its value lists, and each job's folder is named by
that number and a hash of its overrides (naming.py). So a sweep resumed with other values (`seed=1,2,3`, then
`seed=3,4 resume=<sweep dir>`) would give job 0 to `seed=3`: a second job 0, `seed=3` trained twice and counted
twice in the mean over seeds. A resume must therefore give the overrides the sweep began with (`resume_changes`
says what differs); only `data.dir` may change, as the data may have moved (the folder names leave it out too).
The same plan tells `tformer report` of a sweep that died which jobs never started (`planned_jobs`).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import yaml
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from ..store.layout import SweepDir

# keys a resume may change: how the sweep is continued, where its data now is, whether a job may go on with changed
# data (what a job's resume refusal advises); the job folder names leave them out too (configs/train.yaml)
FREE = ("resume", "data.dir", "resume_ignore_data_change")
BASIC_SWEEPER = "BasicSweeper"  # Hydra's grid sweeper (the _target_ multirun.yaml names); Optuna's plans no values


def saved_hydra(sweep_dir: str | Path) -> dict | None:
    """The `hydra` section of the sweep's multirun.yaml ({} when it has none), or None when it cannot be read."""
    try:
        saved = yaml.safe_load(SweepDir(sweep_dir).plan.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    hydra = saved.get("hydra") if isinstance(saved, dict) else None
    return hydra if isinstance(hydra, dict) else {}


def saved_task(sweep_dir: str | Path) -> str | None:
    """The command the sweep ran (train, distill, evaluate, ...: its config's name), or None when unknown."""
    job = (saved_hydra(sweep_dir) or {}).get("job")
    name = job.get("config_name") if isinstance(job, dict) else None
    return str(name) if name else None


def saved_overrides(sweep_dir: str | Path) -> list[str] | None:
    """The command line's overrides the sweep last ran with (hydra.* ones aside), or None when unknown."""
    return _overrides(saved_hydra(sweep_dir) or {}, "task")


def _overrides(hydra: dict, which: str) -> list[str] | None:
    """hydra.overrides.<which> (task: the command line's; hydra: the hydra.* ones) of a saved hydra section."""
    overrides = hydra.get("overrides")
    given = overrides.get(which) if isinstance(overrides, dict) else None
    return [str(o) for o in given] if isinstance(given, list) else None


def _grid(hydra: dict) -> bool:
    sweeper = hydra.get("sweeper")
    return isinstance(sweeper, dict) and BASIC_SWEEPER in str(sweeper.get("_target_"))


def _value(parsed):
    """An override's value as the grid expands it (`seed=range(1,3)` and `seed=1,2` alike: ('1', '2')), else as
    Hydra parses it (`interval(0, 1)` and `interval(0,1)` alike). A shuffled list draws another order each time
    it is expanded: compared as written."""
    if parsed.is_discrete_sweep() and not getattr(parsed.value(), "shuffle", False):
        try:
            return tuple(parsed.sweep_string_iterator())
        except Exception:  # (a glob over config groups needs the config loader: compared as written)
            pass
    if parsed.is_sweep_override() and parsed.is_discrete_sweep():
        return str(parsed.input_line).split("=", 1)[-1]
    return parsed.value()


@dataclass
class _Setting:
    value: object  # what is compared
    typed: str  # the override as written, for messages
    swept: bool


def _settings(overrides: list[str]) -> OrderedDict | None:
    """key -> its setting, in the order Hydra numbers a grid's jobs by (a key given twice keeps its first place
    and its last value, as Hydra's grid does); hydra.* keys and FREE ones left out. None when an override does
    not parse (Hydra then refuses it itself, in its own words)."""
    out: OrderedDict = OrderedDict()
    try:
        for parsed in OverridesParser.create().parse_overrides(overrides):
            if parsed.is_hydra_override() or parsed.key_or_group.lstrip("+~") in FREE:
                continue
            out[parsed.get_key_element()] = _Setting(_value(parsed), str(parsed.input_line),
                                                     parsed.is_sweep_override())
    except Exception:  # Hydra's parser raises its own error types
        return None
    return out


def resume_changes(saved: list[str], given: list[str], grid: bool = True) -> list[str]:
    """How the overrides of a resume differ from those the sweep ran with, one phrase each (none: the same jobs
    under the same numbers). grid: a grid sweep, whose jobs are numbered by the order of its swept keys (an
    Optuna search's trials are not)."""
    before, now = _settings(saved), _settings([a for a in given if not a.startswith("-") and ("=" in a or
                                                                                              a.startswith("~"))])
    if before is None or now is None:
        return []
    changes = [f"{v.typed} (the sweep ran {before[k].typed})" for k, v in now.items()
               if k in before and before[k].value != v.value]
    changes += [f"{v.typed} (not in the sweep)" for k, v in now.items() if k not in before]
    changes += [f"{v.typed} left out" for k, v in before.items() if k not in now]
    swept = lambda settings: [k for k, v in settings.items() if v.swept]
    if grid and not changes and swept(before) != swept(now):
        changes.append(f"the swept keys in another order ({', '.join(swept(now))}; the sweep ran "
                       f"{', '.join(swept(before))}: the jobs would be numbered differently)")
    return changes


def is_grid(sweep_dir: str | Path) -> bool:
    """Whether Hydra's basic (grid) sweeper ran the sweep, as its multirun.yaml names it."""
    return _grid(saved_hydra(sweep_dir) or {})


def saved_hydra_overrides(sweep_dir: str | Path) -> list[str]:
    """The hydra.* overrides the sweep was started with (a launcher, an Optuna trial count), without the ones
    every resume sets itself (hydra.mode, hydra.sweep.dir)."""
    given = _overrides(saved_hydra(sweep_dir) or {}, "hydra") or []
    return [o for o in given if not o.startswith(("hydra.mode=", "hydra.sweep.dir="))]


def planned_jobs(sweep_dir: str | Path) -> list[list[str]] | None:
    """Each job's overrides, in job-number order, of a grid sweep (Hydra's basic sweeper, as it expands them);
    None for another sweeper (an Optuna search picks its values as it goes) or when the plan cannot be read."""
    hydra = saved_hydra(sweep_dir) or {}
    overrides = _overrides(hydra, "task")
    if overrides is None or not _grid(hydra):
        return None
    sweeper = hydra["sweeper"]
    params = sweeper.get("params") if isinstance(sweeper.get("params"), dict) else {}
    try:  # (Hydra's own expansion, not a copy of it)
        parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + overrides)
        (jobs,) = BasicSweeper.split_arguments(parsed, None)
    except Exception:  # a value only the config loader can expand (glob), or one Hydra refuses
        return None
    return [[o for o in job if o.split("=", 1)[0] != "resume"] for job in jobs]
