"""Throughput benchmark of tformer's training and inference path, side by side with the notebook's seed.

    python benchmarks/throughput.py [--steps 12] [--model small] [--data-dir ../shared/data/imdb]

Prints, for the model at max_len 256 and batch 64 on the current device:
  - synthetic full-length batches: training samples/s and tokens/s, evaluation samples/s;
  - the real IMDB train/test splits through the real data pipeline (tokenizer, Arrow cache, length-grouped
    dynamic padding): the same figures;
  - training is the product's own `train_step` (forward, loss, backward, gradient clipping, optimizer with its
    parameter groups, LR schedule), built from the same composed config `tformer train model=<model>` uses;
  - achieved GFLOP/s from an analytic FLOP count, and its share of a measured matmul peak at the same precision;
  - peak memory, and the cold start of `tformer predict "text"` against `python -c "import torch"`;
  - the seed reference (../shared/bench/seed_reference.py), run in the same invocation, and the ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tformer_cli.data.batching import BatchLoader  # noqa: E402
from tformer_cli.hardware import pick_device, pick_precision  # noqa: E402
from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier  # noqa: E402
from tformer_cli.training.loop import Optimization, train_step  # noqa: E402


def train_config(*overrides):
    from tformer_cli.runs.config import TrainConfig

    return TrainConfig.compose(overrides)


def flops_per_sequence(cfg: EncoderConfig, T: float, T2: float, train: bool) -> float:
    """Matmul FLOPs (2 per multiply-add) of one sequence of T tokens (T2 = mean of T^2 over the batch)."""
    D, F_, E = cfg.d_model, cfg.d_ff, cfg.embedding_dim or cfg.d_model
    per_layer = 2 * T * D * 3 * D + 2 * T * D * D + 2 * 2 * T * D * F_ + 2 * 2 * T2 * D  # qkv, out, FF, QK^T and AV
    fwd = cfg.n_layers * per_layer + (2 * T * E * D if E != D else 0) + 2 * D * cfg.num_classes
    return 3 * fwd if train else fwd  # backward is about twice the forward


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int = 2048, reps: int = 10) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e9


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(model, batches, device, precision, optimization=None):
    """Run the batches (the product's train_step each when an Optimization is given, else a forward pass) and
    return (seconds after 2 warm-up batches, samples, real tokens, FLOPs) of the timed ones. Counts are taken from
    the host-side batches, so the timed loop never waits on the device."""
    model.train(optimization is not None)
    samples = tokens = flops = 0.0
    t0 = None
    for i, batch in enumerate(batches):
        if i == 2:
            sync(device)
            t0 = time.perf_counter()
        if optimization is not None:
            train_step(optimization, batch)
        else:
            ids = batch["input_ids"].to(device, non_blocking=True)
            mask = batch["attention_mask"].to(device, non_blocking=True)
            with torch.inference_mode(), precision.autocast():
                model(ids, mask).argmax(-1)
        if i >= 2:
            B, T = batch["input_ids"].shape
            samples += B
            tokens += float(batch["attention_mask"].sum())
            flops += B * flops_per_sequence(model.cfg, T, T * T, train=optimization is not None)
    sync(device)
    return time.perf_counter() - t0, samples, tokens, flops


def synthetic_batches(n, batch, T, vocab):
    for _ in range(n):
        ids = torch.randint(1000, vocab, (batch, T))
        yield {"input_ids": ids, "attention_mask": torch.ones_like(ids, dtype=torch.bool),
               "labels": torch.randint(0, 2, (batch,))}


def real_splits(data_dir: Path, max_len: int):
    from tformer_cli.data import sources, tokenization
    from tformer_cli.model import pretrained

    cfg = train_config("data=imdb", f"data.dir={data_dir}", "embedding_init=minilm")
    data = sources.load(cfg.data, seed=42)
    pre = pretrained.load(cfg.embedding_init, 256)
    tok = tokenization.load_tokenizer(pre.tokenizer_file, max_len)
    out = {s: tokenization.TokenizedSplit.from_dataset(tokenization.tokenize_split(data.splits[s], tok, max_len, s))
           for s in ("train", "test")}
    return out, tokenization.pad_id(tok), pre.weight


def cold_start(cmd: list[str], reps: int = 3, cwd=None) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True, cwd=cwd)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small", choices=["tiny", "small", "base"])
    ap.add_argument("--steps", type=int, default=12, help="timed steps per measurement (plus 2 warm-up)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "imdb"))
    ap.add_argument("--seed-reference", default=str(ROOT.parent / "shared" / "bench" / "seed_reference.py"))
    ap.add_argument("--no-seed", action="store_true", help="skip the seed reference")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args()

    config = train_config(f"model={args.model}")
    mcfg = dict(config.model, max_len=max(args.max_len, config.model["max_len"]))
    device = pick_device("auto")
    precision = pick_precision(args.precision, device)
    torch.manual_seed(0)
    results: dict = {"device": str(device), "precision": precision.name, "model": args.model, "batch": args.batch,
                     "max_len": args.max_len, "threads": torch.get_num_threads()}
    print(f"tformer benchmark: model={args.model} max_len={args.max_len} batch={args.batch} device={device} "
          f"precision={precision.name} threads={torch.get_num_threads()}", flush=True)

    have_data = (Path(args.data_dir) / "train.parquet").is_file()
    splits, pad, weight = real_splits(Path(args.data_dir), args.max_len) if have_data else (None, 0, None)
    emb_dim = weight.shape[1] if weight is not None else 0
    cfg = EncoderConfig.from_dict({**mcfg, "vocab_size": 30522, "num_classes": 2, "embedding_dim": emb_dim})
    model = TransformerClassifier(cfg).to(device)
    n = args.steps + 2
    optimization = Optimization(model, optimizer=config.optimizer, schedule=config.schedule, total_steps=100 * n,
                                device=device, precision=precision, grad_clip=config.trainer.grad_clip)

    def report(mode, train, evaluation):
        t_s, samples, tokens, flops = train
        e_s, e_samples, _, e_flops = evaluation
        r = {"train_samples_per_s": samples / t_s, "train_tokens_per_s": tokens / t_s,
             "train_gflops": flops / t_s / 1e9, "eval_samples_per_s": e_samples / e_s, "eval_gflops": e_flops / e_s / 1e9}
        results[mode] = r
        print(f"  {mode:<9} train {r['train_samples_per_s']:8.1f} samples/s {r['train_tokens_per_s']:9.0f} tokens/s "
              f"{r['train_gflops']:7.1f} GFLOP/s | eval {r['eval_samples_per_s']:8.1f} samples/s "
              f"{r['eval_gflops']:7.1f} GFLOP/s", flush=True)

    report("synthetic", timed(model, synthetic_batches(n, args.batch, args.max_len, 30522), device, precision,
                              optimization),
           timed(model, synthetic_batches(n, args.batch, args.max_len, 30522), device, precision))
    if splits is not None:
        train_batches = BatchLoader(splits["train"], args.batch, pad, shuffle=True, seed=0)
        test_batches = BatchLoader(splits["test"], args.batch, pad, shuffle=True, seed=1)  # random lengths mix
        it_train, it_test = iter(train_batches), iter(test_batches)
        report("imdb", timed(model, (next(it_train) for _ in range(n)), device, precision, optimization),
               timed(model, (next(it_test) for _ in range(n)), device, precision))
        lengths = splits["train"].lengths.float()
        results["imdb_mean_tokens"] = float(lengths.mean())
        print(f"  imdb train: mean {lengths.mean():.0f} tokens after truncation to {args.max_len}, "
              f"{(lengths >= args.max_len).float().mean():.0%} truncated", flush=True)

    dtype = precision.dtype or torch.float32
    peak = matmul_peak(device, dtype)
    results["matmul_peak_gflops"] = peak
    for mode in ("synthetic", "imdb"):
        if mode in results:
            results[mode]["train_share_of_peak"] = results[mode]["train_gflops"] / peak
            results[mode]["eval_share_of_peak"] = results[mode]["eval_gflops"] / peak
    print(f"  matmul peak ({dtype}, 2048^3): {peak:.1f} GFLOP/s; training reaches "
          + ", ".join(f"{m} {results[m]['train_share_of_peak']:.0%}" for m in ("synthetic", "imdb") if m in results)
          + " of it", flush=True)
    if device.type == "cuda":
        results["peak_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20
        print(f"  peak GPU memory: {results['peak_memory_mb']:.0f} MiB")
    results["peak_rss_mb"] = peak_rss_mb()
    print(f"  peak resident memory of this process: {results['peak_rss_mb']:.0f} MiB", flush=True)

    # Cold start: a fresh `tformer predict` against a fresh `import torch`, with a tiny checkpoint trained here.
    tformer = str(Path(sys.executable).parent / "tformer")
    ckpt_root = Path(os.environ.get("TMPDIR", "/tmp")) / "tformer-bench"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    if not list(ckpt_root.glob("outputs/**/checkpoints/best/model.safetensors")):
        subprocess.run([tformer, "train", "data.n_train=400", "data.n_validation=100", "data.n_test=100",
                        "trainer.epochs=1", "trainer.test_after_fit=false"], cwd=ckpt_root, capture_output=True,
                       check=True)
    t_import = cold_start([sys.executable, "-c", "import torch"])
    t_predict = cold_start([tformer, "predict", "a gripping, beautifully shot film"], cwd=ckpt_root)
    results.update({"import_torch_s": t_import, "predict_cold_start_s": t_predict})
    print(f"  cold start: tformer predict {t_predict:.2f}s, python -c 'import torch' {t_import:.2f}s "
          f"(ratio {t_predict / t_import:.2f})", flush=True)

    if not args.no_seed and Path(args.seed_reference).is_file():
        out = subprocess.run([sys.executable, args.seed_reference, "--which", "seed", "--steps", str(args.steps),
                              "--batch", str(args.batch), "--max-len", str(args.max_len)],
                             capture_output=True, text=True, check=True).stdout
        seed_train = float(re.search(r"seed-reference train: ([\d.]+)", out).group(1))
        seed_eval = float(re.search(r"seed-reference eval: ([\d.]+)", out).group(1))
        results["seed"] = {"train_samples_per_s": seed_train, "eval_samples_per_s": seed_eval}
        print(f"  seed reference: train {seed_train:.1f} samples/s, eval {seed_eval:.1f} samples/s")
        for mode in ("synthetic", "imdb"):
            if mode in results:
                r = results[mode]
                r["train_ratio"] = r["train_samples_per_s"] / seed_train
                r["eval_ratio"] = r["eval_samples_per_s"] / seed_eval
                print(f"  ratio vs seed ({mode}): train {r['train_ratio']:.2f}x, eval {r['eval_ratio']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
