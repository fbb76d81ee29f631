"""Strings from users and files (texts, label names, paths) are shown as written: never read as rich markup,
never able to drive the terminal, never parsed as matplotlib mathtext, never run as a spreadsheet formula, never a
raw control character in a JSON line; a Hub reference never names a local folder."""
import csv
import json
import resource
import subprocess

import numpy as np
import pytest

from helpers import TFORMER, TINY_TRAINING, copy_run, run_tformer, tiny
from tformer_cli.errors import TformerError
from tformer_cli.evaluation import artifacts
from tformer_cli.evaluation.rows import reduce as reduce_rows
from tformer_cli.safe_text import csv_cell, json_line, mathtext, terminal
from tformer_cli.store.locate import parse_ref

# what a terminal acts on: C0 controls but newline, DEL, C1 controls (U+009B is a one-character CSI)
RAW_CONTROL = [chr(c) for c in [*range(0x00, 0x0A), *range(0x0B, 0x20), *range(0x7F, 0xA0)]]

HOSTILE_LABELS = ["[/quote]", "[bold red]loud[/]", "$\\notasymbol$", "title\x1b]0;pwned\x07"]


def test_safe_text_helpers():
    assert terminal("a\x1b[2Jb\x07c\td\ne") == "a\ufffd[2Jb\ufffdc\td\ne"
    assert mathtext("$x$ costs $5") == r"\$x\$ costs \$5"
    assert terminal("a\x9b2Jb\udcff") == "a\ufffd2Jb\ufffd"  # C1 CSI; an undecodable byte cannot be printed
    assert terminal("neg\u202egnp.exe \u2067x\u2069 \u200fok") == "neg\ufffdgnp.exe \ufffdx\ufffd \u200fok"  # bidi
    line = json_line({"text": "bell\x07 csi\x9b2J del\x7f sep\u2028 café 東京"})
    assert not any(c in line for c in RAW_CONTROL + ["\n", "\u2028"])
    assert json.loads(line)["text"] == "bell\x07 csi\x9b2J del\x7f sep\u2028 café 東京" and "café 東京" in line
    assert [csv_cell(v) for v in ("=1+1", "+1+2", "-cmd|' /C calc'!A0", "@SUM(A1)", "\t=x", "\r=x", "-0.5", "a=b", 3)] == [
        "'=1+1", "'+1+2", "'-cmd|' /C calc'!A0", "'@SUM(A1)", "'\t=x", "'\r=x", "-0.5", "a=b", 3]


@pytest.mark.parametrize("ref", ["hf://a/b@../../../x", "hf://a/b@/etc", "hf://a/b@main\\..\\x", "hf://a/b@x/../y",
                                 "hf://../b", "hf://a/..", "hf://a--b/c", "hf://a/b.git", "hf://a/b@-x", "hf://a/b@x y"])
def test_hub_references_the_hub_would_refuse_are_refused(ref):
    with pytest.raises(TformerError, match="is not a (Hub reference|revision)"):
        parse_ref(ref)


def test_hub_references_the_hub_takes_are_kept():
    assert parse_ref("hf://user-1/model_v2.0@refs/pr/1") == ("user-1/model_v2.0", "refs/pr/1")
    assert parse_ref("hf://a/b@" + "0f" * 20) == ("a/b", "0f" * 20) and parse_ref("hf://a/b") == ("a/b", None)


def test_a_hub_revision_that_climbs_out_of_the_cache_is_refused_by_predict(tmp_path):
    r = run_tformer("predict", "--checkpoint", "hf://owner/name@../../../../tmp", "hello", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "'../../../../tmp' is not a revision" in r.stderr


def test_errors_csv_cells_are_text_to_a_spreadsheet(tmp_path):
    texts = ['=HYPERLINK("http://x.example/?q="&A1,"click")', "+1+2", "plain text", "@SUM(1)"]
    labels = ["=cmd|' /C calc'!A0", "-neg"]
    metrics = {"confusion_matrix": [[0, 2], [2, 0]], "per_class": {}}
    probs = np.array([[0.2, 0.8], [0.9, 0.1], [0.3, 0.7], [0.6, 0.4]])
    answers = reduce_rows([(np.arange(4), np.log(probs))], [0, 1, 0, 1])
    paths = artifacts.write(tmp_path, metrics, labels, texts, rows=answers, normalize=False, title="t")
    rows = list(csv.DictReader(paths["errors"].open(encoding="utf-8", newline="")))
    cells = [c for r in rows for c in (r["text"], r["true_label"], r["predicted_label"])]
    assert len(rows) == 4 and not [c for c in cells if c[:1] in ("=", "+", "-", "@", "\t", "\r")]
    assert {r["text"] for r in rows} == {"'" + texts[0], "'+1+2", "plain text", "'@SUM(1)"}
    assert {r["true_label"] for r in rows} == {"'=cmd|' /C calc'!A0", "'-neg"}


def test_predict_reads_an_endless_line_in_bounded_memory(tmp_path):
    """/dev/zero is one line without end: read as a stream it is refused in one line; read whole it would fill
    memory (the 1 GiB address-space limit turns that into a MemoryError traceback)."""
    limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # noqa: E731
    r = subprocess.run([TFORMER, "predict", "--file", "/dev/zero"], cwd=tmp_path, capture_output=True, text=True,
                       preexec_fn=limit, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "without a line end" in r.stderr, r.stderr[-500:]


@pytest.mark.slow
def test_paths_texts_and_json_lines_never_carry_raw_controls(tiny_run, tmp_path):
    """A run dir whose name holds escape sequences, hostile and undecodable texts: what predict and evaluate
    print (the newest checkpoint's path, --json lines) carries no raw control; a `key=value` text after `--` is
    labelled, not read as an option; the Python API answers a lone surrogate."""
    hostile = "run\x1b]0;pwned\x07\x9b2J"
    copy_run(tiny_run.run_dir, tmp_path / "outputs" / "train" / "2000-01-01" / hostile)
    texts = ["csi\x9b2J and esc\x1b[2J bell\x07", "file=/etc/hostname", "checkpoint=elsewhere"]
    r = subprocess.run([TFORMER, "predict", "--json", texts[0], "--", *texts[1:], b"caf\xe9 latin-1"],
                       cwd=tmp_path, capture_output=True, env=None, timeout=600)
    out, err = r.stdout.decode("utf-8"), r.stderr.decode("utf-8")
    assert r.returncode == 0 and "Traceback" not in err, err[-2000:]
    assert "using the newest checkpoint" in err and "run\ufffd]0;pwned" in err
    assert not any(c in out + err for c in RAW_CONTROL)
    rows = [json.loads(line) for line in out.splitlines()]
    assert [x["text"] for x in rows] == [*texts, "caf\ufffd latin-1"] and all(x["label"] for x in rows)
    r = run_tformer("evaluate", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "run\ufffd]0;pwned" in r.stdout and not any(c in r.stdout + r.stderr for c in RAW_CONTROL if c != "\r")
    assert tiny_run.classifier().predict(["caf\udce9 lone surrogate"])[0]["label"]


@pytest.mark.slow
def test_hostile_labels_and_texts_train_evaluate_and_predict_cleanly(tmp_path):
    rows = [{"text": f"{w} review number {i}", "label": HOSTILE_LABELS[i % 4]}
            for i, w in enumerate(["good", "bad", "odd", "new"] * 20)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:20]))
    r = run_tformer("train", "data=files", f"data.train_file={tmp_path / 'train.jsonl'}",
                    f"data.test_file={tmp_path / 'test.jsonl'}",
                    *tiny("embedding_init.vocab_size=100", "model.max_len=16", base=TINY_TRAINING), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    run = next(tmp_path.glob("outputs/train/*/*"))
    assert (run / "test_metrics.json").is_file() and (run / "test_report" / "confusion_matrix.png").is_file()
    assert "[/quote]" in r.stdout and "[bold red]loud[/]" in r.stdout  # shown as written, not as markup
    assert "\x1b]0;" not in r.stdout + r.stderr
    r = run_tformer("predict", "[bold red]shout[/] and [/x]", "\x1b[2Jclear", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "[bold red]shout[/] and [/x]" in r.stdout and "\x1b[2J" not in r.stdout
    r = run_tformer("report", str(run), cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr


def test_values_from_data_reach_hydra_as_data(monkeypatch):
    """Class names, file names and API values become overrides (an audit's folds, train(dict)): whatever they hold,
    Hydra and OmegaConf give back the same string, and `${...}` is never resolved (no environment read)."""
    from tformer_cli.hydra_setup import compose_tree
    from tformer_cli.overrides import override_value

    monkeypatch.setenv("TFORMER_SECRET_TEST", "leaked")
    names = ["${oc.env:TFORMER_SECRET_TEST}", "${oc.env:UNSET_VARIABLE}", "${", "a,b", "x'y", "[x]", "{k: 1}",
             "back\\slash", "end\\", "q\\'", "\\${x}", "it's ${b}\\", "???", " spaced ", "a=b", "=", "plain"]
    tree = compose_tree("train", ["data=files", "data.train_file=x.csv",
                                  f"data.label_names={override_value('data.label_names', names)}"])
    assert tree["data"]["label_names"] == names
    assert "leaked" not in json.dumps(tree)


def test_every_job_passes_values_from_data_to_hydra_as_data(monkeypatch, tmp_path):
    """The places where a job turns data into overrides: an audit's fold (its class names and its file's path),
    the Python API's dict (train, distill, audit take one), the in-memory data's parquet path. Each composes
    back to the same values, nothing resolved."""
    from tformer_cli.data.config import DataConfig
    from tformer_cli.hydra_setup import compose_tree
    from tformer_cli.overrides import as_overrides, override_value
    from tformer_cli.runs.audit import fold_overrides
    from tformer_cli.runs.config import TrainConfig

    monkeypatch.setenv("TFORMER_SECRET_TEST", "leaked")
    names = ["${oc.env:TFORMER_SECRET_TEST}", "a,b", "x'y", "[x]", 'say "hi"', "${", "plain", "null", "True", "1e3",
             "-5", "inf", "1_000"]  # (words Hydra would read as None, a bool or a number unquoted)
    data_cfg = TrainConfig.compose(["data=files", "data.train_file=x.csv"]).data
    assert isinstance(data_cfg, DataConfig)
    folder = tmp_path / "odd, ${oc.env:TFORMER_SECRET_TEST} [dir]='x'"
    fold = fold_overrides(["model=tiny", f"resume={folder}"], data_cfg, names)
    tree = compose_tree("train", [*fold, "data=files", f"data.train_file={override_value('data', str(folder))}"])
    assert tree["data"]["label_names"] == names and tree["data"]["train_file"] == str(folder)
    given = {"data.label_names": names, "data.train_file": str(folder), "trainer.epochs": 2, "seed": 3}
    for command in ("train", "distill", "audit"):
        tree = compose_tree(command, ["data=files", *as_overrides(given)])
        assert tree["data"]["label_names"] == names and tree["data"]["train_file"] == str(folder)
        assert "leaked" not in json.dumps(tree)
