"""What differs between training tasks, plugged into the one loop (`loop.fit`): how a batch becomes a loss and an
optimizer step, how validation scores an epoch, and what the epoch's line says. A new task (e.g. distillation) is
one more class here with the members of `loop.Objective`; the loop, checkpoints, resume and Ctrl-C come with it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

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


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, labelled: torch.Tensor, *,
                      temperature: float, alpha: float, multi_label: bool = False,
                      class_weight: torch.Tensor | None = None, label_smoothing: float = 0.0) -> torch.Tensor:
    """Hinton et al. (2015)'s loss, averaged over the rows: alpha * T^2 * KL(teacher_T || student_T) on every row
    (both softmaxes at temperature T; T^2 keeps the gradients' scale as T changes) plus (1 - alpha) * the usual
    cross-entropy on the rows that have a label (`labelled`; texts without one learn from the teacher alone).
    Multi-label: the KL of each label's yes/no (sigmoids at T), averaged over labels, and binary cross-entropy.
    student, teacher: (B, C) logits; labels: (B,) ids or (B, C) multi-hot; labelled: (B,) bool."""
    s, t = student.float() / temperature, teacher.float() / temperature
    if multi_label:
        p = torch.sigmoid(t)  # KL of Bernoulli(p) from Bernoulli(q): BCE(q; p) - H(p), zero when they agree
        soft = (F.binary_cross_entropy_with_logits(s, p, reduction="none")
                - F.binary_cross_entropy_with_logits(t, p, reduction="none")).mean(-1)
    else:
        soft = F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), reduction="none", log_target=True).sum(-1)
    loss = alpha * temperature ** 2 * soft
    if alpha < 1 and bool(labelled.any()):
        if multi_label:
            targets = labels.float() * (1 - label_smoothing) + 0.5 * label_smoothing
            hard = F.binary_cross_entropy_with_logits(student.float(), targets, reduction="none").mean(-1)
        else:  # (a class weight scales its rows' term: the mean over rows keeps micro-batch and rank shares exact)
            hard = F.cross_entropy(student.float(), labels.clamp(min=0), reduction="none",
                                   label_smoothing=label_smoothing)
            if class_weight is not None:
                hard = hard * class_weight[labels.clamp(min=0)]
        loss = loss + (1 - alpha) * torch.where(labelled, hard, torch.zeros_like(hard))
    return loss.mean()


class Distillation(Classification):
    """A student learning from a teacher's logits (computed once, runs/distill.py) on labelled and unlabeled texts:
    `distillation_loss` per row. Validation is classification's (the student's own loss, accuracy and F1 on the
    labelled validation split), so a distilled run is compared, monitored and reported like a trained one.

    teacher: (documents, C) logits of the training split's documents; labelled: (documents,) whether a document
    has a label; docs: the split's document of each sequence (None: one sequence per document)."""

    loss_label = "distillation loss"

    def __init__(self, label_names: list[str], teacher: torch.Tensor, labelled: torch.Tensor,
                 docs: torch.Tensor | None, *, temperature: float, alpha: float, multi_label: bool = False,
                 loss_weight: torch.Tensor | None = None, label_smoothing: float = 0.0):
        super().__init__(label_names, loss_weight, label_smoothing)
        self.teacher, self.labelled, self.docs = teacher, labelled, docs
        self.temperature, self.alpha, self.multi_label = temperature, alpha, multi_label

    def step(self, opt: Optimization, batch: dict, step: int, share: float, micro_batches: int) -> torch.Tensor:
        device = opt.device
        rows = batch["index"] if self.docs is None else self.docs[batch["index"]]
        ids = batch["input_ids"].to(device, non_blocking=True)
        mask = batch["attention_mask"].to(device, non_blocking=True)
        labels = batch["labels"].to(device, non_blocking=True)
        teacher, labelled = self.teacher[rows].to(device), self.labelled[rows].to(device)
        n = labels.shape[0]

        def slice_loss(part: slice) -> torch.Tensor:  # a row mean: a slice carries its rows' share
            with opt.precision.autocast():
                logits = opt.forward(ids[part], mask[part])
            loss = distillation_loss(logits, teacher[part], labels[part], labelled[part],
                                     temperature=self.temperature, alpha=self.alpha, multi_label=self.multi_label,
                                     class_weight=self.loss_weight, label_smoothing=self.label_smoothing)
            return loss if part.stop - part.start == n else loss * ((part.stop - part.start) / n)

        return sliced_update(opt, n, micro_batches, slice_loss, share)

    def share(self, split: TokenizedSplit, rows: torch.Tensor, whole: torch.Tensor, world: int) -> float:
        return world * len(rows) / len(whole)  # a row mean, class weights included (see distillation_loss)

    def epoch_line(self, m: dict) -> str:
        return (f"train_loss {m['train_loss']:.4f} (distillation)  val_loss {m['val_loss']:.4f}  "
                f"val_acc {m['val_accuracy']:.4f}  val_f1 {m['val_f1']:.4f}")


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
