"""Classification's objective, the base of every classifier task, plugged into the one loop (`loop.fit`): how a
batch becomes a loss and an optimizer step, how validation scores an epoch, and what the epoch's line says. Each
other task keeps its objective beside its job (runs/distill.py: Distillation, runs/pretraining.py: masked-LM); the
loop, checkpoints, resume and Ctrl-C come with any class that has the members of `loop.Objective`.
"""
from __future__ import annotations

import torch

from ..data.tokenization import TokenizedSplit
from ..evaluation.evaluate import validation_metrics
from .loop import Optimization, Run, class_weight_share, train_step


class Classification:
    """Cross-entropy (or per-label binary cross-entropy) on labelled texts; validation loss, accuracy and F1."""

    loss_name, loss_label, bar_prefix = "loss", "loss", ""
    exact_slices = True  # micro-batches add up to the whole batch's update (trainer.micro_batches may change)
    best_from_step = 0  # every epoch may be the best

    def __init__(self, label_names: list[str], loss_weight: torch.Tensor | None = None, label_smoothing: float = 0.0):
        self.label_names, self.loss_weight, self.label_smoothing = label_names, loss_weight, label_smoothing

    def loss_options(self) -> dict:
        return {"loss_weight": self.loss_weight, "label_smoothing": self.label_smoothing}

    def step(self, opt: Optimization, batch: dict, step: int, share: float, micro_batches: int) -> torch.Tensor:
        return train_step(opt, batch, share, micro_batches=micro_batches)

    def share(self, split: TokenizedSplit, rows: torch.Tensor, whole: torch.Tensor, world: int) -> float:
        """The weight of a rank's loss so that DDP's gradient average is the gradient of the global batch's loss:
        its rows' share of the global batch (by class weight when the loss is class-weighted: Σw over Σw)."""
        if self.loss_weight is not None and split.labels.dim() == 1:
            return world * float(class_weight_share(self.loss_weight, split.labels, rows, whole))
        return world * len(rows) / len(whole)

    def validate(self, run: Run) -> dict:
        return validation_metrics(run.model, run.validation, self.label_names, pad_id=run.pad_id, device=run.device,
                                  precision=run.precision, batch_size=run.trainer.eval_batch_size,
                                  loss_weight=self.loss_weight)

    def epoch_line(self, m: dict) -> str:
        return (f"train_loss {m['train_loss']:.4f}  val_loss {m['val_loss']:.4f}  val_acc {m['val_accuracy']:.4f}  "
                f"val_f1 {m['val_f1']:.4f}")
