"""How tformer's cost grows with rows and classes, and how processes share a machine.

    python benchmarks/scale.py rows --rows 100000 1000000 4000000           # load, checks, vocabulary, tokenize, ...
    python benchmarks/scale.py classes --classes 10 1000 10000 --rows 10000  # 10,000 rows in each split
    python benchmarks/scale.py together                                      # two demo trainings vs one alone
    python benchmarks/scale.py sweep                                         # a joblib sweep, n_jobs 1 vs 2

Each case generates its data in code (parquet files of texts of 20-80 words from a Zipf vocabulary, each class
with words of its own, so a model can learn it), runs the real `tformer train` in a fresh process and reads what
the run recorded: the wall time and peak memory of each phase (timings.json in the run dir), the longest
silence between two output lines (progress lines every TFORMER_PROGRESS_SECONDS=5 s), the epoch's samples/s
and the size of the largest file in the run dir. Run it on an idle machine, one case at a time; the numbers go to
stdout as a markdown table and, with --json, to a file.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
TFORMER = [sys.executable, "-m", "tformer_cli"]
VOCABULARY = 30_000  # background words, Zipf-distributed
CLASS_WORDS = 8  # words of its own per class, a quarter of each text drawn from them
BATCH = 200_000  # rows generated at a time


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _words(n: int, rng) -> np.ndarray:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lengths = rng.integers(2, 10, n)
    return np.array(["".join(rng.choice(letters, k)) for k in lengths], dtype=object)


def generate(path: Path, rows: int, classes: int, seed: int, min_words: int = 20, max_words: int = 80,
             every_class: bool = True) -> Path:
    """A parquet file of `rows` texts and string labels, written BATCH rows at a time (bounded memory). With
    every_class, the labels cycle through every class before repeating (so 10,000 rows hold 10,000 classes)."""
    rng = np.random.default_rng(seed)
    vocab = pa.array(_words(VOCABULARY, np.random.default_rng(0)))  # the same words in every file
    own = pa.array([f"k{c}w{j}" for c in range(classes) for j in range(CLASS_WORDS)])
    zipf = 1.0 / np.arange(1, VOCABULARY + 1)
    zipf /= zipf.sum()
    names = pa.array([f"class_{c:05d}" for c in range(classes)])
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = None
    for start in range(0, rows, BATCH):
        n = min(BATCH, rows - start)
        labels = (np.arange(start, start + n) % classes) if every_class else rng.integers(0, classes, n)
        if every_class:
            labels = rng.permutation(labels)
        lengths = rng.integers(min_words, max_words + 1, n)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        background = pc.take(vocab, pa.array(rng.choice(VOCABULARY, offsets[-1], p=zipf)))
        mine = rng.random(offsets[-1]) < 0.25  # a quarter of the words: the class's own
        row_of = np.repeat(np.arange(n), lengths)
        signal = pc.take(own, pa.array(labels[row_of] * CLASS_WORDS + rng.integers(0, CLASS_WORDS, offsets[-1])))
        words = pc.if_else(pa.array(mine), signal, background)
        texts = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), words), " ")
        table = pa.table({"text": texts, "label": pc.take(names, pa.array(labels))})
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    writer.close()
    return path


def dataset(folder: Path, rows: int, classes: int, eval_rows: int | None = None) -> dict[str, Path]:
    """train / validation / test files (validation and test: eval_rows each, else rows // 10), made once."""
    eval_rows = eval_rows or max(rows // 10, classes)
    out = {}
    for i, (split, n) in enumerate((("train", rows), ("validation", eval_rows), ("test", eval_rows))):
        path = folder / f"{rows}x{classes}" / f"{split}.parquet"
        if not path.is_file():
            generate(path, n, classes, seed=i + 1)
        out[split] = path
    return out


class Watched:
    """A process whose output lines are timed (the longest silence) and whose peak memory is read at exit."""

    def __init__(self, args: list[str], env: dict, log: Path, stop_after_training_s: float | None = None):
        self.lines, self.gaps = 0, []
        self.stop_after, self.training_since = stop_after_training_s, None
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1)
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log, self.last = log.open("w"), time.monotonic()
        self.peak_anon, self.done = 0.0, threading.Event()  # GB of memory of the process's own (file-backed pages: reclaimable cache, left out)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        threading.Thread(target=self._poll_memory, daemon=True).start()

    def _poll_memory(self) -> None:
        while not self.done.is_set():  # (not proc.poll(): that would reap the process before wait4 reads its usage)
            try:
                for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                    if line.startswith("RssAnon:"):
                        self.peak_anon = max(self.peak_anon, int(line.split()[1]) / 2**20)
            except OSError:
                return
            time.sleep(0.2)

    def _read(self) -> None:
        for line in self.proc.stdout:
            now = time.monotonic()
            self.gaps.append((now - self.last, line.strip()[:100]))
            self.last = now
            self.log.write(f"{now:.2f} {line}")
            self.lines += 1
            if self.stop_after is not None and line.startswith("epoch 1/"):  # a progress line of the first epoch
                self.training_since = self.training_since or now
                if now - self.training_since >= self.stop_after:
                    self.proc.send_signal(signal.SIGINT)  # (saves `last` and stops: enough of the epoch is timed)
                    self.stop_after = None

    def wait(self) -> tuple[int, float]:
        """(exit code, peak resident memory in GB) of the finished process."""
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.done.set()
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.reader.join()
        self.log.close()
        return self.proc.returncode, usage.ru_maxrss / 2**20


def train(files: dict[str, Path], run_dir: Path, overrides: list[str], log: Path,
          stop_after_training_s: float | None = None) -> dict:
    """A `tformer train` run on the files, timed; stop_after_training_s: interrupt it once its first epoch has
    trained that long (the phases before training are what the rows case measures)."""
    env = {**os.environ, "TFORMER_PROGRESS_SECONDS": "5", "PYTHONUNBUFFERED": "1",
           "HF_DATASETS_CACHE": str(run_dir.parent / f"{run_dir.name}.datasets-cache")}  # cold: nothing cached yet
    args = TFORMER + ["train", "data=files", *(f"data.{s}_file={p}" for s, p in files.items()),
                      f"hydra.run.dir={run_dir}", *overrides]
    t0 = time.monotonic()
    watched = Watched(args, env, log, stop_after_training_s)
    code, peak = watched.wait()
    wall = time.monotonic() - t0
    if code not in (0, 130):
        raise SystemExit(f"tformer train failed ({code}); see {log}")
    timings = json.loads((run_dir / "timings.json").read_text())
    biggest = max((p for p in run_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    speeds = [r["samples_per_s"] for r in steps if r.get("kind") == "step"][1:]  # (the first window warms up)
    epochs = [r for r in steps if r.get("kind") == "epoch"]
    silence, after = max(watched.gaps, default=(0.0, ""))
    return {"wall_s": wall, "peak_gb": peak, "peak_anon_gb": watched.peak_anon, "phases": timings, "longest_silence_s": silence, "silent_before": after,
            "epoch_s": epochs[-1]["epoch_seconds"] if epochs else None,
            "samples_per_s": float(np.median(speeds)) if speeds else None, "interrupted": code == 130,
            "largest_file": f"{biggest.relative_to(run_dir)} {biggest.stat().st_size / 2**20:.1f} MB"}


def phase_table(results: list[tuple[str, dict]]) -> str:
    names = list(dict.fromkeys(p["phase"] for _, r in results for p in r["phases"]))
    head = "| case | " + " | ".join(names) + " | whole run | peak (anonymous) | longest silence | largest file |"
    lines = [head, "|" + "---|" * (len(names) + 5)]
    for case, r in results:
        by = {p["phase"]: p for p in r["phases"]}
        cells = [f"{by[n]['seconds']:.1f} s, {by[n]['peak_rss_mb'] / 1024:.2f} GB" if n in by else "-" for n in names]
        lines.append(f"| {case} | " + " | ".join(cells) + f" | {r['wall_s']:.0f} s | {r['peak_gb']:.2f} GB "
                     f"({r['peak_anon_gb']:.2f} GB) | "
                     f"{r['longest_silence_s']:.1f} s | {r['largest_file']} |")
    return "\n".join(lines)


def rows_case(args) -> list[tuple[str, dict]]:
    out = []
    for rows in args.rows:
        files = dataset(args.data, rows, args.num_classes)
        run = args.work / f"rows_{rows}"
        result = train(files, run, ["model=tiny", "trainer.epochs=1", *args.overrides], args.work / f"rows_{rows}.log",
                       stop_after_training_s=args.train_seconds or None)
        out.append((f"{rows:,} rows, {args.num_classes} classes", result))
        print(phase_table(out[-1:]), flush=True)
    print("\nload + vocabulary + tokenize (all splits), per 1,000 train rows:")
    for case, r in out:
        by = {p["phase"]: p["seconds"] for p in r["phases"]}
        rows = int(case.split()[0].replace(",", ""))
        total = sum(by.get(p, 0.0) for p in ("load", "checks", "vocabulary", "tokenize"))
        print(f"  {case}: {1000 * total / rows:.3f} s (load {by.get('load', 0):.1f} s, checks {by.get('checks', 0):.1f} s, "
              f"vocabulary {by.get('vocabulary', 0):.1f} s, tokenize {by.get('tokenize', 0):.1f} s); training "
              f"{r['samples_per_s'] or 0:,.0f} samples/s", flush=True)
    return out


def classes_case(args) -> list[tuple[str, dict]]:
    out = []
    for classes in args.classes:
        files = dataset(args.data, args.rows_per_split, classes, eval_rows=args.rows_per_split)
        run = args.work / f"classes_{classes}"
        result = train(files, run, ["model=tiny", "trainer.epochs=1", *args.overrides],
                       args.work / f"classes_{classes}.log")
        result["budget_s"] = 3 * result["epoch_s"] + 30
        out.append((f"{classes:,} classes, {args.rows_per_split:,} rows a split", result))
        print(phase_table(out[-1:]) + f"\n(whole run {result['wall_s']:.0f} s; 3 x epoch + 30 s = "
              f"{result['budget_s']:.0f} s)", flush=True)
    return out


def demo(run_dir: Path, log: Path, extra=()) -> Watched:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return Watched(TFORMER + ["train", f"hydra.run.dir={run_dir}", *extra], env, log)


def speed(run_dir: Path) -> float:
    """samples/s of a demo run's epochs after the first (the first pays for warm-up)."""
    history = json.loads((run_dir / "history.json").read_text())
    return float(np.mean([h["train_samples_per_s"] for h in history[1:]]))


def together_case(args) -> dict:
    """One demo training alone; two started together; one beside a busy core (a process spinning on one CPU)."""
    work = args.work / "together"
    alone = demo(work / "alone", work / "alone.log")
    alone.wait()
    a, b = demo(work / "a", work / "a.log"), demo(work / "b", work / "b.log")
    a.wait(), b.wait()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = demo(work / "busy", work / "busy.log")
        busy.wait()
    finally:
        spinner.kill()
    one = speed(work / "alone")
    out = {"alone": one, "together": [speed(work / "a"), speed(work / "b")], "beside_busy_core": speed(work / "busy")}
    out["ratios"] = {"together": [v / one for v in out["together"]], "beside_busy_core": out["beside_busy_core"] / one}
    print(f"demo samples/s: alone {one:,.0f}; two together {out['together'][0]:,.0f} and {out['together'][1]:,.0f} "
          f"({out['ratios']['together'][0]:.2f}x, {out['ratios']['together'][1]:.2f}x); beside a busy core "
          f"{out['beside_busy_core']:,.0f} ({out['ratios']['beside_busy_core']:.2f}x)", flush=True)
    return out


def sweep_case(args) -> dict:
    """The same 4-job demo sweep with the joblib launcher, n_jobs=1 then n_jobs=2: wall time of each."""
    out = {}
    for jobs in (1, 2):
        sweep_dir = args.work / f"sweep_{jobs}"
        command = TFORMER + ["train", "-m", "hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}",
                             "optimizer.lr=1e-3,2e-3", "seed=1,2", "trainer.epochs=3", f"hydra.sweep.dir={sweep_dir}"]
        t0 = time.monotonic()
        subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
        out[f"n_jobs={jobs}"] = time.monotonic() - t0
    print(f"4-job sweep: n_jobs=1 {out['n_jobs=1']:.0f} s, n_jobs=2 {out['n_jobs=2']:.0f} s "
          f"({out['n_jobs=1'] / out['n_jobs=2']:.2f}x faster)", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case", choices=("rows", "classes", "together", "sweep"))
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000, 4_000_000])
    parser.add_argument("--num-classes", type=int, default=10, help="classes of the rows case")
    parser.add_argument("--classes", type=int, nargs="+", default=[10, 1_000, 10_000])
    parser.add_argument("--rows-per-split", type=int, default=10_000, help="rows of each split in the classes case")
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "tformer-scale-data")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "tformer-scale-runs")
    parser.add_argument("--train-seconds", type=float, default=60.0,
                        help="rows case: stop each run after its epoch has trained this long (0: the whole epoch)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("overrides", nargs="*", help="extra tformer overrides (e.g. model=small)")
    args = parser.parse_args()
    args.work = args.work / time.strftime("%Y-%m-%d_%H-%M-%S")  # fresh run dirs for every invocation
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {cpu_name()}, {os.cpu_count()} CPUs; python {platform.python_version()}", flush=True)
    cases = {"rows": rows_case, "classes": classes_case, "together": together_case, "sweep": sweep_case}
    result = cases[args.case](args)
    if isinstance(result, list):
        print(phase_table(result))
    if args.json:
        args.json.write_text(json.dumps({"machine": cpu_name(), "case": args.case, "result": result}, indent=2))


if __name__ == "__main__":
    main()
