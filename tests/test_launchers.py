"""Hydra launchers run tformer's sweep jobs elsewhere, unchanged: joblib (parallel local processes) and submitit's
local executor (the SLURM launcher's code path, on this machine). Each sweep ends with its summary, every job done."""
import csv

import pytest

from helpers import TINY, run_tformer

pytestmark = pytest.mark.slow

SWEEP = ["train", "-m", "seed=1,2", *TINY]


@pytest.mark.parametrize("launcher, settings, plugin", [
    ("joblib", ["hydra.launcher.n_jobs=2"], "hydra_plugins.hydra_joblib_launcher"),
    pytest.param("submitit_local", ["hydra.launcher.timeout_min=10"], "hydra_plugins.hydra_submitit_launcher",
                 marks=pytest.mark.heavy),  # (make test-heavy: the joblib case runs in make test)
])
def test_a_sweep_runs_under_a_hydra_launcher(tmp_path, launcher, settings, plugin):
    pytest.importorskip(plugin)
    r = run_tformer(*SWEEP, f"hydra/launcher={launcher}", *settings, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (sweep,) = [p for p in (tmp_path / "outputs" / "multirun").glob("*/*") if p.is_dir()]
    rows = list(csv.DictReader(open(sweep / "summary.csv")))
    assert [(row["job"], row["status"]) for row in rows] == [("0", "done"), ("1", "done")]
    assert all(float(row["test_accuracy"]) >= 0 for row in rows)
