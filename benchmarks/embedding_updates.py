"""Does unfreezing a pretrained token table slow short-text training? `model=small` with the MiniLM table
(30,522 x 384), on short sentences, three ways in one run: the table frozen, unfrozen with dense AdamW updates
(every row every step), unfrozen with row updates (`optimizer.embedding_update=rows`, the default).

    python benchmarks/embedding_updates.py [--steps 30] [--rounds 9] [--batch 32] [--model small]
                                           [--data-dir ../shared/data/imdb]

Sentences: IMDB review sentences of 4 to 40 words (a real vocabulary spread) when --data-dir has IMDB, else demo
sentences. Each mode times the product's own `train_step` on the same batches, rounds alternating after a
warm-up; the median and the best round are reported (this machine's speed drifts between rounds, so compare modes
within one run). `--model minilm_l6` runs the whole pretrained encoder instead.
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tformer_cli.hardware import pick_device, pick_precision  # noqa: E402
from tformer_cli.training import optim as optim_lib  # noqa: E402
from tformer_cli.training.loop import Optimization, train_step  # noqa: E402


def sentences(data_dir: Path, n: int) -> list[str]:
    if (data_dir / "train.parquet").is_file():
        import pyarrow.parquet as pq

        out = []
        for review in pq.read_table(data_dir / "train.parquet", columns=["text"]).column("text").to_pylist():
            for s in re.split(r"(?<=[.!?])\s+", review.replace("<br />", " ")):
                if 4 <= len(s.split()) <= 40:
                    out.append(s)
            if len(out) >= n:
                return out[:n]
        return out
    from tformer_cli.data import demo

    return list(demo.splits(n_train=n, n_validation=1, n_test=1)["train"][0])


def build(model_name: str):
    """The model `tformer train model=<name> [embedding_init=minilm]` builds (fresh head), its config and the
    tokenizer file."""
    from tformer_cli.runs.config import TrainConfig
    from tformer_cli.model import pretrained
    from tformer_cli.model.encoder import TransformerClassifier

    whole = model_name == "minilm_l6"
    config = TrainConfig.compose([f"model={model_name}"] + ([] if whole else ["embedding_init=minilm"]))
    max_len = int(config.model["max_len"])
    if whole:
        options = config.model_options
        enc = pretrained.load_encoder(options.pretrained, options.pretrained_package, max_len)
        model = TransformerClassifier(config.encoder_config(**enc.shape, num_classes=2))
        pretrained.load_into(model, enc)
        return config, model, enc.tokenizer_file
    pre = pretrained.load(config.embedding_init, int(config.model["d_model"]))
    model = TransformerClassifier(config.encoder_config(vocab_size=pre.weight.shape[0], num_classes=2,
                                                        embedding_dim=pre.weight.shape[1], pad_id=0))
    with torch.no_grad():
        model.token_embedding.weight.copy_(pre.weight)
    return config, model, pre.tokenizer_file


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small", choices=["tiny", "small", "base", "minilm_l6"])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "imdb"))
    args = ap.parse_args()

    device = pick_device("auto")
    precision = pick_precision("auto", device)
    torch.manual_seed(0)
    texts = sentences(Path(args.data_dir), args.batch * args.steps)
    from tformer_cli.data.tokenization import load_tokenizer

    modes = {}
    for mode in ("frozen", "dense", "rows"):
        torch.manual_seed(0)
        config, model, tok_file = build(args.model)
        model.to(device)
        opt_cfg = config.optimizer
        opt_cfg.options["embedding_update"] = "dense" if mode == "dense" else "rows"
        opt = Optimization(model, optimizer=opt_cfg, schedule=config.schedule, total_steps=10 ** 6, device=device,
                           precision=precision, grad_clip=config.trainer.grad_clip,
                           embedding_lr_multiplier=config.embedding_init.lr_multiplier,
                           layer_lr_decay=config.model_options.layer_lr_decay)
        optim_lib.set_embedding_frozen(model, mode == "frozen")
        model.train()
        modes[mode] = opt
    tok = load_tokenizer(tok_file, args.max_len)
    batches = []
    encoded = [e.ids[:args.max_len] for e in tok.encode_batch(texts)]
    for i in range(0, len(encoded) - args.batch + 1, args.batch):
        ids = encoded[i:i + args.batch]
        T = -(-max(map(len, ids)) // 16) * 16  # lengths rounded up to 16, as the product's batches
        input_ids = torch.tensor([x + [0] * (T - len(x)) for x in ids])
        batches.append({"input_ids": input_ids, "attention_mask": input_ids.ne(0),
                        "labels": torch.randint(0, 2, (len(ids),))})
    rows_per_batch = statistics.mean(len(b["input_ids"][b["attention_mask"]].unique()) for b in batches)
    table = modes["rows"].model.token_embedding.weight
    print(f"embedding updates: model={args.model} table {tuple(table.shape)} batch={args.batch} "
          f"device={device} precision={precision.name} threads={torch.get_num_threads()}")
    print(f"  {len(texts)} sentences, {statistics.mean(len(x) for x in encoded):.1f} tokens on average, "
          f"{rows_per_batch:.0f} distinct table rows per batch ({rows_per_batch / table.shape[0]:.1%} of the table)")

    def round_(opt) -> float:
        t0 = time.perf_counter()
        for b in batches:
            loss = train_step(opt, b)
        float(loss)
        return len(batches) * args.batch / (time.perf_counter() - t0)

    for opt in modes.values():  # warm-up: kernels, allocator, Adam state
        for b in batches[:5]:
            train_step(opt, b)
    speeds = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m, opt in modes.items():
            speeds[m].append(round_(opt))
    med = {m: statistics.median(v) for m, v in speeds.items()}
    best = {m: max(v) for m, v in speeds.items()}  # the round least disturbed by other work on the machine
    for m in modes:
        print(f"  {m:<6} median {med[m]:6.1f} samples/s, best round {best[m]:6.1f}"
              + ("" if m == "frozen" else f"  ({med[m] / med['frozen']:.2f}x / {best[m] / best['frozen']:.2f}x frozen)")
              + f"   rounds: {', '.join(f'{x:.0f}' for x in speeds[m])}")


if __name__ == "__main__":
    main()
