"""The training loop, readable top to bottom: epochs of length-grouped batches, validation, early stopping,
best/last checkpoints, resumption and clean interruption. Everything it needs is built by commands/train.py and
passed in a `Run`."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from ..data.batching import BatchLoader
from ..data.tokenization import TokenizedSplit
from ..errors import TformerError
from . import optim as optim_lib
from . import schedules
from . import state as state_lib
from .early_stopping import EarlyStopping
from .hardware import MaybeCompiled, Precision
from .inference import predict_proba


class Interrupted(TformerError):
    """SIGINT/SIGTERM: the last checkpoint has been written; the message says how to resume."""

    exit_code = 130


@dataclass
class Run:
    model: torch.nn.Module
    train: TokenizedSplit
    validation: TokenizedSplit
    label_names: list[str]
    pad_id: int
    device: torch.device
    precision: Precision
    trainer_cfg: object
    optimizer_cfg: object
    schedule_cfg: object
    freeze_epochs: int
    embedding_lr_multiplier: float
    # (which: best|last, metrics, meta, training-state tensors or None, training-state JSON or None) -> None
    save_checkpoint: Callable[..., None]
    run_dir: Path
    loss_weight: torch.Tensor | None = None
    label_smoothing: float = 0.0
    history: list[dict] = field(default_factory=list)
    resume: tuple[dict, dict] | None = None  # (tensors, json) of a `last` checkpoint's training state
    stop_requested: bool = False  # set by a signal handler; the loop saves and stops after the current step


def _validate(run: Run) -> dict:
    from ..evaluation.metrics import compute

    probs, loss = predict_proba(run.model, run.validation, batch_size=int(run.trainer_cfg.eval_batch_size),
                                pad_id=run.pad_id, device=run.device, precision=run.precision,
                                loss_weight=run.loss_weight, progress="validating")
    m = compute(run.validation.labels.numpy(), probs.argmax(-1).numpy(), run.label_names, loss)
    return {"val_loss": m["loss"], "val_accuracy": m["accuracy"], "val_f1": m["f1"],
            "val_precision": m["precision"], "val_recall": m["recall"]}


def fit(run: Run) -> dict:
    """Train; returns the best epoch's metrics (the monitored value is what a sweeper optimises)."""
    from rich.console import Console
    from tqdm.auto import tqdm

    console = Console()
    tcfg = run.trainer_cfg
    model, device = run.model.to(run.device), run.device
    loader = BatchLoader(run.train, int(tcfg.batch_size), run.pad_id, shuffle=True, seed=int(tcfg.seed),
                         num_workers=int(tcfg.get("num_workers", 0)), pin_memory=device.type == "cuda")
    epochs = int(tcfg.epochs)
    total_steps = epochs * len(loader)
    optimizer = optim_lib.build(model, run.optimizer_cfg, run.embedding_lr_multiplier, device)
    scheduler = schedules.build(optimizer, run.schedule_cfg, total_steps)
    scaler = run.precision.grad_scaler()
    es_cfg = tcfg.early_stopping
    stopper = EarlyStopping(str(es_cfg.monitor), str(es_cfg.mode), int(es_cfg.patience), float(es_cfg.min_delta))
    clip = float(tcfg.get("grad_clip", 0.0) or 0.0)
    log_every = max(1, int(tcfg.get("log_every_steps", 20)))
    every = int(tcfg.get("checkpoint_every_steps", 0) or 0)
    forward = MaybeCompiled(model, bool(tcfg.get("compile", False)), console.print)
    step, start_epoch, skip, carried = 0, 0, 0, (0.0, 0)
    best_metrics: dict = {}

    def training_state(epoch: int, batches_done: int, loss_sum: float, seen: int, frozen: bool):
        tensors, rng = state_lib.rng_state()
        opt_tensors, opt_json = state_lib.optimizer_state(optimizer)
        tensors.update(opt_tensors)
        meta = {"epoch_index": epoch, "batches_done": batches_done, "step": step, "epoch_loss_sum": loss_sum,
                "epoch_seen": seen, "rng": rng, "optimizer": opt_json, "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else None, "early_stopping": stopper.state_dict(),
                "best_metrics": best_metrics, "history": run.history, "embeddings_frozen": frozen}
        return tensors, meta

    if run.resume is not None:
        tensors, meta = run.resume
        state_lib.load_optimizer_state(optimizer, tensors, meta["optimizer"])
        scheduler.load_state_dict(meta["scheduler"])
        if scaler is not None and meta.get("scaler"):
            scaler.load_state_dict(meta["scaler"])
        stopper.load_state_dict(meta["early_stopping"])
        best_metrics, run.history[:] = dict(meta["best_metrics"]), list(meta["history"])
        step, start_epoch, skip = int(meta["step"]), int(meta["epoch_index"]), int(meta["batches_done"])
        carried = (float(meta["epoch_loss_sum"]), int(meta["epoch_seen"]))
        state_lib.set_rng_state(tensors, meta["rng"])
        console.print(f"resuming at epoch {start_epoch + 1}, batch {skip} (step {step})", highlight=False)
        if stopper.should_stop or start_epoch >= epochs:
            console.print("the run had already finished; nothing to do")

    for epoch in range(start_epoch, epochs):
        if stopper.should_stop:
            break
        frozen = epoch < run.freeze_epochs
        optim_lib.set_embedding_frozen(model, frozen)
        model.train()
        loader.set_epoch(epoch)
        t0 = time.perf_counter()
        loss_sum = torch.full((), carried[0], device=device)  # accumulated on the device; read at log points
        seen, carried = carried[1], (0.0, 0)
        window_loss, window_n = torch.zeros((), device=device), 0
        batches = loader.batches()[skip:]
        first, skip = len(loader) - len(batches), 0
        bar = tqdm(loader.iterate(batches), total=len(loader), initial=first, unit="batch", leave=False,
                   desc=f"epoch {epoch + 1}/{epochs}" + (" (embeddings frozen)" if frozen else ""),
                   dynamic_ncols=True, disable=None)
        for i, batch in enumerate(bar, start=first + 1):
            ids = batch["input_ids"].to(device, non_blocking=True)
            mask = batch["attention_mask"].to(device, non_blocking=True)
            labels = batch["labels"].to(device, non_blocking=True)
            with run.precision.autocast():
                logits = forward(ids, mask)
            loss = F.cross_entropy(logits.float(), labels, weight=run.loss_weight,
                                   label_smoothing=run.label_smoothing)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            else:
                loss.backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            b = labels.shape[0]
            loss_sum += loss.detach() * b
            window_loss += loss.detach()
            window_n += 1
            seen += b
            if step % log_every == 0:
                running = float(window_loss) / window_n  # the one host sync, every log_every steps
                if not math.isfinite(running):
                    raise TformerError(f"loss became {running} near step {step} (epoch {epoch + 1}); the best "
                                       f"checkpoint is kept; try a lower learning rate (optimizer.lr) or "
                                       f"trainer.grad_clip=1.0")
                bar.set_postfix(loss=f"{running:.4f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
                window_loss.zero_()
                window_n = 0
            stop = run.stop_requested
            if (every and step % every == 0 and i < len(loader)) or (stop and i < len(loader)):
                tensors, meta = training_state(epoch, i, float(loss_sum), seen, frozen)
                run.save_checkpoint("last", {"step": step, "epoch": epoch + 1, "batches_done": i},
                                    {"epoch": epoch + 1, "step": step, "embeddings_frozen": frozen}, tensors, meta)
            if stop and i < len(loader):
                bar.close()
                raise Interrupted(f"interrupted at epoch {epoch + 1}, step {step}; the last checkpoint is saved")
        bar.close()
        train_loss = float(loss_sum) / max(seen, 1)
        if not math.isfinite(train_loss):
            raise TformerError(f"training loss is {train_loss} in epoch {epoch + 1} (step {step}); the best checkpoint "
                               f"is kept; try a lower learning rate (optimizer.lr) or trainer.grad_clip=1.0")
        train_time = time.perf_counter() - t0
        metrics = {"epoch": epoch + 1, "step": step, "train_loss": train_loss, **_validate(run),
                   "lr": scheduler.get_last_lr()[0], "epoch_seconds": train_time,
                   "train_samples_per_s": seen / train_time}
        run.history.append(metrics)
        is_best = stopper.update(metrics, epoch + 1)
        meta = {"epoch": epoch + 1, "step": step, "embeddings_frozen": frozen}
        if is_best:
            best_metrics = dict(metrics)
            run.save_checkpoint("best", metrics, meta, None, None)
        tensors, state = training_state(epoch + 1, 0, 0.0, 0, frozen)
        run.save_checkpoint("last", metrics, meta, tensors, state)
        console.print(
            f"epoch {epoch + 1:>3}/{epochs}  train_loss {train_loss:.4f}  val_loss {metrics['val_loss']:.4f}  "
            f"val_acc {metrics['val_accuracy']:.4f}  val_f1 {metrics['val_f1']:.4f}  "
            f"{seen / train_time:,.0f} samples/s  {train_time:.1f}s" + ("  [green]* best[/]" if is_best else ""),
            highlight=False)
        if stopper.should_stop:
            console.print(f"early stopping: {stopper.monitor} has not improved for {stopper.patience} epochs "
                          f"(best {stopper.best:.4f} at epoch {stopper.best_epoch})")
            break
        if run.stop_requested:
            raise Interrupted(f"interrupted after epoch {epoch + 1}, step {step}; the last checkpoint is saved")
    best_metrics["monitor"] = stopper.monitor
    best_metrics["best_value"] = stopper.best
    return best_metrics
