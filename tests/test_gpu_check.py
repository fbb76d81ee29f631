"""The GPU check's dry run on the CPU (`benchmarks/gpu_check.py --device cpu --quick`): every step runs and prints
its one line, so the script is ready the day a GPU is there."""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from helpers import ROOT


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it): a dozen tformer commands
def test_the_gpu_check_runs_every_step_on_the_cpu(tmp_path):
    data = tmp_path / "imdb"
    data.mkdir()
    words = {0: "dull boring awful lifeless film", 1: "gripping wonderful moving beautiful film"}
    for split, n in (("train", 240), ("test", 60)):
        pd.DataFrame({"text": [f"{words[i % 2]} number {i} " * 3 for i in range(n)],
                      "label": [i % 2 for i in range(n)]}).to_parquet(data / f"{split}.parquet", index=False)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--quick",
                        "--data", str(data), "--out", str(out)], capture_output=True, text=True, timeout=1800,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = [line for line in r.stdout.splitlines() if line.startswith(("ok ", "FAIL "))]
    results = json.loads((out / "summary.json").read_text())
    assert len(lines) == len(results) >= 12, r.stdout[-3000:] + r.stderr[-2000:]
    assert [x["step"] for x in results if not x["ok"]] == [], r.stdout[-4000:]
    assert r.returncode == 0 and "steps ok" in r.stdout.splitlines()[-1]
    speeds = next(x["result"] for x in results if x["step"].startswith("throughput"))
    assert {"minilm 128 full eager", "bert_base 512 mixed eager", "minilm 128 full transformers",
            "bert_base 128 mixed eager padded"} <= set(speeds)


@pytest.mark.slow
@pytest.mark.heavy
def test_the_gpu_profile_runs_on_the_cpu(tmp_path):
    """benchmarks/gpu_profile.py --device cpu --quick: every variant prints its line and the kernel table is
    written, so the profile is ready when a GPU is."""
    data = tmp_path / "imdb"
    data.mkdir()
    pd.DataFrame({"text": [f"a film number {i} that was {'good' if i % 2 else 'bad'}" for i in range(200)],
                  "label": [i % 2 for i in range(200)]}).to_parquet(data / "train.parquet", index=False)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_profile.py"), "--device", "cpu", "--quick",
                        "--data", str(data), "--out", str(out)], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    for line in ("step as it runs:", "forward only", "forward + backward", "no dropout:", "no gradient clipping:",
                 "batch 8:"):
        assert r.stdout.count(line) == 2, (line, r.stdout[-3000:])  # once per shape
    assert "aten::" in (out / "profile.txt").read_text()
