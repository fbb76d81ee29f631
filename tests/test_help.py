"""`tformer train|evaluate|pretrain|audit --help`: every key's comment is the one its own YAML file writes beside it.

The expected comment is found here without the help's code: Hydra's defaults list gives the files in merge order,
PyYAML says which of them writes a key (the last one wins, as in Hydra's merge), and a targeted line scan reads
that key's comment in that file."""
from pathlib import Path

import pytest
import yaml
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode

from helpers import compose_config, run_tformer
from tformer_cli.hydra_setup import config_dir
from tformer_cli.typed_config import plain

CASES = [
    ("train",),
    ("evaluate",),
    ("pretrain",),
    ("train", "schedule=noam", "embedding_init=bert"),
    ("train", "experiment=noam"),
    ("train", "data=sst2", "model=minilm_l6", "embedding_init=minilm"),
    ("evaluate", "data=ag_news"),
    ("audit",),
    ("audit", "model=tiny", "audit.folds=3"),
]


def merged_files(task, overrides):
    """(file, package) of each of the project's YAML files in the composition, in Hydra's merge order."""
    root = Path(config_dir())
    with initialize_config_dir(config_dir=str(root), version_base="1.3"):
        merged = GlobalHydra.instance().config_loader().compute_defaults_list(task, list(overrides), RunMode.RUN)
    return [(root / f"{d.config_path}.yaml", d.package or "") for d in merged.defaults
            if not (d.package or "").startswith("hydra") and (root / f"{d.config_path}.yaml").is_file()]


def writes(path, package, key):
    """The key relative to the file's package when the file writes it, else None."""
    parts = key.split(".")
    prefix = package.split(".") if package else []
    if parts[:len(prefix)] != prefix:
        return None
    node = yaml.safe_load(path.read_text()) or {}
    node.pop("defaults", None)
    for part in parts[len(prefix):]:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return parts[len(prefix):]


def line_comment(path, relative):
    """The comment on the line of `relative` (a key path) in the file, continued on indented comment lines below."""
    lines = path.read_text().splitlines()
    depth, indent, i = 0, -1, 0
    while depth < len(relative):
        line = lines[i]
        stripped = line.lstrip(" ")
        here = len(line) - len(stripped)
        if here > indent and stripped.startswith(relative[depth] + ":"):
            depth, indent = depth + 1, here
        i += 1
    found = lines[i - 1]
    rest = found.split(":", 1)[1]
    comment = rest.split(" #", 1)[1].strip() if " #" in rest else ""
    while comment and i < len(lines) and lines[i].startswith(" ") and lines[i].lstrip().startswith("#"):
        comment += " " + lines[i].lstrip()[1:].strip()
        i += 1
    return comment


def help_keys(stdout):
    """{key: (value, comment)} of the keys section of a help page."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("keys ("))
    out = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        assert line.startswith("  ") and " = " in line, line
        key, rest = line.strip().split(" = ", 1)
        value, _, comment = rest.partition("  # ")
        out[key] = (value.strip(), comment.strip())
    return out


def leaves(tree, prefix=""):
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


@pytest.mark.parametrize("args", CASES, ids=" ".join)
def test_every_key_carries_the_comment_of_the_file_that_set_it(tmp_path, args):
    task, *overrides = args
    r = run_tformer(task, "--help", *overrides, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    listed = help_keys(r.stdout)
    files = merged_files(task, overrides)
    for key, (_, comment) in listed.items():
        setters = [(path, rel) for path, package in files if (rel := writes(path, package, key))]
        assert setters, f"{key}: no YAML file of the composition writes it"
        path, rel = setters[-1]
        assert comment == line_comment(path, rel), f"{key}: expected the comment of {path}"
    # every key of the composed config is listed (alone, or inside a mapping written inline)
    composed = plain(compose_config(task, *overrides))
    for leaf in leaves(composed):
        assert any(leaf == k or leaf.startswith(k + ".") for k in listed), leaf
    assert all(not line.lstrip().startswith("- ") for line in r.stdout.splitlines())  # values on one line


def test_the_reported_misattributions_are_gone(tmp_path):
    root = Path(config_dir())
    keys = help_keys(run_tformer("train", "--help", cwd=tmp_path).stdout)
    assert keys["schedule.warmup_ratio"][1] == line_comment(root / "schedule/linear_warmup.yaml", ["warmup_ratio"])
    assert "noam" not in keys["schedule.warmup_ratio"][1] and keys["schedule.warmup_ratio"][0] == "0.06"
    assert keys["embedding_init.vocab_size"][1] == line_comment(root / "embedding_init/random.yaml", ["vocab_size"])
    assert "pretrained vocabulary" not in keys["embedding_init.vocab_size"][1]
    assert keys["optimizer.betas"][0] == "[0.9, 0.999]"
    noam = help_keys(run_tformer("train", "--help", "schedule=noam", cwd=tmp_path).stdout)
    assert noam["schedule.warmup_ratio"][1] == "unused: noam needs warmup_steps"  # the chosen option's own comment


def test_pretrain_help_is_tformers_page(tmp_path):
    r = run_tformer("pretrain", "--help", "model=tiny", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Powered by Hydra" not in r.stdout and r.stdout.startswith("usage: tformer pretrain")
    keys = help_keys(r.stdout)
    assert keys["mlm.mask_prob"][0] == "0.15" and keys["model.d_model"][0] == "64"
    assert keys["trainer.early_stopping.monitor"][0] == "val_mlm_loss"  # pretrain.yaml's own, set after trainer/
    assert any(line.startswith("  model:") and "tiny*" in line for line in r.stdout.splitlines())
