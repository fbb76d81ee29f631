"""The training loop, readable top to bottom: epochs of length-grouped batches, validation, early stopping,
best/last checkpoints. Everything it needs is built by commands/train.py and passed in a `Run`."""
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
from .early_stopping import EarlyStopping
from .hardware import Precision
from .inference import predict_proba


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
    save_checkpoint: Callable[[str, dict, dict], None]  # (which: best|last, metrics, meta) -> None
    run_dir: Path
    loss_weight: torch.Tensor | None = None
    history: list[dict] = field(default_factory=list)


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
    step = 0
    best_metrics: dict = {}

    for epoch in range(epochs):
        frozen = epoch < run.freeze_epochs
        optim_lib.set_embedding_frozen(model, frozen)
        model.train()
        loader.set_epoch(epoch)
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=device)  # accumulated on the device; read only at log points
        seen = 0
        window_loss, window_n = torch.zeros((), device=device), 0
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{epochs}" + (" (embeddings frozen)" if frozen else ""),
                   unit="batch", leave=False, dynamic_ncols=True, disable=None)
        for batch in bar:
            ids = batch["input_ids"].to(device, non_blocking=True)
            mask = batch["attention_mask"].to(device, non_blocking=True)
            labels = batch["labels"].to(device, non_blocking=True)
            with run.precision.autocast():
                logits = model(ids, mask)
            loss = F.cross_entropy(logits.float(), labels, weight=run.loss_weight,
                                   label_smoothing=float(tcfg.get("label_smoothing", 0.0)))
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
                    raise TformerError(f"loss became {running} at step {step} (epoch {epoch + 1}); the best checkpoint "
                                       f"is kept; try a lower learning rate (optimizer.lr) or trainer.grad_clip=1.0")
                bar.set_postfix(loss=f"{running:.4f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
                window_loss.zero_()
                window_n = 0
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
            run.save_checkpoint("best", metrics, meta)
        run.save_checkpoint("last", metrics, meta)
        console.print(
            f"epoch {epoch + 1:>3}/{epochs}  train_loss {train_loss:.4f}  val_loss {metrics['val_loss']:.4f}  "
            f"val_acc {metrics['val_accuracy']:.4f}  val_f1 {metrics['val_f1']:.4f}  "
            f"{seen / train_time:,.0f} samples/s  {train_time:.1f}s" + ("  [green]* best[/]" if is_best else ""),
            highlight=False)
        if stopper.should_stop:
            console.print(f"early stopping: {stopper.monitor} has not improved for {stopper.patience} epochs "
                          f"(best {stopper.best:.4f} at epoch {stopper.best_epoch})")
            break
    best_metrics["monitor"] = stopper.monitor
    best_metrics["best_value"] = stopper.best
    return best_metrics
