import pytest
import torch

from tformer_cli.errors import TformerError
from tformer_cli.training.config import ScheduleConfig
from tformer_cli.training.schedules import build, lr_multiplier


def test_linear_warmup_rises_then_decays_to_zero():
    f = lambda s: lr_multiplier("linear_warmup", s, total_steps=100, warmup_steps=10)
    assert f(0) == pytest.approx(0.1)
    assert f(9) == pytest.approx(1.0)
    assert f(54) == pytest.approx(0.5)
    assert f(99) == pytest.approx(0.0)


def test_cosine_half_way_is_half():
    f = lambda s: lr_multiplier("cosine", s, total_steps=110, warmup_steps=10)
    assert f(9) == pytest.approx(1.0)
    assert f(59) == pytest.approx(0.5)
    assert f(109) == pytest.approx(0.0, abs=1e-12)


def test_noam_matches_vaswani_formula_up_to_normalisation():
    d_model, warmup = 512, 4000
    for step in (1, 100, 3999, 4000, 10_000, 100_000):
        paper = d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
        peak = d_model ** -0.5 * warmup ** -0.5
        assert lr_multiplier("noam", step - 1, 0, warmup) == pytest.approx(paper / peak)


def test_constant_and_scheduler_steps_per_optimizer_step():
    assert lr_multiplier("constant", 500, 1000, 0) == 1.0
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    from tformer_cli.training.config import ScheduleConfig

    sched = build(opt, ScheduleConfig(name="linear_warmup", warmup_steps=2, warmup_ratio=0.0, min_lr_ratio=0.0), 4)
    lrs = []
    for _ in range(4):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.05, 0.1, 0.05, 0.0])


def test_unknown_schedule_is_a_clear_error():
    with pytest.raises(TformerError, match="not one of constant"):
        lr_multiplier("warmup_cosine_restarts", 0, 10, 1)


def test_a_restart_runs_the_schedule_twice_back_to_back():
    """schedules.build(restart_at=N) (mlm.head_warmup_steps): the configured schedule over the first N steps, then
    again over the rest, each with its own warm-up, so the encoder's first steps are at a small rate, not near the
    peak."""
    cfg = ScheduleConfig(name="linear_warmup", warmup_steps=None, warmup_ratio=0.1, min_lr_ratio=0.0)
    seen = []
    for restart in (0, 40):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = build(opt, cfg, total_steps=140, restart_at=restart)
        rates = []
        for _ in range(140):
            rates.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        seen.append(rates)
    plain, restarted = seen
    assert restarted[:40] == pytest.approx([lr_multiplier("linear_warmup", s, 40, 4) for s in range(40)])
    assert restarted[40:] == pytest.approx([lr_multiplier("linear_warmup", s, 100, 10) for s in range(100)])
    assert restarted[40] == pytest.approx(0.1) and plain[40] > 0.7  # the second phase starts with its warm-up
