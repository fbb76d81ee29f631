"""Reports people look at: PNG plots, the per-class report, errors.csv, explanations, `tformer report`."""
import csv
import json

import pytest
import torch

from helpers import copy_run, run_tformer
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
    r = run_tformer("predict", "--explain", "--json", "not bad at all", "the plot was dull but the cast was superb",
                    cwd=work)
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
