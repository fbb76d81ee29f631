"""Reports people look at: PNG plots, the per-class report, errors.csv, explanations, `tformer report` (of a run,
an evaluate run, an audit and its folds)."""
import csv
import json
import random

import pytest
import torch

from helpers import TINY_TRAINING, copy_run, run_tformer
from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(tiny_run, tmp_path_factory):
    """A work folder whose only run (where `tformer train` would have put it) is a copy of the session's tiny run
    (2 epochs: a curve to plot)."""
    work = tmp_path_factory.mktemp("reports")
    return work, copy_run(tiny_run.run_dir, work / "outputs" / "train" / "2000-01-01" / "00-00-00")


def is_png(path):
    from PIL import Image

    assert path.read_bytes()[:8] == PNG_MAGIC
    with Image.open(path) as im:
        im.verify()
        return im.size


@pytest.mark.slow
def test_training_and_test_reports_are_written(run):
    work, run_dir = run
    w, h = is_png(run_dir / "training_curves.png")
    assert w > 300 and h > 200
    is_png(run_dir / "test_report" / "confusion_matrix.png")
    report = json.loads((run_dir / "test_report" / "classification_report.json").read_text())
    assert set(report) >= {"negative", "positive", "macro avg"}


@pytest.mark.slow
def test_evaluate_writes_png_report_and_errors_sorted_by_confidence(run):
    work, run_dir = run
    r = run_tformer("evaluate", f"checkpoint={run_dir}", "normalize=false", cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]
    out = next(work.glob("outputs/evaluate/*/*"))
    is_png(out / "confusion_matrix.png")
    metrics = json.loads((out / "metrics.json").read_text())
    rows = list(csv.DictReader(open(out / "errors.csv")))
    n_wrong = metrics["n"] - sum(metrics["confusion_matrix"][i][i] for i in range(2))
    assert len(rows) == n_wrong
    conf = [float(r["confidence"]) for r in rows]
    assert conf == sorted(conf, reverse=True)
    assert all(r["true_label"] != r["predicted_label"] and r["text"] for r in rows)


@pytest.mark.slow
def test_explain_weights_sum_to_one_per_text(run):
    work, run_dir = run
    r = run_tformer("predict", "--explain=rollout", "--json", "not bad at all",
                    "the plot was dull but the cast was superb", cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]
    for line in r.stdout.splitlines():
        e = json.loads(line)["explanation"]
        assert len(e["tokens"]) == len(e["last_layer"]) == len(e["rollout"])
        assert sum(e["last_layer"]) == pytest.approx(1, abs=1e-4) and sum(e["rollout"]) == pytest.approx(1, abs=1e-4)
        assert e["tokens"][0] == "[CLS]" and min(e["rollout"]) >= 0
    r = run_tformer("predict", "--explain", "the acting was superb", cwd=work)
    assert r.returncode == 0 and "superb" in r.stdout.split("┘")[-1]  # the coloured line after the table


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_explanations_ignore_padding(pooling):
    torch.manual_seed(0)
    model = TransformerClassifier(EncoderConfig(vocab_size=30, num_classes=2, d_model=16, n_heads=2, d_ff=32,
                                                max_len=12, pooling=pooling, n_layers=3)).eval()
    ids = torch.tensor([[2, 7, 8, 9, 3, 0, 0, 0]])
    padded = model.explain(ids, ids.ne(0))
    short = model.explain(ids[:, :5], ids[:, :5].ne(0))
    for name in ("last", "rollout"):
        torch.testing.assert_close(padded[name][:, :5], short[name], rtol=1e-5, atol=1e-6)
        assert torch.all(padded[name][:, 5:] == 0)
        torch.testing.assert_close(padded[name].sum(-1), torch.ones(1))


@pytest.mark.slow
def test_report_command(run):
    work, run_dir = run
    r = run_tformer("report", str(run_dir), cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "training summary" in r.stdout and "best epoch" in r.stdout and "confusion_matrix.png" in r.stdout
    r = run_tformer("report", str(work / "nope"), cwd=work)
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = run_tformer("report", cwd=work)  # no argument: the newest run
    assert r.returncode == 0 and f"run {run_dir.relative_to(work)}" in r.stdout.replace("\n", "")
    r = run_tformer("--version", cwd=work)
    assert r.returncode == 0 and r.stdout.startswith("tformer ")


def test_experiment_configs_compose():
    from hydra import compose, initialize_config_dir

    from tformer_cli.hydra_setup import config_dir

    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        c = compose(config_name="train", overrides=["experiment=newsgroups_keras"])
        assert (c.model.positions, c.model.n_layers, c.model.d_model, c.model.n_heads, c.model.d_ff, c.model.pooling,
                c.model.max_len, c.embedding_init.vocab_size) == ("learned", 1, 64, 2, 60, "mean", 300, 25000)
        c = compose(config_name="train", overrides=["experiment=news_category"])
        assert (c.model.d_model, c.model.n_heads, c.model.max_len, c.optimizer.name, c.optimizer.lr,
                c.loss.class_weights, c.trainer.early_stopping.monitor, c.trainer.early_stopping.patience) == \
               (512, 8, 32, "adam", 1e-4, "balanced", "val_loss", 3)
        c = compose(config_name="train", overrides=["experiment=imdb_bert_cls"])
        assert (c.embedding_init.name, c.embedding_init.freeze_epochs, c.model.pooling, c.optimizer.lr,
                c.trainer.epochs) == ("bert", 1, "cls", 5e-5, 20)
        c = compose(config_name="train", overrides=["experiment=noam"])
        assert c.schedule.name == "noam" and c.optimizer.lr == pytest.approx(256 ** -0.5 * 4000 ** -0.5, rel=1e-3)


def test_balanced_class_weights():
    from tformer_cli.runs.classify import class_weights

    w = class_weights(torch.tensor([0, 0, 0, 1]), 2, "balanced")
    torch.testing.assert_close(w, torch.tensor([4 / 6, 4 / 2]))
    assert class_weights(torch.tensor([0, 1]), 2, None) is None


# 20 Newsgroups' label names: five start with `comp.`, four with `rec.`, four with `talk.` (a cut name is ambiguous)
NEWSGROUPS = ["alt.atheism", "comp.graphics", "comp.os.ms-windows.misc", "comp.sys.ibm.pc.hardware",
              "comp.sys.mac.hardware", "comp.windows.x", "misc.forsale", "rec.autos", "rec.motorcycles",
              "rec.sport.baseball", "rec.sport.hockey", "sci.crypt", "sci.electronics", "sci.med", "sci.space",
              "soc.religion.christian", "talk.politics.guns", "talk.politics.mideast", "talk.politics.misc",
              "talk.religion.misc"]


def twenty_class_metrics():
    """Metrics as evaluate computes them for 20 classes: 300 right per class, a few confusions; the largest is
    rec.autos taken for rec.motorcycles (17), then comp.graphics for comp.windows.x (11)."""
    k = len(NEWSGROUPS)
    cm = [[300 if t == p else (t * 7 + p * 3) % 5 for p in range(k)] for t in range(k)]
    cm[7][8], cm[1][5] = 17, 11
    per_class = {n: {"precision": 0.9, "recall": 0.9, "f1-score": 0.9, "support": sum(cm[i])}
                 for i, n in enumerate(NEWSGROUPS)}
    return {"n": sum(map(sum, cm)), "accuracy": 0.9, "precision": 0.9, "recall": 0.9, "f1": 0.9, "average": "macro",
            "loss": 0.4, "per_class": per_class, "confusion_matrix": cm}


def rendered(print_fn, *args, width=None):
    """What a report function prints on a terminal `width` columns wide, or (None) into a file or pipe."""
    from io import StringIO

    from rich.console import Console

    from tformer_cli.console import plain_console

    buf = StringIO()
    print_fn(*args, Console(width=width, file=buf, color_system=None) if width else plain_console(buf))
    return buf.getvalue()


def whole_names_only(out: str, names) -> None:
    assert "…" not in out and "..." not in out  # nothing cut
    for name in names:
        assert name in out, f"{name} is not shown whole"


@pytest.mark.parametrize("width", [80, 120, 160, None])
def test_twenty_class_report_fits_the_width_and_never_cuts_a_label_name(width):
    from tformer_cli.console import PLAIN_WIDTH
    from tformer_cli.evaluation.report import print_metrics

    out = rendered(print_metrics, twenty_class_metrics(), NEWSGROUPS, "twenty_newsgroups test (6,000 examples)",
                   width=width)
    lines = out.splitlines()
    assert max(map(len, lines)) <= (width or PLAIN_WIDTH)
    whole_names_only(out, NEWSGROUPS)
    if width == 80:  # too narrow for 20 columns: the largest confusions, largest first, and where the matrix is
        assert "confusion_matrix.png" in out and "confusion matrix (" not in out
        top = [line for line in lines if "rec.autos" in line and "rec.motorcycles" in line]
        second = [line for line in lines if "comp.graphics" in line and "comp.windows.x" in line]
        assert top and second and " 17 " in top[0] and lines.index(top[0]) < lines.index(second[0])
    else:  # the whole matrix: columns numbered as the rows, which carry the whole names
        assert "confusion matrix (" in out and "top confusions" not in out
        header = next(line for line in lines if line.split()[:2] == ["true", "1"])
        assert header.split()[1:] == [str(i) for i in range(1, 21)]
        row = next(line for line in lines if line.split()[:2] == ["8", "rec.autos"])
        assert row.split()[2:] == [str(v) for v in twenty_class_metrics()["confusion_matrix"][7]]


def test_few_classes_keep_their_names_as_matrix_columns():
    from tformer_cli.evaluation.report import print_metrics

    metrics = {"n": 10, "accuracy": 0.7, "precision": 0.7, "recall": 0.7, "f1": 0.7, "average": "binary", "loss": None,
               "per_class": {}, "confusion_matrix": [[4, 1], [2, 3]]}
    out = rendered(print_metrics, metrics, ["negative", "positive"], "demo test", width=80)
    header = next(line for line in out.splitlines() if "negative" in line and "positive" in line)
    assert header.index("negative") < header.index("positive") and "confusion matrix (rows: true" in out


def test_a_label_name_wider_than_the_screen_wraps_whole():
    from tformer_cli.evaluation.report import print_metrics

    names = ["a_" + "very_long_category_name_" * 4 + str(i) for i in range(3)]
    metrics = {"n": 9, "accuracy": 0.7, "precision": 0.7, "recall": 0.7, "f1": 0.7, "average": "macro", "loss": 0.1,
               "per_class": {n: {"support": 3} for n in names}, "confusion_matrix": [[2, 1, 0], [0, 3, 0], [1, 0, 2]]}
    out = rendered(print_metrics, metrics, names, "files test", width=80)
    assert max(map(len, out.splitlines())) <= 80 and "…" not in out
    first_cells = "".join(line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│"))
    for name in names:  # every character kept, in order, across the wrapped lines of the first column
        assert name in first_cells


def test_epoch_table_headers_are_readable_at_80_columns():
    from tformer_cli.evaluation.report import print_history

    history = [{"epoch": e, "train_loss": 0.6931, "val_loss": 0.6123, "val_accuracy": 0.8765, "val_f1": 0.8712,
                "lr": 1e-3, "train_samples_per_s": 123456.0, "epoch_seconds": 1234.5} for e in (1, 2)]
    out = rendered(print_history, history, width=80)
    assert max(map(len, out.splitlines())) <= 80 and "…" not in out
    header = " ".join(out.splitlines()[2:5])  # (the title, the top border, then the header's lines)
    for word in ("epoch", "train", "loss", "val", "acc", "f1", "lr", "samples", "seconds"):
        assert word in header.split(), word
    assert "123,456" in out and "1234.5" in out


def test_macro_averages_say_when_a_class_has_no_text_in_the_split():
    from tformer_cli.evaluation.report import absent_classes_note

    per_class = {"a": {"f1-score": 0.8, "support": 5}, "b": {"f1-score": 0.6, "support": 3},
                 "gone": {"f1-score": 0.0, "support": 0}}
    note = absent_classes_note({"average": "macro", "per_class": per_class}, ["a", "b", "gone"])
    assert "1 class with no text in this split ('gone') as 0" in note and "present: 0.7000" in note
    assert absent_classes_note({"average": "binary", "per_class": per_class}, ["a", "b", "gone"]) is None
    assert absent_classes_note({"average": "macro", "per_class": per_class}, ["a", "b"]) is None


def test_the_settings_table_names_where_the_token_table_came_from():
    from tformer_cli.evaluation.report import _embeddings

    random = {"name": "random"}
    assert _embeddings({}, {"pretrained": "sentence-transformers/all-MiniLM-L6-v2"}, random) == \
        "the pretrained model's own"
    assert _embeddings({}, {"init": "outputs/pretrain/x"}, random) == "the pretraining run's"
    assert _embeddings({"distill": {"embeddings": "auto"}}, {}, random).startswith("the teacher's token table")
    assert _embeddings({"distill": {"embeddings": "own"}}, {}, random) == "random"
    assert _embeddings({}, {}, {"name": "minilm", "freeze_epochs": 1}) == "minilm, frozen 1 epoch(s)"
    assert _embeddings({"distill": {"embeddings": "auto"}}, {}, {"name": "minilm", "freeze_epochs": 1}) == \
        "minilm, frozen 1 epoch(s)"  # (a student with a table of its own)


@pytest.mark.slow
def test_report_reads_an_evaluate_run_and_points_from_a_checkpoint_or_a_file_to_its_run(run, tmp_path):
    work, run_dir = run
    evaluated = tmp_path / "evaluated"
    r = run_tformer("evaluate", f"checkpoint={run_dir}", f"hydra.run.dir={evaluated}", cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]
    metrics = json.loads((evaluated / "metrics.json").read_text())
    r = run_tformer("report", str(evaluated), cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"{metrics['accuracy']:.4f}" in r.stdout and "per class" in r.stdout
    assert str(evaluated / "metrics.json") in r.stdout and str(evaluated / "confusion_matrix.png") in r.stdout
    for inside in (run_dir / "checkpoints" / "best", run_dir / "history.json"):  # the run to pass instead
        r = run_tformer("report", str(inside), cwd=work)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and f"`tformer report {run_dir}`" in r.stderr, r.stderr
    # the evaluate run where a checkpoint is asked for: said, not "no saved config" or "incomplete"
    r = run_tformer("predict", f"--checkpoint={evaluated}", "a text", cwd=work)
    assert r.returncode == 2 and "is a `tformer evaluate` run, not a checkpoint; pass the run it evaluated" in r.stderr


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_report_reads_an_audit_and_its_folds(tmp_path):
    rng = random.Random(0)
    words = {"sports": "goal match team score player coach".split(), "cooking": "oven flour sugar bake pan".split()}
    labelled = tmp_path / "labelled.csv"
    with open(labelled, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(80):
            label = "sports" if i % 2 else "cooking"
            w.writerow([" ".join(rng.choice(words[label]) for _ in range(6)), label])
    audited = run_tformer("audit", "data=files", f"data.train_file={labelled}", "audit.folds=2", *TINY_TRAINING,
                          cwd=tmp_path)
    assert audited.returncode == 0, audited.stderr[-2000:]
    (audit_dir,) = (tmp_path / "outputs" / "audit").glob("*/*")
    flagged = len(list(csv.DictReader(open(audit_dir / "label_issues.csv"))))
    said = f"label issues {flagged:,} of 80 rows"
    assert said in " ".join(audited.stdout.split())  # what the audit itself said at its end
    r = run_tformer("report", str(audit_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = " ".join(r.stdout.split())
    assert said in out and str(audit_dir / "label_issues.csv") in out and "duplicates" in out, out
    r = run_tformer("report", str(audit_dir / "fold_1"), cwd=tmp_path)  # its checkpoint is gone, its history kept
    assert r.returncode == 0, r.stderr[-2000:]
    out = " ".join(r.stdout.split())
    assert "training summary" in out and f"the audit's results: `tformer report {audit_dir}`" in out, out


