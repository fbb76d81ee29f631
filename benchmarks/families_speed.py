"""Fine-tuning speed per model family: tformer's encoder (loaded from the family's Hugging Face folder, run by its
own `train_step` as `tformer train` runs it) against the family's own `transformers` class
(`AutoModelForSequenceClassification`), on identical batches, in the same process, at the same precision.

    python benchmarks/families_speed.py [--families bert,roberta,...] [--steps 10] [--batch 16] [--max-len 128]
                                        [--hidden 256] [--layers 4] [--precision auto|bf16|fp32]

Both sides start from the same random-initialised weights of one small config per family (written with
`save_pretrained`, so no download is needed; speed depends on the shapes, not on the trained values): hidden
--hidden, --layers layers, 4x feed-forward, 8,000-token vocabulary; dropout 0.1 on hidden states and attention
probabilities (where the family has them); AdamW with clipping at 1.0. Texts are random token ids whose lengths
are spread like short reviews (a quarter to all of --max-len), batches dynamically padded: the padding the
unpadded path (`RealTokens`) saves is real. Rounds alternate between the sides after a warm-up; medians are
reported, and the ratio tformer / transformers (above 1: tformer is faster).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tformer_cli.hardware import keep_freed_host_memory, own_host_allocator, pick_device, pick_precision  # noqa: E402
from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier  # noqa: E402
from tformer_cli.model.pretrained import load_encoder, load_into  # noqa: E402
from tformer_cli.training.loop import Optimization, train_step  # noqa: E402

VOCAB = 8000


def configs(hidden: int, layers: int, max_len: int) -> dict:
    """One small config per family (transformers config class name, its keyword arguments)."""
    heads, ff = max(hidden // 64, 1), 4 * hidden
    bert = dict(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=ff, max_position_embeddings=max_len + 2, hidden_dropout_prob=0.1,
                attention_probs_dropout_prob=0.1)
    return {
        "bert": ("BertConfig", bert),
        "roberta": ("RobertaConfig", {**bert, "pad_token_id": 1, "type_vocab_size": 1}),
        "xlm-roberta": ("XLMRobertaConfig", {**bert, "pad_token_id": 1, "type_vocab_size": 1}),
        "distilbert": ("DistilBertConfig", dict(vocab_size=VOCAB, dim=hidden, n_layers=layers, n_heads=heads,
                                                hidden_dim=ff, max_position_embeddings=max_len, dropout=0.1,
                                                attention_dropout=0.1)),
        "electra": ("ElectraConfig", {**bert, "embedding_size": hidden // 2}),
        "modernbert": ("ModernBertConfig", dict(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers,
                                                num_attention_heads=heads, intermediate_size=ff,
                                                max_position_embeddings=max(max_len, 512), local_attention=64,
                                                global_attn_every_n_layers=3, embedding_dropout=0.1,
                                                attention_dropout=0.1, mlp_dropout=0.1, pad_token_id=0,
                                                bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3)),
        "deberta-v2": ("DebertaV2Config", {**bert, "relative_attention": True, "position_biased_input": False,
                                           "pos_att_type": ["p2c", "c2p"], "position_buckets": 64,
                                           "max_relative_positions": -1, "norm_rel_ebd": "layer_norm",
                                           "share_att_key": True, "type_vocab_size": 0}),
    }


def write_folder(family: str, spec, folder: Path) -> None:
    """The family's random-initialised model and a word-level tokenizer.json (its tokens are never used)."""
    import transformers
    from tokenizers import Tokenizer, models

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    name, kwargs = spec
    config = getattr(transformers, name)(**kwargs)
    torch.manual_seed(0)
    transformers.AutoModel.from_config(config).save_pretrained(folder, safe_serialization=True)
    Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0")).save(str(folder / "tokenizer.json"))


def batches(n: int, batch: int, max_len: int, pad: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        lengths = torch.randint(max_len // 4, max_len + 1, (batch,), generator=g)
        lengths[0] = max_len
        ids = torch.randint(5, VOCAB, (batch, max_len), generator=g)
        mask = torch.arange(max_len)[None, :] < lengths[:, None]
        out.append({"input_ids": ids.masked_fill(~mask, pad), "attention_mask": mask,
                    "labels": torch.randint(0, 2, (batch,), generator=g)})
    return out


def build_ours(folder: Path, max_len: int, device, precision, steps: int):
    from tformer_cli.training.config import OptimizerConfig, ScheduleConfig

    enc = load_encoder(str(folder), None, max_len)
    model = TransformerClassifier(EncoderConfig(**enc.shape, num_classes=2, dropout=0.1, attention_dropout=0.1,
                                                pooling="cls"))
    load_into(model, enc)
    model.to(device).train()
    opt = Optimization(model, optimizer=OptimizerConfig("adamw", 5e-5, 0.01, {"betas": [0.9, 0.999], "eps": 1e-8,
                                                                       "embedding_update": "rows"}),
                       schedule=ScheduleConfig("constant", 0, 0.0, 0.0), total_steps=steps, device=device,
                       precision=precision, grad_clip=1.0, layer_lr_decay=1.0)
    return (lambda b: train_step(opt, b)), enc.family, model.cfg.pad_id


def build_peer(folder: Path, device, precision):
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "some weights were newly initialized": the classifier head, as ours
    model = AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=2, local_files_only=True)
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01,
                                  **({"fused": True} if device.type in ("cpu", "cuda") else {}))

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
    ap.add_argument("--families", default="bert,roberta,xlm-roberta,distilbert,electra,modernbert,deberta-v2")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"), help="as trainer.precision")
    args = ap.parse_args()
    device = pick_device("auto")
    own_host_allocator()  # as the CLI does
    allocator = keep_freed_host_memory(device)
    precision = pick_precision(args.precision, device)
    specs = configs(args.hidden, args.layers, args.max_len)
    print(f"fine-tuning step per family: batch {args.batch}, lengths {args.max_len // 4}..{args.max_len}, hidden "
          f"{args.hidden}, {args.layers} layers, device {device}, precision {precision.name}, threads "
          f"{torch.get_num_threads()}, host allocator {allocator}")
    print(f"  {'family':<12} {'tformer':>10} {'transformers':>13} {'ratio':>7}   (samples/s, median of {args.rounds})")
    for family in args.families.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            write_folder(family, specs[family], folder)
            ours, name, pad = build_ours(folder, args.max_len, device, precision, args.steps * (args.rounds + 1))
            peer = build_peer(folder, device, precision)
            data = batches(args.steps + 2, args.batch, args.max_len, pad)
            warm, timed_batches = data[:2], data[2:]
            for step in (ours, peer):
                timed(step, warm, device)
            results = {"ours": [], "peer": []}
            for _ in range(args.rounds):
                results["ours"].append(timed(ours, timed_batches, device))
                results["peer"].append(timed(peer, timed_batches, device))
            a, b = statistics.median(results["ours"]), statistics.median(results["peer"])
            print(f"  {name:<12} {a:10.1f} {b:13.1f} {a / b:6.2f}x", flush=True)


if __name__ == "__main__":
    main()
