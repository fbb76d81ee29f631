"""Does `tformer audit` find wrong labels? Plant them and count.

    python benchmarks/audit_noise.py --dataset imdb --out /tmp/audit_imdb                  # the full run
    python benchmarks/audit_noise.py --dataset twenty_newsgroups --out /tmp/audit_20ng
    python benchmarks/audit_noise.py --n-train 2000 --n-test 1000 --model small --max-len 128 --epochs 1 --folds 3
                                                                                          # a quick check

A seeded sample of --n-train training texts (all of them when 0) has --noise of its labels flipped to a random
other class (seeded); the audit (k-fold, out-of-fold probabilities, cleanlab) runs on the noisy labels. Reported:
the precision and recall of the flagged rows against the flipped ones, the precision of the top-ranked rows (as
many as were flipped), and the test accuracy of a model trained on the noisy set against one trained on the noisy
set without the flagged rows (same model, epochs and seed; --n-test texts of the dataset's test split). Writes
results.json into --out (with the audit's folder, the two training runs and the data files).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from tformer_cli import audit, train
from tformer_cli.data.newsgroups import clean

READING = {"imdb": ["data.truncation=left"],  # the verdict is at the end of a review
           "twenty_newsgroups": ["data.remove=[headers,footers,quotes]"]}
REMOVED = {"twenty_newsgroups": ("headers", "footers", "quotes")}


def noisy_sample(root: Path, args) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(the noisy training sample with its `true_label` and `flipped` columns, the test sample, class names)."""
    rng = np.random.default_rng(args.seed)
    source = pd.read_parquet(root / "train.parquet")[["text", "label"]]
    if args.n_train and args.n_train < len(source):
        source = source.iloc[np.sort(rng.choice(len(source), args.n_train, replace=False))]
    source = source.reset_index(drop=True).rename(columns={"label": "true_label"})
    names = (root / "labels.txt").read_text().split("\n")
    names = [n for n in names if n.strip()]
    k = len(names)
    flipped = np.zeros(len(source), dtype=bool)
    flipped[rng.choice(len(source), int(round(args.noise * len(source))), replace=False)] = True
    shift = rng.integers(1, k, size=len(source))  # 1..k-1: always another class, uniformly
    source["label"] = np.where(flipped, (source["true_label"] + shift) % k, source["true_label"])
    source["flipped"] = flipped
    test = pd.read_parquet(root / "test.parquet")[["text", "label"]]
    if args.n_test and args.n_test < len(test):
        test = test.iloc[np.sort(rng.choice(len(test), args.n_test, replace=False))]
    return source, test.reset_index(drop=True), names


def trained_accuracy(frame: pd.DataFrame, test_file: Path, common: list[str], run_dir: Path) -> float:
    """Test accuracy of a model trained on `frame` (with --resume, a finished run in run_dir is read, not redone)."""
    path = run_dir.with_suffix(".parquet")
    done = run_dir / "test_metrics.json"
    if done.is_file() and path.is_file() and pd.read_parquet(path).equals(frame[["text", "label"]].reset_index(drop=True)):
        return float(json.loads(done.read_text())["accuracy"])
    frame[["text", "label"]].to_parquet(path, index=False)
    done = train([*common, "data=files", f"data.train_file={path}", f"data.test_file={test_file}"], run_dir=run_dir,
                 quiet=True)
    return float(done.test_metrics["accuracy"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="imdb", choices=sorted(READING))
    parser.add_argument("--data-root", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--n-train", type=int, default=0, help="training texts sampled (0: all)")
    parser.add_argument("--n-test", type=int, default=0, help="test texts sampled (0: all)")
    parser.add_argument("--noise", type=float, default=0.05, help="share of training labels flipped")
    parser.add_argument("--model", default="small")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_audit_noise"))
    parser.add_argument("--resume", action="store_true",
                        help="continue the audit in --out (finished folds and trainings on the same rows are kept)")
    parser.add_argument("overrides", nargs="*", help="more `tformer train` overrides, e.g. embedding_init=minilm")
    args = parser.parse_args()

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    noisy, test, names = noisy_sample(args.data_root / args.dataset, args)
    test_file = out / "test.parquet"
    test.to_parquet(test_file, index=False)
    train_file = out / "noisy_train.parquet"
    noisy[["text", "label"]].to_parquet(train_file, index=False)
    labels = "[" + ",".join("'" + n.replace("'", "\\'") + "'" for n in names) + "]"
    common = [f"model={args.model}", f"model.max_len={args.max_len}", f"trainer.epochs={args.epochs}",
              f"seed={args.seed}", f"data.label_names={labels}", *READING[args.dataset], *args.overrides]

    started = time.monotonic()
    resume = [f"resume={out / 'audit'}"] if args.resume else []
    result = audit([*common, f"audit.folds={args.folds}", "data=files", f"data.train_file={train_file}", *resume],
                   run_dir=None if args.resume else out / "audit", quiet=False)
    audit_s = time.monotonic() - started
    # the audit's rows are the loaded splits' (validation carved from train), their texts as read (20 Newsgroups:
    # headers, footers and quotes removed): matched back by the text as read and the given label
    read = [clean(t, REMOVED.get(args.dataset, ())) for t in noisy["text"]]
    keys = list(zip(read, noisy["label"].map(names.__getitem__)))
    flipped_keys = {k for k, f in zip(keys, noisy["flipped"]) if f}
    is_flipped = lambda frame: np.array([(t, g) in flipped_keys for t, g in zip(frame["text"], frame["given_label"])])
    hits = int(is_flipped(result.issues).sum())
    n_flipped, n_flagged = int(noisy["flipped"].sum()), len(result.issues)
    top = is_flipped(result.scores.head(n_flipped))
    flagged = set(zip(result.issues["text"], result.issues["given_label"]))
    kept = noisy[[k not in flagged for k in keys]]

    noisy_acc = trained_accuracy(noisy, test_file, common, out / "train_noisy")
    cleaned_acc = trained_accuracy(kept, test_file, common, out / "train_cleaned")
    results = {
        "dataset": args.dataset, "n_train": len(noisy), "n_test": len(test), "noise": args.noise,
        "model": args.model, "overrides": args.overrides, "epochs": args.epochs, "max_len": args.max_len, "folds": args.folds, "seed": args.seed,
        "flipped": n_flipped, "flagged": n_flagged, "flagged_and_flipped": hits,
        "precision": round(hits / max(n_flagged, 1), 4), "recall": round(hits / max(n_flipped, 1), 4),
        f"precision_at_{n_flipped}": round(float(top.mean()), 4) if n_flipped else None,
        "test_accuracy_noisy": round(noisy_acc, 4), "test_accuracy_without_flagged": round(cleaned_acc, 4),
        "rows_dropped": len(noisy) - len(kept), "audit_seconds": round(audit_s, 1),
        "audit_dir": str(result.run_dir)}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
