"""The package's shape, read from its source: no import cycles (module-level and deferred imports alike), no module
reaching into another's underscore names, thin commands, one home for the run engine's concepts."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tformer_cli"
NAME = "tformer_cli"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join([NAME, *parts])] = path
    return found


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, path: Path):
    """(imported module, imported names) for every import statement that runs (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node)
               for child in node.body for n in ast.walk(child)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(NAME):
                    yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith(NAME):
                continue
            names = [a.name for a in node.names]
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
            if len(submodules) < len(names):  # (a package's submodules alone: the edges go to them)
                yield target, [n for n in names if f"{target}.{n}" not in MODULES]
            for sub in submodules:
                yield sub, []


def _graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports. The package root is left out as an importer: its lazy
    `__getattr__` (tformer_cli.train, tformer_cli.Classifier) runs only when a user asks for those names."""
    graph = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        if module == NAME:
            continue
        for target, _ in _imports(module, path):
            if target in MODULES and target != module:
                graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_in_the_package():
    assert _cycles(_graph()) == []


def test_no_module_imports_another_modules_private_names():
    offenders = []
    for module, path in MODULES.items():
        for target, names in _imports(module, path):
            if target != module:
                offenders += [f"{module} imports {target}.{n}" for n in names
                              if n.startswith("_") and not n.startswith("__")]
    assert offenders == []


def test_commands_are_thin():
    sizes = {p.name: len(p.read_text().splitlines()) for p in (PACKAGE / "commands").glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 150} == {}


def test_the_run_engine_has_one_home_per_concept():
    """One way to find a run to resume and one NaN guard of the loss, for every training task."""
    sources = {m: p.read_text() for m, p in MODULES.items()}
    for definition in ("def find_resumable(", "def check_finite(", "def fit(", "def config_diff("):
        homes = [m for m, text in sources.items() if definition in text]
        assert len(homes) == 1, (definition, homes)
    assert not any("def _check_finite(" in text for text in sources.values())


def test_every_subpackage_ships_in_the_wheel():
    """pyproject lists packages by name: a new subpackage missing there works from a checkout, not from a wheel."""
    import pytest

    tomllib = pytest.importorskip("tomllib")  # (Python 3.11+)
    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    subpackages = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    assert subpackages - listed == set()


# The layers, lowest first: a module imports only from its own layer and the layers below it. A name is a module
# or a package (every module under it); the longest name that fits a module decides its layer.
LAYERS = (
    ("base", ("errors", "yesno", "safe_text", "typed_config", "registry", "console", "cores", "hardware", "hub",
              "network", "tasks")),
    ("store", ("store", "timing")),
    ("data and models", ("data", "model")),
    ("evaluation's arithmetic", ("evaluation.calibration", "evaluation.conformal", "evaluation.metrics", "evaluation.rows",
                                 "evaluation.confident", "evaluation.selection", "evaluation.answers",
                                 "evaluation.artifacts", "evaluation.report")),
    ("checkpoints and inference", ("checkpoint", "inference", "overrides")),
    ("the classifier and what scores with it", ("classifier", "evaluation", "deploy.onnx_classifier",
                                                "deploy.serve")),
    ("training", ("training",)),
    ("the run engine and deployment", ("runs", "deploy", "sweeps", "hydra_setup", "launch", "api")),
    ("commands", ("commands", "cli", "__main__")),
)


def _layer_of(module: str) -> int | None:
    name = module.removeprefix(NAME + ".")
    fits = [(len(prefix), i) for i, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
            if name == prefix or name.startswith(prefix + ".")]
    return max(fits)[1] if fits else None


def test_every_module_has_a_layer():
    assert [m for m in MODULES if m != NAME and _layer_of(m) is None] == []


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return [f"{a} ({LAYERS[_layer_of(a)][0]}) -> {b} ({LAYERS[_layer_of(b)][0]})"
            for a, targets in graph.items() if a != NAME for b in targets
            if b != NAME and _layer_of(b) > _layer_of(a)]


def test_no_module_imports_from_a_layer_above_its_own():
    assert _upward(_graph()) == []


def test_the_layer_test_sees_an_upward_import():
    store, runs = f"{NAME}.store.layout", f"{NAME}.runs.audit"
    assert _upward({store: {runs}, runs: {store}}) == [f"{store} (store) -> {runs} (the run engine and deployment)"]


def test_the_task_table_names_real_commands_and_api_functions():
    import importlib

    import tformer_cli
    from tformer_cli.tasks import TASKS

    for name, task in TASKS.items():
        module = importlib.import_module(f"{NAME}.commands.{task.module}")
        assert callable(getattr(module, task.entry)) and task.style in ("hydra", "argv"), name
        assert task.api is None or task.api in tformer_cli.__all__, name
        assert not task.trains or task.style == "hydra", name
