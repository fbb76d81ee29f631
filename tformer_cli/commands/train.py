"""`tformer train`: typed config -> data, tokenizer, encoder -> fit -> best checkpoint -> reports and test metrics."""
from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from typing import Any

from ..errors import TformerError
from ..run_dir import RunDir
from .config import TrainConfig


def run(cfg) -> float:
    """The Hydra entry point; returns the monitored metric's best value (what a sweeper optimises)."""
    from hydra.core.hydra_config import HydraConfig

    from ..typed_config import plain

    from ..data.sources import absolute_locations

    tree = plain(cfg)
    config = TrainConfig.from_dict(tree)
    located = absolute_locations(config.data)  # the saved config must find the data from any directory
    tree["data"].update(located)
    config.data = dataclasses.replace(config.data, **located)
    hydra = HydraConfig.get()
    return train(config, RunDir(hydra.runtime.output_dir), tree, overrides=list(hydra.overrides.task))


def train(config: TrainConfig, run_dir: RunDir, tree: dict, overrides: list[str] = ()) -> float:
    """Train one run into `run_dir` (or continue the run named by config.resume); `tree` is the composed config
    as plain containers, saved with every checkpoint and compared on resume."""
    import torch
    from rich.console import Console

    from ..hardware import pick_device, pick_precision
    from ..training.loop import Interrupted, fit

    console = Console()
    resume = load_resume(config, tree) if config.resume else None
    if resume is not None:
        run_dir = resume.run_dir  # a resumed run keeps writing into its own directory
        console.print(f"[bold]resuming[/] {run_dir}", highlight=False)
    seed_everything(config.seed)
    device = pick_device(config.trainer.device)
    precision = pick_precision(config.trainer.precision, device)
    torch.set_float32_matmul_precision("high")
    prepared = prepare(config, resume, console)
    console.print(f"[bold]model[/] {prepared.describe(config)}; [bold]device[/] {device}, precision "
                  f"{precision.name}; run dir {run_dir}", highlight=False)
    fit_run = build_run(config, prepared, run_dir, tree, device, precision, resume, console)
    _install_signal_handlers(fit_run)
    try:
        state = fit(fit_run)
    except torch.cuda.OutOfMemoryError as exc:
        raise TformerError(f"out of GPU memory with trainer.batch_size={config.trainer.batch_size} and "
                           f"model.max_len={prepared.model_cfg.max_len}; try trainer.batch_size="
                           f"{max(1, config.trainer.batch_size // 2)} (the last checkpoint is kept)") from exc
    except Interrupted as exc:
        command = " ".join(["tformer", "train", *[o for o in overrides if not o.startswith("resume=")],
                            f"resume={run_dir}"])
        raise Interrupted(f"{exc}; resume with: {command}") from None
    report_run(config, run_dir, state, prepared, device, precision, console)
    return float(state.best_metrics["best_value"])


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Prepared:
    """The run's data, tokenizer and model, ready for `fit`."""

    data: Any  # sources.LoadedData
    tokenizer: Any  # tokenizers.Tokenizer
    tokenized: dict  # split -> TokenizedSplit
    model: Any  # TransformerClassifier
    model_cfg: Any  # EncoderConfig
    embeddings_source: str | None  # where a pretrained table or encoder came from (None: random or resumed)

    @property
    def pad_id(self) -> int:
        from ..data import tokenization

        return tokenization.pad_id(self.tokenizer)

    def describe(self, config: TrainConfig) -> str:
        c, options = self.model_cfg, config.model_options
        epochs, layers = freeze_plan(config)
        frozen = (f", frozen for {epochs} epoch(s)" + (f" with the lowest {layers} blocks" if layers else "")
                  if epochs else "")
        source = ("encoder" if options.pretrained else f"embeddings {config.embedding_init.name}") + \
            (f" pretrained, from {self.embeddings_source}" if self.embeddings_source else "")
        return (f"{self.model.num_parameters():,} parameters ({c.n_layers} layers, d_model {c.d_model}, {c.n_heads} "
                f"heads, {c.positions} positions, {c.norm}-norm, {c.pooling} pooling); {source}{frozen}"
                + (f"; layer-wise lr decay {options.layer_lr_decay}" if options.layer_lr_decay != 1.0 else ""))


def prepare(config: TrainConfig, resume, console) -> Prepared:
    """Data, tokenizer (the run's own when resuming) and model (built, or the checkpoint's, checked on load)."""
    import torch

    from ..data import sources, tokenization
    from ..data.tokenization import TokenizedSplit
    from ..model.encoder import EncoderConfig, TransformerClassifier

    data = sources.load(config.data, seed=config.seed)
    from ..safe_text import markup

    console.print(f"[bold]data[/] {markup(config.data.name)} from {markup(data.source)}: " + ", ".join(
        f"{s} {len(ds):,}" for s, ds in data.splits.items()) + f"; {len(data.label_names)} classes")
    max_len, pre, encoder = int(config.model["max_len"]), None, None
    options = config.model_options
    if resume is not None:
        tok = tokenization.load_tokenizer(resume.checkpoint.tokenizer_file, max_len)
    elif options.pretrained:
        from ..model import pretrained

        encoder = pretrained.load_encoder(options.pretrained, options.pretrained_package, max_len)
        tok = tokenization.load_tokenizer(encoder.tokenizer_file, max_len)
    else:
        tok, pre = build_tokenizer_and_embeddings(config, data.splits["train"]["text"])
    tokenization.configure(tok, max_len, config.data.truncation, config.long_text)
    tokenized = {s: TokenizedSplit.from_dataset(tokenization.tokenize_split(ds, tok, max_len, s, config.long_text))
                 for s, ds in data.splits.items()}
    if resume is not None:
        if list(resume.checkpoint.label_names) != list(data.label_names):
            raise TformerError(f"cannot resume {resume.run_dir}: the data's labels {data.label_names[:5]} differ from "
                               f"the run's {resume.checkpoint.label_names[:5]}; resume on the same data or start a "
                               f"new run")
        model, model_cfg = resume.checkpoint.model, EncoderConfig.from_dict(resume.checkpoint.model_config)
        return Prepared(data, tok, tokenized, model, model_cfg, None)
    if encoder is not None:
        from ..model import pretrained

        model_cfg = config.encoder_config(**encoder.shape, num_classes=len(data.label_names))
        model = TransformerClassifier(model_cfg)
        pretrained.load_into(model, encoder)
        return Prepared(data, tok, tokenized, model, model_cfg, encoder.source)
    model_cfg = config.encoder_config(
        vocab_size=pre.weight.shape[0] if pre is not None else tok.get_vocab_size(),
        num_classes=len(data.label_names), embedding_dim=pre.weight.shape[1] if pre is not None else 0,
        pad_id=tokenization.pad_id(tok))
    model = TransformerClassifier(model_cfg)
    if pre is not None:
        with torch.no_grad():
            model.token_embedding.weight.copy_(pre.weight)
    return Prepared(data, tok, tokenized, model, model_cfg, pre.source if pre is not None else None)


def freeze_plan(config: TrainConfig) -> tuple[int, int]:
    """(epochs, lower blocks) to freeze: a whole pretrained encoder's model.freeze_*, else a pretrained
    embedding table's embedding_init.freeze_epochs (the table alone)."""
    options, emb = config.model_options, config.embedding_init
    if options.pretrained or options.freeze_epochs:
        return options.freeze_epochs, options.freeze_layers
    return (emb.freeze_epochs, 0) if emb.pretrained else (0, 0)


def build_tokenizer_and_embeddings(config: TrainConfig, train_texts):
    """(tokenizer, pretrained weight or None) for the chosen embedding_init."""
    from ..data import tokenization
    from ..model import pretrained

    emb, max_len = config.embedding_init, int(config.model["max_len"])
    if not emb.pretrained:
        return tokenization.train_wordpiece(train_texts, int(emb.vocab_size), max_len), None
    pre = pretrained.load(emb, int(config.model["d_model"]))
    return tokenization.load_tokenizer(pre.tokenizer_file, max_len), pre


def build_run(config: TrainConfig, prepared: Prepared, run_dir: RunDir, tree: dict, device, precision, resume,
              console):
    from omegaconf import OmegaConf

    from .. import checkpoint
    from ..training.loop import Run

    config_yaml, tokenizer_json = OmegaConf.to_yaml(OmegaConf.create(tree)), prepared.tokenizer.to_str()
    model_config, label_names = prepared.model_cfg.to_dict(), prepared.data.label_names

    def save(which: str, metrics: dict, training_state=None) -> None:
        checkpoint.save(run_dir.checkpoint(which), prepared.model, model_config=model_config,
                        tokenizer_json=tokenizer_json, label_names=label_names, config_yaml=config_yaml,
                        metrics=metrics, meta={"epoch": metrics.get("epoch"), "step": metrics.get("step"),
                                               **config.long_text.to_meta()},
                        training_state=training_state)

    weight = class_weights(prepared.tokenized["train"].labels, len(label_names), config.loss.class_weights)
    freeze_epochs, freeze_layers = freeze_plan(config)
    return Run(model=prepared.model, train=prepared.tokenized["train"], validation=prepared.tokenized["validation"],
               label_names=label_names, pad_id=prepared.pad_id, device=device, precision=precision,
               trainer=config.trainer, optimizer=config.optimizer, schedule=config.schedule, save_checkpoint=save,
               freeze_epochs=freeze_epochs, freeze_layers=freeze_layers,
               embedding_lr_multiplier=config.embedding_init.lr_multiplier,
               layer_lr_decay=config.model_options.layer_lr_decay,
               loss_weight=weight.to(device) if weight is not None else None,
               label_smoothing=config.loss.label_smoothing,
               resume=(resume.tensors, resume.state) if resume is not None else None, say=console.print)


def report_run(config: TrainConfig, run_dir: RunDir, state, prepared: Prepared, device, precision, console) -> None:
    """history.json, training curves, and the best checkpoint's metrics and reports on the test split."""
    from .. import checkpoint
    from ..evaluation import report
    from ..evaluation.evaluate import evaluate_split, write_reports

    report.print_history(state.history, console)
    run_dir.history.write_text(json.dumps(state.history, indent=2))
    if state.history:
        from ..evaluation.artifacts import training_curves_png

        training_curves_png(run_dir.training_curves, state.history)
    best = state.best_metrics
    console.print(f"best checkpoint: {run_dir.best} (epoch {best.get('epoch')}, {best['monitor']} "
                  f"{best['best_value']:.4f})", highlight=False)
    test = prepared.tokenized.get("test")
    if not config.trainer.test_after_fit or test is None:
        return
    loaded = checkpoint.load(run_dir.best, device)
    metrics, probs = evaluate_split(loaded.model, test, loaded.label_names, pad_id=prepared.pad_id, device=device,
                                    precision=precision, batch_size=config.trainer.eval_batch_size)
    title = f"test ({len(test):,} examples, best checkpoint)"
    report.print_metrics(metrics, loaded.label_names, title, console)
    run_dir.test_metrics.write_text(json.dumps(metrics, indent=2))
    write_reports(run_dir.test_report, metrics, loaded.label_names, prepared.data.splits["test"]["text"], test,
                  probs, True, title, console)


def class_weights(labels, num_classes: int, mode: str | None):
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


def config_diff(a: dict, b: dict, prefix: str = "") -> list[str]:
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


def load_resume(config: TrainConfig, tree: dict):
    """The run to continue (resume=true: the newest; else the named one), refused if its config differs."""
    from .. import checkpoint

    resume = checkpoint.load_training_state(checkpoint.find_resumable(config.resume))
    diff = config_diff(resume.config, tree)
    if diff:
        shown = ", ".join(f"{k} ({_get(resume.config, k)!r} -> {_get(tree, k)!r})" for k in diff[:6])
        raise TformerError(f"cannot resume {resume.run_dir}: the config differs in {shown}; resume with the run's "
                           f"original overrides or start a new run")
    return resume


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
