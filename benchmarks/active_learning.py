"""Does `tformer suggest` pick better texts to label than chance? A learning curve on IMDB reviews (or any folder
of train.parquet / test.parquet with text and label columns, e.g. TREC questions).

    python benchmarks/active_learning.py --data data/imdb --out /tmp/active_learning
    python benchmarks/active_learning.py --data data/trec --pool 4700 --test 500 --out /tmp/al_trec
    python benchmarks/active_learning.py --seeds 0 --rounds 2 --pool 1000 --test 500 --epochs 1   # a quick check

Per seed: --initial labelled texts (train; the same number per class), a pool of --pool unlabelled ones and
--validation held-out ones (disjoint, from the rest of train) and --test texts from test, all seeded samples. Round 0 trains on
the initial set. Then, for each strategy, --rounds rounds each label --per-round more reviews from the pool (their
true labels revealed) and train again from the pretrained encoder on everything labelled so far:

    suggest  `tformer_cli.suggest` with the previous round's model (uncertainty + k-center diversity);
    random   a seeded random sample of the pool (the baseline every active-learning method must beat).

Same model, epochs and label budget for both; test accuracy after every round. Writes results.json,
results.md (mean and spread over seeds, per round and strategy) and learning_curve.png into --out.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from tformer_cli import suggest, train


def splits(folder: Path, args, seed: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(initial labelled, validation, pool, test): seeded, disjoint samples; the initial set is class-balanced."""
    rng = np.random.default_rng(seed)
    source = pd.read_parquet(folder / "train.parquet")[["text", "label"]]
    order = rng.permutation(len(source))
    shuffled = source.iloc[order].reset_index(drop=True)
    per_class = args.initial // shuffled["label"].nunique()
    initial = shuffled.groupby("label", group_keys=False).head(per_class)
    rest = shuffled.drop(initial.index)
    validation, pool = rest.iloc[:args.validation], rest.iloc[args.validation:args.validation + args.pool]
    test_source = pd.read_parquet(folder / "test.parquet")[["text", "label"]]
    test = test_source.iloc[rng.permutation(len(test_source))[:args.test]]
    return (initial.reset_index(drop=True), validation.reset_index(drop=True), pool.reset_index(drop=True),
            test.reset_index(drop=True))


def fit(labelled: pd.DataFrame, validation: pd.DataFrame, test: pd.DataFrame, args, seed: int, run_dir: Path):
    """Train on `labelled` from the pretrained encoder: (test accuracy, the TrainResult)."""
    overrides = [f"model={args.model}", f"model.max_len={args.max_len}", f"trainer.epochs={args.epochs}",
                 "trainer.precision=fp32" if args.fp32 else "trainer.precision=auto", f"seed={seed}",
                 *args.override]
    result = train(overrides, run_dir=run_dir, data=labelled, validation_data=validation, test_data=test,
                   quiet=True)
    return float(result.test_metrics["accuracy"]), result


def one_seed(folder: Path, args, seed: int, out: Path) -> dict:
    initial, validation, pool, test = splits(folder, args, seed)
    t0 = time.time()
    acc0, first = fit(initial, validation, test, args, seed, out / f"seed{seed}" / "round0")
    print(f"seed {seed} round 0: {len(initial)} labelled, test accuracy {acc0:.4f} ({time.time() - t0:.0f} s)",
          flush=True)
    curves = {}
    for strategy in ("suggest", "random"):
        rng = np.random.default_rng(1000 + seed)
        labelled, left, result, accs = initial, pool, first, [acc0]
        for r in range(1, args.rounds + 1):
            t0 = time.time()
            if strategy == "suggest":
                picks = suggest(classifier=result.classifier(), texts=left["text"].tolist(), n=args.per_round,
                                labelled=labelled["text"].tolist(), uncertainty=args.uncertainty,
                                pool_factor=args.pool_factor, quiet=True)
                rows = picks.index.to_numpy()
            else:
                rows = rng.choice(len(left), args.per_round, replace=False)
            labelled = pd.concat([labelled, left.iloc[rows]], ignore_index=True)
            left = left.drop(left.index[rows]).reset_index(drop=True)
            acc, result = fit(labelled, validation, test, args, seed, out / f"seed{seed}" / f"{strategy}{r}")
            accs.append(acc)
            print(f"seed {seed} {strategy} round {r}: {len(labelled)} labelled, test accuracy {acc:.4f} "
                  f"({time.time() - t0:.0f} s)", flush=True)
        curves[strategy] = accs
    return curves


def table(results: dict, sizes: list[int]) -> str:
    """Markdown: per round, each strategy's mean test accuracy and its spread (min-max over seeds)."""
    lines = ["| round | labelled | suggest | random | suggest - random |", "|---|---|---|---|---|"]
    for r, size in enumerate(sizes):
        cells = []
        for strategy in ("suggest", "random"):
            values = np.array([results[s][strategy][r] for s in results])
            cells.append(f"{values.mean():.4f} ({values.min():.4f}-{values.max():.4f})" if len(values) > 1
                         else f"{values.mean():.4f}")
        gap = np.mean([results[s]["suggest"][r] - results[s]["random"][r] for s in results])
        lines.append(f"| {r} | {size} | {cells[0]} | {cells[1]} | {gap:+.4f} |")
    return "\n".join(lines)


def plot(results: dict, sizes: list[int], path: Path, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for strategy, colour in (("suggest", "tab:blue"), ("random", "tab:gray")):
        values = np.array([results[s][strategy] for s in results])  # (seeds, rounds + 1)
        ax.plot(sizes, values.mean(0), marker="o", color=colour, label=strategy)
        if len(values) > 1:
            ax.fill_between(sizes, values.min(0), values.max(0), color=colour, alpha=0.2)
    ax.set_xlabel("labelled texts")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{name}: tformer suggest vs random ({len(results)} seed{'s' * (len(results) > 1)})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", "--imdb", dest="data",
                    default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "imdb"),
                    help="folder with train.parquet / test.parquet (text, label): IMDB by default")
    ap.add_argument("--out", default="/tmp/active_learning", help="results, plots and the runs go here")
    ap.add_argument("--model", default="minilm_l6")
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--initial", type=int, default=200)
    ap.add_argument("--per-round", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--pool", type=int, default=5000)
    ap.add_argument("--validation", type=int, default=500)
    ap.add_argument("--test", type=int, default=2000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--uncertainty", default="margin", choices=["margin", "entropy"])
    ap.add_argument("--pool-factor", type=int, default=10)
    ap.add_argument("--fp32", action="store_true", help="trainer.precision=fp32 (default: auto)")
    ap.add_argument("--override", nargs="*", default=[], help="more `tformer train` overrides for every round")
    args = ap.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    results = {seed: one_seed(Path(args.data), args, seed, out) for seed in args.seeds}
    sizes = [args.initial + r * args.per_round for r in range(args.rounds + 1)]
    (out / "results.json").write_text(json.dumps({"args": vars(args), "labelled": sizes,
                                                  "test_accuracy": {str(s): c for s, c in results.items()}}, indent=2))
    md = table(results, sizes)
    (out / "results.md").write_text(md + "\n")
    plot(results, sizes, out / "learning_curve.png", Path(args.data).name)
    print(md)
    print(f"wrote {out}/results.json, results.md, learning_curve.png ({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
