"""The GPU check: one command that trains, serves and measures tformer on a CUDA machine, every step timed and
reported as one line even when an earlier step failed.

    python benchmarks/gpu_check.py [--device cuda] [--data .gpu/imdb] [--out $OUT] [--quick]

On a machine without network (docs/results-and-benchmarks.md, "GPU", has the exact command): `python
benchmarks/gpu_prepare.py` here first gathers the missing wheels and an IMDB subset into .gpu/. `--device cpu
--quick` is the dry run a slow test makes, so that the script cannot rot before a GPU appears.

Steps, in order (each line: `ok` or `FAIL`, the step, its seconds, what it found):
 1. environment: torch, CUDA, the GPU, and the bf16 matrix-product peak (8192^3, the mean of 10 after warm-up);
 2. the demo (`tformer train`, its defaults);
 3. two encoders with random weights written as Hugging Face folders by `transformers` (no download): a
    MiniLM-L6 shape (6 x 384, 12 heads) and a BERT-base shape (12 x 768), with a WordPiece vocabulary learned
    from the IMDB texts; each trained with `tformer train model=pretrained` on IMDB, bf16;
 4. on the MiniLM-shaped run: evaluate, predict, export (ONNX, its parity line), serve (one request on
    127.0.0.1);
 5. Ctrl-C and resume: a run interrupted after its first checkpoint and resumed ends with the same weights as the
    same run uninterrupted (the largest difference is printed);
 6. throughput of tformer's own `train_step` for both shapes at 128 and 512 tokens, eager and compiled:
    samples/s, tokens/s and MFU (PaLM's count: 6N + 12 L H Q T FLOPs per token, forward and backward, attention
    included; N without the embeddings), against the GPU's dense bf16 peak (989 TFLOP/s on an H100/H200) and
    against the measured matrix-product peak;
 7. the same batches through `transformers`' AutoModelForSequenceClassification (the ratio: tformer / peer);
 8. the torchrun path (`torch.distributed.run`, one process, NCCL on CUDA) and fp16 with its gradient scaler.

Everything the steps write goes under --out (default: $OUT when set, else a temporary folder); the last line is
a summary, and summary.json holds every step's result.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS: list[dict] = []
DEADLINE = [float("inf")]  # time.monotonic() by which the script must end (--budget)
DENSE_BF16_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12}  # TFLOP/s, dense, no sparsity
SHAPES = {"minilm": dict(n_layers=6, d_model=384, n_heads=12, d_ff=1536),
          "bert_base": dict(n_layers=12, d_model=768, n_heads=12, d_ff=3072)}
QUICK_SHAPES = {"minilm": dict(n_layers=2, d_model=64, n_heads=4, d_ff=128),
                "bert_base": dict(n_layers=2, d_model=96, n_heads=4, d_ff=192)}


def say(line: str) -> None:
    print(line, flush=True)


def left() -> float:
    return DEADLINE[0] - time.monotonic()


def step(name: str, fn, *args, **kwargs):
    """Run one step; print one line whatever happens; return its result (None when it failed or was skipped)."""
    if left() < 20:
        say(f"skip {name}: the --budget is spent")
        RESULTS.append({"step": name, "ok": True, "skipped": True, "seconds": 0})
        return None
    start = time.perf_counter()
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:  # every step reports, and the next one runs
        seconds = time.perf_counter() - start
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
        say(f"FAIL {name} ({seconds:.1f} s): {type(exc).__name__}: {first}")
        RESULTS.append({"step": name, "ok": False, "seconds": round(seconds, 1), "error": first,
                        "traceback": traceback.format_exc()[-3000:]})
        return None
    seconds = time.perf_counter() - start
    shown = result if isinstance(result, str) else json.dumps(result, default=str)
    say(f"ok   {name} ({seconds:.1f} s): {shown}")
    RESULTS.append({"step": name, "ok": True, "seconds": round(seconds, 1), "result": result})
    return result


def tformer(*args: str, cwd: Path, timeout: int = 900) -> str:
    """`tformer <args>` from this checkout (python -m tformer_cli): its stdout, or an error with its last line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([sys.executable, "-m", "tformer_cli", *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=max(10, min(timeout, left())))
    if r.returncode != 0:
        tail = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"tformer {args[0]} exit {r.returncode}: {tail[0]}")
    return r.stdout


def run_figures(run: Path) -> dict:
    history = json.loads((run / "history.json").read_text())
    metrics = json.loads((run / "test_metrics.json").read_text()) if (run / "test_metrics.json").is_file() else {}
    return {"epochs": len(history), "samples_per_s": round(history[-1].get("train_samples_per_s", 0.0), 1),
            "val_accuracy": round(history[-1].get("val_accuracy", float("nan")), 4),
            "test_accuracy": round(metrics["accuracy"], 4) if "accuracy" in metrics else None}


# ---------------------------------------------------------------------------------------------------------------

def environment(device: str, quick: bool) -> dict:
    import torch

    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    if device == "cuda":
        out["gpu"] = torch.cuda.get_device_name(0)
        out["memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    n = 512 if quick else 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    start, reps = time.perf_counter(), 10
    for _ in range(reps):
        a @ b
    sync(device)
    out["bf16_matmul_tflops"] = round(2 * n**3 * reps / (time.perf_counter() - start) / 1e12, 1)
    return out


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def demo(out: Path, device: str, quick: bool) -> dict:
    small = ["data.n_train=300", "data.n_validation=100", "data.n_test=100", "trainer.epochs=1",
             "embedding_init.vocab_size=300"] if quick else []
    tformer("train", f"trainer.device={device}", *small, f"hydra.run.dir={out / 'demo'}", cwd=out)
    return run_figures(out / "demo")


def folders(out: Path, data: Path, quick: bool) -> dict:
    """Hugging Face BERT folders with random weights (transformers' save_pretrained) and a WordPiece tokenizer
    learned from the IMDB training texts."""
    import pandas as pd
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    texts = pd.read_parquet(data / "train.parquet")["text"].tolist()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=2000 if quick else 30522,
                                                            special_tokens=special, show_progress=False))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    made = {}
    for name, shape in (QUICK_SHAPES if quick else SHAPES).items():
        folder = out / f"hf_{name}"
        config = transformers.BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=shape["d_model"],
                                         num_hidden_layers=shape["n_layers"], num_attention_heads=shape["n_heads"],
                                         intermediate_size=shape["d_ff"], max_position_embeddings=512,
                                         pad_token_id=tok.token_to_id("[PAD]"))
        torch.manual_seed(0)
        transformers.BertModel(config).save_pretrained(folder, safe_serialization=True)
        tok.save(str(folder / "tokenizer.json"))
        made[name] = str(folder)
    return made


def train_folder(out: Path, data: Path, folder: str, name: str, device: str, quick: bool) -> dict:
    small = ["data.max_train_samples=200", "data.max_eval_samples=100"] if quick else []
    tformer("train", "model=pretrained", f"model.pretrained={folder}", "data=files",
            f"data.train_file={data / 'train.parquet'}", f"data.test_file={data / 'test.parquet'}",
            f"trainer.device={device}", "trainer.precision=bf16", "model.max_len=128", "trainer.epochs=1",
            *small, f"hydra.run.dir={out / name}", cwd=out)
    return run_figures(out / name)


def evaluate(out: Path, run: Path) -> str:
    text = tformer("evaluate", f"checkpoint={run}", f"hydra.run.dir={out / 'evaluated'}", cwd=out)
    metrics = json.loads(next((out / "evaluated").rglob("*metrics.json")).read_text())
    return f"accuracy {metrics['accuracy']:.4f} on {metrics['n']:,} texts" if "accuracy" in metrics else text[-200:]


def predict(out: Path, run: Path) -> str:
    answer = json.loads(tformer("predict", f"--checkpoint={run}", "--json", "a gripping, beautifully shot film",
                                cwd=out).strip().splitlines()[-1])
    return f"{answer['label']} {answer['probability']:.3f}"


def export(out: Path, run: Path) -> str:
    text = tformer("export", f"checkpoint={run}", f"out={out / 'onnx'}", cwd=out)
    import onnxruntime

    line = next((l for l in text.splitlines() if "logit difference" in l), text.strip().splitlines()[-1])
    return f"{line.split(';', 1)[-1].strip()} (onnxruntime {onnxruntime.__version__}, providers " \
           f"{','.join(onnxruntime.get_available_providers())})"


def serve(out: Path, run: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tformer_cli", "serve", f"checkpoint={run}", "port=0"], cwd=out,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, url, said = time.monotonic() + 120, None, ""
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            said = line.strip() or said
            if not line and proc.poll() is not None:
                raise RuntimeError(f"serve ended with exit {proc.returncode} before listening: {said}")
            found = re.search(r"on (http://[\d.]+:\d+)", line)
            url = found.group(1) if found else None
        if url is None:
            raise RuntimeError("serve printed no address within 120 s")
        request = urllib.request.Request(f"{url}/predict", data=json.dumps(["a dull, lifeless film"]).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            body = json.loads(response.read())
        return f"HTTP {response.status}: {body['predictions'][0]['label']}"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def ctrl_c_and_resume(out: Path, device: str, quick: bool) -> str:
    from safetensors.torch import load_file

    args = ["data.n_train=1000" if quick else "data.n_train=4000", "data.n_validation=200", "data.n_test=200",
            "trainer.epochs=2", "trainer.checkpoint_every_steps=10", f"trainer.device={device}",
            "trainer.test_after_fit=false"]
    tformer("train", *args, f"hydra.run.dir={out / 'whole'}", cwd=out)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "tformer_cli", "train", *args, f"hydra.run.dir={out / 'cut'}"],
                            cwd=out, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while not (out / "cut" / "checkpoints" / "last").is_dir() and proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("no checkpoint within 600 s")
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=300)
    if code == 0:
        raise RuntimeError("the run ended before it could be interrupted (make it longer)")
    tformer("train", *args, f"resume={out / 'cut'}", cwd=out)
    a = load_file(str(out / "whole" / "checkpoints" / "best" / "model.safetensors"))
    b = load_file(str(out / "cut" / "checkpoints" / "best" / "model.safetensors"))
    worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    return f"interrupted (exit {code}) and resumed: {'identical weights' if worst == 0 else f'max |diff| {worst:.2e}'}"


def throughput(folders_made: dict, device: str, quick: bool, measured_peak: float | None,
               compiled: set[str] | None = None) -> dict:
    """tformer's train_step and the peer's on the same batches, bf16: full-length batches (no padding) and batches
    of mixed lengths (40% to 100% of the length, about 30% padding). Rows, each `<shape> <length> <batches>
    <mode>`: `eager` (tformer as it runs), `eager padded` (the same with the padding fast paths off: the mask
    always passed, no unpadding), `transformers` (AutoModelForSequenceClassification, its default attention) and
    `compiled` (trainer.compile=true; only the cases in `compiled` when given, as `shape:length`). Tokens and MFU
    count real tokens only."""
    import torch
    import transformers
    from transformers import AutoModelForSequenceClassification

    from tformer_cli.hardware import Precision
    from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier
    from tformer_cli.model.fast_paths import Layout
    from tformer_cli.model.pretrained import load_encoder, load_into
    from tformer_cli.training import loop
    from tformer_cli.training.config import OptimizerConfig, ScheduleConfig
    from tformer_cli.training.loop import Optimization, train_step

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    dev = torch.device(device)
    precision = Precision("bf16", dev.type)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    peak = next((v for k, v in DENSE_BF16_PEAK.items() if k in name), None)
    table = {}
    steps, warm = (2, 1) if quick else (50, 10)  # 20 steps left a run-to-run spread of up to 40% on an H200
    batch_size = 4 if quick else 32

    class Padded:  # the padding fast paths off: every batch runs padded, with its mask
        @staticmethod
        def of(mask, device=None, unpad=True):
            return Layout(True)

    cases = [(shape, length, kind) for kind in ("full", "mixed") for shape in folders_made for length in (128, 512)]
    modes = ["eager", "eager padded", "transformers"]
    if not (quick and device == "cpu"):
        modes.append("compiled")
    for mode in modes:  # every eager and peer row first: a compile that runs long costs only compiled rows
        for shape_name, length, kind in cases:
            key = f"{shape_name} {length} {kind} {mode}"
            if mode == "eager padded" and kind == "full" and device != "cuda":
                continue  # a CPU already ran full batches without a mask; on a GPU that is new: measured
            if mode == "compiled" and (kind == "mixed" or (compiled is not None
                                                           and f"{shape_name}:{length}" not in compiled)):
                continue
            if left() < (60 if mode == "compiled" else 20):
                say(f"     {key}: skipped, the --budget is spent")
                continue
            folder = folders_made[shape_name]
            enc = load_encoder(folder, None, length)
            batches = random_batches(enc.shape["vocab_size"], length, kind, steps + warm, batch_size, device)
            real_tokens = sum(int(b["attention_mask"].sum()) for b in batches[warm:]) / (steps * batch_size)
            cfg = EncoderConfig(**enc.shape, num_classes=2, dropout=0.1, attention_dropout=0.1, pooling="mean")
            if mode == "transformers":
                peer = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2).to(dev).train()
                fused = {"fused": True} if dev.type in ("cpu", "cuda") else {}
                optimizer = torch.optim.AdamW(peer.parameters(), lr=5e-5, weight_decay=0.01, **fused)

                def peer_step(b, peer=peer, optimizer=optimizer):
                    with precision.autocast():
                        loss = peer(input_ids=b["input_ids"].to(dev),
                                    attention_mask=b["attention_mask"].long().to(dev),
                                    labels=b["labels"].to(dev)).loss
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(peer.parameters(), 1.0)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    return loss.detach()

                rate = timed(peer_step, batches, warm, device)[0]
                row = {"samples_per_s": round(rate, 1)}
                for ours in ("eager", "compiled"):
                    theirs = table.get(f"{shape_name} {length} {kind} {ours}", {}).get("samples_per_s")
                    if theirs:
                        row[f"tformer_{ours}_ratio"] = round(theirs / rate, 2)
                del peer, optimizer
            else:
                model = TransformerClassifier(cfg)
                load_into(model, enc)
                model.to(dev).train()
                n_params = sum(p.numel() for n_, p in model.named_parameters() if "embedding" not in n_)
                opt = Optimization(model, optimizer=OptimizerConfig("adamw", 5e-5, 0.01, {"betas": [0.9, 0.999],
                                                                                          "eps": 1e-8}),
                                   schedule=ScheduleConfig("constant", 0, 0.0, 0.0), total_steps=steps + warm,
                                   device=dev, precision=precision, grad_clip=1.0, compile=mode == "compiled")
                started = time.perf_counter()
                kept, loop.Layout = loop.Layout, (Padded if mode == "eager padded" else loop.Layout)
                try:
                    rate = timed(lambda b: train_step(opt, b), batches, warm, device)[0]
                finally:
                    loop.Layout = kept
                flops = 6 * n_params + 12 * cfg.n_layers * cfg.n_heads * (cfg.d_model // cfg.n_heads) * length
                row = {"samples_per_s": round(rate, 1), "real_tokens_per_s": round(rate * real_tokens),
                       "seconds_with_warm_up": round(time.perf_counter() - started, 1)}
                if peak:
                    row["mfu"] = round(rate * real_tokens * flops / peak, 3)
                if measured_peak:
                    row["mfu_of_measured_peak"] = round(rate * real_tokens * flops / measured_peak, 3)
                if mode == "eager padded":
                    fast = table.get(f"{shape_name} {length} {kind} eager", {}).get("samples_per_s")
                    if fast:
                        row["fast_path_gain"] = round(fast / rate, 2)
                del model, opt
            table[key] = row
            say(f"     {key}: {json.dumps(row)}")
            if device == "cuda":
                torch.cuda.empty_cache()
    return table


def random_batches(vocab: int, length: int, kind: str, n: int, batch_size: int, device: str) -> list[dict]:
    """n seeded batches of random token ids: `full` (no padding) or `mixed` (texts of 40% to 100% of the length)."""
    import torch

    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(5, vocab, (batch_size, length), generator=g)
        if kind == "full":
            mask = torch.ones(batch_size, length, dtype=torch.bool)
        else:
            real = torch.randint(int(0.4 * length), length + 1, (batch_size,), generator=g)
            mask = torch.arange(length)[None, :] < real[:, None]
            ids = ids.masked_fill(~mask, 0)
        batch = {"input_ids": ids, "attention_mask": mask,
                 "labels": torch.randint(0, 2, (batch_size,), generator=g)}
        # pinned, as tformer's loader gives them on CUDA: a copy from pageable memory waits for the device
        # to finish the previous step, so the host could not queue one step while the device runs another
        out.append({k: v.pin_memory() for k, v in batch.items()} if device == "cuda" else batch)
    return out


def timed(step_fn, batches, warm: int, device: str) -> tuple[float, float]:
    """(samples/s over batches[warm:], the host's seconds per step to queue them before waiting for the device:
    a step the host takes as long to queue as the device to run is bound by the host)."""
    for b in batches[:warm]:
        step_fn(b)
    sync(device)
    start = time.perf_counter()
    for b in batches[warm:]:
        step_fn(b)
    queued = time.perf_counter() - start
    sync(device)
    seconds = time.perf_counter() - start
    return sum(len(b["labels"]) for b in batches[warm:]) / seconds, queued / (len(batches) - warm)


def torchrun(out: Path, device: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "--standalone",
                        "-m", "tformer_cli", "train", "data.n_train=500", "data.n_validation=100", "data.n_test=100",
                        "trainer.epochs=1", f"trainer.device={device}", f"hydra.run.dir={out / 'torchrun'}"],
                       cwd=out, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError((r.stderr.strip() or r.stdout.strip()).splitlines()[-1])
    found = next((l for l in r.stdout.splitlines() if "distributed" in l or "backend" in l),
                 "one process (DDP, and so NCCL, starts at two ranks)")
    bound = ""
    if device == "cuda":  # one rank per GPU: one more than the machine shows is refused before anything starts
        import torch

        more = torch.cuda.device_count() + 1
        r = subprocess.run([sys.executable, "-m", "tformer_cli", "train", f"trainer.devices={more}"], cwd=out, env=env,
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 2 or "one process per GPU" not in r.stderr:
            raise RuntimeError(f"trainer.devices={more}: exit {r.returncode}, {r.stderr.strip()[-300:]}")
        bound = f"; trainer.devices={more} refused: {r.stderr.strip()[:120]}"
    return f"{found.strip()[:160]}; {run_figures(out / 'torchrun')}{bound}"


def fp16(out: Path, device: str) -> dict:
    tformer("train", "data.n_train=1000", "data.n_validation=200", "data.n_test=200", "trainer.epochs=1",
            f"trainer.device={device}", "trainer.precision=fp16", f"hydra.run.dir={out / 'fp16'}", cwd=out)
    return run_figures(out / "fp16")


STEPS = ("demo", "train", "evaluate", "predict", "export", "serve", "resume", "throughput", "torchrun", "fp16")


def main() -> None:
    ap = argparse.ArgumentParser(description="tformer's GPU check: one line per step")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--data", type=Path, default=ROOT / ".gpu" / "imdb", help="train.parquet and test.parquet")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    ap.add_argument("--quick", action="store_true", help="tiny shapes and few steps (the CPU dry run)")
    ap.add_argument("--budget", type=float, default=540,
                    help="seconds the whole check may take: a step that would start with under 20 s left is "
                         "skipped (and said so), compiled throughput rows need 90 s")
    ap.add_argument("--compiled", default="", help="the throughput cases measured compiled too, as "
                    "shape:length (minilm:128,bert_base:512); default: all four")
    ap.add_argument("--only", default="", help="comma-separated step names to run (a rerun after a fix): "
                    + ",".join(STEPS))
    args = ap.parse_args()
    # the tformer commands run in other folders: a relative PYTHONPATH (.gpu/site) would point nowhere there
    if os.environ.get("PYTHONPATH"):
        os.environ["PYTHONPATH"] = os.pathsep.join(str(Path(x).resolve()) for x in
                                                   os.environ["PYTHONPATH"].split(os.pathsep) if x)
    DEADLINE[0] = time.monotonic() + args.budget
    out = (args.out or Path(tempfile.mkdtemp(prefix="gpu_check-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # runs, checkpoints and model folders (a BERT-base one is 440 MB) go to a scratch folder; --out keeps the
    # summary, so that what a remote machine sends back is small
    work = Path(tempfile.mkdtemp(prefix="gpu_check-work-"))
    data, dev, quick = args.data.resolve(), args.device, args.quick
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    if only - set(STEPS):
        ap.error(f"--only: unknown step(s) {', '.join(sorted(only - set(STEPS)))}; known: {', '.join(STEPS)}")
    wanted = lambda name: not only or name in only  # noqa: E731
    say(f"gpu_check: device {dev}{' (quick)' if quick else ''}, data {data}, out {out}, work {work}, "
        f"budget {args.budget:.0f} s")
    started = time.perf_counter()
    env = step("environment", environment, dev, quick)
    if wanted("demo"):
        step("demo: tformer train", demo, work, dev, quick)
    needs_folders = {"train", "evaluate", "predict", "export", "serve", "throughput"}
    made = None
    if not only or only & needs_folders:
        made = step("folders: minilm and bert-base shapes (transformers save_pretrained)", folders, work, data,
                    quick)
    if wanted("train") or (only & {"evaluate", "predict", "export", "serve"}):
        for name in (made or {}) if wanted("train") else ["minilm"]:
            if made and name in made:
                step(f"train {name} on IMDB (bf16)", train_folder, work, data, made[name], name, dev, quick)
    run = work / "minilm"
    for name, fn in (("evaluate", evaluate), ("predict", predict), ("export", export), ("serve", serve)):
        if wanted(name):
            step({"export": "export (ONNX)", "serve": "serve (one request)"}.get(name, name), fn, work, run)
    if wanted("resume"):
        step("ctrl-c and resume", ctrl_c_and_resume, work, dev, quick)
    if made and wanted("throughput"):
        step("throughput: train_step vs transformers", throughput, made, dev, quick,
             (env or {}).get("bf16_matmul_tflops", 0) * 1e12 or None,
             {x.strip() for x in args.compiled.split(",") if x.strip()} if args.compiled else None)
    if wanted("torchrun"):
        step("torchrun path (one process)", torchrun, work, dev)
    if dev == "cuda" and wanted("fp16"):
        step("fp16 with its gradient scaler", fp16, work, dev)
    failed = [r["step"] for r in RESULTS if not r["ok"]]
    skipped = [r["step"] for r in RESULTS if r.get("skipped")]
    (out / "summary.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    say(f"gpu_check: {len(RESULTS) - len(failed) - len(skipped)} of {len(RESULTS)} steps ok in "
        f"{time.perf_counter() - started:.0f} s" + (f"; failed: {', '.join(failed)}" if failed else "")
        + (f"; skipped (budget): {', '.join(skipped)}" if skipped else "") + f"; details in {out / 'summary.json'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
