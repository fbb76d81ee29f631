"""The one training loop, readable top to bottom: epochs of length-grouped batches, validation, early stopping,
best/last checkpoints, resumption and clean interruption, for every training task.

Parts with names: `Optimization` (optimizer, LR schedule, gradient scaler: the stateful parts of a step),
`train_step` (one classification step; the benchmark times this very function), `TrainingState` (where the loop
is, saved with every `last` checkpoint) and the `Objective` (what differs between tasks: how a batch becomes a
loss, how validation scores; each task's beside its job in runs/). The run engine builds a `Run` and calls `fit`.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch
import torch.nn.functional as F

from .. import cores
from ..console import output, progress
from ..data.batching import BatchLoader
from ..data.tokenization import TokenizedSplit
from ..errors import ConfigError, TformerError
from ..hardware import MaybeCompiled, Precision, release_freed_host_memory
from ..inference import weighted_bce
from ..model.fast_paths import Layout
from . import optim as optim_lib
from . import schedules
from . import distributed
from . import state as state_lib
from .config import OptimizerConfig, ScheduleConfig, TrainerConfig
from .distributed import Dist
from .early_stopping import EarlyStopping
from .state import TrainingState


class Objective(Protocol):
    """A training task plugged into `fit` (classification in training/objectives.py; the other tasks' beside their jobs in runs/)."""

    loss_name: str  # the loss's metric names: "loss" logs loss / train_loss, "mlm_loss" train_mlm_loss
    loss_label: str  # the loss in messages: "loss", "MLM loss"
    bar_prefix: str  # before "epoch k/n" on the progress bar
    best_from_step: int  # an epoch ending at or before this step is never the best (a head warm-up's: 0 for most)

    def loss_options(self) -> dict: ...  # extra Optimization(...) arguments (class weights, smoothing, a restart)

    def step(self, opt: "Optimization", batch: dict, step: int, share: float, micro_batches: int) -> torch.Tensor:
        ...  # one optimizer step on a batch; the loss, detached, on the device

    def share(self, split: TokenizedSplit, rows: torch.Tensor, whole: torch.Tensor, world: int) -> float: ...

    def validate(self, run: "Run") -> dict: ...  # the epoch's validation metrics (val_...)

    def epoch_line(self, metrics: dict) -> str: ...  # the losses and scores of an epoch's line


class Interrupted(TformerError):
    """SIGINT/SIGTERM: the last checkpoint has been written; the message says how to resume."""

    exit_code = 130


class Optimization:
    """What a training step needs besides the batch: the model's forward (compiled or not), the loss, and the
    stateful optimizer, LR schedule and gradient scaler (disabled, and so a pass-through, unless fp16 on CUDA)."""

    def __init__(self, model: torch.nn.Module, *, optimizer: OptimizerConfig, schedule: ScheduleConfig,
                 total_steps: int, device: torch.device, precision: Precision, grad_clip: float = 0.0,
                 embedding_lr_multiplier: float = 1.0, layer_lr_decay: float = 1.0,
                 loss_weight: torch.Tensor | None = None,
                 label_smoothing: float = 0.0, compile: bool = False, distributed: bool = False,
                 say: Callable[[str], None] = print, schedule_restart: int = 0):
        self.model, self.device, self.precision, self.grad_clip = model, device, precision, grad_clip
        self.loss_weight, self.label_smoothing = loss_weight, label_smoothing
        self.forward = MaybeCompiled(model, compile, say)
        self.row_updates = optim_lib.use_row_updates(model, optimizer, compile, distributed)
        self.optimizer = optim_lib.build(model, optimizer, embedding_lr_multiplier, device, layer_lr_decay)
        self.scheduler = schedules.build(self.optimizer, schedule, total_steps, schedule_restart)
        self.scaler = precision.grad_scaler()
        self.base_lr = optimizer.lr

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if labels.dim() == 2:  # multi-label: an independent yes/no per label (smoothing pulls targets toward 0.5)
            targets = labels * (1 - self.label_smoothing) + 0.5 * self.label_smoothing
            return weighted_bce(logits.float(), targets, self.loss_weight)
        return F.cross_entropy(logits.float(), labels, weight=self.loss_weight, label_smoothing=self.label_smoothing)

    @property
    def lr(self) -> float:
        """optimizer.lr under the schedule: the top layers' and the head's rate. Under layer-wise decay or an
        embedding multiplier the other groups run at fixed fractions of it (the first group is the lowest layer)."""
        group = self.optimizer.param_groups[0]
        start = group.get("initial_lr") or 0.0
        if not start or start == self.base_lr:
            return group["lr"]
        return self.base_lr * group["lr"] / start

    def state_dict(self) -> tuple[dict, dict]:
        tensors, opt_json = state_lib.optimizer_state(self.optimizer)
        return tensors, {"optimizer": opt_json, "scheduler": self.scheduler.state_dict(),
                         "scaler": self.scaler.state_dict()}

    def load_state_dict(self, tensors: dict, state: dict) -> None:
        state_lib.load_optimizer_state(self.optimizer, tensors, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def train_step(opt: Optimization, batch: dict[str, torch.Tensor], loss_weight: float = 1.0,
               micro_batches: int = 1) -> torch.Tensor:
    """Forward, loss, backward, gradient clipping, optimizer and schedule step. Returns the loss (detached,
    still on the device: reading it would wait for the step to finish). loss_weight scales what is
    backpropagated (a rank's share of a global batch under DDP), not what is returned.

    micro_batches = N > 1 runs the batch as N slices of rows whose gradients add up to the whole batch's (each
    slice's loss weighted by its share of the batch's loss): the same update with about 1/N of the activation
    memory, for machines where a batch of long texts does not fit."""
    ids = batch["input_ids"].to(opt.device, non_blocking=True)
    host_mask = batch["attention_mask"]
    mask = host_mask.to(opt.device, non_blocking=True)
    labels = batch["labels"].to(opt.device, non_blocking=True)
    unpad = opt.forward.compiled is None  # compiled graphs want few shapes: padded or not, never N real tokens

    def slice_loss(part: slice) -> torch.Tensor:
        layout = Layout.of(host_mask[part], opt.device, unpad)  # read on the host: no wait on the device
        with opt.precision.autocast():
            logits = opt.forward(ids[part], mask[part], layout=layout)
        loss = opt.loss(logits, labels[part])
        return loss if part.stop - part.start == len(labels) else loss * _loss_share(opt, labels, part)

    return sliced_update(opt, labels.shape[0], micro_batches, slice_loss, loss_weight)


def sliced_update(opt: Optimization, rows: int, micro_batches: int, slice_loss: Callable[[slice], torch.Tensor],
                  loss_weight: float = 1.0) -> torch.Tensor:
    """One update from a batch taken as row slices (one slice unless micro_batches > 1): slice_loss(part) runs
    that slice's forward and returns its share of the whole batch's loss, so the gradients summed in .grad are
    the whole batch's. Returns the summed loss (detached, on the device). Shared by classification and
    pretraining, which differ only in how a slice's share is counted (rows, class weights, masked tokens)."""
    total = torch.zeros((), device=opt.device)
    parts = micro_slices(rows, micro_batches)
    for k, part in enumerate(parts):
        # under DDP only the last slice's backward all-reduces (no_sync: the earlier ones just accumulate)
        syncing = k == len(parts) - 1 or not hasattr(opt.forward.model, "no_sync")
        with contextlib.nullcontext() if syncing else opt.forward.model.no_sync():
            loss = slice_loss(part)
            backward(opt, loss * loss_weight if loss_weight != 1.0 else loss)
        total += loss.detach()
    update(opt)
    return total


def micro_slices(rows: int, n: int) -> list[slice]:
    """min(n, rows) contiguous slices covering rows 0..rows-1, their sizes differing by at most one."""
    k = max(min(n, rows), 1)
    bounds = [i * rows // k for i in range(k + 1)]
    return [slice(bounds[i], bounds[i + 1]) for i in range(k)]


def _loss_share(opt: Optimization, labels: torch.Tensor, part: slice) -> torch.Tensor | float:
    """The part of the whole batch's (mean) loss that a slice of rows carries: its rows' share, or with class
    weights its rows' weight over the batch's."""
    if opt.loss_weight is not None and labels.dim() == 1:
        return class_weight_share(opt.loss_weight, labels, part, slice(None))
    return (part.stop - part.start) / labels.shape[0]  # (micro_slices gives explicit bounds)


def class_weight_share(weight: torch.Tensor, labels: torch.Tensor, part, whole) -> torch.Tensor:
    """Rows `part`'s share of the class-weighted loss of rows `whole` (single-label): cross-entropy with class
    weights divides by the summed weight of the targets, so a part carries its weight over the whole's. Used for
    micro-batch slices and for DDP ranks' parts of a global batch."""
    w = weight.to(labels.device)
    return w[labels[part]].sum() / w[labels[whole]].sum()


def backward(opt: Optimization, loss: torch.Tensor) -> None:
    """Adds the loss's gradients (scaled under fp16) to what earlier micro-batches left in .grad."""
    opt.scaler.scale(loss).backward()


def update(opt: Optimization) -> None:
    """Gradient clipping, optimizer and schedule step on the gradients accumulated since the last update."""
    if opt.grad_clip > 0:
        opt.scaler.unscale_(opt.optimizer)  # clip the true gradients, not the scaled ones
        optim_lib.clip_grad_norm(opt.model.parameters(), opt.grad_clip)
    if opt.scaler.is_enabled():  # fp16: a step with inf/NaN gradients is skipped, and so is its schedule step
        scale = opt.scaler.get_scale()
        opt.scaler.step(opt.optimizer)
        opt.scaler.update()
        stepped = opt.scaler.get_scale() >= scale  # the scaler backs off after (only after) a skipped step
    else:
        opt.optimizer.step()
        stepped = True
    if stepped:
        opt.scheduler.step()
    opt.optimizer.zero_grad(set_to_none=True)


# (which checkpoint: best | last, metrics, the training state (tensors, JSON) for last, or None) -> None
SaveCheckpoint = Callable[[str, dict, "tuple[dict, dict] | None"], None]


@dataclass
class Run:
    """Everything `fit` needs, built by a run engine job (runs/classify.py, runs/pretraining.py) or a test.
    What is specific to one training task (its loss, validation, epoch line) is the `objective`."""

    model: torch.nn.Module
    train: TokenizedSplit
    validation: TokenizedSplit
    objective: "Objective"
    pad_id: int
    device: torch.device
    precision: Precision
    trainer: TrainerConfig
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    save_checkpoint: SaveCheckpoint
    freeze_epochs: int = 0  # the token table (and freeze_layers lower layers) frozen for this many epochs
    freeze_layers: int = 0
    embedding_lr_multiplier: float = 1.0
    layer_lr_decay: float = 1.0
    resume: tuple[dict, dict] | None = None  # (tensors, JSON) of a `last` checkpoint's training state
    stop_requested: bool = False  # set by a signal handler; the loop saves and stops after the current step
    say: Callable[..., None] | None = None  # rich-style print(text, highlight=...); default: a rich Console
    log_metrics: Callable[[dict], None] | None = None  # one record per logged step and per epoch (metrics.jsonl)
    dist: Dist = field(default_factory=Dist)  # this process's place in a torchrun launch (distributed.py)


def fit(run: Run) -> TrainingState:
    """Train; returns the final state (its best_metrics hold the monitored value a sweeper optimises)."""
    if run.say is None:
        run.say = output().print
    tcfg, objective = run.trainer, run.objective
    if not isinstance(tcfg.epochs, int):  # (train and distill choose it from the data before they get here)
        raise ConfigError(f"trainer.epochs={tcfg.epochs} is chosen by tformer train and distill; pass a number of "
                          f"epochs to this job")
    if isinstance(run.optimizer.lr, str):  # (likewise optimizer.lr=auto: train, distill and pretrain resolve it)
        raise ConfigError("optimizer.lr=auto is chosen by tformer train, distill and pretrain; pass optimizer.lr=<lr> "
                          "to this job")
    model = run.model.to(run.device)
    loader = BatchLoader(run.train, tcfg.batch_size, run.pad_id, shuffle=True, seed=tcfg.seed,
                         num_workers=tcfg.num_workers, pin_memory=run.device.type == "cuda")
    steps_per_epoch = len(loader)
    if run.dist.enabled:  # (a last global batch with fewer rows than ranks is dropped: distributed.shard)
        steps_per_epoch -= int(0 < len(run.train) % tcfg.batch_size < run.dist.world)
    opt = Optimization(model, optimizer=run.optimizer, schedule=run.schedule, total_steps=tcfg.epochs * steps_per_epoch,
                       device=run.device, precision=run.precision, grad_clip=tcfg.grad_clip,
                       embedding_lr_multiplier=run.embedding_lr_multiplier, layer_lr_decay=run.layer_lr_decay,
                       compile=tcfg.compile, distributed=run.dist.enabled, say=run.say, **objective.loss_options())
    es = tcfg.early_stopping
    state = TrainingState(EarlyStopping(es.monitor, es.mode, es.patience, es.min_delta))
    if run.resume is not None:
        _restore(run, state, opt)
    wrapped_for = None  # the frozen/unfrozen state the DDP wrapper was built for
    while state.epoch < tcfg.epochs and not state.stopper.should_stop:
        state.embeddings_frozen = state.epoch < run.freeze_epochs
        if run.freeze_epochs:
            optim_lib.set_embedding_frozen(model, state.embeddings_frozen, run.freeze_layers)
        if run.dist.enabled and wrapped_for != state.embeddings_frozen:
            opt.forward = MaybeCompiled(distributed.wrap(model, run.dist, run.device), tcfg.compile, run.say)
            wrapped_for = state.embeddings_frozen
        _train_epoch(run, state, opt, loader)
        metrics = _end_epoch(run, state, opt)
        if run.dist.enabled:  # a signal that came while rank 0 was saving: every rank must take the same branch
            run.stop_requested = distributed.any_rank(run.stop_requested, run.device)
        if state.stopper.should_stop:
            run.say(f"early stopping: {state.stopper.monitor} has not improved for {state.stopper.patience} "
                    f"epochs (best {state.stopper.best:.4f} at epoch {state.stopper.best_epoch})")
        elif run.stop_requested:
            raise Interrupted(f"interrupted after epoch {metrics['epoch']}, step {state.step}; the last checkpoint "
                              f"is saved")
    state.best_metrics.update(monitor=state.stopper.monitor, best_value=state.stopper.best)
    return state


def _restore(run: Run, state: TrainingState, opt: Optimization) -> None:
    tensors, saved = run.resume
    world = int(saved.get("processes", 1))
    if world != run.dist.world and int(saved.get("batches_done", 0)) > 0:
        raise TformerError(f"the run stopped mid-epoch with {world} process(es): its place in the epoch is in "
                           f"their batches; resume with trainer.devices={world} (at an epoch boundary any number "
                           f"of processes may continue it)")
    opt.load_state_dict(tensors, saved)
    state.load_state_dict(tensors, saved)  # last: it also restores the random number generators
    if state.stopper.should_stop or state.epoch >= run.trainer.epochs:
        run.say(f"resuming after epoch {state.epoch} (step {state.step}): training had already ended; its reports "
                f"follow", highlight=False)
    else:
        run.say(f"resuming at epoch {state.epoch + 1}, batch {state.batches_done} (step {state.step})",
                highlight=False)


def _training_files(state: TrainingState, opt: Optimization, world: int = 1) -> tuple[dict, dict]:
    tensors, saved = state.state_dict()
    opt_tensors, opt_saved = opt.state_dict()
    return {**tensors, **opt_tensors}, {**saved, **opt_saved, "processes": world}


def _train_epoch(run: Run, state: TrainingState, opt: Optimization, loader: BatchLoader) -> None:
    """One epoch from `state.batches_done` on; saves `last` every checkpoint_every_steps and on interruption.
    Losses accumulate on the device and are read on the host once every log_every_steps; the time spent adds to
    state.epoch_seconds."""
    tcfg, epoch, dist = run.trainer, state.epoch, run.dist
    run.model.train()
    loader.set_epoch(epoch)
    t0, seconds_before = time.perf_counter(), state.epoch_seconds
    everything = loader.batches()
    if dist.enabled:  # this rank's rows of each global batch; the epoch's sums so far are counted once, by rank 0
        everything = distributed.shard(everything, dist)
        if not dist.is_main:
            state.epoch_loss_sum, state.epoch_seen = 0.0, 0
    n_batches = len(everything)
    todo = everything[state.batches_done:]
    shares = [run.objective.share(run.train, rows, whole, dist.world) for rows, whole in todo] if dist.enabled else None
    wholes = [len(whole) for _, whole in todo] if dist.enabled else None
    loss_sum = torch.full((), state.epoch_loss_sum, device=run.device)
    window, window_n = torch.zeros((), device=run.device), 0
    window_t, window_seen = time.perf_counter(), 0
    bar = progress(loader.iterate([rows for rows, _ in todo] if dist.enabled else todo), total=n_batches,
                   initial=state.batches_done, unit="batch", enabled=dist.is_main,
                   desc=f"{run.objective.bar_prefix}epoch {epoch + 1}/{tcfg.epochs}"
                   + (" (embeddings frozen)" * state.embeddings_frozen))
    for i, batch in enumerate(bar):
        rows = batch["input_ids"].shape[0]
        loss = run.objective.step(opt, batch, state.step, shares[i] if dist.enabled else 1.0, tcfg.micro_batches)
        state.step, state.batches_done = state.step + 1, state.batches_done + 1
        if dist.enabled:  # this rank's part of the global batch's loss: summed over ranks, the loss one process sees
            loss = loss * (shares[i] / dist.world)
            loss_sum += loss * wholes[i]
        else:
            loss_sum += loss * rows
        state.epoch_seen += rows
        cores.rebalance()  # fewer threads while other processes want the cores, more when they are free again
        window, window_n, window_seen = window + loss, window_n + 1, window_seen + rows
        every = tcfg.checkpoint_every_steps
        logging_step = state.step % tcfg.log_every_steps == 0
        stop = run.stop_requested
        if dist.enabled:  # ranks agree on a stop at log and checkpoint steps (not every step: each is a host sync)
            stop = (logging_step or bool(every and state.step % every == 0)) and \
                distributed.any_rank(run.stop_requested, run.device)
        if logging_step:
            if dist.enabled:  # every rank's losses: the same finite check and the same figure on every rank
                total, window_seen = distributed.all_sum([float(window), window_seen], run.device)
                running = total / window_n
            else:
                running = float(window) / window_n  # the one host sync, every log_every_steps
            check_finite(running, run.objective.loss_label, f"near step {state.step} (epoch {epoch + 1})")
            bar.set_postfix(loss=f"{running:.4f}", lr=f"{opt.lr:.2e}")
            if run.log_metrics is not None:
                now = time.perf_counter()
                run.log_metrics({"kind": "step", "step": state.step, "epoch": epoch + 1, run.objective.loss_name: running,
                                 "lr": opt.lr, "samples_per_s": window_seen / max(now - window_t, 1e-9)})
                window_t, window_seen = now, 0
            window, window_n = torch.zeros((), device=run.device), 0
        elif i == 0 and dist.is_main:  # the bar shows a loss from its first step, not only from the first logged
            bar.set_postfix(loss=f"{float(window) / window_n:.4f}", lr=f"{opt.lr:.2e}")  # one (an epoch of 10 steps)
        mid_epoch = state.batches_done < n_batches
        if mid_epoch and (stop or (every and state.step % every == 0)):
            state.epoch_loss_sum = float(loss_sum)
            state.epoch_seconds = seconds_before + time.perf_counter() - t0
            saved_local = (state.epoch_loss_sum, state.epoch_seen)
            if dist.enabled:  # `last` holds the whole epoch's sums (every rank's), as a single process's would
                state.epoch_loss_sum, state.epoch_seen = distributed.all_sum(list(saved_local), run.device)
                state.epoch_seen = int(state.epoch_seen)
            run.save_checkpoint("last", {"step": state.step, "epoch": epoch + 1, "batches_done": state.batches_done},
                                _training_files(state, opt, run.dist.world))
            if stop:
                bar.close()
                raise Interrupted(f"interrupted at epoch {epoch + 1}, step {state.step}; the last checkpoint is saved")
            state.epoch_loss_sum, state.epoch_seen = saved_local  # each rank goes on with its own part
    bar.close()
    state.epoch_loss_sum = float(loss_sum)
    if dist.enabled:  # the epoch's train loss and throughput over every rank's rows
        total, seen = distributed.all_sum([state.epoch_loss_sum, state.epoch_seen], run.device)
        state.epoch_loss_sum, state.epoch_seen = total, int(seen)
    state.epoch_seconds = seconds_before + time.perf_counter() - t0


def _end_epoch(run: Run, state: TrainingState, opt: Optimization) -> dict:
    """Validate, record, save `best` (if it is) and `last`, print the epoch line."""
    epoch, seen, name = state.epoch + 1, state.epoch_seen, run.objective.loss_name
    train_loss = state.epoch_loss_sum / max(seen, 1)
    check_finite(train_loss, run.objective.loss_label, f"in epoch {epoch} (step {state.step})")
    metrics = {"epoch": epoch, "step": state.step, f"train_{name}": train_loss, **run.objective.validate(run),
               "lr": opt.lr, "epoch_seconds": state.epoch_seconds, "train_samples_per_s": state.samples_per_s()}
    state.history.append(metrics)
    if run.log_metrics is not None:
        run.log_metrics({"kind": "epoch", **metrics})
    is_best = state.step > run.objective.best_from_step and state.stopper.update(metrics, epoch)
    if is_best:
        state.best_metrics = dict(metrics)
        run.save_checkpoint("best", metrics, None)
    state.start_epoch()
    run.save_checkpoint("last", metrics, _training_files(state, opt, run.dist.world))
    release_freed_host_memory()
    run.say(f"epoch {epoch:>3}/{run.trainer.epochs}  {run.objective.epoch_line(metrics)}  "
            f"{metrics['train_samples_per_s']:,.0f} samples/s  {metrics['epoch_seconds']:.1f}s"
            + ("  [green]* best[/]" if is_best else ""), highlight=False)
    return metrics


def check_finite(loss: float, label: str, where: str) -> None:
    """The one NaN/inf guard of every objective's loss (read at log steps and at the end of each epoch)."""
    if not math.isfinite(loss):
        raise TformerError(f"the {label} became {loss} {where}; checkpoints saved before it are kept; try a lower learning "
                           f"rate (optimizer.lr) or trainer.grad_clip=1.0")
