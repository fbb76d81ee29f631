"""The wheel a user installs is complete: built by pip, installed by pip, it finds tformer's Optuna sweeper (Hydra
discovers sweepers only in the `hydra_plugins` namespace, which a checkout on sys.path would otherwise provide) and
runs a real 2-trial search with no other Hydra plugin installed for it."""
import csv
import os
import subprocess
import sys
import zipfile

import pytest

from helpers import ROOT, tiny

pytest.importorskip("optuna")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the folder the wheel is installed into, its environment): the wheel's files come before the checkout."""
    build, target = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("site")
    # --no-build-isolation: the build backend (setuptools) is this venv's, so no index is needed
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT),
                    "-w", str(build)], check=True, capture_output=True, cwd=ROOT)
    (wheel,) = build.glob("tformer-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hydra_plugins/tformer_sweepers/resumable_optuna.py" in names
    assert "hydra_plugins/tformer_sweepers/config.py" in names
    assert "hydra_plugins/__init__.py" not in names  # a namespace: other plugins' distributions share it
    assert "tformer_cli/configs/hparams_search/small_optuna.yaml" in names
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(target), "COLUMNS": "200"}
    env.pop("TFORMER_DEBUG", None)
    return target, env


@pytest.mark.slow  # builds and installs a wheel, then a 2-trial search
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_the_installed_wheel_finds_the_sweeper_without_hydra_optuna_sweeper(installed, tmp_path):
    target, env = installed
    code = ("import sys, json\n"
            "from hydra.core.config_store import ConfigStore\n"
            "from hydra.core.plugins import Plugins\n"
            "from hydra.plugins.sweeper import Sweeper\n"
            "import tformer_cli, tformer_cli.sweeps.optuna_sweep\n"
            "sweepers = {c.__name__: sys.modules[c.__module__].__file__ for c in Plugins.instance().discover(Sweeper)}\n"
            "print(json.dumps({'tformer_cli': tformer_cli.__file__, 'sweepers': sweepers,\n"
            "  'group': 'tformer_optuna.yaml' in ConfigStore.instance().list('hydra/sweeper'),\n"
            "  'old_impl': 'hydra_plugins.hydra_optuna_sweeper._impl' in sys.modules}))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    found = json.loads(r.stdout.splitlines()[-1])
    assert found["tformer_cli"].startswith(str(target)), found  # the wheel's files, not the checkout's
    assert found["sweepers"]["ResumableOptunaSweeper"].startswith(str(target)), found
    assert found["group"] and not found["old_impl"], found

    tformer = target / "bin" / "tformer"  # the wheel's console script
    r = subprocess.run([str(tformer), "train", "-m", "hparams_search=small_optuna", "hydra.sweeper.n_trials=2",
                        "model=tiny", *tiny()], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    (summary,) = (tmp_path / "outputs" / "multirun").glob("*/*/summary.csv")
    rows = list(csv.DictReader(open(summary)))
    assert [row["job"] for row in rows] == ["0", "1"] and {row["status"] for row in rows} == {"done"}
    assert (summary.parent / "optuna.db").is_file()
