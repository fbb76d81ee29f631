"""predict's explanations by occlusion (classifier.py): each word's weight is what deleting it does to the answer's
probability, for every runtime; rollout stays as an option."""
import numpy as np
import pytest

import tformer_cli.classifier as classifier_module
from tformer_cli import Classifier
from tformer_cli.errors import TformerError

pytestmark = pytest.mark.slow  # the session's tiny run (it trains)


def test_a_words_weight_is_the_fall_in_the_answers_probability_when_it_is_deleted(tiny_run):
    clf = Classifier.load(tiny_run.run_dir)
    text = "the plot was dull, but the cast hasn't been better"
    answer = clf.predict([text], explain=True)[0]
    exp = answer["explanation"]
    assert exp["method"] == "occlusion" and exp["label"] == answer["label"]
    assert exp["words"] == ["the", "plot", "was", "dull", ",", "but", "the", "cast", "hasn't", "been", "better"]
    c = clf.labels.index(answer["label"])
    full = clf.predict_proba([text])[0, c]
    top = int(np.argmax(np.abs(exp["weights"])))
    without = text.replace(exp["words"][top], "", 1) if exp["words"].count(exp["words"][top]) == 1 else None
    if without is not None:
        assert exp["weights"][top] == pytest.approx(full - clf.predict_proba([without])[0, c], abs=1e-5)
    assert any(w != 0 for w in exp["weights"])
    raw = clf.predict([text], explain=True, calibrated=False)[0]  # (--raw: falls of the raw probability shown)
    if without is not None and raw["label"] == answer["label"]:
        assert raw["explanation"]["weights"][top] == pytest.approx(
            clf.predict_proba([text], calibrated=False)[0, c] - clf.predict_proba([without], calibrated=False)[0, c],
            abs=1e-5)
    assert all(w is None or w <= raw["probability"] + 1e-6 for w in raw["explanation"]["weights"])


def test_rollout_stays_an_option_and_a_bad_method_is_named(tiny_run):
    clf = Classifier.load(tiny_run.run_dir)
    assert clf.explain(["the film was great"], method="rollout")[0]["explanation"]["method"] == "rollout"
    with pytest.raises(TformerError, match="occlusion, rollout"):
        clf.predict(["the film"], explain="shap")


def test_only_the_first_words_are_tried_and_one_word_texts_work(tiny_run, monkeypatch):
    monkeypatch.setattr(classifier_module, "OCCLUDED_WORDS", 3)
    clf = Classifier.load(tiny_run.run_dir)
    long, one = clf.predict(["a b c d e f", "great"], explain=True)
    assert len(long["explanation"]["weights"]) == 6 and long["explanation"]["weights"][3:] == [None, None, None]
    assert all(w is not None for w in long["explanation"]["weights"][:3])  # (not measured is not "no effect")
    from tformer_cli.evaluation.answers import plain_explanation, render_explanation

    shown = plain_explanation({**long, "text": "a b c d e f"}).plain
    assert shown.endswith(" d e f") and "c(" in shown and render_explanation(long).plain.endswith("d e f ")
    assert len(one["explanation"]["weights"]) == 1 and np.isfinite(one["explanation"]["weights"][0])
