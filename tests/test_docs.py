"""The README and docs/ are what a newcomer reads first: they must stay short, speak to users, and every command
they show must be one tformer accepts. Nothing here trains or runs a command: train/evaluate/pretrain lines are
composed by Hydra from the real configs, the other commands' options go through their own parsers."""
import re
import shlex
from pathlib import Path

import pytest
from hydra.errors import HydraException

from tformer_cli.commands import export, push, serve, suggest
from tformer_cli.commands.options import parse_key_values
from tformer_cli.commands.predict import parse_args as parse_predict
from tformer_cli.errors import TformerError
from tformer_cli.hydra_setup import compose_config
from tformer_cli.runs.audit import options_of
from tformer_cli.runs.distill import options_of as distill_options
from tformer_cli.runs.config import CalibrateConfig, TrainConfig
from tformer_cli.runs.pretraining import MlmOptions
from tformer_cli.typed_config import build, plain

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOC_FILES = [README, *sorted((ROOT / "docs").glob("*.md"))]

INTERNAL = [r"\bissue", r"notebook", r"\bsession", r"\blent\b", r"\.\./shared", r"/work/", r"fixed since",
            r"\bcommit\s+`?[0-9a-f]{7,40}\b"]
# code names that contain an internal-sounding word (the run engine's module is runs/session.py)
CODE_NAMES = ["runs/session.py", "session.py", "session.execute", "build(session)", "report(session, state)",
              "label_issues", ".issues"]  # (tformer audit's file and AuditResult field)

# placeholders a reader replaces, and what stands in for them when a command is composed
PLACEHOLDERS = {"<date>": "2026-01-01", "<time>": "00-00-00", "<run dir>": "outputs/train/2026-01-01/00-00-00",
                "<sweep dir>": "outputs/multirun/2026-01-01/00-00-00", "<pretrain run>": "outputs/pretrain/x",
                "<you>": "me", "<name>": "model", "<revision>": "main", "<p>": "gpu", "<n>": "2",
                "<folder>": "data/mine", "<more>": "5", "<glue sst2 dir>": "data/sst2"}
HYDRA_COMMANDS = {"train": "train", "evaluate": "evaluate", "pretrain": "pretrain", "audit": "audit",
                  "distill": "distill", "calibrate": "calibrate"}
KEY_VALUE_COMMANDS = {"export": export, "serve": serve, "push": push, "suggest": suggest}
# the flags that make `train` print instead of run, and Hydra's -m: not overrides
RUN_FLAGS = {"-m", "--multirun", "--help", "--hydra-help"}


def fenced_lines(path: Path) -> list[str]:
    """The lines of the ```-fenced blocks of a markdown file, continuation lines joined, $VAR expanded from the
    block's own `VAR="..."` lines (how the docs shorten repeated overrides)."""
    lines, block, variables = [], None, {}
    for raw in path.read_text().splitlines():
        if raw.lstrip().startswith("```"):
            block = [] if block is None else None
            if block is None:
                variables = {}
            continue
        if block is None:
            continue
        if lines and lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1] + " " + raw.strip()
        else:
            lines.append(raw.strip())
    expanded = []
    for line in lines:
        assignment = re.fullmatch(r'([A-Z])="([^"]*)"', line)
        if assignment:
            variables[assignment.group(1)] = assignment.group(2)
            continue
        expanded.append(re.sub(r"\$([A-Z])\b", lambda m: variables.get(m.group(1), m.group(0)), line))
    return expanded


def tformer_commands(path: Path) -> list[str]:
    """Every `tformer <command> ...` line of the fenced blocks (a `$ ` prompt, a pipe into it, a comment after);
    `tformer benchmark: ...` and the like are a program's output, not commands."""
    found = []
    for line in fenced_lines(path):
        line = line.removeprefix("$ ")
        if "| tformer " in line:
            line = line.split("| ", 1)[1]
        if not re.match(r"tformer [a-z-]+(\s|$)", line):
            continue
        found.append(re.split(r"\s+#", line, maxsplit=1)[0].strip())
    return found


def argv_of(command: str) -> list[str]:
    for placeholder, value in PLACEHOLDERS.items():
        command = command.replace(placeholder, value)
    assert "<" not in command, f"unknown placeholder in {command!r}: add it to PLACEHOLDERS"
    return shlex.split(command)[1:]


def first_of_sweep(override: str) -> str:
    """`key=a,b` of a -m grid composes as its first value (brackets and quotes hold lists, not sweeps)."""
    key, sep, value = override.partition("=")
    if sep and "," in value and not value.startswith(("[", "{", "'", '"')) and "(" not in value:
        return f"{key}={value.split(',')[0]}"
    return override


def check_command(command: str) -> None:
    argv = argv_of(command)
    name, args = argv[0], argv[1:]
    if name in HYDRA_COMMANDS:
        if "--cfg" in args:
            del args[args.index("--cfg"):args.index("--cfg") + 2]
        overrides = [first_of_sweep(a) for a in args if a not in RUN_FLAGS]
        cfg = compose_config(HYDRA_COMMANDS[name], overrides, return_hydra_config=True)  # hydra.* overrides too
        tree = {key: plain(cfg[key]) for key in cfg if key != "hydra"}
        if name == "train":  # the values' types and ranges, as the command checks them before reading data
            build(TrainConfig, tree)
        elif name == "pretrain":
            build(MlmOptions, tree.pop("mlm"), "mlm")
            build(TrainConfig, tree)
        elif name == "audit":  # the audit's own keys, then every train key (each fold trains with them)
            options_of(tree)
            build(TrainConfig, {k: v for k, v in tree.items() if k not in ("audit", "checkpoint")})
        elif name == "distill":  # the distillation's own keys, then every train key (the student trains with them)
            distill_options(tree)
            assert tree.get("teacher"), f"tformer distill needs teacher=: {command!r}"
            build(TrainConfig, {k: v for k, v in tree.items() if k not in ("distill", "teacher")})
        elif name == "calibrate":  # its keys, and which texts it fits on
            CalibrateConfig.from_hydra(tree, overrides)
    elif name == "predict":
        parse_predict(args)
    elif name in KEY_VALUE_COMMANDS:
        module = KEY_VALUE_COMMANDS[name]
        parse_key_values(args, module.DEFAULTS, module.USAGE, name)
    elif name == "report":
        assert len(args) <= 1, f"tformer report takes one folder: {command!r}"
    else:
        raise AssertionError(f"no check for `tformer {name}` in {command!r}: add one")


ALL_COMMANDS = [(path.relative_to(ROOT).as_posix(), command) for path in DOC_FILES
                for command in tformer_commands(path)]


def test_readme_fits_on_a_few_screens():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"


def test_readme_keeps_the_checkout_commands():
    """CI runs the README's test command; a newcomer's checkout starts with make demo."""
    text = README.read_text()
    assert "make demo" in text and "make test" in text


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: p.name)
def test_docs_speak_to_users(path):
    text = path.read_text()
    for name in CODE_NAMES:
        text = text.replace(name, "")
    for pattern in INTERNAL:
        match = re.search(pattern, text, flags=re.IGNORECASE)
        assert match is None, f"{path.name}: internal wording {match.group(0)!r} near " \
                              f"{text[max(0, match.start() - 60):match.end() + 60]!r}"


def test_docs_show_commands():
    """The command check below must have something to check: the README's tour alone is ten commands."""
    assert sum(path == "README.md" for path, _ in ALL_COMMANDS) >= 10
    assert {"train", "evaluate", "pretrain", "predict", "export", "serve", "push"} <= {
        shlex.split(c)[1] for _, c in ALL_COMMANDS}


@pytest.mark.parametrize("path,command", ALL_COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in ALL_COMMANDS])
def test_every_documented_command_is_accepted(path, command):
    check_command(command)


@pytest.mark.parametrize("bad,error", [
    ("tformer train optimizer.lrr=1e-3", HydraException), ("tformer evaluate chekpoint=x", HydraException),
    ("tformer train trainer.epochs=abc", TformerError), ("tformer pretrain mlm.mask_prob=2", TformerError),
    ("tformer predict --topk 3 x", TformerError), ("tformer serve prot=1", TformerError),
    ("tformer audit audit.fold=3", HydraException), ("tformer audit audit.filter_by=best", TformerError),
    ("tformer suggest fil=x.csv", TformerError), ("tformer distill teacher=x distill.alpha=2", TformerError),
    ("tformer distill teacher=x distill.temprature=2", HydraException),
    ("tformer frobnicate", AssertionError)])
def test_the_command_check_refuses_a_typo(bad, error):
    with pytest.raises(error):
        check_command(bad)


def anchors(path: Path) -> set[str]:
    """The #fragments a markdown renderer (GitHub's rule) gives the file's headings."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: p.name)
def test_relative_links_point_to_files(path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, fragment = target.partition("#")
        linked = path.parent / file if file else path
        assert linked.exists(), f"{path.name} links to {target}, which does not exist"
        if fragment and linked.suffix == ".md":
            assert fragment in anchors(linked), f"{path.name} links to {target}: no such heading in {linked.name}"


def test_readme_links_every_docs_page():
    text = README.read_text()
    missing = [p.name for p in DOC_FILES[1:] if f"docs/{p.name}" not in text]
    assert not missing, f"README.md does not link {missing}"
