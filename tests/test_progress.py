"""Plain progress lines (console.PlainProgress), what a log file gets instead of a bar."""
import pytest

from tformer_cli.console import PlainProgress, duration


def test_a_line_says_where_it_is_how_long_is_left_and_the_postfix():
    bar = PlainProgress(total=625, desc="epoch 3/3", unit="batch", initial=300)
    bar.n = 400
    bar.set_postfix(loss="0.1234", lr="1.70e-05")
    assert bar.line(600.0) == "epoch 3/3: 400/625 batches (64%), 22 min left, 10 min elapsed, loss 0.1234, lr 1.70e-05"


def test_without_a_total_it_counts(capsys, monkeypatch):
    monkeypatch.setenv("TFORMER_PROGRESS_SECONDS", "0")
    bar = PlainProgress(iter(range(3)), total=None, desc="reading", unit="text")
    assert list(bar) == [0, 1, 2]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and err[-1].startswith("reading: 3 texts, ")


@pytest.mark.parametrize("seconds,text", [(42, "42 s"), (95, "2 min"), (7500, "2 h 05 min")])
def test_durations(seconds, text):
    assert duration(seconds) == text


def test_a_phase_that_printed_ends_with_a_line_where_it_stopped(capsys, monkeypatch):
    monkeypatch.setenv("TFORMER_PROGRESS_SECONDS", "nan")  # not a number: the default minute
    with PlainProgress(total=10, desc="evaluating", unit="batch") as bar:
        bar.update(3)
    assert capsys.readouterr().err == ""  # nothing printed during it (under a minute): nothing at the end
    bar = PlainProgress(total=10, desc="evaluating", unit="batch")
    bar.every = 0.0
    bar.update(3)
    bar.every = 1e9
    bar.update(6)
    bar.close()
    bar.close()
    err = capsys.readouterr().err.splitlines()
    assert [e.split(",")[0] for e in err] == ["evaluating: 3/10 batches (30%)", "evaluating: 9/10 batches (90%)"]


def test_evaluation_progress_counts_tokens_so_longest_first_batches_do_not_skew_it(capsys, monkeypatch):
    import torch

    from tformer_cli.data.tokenization import TokenizedSplit
    from tformer_cli.hardware import Precision
    from tformer_cli.inference import predict_proba
    from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier

    monkeypatch.setenv("TFORMER_PROGRESS_SECONDS", "0")  # a line after every batch
    lengths = [30, 29, 5, 4, 3, 3]  # batches of 2 go longest first: 59, 9 and 6 tokens
    split = TokenizedSplit.from_ids([[7] * n for n in lengths], [0] * len(lengths))
    model = TransformerClassifier(EncoderConfig(vocab_size=10, num_classes=2, d_model=8, n_heads=2, d_ff=16,
                                                max_len=32))
    predict_proba(model, split, batch_size=2, pad_id=0, device=torch.device("cpu"), precision=Precision("fp32", "cpu"),
                  progress="evaluating")
    err = capsys.readouterr().err.splitlines()
    assert [e.split(" (")[0] for e in err] == ["evaluating: 59/74 tokens", "evaluating: 68/74 tokens",
                                               "evaluating: 74/74 tokens"]
    assert "(79%)" in err[0]  # by batches it would say 33%, and promise twice the time left
