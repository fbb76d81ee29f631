"""The package declares what it imports, and only the checkpoint layout's owner spells its file names."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

# import name -> distribution name, where they differ
DISTRIBUTIONS = {"yaml": "pyyaml", "sklearn": "scikit-learn", "hydra": "hydra-core", "PIL": "pillow"}


def third_party_imports(folder: Path) -> set[str]:
    names = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "tformer_cli"}


# extras that hold packages tformer_cli imports lazily, for one feature (the rest: dev tools, data packages)
RUNTIME_EXTRAS = ("onnx", "serve", "tensorboard", "mlflow", "wandb", "optuna", "audit")
DISTRIBUTIONS.update({"mlflow": "mlflow-skinny"})
# installed by `make` with --no-deps, outside pyproject (none: tformer's Optuna sweeper ships in its own wheel)
MAKE_INSTALLED: set[str] = set()


def declared(block_name: str = "dependencies") -> set[str]:
    """The distribution names listed in one pyproject block (`dependencies` or an extra's name)."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(rf"^{block_name} = \[(.*?)\]", text, re.S | re.M).group(1)
    names = {re.split(r"[<>=\[ ]", d.strip().strip('",'))[0].lower().replace("_", "-")
             for d in re.split(r"[,\n]", block)}
    return names - {""}


def test_dependencies_match_imports():
    """Every required dependency is imported; every import is a required dependency or in a runtime extra."""
    imported = {DISTRIBUTIONS.get(n, n).lower().replace("_", "-") for folder in ("tformer_cli", "hydra_plugins")
                for n in third_party_imports(ROOT / folder)}
    required = declared()
    optional = set().union(*(declared(extra) for extra in RUNTIME_EXTRAS)) | MAKE_INSTALLED
    assert all(f"'{name}==" in (ROOT / "Makefile").read_text() for name in MAKE_INSTALLED)
    assert not imported - required - optional, f"imported but undeclared: {imported - required - optional}"
    assert required <= imported, f"declared but unused: {required - imported}"


def string_literals(path: Path) -> list[str]:
    """Every string constant in a module's code (docstrings, which may describe the layout, left out)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings]


def test_only_the_layout_module_spells_run_and_checkpoint_file_names():
    names = ["history.json", "trainer_state.json", "training_state.safetensors", "model.safetensors", "model.json",
             "labels.json", "meta.json", "metrics.json", "tokenizer.json", "config.yaml", "training_curves.png",
             "test_report", ".old", ".tmp-", "checkpoints/"]
    # model/pretrained.py owns another format, a Hugging Face model folder, which shares two of the names.
    allowed = {"layout.py": set(names), "pretrained.py": {"model.safetensors", "tokenizer.json"}}
    offenders = []
    for path in (ROOT / "tformer_cli").rglob("*.py"):
        literals = string_literals(path)
        offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n not in allowed.get(path.name, ())
                      and any(n in s for s in literals)]
    assert not offenders, offenders


@pytest.mark.slow  # a fresh interpreter
def test_predict_imports_neither_training_nor_heavy_libraries():
    code = ("import sys; import tformer_cli.commands.predict as p, tformer_cli.checkpoint, tformer_cli.inference; "
            "print(sorted(m for m in sys.modules if m.startswith(('tformer_cli.training', 'transformers', "
            "'datasets', 'sklearn', 'hydra', 'matplotlib'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
