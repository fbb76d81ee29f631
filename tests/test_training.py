"""The real training loop on small data: freezing/unfreezing, optimizer state, early stopping."""
import pytest
import torch

from helpers import train_config
from tformer_cli.data.tokenization import TokenizedSplit
from tformer_cli.hardware import Precision
from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier
from tformer_cli.training.early_stopping import EarlyStopping
from tformer_cli.training.loop import Run, fit
from tformer_cli.training.objectives import Classification


def toy_split(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids, labels = [], []
    for i in range(n):
        length = int(torch.randint(3, 12, (1,), generator=g))
        seq = torch.randint(5, 40, (length,), generator=g).tolist()
        label = i % 2
        seq[0] = 40 + label  # a learnable cue
        ids.append([2] + seq + [3])
        labels.append(label)
    return TokenizedSplit.from_ids(ids, labels)


def make_run(tmp_path, *, epochs=3, freeze_epochs=0, lr=1e-2, monitor="val_loss", mode="min", patience=0,
             snapshots=None, optimizer_states=None):
    torch.manual_seed(0)
    model = TransformerClassifier(EncoderConfig(vocab_size=50, num_classes=2, d_model=16, n_heads=2, d_ff=32,
                                                max_len=16, embedding_dim=24))
    cfg = train_config(f"trainer.epochs={epochs}", "trainer.batch_size=16", "trainer.eval_batch_size=32",
                       "trainer.seed=0", "trainer.log_every_steps=2", f"trainer.early_stopping.monitor={monitor}",
                       f"trainer.early_stopping.mode={mode}", f"trainer.early_stopping.patience={patience}",
                       f"optimizer.lr={lr}", "optimizer.weight_decay=0.01", "schedule=constant")
    run = None

    def save(which, metrics, training_state=None):
        if which == "last" and snapshots is not None:
            snapshots.append(run.model.token_embedding.weight.detach().clone())

    run = Run(model=model, train=toy_split(), validation=toy_split(32, seed=1), objective=Classification(["a", "b"]), pad_id=0,
              device=torch.device("cpu"), precision=Precision("fp32", "cpu"), trainer=cfg.trainer,
              optimizer=cfg.optimizer, schedule=cfg.schedule, freeze_epochs=freeze_epochs, save_checkpoint=save)
    return run


@pytest.mark.slow  # fits
def test_embeddings_frozen_then_trained_without_resetting_other_state(tmp_path, monkeypatch):
    snapshots = []
    run = make_run(tmp_path, epochs=3, freeze_epochs=1, snapshots=snapshots)
    initial = run.model.token_embedding.weight.detach().clone()
    steps_seen = {}
    import tformer_cli.training.optim as optim_lib

    real_set = optim_lib.set_embedding_frozen

    def spy(model, frozen, layers=0):
        steps_seen[len(steps_seen)] = frozen
        real_set(model, frozen, layers)

    monkeypatch.setattr(optim_lib, "set_embedding_frozen", spy)
    state = fit(run)
    assert steps_seen == {0: True, 1: False, 2: False}
    assert torch.equal(snapshots[0], initial), "embeddings changed while frozen"
    assert not torch.equal(snapshots[1], snapshots[0]), "embeddings did not change after unfreezing"
    # other parameters did train during the frozen epoch
    assert state.history[0]["train_loss"] > state.history[-1]["train_loss"]


def test_unfreezing_keeps_adam_moments_of_other_parameters():
    from tformer_cli.training import optim as optim_lib

    torch.manual_seed(0)
    model = TransformerClassifier(EncoderConfig(vocab_size=20, num_classes=2, d_model=8, n_heads=2, d_ff=16, max_len=8))
    cfg = train_config("optimizer=adamw", "optimizer.lr=0.1", "optimizer.weight_decay=0.0").optimizer
    opt = optim_lib.build(model, cfg, 1.0, torch.device("cpu"))
    ids = torch.tensor([[2, 5, 6, 3]])
    optim_lib.set_embedding_frozen(model, True)
    for _ in range(3):
        model(ids).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    head = model.head.weight
    before = opt.state[head]["exp_avg"].clone()
    assert model.token_embedding.weight not in opt.state  # never stepped while frozen
    optim_lib.set_embedding_frozen(model, False)
    model(ids).sum().backward()
    opt.step()
    assert int(opt.state[head]["step"]) == 4  # continued, not restarted
    assert int(opt.state[model.token_embedding.weight]["step"]) == 1
    assert not torch.equal(opt.state[head]["exp_avg"], torch.zeros_like(before))


def test_early_stopping_rules():
    es = EarlyStopping("val_loss", "min", patience=2, min_delta=0.01)
    assert es.update({"val_loss": 1.0}, 1)
    assert not es.update({"val_loss": 0.995}, 2)  # within min_delta: not an improvement
    assert not es.should_stop
    assert not es.update({"val_loss": 1.2}, 3)
    assert es.should_stop and es.best_epoch == 1
    es = EarlyStopping("val_accuracy", "max", patience=1)
    assert es.update({"val_accuracy": 0.5}, 1) and es.update({"val_accuracy": 0.6}, 2)
    with pytest.raises(Exception, match="not a logged metric"):
        es.update({"val_loss": 0.1}, 3)


@pytest.mark.slow  # fits
def test_fit_stops_when_the_monitored_metric_stalls(tmp_path):
    run = make_run(tmp_path, epochs=10, lr=0.0, monitor="val_loss", patience=2)  # lr 0: nothing improves
    state = fit(run)
    assert len(state.history) == 3  # epoch 1 best, then 2 bad epochs
    assert state.best_metrics["epoch"] == 1 and state.best_metrics["monitor"] == "val_loss"


def test_layer_wise_lr_decay_gives_lower_layers_smaller_rates():
    from tformer_cli.training import optim as optim_lib

    model = TransformerClassifier(EncoderConfig(vocab_size=20, num_classes=2, d_model=8, n_heads=2, d_ff=16, max_len=8,
                                                n_layers=3, positions="learned", embedding_norm=True))
    groups = optim_lib.param_groups(model, 1.0, 0.01, 1.0, layer_decay=0.5)
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    assert lr_of[id(model.head.weight)] == 1.0  # the top: the full rate
    assert [lr_of[id(b.ff.up.weight)] for b in model.blocks] == [0.125, 0.25, 0.5]
    assert lr_of[id(model.token_embedding.weight)] == lr_of[id(model.embedding_norm.weight)] == 0.0625
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    flat = optim_lib.param_groups(model, 1.0, 0.01, 1.0)  # no decay: the three groups of old
    assert [g["name"] for g in flat] == ["decay", "no_decay", "embedding"]


@pytest.mark.slow  # fits
def test_freezing_lower_layers_then_unfreezing(tmp_path):
    run = make_run(tmp_path, epochs=2)
    run.freeze_epochs, run.freeze_layers = 1, 1
    low = run.model.blocks[0].ff.up.weight.detach().clone()
    high = run.model.blocks[1].ff.up.weight.detach().clone()
    frozen_after_epoch = []

    def save(which, metrics, training_state=None):
        if which == "best" or training_state is None:
            return
        frozen_after_epoch.append((torch.equal(run.model.blocks[0].ff.up.weight, low),
                                   torch.equal(run.model.blocks[1].ff.up.weight, high)))

    run.save_checkpoint = save
    fit(run)
    assert frozen_after_epoch[0] == (True, False)  # epoch 1: the lowest block frozen, the next one trained
    assert frozen_after_epoch[-1] == (False, False)  # epoch 2: everything trains
