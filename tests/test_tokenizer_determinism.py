"""The learned WordPiece vocabulary: the same texts give the same tokenizer.json in every process, and it is a
complete WordPiece vocabulary (specials first, every character, `##` for every continuing character)."""
import hashlib
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, decoders

from tformer_cli.data.tokenization import SPECIAL_TOKENS, learn_wordpiece_vocab, train_wordpiece, word_counts

# 3,000 reviews, 20,000 pieces: far enough past the frequent merges that many pairs tie (seen twice or three times).
# With tokenizers' WordPieceTrainer four processes out of four gave four different files here.
N_TEXTS, VOCAB = 3000, 20000


def imdb_texts(shared_data, split: str, n: int) -> list[str]:
    return pq.read_table(shared_data / "imdb" / f"{split}.parquet", columns=["text"]).column("text").to_pylist()[:n]


@pytest.fixture(scope="module")
def imdb_tokenizer(shared_data):
    """One tokenizer learned in-process from 2,000 IMDB reviews, and those reviews."""
    texts = imdb_texts(shared_data, "train", 2000)
    return train_wordpiece(texts, 8000, 512), texts


@pytest.mark.slow  # three fresh interpreters, each learning a 20,000-piece vocabulary
def test_separate_processes_write_byte_identical_tokenizer_files(shared_data, tmp_path):
    code = ("import sys, pyarrow.parquet as pq\n"
            "from tformer_cli.data.tokenization import train_wordpiece\n"
            "texts = pq.read_table(sys.argv[1], columns=['text']).column('text').to_pylist()[:int(sys.argv[2])]\n"
            "train_wordpiece(texts, int(sys.argv[3]), 256).save(sys.argv[4])\n")
    files = []
    for seed in (1, 2, 3):  # the Rust hash maps are seeded per process anyway; Python's too, here
        out = tmp_path / f"tokenizer{seed}.json"
        r = subprocess.run([sys.executable, "-c", code, str(shared_data / "imdb" / "train.parquet"), str(N_TEXTS),
                            str(VOCAB), str(out)], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        files.append(out.read_bytes())
    digests = [hashlib.sha256(f).hexdigest()[:12] for f in files]
    assert len(set(digests)) == 1, f"different tokenizer.json from the same texts: {digests}"
    assert Tokenizer.from_str(files[0].decode()).get_vocab_size() == VOCAB


def test_the_vocabulary_has_the_specials_first_and_every_character(imdb_tokenizer):
    tok, texts = imdb_tokenizer
    vocab = tok.get_vocab()
    assert [tok.id_to_token(i) for i in range(len(SPECIAL_TOKENS))] == SPECIAL_TOKENS
    assert sorted(vocab.values()) == list(range(8000))  # exactly vocab_size ids, no gaps
    words = word_counts(tok, texts)
    characters = set("".join(words))
    continuing = set("".join(w[1:] for w in words))
    assert len(characters) > 60  # letters, digits, punctuation, a few accented and typographic characters
    assert characters <= set(vocab), sorted(characters - set(vocab))  # any character can start a word
    assert {"##" + c for c in continuing} <= set(vocab), sorted(c for c in continuing if "##" + c not in vocab)
    assert {"the", "movie", "##s"} <= set(vocab)


def test_held_out_reviews_encode_and_decode_back_to_their_words(imdb_tokenizer, shared_data):
    tok, _ = imdb_tokenizer
    plain = Tokenizer.from_str(tok.to_str())
    plain.no_truncation()
    plain.decoder = decoders.WordPiece(cleanup=False)  # words joined by spaces, nothing else changed
    for text in imdb_texts(shared_data, "test", 200):
        words = [w for w, _ in plain.pre_tokenizer.pre_tokenize_str(plain.normalizer.normalize_str(text))]
        enc = plain.encode(text)
        assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
        if "[UNK]" in enc.tokens:  # a character never seen in training (none in these 200, but allowed)
            continue
        assert plain.decode(enc.ids) == " ".join(words)
        assert len(enc.ids) - 2 >= len(words)


def test_word_counts_are_what_the_tokenizer_makes_of_each_text(imdb_tokenizer):
    """The fast ASCII path and the chunk-wise pre-tokenization count exactly the words the normalizer and the
    pre-tokenizer give text by text (control characters, accents, CJK, final sigma, punctuation inside words)."""
    tok, texts = imdb_tokenizer
    crafted = ["Tab\there,\r\nnew\x0bline\x0c\x1fend\x7f!", "Café naïve ÉCOLE", "ΟΔΟΣ οδός", "漢字かな交じり文", "\x00",
               "it's U.S.-made (1999)... $5+$6=11 ~x~ |y| <b>z</b>", "emoji😀inside\u200bzero\u00a0nbsp\ue000pua"]
    sample = texts[:300] + crafted
    expected = {}
    for text in sample:
        for word, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text)):
            expected[word] = expected.get(word, 0) + 1
    assert word_counts(tok, sample) == expected


def test_private_use_characters_in_words_do_not_collide_with_continuations():
    """Continuing characters are spelled with unused characters while learning: a corpus that already has
    private-use characters keeps them apart."""
    words = {"\ue000a": 3, "a\ue000": 3, "\ue001\ue000": 2, "ab": 5}
    vocab = learn_wordpiece_vocab(words, 100, min_frequency=2)
    assert list(vocab)[:len(SPECIAL_TOKENS)] == SPECIAL_TOKENS
    assert {"\ue000", "\ue001", "a", "b", "##\ue000", "##a", "##b"} <= set(vocab)
    assert {"\ue000##a", "a##\ue000"}.isdisjoint(vocab)
    assert {"\ue000a", "a\ue000", "\ue001\ue000", "ab"} <= set(vocab)  # each pair seen at least twice is merged
    assert sorted(vocab.values()) == list(range(len(vocab)))


def test_min_frequency_and_vocab_size_bound_the_merges():
    words = {"low": 1, "lower": 1, "newest": 4, "widest": 2}
    once = learn_wordpiece_vocab(words, 1000, min_frequency=7)  # no pair is seen 7 times: characters only
    characters = {c for w in words for c in w}
    assert set(once) == set(SPECIAL_TOKENS) | characters | {"##" + c for w in words for c in w[1:]}
    merged = learn_wordpiece_vocab(words, 1000, min_frequency=2)
    assert {"newest", "##est"} <= set(merged) and "lower" not in merged  # "lower" is seen once
    small = learn_wordpiece_vocab(words, len(once) + 3, min_frequency=2)
    assert len(small) == len(once) + 3  # three merges, then vocab_size is reached
    tiny = learn_wordpiece_vocab(words, 10, min_frequency=2)
    assert set(tiny) == set(once)  # the characters are always all kept, even past vocab_size
