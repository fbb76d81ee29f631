"""Cold start of `tformer predict "one text"` against `python -c "import torch"`, as a ratio.

A new process each time, the two commands interleaved (a load that comes and goes hits both alike), median of
--repeat. torch's import is the floor of any torch-based predict; the ratio says what tformer adds on top: its
own imports (config machinery, tables), reading the checkpoint and tokenizer, and the first forward pass. Run it
on an otherwise idle machine: the load average is printed with the figures, since on a busy machine both times
stretch, and not by the same factor.

    python benchmarks/cold_start.py                    # trains a tiny checkpoint once (under $TMPDIR)
    python benchmarks/cold_start.py --checkpoint RUN   # any run dir or checkpoint dir
    python benchmarks/cold_start.py --breakdown        # also: where predict's import time goes, by package
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

BIN = Path(sys.executable).parent
TEXT = "a gripping, beautifully shot film"


def tiny_checkpoint() -> Path:
    root = Path(os.environ.get("TMPDIR", "/tmp")) / "tformer-bench"
    root.mkdir(parents=True, exist_ok=True)
    found = sorted(root.glob("outputs/**/checkpoints/best/model.safetensors"))
    if not found:
        subprocess.run([str(BIN / "tformer"), "train", "data.n_train=400", "data.n_validation=100",
                        "data.n_test=100", "trainer.epochs=1", "trainer.test_after_fit=false"], cwd=root,
                       capture_output=True, check=True)
        found = sorted(root.glob("outputs/**/checkpoints/best/model.safetensors"))
    return found[-1].parent


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True)
    return time.perf_counter() - t0


def breakdown(predict: list[str]) -> None:
    """predict's import time by top-level package (python -X importtime), the largest first."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-m", "tformer_cli", *predict[1:]],
                         capture_output=True, text=True, check=True).stderr
    by_package: dict[str, int] = defaultdict(int)
    for line in err.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+\d+ \|( *)(\S+)", line)
        if m:  # self time, so that nested imports are not counted twice
            by_package[m.group(3).split(".")[0]] += int(m.group(1))
    total = sum(by_package.values())
    print(f"  imports of predict: {total / 1e6:.2f}s in all, by package:")
    for name, us in sorted(by_package.items(), key=lambda kv: -kv[1])[:12]:
        print(f"    {name:<24}{us / 1e6:7.3f}s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="a run dir or checkpoint dir (default: a tiny one trained here)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--breakdown", action="store_true", help="also list predict's import time by package")
    args = ap.parse_args()
    ckpt = Path(args.checkpoint) if args.checkpoint else tiny_checkpoint()
    torch_cmd = [sys.executable, "-c", "import torch"]
    predict = [str(BIN / "tformer"), "predict", "--checkpoint", str(ckpt), TEXT]
    wall(torch_cmd), wall(predict)  # warm the page cache: a cold disk is not what this measures
    t_torch, t_predict = [], []
    for _ in range(args.repeat):
        t_torch.append(wall(torch_cmd))
        t_predict.append(wall(predict))
    a, b = statistics.median(t_torch), statistics.median(t_predict)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"cold start (median of {args.repeat}, {os.cpu_count()} cores, load average {load}):")
    print(f"  python -c 'import torch'   {a:.2f}s")
    print(f"  tformer predict 'one text' {b:.2f}s")
    print(f"  ratio {b / a:.2f}")
    if args.breakdown:
        breakdown(predict)


if __name__ == "__main__":
    main()
