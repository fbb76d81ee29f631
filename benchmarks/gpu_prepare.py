"""What a GPU machine without network needs to run benchmarks/gpu_check.py, gathered into .gpu/ (git-ignored):

    python benchmarks/gpu_prepare.py [--python 3.12] [--imdb ../data/imdb] [--rows 4000]

- .gpu/wheels/: the packages tformer needs that such a machine usually lacks (Hydra, OmegaConf and its parser,
  datasets, the server's FastAPI stack), for its Python, at the versions installed here; everything else (torch,
  transformers, tokenizers, safetensors, pyarrow, pandas, onnx, onnxruntime, matplotlib, rich, ...) is expected
  there. Downloaded with pip (binary wheels only; the one source-only package is built into a wheel here).
- .gpu/imdb/: a seeded, class-balanced subset of IMDB's train and test parquet files.

Everything together stays well under the 64 MiB such a run may carry; the script prints the total.
"""
from __future__ import annotations

import argparse
import importlib.metadata as metadata
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".gpu"
# Installed on the usual GPU image (torch, transformers, pandas, pyarrow, matplotlib, onnx, ...) except these.
MISSING = ["hydra-core", "omegaconf", "antlr4-python3-runtime", "datasets", "dill", "multiprocess", "fastapi",
           "starlette", "uvicorn", "pydantic", "pydantic_core", "annotated-types", "typing-inspection",
           "annotated-doc", "opentelemetry-api"]  # (FastAPI imports opentelemetry's API for its telemetry hooks)
SOURCE_ONLY = ["antlr4-python3-runtime"]  # no wheel on PyPI: built here (pure Python)
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def wheels(python: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in MISSING:
        spec = f"{name}=={metadata.version(name)}"
        if name in SOURCE_ONLY:
            cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(folder), spec]
        else:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                   "--python-version", python, "--implementation", "cp", "-d", str(folder), spec]
            cmd += [f"--platform={p}" for p in PLATFORMS] + ["--platform=any"]
        subprocess.run(cmd, check=True)
        print(f"wheel: {spec}", flush=True)


def imdb_subset(source: Path, folder: Path, rows: int, seed: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", rows), ("test", rows // 4)):
        frame = pd.read_parquet(source / f"{split}.parquet")
        part = frame.groupby("label", group_keys=False).sample(n=n // 2, random_state=seed)
        part.sample(frac=1.0, random_state=seed).reset_index(drop=True).to_parquet(folder / f"{split}.parquet",
                                                                                  index=False)
        print(f"imdb {split}: {len(part):,} reviews", flush=True)
    for extra in ("labels.txt",):
        if (source / extra).is_file():
            shutil.copy(source / extra, folder / extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default="3.12", help="the GPU machine's Python (major.minor)")
    ap.add_argument("--imdb", type=Path, default=ROOT.parent / "shared" / "data" / "imdb",
                    help="a folder with IMDB's train.parquet and test.parquet (text, label)")
    ap.add_argument("--rows", type=int, default=4000, help="train reviews (test: a quarter as many)")
    args = ap.parse_args()
    shutil.rmtree(OUT, ignore_errors=True)
    wheels(args.python, OUT / "wheels")
    imdb_subset(args.imdb, OUT / "imdb", args.rows)
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"{OUT}: {total / 2**20:.1f} MiB in all (a device run carries at most 64 MiB, the repository included)")


if __name__ == "__main__":
    main()
