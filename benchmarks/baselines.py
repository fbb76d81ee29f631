"""The strongest simple baselines on exactly the splits `tformer train` uses, beside a tformer run's test metrics.

    python benchmarks/baselines.py data=imdb data.dir=../shared/data/imdb [--run outputs/train/<date>/<time>]
    python benchmarks/baselines.py data=twenty_newsgroups data.dir=../shared/data/twenty_newsgroups

Arguments of the form key=value are `tformer train` overrides: the data are loaded, cleaned and split by tformer's
own loader with the same seed, so the baselines train on tformer's train split (validation carved out) and are
scored on the same test split. Each baseline is TF-IDF (word uni+bigrams, sublinear tf, min_df 2) with logistic
regression or a linear SVM; C is chosen on tformer's validation split from a small grid, then the model is refit
on the train split. With --run, the run's test_metrics.json is printed in the same table.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def fit_and_score(make_model, grid, x_train, y_train, x_val, y_val, x_test, y_test):
    from sklearn.metrics import accuracy_score, f1_score

    scores = {c: accuracy_score(y_val, make_model(c).fit(x_train, y_train).predict(x_val)) for c in grid}
    best_c = max(scores, key=scores.get)
    pred = make_model(best_c).fit(x_train, y_train).predict(x_test)
    average = "binary" if len(set(y_train)) == 2 else "macro"
    return {"accuracy": accuracy_score(y_test, pred), "f1": f1_score(y_test, pred, average=average), "C": best_c,
            "val_accuracy": scores[best_c]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="tformer train overrides, e.g. data=imdb data.dir=...")
    ap.add_argument("--run", help="a tformer run dir whose test metrics to show beside the baselines")
    args = ap.parse_args()

    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import LinearSVC

    from tformer_cli.runs.config import TrainConfig
    from tformer_cli.data import sources
    from tformer_cli.store.layout import RunDir

    config = TrainConfig.compose(args.overrides)
    data = sources.load(config.data, seed=config.seed)
    if "test" not in data.splits:
        raise SystemExit(f"{config.data.name} has no test split")
    s = data.splits
    print(f"{config.data.name} from {data.source}: train {len(s['train']):,}, validation {len(s['validation']):,}, "
          f"test {len(s['test']):,}", flush=True)
    t0 = time.perf_counter()
    vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2, max_features=1_000_000)
    x_train = vec.fit_transform(s["train"]["text"])
    x_val, x_test = vec.transform(s["validation"]["text"]), vec.transform(s["test"]["text"])
    y = {k: s[k]["label"] for k in ("train", "validation", "test")}
    rows = []
    for name, make, grid in (
        ("TF-IDF uni+bigram + logistic regression", lambda c: LogisticRegression(C=c, max_iter=2000), (1, 10, 100)),
        ("TF-IDF uni+bigram + linear SVM", lambda c: LinearSVC(C=c), (0.1, 0.5, 1.0)),
    ):
        t = time.perf_counter()
        r = fit_and_score(make, grid, x_train, y["train"], x_val, y["validation"], x_test, y["test"])
        rows.append((name + f" (C={r['C']})", r["accuracy"], r["f1"], time.perf_counter() - t))
        print(f"  {rows[-1][0]:<52} test accuracy {r['accuracy']:.4f}  f1 {r['f1']:.4f}  "
              f"({rows[-1][3]:.0f}s)", flush=True)
    if args.run:
        run = RunDir(args.run)
        if not run.test_metrics.is_file():
            raise SystemExit(f"{run} has no test metrics; train with trainer.test_after_fit=true")
        m = json.loads(run.test_metrics.read_text())
        if m.get("n") != len(s["test"]):
            print(f"  warning: the run was tested on {m.get('n')} texts, the baselines on {len(s['test'])}")
        rows.append((f"tformer run {run}", m["accuracy"], m["f1"], float("nan")))
        print(f"  {rows[-1][0]:<52} test accuracy {m['accuracy']:.4f}  f1 {m['f1']:.4f}")
    print(f"vectorising and fitting took {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
