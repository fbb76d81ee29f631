import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
TFORMER = shutil.which("tformer", path=str(Path(sys.executable).parent)) or "tformer"


def run_tformer(*args, cwd, input=None, env=None, timeout=600):
    """Run the installed `tformer` command in a subprocess, as a user would."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    full_env.pop("TFORMER_DEBUG", None)
    return subprocess.run([TFORMER, *args], cwd=cwd, input=input, capture_output=True, text=True, env=full_env,
                          timeout=timeout)


@pytest.fixture(scope="session")
def shared_data():
    if not (SHARED_DATA / "imdb" / "train.parquet").is_file():
        pytest.skip("../shared/data is not beside this checkout")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _isolated_datasets_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path_factory.getbasetemp() / "hf_datasets"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
