"""Settings a preset derives from the data instead of fixing a number: `model.max_len: auto`, the peak lr,
the epochs.

Why a fitted length and not a fixed 256: tformer pads each batch to its longest text (data/batching.py), so on
short texts max_len never costs padding; what it decides is which texts are cut. A fixed number is either far
above short texts (harmless, but it says nothing about them) or below long ones. `auto` reads the training texts'
token lengths with the run's own tokenizer and takes a high percentile of them (PERCENTILE), rounded up to a
multiple of 8, never above `model.max_len_limit` (the preset's budget for long documents, where data.long_text
decides what is kept) nor the pretrained model's positions. The value chosen, the percentile and the share of
texts that are longer are said in the run log; model.json saves the number, so evaluate / predict / export read
texts exactly as training did.

Measured (MiniLM-L6, one epoch, 2-core CPU): TREC questions get max_len 32 (0.2% of texts longer; test accuracy
0.954 vs 0.956 at 256) and IMDB last sentences 64. Batches were already padded only to their own longest text, so
a fitted length decides which rare long texts are cut; it is no speed-up for short texts.

The peak lr is derived too (`model.recommended_lr: auto`, which optimizer.lr follows unless given). One-epoch TREC
runs went 0.946 / 0.956 / 0.964 / 0.966 for 5e-5 / 1e-4 / 2e-4 / 3e-4 and IMDB sentences 0.770 / 0.772 for 1e-4 /
2e-4; full runs on short texts with many classes (TREC's 50 fine labels over two seeds, 20 Newsgroups subject lines:
docs/models-and-pretraining.md) gained 0.8 to 2.2 points of test accuracy from twice MiniLM's lr (a full TREC-6 run
lost 0.4), where long documents and multi-label data were measured at the preset's. So `auto` is the preset's
`lr_short_texts` for single-label data whose texts are short (the 99th percentile of their uncut token lengths at
most SHORT_TEXT_TOKENS) and its `lr_texts` otherwise. A longer run was no win on either set (30 epochs: +0.4 and
-0.6 points), so the epochs stay ten.

An explicit number always wins: `auto` is only ever the preset's value, and model.max_len=128 on the command
line replaces it. A resumed run keeps the length it was trained with.
"""
from __future__ import annotations

import math
import random

import numpy as np
from tokenizers import Tokenizer

from ..data import arrow
from ..errors import ConfigError, TformerError
from ..model import pretrained
from ..safe_text import markup

AUTO = "auto"
PERCENTILE = 99.0  # a text longer than 99% of the training texts is cut (or read by data.long_text)
MULTIPLE = 8  # rounded up to a multiple of this (tensor-core friendly shapes on a GPU)
DEFAULT_LIMIT = 512  # BERT's positions: auto's ceiling when the preset names no model.max_len_limit
SAMPLE = 20_000  # texts whose lengths are measured (seeded sample): a percentile needs no more


def said_auto(value) -> bool:
    """Whether a config value is the word auto (any case: a value read back from a saved config or a tree is not
    normalised by the typed config)."""
    return isinstance(value, str) and value.strip().lower() == AUTO


def is_auto(model: dict) -> bool:
    return said_auto(model.get("max_len"))


def limit(model: dict) -> int:
    """The most `auto` may choose: model.max_len_limit, else DEFAULT_LIMIT."""
    value = model.get("max_len_limit")
    if value is None:
        return DEFAULT_LIMIT
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"model.max_len_limit={value!r} must be a whole number >= 1 (the longest model.max_len=auto "
                          f"may choose), or null for {DEFAULT_LIMIT}")
    return value


def fitted_length(lengths, cap: int, percentile: float = PERCENTILE, multiple: int = MULTIPLE) -> int:
    """The PERCENTILE-th token length (special tokens included), rounded up to `multiple`, within [multiple, cap].
    No texts: cap."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return cap
    high = float(np.percentile(lengths, percentile, method="inverted_cdf"))  # the shortest that fits PERCENTILE%
    return int(min(cap, max(multiple, math.ceil(high / multiple) * multiple)))


def numeric_max_len(model: dict, folder=None):
    """model.max_len for checks made before the data are read: a number as given (its own checks name it), and
    for `auto` its ceiling (model.max_len_limit, within a pretrained folder's positions when one is given)."""
    if not is_auto(model):
        return model.get("max_len")
    return usable_positions(folder, limit(model)) if folder is not None else limit(model)


def usable_positions(folder, wanted: int) -> int:
    """`wanted`, or fewer when the pretrained model in `folder` has fewer positions. The model's family decides
    what is usable (RoBERTa's table has 2 rows fewer usable), so it is asked, not config.json read here."""
    if _accepts(folder, wanted):
        return wanted
    low, high = 1, wanted  # low accepted (else the family's own error is raised), high refused
    pretrained.encoder_shape(folder, low)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if _accepts(folder, mid) else (low, mid)
    return low


def _accepts(folder, max_len: int) -> bool:
    try:
        pretrained.encoder_shape(folder, max_len)
        return True
    except TformerError:  # "model.max_len=N exceeds the M positions" (any other refusal repeats at max_len 1)
        return False


def token_lengths(tok: Tokenizer, texts, seed: int = 0, sample: int = SAMPLE) -> np.ndarray:
    """Token counts with special tokens of (a seeded sample of) `texts`, untruncated. texts: a list, or a split
    (a datasets.Dataset: only the sampled rows are read)."""
    if hasattr(texts, "select"):  # a split: the same rows random.sample picks from a list of its texts
        rows = random.Random(seed).sample(range(len(texts)), sample) if len(texts) > sample else range(len(texts))
        texts = arrow.take_texts(texts, list(rows))
    texts = list(texts)
    if len(texts) > sample:
        texts = random.Random(seed).sample(texts, sample)
    counter = Tokenizer.from_str(tok.to_str())  # a copy: the run's tokenizer keeps its truncation settings
    counter.no_truncation()
    counter.no_padding()
    return np.asarray([len(e.ids) for e in counter.encode_batch([t or "" for t in texts])], dtype=np.int64)


def planned_max_len(config, texts, resume, console) -> tuple[int, bool]:
    """(max_len the run is prepared with, whether `auto` is still to be fitted once the tokenizer is built).
    A pretrained encoder is fitted now, with its own tokenizer.json, because its position table is cut to
    max_len when it is loaded. The resolved number replaces `auto` in config.model (the encoder config and the
    saved model.json read it from there)."""
    model, options = config.model, config.model_options
    if not is_auto(model):
        return int(model["max_len"]), False
    if resume is not None:  # the run's own length: its position table and tokenizer were saved with it
        model["max_len"] = int(resume.loaded.model_config["max_len"])
        return model["max_len"], False
    if options.pretrained and not options.init:
        folder = pretrained.locate_model(options.pretrained, options.pretrained_package)
        cap = usable_positions(folder, limit(model))
        tok = Tokenizer.from_file(str(pretrained.tokenizer_file(folder)))
        return _fit(config, tok, texts, cap, console), False
    model["max_len"] = limit(model)  # its ceiling until then (the tokenizer is built with it)
    return model["max_len"], True


def fit_max_len(config, tok, texts, init, console) -> int:
    """`auto` fitted with the tokenizer the run built (learned from the texts, a pretrained table's, or a
    pretraining run's, whose learned positions also cap it)."""
    cap = limit(config.model)
    if init is not None and init.model_config.get("positions") == "learned":
        cap = min(cap, int(init.model_config["max_len"]))
    return _fit(config, tok, texts, cap, console)


def _fit(config, tok, texts, cap: int, console) -> int:
    lengths = token_lengths(tok, texts, seed=config.seed)
    value = fitted_length(lengths, cap)
    longer = float((lengths > value).mean()) if lengths.size else 0.0
    config.model["max_len"] = value
    console.print(f"[bold]max_len[/] {value} (model.max_len=auto: the {PERCENTILE:g}th percentile of {lengths.size:,} "
                  f"train texts' token lengths, rounded up to a multiple of {MULTIPLE}, at most {cap}; "
                  f"{longer:.1%} are longer: data.long_text={markup(config.long_text.mode)} reads them)",
                  highlight=False)
    return value


# trainer.epochs: auto. A multi-label run gets a number of passes that gives it about STEPS_MULTI_LABEL optimizer
# steps, so that the schedule's decay ends where training does: ten fixed passes over 43,000 GoEmotions comments
# peaked at the second (lr still near its peak) and were stopped at the fifth, while ten passes over 2,000 short
# texts are 600 steps, too few for a head of 60 labels. Single-label runs keep the ten passes every single-label
# figure in the docs was measured with.
EPOCHS_SINGLE_LABEL = 10
STEPS_MULTI_LABEL = 4000
EPOCHS_MULTI_LABEL = (2, 30)  # at least, at most


def auto_epochs(rows: int, batch_size: int, multi_label: bool) -> tuple[int, str]:
    """(epochs, why) for trainer.epochs=auto: `rows` training rows in batches of `batch_size` (the global batch)."""
    if not multi_label:
        return EPOCHS_SINGLE_LABEL, "single-label data"
    steps = max(1, math.ceil(rows / batch_size))
    low, high = EPOCHS_MULTI_LABEL
    epochs = min(high, max(low, math.ceil(STEPS_MULTI_LABEL / steps)))
    return epochs, (f"multi-label data: about {STEPS_MULTI_LABEL:,} optimizer steps at {steps:,} an epoch, "
                    f"{low} to {high} epochs")


# model.recommended_lr: auto (and optimizer.lr, which follows it unless given).
SHORT_TEXT_TOKENS = 64


def base_lr(options) -> float:
    """The model options' lr for texts that are not short (optimizer.lr=auto without a short-text rule)."""
    base = options.lr_texts if options.lr_texts is not None else options.recommended_lr
    if said_auto(base):
        raise ConfigError("optimizer.lr=auto needs the model's lr: give optimizer.lr=<lr>, or ++model.lr_texts=<lr> "
                          "(and ++model.lr_short_texts=<lr>)")
    return float(base)


def auto_lr(options, lengths, multi_label: bool) -> tuple[float, str]:
    """(lr, why) for optimizer.lr=auto: the model options' lr_short_texts for single-label data whose train texts
    are short, else its lr_texts (or a numeric recommended_lr). `lengths`: the texts' token counts uncut
    (token_lengths), so that long texts read through a small max_len are not taken for short ones."""
    base = base_lr(options)
    lengths = np.asarray(lengths)
    p = float(np.percentile(lengths, PERCENTILE)) if lengths.size else 0.0
    short = p <= SHORT_TEXT_TOKENS
    said = f"99% of the train texts are at most {math.ceil(p)} tokens"
    if short and not multi_label and options.lr_short_texts is not None:
        return float(options.lr_short_texts), f"short texts: {said} (<= {SHORT_TEXT_TOKENS}); model.lr_short_texts"
    if options.lr_texts is None:
        return base, "model.recommended_lr"
    return base, ("multi-label data" if short and multi_label and options.lr_short_texts is not None else said) + \
        "; model.lr_texts"
