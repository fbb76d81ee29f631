"""Every model family tformer reads, end to end on tiny random-initialised folders (tests/hf_folders.py): trained
with long texts read as chunks, its run log naming the family, predictions that do not depend on the batch's
padding, explanations over whole words without the tokenizer's special tokens, and an ONNX export with its parity
check. Numerical parity with `transformers` is in tests/test_pretrained.py and tests/test_family_*.py."""
import json

import numpy as np
import pytest

import hf_folders
from helpers import TINY_DATA
from tformer_cli import Classifier, train
from tformer_cli.evaluation.answers import words_and_weights

pytest.importorskip("onnxruntime")

from tformer_cli.deploy.export import PARITY_TOLERANCE, export_onnx  # noqa: E402
from tformer_cli.deploy.onnx_classifier import OnnxClassifier  # noqa: E402

pytestmark = pytest.mark.slow  # each test trains and exports a model

LONG = "the acting was good but the plot was painfully dull and far too long " * 4
NAMES = {"bert": "BERT", "roberta": "RoBERTa", "xlm-roberta": "XLM-RoBERTa", "distilbert": "DistilBERT",
         "electra": "ELECTRA", "modernbert": "ModernBERT", "deberta-v2": "DeBERTa"}


@pytest.mark.parametrize("family", list(hf_folders.FAMILIES))
def test_a_family_trains_predicts_explains_and_exports(family, tmp_path):
    folder = hf_folders.write(family, tmp_path / "model")
    result = train([*TINY_DATA, "trainer.epochs=1", "trainer.precision=fp32", "model=pretrained",
                    f"model.pretrained={folder}", "model.max_len=24", "data.long_text=chunks", "optimizer.lr=1e-3"],
                   run_dir=tmp_path / "run", quiet=True)
    log = (result.run_dir / "train.log").read_text()
    assert NAMES[family] in log, log[:2000]
    assert json.loads((result.best_checkpoint / "model.json").read_text())["vocab_size"] == \
        json.loads((folder / "config.json").read_text())["vocab_size"]

    clf = Classifier.load(result.run_dir)
    assert len(clf._encode([LONG])[2][0]) > 1  # the long text really is several windows
    texts = ["the film was never dull", "bad", LONG]
    together = clf.predict_proba(texts)
    alone = np.stack([clf.predict_proba([t])[0] for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)  # padding in a batch changes nothing
    np.testing.assert_allclose(together.sum(axis=1), 1.0, atol=1e-5)

    explained = clf.explain(["the film was never dull"], method="rollout")[0]["explanation"]
    assert sum(explained["rollout"]) == pytest.approx(1.0, abs=1e-4)
    words = [w for w, _ in words_and_weights(explained["tokens"], explained["rollout"], clf.word_pieces)]
    assert words == ["the", "film", "was", "never", "dull"], explained["tokens"]

    exported = export_onnx(result.run_dir)
    assert exported.max_abs_logit_diff <= PARITY_TOLERANCE
    np.testing.assert_allclose(OnnxClassifier.load(result.run_dir).predict_proba(texts), together, atol=1e-4)
