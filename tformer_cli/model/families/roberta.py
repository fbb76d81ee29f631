"""RoBERTa and XLM-RoBERTa (and CamemBERT, the same network): BERT's math with another position numbering.

`transformers` numbers a text's positions from padding_idx + 1 (create_position_ids_from_input_ids: padding keeps
position padding_idx), so the first `padding_idx + 1` rows of the table are never read by real tokens: our table is
rows padding_idx + 1 .. padding_idx + max_len, and of max_position_embeddings = 514 rows, 512 are usable. The
checkpoints have one token type, folded into the positions as in BERT.
"""
from __future__ import annotations

from . import bert
from .base import Family, MlmHead, ModelConfig, Tensors, register


def offset(c: ModelConfig) -> int:
    """Rows of the position table before the first real token's: padding_idx + 1."""
    return c.number("pad_token_id", 1, low=0) + 1


def shape(c: ModelConfig, max_len: int) -> dict:
    return bert.shape(c, max_len, offset(c))


def state(t: Tensors, shape: dict, c: ModelConfig) -> Tensors:
    return {**bert.embeddings(t, shape["max_len"], offset(c)), **bert.layers(t, shape["n_layers"])}


# All save their task models' encoders under "roberta." (RobertaForMaskedLM, XLMRobertaForSequenceClassification),
# and RobertaLMHead's activation is always exact GELU.
HEADS = (MlmHead("lm_head.dense", "lm_head.layer_norm", ("lm_head.bias", "lm_head.decoder.bias"), activation=None),)
ROBERTA = register(Family(name="RoBERTa", model_types=("roberta",), prefixes=("roberta.",), shape=shape,
                          state=state, mlm_heads=HEADS))
CAMEMBERT = register(Family(name="CamemBERT", model_types=("camembert",), prefixes=("roberta.",), shape=shape,
                            state=state, mlm_heads=HEADS))
XLM_ROBERTA = register(Family(name="XLM-RoBERTa", model_types=("xlm-roberta",), prefixes=("roberta.",), shape=shape,
                              state=state, mlm_heads=HEADS))
