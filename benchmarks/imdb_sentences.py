"""A short-text sentiment set cut from IMDB reviews, as a stand-in for SST-2-like data: the last sentence of each
review (the verdict is usually at the end) with the review's label.

    python benchmarks/imdb_sentences.py --imdb ../shared/data/imdb --out /tmp/imdb_sentences
    tformer train data=files data.train_file=/tmp/imdb_sentences/train.parquet \
        data.validation_file=/tmp/imdb_sentences/validation.parquet \
        data.test_file=/tmp/imdb_sentences/test.parquet model=minilm_l6 trainer.epochs=1

Writes train (--n-train, default 8,000, from IMDB train), validation (--n-validation, from IMDB train, disjoint
from train) and test (--n-test, from IMDB test) parquet files with columns text / label, plus labels.txt. Each
sentence is the last one of its review with --min-words..--max-words words (reviews without one are skipped);
rows are a seeded, class-balanced sample. A last sentence does not always carry the review's verdict, so the best
reachable accuracy is below a full review's.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
MARKUP = re.compile(r"<br\s*/?>|<[^>]+>")


def last_sentence(review: str, min_words: int, max_words: int) -> str | None:
    """The review's last sentence of a usable length, else None."""
    sentences = [s.strip() for s in SENTENCE_END.split(MARKUP.sub(" ", review)) if s.strip()]
    for sentence in reversed(sentences):
        if min_words <= len(sentence.split()) <= max_words:
            return sentence
    return None


def sentences(frame: pd.DataFrame, n: int, seed: int, min_words: int, max_words: int) -> pd.DataFrame:
    """n rows, half of each label, drawn after shuffling with the seed."""
    texts = frame["text"].map(lambda r: last_sentence(r, min_words, max_words))
    frame = pd.DataFrame({"text": texts, "label": frame["label"].astype("int64")}).dropna()
    frame = frame.sample(frac=1.0, random_state=seed)
    per_label = n // frame["label"].nunique()
    return (frame.groupby("label", group_keys=False).head(per_label).sample(frac=1.0, random_state=seed)
            .reset_index(drop=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--imdb", required=True, help="folder with IMDB train.parquet / test.parquet (text, label)")
    ap.add_argument("--out", required=True, help="folder to write train/validation/test.parquet and labels.txt")
    ap.add_argument("--n-train", type=int, default=8000)
    ap.add_argument("--n-validation", type=int, default=1000)
    ap.add_argument("--n-test", type=int, default=2000)
    ap.add_argument("--min-words", type=int, default=4)
    ap.add_argument("--max-words", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    imdb, out = Path(args.imdb), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pool = sentences(pd.read_parquet(imdb / "train.parquet"), args.n_train + args.n_validation, args.seed,
                     args.min_words, args.max_words)
    splits = {"train": pool.iloc[:args.n_train], "validation": pool.iloc[args.n_train:],
              "test": sentences(pd.read_parquet(imdb / "test.parquet"), args.n_test, args.seed, args.min_words,
                                args.max_words)}
    for name, frame in splits.items():
        frame.reset_index(drop=True).to_parquet(out / f"{name}.parquet", index=False)
        words = frame["text"].str.split().str.len()
        print(f"{name}: {len(frame)} sentences, {words.median():.0f} words median, {words.max()} max, "
              f"labels {frame['label'].value_counts().sort_index().to_dict()}")
    labels = imdb / "labels.txt"
    (out / "labels.txt").write_text(labels.read_text() if labels.is_file() else "neg\npos\n")


if __name__ == "__main__":
    main()
