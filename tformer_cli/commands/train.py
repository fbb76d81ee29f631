"""`tformer train`: data -> tokenizer -> encoder -> fit -> best checkpoint -> test metrics."""
from __future__ import annotations

import json
import random
from pathlib import Path

from ..errors import TformerError


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_tokenizer_and_embeddings(cfg, train_texts):
    """(tokenizer, pretrained weight or None) for the chosen embedding_init."""
    from ..data import tokenization
    from ..model import pretrained

    emb, max_len = cfg.embedding_init, int(cfg.model.max_len)
    if emb.name == "random":
        return tokenization.train_wordpiece(train_texts, int(emb.vocab_size), max_len), None
    pre = pretrained.load(emb, int(cfg.model.d_model))
    return tokenization.load_tokenizer(pre.tokenizer_file, max_len), pre


def class_weights(labels, num_classes: int, mode):
    """'balanced': n / (k * count_c), scikit-learn's inverse-frequency weights; None: unweighted."""
    import torch

    if not mode:
        return None
    if mode != "balanced":
        raise TformerError(f"loss.class_weights={mode} must be null or balanced")
    counts = torch.bincount(labels, minlength=num_classes).float().clamp(min=1)
    return counts.sum() / (num_classes * counts)


# Keys that may differ between a run and its resumption (where data comes from, how fast, how loud).
RESUME_IGNORED = ("resume", "trainer.device", "trainer.num_workers", "trainer.log_every_steps",
                  "trainer.checkpoint_every_steps", "trainer.eval_batch_size", "trainer.test_after_fit", "data.dir",
                  "trainer.compile")


def config_diff(a, b, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two plain (resolved) config dicts."""
    keys = []
    for k in sorted(set(a) | set(b), key=str):
        dotted = f"{prefix}{k}"
        if dotted in RESUME_IGNORED:
            continue
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            keys += config_diff(va, vb, dotted + ".")
        elif va != vb:
            keys.append(dotted)
    return keys


def find_resume_checkpoint(resume, outputs_dir: str = "outputs") -> Path:
    """resume=true: the newest run's last checkpoint; resume=<run dir or checkpoint dir>: that one."""
    if resume is True or str(resume).lower() == "true":
        found = sorted(Path(outputs_dir).glob("**/checkpoints/last/trainer_state.json"),
                       key=lambda p: p.stat().st_mtime)
        if not found:
            raise TformerError(f"resume=true but no run with a last checkpoint under {outputs_dir}/; start a run "
                               f"first or pass resume=<run dir>")
        return found[-1].parent
    p = Path(str(resume)).expanduser()
    # .last.old: the previous `last`, left by a crash between the two renames of an atomic checkpoint write
    for candidate in (p / "checkpoints" / "last", p / "checkpoints" / ".last.old", p / "last", p):
        if (candidate / "trainer_state.json").is_file():
            return candidate
    raise TformerError(f"resume={resume}: no last checkpoint with training state there; pass the run directory "
                       f"(outputs/train/<date>/<time>)")


def load_resume_state(ckpt: Path, cfg) -> tuple[dict, dict]:
    from omegaconf import OmegaConf
    from safetensors.torch import load_file

    saved = OmegaConf.to_container(OmegaConf.load(ckpt / "config.yaml"), resolve=True)
    current = OmegaConf.to_container(cfg, resolve=True)
    diff = config_diff(saved, current)
    if diff:
        shown = ", ".join(f"{k} ({_get(saved, k)!r} -> {_get(current, k)!r})" for k in diff[:6])
        raise TformerError(f"cannot resume {ckpt.parent.parent}: the config differs in {shown}; resume with the "
                           f"run's original overrides or start a new run")
    return load_file(str(ckpt / "training_state.safetensors")), json.loads((ckpt / "trainer_state.json").read_text())


def _get(d, dotted):
    for part in dotted.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def _install_signal_handlers(run) -> None:
    """First SIGINT/SIGTERM: finish the step, save, stop. Second: exit at once (checkpoints are atomic)."""
    import os
    import signal

    def handler(signum, frame):
        if run.stop_requested:
            print("\n[tformer] second interrupt: exiting now", flush=True)
            os._exit(130)
        run.stop_requested = True
        print(f"\n[tformer] {signal.Signals(signum).name}: finishing this step and saving the last checkpoint "
              f"(again to exit at once)", flush=True)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def run(cfg) -> float:
    import torch
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf
    from rich.console import Console

    from .. import checkpoint
    from ..data import sources, tokenization
    from ..data.tokenization import TokenizedSplit
    from ..evaluation import report
    from ..model.encoder import EncoderConfig, TransformerClassifier
    from ..training.hardware import pick_device, pick_precision
    from ..training.loop import Interrupted, Run, fit

    console = Console()
    # Validate the model shape before spending minutes on data.
    EncoderConfig.from_dict({**OmegaConf.to_container(cfg.model, resolve=True), "vocab_size": 1, "num_classes": 2})
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    resume_ckpt = find_resume_checkpoint(cfg.resume) if cfg.get("resume") else None
    resume_state = load_resume_state(resume_ckpt, cfg) if resume_ckpt is not None else None
    if resume_ckpt is not None:
        run_dir = resume_ckpt.parent.parent  # a resumed run keeps writing into its own directory
        console.print(f"[bold]resuming[/] {run_dir}", highlight=False)
    seed = int(cfg.seed)
    seed_everything(seed)
    device = pick_device(cfg.trainer.device)
    precision = pick_precision(cfg.trainer.precision, device)
    torch.set_float32_matmul_precision("high")

    data = sources.load(cfg.data, seed=seed)
    splits = data.splits
    console.print(f"[bold]data[/] {cfg.data.name} from {data.source}: " + ", ".join(
        f"{s} {len(ds):,}" for s, ds in splits.items()) + f"; {len(data.label_names)} classes")
    if resume_ckpt is not None:  # the run's own tokenizer, not a retrained one
        tok, pre = tokenization.load_tokenizer(resume_ckpt / "tokenizer.json", int(cfg.model.max_len)), None
        if cfg.embedding_init.name != "random":
            from ..model import pretrained

            pre = pretrained.load(cfg.embedding_init, int(cfg.model.d_model))
    else:
        tok, pre = build_tokenizer_and_embeddings(cfg, splits["train"]["text"])
    tokenization.configure(tok, int(cfg.model.max_len), str(cfg.data.get("truncation", "right")))
    pad_id = tokenization.pad_id(tok)
    tokenized = {s: TokenizedSplit.from_dataset(tokenization.tokenize_split(ds, tok, int(cfg.model.max_len), s))
                 for s, ds in splits.items()}

    model_cfg = EncoderConfig.from_dict({
        **OmegaConf.to_container(cfg.model, resolve=True),
        "vocab_size": pre.weight.shape[0] if pre is not None else tok.get_vocab_size(),
        "num_classes": len(data.label_names),
        "embedding_dim": pre.weight.shape[1] if pre is not None else 0,
        "pad_id": pad_id,
    })
    model = TransformerClassifier(model_cfg)
    if pre is not None:
        with torch.no_grad():
            model.token_embedding.weight.copy_(pre.weight)
    if resume_ckpt is not None:
        from safetensors.torch import load_file

        model.load_state_dict(load_file(str(resume_ckpt / "model.safetensors")))
    freeze_epochs = int(cfg.embedding_init.get("freeze_epochs", 0)) if pre is not None else 0
    console.print(
        f"[bold]model[/] {model.num_parameters():,} parameters ({model_cfg.n_layers} layers, d_model {model_cfg.d_model}, "
        f"{model_cfg.n_heads} heads, {model_cfg.positions} positions, {model_cfg.norm}-norm, {model_cfg.pooling} pooling); "
        f"embeddings {cfg.embedding_init.name}" + (f" from {pre.source}, frozen for {freeze_epochs} epoch(s)" if pre else "")
        + f"; [bold]device[/] {device}, precision {precision.name}; run dir {run_dir}", highlight=False)

    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    tokenizer_json = tok.to_str()
    ckpt_dir = run_dir / "checkpoints"

    def save(which: str, metrics: dict, meta: dict, tensors=None, state=None) -> None:
        checkpoint.save(ckpt_dir / which, model, model_config=model_cfg.to_dict(), tokenizer_json=tokenizer_json,
                        label_names=data.label_names, config_yaml=config_yaml, metrics=metrics, meta=meta,
                        extra_tensors=tensors, extra_json=state)

    loss_weight = class_weights(tokenized["train"].labels, len(data.label_names), cfg.get("loss", {}).get("class_weights"))
    run = Run(model=model, train=tokenized["train"], validation=tokenized["validation"], label_names=data.label_names,
              pad_id=pad_id, device=device, precision=precision, trainer_cfg=cfg.trainer, optimizer_cfg=cfg.optimizer,
              schedule_cfg=cfg.schedule, freeze_epochs=freeze_epochs,
              embedding_lr_multiplier=float(cfg.embedding_init.get("lr_multiplier", 1.0)), save_checkpoint=save,
              run_dir=run_dir, loss_weight=loss_weight.to(device) if loss_weight is not None else None,
              resume=resume_state, label_smoothing=float(cfg.loss.get("label_smoothing", 0.0)))
    _install_signal_handlers(run)
    try:
        best = fit(run)
    except torch.cuda.OutOfMemoryError as exc:
        raise TformerError(f"out of GPU memory with trainer.batch_size={cfg.trainer.batch_size} and "
                           f"model.max_len={cfg.model.max_len}; try trainer.batch_size="
                           f"{max(1, int(cfg.trainer.batch_size) // 2)} (the last checkpoint is kept)") from exc
    except Interrupted as exc:
        overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("resume=")]
        command = " ".join(["tformer", "train", *overrides, f"resume={run_dir}"])
        raise Interrupted(f"{exc}; resume with: {command}") from None
    report.print_history(run.history, console)
    (run_dir / "history.json").write_text(json.dumps(run.history, indent=2))
    if run.history:
        from ..evaluation.artifacts import training_curves_png

        training_curves_png(run_dir / "training_curves.png", run.history)
    console.print(f"best checkpoint: {ckpt_dir / 'best'} (epoch {best.get('epoch')}, "
                  f"{best['monitor']} {best['best_value']:.4f})", highlight=False)

    if cfg.trainer.get("test_after_fit", True) and "test" in tokenized:
        from .evaluate import evaluate_split, write_reports

        loaded = checkpoint.load(ckpt_dir / "best", device)
        metrics, probs = evaluate_split(loaded.model, tokenized["test"], loaded.label_names, pad_id=pad_id,
                                        device=device, precision=precision,
                                        batch_size=int(cfg.trainer.eval_batch_size))
        title = f"test ({len(tokenized['test']):,} examples, best checkpoint)"
        report.print_metrics(metrics, data.label_names, title, console)
        (run_dir / "test_metrics.json").write_text(json.dumps(metrics, indent=2))
        write_reports(run_dir / "test_report", metrics, data.label_names, splits["test"]["text"], tokenized["test"],
                      probs, True, title, console)
    return float(best["best_value"])
