"""`tformer train --help` / `tformer evaluate --help`: every key with its resolved default and what it means.

Hydra's own help prints the composed config without the YAML comments that document it, and with interpolations
unresolved (`${oc.select:model.recommended_lr,5.0e-4}`). Here the config is composed with the given overrides,
resolved, and each key is printed with the comment that follows it in the YAML file it comes from, so the help
is as current as the configs themselves (`tformer train model=small --help` shows `small`'s values).
`--hydra-help` still shows Hydra's.
"""
from __future__ import annotations

import re
from pathlib import Path

from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..errors import TformerError
from ..hydra_setup import compose_config, config_dir

KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.]*):(?P<value>[^#]*?)(?:\s+#\s?(?P<comment>.*))?$")
COMMENT_LINE = re.compile(r"^\s+#\s?(?P<comment>.*)$")


def yaml_comments(path: Path, prefix: str = "") -> dict[str, str]:
    """{dotted key: its trailing comment (continued on following comment-only lines)} of one YAML file."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing mappings
    last = None
    for line in path.read_text().splitlines():
        m = KEY_LINE.match(line)
        if m and m.group("key") != "defaults":
            indent = len(m.group("indent"))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            dotted = ".".join([prefix] * bool(prefix) + [k for _, k in stack] + [m.group("key")])
            if m.group("comment"):
                out[dotted] = m.group("comment").strip()
            last = dotted if m.group("comment") else None
            if not m.group("value").strip():
                stack.append((indent, m.group("key")))
            continue
        c = COMMENT_LINE.match(line)
        if c and last is not None:  # a comment continued under its key
            out[last] += " " + c.group("comment").strip()
        else:
            last = None
    return out


def flatten(tree: dict, prefix: str = "") -> list[tuple[str, object]]:
    rows = []
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            rows += flatten(value, dotted + ".")
        else:
            rows.append((dotted, value))
    return rows


def render(task: str, overrides: list[str]) -> str:
    root = Path(config_dir())
    try:
        cfg = compose_config(task, overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise TformerError(f"{str(exc).splitlines()[0]}; see tformer {task} --help") from None
    choices = {g: c for g, c in OmegaConf.to_container(cfg.hydra.runtime.choices).items()
               if not g.startswith("hydra") and c is not None}
    comments = yaml_comments(root / f"{task}.yaml")
    for group, choice in choices.items():
        # a key documented in any option of the group (e.g. model/tiny.yaml) is documented for all; the chosen
        # option's own comment wins
        others = sorted(p.stem for p in (root / group).glob("*.yaml") if p.stem not in ("_base", choice))
        for name in (*others, "_base", choice):
            path = root / group / f"{name}.yaml"
            if path.is_file():
                comments.update(yaml_comments(path, prefix=group))
    tree = {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
            for k in cfg if k != "hydra"}
    lines = [f"usage: tformer {task} [group=option ...] [key=value ...]" + ("   (-m: a sweep over comma-separated "
                                                                           "values)" if task == "train" else ""), ""]
    groups = sorted(p.name for p in root.iterdir() if p.is_dir())
    if groups and task == "train":
        lines.append("config groups (the one in use is marked *):")
        for group in groups:
            options = sorted(p.stem for p in (root / group).glob("*.yaml") if not p.stem.startswith("_"))
            lines.append(f"  {group + ':':<16}" + ", ".join(o + "*" * (o == choices.get(group)) for o in options))
        lines.append("")
    lines.append("keys (key=value to change one; the values shown are those this command would use):")
    rows = [(k, OmegaConf.to_yaml({"v": v}).strip()[3:] if not isinstance(v, str) else v, comments.get(k, ""))
            for k, v in flatten(tree)]
    width = max(len(f"{k} = {v}") for k, v, _ in rows)
    for key, value, comment in rows:
        shown = f"  {key} = {value}"
        lines.append(f"{shown:<{width + 4}}  # {comment}" if comment else shown)
    lines += ["", "Hydra's own options: tformer " + task + " --hydra-help"]
    return "\n".join(lines)
