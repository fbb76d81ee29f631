"""TF-IDF + linear SVM on 20 Newsgroups with headers, footers and quotes removed (the figure tformer is compared
with in the README). Uses tformer's own loader, so the split and the cleaning are the same as `tformer train`.

    python benchmarks/newsgroups_baseline.py [--data-dir ../shared/data/twenty_newsgroups]
"""
import argparse
from pathlib import Path

from omegaconf import OmegaConf
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.metrics import accuracy_score, f1_score
from sklearn.svm import LinearSVC

from tformer_cli.data import sources

ap = argparse.ArgumentParser()
ap.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared/data/twenty_newsgroups"))
args = ap.parse_args()
cfg = OmegaConf.create({"name": "twenty_newsgroups", "dir": args.data_dir, "text_column": "text", "label_column": "label",
                        "validation_fraction": 0.2, "remove": ["headers", "footers", "quotes"]})
data = sources.load(cfg, seed=42)
train = data.splits["train"]
test = data.splits["test"]
for name, texts, labels in (("train (80%, as tformer trains)", train["text"], train["label"]),):
    vec = TfidfVectorizer(sublinear_tf=True, min_df=2)
    clf = LinearSVC(C=0.5).fit(vec.fit_transform(texts), labels)
    pred = clf.predict(vec.transform(test["text"]))
    print(f"TF-IDF + LinearSVC, {name}: test accuracy {accuracy_score(test['label'], pred):.4f}, "
          f"macro-F1 {f1_score(test['label'], pred, average='macro'):.4f} (n={len(test)})")
