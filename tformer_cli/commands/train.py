"""`tformer train`: typed config -> data, tokenizer, encoder -> fit -> best checkpoint -> reports and test metrics."""
from __future__ import annotations

import dataclasses
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

    config, tree = configure(plain(cfg))
    hydra = HydraConfig.get()
    return train(config, RunDir(hydra.runtime.output_dir), tree, overrides=list(hydra.overrides.task)).best_value


def configure(tree: dict) -> tuple[TrainConfig, dict]:
    """The typed config of a composed tree, with data locations made absolute in both (the saved config must
    find the data from any directory). Shared by the Hydra entry point and the Python API."""
    from ..data.sources import absolute_locations

    config = TrainConfig.from_dict(tree)
    located = absolute_locations(config.data)
    tree["data"].update(located)
    config.data = dataclasses.replace(config.data, **located)
    return config, tree


@dataclass
class Trained:
    run_dir: RunDir  # where the run was written (a resumed run's own directory)
    best_value: float  # the monitored metric's best value


def train(config: TrainConfig, run_dir: RunDir, tree: dict, overrides: list[str] = ()) -> Trained:
    """Train one run into `run_dir` (or continue the run named by config.resume); `tree` is the composed config
    as plain containers, saved with every checkpoint and compared on resume."""
    from .. import checkpoint
    from ..console import output

    console = output()
    from ..run_dir import SweepDir
    from ..training import distributed

    dist = distributed.from_env()
    if dist.enabled and not dist.is_main:
        return _train_worker(config, run_dir, tree, dist)
    if config.resume and SweepDir(str(config.resume)).is_sweep():  # a job of a resumed `-m` sweep
        finished, resume_from = sweep_job_plan(run_dir)
        if finished is not None:
            return finished
    else:
        resume_from = checkpoint.find_resumable(config.resume) if config.resume else None
    if resume_from is not None:
        run_dir.discard_if_empty()  # the folder Hydra made for this invocation: the run goes on in its own
        run_dir = RunDir.of_checkpoint(resume_from)  # a resumed run keeps writing into its own directory
    with run_dir.lock():  # before reading `last`: another process may be writing it
        # a resume's log lines wait in memory until its checks pass: a refused resume leaves the run as it was
        console.open_log(run_dir.log("train"), log_header("train", overrides, tree, resumed=resume_from is not None),
                         defer=resume_from is not None)
        if resume_from is not None:
            console.print(f"[bold]resuming[/] {run_dir}", highlight=False)
        resume = load_resume(resume_from, tree) if resume_from is not None else None
        best_value = _train_locked(config, run_dir, tree, overrides, resume, console)
    console.close_log()
    return Trained(run_dir, best_value)


def sweep_job_plan(run_dir: RunDir):
    """(Trained, None) for a job of a resumed sweep that had finished (read, not retrained); (None, its `last`)
    for one interrupted after a checkpoint (resumed); (None, None) for one that never got that far (trained
    afresh in its folder)."""
    import json

    from ..console import output

    if run_dir.finished:
        best = run_dir.best.existing()
        monitor, mode = best.early_stopping() if best is not None else ("val_accuracy", "max")
        value = json.loads(best.metrics.read_text()).get(monitor) if best is not None else None
        line = (f"job {run_dir.root.name} had finished ({monitor} {value:.4f}); not retrained" if value is not None
                else f"job {run_dir.root.name} had finished; not retrained")
        output().print(line, highlight=False)
        with open(run_dir.log("train"), "a", encoding="utf-8") as f:
            f.write(f"===== resumed sweep: {line}\n")
        return Trained(run_dir, float(value) if value is not None else float("nan")), None
    last = run_dir.last.existing()
    if last is not None and last.has_training_state():
        return None, last
    for leftover in (run_dir.metrics_log, run_dir.metrics_csv):  # a job killed before its first checkpoint
        leftover.unlink(missing_ok=True)
    return None, None


def _train_locked(config: TrainConfig, run_dir: RunDir, tree: dict, overrides, resume, console) -> float:
    import torch

    from ..hardware import keep_freed_host_memory, pick_device, pick_precision
    from ..training.loop import Interrupted, fit

    from ..training import distributed

    dist = distributed.from_env()
    device = pick_device(config.trainer.device)
    allocator = keep_freed_host_memory(device)
    if dist.enabled:  # (before seeding: joining the group draws random numbers)
        device = distributed.init(dist, device)
        console.print(f"[bold]distributed[/] {dist.world} processes (DDP, {'NCCL' if device.type == 'cuda' else 'gloo'}"
                      f"), global batch {config.trainer.batch_size}; rank 0 writes", highlight=False)
    seed_everything(config.seed)
    precision = pick_precision(config.trainer.precision, device)
    torch.set_float32_matmul_precision("high")
    prepared = prepare(config, resume, console)
    console.commit_log()
    if resume is not None and run_dir.finished:  # being trained longer: unfinished again until it ends, so an
        run_dir.history.unlink()                  # interruption of the extension can itself be resumed
    console.print(f"[bold]model[/] {prepared.describe(config)}; [bold]device[/] {device}"
                  f"{' (freed host memory reused)' if allocator == 'retain' else ''}, precision {precision.name}; "
                  f"run dir {run_dir}", highlight=False)
    from ..training.loggers import build_logger

    run_logger = build_logger(config.logger, run_dir)
    run_logger.start(tree, resume.step if resume is not None else None)
    status = "FAILED"
    try:
        fit_run = build_run(config, prepared, run_dir, tree, device, precision, resume, console, run_logger)
        fit_run.dist = dist
        restore = _install_signal_handlers(fit_run)
        try:
            state = fit(fit_run)
        except torch.cuda.OutOfMemoryError as exc:
            micro, rows = config.trainer.micro_batches, config.trainer.batch_size // dist.world
            slices = f"trainer.micro_batches={micro * 2} (the same updates in slices; it may be added to resume=), " \
                if micro * 2 <= rows else ""
            raise TformerError(f"out of GPU memory with trainer.batch_size={config.trainer.batch_size} and "
                               f"model.max_len={prepared.model_cfg.max_len}; try {slices}a lower model.max_len, or "
                               f"trainer.eval_batch_size={max(1, config.trainer.eval_batch_size // 2)} if it was "
                               f"validating (the last checkpoint is kept)") from exc
        except Interrupted as exc:
            status = "KILLED"
            sweep = run_dir.sweep()
            if sweep is not None:  # a job of a -m sweep: the whole sweep picks up where it stopped
                raise Interrupted(f"{exc}; resume the sweep with the same `tformer train -m ...` command plus "
                                  f"resume={sweep}") from None
            command = " ".join(["tformer", "train", *[o for o in overrides if not o.startswith("resume=")],
                                *([f"trainer.devices={dist.world}"] if dist.enabled else []), f"resume={run_dir}"])
            raise Interrupted(f"{exc}; resume with: {command}") from None
        finally:
            restore()  # Ctrl-C while reporting: the generic one-line stop (the checkpoints are complete)
            distributed.shutdown()  # (the other ranks are done: rank 0 reports alone)
        report_run(config, run_dir, state, prepared, device, precision, console)
        if run_dir.test_metrics.is_file():
            import json

            run_logger.log_test(json.loads(run_dir.test_metrics.read_text()))
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        run_logger.finish(status)
    if not config.trainer.keep_optimizer_state:
        from .. import checkpoint

        checkpoint.drop_training_state(run_dir.last)
    return float(state.best_metrics["best_value"])


def _train_worker(config: TrainConfig, run_dir: RunDir, tree: dict, dist) -> Trained:
    """A torchrun rank other than 0: the same data, model, optimizer state and steps as rank 0, writing nothing
    (its Hydra folder is a throwaway one, cli.py; rank 0 writes checkpoints, logs and reports)."""
    import torch

    from .. import checkpoint
    from ..console import output
    from ..hardware import keep_freed_host_memory, pick_device, pick_precision
    from ..training import distributed
    from ..training.loop import Interrupted, fit

    import warnings

    console = output()
    console.screen.quiet = True  # one voice: rank 0's (its warnings too)
    warnings.simplefilter("ignore")
    resume_from = checkpoint.find_resumable(config.resume) if config.resume else None
    resume = load_resume(resume_from, tree) if resume_from is not None else None
    device = distributed.init(dist, pick_device(config.trainer.device))
    keep_freed_host_memory(device)
    seed_everything(config.seed)
    precision = pick_precision(config.trainer.precision, device)
    torch.set_float32_matmul_precision("high")
    prepared = prepare(config, resume, console)
    fit_run = build_run(config, prepared, run_dir, tree, device, precision, resume, console)
    fit_run.save_checkpoint, fit_run.log_metrics, fit_run.dist = (lambda *args: None), None, dist
    fit_run.say = lambda *args, **kwargs: None
    restore = _install_signal_handlers(fit_run, quiet=True)
    try:
        state = fit(fit_run)
    except Interrupted:  # rank 0 says it (and saved the checkpoint)
        raise SystemExit(130) from None
    finally:
        restore()
        distributed.shutdown()
    return Trained(run_dir, float(state.best_metrics["best_value"]))


def log_header(task: str, overrides, tree: dict, resumed: bool = False) -> str:
    """The top of a run log: the command, when, and the composed config."""
    import time

    import yaml

    command = " ".join(["tformer", task, *overrides])
    if resumed:
        return f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} resumed: {command}\n"
    return (f"===== {time.strftime('%Y-%m-%d %H:%M:%S')} {command}\n"
            + yaml.safe_dump(tree, sort_keys=False, allow_unicode=True) + "=====\n")


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
    data_fingerprint: dict  # sources.fingerprint: saved with every checkpoint, checked on resume

    @property
    def pad_id(self) -> int:
        from ..data import tokenization

        return tokenization.pad_id(self.tokenizer)

    def describe(self, config: TrainConfig) -> str:
        c, options = self.model_cfg, config.model_options
        epochs, layers = freeze_plan(config)
        frozen = (f", frozen for {epochs} epoch(s)" + (f" with the lowest {layers} blocks" if layers else "")
                  if epochs else "")
        if options.init and self.embeddings_source:
            source = f"encoder from the {self.embeddings_source}"
        else:
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

    from ..safe_text import markup

    data = sources.load(config.data, seed=config.seed)
    console.print(f"[bold]data[/] {markup(config.data.name)} from {markup(data.source)}: " + ", ".join(
        f"{s} {len(ds):,}" for s, ds in data.splits.items()) + f"; {len(data.label_names)} classes")
    fingerprint = sources.fingerprint(data)
    if resume is not None:
        check_same_data(resume, fingerprint, config.resume_ignore_data_change, console)
    max_len, pre, encoder = int(config.model["max_len"]), None, None
    options = config.model_options
    init = None
    if resume is not None:
        tok = tokenization.load_tokenizer(resume.checkpoint.tokenizer_file, max_len)
    elif options.init:
        from .. import checkpoint

        init = checkpoint.load_pretraining(options.init)
        tok = tokenization.load_tokenizer(init.tokenizer_file, max_len)
    elif options.pretrained:
        from ..model import pretrained

        encoder = pretrained.load_encoder(options.pretrained, options.pretrained_package, max_len)
        tok = tokenization.load_tokenizer(encoder.tokenizer_file, max_len)
    else:
        tok, pre = build_tokenizer_and_embeddings(config, data.splits["train"]["text"])
        if pre is None:  # learned from the texts: under DDP, rank 0's (WordPiece training is not reproducible
            from ..training import distributed  # across processes when merges tie)

            tok = distributed.same_tokenizer(tok, max_len)
    tokenization.configure(tok, max_len, config.data.truncation, config.long_text)
    tokenized = {s: TokenizedSplit.from_dataset(tokenization.tokenize_split(ds, tok, max_len, s, config.long_text))
                 for s, ds in data.splits.items()}
    if resume is not None:
        model, model_cfg = resume.checkpoint.model, EncoderConfig.from_dict(resume.checkpoint.model_config)
        return Prepared(data, tok, tokenized, model, model_cfg, None, fingerprint)
    if init is not None:
        return _from_pretraining(config, init, data, tok, tokenized, fingerprint, console)
    if encoder is not None:
        from ..model import pretrained

        model_cfg = config.encoder_config(**encoder.shape, num_classes=len(data.label_names),
                                          multi_label=config.data.multi_label)
        model = TransformerClassifier(model_cfg)
        pretrained.load_into(model, encoder)
        return Prepared(data, tok, tokenized, model, model_cfg, encoder.source, fingerprint)
    model_cfg = config.encoder_config(
        vocab_size=pre.weight.shape[0] if pre is not None else tok.get_vocab_size(),
        num_classes=len(data.label_names), embedding_dim=pre.weight.shape[1] if pre is not None else 0,
        pad_id=tokenization.pad_id(tok), multi_label=config.data.multi_label)
    model = TransformerClassifier(model_cfg)
    if pre is not None:
        with torch.no_grad():
            model.token_embedding.weight.copy_(pre.weight)
    return Prepared(data, tok, tokenized, model, model_cfg, pre.source if pre is not None else None, fingerprint)


def check_same_data(resume, fingerprint: dict, ignore: bool, console) -> None:
    """Refuse to continue a run on data that differs from what it trained on (its history would mix two datasets),
    unless resume_ignore_data_change=true; a different label set is always refused (the classifier's shape)."""
    from ..data.sources import fingerprint_changes

    saved = resume.checkpoint.meta.get("data")
    labels_now, labels_then = fingerprint["label_names"], list(resume.checkpoint.label_names)
    if labels_now != labels_then:
        raise TformerError(f"cannot resume {resume.run_dir}: " + "; ".join(fingerprint_changes(
            {"label_names": labels_then}, {"label_names": labels_now})) + "; resume on the run's data or start a "
            "new run")
    changes = fingerprint_changes(saved, fingerprint) if isinstance(saved, dict) else []
    if changes and not ignore:
        raise TformerError(f"cannot resume {resume.run_dir}: the data changed since the run began ("
                           f"{'; '.join(changes)}); resume on the same data, start a new run, or pass "
                           f"resume_ignore_data_change=true to go on anyway")
    if changes:
        console.print(f"[yellow]warning[/]: resuming on changed data ({'; '.join(changes)})", highlight=False,
                      markup=True)


def freeze_plan(config: TrainConfig) -> tuple[int, int]:
    """(epochs, lower blocks) to freeze: a whole pretrained encoder's model.freeze_*, else a pretrained
    embedding table's embedding_init.freeze_epochs (the table alone)."""
    options, emb = config.model_options, config.embedding_init
    if options.pretrained or options.freeze_epochs:
        return options.freeze_epochs, options.freeze_layers
    return (emb.freeze_epochs, 0) if emb.pretrained else (0, 0)


# A classifier started from a `tformer pretrain` run keeps the pretrained encoder's shape; these come from the
# classifier's own model config (the head, pooling, regularisation, and the length it reads).
_FROM_CLASSIFIER = ("pooling", "head_hidden", "dropout", "attention_dropout", "max_len")


def _from_pretraining(config: TrainConfig, init, data, tok, tokenized, fingerprint, console) -> "Prepared":
    """The classifier whose encoder is the pretraining run's (weights copied key for key; the head is new)."""
    from ..model.encoder import EncoderConfig, TransformerClassifier
    from ..model.mlm import encoder_state
    from ..safe_text import markup

    import yaml

    saved = yaml.safe_load(init.files.config.read_text()) if init.files.config.is_file() else {}
    if (saved.get("data") or {}).get("name") == config.data.name and saved.get("seed") != config.seed:
        raise TformerError(f"model.init: the pretraining run split {config.data.name} with seed={saved.get('seed')}; "
                           f"with seed={config.seed} the validation (and a carved test) split would hold texts it "
                           f"pretrained on: pass seed={saved.get('seed')}")
    mine = config.encoder_config(vocab_size=int(init.model_config["vocab_size"]), num_classes=len(data.label_names),
                                 multi_label=config.data.multi_label, pad_id=int(init.model_config["pad_id"]),
                                 embedding_dim=int(init.model_config.get("embedding_dim") or 0))
    merged = {**init.model_config, **{k: getattr(mine, k) for k in _FROM_CLASSIFIER},
              "num_classes": mine.num_classes, "multi_label": mine.multi_label}
    if merged["positions"] == "learned" and merged["max_len"] > int(init.model_config["max_len"]):
        raise TformerError(f"model.max_len={merged['max_len']} is longer than the pretraining run's "
                           f"{init.model_config['max_len']} learned positions; use model.max_len<="
                           f"{init.model_config['max_len']}")
    model_cfg = EncoderConfig.from_dict(merged)
    model = TransformerClassifier(model_cfg)
    weights = encoder_state(init.state)
    if model_cfg.positions != "learned":
        weights = {k: v for k, v in weights.items() if k != "position_table"}
    elif "position_embedding.weight" in weights:
        weights["position_embedding.weight"] = weights["position_embedding.weight"][:model_cfg.max_len]
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or any(not k.startswith("head.") for k in missing):
        raise TformerError(f"the pretraining run {init.files.path} does not fit this encoder (missing "
                           f"{[k for k in missing if not k.startswith('head.')][:3]}, unexpected {unexpected[:3]})")
    source = f"pretraining run {init.files.path.parent.parent}"
    console.print(f"[bold]encoder[/] from {markup(source)} ({model_cfg.n_layers} layers, d_model {model_cfg.d_model}, "
                  f"its tokenizer); a new {model_cfg.num_classes}-way head", highlight=False)
    return Prepared(data, tok, tokenized, model, model_cfg, source, fingerprint)


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
              console, run_logger=None):
    from omegaconf import OmegaConf

    from .. import checkpoint
    from ..training.loop import Run

    config_yaml, tokenizer_json = OmegaConf.to_yaml(OmegaConf.create(tree)), prepared.tokenizer.to_str()
    model_config, label_names = prepared.model_cfg.to_dict(), prepared.data.label_names

    def save(which: str, metrics: dict, training_state=None) -> None:
        checkpoint.save(run_dir.checkpoint(which), prepared.model, model_config=model_config,
                        tokenizer_json=tokenizer_json, label_names=label_names, config_yaml=config_yaml,
                        metrics=metrics, meta={"epoch": metrics.get("epoch"), "step": metrics.get("step"),
                                               "data": prepared.data_fingerprint, **config.long_text.to_meta(),
                                               **({"thresholds": metrics.get("thresholds")}
                                                  if prepared.model_cfg.multi_label else {})},
                        training_state=training_state)

    from ..atomic import JsonLines

    metrics_log = JsonLines(run_dir.metrics_log)
    if resume is not None:
        metrics_log.truncate_after(resume.step)  # what came after the checkpoint is trained (and logged) again
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
               resume=(resume.tensors, resume.state) if resume is not None else None, say=console.print,
               log_metrics=metrics_log if run_logger is None else lambda r: (metrics_log(r), run_logger.log(r)))


def report_run(config: TrainConfig, run_dir: RunDir, state, prepared: Prepared, device, precision, console) -> None:
    """history.json, training curves, and the best checkpoint's metrics and reports on the test split."""
    from .. import checkpoint
    from ..atomic import write_json
    from ..evaluation import report
    from ..evaluation.evaluate import count, evaluate_split, write_reports

    report.print_history(state.history, console)
    write_json(run_dir.history, state.history)
    if state.history:
        from ..evaluation.artifacts import training_curves_png

        training_curves_png(run_dir.training_curves, state.history, state.best_metrics.get("epoch"))
    best = state.best_metrics
    console.print(f"best checkpoint: {run_dir.best} (epoch {best.get('epoch')}, {best['monitor']} "
                  f"{best['best_value']:.4f})", highlight=False)
    test = prepared.tokenized.get("test")
    if not config.trainer.test_after_fit or test is None:
        return
    loaded = checkpoint.load(run_dir.best, device)
    metrics, probs = evaluate_split(loaded.model, test, loaded.label_names, pad_id=prepared.pad_id, device=device,
                                    precision=precision, batch_size=config.trainer.eval_batch_size,
                                    thresholds=loaded.thresholds)
    title = f"test ({count(test)}; best checkpoint)"
    report.print_metrics(metrics, loaded.label_names, title, console)
    write_json(run_dir.test_metrics, metrics)
    write_reports(run_dir.test_report, metrics, loaded.label_names, prepared.data.splits["test"]["text"], test,
                  probs, True, title, console)


def class_weights(labels, num_classes: int, mode: str | None):
    """'balanced': n / (k * count_c), scikit-learn's inverse-frequency weights; None: unweighted."""
    import torch

    if not mode:
        return None
    if labels.dim() == 2:
        raise TformerError("loss.class_weights=balanced weighs single-label classes; with data.multi_label=true "
                           "leave it null")
    if mode != "balanced":
        raise TformerError(f"loss.class_weights={mode} must be null or balanced")
    counts = torch.bincount(labels, minlength=num_classes).float().clamp(min=1)
    return counts.sum() / (num_classes * counts)


# Keys that may differ between a run and its resumption (where data comes from, how fast, how loud).
RESUME_IGNORED = ("resume", "resume_ignore_data_change", "trainer.keep_optimizer_state", "trainer.device", "trainer.num_workers", "trainer.log_every_steps",
                  "trainer.checkpoint_every_steps", "trainer.eval_batch_size", "trainer.test_after_fit", "data.dir",
                  "trainer.compile", "trainer.devices", "trainer.micro_batches", "logger")


def config_diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two plain (resolved) config dicts: `a` the saved run's, `b` the
    new one. A key the saved config lacks came with a newer tformer (the run used its default): not a change."""
    keys = []
    for k in sorted(set(a) | set(b), key=str):
        dotted = f"{prefix}{k}"
        if dotted in RESUME_IGNORED or k not in a:
            continue
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            keys += config_diff(va, vb, dotted + ".")
        elif va != vb:
            keys.append(dotted)
    return keys


def load_resume(ckpt, tree: dict):
    """The training state of `ckpt` (a run's last checkpoint), refused if its config differs. A finished run is
    only continued when asked to train longer (a larger trainer.epochs); otherwise it is left exactly as it is."""
    from .. import checkpoint

    run = RunDir.of_checkpoint(ckpt)
    saved_epochs = _get(checkpoint.read_config(ckpt), "trainer.epochs") if ckpt.config.is_file() else None
    extending = isinstance(saved_epochs, int) and int(_get(tree, "trainer.epochs")) > saved_epochs
    if run.finished and not extending:
        raise TformerError(f"run {run} has already finished (its history is written), so there is nothing to "
                           f"resume and it is left as it is; start a new run, or pass trainer.epochs=<more than "
                           f"{saved_epochs}> with resume= to train it longer")
    resume = checkpoint.load_training_state(ckpt)
    stopper = resume.state.get("early_stopping", {})
    if extending and stopper.get("patience", 0) > 0 and stopper.get("bad_epochs", 0) >= stopper["patience"]:
        raise TformerError(f"run {run} stopped early ({stopper.get('monitor')} did not improve for "
                           f"{stopper['patience']} epochs); more epochs would stop again at once; start a new run")
    diff = [k for k in config_diff(resume.config, tree) if not (extending and k == "trainer.epochs")]
    if diff:
        shown = ", ".join(f"{k} ({_get(resume.config, k)!r} -> {_get(tree, k)!r})" for k in diff[:6])
        raise TformerError(f"cannot resume {resume.run_dir}: the config differs in {shown}; resume with the run's "
                           f"original overrides{_as_it_was(resume.config, diff)} or start a new run")
    return resume


def _as_it_was(saved: dict, keys: list[str]) -> str:
    """' (add: data.long_text=truncate ...)': the overrides that put back the run's values, which is also what a
    run from an older tformer needs when a default has changed since (where the values are plain scalars)."""
    import json

    values = [_get(saved, k) for k in keys]
    if not all(v is None or isinstance(v, (str, int, float, bool)) for v in values):
        return ""
    return " (add: " + " ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in zip(keys, values)) + ")"


def _get(d, dotted):
    for part in dotted.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def _install_signal_handlers(run, quiet: bool = False):
    """First SIGINT/SIGTERM: finish the step, save, stop. Second: exit at once (checkpoints are atomic). A second
    signal within a second is the same stop (Ctrl-C under torchrun: the terminal's SIGINT, then torchrun's
    SIGTERM)."""
    import os
    import signal
    import time

    first = []

    def handler(signum, frame):
        if run.stop_requested and first and time.monotonic() - first[0] < 1.0:
            return
        if run.stop_requested:
            print("\n[tformer] second interrupt: exiting now", flush=True)
            os._exit(130)
        run.stop_requested = True
        first.append(time.monotonic())
        if quiet:
            return
        print(f"\n[tformer] {signal.Signals(signum).name}: finishing this step and saving the last checkpoint "
              f"(again to exit at once)", flush=True)

    import threading

    if threading.current_thread() is not threading.main_thread():  # e.g. a library caller's worker thread
        return lambda: None
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    return lambda: [signal.signal(sig, h) for sig, h in previous.items()]
