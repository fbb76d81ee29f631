"""Tokenizers are used as their tokenizer.json makes them: RoBERTa's byte-level BPE (`<s> text </s>`, `<pad>` id 1,
`<mask>`), a SentencePiece-style Unigram with Metaspace '▁' (`[CLS] text [SEP]`, DeBERTa-v3's layout) and our own
WordPiece. Padding, long-text windows, masked-LM masking and predict --explain's words follow each one's own special
tokens and word scheme, never BERT's names. Small tokenizers are built here: nothing is downloaded."""
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from tformer_cli.data import tokenization
from tformer_cli.data.batching import collate
from tformer_cli.data.tokenization import LongText, TokenizedSplit
from tformer_cli.errors import TformerError
from tformer_cli.evaluation.answers import plain_explanation, words_and_weights
from tformer_cli.model.mlm import IGNORE, mask_tokens
from tformer_cli.runs.pretraining import mlm_tokens, text_windows

CORPUS = ["the unbelievable film was a café of wonders", "an unforgettable story, told slowly and well",
          "the plot wanders but the acting is superb", "a film about films and the people who make them",
          "slowly the story unfolds into something unbelievable"] * 4
LONG = " ".join(CORPUS[:5] * 3)  # ~120 words: several windows at max_len 16


def roberta_like() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tok


def unigram_metaspace(single: str = "[CLS] $A [SEP]") -> Tokenizer:
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=120, special_tokens=["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"],
                                      unk_token="[UNK]", show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    return tok


def wordpiece() -> Tokenizer:
    return tokenization.train_wordpiece(CORPUS, vocab_size=120, max_len=512)


FAMILIES = {"roberta": (roberta_like, "<s>", "</s>", "<pad>", 1, "<mask>"),
            "unigram": (unigram_metaspace, "[CLS]", "[SEP]", "[PAD]", 0, "[MASK]"),
            "wordpiece": (wordpiece, "[CLS]", "[SEP]", "[PAD]", 0, "[MASK]")}


@pytest.fixture(params=list(FAMILIES), scope="module")
def family(request, tmp_path_factory):
    """(tokenizer.json path, first special, last special, pad token, its id, mask token)."""
    build, *rest = FAMILIES[request.param]
    path = tmp_path_factory.mktemp(request.param) / "tokenizer.json"
    build().save(str(path))
    return (path, *rest)


def test_pad_id_is_the_tokenizer_s_own_pad_token(family):
    path, first, _, pad, pad_number, _ = family
    tok = tokenization.load_tokenizer(path, 16)
    assert tok.token_to_id(pad) == pad_number and tokenization.pad_id(tok) == pad_number
    if first == "<s>":  # the old fallback, 0, is RoBERTa's <s>: the first token would have been padding
        assert tok.token_to_id("<s>") == 0 != tokenization.pad_id(tok)


def test_pad_id_reads_a_padding_config_and_refuses_a_tokenizer_without_a_pad_token():
    tok = roberta_like()
    fill = tok.token_to_id("</s>")
    tok.enable_padding(pad_id=fill, pad_token="</s>")  # (GPT-style: the end token pads)
    assert tokenization.pad_id(tok) == fill
    tok.no_padding()
    assert tokenization.pad_id(tok) == tok.token_to_id("<pad>")
    bare = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    with pytest.raises(TformerError, match="no padding token"):
        tokenization.pad_id(bare)
    bare.add_special_tokens(["<|pad|>"])  # a pad token spelled another way is still found
    assert tokenization.pad_id(bare) == bare.token_to_id("<|pad|>")


def test_the_special_layout_is_read_off_the_tokenizer(family):
    path, first, last, pad, _, mask = family
    tok = tokenization.load_tokenizer(path, 16)
    layout = tokenization.special_layout(tok)
    assert (layout.before, layout.after, layout.mask) == (1, 1, mask)
    assert {first, last, pad, mask} <= layout.tokens and tok.token_to_id(first) in layout.ids
    odd = unigram_metaspace("[CLS] $A [SEP] [SEP]")  # two after the text
    assert (tokenization.special_layout(odd).before, tokenization.special_layout(odd).after) == (1, 2)


def _covers(windows: list[list], body: list, width: int) -> bool:
    """Each window's text part is a slice of the body, the first at its start, the last at its end, no gap between."""
    end = 0
    for part in windows:
        starts = [a for a in range(len(body) - len(part) + 1) if body[a:a + len(part)] == part and a <= end]
        if not starts or len(part) > width:
            return False
        end = max(starts) + len(part)
    return windows[0] == body[:len(windows[0])] and end == len(body)


def test_chunks_windows_carry_the_tokenizer_s_own_special_tokens_and_cover_the_text(family):
    path, first, last, *_ = family
    long_text = LongText("chunks", chunk_overlap=3)
    tok = tokenization.load_tokenizer(path, 16, long_text)
    full = tok.encode(LONG).tokens
    assert full[0] == first and full[-1] == last and len(full) > 40
    [windows] = tokenization.encode_batch(tok, [LONG], 16, long_text)
    assert len(windows) > 2
    for ids, tokens in windows:
        assert len(ids) == len(tokens) <= 16 and tokens[0] == first and tokens[-1] == last
        assert first not in tokens[1:-1] and last not in tokens[1:-1]
    assert _covers([tokens[1:-1] for _, tokens in windows], full[1:-1], 14)


def test_windows_follow_a_layout_with_two_special_tokens_after_the_text(tmp_path):
    odd = unigram_metaspace("[CLS] $A [SEP] [SEP]")
    odd.save(str(tmp_path / "tokenizer.json"))
    for long_text in (LongText("chunks", chunk_overlap=2), LongText("head_tail", head_tokens=4)):
        tok = tokenization.load_tokenizer(tmp_path / "tokenizer.json", 12, long_text)
        full = tok.encode(LONG).tokens
        windows = [t for _, t in tokenization.encode_batch(tok, [LONG], 12, long_text)[0]]
        assert all(len(w) == 12 and w[0] == "[CLS]" and w[-2:] == ["[SEP]", "[SEP]"] for w in windows)
        assert all("[SEP]" not in w[1:-2] for w in windows)  # 9 tokens of text in each
        if long_text.mode == "chunks":
            assert _covers([w[1:-2] for w in windows], full[1:-2], 9)
        else:
            assert windows[0][1:-2] == full[1:5] + full[-7:-2]


def test_head_tail_keeps_the_special_tokens_at_both_ends(family):
    path, first, last, *_ = family
    long_text = LongText("head_tail", head_tokens=5)
    tok = tokenization.load_tokenizer(path, 16, long_text)
    full = tok.encode(LONG).tokens
    [[(ids, tokens)]] = tokenization.encode_batch(tok, [LONG], 16, long_text)
    assert tokens == [first, *full[1:6], *full[-10:-1], last] and len(ids) == 16  # 5 + 9 of text


def test_tokenize_split_reads_with_the_tokenizer_s_layout(family):
    import datasets

    path, first, last, *_ = family
    long_text = LongText("chunks", chunk_overlap=3)
    tok = tokenization.load_tokenizer(path, 16, long_text)
    ds = datasets.Dataset.from_dict({"text": [LONG, "a short one"], "label": [1, 0]})
    split = TokenizedSplit.from_dataset(tokenization.tokenize_split(ds, tok, 16, "test", long_text))
    expected = [ids for ws in tokenization.encode_batch(tok, [LONG, "a short one"], 16, long_text) for ids, _ in ws]
    got = [split.values[a:b].tolist() for a, b in zip(split.offsets[:-1], split.offsets[1:])]
    assert got == expected and split.n_docs == 2 and len(split) > 3
    assert all(s[0] == tok.token_to_id(first) and s[-1] == tok.token_to_id(last) for s in got)


def test_masked_lm_masks_with_the_tokenizer_s_mask_and_never_a_special_token(family):
    path, first, last, pad, pad_number, mask = family
    tok = tokenization.load_tokenizer(path, 16)
    mask_id, specials = mlm_tokens(tok)
    assert mask_id == tok.token_to_id(mask) and mask_id not in specials
    assert {tok.token_to_id(first), tok.token_to_id(last), pad_number} <= set(specials)
    seqs = text_windows(tok, [LONG, "a short one", ""], 16, windows=True)
    assert all(s[0] == tok.token_to_id(first) and s[-1] == tok.token_to_id(last) and len(s) <= 16 for s in seqs)
    split = TokenizedSplit.from_ids(seqs)
    batch = collate(split, torch.arange(len(split)), tokenization.pad_id(tok))
    ids, attention = batch["input_ids"], batch["attention_mask"].bool()
    assert (~attention).any()  # some padding to keep away from
    is_special = torch.isin(ids, torch.tensor(specials)) | ~attention
    picked = torch.zeros_like(attention)
    for seed in range(20):
        inputs, labels = mask_tokens(ids, attention, mask_id=mask_id, vocab_size=tok.get_vocab_size(),
                                     special_ids=specials, generator=torch.Generator().manual_seed(seed), prob=0.5)
        chosen = labels.ne(IGNORE)
        assert not (chosen & is_special).any() and torch.equal(inputs[is_special], ids[is_special])
        assert (inputs[chosen] == mask_id).any() and not torch.isin(inputs[~chosen], torch.tensor([mask_id])).any()
        assert not torch.isin(inputs[chosen], torch.tensor(specials)).any()  # random replacements: ordinary tokens
        picked |= chosen
    assert torch.equal(picked, ~is_special)  # every ordinary token is picked some time


@pytest.mark.parametrize("build", [roberta_like, unigram_metaspace, wordpiece])
def test_explain_glues_each_scheme_s_pieces_into_whole_words(build):
    tok = build()
    text = "the unbelievable café wanders slowly"
    e = tok.encode(text)
    assert len(e.tokens) > len(text.split()) + 2  # some word is several pieces
    pieces = tokenization.word_pieces(tok)
    pairs = words_and_weights(e.tokens, [1.0] * len(e.tokens), pieces)
    expected = text.split() if build is not wordpiece else ["the", "unbelievable", "cafe", "wanders", "slowly"]
    assert [w for w, _ in pairs] == expected  # the special tokens dropped, whatever they are called
    assert sum(w for _, w in pairs) == len(e.tokens) - 2 and max(w for _, w in pairs) > 1
    result = {"label": "positive", "probability": 0.9, "explanation": {"tokens": e.tokens, "rollout": [0.1] * len(e)}}
    assert plain_explanation(result, pieces).plain.startswith(f"positive 0.900 [rollout]: {expected[0]}(")


def test_a_tokenizer_without_a_post_processor_is_read_with_no_special_tokens():
    tok = Tokenizer(models.WordLevel({"x": 0, "y": 1, "<s>": 2, "</s>": 3}))  # no unknown token: "a b" fails
    tok.add_special_tokens(["<s>", "</s>"])
    layout = tokenization.special_layout(tok)
    assert (layout.before, layout.after, layout.ids) == (0, 0, {2, 3})
    windows = LongText("chunks", chunk_overlap=1).windows(list(range(10)), 4, layout)
    assert windows == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]  # no token taken for a special one
    assert LongText("head_tail", head_tokens=1).cut(list(range(10)), 4, layout) == [0, 7, 8, 9]
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s> </s>",
                                                       special_tokens=[("<s>", 2), ("</s>", 3)])
    assert (tokenization.special_layout(tok).before, tokenization.special_layout(tok).after) == (1, 2)


@pytest.mark.parametrize("scheme", ["wordpiece", "bpe_roberta", "unigram_cls"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_a_long_text_cut_before_tokenizing_keeps_exactly_the_same_tokens(scheme, side):
    """A text far longer than the window is cut at a space before a truncating tokenizer reads it (a one-line
    30 MB text took minutes): the tokens kept are those of the whole text, for every family's pre-tokenizer."""
    import random

    import hf_folders

    tok = tokenization.configure(hf_folders.tokenizer(scheme), 16, side)
    rng = random.Random(0)
    words = ["Good", "film,", "the", "plot!", "naïve", "  ", "\n", "über-long", "dull...", "x"]
    texts = [" ".join(rng.choice(words) for _ in range(n)) for n in (5, 900, 3000)]
    texts.append("nospace" * 1000 + " then words " * 10)  # no space near the cut: read whole
    texts.append("a " * 3000)
    assert len(texts[2]) > 2 * 16 * tokenization.CUT_CHARS_PER_TOKEN
    assert [e.ids for e in tokenization.encodings(tok, texts)] == [e.ids for e in tok.encode_batch(texts)]
    assert tokenization._cut(tok, texts)[2] != texts[2]  # (the long text was cut)
