"""What differs between training tasks, plugged into the one loop (`loop.fit`): how a batch becomes a loss and an
optimizer step, how validation scores an epoch, and what the epoch's line says. A new task (e.g. distillation) is
one more class here with the members of `loop.Objective`; the loop, checkpoints, resume and Ctrl-C come with it.
"""
from __future__ import annotations

import torch

from ..data.batching import BatchLoader
from ..data.tokenization import TokenizedSplit
from ..evaluation.evaluate import validation_metrics
from ..model.mlm import IGNORE, mask_tokens
from .loop import Optimization, Run, class_weight_share, sliced_update, train_step


class Classification:
    """Cross-entropy (or per-label binary cross-entropy) on labelled texts; validation loss, accuracy and F1."""

    loss_name, loss_label, bar_prefix = "loss", "loss", ""

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


class MaskedLanguageModeling:
    """Masked-token prediction (model/mlm.py) on unlabeled text. The masks come from a seed per step, so a resumed
    run draws the same ones; validation uses masks that are the same every epoch, so epochs are comparable."""

    loss_name, loss_label, bar_prefix = "mlm_loss", "MLM loss", "pretrain "

    def __init__(self, *, mask_id: int, vocab_size: int, special_ids: list[int], seed: int, mask_prob: float):
        self.mask_id, self.vocab_size, self.special_ids = mask_id, vocab_size, special_ids
        self.seed, self.mask_prob = seed, mask_prob

    def loss_options(self) -> dict:
        return {}

    def masked(self, batch: dict, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return mask_tokens(batch["input_ids"], batch["attention_mask"], mask_id=self.mask_id,
                           vocab_size=self.vocab_size, special_ids=self.special_ids, generator=g, prob=self.mask_prob)

    def step(self, opt: Optimization, batch: dict, step: int, share: float, micro_batches: int) -> torch.Tensor:
        device = opt.device
        inputs, labels = self.masked(batch, step)
        inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        mask = batch["attention_mask"].to(device, non_blocking=True)
        predicted = labels.ne(IGNORE)

        def slice_loss(part: slice) -> torch.Tensor:  # weighted by its share of the batch's masked tokens
            with opt.precision.autocast():
                logits = opt.forward(inputs[part], mask[part], labels[part])
            loss = opt.model.loss(logits, labels[part])
            if part.stop - part.start < labels.shape[0]:
                loss = loss * (predicted[part].sum() / predicted.sum().clamp(min=1))
            return loss

        return sliced_update(opt, labels.shape[0], micro_batches, slice_loss, share)

    def share(self, split: TokenizedSplit, rows: torch.Tensor, whole: torch.Tensor, world: int) -> float:
        raise NotImplementedError("masked-LM pretraining runs in one process (launch.py refuses trainer.devices>1)")

    def validate(self, run: Run) -> dict:
        """MLM loss and masked-token accuracy on the validation texts."""
        model = run.model
        model.eval()
        total, correct, count = 0.0, 0, 0
        with torch.no_grad():
            for i, batch in enumerate(BatchLoader(run.validation, run.trainer.eval_batch_size, run.pad_id,
                                                  shuffle=False)):
                inputs, labels = self.masked(batch, -1 - i)
                labels = labels.to(run.device)
                with run.precision.autocast():
                    logits = model(inputs.to(run.device), batch["attention_mask"].to(run.device), labels)
                targets = labels[labels.ne(IGNORE)]
                if len(targets) == 0:
                    continue
                total += float(model.loss(logits, labels)) * len(targets)
                correct += int(logits.argmax(-1).eq(targets).sum())
                count += len(targets)
        model.train()
        if count == 0:  # nothing to predict (texts too short): not a perfect score
            return {"val_mlm_loss": float("nan"), "val_mlm_accuracy": float("nan")}
        return {"val_mlm_loss": total / count, "val_mlm_accuracy": correct / count}

    def epoch_line(self, m: dict) -> str:
        return (f"train_mlm_loss {m['train_mlm_loss']:.4f}  val_mlm_loss {m['val_mlm_loss']:.4f}  "
                f"val_mlm_acc {m['val_mlm_accuracy']:.4f}")
