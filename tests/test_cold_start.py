"""`tformer predict "one text"` starts in about the time of `import torch` (benchmarks/cold_start.py measures it;
no test here asserts a time): it loads no config machinery on its way, and a few texts run on one CPU thread,
while a library caller's thread settings are left alone."""
import json
import subprocess
import sys

import pytest

# the predict command, run in-process as `tformer predict` would, then the modules it loaded and torch's threads
PREDICT = """
import atexit, json, sys, torch
torch.set_num_threads(3)
{setup}
atexit.register(lambda: print(json.dumps({{"threads": torch.get_num_threads(), "modules": sorted(sys.modules)}}),
                              file=sys.stderr))
from tformer_cli.cli import main
sys.argv = ["tformer", "predict", "--checkpoint", {ckpt!r}, *{texts!r}]
main()
"""


def run_predict(ckpt, texts, setup="", cwd=None) -> tuple[subprocess.CompletedProcess, dict]:
    code = PREDICT.format(setup=setup, ckpt=str(ckpt), texts=list(texts))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    return r, json.loads(r.stderr.strip().splitlines()[-1])


@pytest.mark.slow  # the shared trained run, fresh interpreters
def test_predict_loads_no_config_machinery_and_runs_a_few_texts_on_one_thread(tiny_run, tmp_path):
    r, seen = run_predict(tiny_run.run_dir, ["a gripping, beautifully shot film"], cwd=tmp_path)
    assert "a gripping, beautifully shot film" in r.stdout
    heavy = [m for m in seen["modules"] if m.split(".")[0] in (
        "omegaconf", "hydra", "antlr4", "matplotlib", "datasets", "sklearn", "pandas", "transformers")
             or m.startswith("tformer_cli.training")]
    assert heavy == []
    assert seen["threads"] == 1


@pytest.mark.slow
def test_more_than_a_little_work_gets_the_threads_back(tiny_run, tmp_path):
    # (the threshold at 0: every batch is more than a little work)
    _, seen = run_predict(tiny_run.run_dir, ["one text", "another"], cwd=tmp_path,
                          setup="import tformer_cli.classifier as c; c.LITTLE_WORK_FLOPS = 0")
    assert seen["threads"] == 3


@pytest.mark.slow
def test_the_library_leaves_its_callers_threads_alone(tiny_run, tmp_path):
    code = ("import torch; torch.set_num_threads(3)\n"
            "from tformer_cli import Classifier\n"
            f"clf = Classifier.load({str(tiny_run.run_dir)!r})\n"
            "print(clf.predict(['one text'])[0]['label'] in clf.labels, torch.get_num_threads())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["True", "3"]
