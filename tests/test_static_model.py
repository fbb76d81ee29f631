"""model=static's hashed token pairs and word dropout: a static model without pairs cannot tell two orders of the
same words apart, one with them learns to; the pairs' buckets are computed alike by torch and the ONNX export;
word dropout acts in training only; both are refused on an encoder with layers and set by the classifier, not by
a pretraining run it starts from."""
import random

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from helpers import TINY_TRAINING, compose_config, tiny, train_config
from tformer_cli import Classifier, train
from tformer_cli.console import output
from tformer_cli.errors import ConfigError
from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier, pair_ids
from tformer_cli.runs.classify import prepare
from tformer_cli.runs.pretraining import pretrain
from tformer_cli.store.layout import RunDir
from tformer_cli.typed_config import plain

FILLER = "the a film plot cast scene music story was is and of to it this".split()


def order_rows(n: int, seed: int) -> pd.DataFrame:
    """Texts of filler words with "red blue" or "blue red" somewhere in them: the label is the order of the two,
    so every text's bag of words is as likely under either label."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = ("red_first", "blue_first")[i % 2]
        words = [rng.choice(FILLER) for _ in range(6)]
        at = rng.randrange(len(words) + 1)
        words[at:at] = ["red", "blue"] if label == "red_first" else ["blue", "red"]
        rows.append({"text": " ".join(words), "label": label})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def order_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("order")
    order_rows(400, 0).to_csv(folder / "train.csv", index=False)
    order_rows(100, 1).to_csv(folder / "test.csv", index=False)
    return folder


def static_run(folder, run_dir, buckets: int):
    return train(tiny("data=files", f"data.train_file={folder / 'train.csv'}", f"data.test_file={folder / 'test.csv'}",
                      "model=static", "model.d_model=32", "model.head_hidden=32", "model.max_len=32",
                      f"model.pair_buckets={buckets}", "model.token_dropout=0", "optimizer.lr=1e-2",
                      "trainer.epochs=8", "trainer.early_stopping.patience=0", base=TINY_TRAINING),
                 run_dir=run_dir, quiet=True)


def test_pairs_let_a_static_model_see_word_order(order_files, tmp_path):
    test = pd.read_csv(order_files / "test.csv")
    swapped = [t.replace("red blue", "@").replace("blue red", "red blue").replace("@", "blue red") for t in test.text]

    bag = Classifier.load(static_run(order_files, tmp_path / "bag", 0).run_dir, device="cpu")
    np.testing.assert_allclose(bag.predict_proba(swapped), bag.predict_proba(list(test.text)), atol=1e-5)
    assert (np.array([p["label"] for p in bag.predict(list(test.text))]) == test.label).mean() <= 0.75

    pairs = static_run(order_files, tmp_path / "pairs", 4096)
    model = Classifier.load(pairs.run_dir, device="cpu")
    assert (np.array([p["label"] for p in model.predict(list(test.text))]) == test.label).mean() >= 0.9
    assert model._loaded.model.pair_embedding.weight.shape == (4096, 32)

    pytest.importorskip("onnxruntime")
    from tformer_cli.deploy.export import PARITY_TOLERANCE, export_onnx
    from tformer_cli.deploy.onnx_classifier import OnnxClassifier

    exported = export_onnx(pairs.run_dir)  # the buckets are integer arithmetic in the graph (Mul, Add, Mod)
    assert exported.max_abs_logit_diff <= PARITY_TOLERANCE and exported.label_agreement == 1.0
    np.testing.assert_allclose(OnnxClassifier.load(pairs.run_dir).predict_proba(swapped), model.predict_proba(swapped),
                               atol=1e-4)


def test_a_pair_counts_only_where_both_tokens_are_real():
    cfg = EncoderConfig(vocab_size=50, num_classes=2, d_model=8, n_layers=0, n_heads=1, d_ff=1, positions="none",
                        pooling="mean", pair_buckets=64)
    model = TransformerClassifier(cfg).eval()
    torch.nn.init.normal_(model.pair_embedding.weight)
    ids = torch.tensor([[5, 6, 7, 0, 0], [5, 6, 7, 9, 9]])
    pooled = model.features(ids, ids.ne(0))
    unpadded = model.features(ids[:1, :3], ids[:1, :3].ne(0))  # the same text without its padding
    torch.testing.assert_close(pooled[0], unpadded[0])
    assert pair_ids(ids, 64).tolist()[0][:2] == [(5 * 1_000_003 + 6) % 64, (6 * 1_000_003 + 7) % 64]
    with pytest.raises(ConfigError, match="pair_buckets=64 .* static models"):
        EncoderConfig(vocab_size=50, num_classes=2, n_layers=2, pair_buckets=64)


def test_token_dropout_leaves_tokens_out_in_training_only():
    cfg = EncoderConfig(vocab_size=50, num_classes=2, d_model=8, n_layers=0, n_heads=1, d_ff=1, positions="none",
                        pooling="mean", pair_buckets=64, token_dropout=0.9, dropout=0.0)
    model = TransformerClassifier(cfg)
    ids = torch.randint(1, 50, (64, 20))
    mask = ids.ne(0)
    model.eval()
    torch.testing.assert_close(model.features(ids, mask), model.features(ids, mask))
    full = model.features(ids, mask)
    model.train()
    torch.manual_seed(0)
    dropped = model.features(ids, mask)
    assert not torch.allclose(dropped, full)  # each text's mean is over another subset of its tokens
    one = torch.tensor([[7, 0, 0]])  # a text whose only token is dropped keeps it: never an empty mean
    torch.testing.assert_close(model.features(one, one.ne(0)), model.eval().features(one, one.ne(0)))
    with pytest.raises(ConfigError, match="token_dropout=0.5 is for static models"):
        EncoderConfig(vocab_size=50, num_classes=2, n_layers=2, token_dropout=0.5)


def test_a_static_pretraining_run_starts_a_classifier_with_this_runs_pairs(tmp_path):
    """The masked LM reads token vectors only, so a static pretraining run has no pair table; a classifier started
    from it (model.init) gets the pair buckets and token dropout it asks for, its pairs starting at zero."""
    static = ("model=static", "model.d_model=32", "model.head_hidden=32", "model.max_len=32")
    run = RunDir(tmp_path / "pretrain")
    pretrain(plain(compose_config("pretrain", *tiny(*static, "data.n_train=300"))), run)
    assert not [k for k in load_file(run.best.weights) if "pair" in k]
    config = train_config(*tiny(*static, f"model.init={run.root}", "model.pair_buckets=1024",
                                "model.token_dropout=0.1"))
    model = prepare(config, None, output()).model
    assert (model.cfg.pair_buckets, model.cfg.token_dropout) == (1024, 0.1)
    assert model.pair_embedding.weight.abs().sum() == 0
