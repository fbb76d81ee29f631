"""Two many-class short-text sets built from TREC and 20 Newsgroups, for checking settings on short texts
(about 5 to 10 words, tens of classes, some with few examples):

- `trec50`: TREC's questions with their 50 fine labels (`ENTY:animal`, `NUM:date`, ...): 5,444 train / 499 test
  questions of about 10 words; the rarest classes have 1 to 5 training examples.
- `newsgroup_subjects`: each 20 Newsgroups post's subject line alone ("Re:"/"Fwd:" prefixes removed), labelled
  with its newsgroup: 11,314 train / 7,532 test (official by-date split) subjects of about 5 words. Threads share
  subjects, so a validation split carved from train reads higher than the later test posts.

    python benchmarks/short_texts.py --trec <trec folder> --newsgroups <20 newsgroups folder> --out short
    tformer train data=files data.train_file=short/trec50/train.parquet data.test_file=short/trec50/test.parquet \
        model=minilm_l6

Each folder gets train.parquet and test.parquet with columns text / label (label names as strings); the input
folders are the ones `data=trec data.dir=...` and `data=twenty_newsgroups data.dir=...` read.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd

SUBJECT = r"(?im)^Subject:[ \t]*(.*)$"
REPLY_PREFIX = re.compile(r"^\s*((re|fwd?)\s*:\s*)+", re.IGNORECASE)


def trec50(folder: Path, split: str) -> pd.DataFrame:
    frame = pd.read_parquet(folder / f"{split}.parquet")
    return pd.DataFrame({"text": frame["text"], "label": frame["fine_label"].astype(str)})


def subjects(folder: Path, split: str) -> pd.DataFrame:
    frame = pd.read_parquet(folder / f"{split}.parquet")
    names = (folder / "labels.txt").read_text().split()
    text = frame["text"].str.extract(SUBJECT)[0].fillna("").map(lambda s: REPLY_PREFIX.sub("", s).strip())
    out = pd.DataFrame({"text": text, "label": [names[i] for i in frame["label"]]})
    return out[out["text"].str.len() > 0].reset_index(drop=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trec", type=Path, required=True, help="folder with TREC's train/test parquet (fine_label)")
    ap.add_argument("--newsgroups", type=Path, required=True, help="folder with 20 Newsgroups' parquet + labels.txt")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    for name, build, folder in (("trec50", trec50, args.trec), ("newsgroup_subjects", subjects, args.newsgroups)):
        (args.out / name).mkdir(parents=True, exist_ok=True)
        for split in ("train", "test"):
            frame = build(folder, split)
            frame.to_parquet(args.out / name / f"{split}.parquet", index=False)
            print(f"{name}/{split}: {len(frame):,} texts, {frame['label'].nunique()} classes, "
                  f"{frame['text'].str.split().str.len().mean():.1f} words on average")


if __name__ == "__main__":
    main()
