"""The deletion test of predict's explanations: delete the k words an explanation names as most important, and see
how much the probability of the model's answer falls, against deleting k random words.

    python benchmarks/explain_deletion.py --checkpoint outputs/train/<date>/<time> --data <test.parquet> \
        [--n 200] [--k 3] [--max-words 80] [--seed 0]

Methods: occlusion (predict --explain, the default: each word's weight is the fall when it alone is deleted),
rollout and last_layer (predict --explain=rollout: attention weights, summed over each word's tokens), random.
Texts: a seeded sample of --n texts of at most --max-words words (occlusion costs one forward pass per word).
Prints one line per method: the mean fall of the answer's probability, and the share of answers that changed.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tformer_cli import Classifier  # noqa: E402
from tformer_cli.classifier import WORD  # noqa: E402


def attention_by_word(clf, text: str, spans: list[tuple[int, int]]) -> dict[str, np.ndarray]:
    """Rollout and last-layer weights of the text's first window, each token's weight added to the word (WORD span)
    its first character falls in."""
    encoding = clf._tok.encode(text)
    weights = clf.predict([text], explain="rollout")[0]["explanation"]
    out = {}
    for name, key in (("rollout", "rollout"), ("last_layer", "last_layer")):
        per_word = np.zeros(len(spans))
        starts = np.array([a for a, _ in spans])
        for (a, b), w in zip(encoding.offsets[:len(weights[key])], weights[key]):
            if b > a:  # (special tokens have empty offsets)
                at = int(np.searchsorted(starts, a, side="right")) - 1
                if at >= 0 and a < spans[at][1]:
                    per_word[at] += w
        out[name] = per_word
    return out


def without(text: str, spans: list[tuple[int, int]], drop) -> str:
    drop = set(int(i) for i in drop)
    kept, at = [], 0
    for i, (a, b) in enumerate(spans):
        if i in drop:
            kept.append(text[at:a])
            at = b
    return "".join(kept) + text[at:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data", required=True, type=Path, help="a parquet file with a text column")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--max-words", type=int, default=80)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    clf = Classifier.load(args.checkpoint)
    texts = pd.read_parquet(args.data)["text"].tolist()
    short = [t for t in texts if args.k + 2 <= len(WORD.findall(t)) <= args.max_words]
    rng = np.random.default_rng(args.seed)
    chosen = [short[i] for i in sorted(rng.choice(len(short), size=min(args.n, len(short)), replace=False))]
    print(f"{len(chosen)} texts of {args.k + 2} to {args.max_words} words (of {len(texts):,}; {len(short):,} that "
          f"short), deleting {args.k} words each", flush=True)
    started = time.perf_counter()
    answers = clf.predict(chosen, explain=True)
    print(f"occlusion explanations: {time.perf_counter() - started:.0f} s", flush=True)
    falls = {m: [] for m in ("occlusion", "rollout", "last_layer", "random")}
    flips = {m: [] for m in falls}
    variants, owners = [], []
    for t, answer in zip(chosen, answers):
        spans = [m.span() for m in WORD.finditer(t)]
        measured = np.array([-np.inf if w is None else w for w in answer["explanation"]["weights"]])  # (None: past
        ranked = {"occlusion": np.argsort(-measured, kind="stable")[:args.k],  # the words occlusion measures)
                  "random": rng.choice(len(spans), size=args.k, replace=False)}
        ranked |= {m: np.argsort(-w, kind="stable")[:args.k] for m, w in attention_by_word(clf, t, spans).items()}
        for method in falls:
            variants.append(without(t, spans, ranked[method]))
            owners.append(method)
    full = clf.predict_proba(chosen)
    cut = clf.predict_proba(variants)
    for j, (method, p_cut) in enumerate(zip(owners, cut)):
        i = j // len(falls)
        c = int(np.argmax(full[i]))
        falls[method].append(full[i, c] - p_cut[c])
        flips[method].append(int(np.argmax(p_cut)) != c)
    for method in falls:
        print(f"{method:>10}: mean fall of the answer's probability {np.mean(falls[method]):.4f}, answers changed "
              f"{np.mean(flips[method]):.1%}", flush=True)


if __name__ == "__main__":
    main()
