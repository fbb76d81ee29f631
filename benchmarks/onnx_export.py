"""ONNX export figures for one run: cold start of `tformer predict` under each runtime, throughput, and the test
accuracy of the checkpoint, its fp32 export and its int8 export on the run's own test split.

    python benchmarks/onnx_export.py outputs/train/<date>/<time> [--repeat 5] [--max-test 5000]

Exports are made (or remade) into <run dir>/export/onnx and onnx-int8. Cold start = wall time of a fresh
`tformer predict ... "one text"` process, median of --repeat runs (the file cache warm, as on a second call).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.inference import cpu_name  # noqa: E402


def cold_start(run: Path, runtime: str, repeat: int) -> float:
    tformer = Path(sys.executable).parent / "tformer"
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([str(tformer), "predict", f"--runtime={runtime}", f"--checkpoint={run}", "--json",
                        "a gripping, beautifully shot film"], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--max-test", type=int, default=5000, help="score at most this many test texts (seeded subset)")
    args = ap.parse_args()

    import numpy as np

    from tformer_cli.classifier import Classifier
    from tformer_cli.runs.config import data_config
    from tformer_cli.data import sources
    from tformer_cli.deploy.export import export_onnx
    from tformer_cli.deploy.onnx_classifier import OnnxClassifier
    from tformer_cli import checkpoint

    fp32, int8 = export_onnx(args.run), export_onnx(args.run, quantize="int8")
    loaded = checkpoint.load(args.run)
    saved = loaded.saved_config()
    data = sources.load(data_config(saved["data"], max_eval_samples=args.max_test), seed=int(saved.get("seed", 0)))
    test = data.splits["test"]
    texts, labels = list(test["text"]), np.asarray(test["label"])
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; "
          f"run {args.run}; {len(texts)} test texts")
    print(f"{'runtime':<14}{'file MB':>9}{'|dlogit| max':>14}{'accuracy':>10}{'texts/s':>9}{'cold start s':>14}")
    for name, clf, exported in (("torch fp32", Classifier.load(args.run, device="cpu"), None),
                                ("onnx fp32", OnnxClassifier.load(fp32.path), fp32),
                                ("onnx int8", OnnxClassifier.load(int8.path), int8)):
        start = time.perf_counter()
        probs = clf.predict_proba(texts, batch_size=64)
        speed = len(texts) / (time.perf_counter() - start)
        accuracy = float((probs.argmax(1) == labels).mean())
        size = (exported.bytes if exported else loaded.files.weights.stat().st_size) / 1e6
        diff = f"{exported.max_abs_logit_diff:.1e}" if exported else "-"
        path = exported.path if exported else args.run
        cold = cold_start(path, "onnx" if exported else "torch", args.repeat)
        print(f"{name:<14}{size:>9.1f}{diff:>14}{accuracy:>10.4f}{speed:>9.0f}{cold:>14.2f}")


if __name__ == "__main__":
    main()
