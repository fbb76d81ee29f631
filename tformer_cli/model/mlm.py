"""Masked-language-model pretraining of our encoder (`tformer pretrain`), BERT's recipe at the scale of one file.

    masking     15% of the real tokens of each text (never [CLS], [SEP], [PAD]) become prediction targets; of
                those, 80% are replaced by [MASK], 10% by a random token, 10% kept as they are
    model       the classifier's encoder (TransformerClassifier.encode: embeddings + blocks) and an MLM head:
                dense d->d, GELU, LayerNorm, then an output layer tied to the token table (its transpose; a
                table narrower than d_model is reached through the embedding projection's transpose)
    loss        cross-entropy over the masked positions only

The encoder's weights are stored under the same names as in a classifier, so `tformer train model.init=<pretrain
run>` copies them key for key (the classifier head is the one part that starts fresh).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from .encoder import EncoderConfig, TransformerClassifier
from .pretrained import PretrainedEncoder, load_into

IGNORE = -100  # label of a position that is not predicted (F.cross_entropy's ignore_index)
# The predicted positions are gathered in blocks of this many rows (the last block filled with position 0, whose
# row the loss ignores): the (rows, vocabulary) logits then come in a few sizes, not a new size every step, and an
# allocator that keeps freed memory for reuse (hardware.py) reuses it. With a size per step, continued pretraining
# of minilm_l6 grew to 18.4 GB over 631 steps.
ROW_BLOCK = 256


def mask_tokens(ids: torch.Tensor, mask: torch.Tensor, *, mask_id: int, vocab_size: int, special_ids: list[int],
                generator: torch.Generator, prob: float = 0.15) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels): BERT's 80/10/10 masking of `prob` of the maskable tokens; labels are IGNORE elsewhere."""
    maskable = mask.clone()
    for s in special_ids:
        maskable &= ids.ne(s)
    chosen = (torch.rand(ids.shape, generator=generator) < prob) & maskable
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
    draw = torch.rand(ids.shape, generator=generator)
    inputs = ids.clone()
    inputs[chosen & (draw < 0.8)] = mask_id
    random_pos = chosen & (draw >= 0.8) & (draw < 0.9)
    ordinary = torch.ones(vocab_size, dtype=torch.bool)  # random replacements are never special tokens
    ordinary[[i for i in (*special_ids, mask_id) if 0 <= i < vocab_size]] = False
    pool = ordinary.nonzero().squeeze(1)
    drawn = pool[torch.randint(len(pool), ids.shape, generator=generator)]
    inputs[random_pos] = drawn[random_pos]
    return inputs, labels


class MaskedLM(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.encoder = TransformerClassifier(cfg)
        self.transform = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_model), nn.GELU(),
                                       nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps))
        self.output_bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                labels: torch.Tensor | None = None, head_only: bool = False) -> torch.Tensor:
        """-> vocabulary logits tied to the token table: (B, T, V), or with `labels` only at the predicted
        positions, (N', V) in row-major order, N' the N predicted positions rounded up to ROW_BLOCK (the output
        layer is most of the cost: 15% of it is what counts; `loss` ignores the rows past N).

        head_only: gradients reach the head's own weights (transform, output bias) and nothing of the encoder,
        the tied token table included: a new head learns to read the encoder before its first, random gradients
        can move a pretrained encoder (mlm.head_warmup_steps)."""
        with torch.no_grad() if head_only else contextlib.nullcontext():
            h = self.encoder.encode(input_ids, attention_mask.bool())
        if labels is not None:
            picked = labels.flatten().ne(IGNORE).nonzero().squeeze(1)
            rows = -(-max(len(picked), 1) // ROW_BLOCK) * ROW_BLOCK
            h = h.flatten(0, 1)[F.pad(picked, (0, rows - len(picked)))]
        h = self.transform(h)
        projection, table = self.encoder.embedding_projection, self.encoder.token_embedding.weight
        if projection is not None:  # back from d_model to the table's width
            h = h @ (projection.weight.detach() if head_only else projection.weight)
        return h @ (table.detach() if head_only else table).t() + self.output_bias

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy over the predicted positions: logits (B, T, V) with labels (B, T), or the (N', V) logits
        of `forward(..., labels)` with the same labels (its rows past the N predicted ones ignored)."""
        if logits.dim() == 2:
            targets = predicted_targets(labels)
            if len(targets) == 0:  # a batch of texts too short to mask anything: no loss, no NaN
                return logits[:0].sum()
            return F.cross_entropy(logits.float(), F.pad(targets, (0, logits.shape[0] - len(targets)), value=IGNORE),
                                   ignore_index=IGNORE)
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE)


def predicted_targets(labels: torch.Tensor) -> torch.Tensor:
    """The token ids to predict, in the order of the first rows of `forward(..., labels)`."""
    return labels[labels.ne(IGNORE)]


def continued(cfg: EncoderConfig, encoder: PretrainedEncoder) -> MaskedLM:
    """The masked-LM model of a pretrained encoder (built from `encoder.shape`): its weights, and its checkpoint's
    own head where the family saves one that this head computes (families/base.py: mlm_head), else a new one."""
    model = MaskedLM(cfg)
    load_into(model.encoder, encoder)
    head = encoder.mlm_head
    if head:
        model.transform.load_state_dict({k.removeprefix("transform."): v for k, v in head.items()
                                         if k.startswith("transform.")})
        with torch.no_grad():
            model.output_bias.copy_(head["output_bias"])
    return model


def encoder_state(mlm_state: dict) -> dict:
    """The classifier-named encoder weights of a pretraining checkpoint (its MLM head left out)."""
    return {k.removeprefix("encoder."): v for k, v in mlm_state.items()
            if k.startswith("encoder.") and not k.startswith("encoder.head.")}
