"""Strings from users and files (texts, label names, paths) are shown as written: never read as rich markup,
never able to drive the terminal, never parsed as matplotlib mathtext."""
import json

import pytest

from helpers import TINY_TRAINING, run_tformer, tiny
from tformer_cli.safe_text import mathtext, terminal

HOSTILE_LABELS = ["[/quote]", "[bold red]loud[/]", "$\\notasymbol$", "title\x1b]0;pwned\x07"]


def test_safe_text_helpers():
    assert terminal("a\x1b[2Jb\x07c\td\ne") == "a\ufffd[2Jb\ufffdc\td\ne"
    assert mathtext("$x$ costs $5") == r"\$x\$ costs \$5"


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
