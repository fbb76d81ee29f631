"""Tokenizers and token storage.

Every checkpoint carries a single `tokenizer.json` (Hugging Face `tokenizers` format), so `predict` needs
neither `transformers` nor `datasets`. Token ids are computed once per (dataset fingerprint, tokenizer,
max_len), written by `datasets` as Arrow next to the dataset's cache, and read back as one flat int32
tensor plus offsets: no Python lists of lists on the training path.
"""
from __future__ import annotations

import hashlib
import itertools
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from ..console import progress
from ..errors import ConfigError, TformerError
from ..store.atomic import write_with

if TYPE_CHECKING:  # torch is imported where tensors are made: the ONNX predict path never loads it
    import torch

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_wordpiece(texts, vocab_size: int, max_len: int, min_frequency: int = 2, total: int | None = None):
    """A BERT-style uncased WordPiece tokenizer learned from the training texts; the same texts give the same
    tokenizer.json in every process (runs, their token caches and their accuracy are reproducible). texts: a list,
    or any iterable of texts with their number as `total` (a big split's sample streamed from Arrow, see
    `vocabulary_sample`).

    Not `trainers.WordPieceTrainer`: it breaks ties between equally frequent merges by the pieces' ids, and gives
    the `##c` pieces their ids in hash-map order, random per process, so two runs learned different pieces. A plain
    BPE trainer numbers every starting symbol in code-point order: a character that continues a word is spelled as
    a private-use character of its own while learning (`learn_wordpiece_vocab`), so the same Rust merges run, ties
    break the same way every time, and the pieces are read back as WordPiece (`##`) pieces."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, clean_text=True, strip_accents=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    if total is None:
        texts = texts[:]  # one list (a datasets Column would be read row by row, seconds on IMDB)
        total = len(texts)
    # the first long wait of a new dataset: a bar says what it is (on a terminal; a line a minute in a log)
    with progress(total=total, desc=f"learning a {vocab_size:,}-piece tokenizer", unit="text") as bar:
        counts = word_counts(tok, texts, bar)
        bar.set_postfix(now="merging pieces")
        vocab = learn_wordpiece_vocab(counts, vocab_size, min_frequency)
    tok.model = models.WordPiece(vocab, unk_token="[UNK]")
    tok.add_special_tokens(SPECIAL_TOKENS)  # as a trainer adds them: never split, skipped by decode
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))]
    )
    return configure(tok, max_len)


# What BertNormalizer does to ASCII text, as a str.translate table: control characters go, tab/newline/CR become spaces
_ASCII_CLEAN = {**dict.fromkeys([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F]), 0x09: " ", 0x0A: " ",
                0x0D: " "}


def word_counts(tok, texts, bar=None) -> Counter:
    """How often each word occurs, the words being what tok's normalizer and pre-tokenizer make of the texts.

    Calling those per text costs ~1 ms a review (their offset bookkeeping), so: ASCII texts are cleaned and
    lowercased in Python (what BertNormalizer does to ASCII), the others go through the normalizer; the text is
    split at whitespace, and only the distinct chunks that are not plain letters and digits are pre-tokenized
    (BertPreTokenizer splits off punctuation). Same counts as the per-text calls (tested)."""
    chunks: Counter = Counter()
    last = 0
    for i, text in enumerate(texts, 1):
        clean = text.translate(_ASCII_CLEAN).lower() if text.isascii() else tok.normalizer.normalize_str(text)
        chunks.update(clean.split())
        if bar is not None and i % 1000 == 0:  # (`bar`: train_wordpiece's progress)
            bar.update(1000)
        last = i
    if bar is not None:
        bar.update(last % 1000)
    words: Counter = Counter()
    for chunk, n in chunks.items():
        if chunk.isalnum():  # no punctuation or whitespace: one word
            words[chunk] += n
        else:
            for word, _ in tok.pre_tokenizer.pre_tokenize_str(chunk):
                words[word] += n
    return words


def _unused_characters(taken: set[str]):
    """Characters for continuation symbols: private-use first, never one the corpus has, never whitespace (the
    BPE trainer's words are split at whitespace)."""
    private = itertools.chain(range(0xE000, 0xF900), range(0xF0000, 0xFFFFE), range(0x100000, 0x10FFFE))
    others = itertools.chain(range(0x80, 0xD800), range(0xF900, 0xF0000))  # a corpus with over 137,000 characters
    return (chr(c) for c in itertools.chain(private, others) if chr(c) not in taken and not chr(c).isspace())


def learn_wordpiece_vocab(words: dict[str, int], vocab_size: int, min_frequency: int = 2) -> dict[str, int]:
    """WordPiece vocabulary (piece -> id) learned by BPE merges from word counts, as WordPieceTrainer learns it:
    the special tokens (ids 0..4), every character of the words, every `##` character that continues one,
    then merged pieces, most frequent pair first, until vocab_size pieces (the characters are always all kept,
    even past vocab_size); a pair seen fewer than min_frequency times is never merged.

    The word's first character is itself, every other character c is spelled as its own unused character (the
    same for every occurrence of c): the BPE trainer then learns WordPiece's pieces, but its starting symbols are
    numbered in code-point order (no `##c` numbered in hash-map order) and its ties break the same every run."""
    taken = set("".join(words))
    inner = sorted(set("".join(word[1:] for word in words)))
    spell = dict(zip(inner, _unused_characters(taken)))
    continuation = set(spell.values())
    encode, decode = str.maketrans(spell), str.maketrans({v: k for k, v in spell.items()})
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # every character also as a piece of its own, even one that only ever continues words (as WordPieceTrainer)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=sorted(taken), show_progress=False)
    # The trainer takes texts, not counts: each word once per occurrence, one text per distinct word (made as read)
    block = 10_000  # repeats per string: the most frequent word of a big corpus is not one string of its count

    def feed():
        for word, n in words.items():
            piece = word[0] + word[1:].translate(encode)
            for start in range(0, n, block):
                yield " ".join([piece] * min(block, n - start))

    bpe.train_from_iterator(feed(), trainer=trainer, length=len(words))
    vocab = {}
    for piece, i in sorted(bpe.get_vocab().items(), key=lambda item: item[1]):
        if piece not in SPECIAL_TOKENS:
            piece = ("##" if piece[0] in continuation else "") + piece.translate(decode)
        vocab[piece] = i
    return vocab


@dataclass(frozen=True)
class SpecialLayout:
    """A tokenizer's special tokens as its tokenizer.json makes them, never by BERT's names: RoBERTa and XLM-R
    read `<s> text </s>` with `<mask>`, BERT, DeBERTa-v3 and ModernBERT `[CLS] text [SEP]` with `[MASK]`."""

    before: int = 1  # special tokens the post-processor puts before a single text
    after: int = 1  # ... and after it
    mask: str | None = "[MASK]"  # the masked-LM mask token (None: the tokenizer has none)
    tokens: frozenset[str] = frozenset(SPECIAL_TOKENS)  # every special token's string
    ids: frozenset[int] = frozenset(range(len(SPECIAL_TOKENS)))  # ... and its id

    @property
    def count(self) -> int:
        return self.before + self.after


BERT_LAYOUT = SpecialLayout()  # our own WordPiece tokenizers' (train_wordpiece): ids 0..4 in SPECIAL_TOKENS order


def _bare(token: str) -> str:
    return token.strip("<>[]|").lower()


def _named(tok, role: str, names: tuple[str, ...]) -> str | None:
    """The tokenizer's token for a role ('pad', 'mask'): the first of the usual names it has, else a special token
    spelled like one (`<|pad|>`, `[pad]`)."""
    for name in names:
        if tok.token_to_id(name) is not None:
            return name
    return next((t.content for _, t in sorted(tok.get_added_tokens_decoder().items())
                 if t.special and _bare(t.content) == role), None)


def _probe(tok, specials: dict):
    """A short text's encoding without special tokens, at least one token long (even cut to max_len)."""
    try:
        plain = tok.encode("a b", add_special_tokens=False)
    except Exception:  # noqa: BLE001 (tokenizers raises a bare Exception: a word-level vocabulary with no unknown)
        plain = None
    if plain is None or not plain.ids:  # no 'a', no 'b', no unknown token: one of the tokenizer's own pieces
        piece = next(tok.id_to_token(i) for i in range(tok.get_vocab_size()) if i not in specials)
        plain = tok.encode(piece, add_special_tokens=False)
    return plain


def special_layout(tok) -> SpecialLayout:
    """Read off the tokenizer: a short text encoded without special tokens, then through its post-processor (the
    `special_tokens_mask` says which tokens it added, on which side), plus every token marked special."""
    added = {i: t.content for i, t in tok.get_added_tokens_decoder().items() if t.special}
    before = after = 0
    if tok.post_processor is not None:
        plain = _probe(tok, added)
        e = tok.post_processor.process(plain)
        flags = e.special_tokens_mask
        before = next((i for i, f in enumerate(flags) if not f), len(flags))
        after = len(flags) - before - len(plain.ids)
        added.update((i, t) for i, t, f in zip(e.ids, e.tokens, flags) if f)
    return SpecialLayout(before, after, _named(tok, "mask", ("[MASK]", "<mask>")), frozenset(added.values()),
                         frozenset(added))


@dataclass(frozen=True)
class WordPieces:
    """How a tokenizer's pieces spell words, to show whole words (predict --explain): WordPiece marks a piece that
    continues a word ('##ing'); byte-level BPE ('Ġ') and SentencePiece/Metaspace ('▁') mark one that begins a word.
    decode: the tokenizer's decoder over one word's pieces (byte-level pieces are bytes, shown decoded)."""

    marker: str = "##"
    starts_word: bool = False
    specials: frozenset[str] = frozenset(SPECIAL_TOKENS)
    decode: Callable[[list[str]], str] | None = None  # None: the pieces glued without their markers


def word_pieces(tok) -> WordPieces:
    """Told by the tokenizer's model (a continuation prefix), else its decoder and pre-tokenizer (the scheme that
    marks a word's start): never guessed from the pieces' spelling."""
    specials = special_layout(tok).tokens
    prefix = getattr(tok.model, "continuing_subword_prefix", None)  # WordPiece's '##' (a BPE may have one too)
    decode = tok.decoder.decode if tok.decoder is not None else None
    if prefix:
        return WordPieces(prefix, False, specials, decode)
    # the decoder and pre-tokenizer say which scheme marks a word's start (either can be a Sequence of several)
    parts = "".join(part.__getstate__().decode() for part in (tok.decoder, tok.pre_tokenizer) if part is not None)
    if '"ByteLevel"' in parts:
        return WordPieces("Ġ", True, specials, decode)
    if '"Metaspace"' in parts or "\u2581" in parts or "\\u2581" in parts:
        return WordPieces("\u2581", True, specials, decode)
    return WordPieces("", True, specials, decode)  # no scheme known: each piece shown on its own


LONG_TEXT_MODES = ("truncate", "head_tail", "chunks")


@dataclass(frozen=True)
class LongText:
    """How a text longer than max_len tokens is read: `truncate` cuts one side (data.truncation); `head_tail`
    keeps the first head_tokens and fills the rest from the end (Sun et al. 2019: the head and the tail of a review
    carry most of its verdict); `chunks` splits it into windows of max_len that overlap by chunk_overlap tokens:
    training learns from every window (with the document's label), evaluate and predict average the windows'
    logits per document. Saved in the checkpoint, so evaluate and predict read texts the way training did."""

    mode: str = "truncate"
    head_tokens: int | None = None  # head_tail: tokens kept from the start (None: a quarter of max_len)
    chunk_overlap: int | None = None  # chunks: tokens shared by neighbouring windows (None: a quarter of max_len)

    def __post_init__(self) -> None:
        if self.mode not in LONG_TEXT_MODES:
            raise ConfigError(f"data.long_text={self.mode!r} is not one of {', '.join(LONG_TEXT_MODES)}")

    def head(self, max_len: int, specials: int = 2) -> int:
        """head_tokens or its default; specials: the tokens the tokenizer puts around a text (2 for every family
        we read: [CLS] .. [SEP], <s> .. </s>), checked again at encoding time against the tokenizer's own count."""
        width = max_len - specials
        head = self.head_tokens if self.head_tokens is not None else width // 4
        if not 0 <= head <= width:
            raise ConfigError(f"data.head_tokens={head} must be between 0 and model.max_len - {specials} = {width}")
        return head

    def overlap(self, max_len: int, specials: int = 2, key: str = "data.chunk_overlap", given: bool = True) -> int:
        """chunk_overlap or its default, checked against max_len: the one rule for windows, headers and config (key:
        the name the user gave it, `chunk_overlap=` for evaluate). A value given now moves windows on by an eighth
        of their width at least (a 1-token stride reads a text as many times as it has tokens); one a checkpoint
        saved (given=False) needs only to move them (models trained before the eighth rule read as they trained)."""
        width = max_len - specials
        overlap = self.chunk_overlap if self.chunk_overlap is not None else width // 4
        most = width - (max(1, -(-width // 8)) if given else 1)
        if not 0 <= overlap <= most:
            raise ConfigError(f"{key}={overlap} must be between 0 and {most} (windows of "
                              f"{width} text tokens, model.max_len {max_len}, each moving on by at least an eighth "
                              f"of that)")
        return overlap

    def windows(self, seq: list, max_len: int, layout: SpecialLayout | None = None) -> list[list]:
        """specials body specials -> one sequence of at most max_len, or (chunks) several, each with the text's
        own special tokens around its part (layout: how many the tokenizer puts before and after a text)."""
        if self.mode != "chunks" or len(seq) <= max_len:
            return [self.cut(seq, max_len, layout)]
        before, after = (layout or BERT_LAYOUT).before, (layout or BERT_LAYOUT).after
        body, width = seq[before:len(seq) - after], max_len - before - after
        overlap = self.overlap(max_len, before + after, given=False)  # (checked where it was given)
        starts = list(range(0, len(body) - width, width - overlap)) + [len(body) - width]  # the last ends the text
        return [seq[:before] + body[a:a + width] + seq[len(seq) - after:] for a in starts]

    def cut(self, seq: list, max_len: int, layout: SpecialLayout | None = None) -> list:
        """[CLS] a b ... y z [SEP] -> [CLS] + the first head + the last (max_len - 2 - head) + [SEP] (with the
        tokenizer's own special tokens, as many as layout says)."""
        if self.mode != "head_tail" or len(seq) <= max_len:
            return seq
        before, after = (layout or BERT_LAYOUT).before, (layout or BERT_LAYOUT).after
        head = self.head(max_len, before + after)
        tail = max_len - before - after - head
        return seq[: before + head] + seq[len(seq) - tail - after:]

    def describe(self, max_len: int) -> str:
        """'chunks of 256 tokens overlapping by 63': what a reading does at this max_len, for headers."""
        if self.mode == "head_tail":
            return f"head_tail: the first {self.head(max_len)} and the last {max_len - 2 - self.head(max_len)} tokens"
        if self.mode == "chunks":
            return f"chunks of {max_len} tokens overlapping by {self.overlap(max_len, given=False)}"
        return f"truncate to {max_len} tokens"

    def to_meta(self) -> dict:
        return {"long_text": self.mode, "head_tokens": self.head_tokens, "chunk_overlap": self.chunk_overlap}

    @classmethod
    def from_meta(cls, meta: dict) -> "LongText":
        return cls(str(meta.get("long_text", "truncate")), meta.get("head_tokens"), meta.get("chunk_overlap"))


UNSEEN = "\ue000"  # a private-use character: in no tokenizer's vocabulary


def configure(tok, max_len: int, side: str | None = None, long_text: LongText = LongText()):
    """Truncate to exactly max_len (special tokens included); padding happens per batch in the collator.
    side: 'right' keeps the start of long texts, 'left' keeps the end (where reviews give their verdict);
    None keeps what the tokenizer file says, so a checkpoint's tokenizer truncates as it did in training.
    head_tail texts are encoded whole and cut by `encode_batch`."""
    if side is None:
        side = str((tok.truncation or {}).get("direction", "right")).lower()
    if side not in ("right", "left"):
        raise ConfigError(f"data.truncation={side!r} must be right (keep the start) or left (keep the end)")
    try:  # a character no vocabulary has (private use): a tokenizer without an unknown token fails on it
        tok.encode(UNSEEN)
    except Exception as exc:  # (tokenizers raises a plain Exception)
        raise TformerError(f"the tokenizer cannot encode a character outside its vocabulary "
                           f"({str(exc).splitlines()[0][:100]}); give its model an unknown token (unk_id for "
                           f"Unigram, unk_token for WordPiece) and save it again") from None
    tok.no_padding()
    if long_text.mode != "truncate":
        tok.no_truncation()
    else:
        tok.enable_truncation(max_length=max_len, direction=side)
    return tok


# The vocabulary of a big train split is learned from a seeded sample of its texts holding about this many
# characters: its most frequent pieces are already certain there (a few seconds of counting a million characters),
# and learning stays a bounded wait at any size. Smaller splits are read whole.
VOCABULARY_CHARS = 100_000_000


def vocabulary_sample(ds, seed: int) -> tuple[object, int, int]:
    """(the texts the vocabulary is learned from, streamed a block at a time, how many, how many the split has) of a
    train split (a datasets.Dataset): every text, or above VOCABULARY_CHARS characters a seeded sample of them."""
    from . import arrow  # deferred: predict imports this module and never loads pyarrow

    rows = arrow.sample_rows(len(ds), seed, arrow.text_lengths(ds), VOCABULARY_CHARS)
    part = ds if len(rows) == len(ds) else ds.select(rows)

    def texts():
        for _, block in arrow.blocks(part, "text"):
            yield from block.to_pylist()

    return texts(), len(rows), len(ds)


ENCODE_CHUNK = 2048  # texts per encode_batch call in `encodings`


def encodings(tok, texts: list[str]):
    """Each text's `Encoding`, ENCODE_CHUNK texts per `encode_batch` call (still parallel within a call).

    For corpora: an Encoding also holds each token's string, offsets and masks (and, cut, the overflowing tokens),
    so one call over every text holds all of them at once (IMDB's 70,000 pretraining texts: over 1 GiB)."""
    for start in range(0, len(texts), ENCODE_CHUNK):
        yield from tok.encode_batch(_cut(tok, texts[start:start + ENCODE_CHUNK]))


# A text longer than max_len x this many characters is cut (at a space) before a truncating tokenizer reads it: the
# tokenizer would read all of it to keep max_len tokens (a 30 MB line: minutes and gigabytes). Kept only when the
# cut part still overflows the window, so the tokens kept are exactly those of the whole text.
CUT_CHARS_PER_TOKEN = 64


def _cut(tok, texts: list[str]) -> list[str]:
    truncation = tok.truncation
    if not truncation or tok.pre_tokenizer is None:  # (without a pre-tokenizer a piece may span a space)
        return texts
    limit = int(truncation["max_length"]) * CUT_CHARS_PER_TOKEN
    if not texts or max(map(len, texts)) <= 2 * limit:  # (nearly always: no Python loop over the texts)
        return texts
    out = None
    for i, text in enumerate(texts):
        if len(text) <= 2 * limit:
            continue
        keep_end = str(truncation.get("direction", "right")).lower() == "left"
        if keep_end:
            at = next((j for j in range(len(text) - limit, len(text)) if text[j].isspace()), None)
            part = None if at is None else text[at:]
        else:
            at = next((j for j in range(limit, 0, -1) if text[j].isspace()), None)
            part = None if at is None else text[:at]
        if part is None or not tok.encode(part).overflowing:  # (no space, or too few tokens: read it whole)
            continue
        out = out if out is not None else list(texts)
        out[i] = part
    return texts if out is None else out


def encode_batch(tok, texts: list[str], max_len: int, long_text: LongText = LongText(),
                 layout: SpecialLayout | None = None) -> list[list[tuple]]:
    """Per text, its windows' (ids, tokens), each at most max_len long (one window unless long_text is chunks).
    layout: `special_layout(tok)`, read here when not given (a caller encoding many batches reads it once)."""
    if layout is None and long_text.mode != "truncate":
        layout = special_layout(tok)
    return [list(zip(long_text.windows(e.ids, max_len, layout), long_text.windows(e.tokens, max_len, layout)))
            for e in encodings(tok, texts)]


def encode_ids(tok, texts: list[str], max_len: int, long_text: LongText = LongText(),
               layout: SpecialLayout | None = None) -> list[list[list[int]]]:
    """Per text, its windows' ids (`encode_batch` without the tokens' strings, which only explanations read)."""
    if layout is None and long_text.mode != "truncate":
        layout = special_layout(tok)
    return [long_text.windows(e.ids, max_len, layout) for e in encodings(tok, texts)]


def load_tokenizer(path: str | Path, max_len: int, long_text: LongText = LongText(), side: str | None = None):
    """side: None truncates as the file says (as training did); a head_tail or chunks run saved no side."""
    return configure(Tokenizer.from_file(str(path)), max_len, side, long_text)


def pad_id(tok) -> int:
    """The id batches are padded with: the tokenizer's padding config when its file sets one, else its pad token
    by name ([PAD], <pad>, ...). Never a guessed 0: that is RoBERTa's <s>, and its texts' first token would be
    masked out as padding. (`configure` turns padding off, so a configured tokenizer is read by name.)"""
    padding = tok.padding
    if padding is not None:
        by_name = tok.token_to_id(str(padding.get("pad_token")))
        return by_name if by_name is not None else int(padding["pad_id"])
    name = _named(tok, "pad", ("[PAD]", "<pad>"))
    if name is None:
        raise TformerError("the tokenizer has no padding token ([PAD] or <pad>) to fill batches "
                           "with; add one to its special tokens, or use a tokenizer that has one")
    return tok.token_to_id(name)


def tokenizer_hash(tok) -> str:
    return hashlib.sha256(tok.to_str().encode()).hexdigest()[:16]


def tokenize_split(ds, tok, max_len: int, desc: str, long_text: LongText = LongText()):
    """Add `input_ids` (int32 Arrow lists) to a text/label dataset; cached on disk by datasets fingerprint."""
    import datasets  # deferred: predict imports this module and never loads datasets (~1 s)

    key = f"{ds._fingerprint}|{tokenizer_hash(tok)}|{max_len}|{long_text}|v2"
    fingerprint = hashlib.sha256(key.encode()).hexdigest()[:32]
    features = datasets.Features({"label": ds.features["label"], "doc": datasets.Value("int64"),
                                  "input_ids": datasets.Sequence(datasets.Value("int32"))})

    layout = special_layout(tok)

    def encode(batch, indices):  # one row per window; `doc` is the row's document
        rows = [(w, label, i) for windows, label, i in zip(encode_ids(tok, batch["text"], max_len, long_text, layout),
                                                            batch["label"], indices) for w in windows]
        bar.update(len(indices))
        return {"input_ids": [r[0] for r in rows], "label": [r[1] for r in rows], "doc": [r[2] for r in rows]}

    datasets.disable_progress_bars()  # ours below; datasets would print one per internal step into logs
    # (stays at 0 and vanishes when the cache answers)
    with progress(total=len(ds), desc=f"tokenizing {desc}", unit="text") as bar:
        return ds.map(encode, batched=True, batch_size=2000, with_indices=True, remove_columns=ds.column_names,
                      features=features, new_fingerprint=fingerprint)


def _flat_ids(ds) -> tuple[np.ndarray, np.ndarray]:
    """(values int32, offsets int64 from 0) of a tokenized split's `input_ids`. A split cached on disk by datasets
    gets them memory-mapped from a flat copy beside its Arrow file (written once, a chunk at a time): token ids take
    page cache, not process memory, and a training set larger than RAM still trains. An in-memory split (built in
    Python) gets them copied in one pass."""
    import pyarrow as pa  # deferred: predict's cold start (~150 ms, and predict never reads Arrow)

    if ds._indices is not None:  # a select()/shuffle() view: materialise the rows it points at
        ds = ds.flatten_indices()
    column = ds.data.column("input_ids")  # ChunkedArray of list<int32>, memory-mapped from the cache
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    counts = [int(c.offsets[-1].as_py()) - int(c.offsets[0].as_py()) if len(c) else 0 for c in chunks]
    cached = [Path(f["filename"]) for f in ds.cache_files]
    if len(cached) == 1 and ds._fingerprint:
        base = cached[0].parent / f"tokens-{ds._fingerprint}"
        values_file, offsets_file = base.with_suffix(".ids.npy"), base.with_suffix(".offsets.npy")
        if not (values_file.is_file() and offsets_file.is_file()):
            write_with(values_file, lambda tmp: _fill(np.lib.format.open_memmap(tmp, "w+", np.int32, (sum(counts),)),
                                                      chunks))
            write_with(offsets_file, lambda tmp: _save(tmp, _offsets(chunks)))
        values, offsets = np.load(values_file, mmap_mode="r"), np.load(offsets_file)
        if len(values) == sum(counts) and len(offsets) == len(ds) + 1:
            return values, offsets
    return _fill(np.empty(sum(counts), dtype=np.int32), chunks), _offsets(chunks)


def _save(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:  # (np.save(path) would add ".npy" to a temporary name)
        np.save(f, array)


def _fill(out: np.ndarray, chunks) -> np.ndarray:
    """The chunks' token ids one after another into `out` (flushed when it is a memory map)."""
    at = 0
    for chunk in chunks:
        if len(chunk):
            o = chunk.offsets.to_numpy()
            part = chunk.values.to_numpy(zero_copy_only=False)[o[0]:o[-1]]
            out[at:at + len(part)] = part
            at += len(part)
    if isinstance(out, np.memmap):
        out.flush()
    return out


def _offsets(chunks) -> np.ndarray:
    """Sequence starts and the end (int64, from 0) of list chunks laid end to end."""
    parts, at = [np.zeros(1, dtype=np.int64)], 0
    for chunk in chunks:
        if len(chunk):
            o = chunk.offsets.to_numpy().astype(np.int64)
            parts.append(o[1:] - o[0] + at)
            at += int(o[-1] - o[0])
    return np.concatenate(parts)


@dataclass
class TokenizedSplit:
    """Ragged token ids: sequence i is values[offsets[i]:offsets[i+1]]. With long_text=chunks a document is
    several sequences (windows): docs[i] is sequence i's document, and doc_labels the documents' labels."""

    values: torch.Tensor  # (total_tokens,) int32
    offsets: torch.Tensor  # (N + 1,) int64
    labels: torch.Tensor  # (N,) int64 per sequence; multi-label: (N, C) uint8 multi-hot (batches: float)
    docs: torch.Tensor | None = None  # (N,) int64 document index of each sequence; None: one sequence per document

    def __len__(self) -> int:
        return self.labels.shape[0]

    @property
    def n_docs(self) -> int:
        return len(self) if self.docs is None else int(self.docs.max()) + 1 if len(self) else 0

    @property
    def doc_labels(self) -> torch.Tensor:
        """(n_docs,) the label of each document (what metrics are computed on)."""
        import torch  # deferred: predict --runtime onnx imports this module and never loads torch

        if self.docs is None:
            return self.labels
        out = torch.empty((self.n_docs, *self.labels.shape[1:]), dtype=self.labels.dtype)
        out[self.docs] = self.labels
        return out

    @property
    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    @classmethod
    def from_dataset(cls, ds) -> "TokenizedSplit":
        import pyarrow as pa  # deferred: predict's cold start (~150 ms, and predict never reads Arrow)
        import pyarrow.compute  # noqa: F401 (pa.compute)
        import torch  # deferred: predict --runtime onnx imports this module and never loads torch

        values, offsets = _flat_ids(ds)
        feature = ds.features["label"]
        labels_column = ds.with_format("arrow")["label"]  # (a whole column: one Arrow array, never row by row)
        if hasattr(feature, "feature"):  # multi-label: each row's set of ids -> a multi-hot row (N, C), one byte a
            # pair (a million texts of 1,000 labels: 1 GB, where float32 took 4)
            ids = labels_column.combine_chunks() if isinstance(labels_column, pa.ChunkedArray) else labels_column
            labels = np.zeros((len(ds), feature.feature.num_classes), dtype=np.uint8)
            counts = pa.compute.list_value_length(ids).to_numpy(zero_copy_only=False)
            rows = np.repeat(np.arange(len(ds)), np.nan_to_num(counts).astype(np.int64))
            labels[rows, pa.compute.list_flatten(ids).to_numpy().astype(np.int64)] = 1
        else:
            labels = labels_column.to_numpy().astype(np.int64)
        docs = ds.with_format("arrow")["doc"].to_numpy().astype(np.int64) if "doc" in ds.column_names else None
        single = docs is None or (len(docs) and int(docs.max()) + 1 == len(docs))
        with warnings.catch_warnings():  # a memory-mapped cache is read-only: nothing writes into token ids
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            ids = torch.from_numpy(values)
        return cls(ids, torch.from_numpy(np.asarray(offsets)), torch.from_numpy(labels),
                   None if single else torch.from_numpy(docs))

    @classmethod
    def from_ids(cls, ids: list[list[int]], labels=None, docs: list[int] | None = None) -> "TokenizedSplit":
        import torch  # deferred: predict --runtime onnx imports this module and never loads torch

        lengths = torch.tensor([len(x) for x in ids], dtype=torch.int64)
        offsets = torch.zeros(len(ids) + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(lengths, 0)
        values = torch.tensor([t for x in ids for t in x], dtype=torch.int32)
        lab = torch.as_tensor(labels if labels is not None else [0] * len(ids), dtype=torch.int64)
        single = docs is None or list(docs) == list(range(len(ids)))
        return cls(values, offsets, lab, None if single else torch.as_tensor(docs, dtype=torch.int64))

    @classmethod
    def concat(cls, parts: list["TokenizedSplit"]) -> "TokenizedSplit":
        """The parts' sequences one after the other, their documents numbered on (a distillation's labelled train
        split, then its unlabeled texts)."""
        import torch  # deferred: predict --runtime onnx imports this module and never loads torch

        offsets, docs, start, first_doc = [torch.zeros(1, dtype=torch.int64)], [], 0, 0
        for part in parts:
            offsets.append(part.offsets[1:] + start)
            start += int(part.offsets[-1])
            docs.append((part.docs if part.docs is not None else torch.arange(len(part))) + first_doc)
            first_doc += part.n_docs
        single = all(part.docs is None for part in parts)
        return cls(torch.cat([p.values for p in parts]), torch.cat(offsets), torch.cat([p.labels for p in parts]),
                   None if single else torch.cat(docs))

    @classmethod
    def from_windows(cls, windows: list[list[tuple]]) -> "TokenizedSplit":
        """From `encode_batch`'s output: every window of every text, with its text as its document."""
        return cls.from_ids([ids for ws in windows for ids, _ in ws],
                            docs=[d for d, ws in enumerate(windows) for _ in ws])
