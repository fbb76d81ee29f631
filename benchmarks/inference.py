"""Inference as a product figure: for each run, test accuracy, CPU texts/s at batch 1 and batch 32, and peak memory
of the PyTorch checkpoint, its fp32 ONNX export and its int8 export, each runtime measured in a fresh process that
imports only what serving with it needs (the texts come from a file).

    python benchmarks/inference.py outputs/train/<date>/<time> [<run dir> ...] [--max-test 5000] [--json out.json]
    python benchmarks/inference.py <run dir> --int8-recipes     # also the int8 recipes tried for the default

Texts/s counts whole `predict_proba` calls on real test texts (tokenizing included, each text read as the run was
trained to: max_len, head_tail or chunks): batch 1 = --single texts one call each, batch 32 = --batched texts in
calls of 32. Accuracy is on the run's test split (a seeded subset of --max-test texts; the same texts for every
runtime). Peak memory is the worker process's peak resident set (model, runtime, tokenizer and the texts).
Exports are made (or remade) into <run dir>/export/onnx and onnx-int8 with `tformer export`'s own code.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def peak_mib() -> float:
    """This process's peak resident set (VmHWM: its own since exec; ru_maxrss would carry the parent's size from
    the fork)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(kind: str, path: str, texts_file: str, single: int, batched: int) -> None:
    """One runtime in this process: accuracy over every text, then the two speeds; prints one JSON line."""
    import numpy as np

    data = json.loads(Path(texts_file).read_text())
    texts, labels = data["texts"], np.asarray(data["labels"])
    if kind == "torch":
        from tformer_cli.classifier import Classifier

        clf = Classifier.load(path, device="cpu")
    else:
        from tformer_cli.deploy.onnx_classifier import OnnxClassifier

        clf = OnnxClassifier.load(path)
    start = time.perf_counter()
    probs = clf.predict_proba(texts, batch_size=32)
    whole = time.perf_counter() - start
    accuracy = float((probs.argmax(1) == labels).mean())
    b1 = b32 = None  # (--single 0 / --batched 0: accuracy only)
    part = texts[:batched]
    if part:
        start = time.perf_counter()
        clf.predict_proba(part, batch_size=32)
        b32 = len(part) / (time.perf_counter() - start)
    if single:
        start = time.perf_counter()
        for text in texts[:single]:
            clf.predict_proba([text], batch_size=1)
        b1 = min(single, len(texts)) / (time.perf_counter() - start)
    peak = peak_mib()
    print(json.dumps({"accuracy": accuracy, "texts_per_s_b1": b1, "texts_per_s_b32": b32, "peak_mib": peak,
                      "accuracy_seconds": whole}))


def measure(kind: str, path: Path, texts_file: Path, args) -> dict:
    done = subprocess.run([sys.executable, __file__, "--worker", kind, str(path), "--texts-file", str(texts_file),
                           "--single", str(args.single), "--batched", str(args.batched)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{kind} worker on {path} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_texts(run: Path, max_test: int | None):
    from tformer_cli.data import sources
    from tformer_cli.runs.config import data_config
    from tformer_cli import checkpoint

    saved = checkpoint.load(run, "cpu").saved_config()
    cfg = data_config(saved["data"], **({"max_eval_samples": max_test} if max_test else {}))
    test = sources.load(cfg, seed=int(saved.get("seed", 0))).splits["test"]
    return list(test["text"]), [int(x) for x in test["label"]]


def int8_recipes(fp32_model: Path, out_dir: Path) -> dict[str, Path]:
    """int8 models of one fp32 export by each recipe tried for the default (benchmark only)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(fp32_model)).graph
    matmuls = [n for n in graph.node if n.op_type == "MatMul"]
    blocks = sorted({n.name.split("/")[1] for n in matmuls if n.name.startswith("/blocks.")},
                    key=lambda b: int(b.split(".")[1]))
    edge = [n.name for n in graph.node if n.name.startswith((f"/{blocks[0]}/", f"/{blocks[-1]}/"))] if blocks else []
    linear = {"op_types_to_quantize": ["MatMul", "Gemm"]}  # (onnxruntime's default also quantizes the Gather
    # that reads the token table; a MatMul of two activations, the attention products, is never quantized
    # dynamically: MatMulConstBOnly)
    recipes = {
        "onnxruntime defaults": {},
        "per-channel (the default)": {"per_channel": True},
        "per-channel, 7-bit weights": {"per_channel": True, "reduce_range": True},
        "token table fp32": linear,
        "token table fp32, per-channel": {**linear, "per_channel": True},
        "token table fp32, per-channel, 7-bit weights": {**linear, "per_channel": True, "reduce_range": True},
        "token table, first and last block fp32, per-channel": {**linear, "per_channel": True,
                                                                "nodes_to_exclude": edge},
    }
    out = {}
    logging.disable(logging.WARNING)  # onnxruntime's advice to pre-process goes to the root logger
    for name, kwargs in recipes.items():
        target = out_dir / (name.replace(" ", "_").replace(",", "") + ".onnx")
        quantize_dynamic(str(fp32_model), str(target), weight_type=QuantType.QInt8, **kwargs)
        out[name] = target
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path)
    ap.add_argument("--max-test", type=int, default=5000, help="at most this many test texts (seeded subset); 0: all")
    ap.add_argument("--single", type=int, default=200, help="texts timed one call each (batch 1)")
    ap.add_argument("--batched", type=int, default=1024, help="texts timed in calls of 32")
    ap.add_argument("--int8-recipes", action="store_true", help="also each int8 recipe tried for the default")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--worker", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--texts-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(*args.worker, args.texts_file, args.single, args.batched)

    import onnxruntime
    import torch

    from tformer_cli.deploy.export import export_onnx

    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; torch {torch.__version__}, onnxruntime "
          f"{onnxruntime.__version__}")
    rows = []
    for run in args.runs:
        texts, labels = test_texts(run, args.max_test or None)
        fp32, int8 = export_onnx(run), export_onnx(run, quantize="int8")
        with tempfile.TemporaryDirectory() as tmp:
            texts_file = Path(tmp) / "texts.json"
            texts_file.write_text(json.dumps({"texts": texts, "labels": labels}))
            targets = [("torch fp32", "torch", run, None), ("onnx fp32", "onnx", fp32.path, fp32),
                       ("onnx int8", "onnx", int8.path, int8)]
            if args.int8_recipes:
                import shutil

                for name, model in int8_recipes(fp32.path / "model.onnx", Path(tmp)).items():
                    folder = Path(tmp) / f"export-{model.stem}"
                    shutil.copytree(int8.path, folder, ignore=shutil.ignore_patterns(".tformer", "manifest.json"))
                    shutil.copyfile(model, folder / "model.onnx")
                    from tformer_cli.store import manifest
                    from tformer_cli.store.layout import ExportDir

                    manifest.write(ExportDir(folder))
                    targets.append((f"int8: {name}", "onnx", folder, None))
            base = None
            for name, kind, path, exported in targets:
                m = measure(kind, path, texts_file, args)
                size = (Path(path) / "model.onnx").stat().st_size if kind == "onnx" else \
                    (run / "checkpoints" / "best" / "model.safetensors").stat().st_size
                base = base if base is not None else m["accuracy"]
                row = {"run": str(run), "runtime": name, "test_texts": len(texts), "accuracy": m["accuracy"],
                       "accuracy_change_points": 100 * (m["accuracy"] - base), "texts_per_s_b1": m["texts_per_s_b1"],
                       "texts_per_s_b32": m["texts_per_s_b32"], "peak_mib": m["peak_mib"], "file_mb": size / 1e6}
                rows.append(row)
                speed = lambda v: "-" if v is None else f"{v:,.1f}"  # noqa: E731
                print(f"| {run.name} | {name} | {row['file_mb']:.1f} MB | {row['accuracy']:.4f} "
                      f"({row['accuracy_change_points']:+.2f}) | {speed(row['texts_per_s_b1'])} | "
                      f"{speed(row['texts_per_s_b32'])} | {row['peak_mib']:,.0f} MiB |", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"machine": cpu_name(), "cores": os.cpu_count(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
