"""Where a GPU training step's time goes: tformer's train_step on the BERT-base shape, bf16, profiled.

    python benchmarks/gpu_profile.py [--device cuda] [--data .gpu/imdb] [--out $OUT] [--quick]

Prints, for the BERT-base shape at 512 tokens (full batches of 32; --quick: tiny shapes on any device):
- samples/s of variants of one step, each 30 timed steps after 10 (one run each): as it runs; without dropout;
  without gradient clipping; a batch of 64; the step's parts alone (forward, forward + backward);
- the host's time per step against the device's (a step the host cannot issue fast enough is launch-bound);
- the 25 kernels that take the most device time in 5 profiled steps (torch.profiler), written also to
  profile.txt under --out.
Made to go with benchmarks/gpu_check.py (its folders step makes the model folder), to decide what a faster
step needs before changing one.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402
from tformer_cli.hardware import Precision  # noqa: E402
from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier  # noqa: E402
from tformer_cli.model.pretrained import load_encoder, load_into  # noqa: E402
from tformer_cli.training.config import OptimizerConfig, ScheduleConfig  # noqa: E402
from tformer_cli.training.loop import Layout, Optimization, train_step  # noqa: E402


def build(enc, dev, precision, dropout=0.1, grad_clip=1.0):
    cfg = EncoderConfig(**enc.shape, num_classes=2, dropout=dropout, attention_dropout=dropout, pooling="mean")
    model = TransformerClassifier(cfg)
    load_into(model, enc)
    model.to(dev).train()
    opt = Optimization(model, optimizer=OptimizerConfig("adamw", 5e-5, 0.01, {"betas": [0.9, 0.999], "eps": 1e-8}),
                       schedule=ScheduleConfig("constant", 0, 0.0, 0.0), total_steps=10_000, device=dev,
                       precision=precision, grad_clip=grad_clip, compile=False)
    return opt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--data", type=Path, default=ROOT / ".gpu" / "imdb")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--length", type=int, default=512)
    args = ap.parse_args()
    out = (args.out or Path(tempfile.mkdtemp(prefix="gpu_profile-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(args.device)
    precision = Precision("bf16", dev.type)
    work = Path(tempfile.mkdtemp(prefix="gpu_profile-work-"))
    made = gpu_check.folders(work, args.data.resolve(), args.quick)
    length = 32 if args.quick else args.length
    steps, warm = (3, 1) if args.quick else (30, 10)
    for shape in ("bert_base", "minilm"):
        enc = load_encoder(made[shape], None, length)
        data = gpu_check.random_batches(enc.shape["vocab_size"], length, "full", steps + warm,
                                         4 if args.quick else 32, dev.type)
        print(f"== {shape}, {length} tokens, batch {len(data[0]['labels'])}, bf16", flush=True)
        opt = build(enc, dev, precision)
        base, host = gpu_check.timed(lambda b: train_step(opt, b), data, warm, dev.type)
        print(f"step as it runs: {base:.1f} samples/s; host {host * 1e3:.1f} ms/step issued, "
              f"{len(data[0]['labels']) / base * 1e3:.1f} ms/step in all", flush=True)

        def forward_only(b, opt=opt):
            with torch.no_grad(), precision.autocast():
                return opt.forward(b["input_ids"].to(dev), b["attention_mask"].to(dev),
                                   layout=Layout.of(b["attention_mask"], dev, False))

        def forward_backward(b, opt=opt):
            with precision.autocast():
                logits = opt.forward(b["input_ids"].to(dev), b["attention_mask"].to(dev),
                                     layout=Layout.of(b["attention_mask"], dev, False))
            opt.loss(logits, b["labels"].to(dev)).backward()

        for name, fn in (("forward only (no grad)", forward_only), ("forward + backward", forward_backward)):
            r, h = gpu_check.timed(fn, data, warm, dev.type)
            print(f"{name}: {r:.1f} samples/s ({r / base:.2f}x the step); host {h * 1e3:.1f} ms", flush=True)
        if shape == "bert_base":
            activities = [torch.profiler.ProfilerActivity.CPU] + (
                [torch.profiler.ProfilerActivity.CUDA] if dev.type == "cuda" else [])
            with torch.profiler.profile(activities=activities) as prof:
                for b in data[:5]:
                    train_step(opt, b)
                gpu_check.sync(dev.type)
            key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
            table = prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=70)
            (out / "profile.txt").write_text(table)
            print(table, flush=True)
        del opt
        for name, kw in (("no dropout", {"dropout": 0.0}), ("no gradient clipping", {"grad_clip": 0.0})):
            opt = build(enc, dev, precision, **kw)
            r, h = gpu_check.timed(lambda b: train_step(opt, b), data, warm, dev.type)
            print(f"{name}: {r:.1f} samples/s ({r / base:.2f}x); host {h * 1e3:.1f} ms", flush=True)
            del opt
        opt = build(enc, dev, precision)
        big = gpu_check.random_batches(enc.shape["vocab_size"], length, "full", steps + warm,
                                       8 if args.quick else 64, dev.type)
        r, h = gpu_check.timed(lambda b: train_step(opt, b), big, warm, dev.type)
        print(f"batch {len(big[0]['labels'])}: {r:.1f} samples/s ({r / base:.2f}x); host {h * 1e3:.1f} ms", flush=True)
        del opt, big
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
