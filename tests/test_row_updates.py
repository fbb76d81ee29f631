"""Row updates of the token table (optimizer.embedding_update=rows): the lazy Adam/AdamW step on a sparse
gradient is Adam's own step for the rows a batch uses, leaves the other rows alone, clips like the dense path,
shares Adam's state format (so a run may switch modes on resume), and `fit` turns it on only where it can."""
import copy
import warnings

import pytest
import torch
from torch import nn

from helpers import train_config
from test_training import make_run
from tformer_cli.training import optim as optim_lib
from tformer_cli.training.loop import fit


class Bag(nn.Module):
    """A token table and a head: the smallest model with the shape that matters here."""

    def __init__(self, vocab=40, dim=6):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, dim, padding_idx=0)
        self.head = nn.Linear(dim, 3)

    def forward(self, ids):
        return self.head(self.token_embedding(ids).mean(1))


def _steps(model, opt, batches, clip=0.0):
    for ids in batches:
        opt.zero_grad(set_to_none=True)
        logits = model(ids)
        loss = logits.logsumexp(-1).sum() - logits[:, 0].sum()
        loss.backward()
        if clip:
            optim_lib.clip_grad_norm(model.parameters(), clip)
        opt.step()


@pytest.mark.parametrize("name,wd", [("adamw", 0.1), ("adam", 0.1), ("adamw", 0.0)])
def test_rows_used_by_every_batch_follow_adam_exactly(name, wd):
    torch.manual_seed(0)
    dense_model = Bag()
    rows_model = copy.deepcopy(dense_model)
    rows_model.token_embedding.sparse = True
    initial = dense_model.token_embedding.weight.detach().clone()
    reference = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}[name]
    ours = {"adamw": optim_lib.AdamWRows, "adam": optim_lib.AdamRows}[name]
    dense = reference(dense_model.parameters(), lr=0.05, weight_decay=wd)
    rows = ours(rows_model.parameters(), lr=0.05, weight_decay=wd, fused=True)
    ids = torch.tensor([[5, 7, 7, 0], [9, 5, 11, 12]])  # the same rows each step: lazy Adam == Adam on them
    _steps(dense_model, dense, [ids] * 6, clip=0.5)
    _steps(rows_model, rows, [ids] * 6, clip=0.5)
    used = [5, 7, 9, 11, 12]
    assert torch.allclose(rows_model.token_embedding.weight[used], dense_model.token_embedding.weight[used],
                          atol=1e-5)
    assert torch.allclose(rows_model.head.weight, dense_model.head.weight, atol=1e-5)
    # the rows no batch used are exactly as initialised (dense AdamW would have decayed them)
    unused = [i for i in range(40) if i not in used and i != 0]
    assert torch.equal(rows_model.token_embedding.weight[unused], initial[unused])
    if wd:
        assert not torch.equal(dense_model.token_embedding.weight[unused], initial[unused])
    assert rows_model.token_embedding.weight.grad.is_sparse


def test_untouched_rows_and_their_moments_do_not_move():
    torch.manual_seed(0)
    model = Bag()
    model.token_embedding.sparse = True
    before = model.token_embedding.weight.detach().clone()
    opt = optim_lib.AdamWRows(model.parameters(), lr=0.05, weight_decay=0.1)
    _steps(model, opt, [torch.tensor([[3, 4]]), torch.tensor([[3, 8]])])
    w, state = model.token_embedding.weight.detach(), opt.state[model.token_embedding.weight]
    assert not torch.equal(w[[3, 4, 8]], before[[3, 4, 8]])
    assert torch.equal(w[9:], before[9:])
    assert float(state["exp_avg"][4].abs().sum()) > 0 and float(state["exp_avg"][9:].abs().sum()) == 0
    # row 4 was not used by the second step: lazy Adam leaves it and its moments where step 1 put them
    assert int(state["step"]) == 2


def test_clipping_a_sparse_gradient_equals_clipping_the_dense_one():
    torch.manual_seed(0)
    a = Bag()
    b = copy.deepcopy(a)
    b.token_embedding.sparse = True
    ids = torch.tensor([[5, 5, 6], [7, 5, 0]])
    for m in (a, b):
        (m(ids) ** 2).sum().backward()
    na = torch.nn.utils.clip_grad_norm_(a.parameters(), 0.01)
    nb = optim_lib.clip_grad_norm(b.parameters(), 0.01)
    assert torch.allclose(na, nb) and float(na) > 0.01  # it did clip
    assert torch.allclose(b.token_embedding.weight.grad.to_dense(), a.token_embedding.weight.grad, atol=1e-7)
    assert torch.allclose(b.head.weight.grad, a.head.weight.grad)


def test_state_is_adams_own_so_a_run_can_switch_modes():
    torch.manual_seed(0)
    model = Bag()
    model.token_embedding.sparse = True
    opt = optim_lib.AdamWRows(model.parameters(), lr=0.05, fused=True)
    _steps(model, opt, [torch.tensor([[3, 4]])] * 2)
    saved = opt.state_dict()
    model.token_embedding.sparse = False  # resumed with embedding_update=dense
    dense = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
    dense.load_state_dict(saved)
    _steps(model, dense, [torch.tensor([[3, 5]])])
    assert int(dense.state[model.token_embedding.weight]["step"]) == 3


@pytest.mark.slow  # fits
def test_fit_uses_rows_by_default_and_dense_on_request(tmp_path):
    run = make_run(tmp_path, epochs=1)
    fit(run)
    assert run.model.token_embedding.sparse  # the adamw YAML's default
    assert train_config().optimizer.options["embedding_update"] == "rows"
    dense = make_run(tmp_path, epochs=1)
    dense.optimizer.options["embedding_update"] = "dense"
    fit(dense)
    assert not dense.model.token_embedding.sparse
    bad = make_run(tmp_path, epochs=1)
    bad.optimizer.options["embedding_update"] = "some"
    with pytest.raises(Exception, match="embedding_update='some' must be rows or dense"):
        fit(bad)


def test_rows_are_off_where_they_cannot_work():
    model = Bag()
    cfg = train_config().optimizer
    assert optim_lib.use_row_updates(model, cfg) and model.token_embedding.sparse
    assert not optim_lib.use_row_updates(model, cfg, compiled=True) and not model.token_embedding.sparse
    assert not optim_lib.use_row_updates(model, cfg, distributed=True)
    assert not optim_lib.use_row_updates(model, train_config("optimizer=sgd").optimizer)


@pytest.mark.parametrize("grad_clip", [1.0, 0.0])
def test_an_fp16_scaler_unscales_the_rows_and_skips_an_overflowing_step(grad_clip):
    """What fp16 on a GPU does, on the CPU: the scaler's inf step must leave the rows finite and unmoved, and an
    ordinary step must update them with the unscaled gradient (as the dense path would)."""
    from tformer_cli.hardware import Precision
    from tformer_cli.training.loop import Optimization, backward, update

    def optimizer_step(opt, loss):  # one optimizer step on a loss already computed
        backward(opt, loss)
        update(opt)

    cfg = train_config()
    steps = {}
    for mode in ("rows", "dense"):
        torch.manual_seed(0)
        model = Bag()
        optimizer = copy.deepcopy(cfg.optimizer)
        optimizer.options["embedding_update"] = mode
        opt = Optimization(model, optimizer=optimizer, schedule=cfg.schedule, total_steps=10,
                           device=torch.device("cpu"), precision=Precision("fp32", "cpu"), grad_clip=grad_clip)
        opt.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16, enabled=True)
        assert opt.row_updates == (mode == "rows")
        ids = torch.tensor([[3, 4, 5]])
        before = model.token_embedding.weight.detach().clone()
        lr = opt.lr
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. torch's "lr_scheduler.step() before optimizer.step()"
            optimizer_step(opt, model(ids).sum() * float("inf"))  # overflow: the scaler skips this step
        assert torch.equal(model.token_embedding.weight, before)
        assert opt.lr == lr and opt.scheduler.last_epoch == 0  # nor did the schedule advance
        optimizer_step(opt, model(ids).logsumexp(-1).sum())
        steps[mode] = model.token_embedding.weight.detach().clone()
        assert torch.isfinite(steps[mode]).all() and not torch.equal(steps[mode], before)
    assert torch.allclose(steps["rows"], steps["dense"], atol=1e-6)
