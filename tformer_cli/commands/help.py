"""`tformer train|evaluate|pretrain|audit --help`: every key with the value this command would use and what it means.

Hydra's own help prints the composed config without the YAML comments that document it, with interpolations
unresolved (`${oc.select:model.recommended_lr,5.0e-4}`) and lists over several lines. Here the config is composed
with the given overrides, resolved, and each key is printed on one line with the comment of the YAML file that
set its value in this composition: the files are read in Hydra's own merge order (its defaults list, `_base`
files and an experiment's overrides included), and the last one that writes a key owns it. A comment never
comes from an option that is not in use (the noam schedule's "unused" does not describe linear_warmup's
warmup_ratio), so the help is as current as the configs themselves (`tformer train model=small --help` shows
`small`'s values and `small`'s comments). `--hydra-help` still shows Hydra's.
"""
from __future__ import annotations

import re
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..errors import TformerError
from ..hydra_setup import config_dir

KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.]*):(?P<value>[^#]*?)(?:\s+#\s?(?P<comment>.*))?$")
COMMENT_LINE = re.compile(r"^\s+#\s?(?P<comment>.*)$")
PLAIN = re.compile(r"^[\w./@~+-]+$")  # a string shown unquoted (one Hydra override would read it back as is)
SWEEP_NOTE = "   (-m: a sweep over comma-separated values)"


def yaml_comments(path: Path, prefix: str = "") -> dict[str, str]:
    """{dotted key: its comment} for every key line of one YAML file ("" when the line has none). A comment is the
    one on the key's own line, continued on the indented comment-only lines right under it; a comment on a line of
    its own above a key documents a section, not the key."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing mappings
    last = None
    for line in path.read_text().splitlines():
        m = KEY_LINE.match(line)
        if m and not (m.group("key") == "defaults" and not m.group("indent")):
            indent = len(m.group("indent"))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            dotted = ".".join([prefix] * bool(prefix) + [k for _, k in stack] + [m.group("key")])
            out[dotted] = (m.group("comment") or "").strip()
            last = dotted if out[dotted] else None
            if not m.group("value").strip():
                stack.append((indent, m.group("key")))
            continue
        c = COMMENT_LINE.match(line)
        if c and last is not None:  # a comment continued under its key
            out[last] += " " + c.group("comment").strip()
        else:
            last = None
    return out


def compose_with_sources(task: str, overrides: list[str]):
    """The composed config (with `hydra.runtime.choices`) and the tformer YAML files it merged, in merge order,
    each with the package its keys land in (`data/_base.yaml` -> `data`, an `@package _global_` experiment -> "")."""
    root = Path(config_dir())
    with initialize_config_dir(config_dir=str(root), version_base="1.3"):
        cfg = compose(config_name=task, overrides=overrides, return_hydra_config=True)
        merged = GlobalHydra.instance().config_loader().compute_defaults_list(task, overrides, RunMode.RUN)
    files = []
    for default in merged.defaults:
        path = root / f"{default.config_path}.yaml"
        if (default.package or "").split(".")[0] != "hydra" and path.is_file():
            files.append((path, default.package or ""))
    return cfg, files


def key_sources(files) -> dict[str, tuple[Path, str]]:
    """{dotted key: (the last file in merge order that writes it, that line's comment)}."""
    owner: dict[str, tuple[Path, str]] = {}
    for path, package in files:
        for key, comment in yaml_comments(path, package).items():
            owner[key] = (path, comment)
    return owner


def inline(value) -> str:
    """A value on one line, as it would be typed in an override: lists [0.9, 0.999], mappings {a: 1}, null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(inline(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {inline(v)}" for k, v in value.items()) + "}"
    text = str(value)
    typed = text.lower() in ("null", "true", "false", "~") or re.fullmatch(r"[-+]?[\d.]+(e[-+]?\d+)?", text.lower())
    return text if PLAIN.match(text) and not typed else repr(text)


def rows(tree: dict, owner: dict, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, value, comment) per key. A mapping is listed key by key when a file writes its keys on lines of
    their own; one written inline (`split_names: {train: train, test: dev}`) stays one value."""
    out = []
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value and any(f"{dotted}.{k}" in owner for k in value):
            out += rows(value, owner, dotted + ".")
        else:
            out.append((dotted, inline(value), owner.get(dotted, (None, ""))[1]))
    return out


def header(path: Path) -> list[str]:
    """The comment block that opens a command's YAML file: what the command does."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").rstrip())
    return lines


def render(task: str, overrides: list[str]) -> str:
    root = Path(config_dir())
    try:
        cfg, files = compose_with_sources(task, overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise TformerError(f"{str(exc).splitlines()[0]}; see tformer {task} --help") from None
    choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
    tree = {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
            for k in cfg if k != "hydra"}
    lines = [f"usage: tformer {task} [group=option ...] [key=value ...]" + SWEEP_NOTE * (task == "train"),
             *header(root / f"{task}.yaml"), ""]
    groups = [g for g in sorted(choices) if not g.startswith("hydra") and (root / g).is_dir()]
    if groups:
        lines.append("config groups (the one in use is marked *):")
        for group in groups:
            options = sorted(p.stem for p in (root / group).glob("*.yaml") if not p.stem.startswith("_"))
            lines.append(f"  {group + ':':<16}" + ", ".join(o + "*" * (o == choices[group]) for o in options))
        lines.append("")
    lines.append("keys (key=value to change one; the values shown are those this command would use):")
    listed = rows(tree, key_sources(files))
    width = max(len(f"{k} = {v}") for k, v, _ in listed)
    for key, value, comment in listed:
        shown = f"  {key} = {value}"
        lines.append(f"{shown:<{width + 4}}  # {comment}" if comment else shown)
    lines += ["", f"Hydra's own options: tformer {task} --hydra-help"]
    return "\n".join(lines)
