"""`tformer pretrain`: masked-language-model pretraining of the encoder on unlabeled text, in the same run
directories as `train` (checkpoints/best by validation MLM loss, checkpoints/last to resume, metrics.jsonl,
history.json, pretrain.log), with the same progress, Ctrl-C and `resume=` behaviour. Then
`tformer train model.init=<this run dir>` fine-tunes a classifier from it (train.py: `prepare`).

Texts: the data config's train split, plus data.dir/unsupervised.parquet when present (mlm.use_unsupervised) and
mlm.extra_files; never the test split. A text longer than model.max_len is read as consecutive windows of it
(mlm.windows), so every token is learned from: keeping each text's first max_len tokens, pretraining at 128 tokens
left out 62% of IMDB's tokens. The validation split's texts measure the MLM loss and masked-token accuracy each
epoch (on masks drawn from a fixed seed, so epochs are comparable).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TformerError
from ..run_dir import RunDir


@dataclass
class MlmOptions:
    mask_prob: float = 0.15
    use_unsupervised: bool = True
    extra_files: list = field(default_factory=list)
    max_texts: int | None = None
    windows: bool = True

    RANGES = {"mask_prob": (0, 1, "()"), "max_texts": (1, None, "[)")}


def run(cfg) -> float:
    """The Hydra entry point; returns the best validation MLM loss."""
    from hydra.core.hydra_config import HydraConfig

    from ..typed_config import plain

    hydra = HydraConfig.get()
    return pretrain(plain(cfg), RunDir(hydra.runtime.output_dir), list(hydra.overrides.task))


def pretraining_texts(config, options: MlmOptions, console) -> tuple[list[str], list[str]]:
    """(train texts, validation texts): the labelled splits' texts (labels unused) and any unlabeled files."""
    import random

    from ..data import sources
    from ..safe_text import markup

    data = sources.load(config.data, seed=config.seed)
    train, validation = list(data.splits["train"]["text"]), list(data.splits["validation"]["text"])
    extra = [Path(f).expanduser() for f in options.extra_files]
    folder = sources.resolve_dir(config.data)
    if options.use_unsupervised and folder is not None and (folder / "unsupervised.parquet").is_file():
        extra.append(folder / "unsupervised.parquet")
    for path in extra:
        train += read_texts(path)
    if options.max_texts is not None and len(train) > options.max_texts:
        train = random.Random(config.seed).sample(train, options.max_texts)
    train = [t for t in train if t and t.strip()]
    console.print(f"[bold]texts[/] {len(train):,} to pretrain on ({markup(config.data.name)} train split"
                  + "".join(f" + {markup(p.name)}" for p in extra) + f"), {len(validation):,} to validate on",
                  highlight=False)
    return train, validation


def read_texts(path: Path) -> list[str]:
    """The `text` column of a parquet / csv / tsv / json / jsonl file."""
    import datasets

    kinds = {".parquet": "parquet", ".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json"}
    if not path.is_file() or path.suffix not in kinds:
        raise TformerError(f"mlm.extra_files: {path} is not a readable {'/'.join(kinds)} file")
    extra = {"delimiter": "\t"} if path.suffix == ".tsv" else {}
    ds = datasets.load_dataset(kinds[path.suffix], data_files=str(path), split="train", **extra)
    if "text" not in ds.column_names:
        raise TformerError(f"{path} has no `text` column (it has {', '.join(ds.column_names)})")
    return [t for t in ds["text"] if isinstance(t, str)]


def pretrain(tree: dict, run_dir: RunDir, overrides=()) -> float:
    import copy

    from .. import checkpoint
    from ..console import output
    from ..typed_config import build
    from .train import configure, log_header

    tree = copy.deepcopy(tree)
    if isinstance(tree.get("mlm"), dict) and tree["mlm"].get("extra_files"):  # found again from any directory
        tree["mlm"]["extra_files"] = [str(Path(f).expanduser().resolve()) for f in tree["mlm"]["extra_files"]]
    options = build(MlmOptions, tree.get("mlm") or {}, "mlm")
    config, located = configure({k: v for k, v in tree.items() if k != "mlm"})  # (data paths made absolute)
    tree.update(located)
    console = output()
    resume_from = None
    if config.resume:
        resume_from = _find_resumable(config.resume)
        run_dir.discard_if_empty()
        run_dir = RunDir.of_checkpoint(resume_from)
    with run_dir.lock():
        console.open_log(run_dir.log("pretrain"), log_header("pretrain", overrides, tree, resumed=resume_from is not None))
        if resume_from is not None:
            console.print(f"[bold]resuming[/] {run_dir}", highlight=False)
        best = _pretrain_locked(config, options, tree, run_dir, overrides, resume_from, console)
    console.close_log()
    if not config.trainer.keep_optimizer_state:
        checkpoint.drop_training_state(run_dir.last)
    return best


def _find_resumable(resume):
    from ..run_dir import newest_checkpoints

    if resume is True or str(resume).lower() == "true":
        found = [c for c in newest_checkpoints("outputs", "last", pretraining=True)
                 if c.has_training_state() and not RunDir.of_checkpoint(c).finished]
        if not found:
            raise TformerError("resume=true but no unfinished pretraining run under outputs/; pass resume=<run dir>")
        return found[-1]
    last = RunDir(Path(str(resume)).expanduser()).last.existing()
    if last is None or not last.has_training_state() or not last.is_pretraining():
        raise TformerError(f"resume={resume}: no pretraining run with a resumable last checkpoint there; pass the "
                           f"run dir (outputs/pretrain/<date>/<time>)")
    return last


def text_windows(tok, texts: list[str], max_len: int, windows: bool) -> list[list[int]]:
    """Token ids to pretrain on: each text's first max_len tokens, or (windows) all of them, in consecutive windows
    of max_len tokens, each [CLS] part [SEP], sharing none (a mask draws from every token once per epoch).
    Only the ids are kept, a chunk of texts at a time (tokenization.encodings)."""
    if windows and max_len < 3:
        from ..errors import ConfigError

        raise ConfigError(f"model.max_len={max_len} leaves no room for a token between [CLS] and [SEP]; pretrain "
                          f"with model.max_len >= 3")
    from ..data import tokenization

    if windows:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(tok.to_str())
        tok.no_truncation()
    width, out = max_len - 2, []
    for e in tokenization.encodings(tok, texts):
        ids = e.ids  # [CLS] body [SEP]
        if not windows:
            out.append(ids)
            continue
        body = ids[1:-1]
        out += [ids[:1] + body[a:a + width] + ids[-1:] for a in range(0, max(len(body), 1), width)]
    return out


def _check_resumable(resumed, tree: dict, run_dir: RunDir) -> dict:
    """As `train`'s resume: the same config (texts, model, batches: the run's place in its epoch depends on them),
    and a finished run only continued to train longer. Returns the run's saved config."""
    import yaml

    from .train import _get, config_diff

    saved = (yaml.safe_load(resumed.files.config.read_text()) if resumed.files.config.is_file() else None) or {}
    saved_epochs = _get(saved, "trainer.epochs")
    extending = isinstance(saved_epochs, int) and int(_get(tree, "trainer.epochs")) > saved_epochs
    if run_dir.finished and not extending:
        raise TformerError(f"pretraining run {run_dir} has already finished; pass trainer.epochs=<more than "
                           f"{saved_epochs}> with resume= to train it longer, or start a new run")
    diff = [k for k in config_diff(saved, tree) if not (extending and k == "trainer.epochs")]
    if diff:
        shown = ", ".join(f"{k} ({_get(saved, k)!r} -> {_get(tree, k)!r})" for k in diff[:6])
        raise TformerError(f"cannot resume {run_dir}: the config differs in {shown}; resume with the run's original "
                           f"overrides (`tformer pretrain <them> resume={run_dir}`) or start a new run")
    return saved


class MlmRun:
    """One pretraining run's parts (model, optimizer, splits, state) and its steps: `_pretrain_locked` below reads
    top to bottom as the epoch loop, these methods are what each part of it does."""

    def __init__(self, config, options: MlmOptions, tree: dict, run_dir: RunDir, resume_from, console):
        import torch
        from omegaconf import OmegaConf

        from .. import checkpoint
        from ..atomic import JsonLines
        from ..data import tokenization
        from ..data.batching import BatchLoader
        from ..data.tokenization import TokenizedSplit
        from ..hardware import keep_freed_host_memory, pick_device, pick_precision
        from ..model.encoder import EncoderConfig
        from ..model.mlm import MaskedLM
        from ..training.early_stopping import EarlyStopping
        from ..training.loop import Optimization
        from ..training.state import TrainingState
        from .train import build_tokenizer_and_embeddings, seed_everything

        self.config, self.options, self.run_dir, self.console = config, options, run_dir, console
        seed_everything(config.seed)
        self.device = pick_device(config.trainer.device)
        keep_freed_host_memory(self.device)
        self.precision = pick_precision(config.trainer.precision, self.device)
        train_texts, val_texts = pretraining_texts(config, options, console)
        max_len, resumed, saved_config = int(config.model["max_len"]), None, {}
        if resume_from is not None:
            resumed = checkpoint.load_pretraining(resume_from, with_training_state=True)
            saved_config = _check_resumable(resumed, tree, run_dir)
            tok, pre = tokenization.load_tokenizer(resumed.tokenizer_file, max_len), None
        else:
            tok, pre = build_tokenizer_and_embeddings(config, train_texts)
        tokenization.configure(tok, max_len)  # (cut: the first max_len tokens; the saved tokenizer stays so)
        before_windows = resumed is not None and "windows" not in (saved_config.get("mlm") or {})
        self.windows = options.windows and not before_windows
        if before_windows:  # its batches are cut texts, on this resume and every later one: the key stays out of
            tree.get("mlm", {}).pop("windows", None)  # the config it saves
            console.print(f"this run began before mlm.windows: it goes on reading each text's first {max_len} tokens",
                          highlight=False)
        encode = lambda texts: TokenizedSplit.from_ids(text_windows(tok, texts, max_len, self.windows))
        self.val_split, self.pad = encode(val_texts), tokenization.pad_id(tok)
        if resumed is not None:
            self.model_cfg = EncoderConfig.from_dict(resumed.model_config)
        else:
            self.model_cfg = config.encoder_config(
                vocab_size=pre.weight.shape[0] if pre is not None else tok.get_vocab_size(), num_classes=2,
                embedding_dim=pre.weight.shape[1] if pre is not None else 0, pad_id=self.pad)
        self.model = MaskedLM(self.model_cfg)
        if resumed is not None:
            self.model.load_state_dict(resumed.state)
        elif pre is not None:
            with torch.no_grad():
                self.model.encoder.token_embedding.weight.copy_(pre.weight)
        self.model.to(self.device)
        self.specials = sorted({tok.token_to_id(t) for t in tokenization.SPECIAL_TOKENS
                                if tok.token_to_id(t) is not None and t not in ("[MASK]", "[UNK]")})
        self.mask_id = tok.token_to_id("[MASK]")
        tcfg = config.trainer
        train_split = encode(train_texts)
        self.read_as = (f"{len(train_split):,} windows of at most {max_len} tokens" if self.windows else
                        f"{len(train_split):,} texts cut at {max_len} tokens")
        self.loader = BatchLoader(train_split, tcfg.batch_size, self.pad, shuffle=True, seed=tcfg.seed)
        self.opt = Optimization(self.model, optimizer=config.optimizer, schedule=config.schedule,
                                total_steps=tcfg.epochs * len(self.loader), device=self.device,
                                precision=self.precision, grad_clip=tcfg.grad_clip, say=console.print)
        es = tcfg.early_stopping
        self.state = TrainingState(EarlyStopping(es.monitor, es.mode, es.patience, es.min_delta))
        if resumed is not None and resumed.training is not None:
            tensors, saved = resumed.training
            self.opt.load_state_dict(tensors, saved)
            self.state.load_state_dict(tensors, saved)
        self.config_yaml, self.tokenizer_json = OmegaConf.to_yaml(OmegaConf.create(tree)), tok.to_str()
        self.metrics_log = JsonLines(run_dir.metrics_log)
        if resumed is not None:
            self.metrics_log.truncate_after(self.state.step)

    def describe(self) -> str:
        c = self.model_cfg
        return (f"[bold]model[/] {c.n_layers} layers, d_model {c.d_model}, vocabulary {c.vocab_size:,}, "
                f"{sum(p.numel() for p in self.model.parameters()):,} parameters with the MLM head (output layer "
                f"tied to the token table); texts read as {self.read_as}; device {self.device}, precision "
                f"{self.precision.name}; run dir {self.run_dir}")

    def masked(self, batch: dict, step: int):
        """(inputs, labels) of a batch; the masks come from a seed per step: a resumed run draws the same ones."""
        import torch

        from ..model.mlm import mask_tokens

        g = torch.Generator().manual_seed(self.config.seed * 1_000_003 + step)
        return mask_tokens(batch["input_ids"], batch["attention_mask"], mask_id=self.mask_id,
                           vocab_size=self.model_cfg.vocab_size, special_ids=self.specials, generator=g,
                           prob=self.options.mask_prob)

    def save(self, which: str, metrics: dict, training: bool) -> None:
        from .. import checkpoint
        from ..run_dir import PRETRAINING

        files = None
        if training:
            t1, s1 = self.state.state_dict()
            t2, s2 = self.opt.state_dict()
            files = ({**t1, **t2}, {**s1, **s2})
        checkpoint.save(self.run_dir.checkpoint(which), self.model, model_config=self.model_cfg.to_dict(),
                        tokenizer_json=self.tokenizer_json, label_names=[], config_yaml=self.config_yaml,
                        metrics=metrics, training_state=files,
                        meta={"kind": PRETRAINING, "epoch": metrics.get("epoch"), "step": metrics.get("step")})

    def step(self, batch: dict):
        """One optimizer step on a masked batch; the loss, detached, still on the device."""
        import torch

        from ..model.mlm import IGNORE
        from ..training.loop import sliced_update

        device = self.device
        inputs, labels = self.masked(batch, self.state.step)
        inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        mask = batch["attention_mask"].to(device, non_blocking=True)
        predicted = labels.ne(IGNORE)

        def slice_loss(part: slice) -> torch.Tensor:  # weighted by its share of the batch's masked tokens
            with self.precision.autocast():
                logits = self.model(inputs[part], mask[part], labels[part])
            loss = self.model.loss(logits, labels[part])
            if part.stop - part.start < labels.shape[0]:
                loss = loss * (predicted[part].sum() / predicted.sum().clamp(min=1))
            return loss

        return sliced_update(self.opt, labels.shape[0], self.config.trainer.micro_batches, slice_loss)

    def train_epoch(self, stop) -> float:
        """The epoch from state.batches_done on (its time added to state.epoch_seconds); `last` every
        checkpoint_every_steps, and on a stop request (then Interrupted). Returns the epoch's summed loss."""
        import torch

        from ..console import progress
        from ..training.loop import Interrupted

        state, tcfg, device = self.state, self.config.trainer, self.device
        self.model.train()
        self.loader.set_epoch(state.epoch)
        t0, seconds_before, window_n = time.perf_counter(), state.epoch_seconds, 0
        loss_sum = torch.full((), state.epoch_loss_sum, device=device)  # summed on the device, read when logged
        window = torch.zeros((), device=device)
        bar = progress(self.loader.iterate(self.loader.batches()[state.batches_done:]), total=len(self.loader),
                       initial=state.batches_done, unit="batch", desc=f"pretrain epoch {state.epoch + 1}/{tcfg.epochs}")
        for batch in bar:
            loss, rows = self.step(batch), batch["input_ids"].shape[0]
            state.step, state.batches_done = state.step + 1, state.batches_done + 1
            loss_sum, state.epoch_seen = loss_sum + loss * rows, state.epoch_seen + rows
            window, window_n = window + loss, window_n + 1
            if state.step % tcfg.log_every_steps == 0:
                running = float(window) / window_n
                _check_finite(running, f"near step {state.step}")
                bar.set_postfix(loss=f"{running:.4f}", lr=f"{self.opt.lr:.2e}")
                self.metrics_log({"kind": "step", "step": state.step, "epoch": state.epoch + 1, "mlm_loss": running,
                                  "lr": self.opt.lr})
                window, window_n = torch.zeros((), device=device), 0
            every = tcfg.checkpoint_every_steps
            if state.batches_done < len(self.loader) and (stop.stop_requested or (every and state.step % every == 0)):
                state.epoch_loss_sum = float(loss_sum)
                state.epoch_seconds = seconds_before + time.perf_counter() - t0
                self.save("last", {"step": state.step, "epoch": state.epoch + 1}, training=True)
                if stop.stop_requested:
                    bar.close()
                    raise Interrupted(f"interrupted at epoch {state.epoch + 1}, step {state.step}; the last "
                                      f"checkpoint is saved")
        bar.close()
        state.epoch_seconds = seconds_before + time.perf_counter() - t0
        return float(loss_sum)

    def validate(self) -> dict:
        """MLM loss and masked-token accuracy on the validation texts, on masks that are the same every epoch."""
        import torch

        from ..data.batching import BatchLoader
        from ..model.mlm import IGNORE

        self.model.eval()
        total, correct, count = 0.0, 0, 0
        with torch.no_grad():
            for i, batch in enumerate(BatchLoader(self.val_split, self.config.trainer.eval_batch_size, self.pad,
                                                  shuffle=False)):
                inputs, labels = self.masked(batch, -1 - i)
                labels = labels.to(self.device)
                with self.precision.autocast():
                    logits = self.model(inputs.to(self.device), batch["attention_mask"].to(self.device), labels)
                targets = labels[labels.ne(IGNORE)]
                if len(targets) == 0:
                    continue
                total += float(self.model.loss(logits, labels)) * len(targets)
                correct += int(logits.argmax(-1).eq(targets).sum())
                count += len(targets)
        self.model.train()
        if count == 0:  # nothing to predict (texts too short): not a perfect score
            return {"val_mlm_loss": float("nan"), "val_mlm_accuracy": float("nan")}
        return {"val_mlm_loss": total / count, "val_mlm_accuracy": correct / count}

    def end_epoch(self, loss_sum: float) -> dict:
        """Validate, record, save `best` (if it is) and `last`, print the epoch line."""
        state = self.state
        _check_finite(loss_sum, f"in epoch {state.epoch + 1}")
        metrics = {"epoch": state.epoch + 1, "step": state.step,
                   "train_mlm_loss": loss_sum / max(state.epoch_seen, 1), **self.validate(), "lr": self.opt.lr,
                   "epoch_seconds": state.epoch_seconds, "train_samples_per_s": state.samples_per_s()}
        state.history.append(metrics)
        self.metrics_log({"kind": "epoch", **metrics})
        is_best = state.stopper.update(metrics, metrics["epoch"])
        if is_best:
            state.best_metrics = dict(metrics)
            self.save("best", metrics, training=False)
        state.start_epoch()
        self.save("last", metrics, training=True)
        from ..hardware import release_freed_host_memory

        release_freed_host_memory()
        self.console.print(
            f"epoch {metrics['epoch']:>3}/{self.config.trainer.epochs}  train_mlm_loss {metrics['train_mlm_loss']:.4f}"
            f"  val_mlm_loss {metrics['val_mlm_loss']:.4f}  val_mlm_acc {metrics['val_mlm_accuracy']:.4f}  "
            f"{metrics['train_samples_per_s']:,.0f} samples/s  {metrics['epoch_seconds']:.1f}s"
            + ("  [green]* best[/]" if is_best else ""), highlight=False)
        return metrics


def _check_finite(loss: float, where: str) -> None:
    if not math.isfinite(loss):
        raise TformerError(f"the MLM loss became {loss} {where}; try a lower optimizer.lr (the last checkpoint is "
                           f"kept)")


def _pretrain_locked(config, options: MlmOptions, tree: dict, run_dir: RunDir, overrides, resume_from,
                     console) -> float:
    from ..atomic import write_json
    from ..evaluation import report
    from ..training.loop import Interrupted
    from .train import _install_signal_handlers

    if config.model_options.pretrained or config.model_options.init:
        raise TformerError("tformer pretrain trains a from-scratch encoder (model=tiny|small|base); a pretrained "
                           "encoder (model.pretrained / model.init) is fine-tuned with tformer train")
    run = MlmRun(config, options, tree, run_dir, resume_from, console)
    state = run.state
    console.print(run.describe(), highlight=False)
    if resume_from is not None:
        console.print(f"resuming at epoch {state.epoch + 1}, batch {state.batches_done} (step {state.step})",
                      highlight=False)
        if run_dir.finished:
            run_dir.history.unlink()  # trained longer: unfinished until it ends again
    stop = type("Stop", (), {"stop_requested": False})()
    restore = _install_signal_handlers(stop)
    try:
        while state.epoch < config.trainer.epochs and not state.stopper.should_stop:
            metrics = run.end_epoch(run.train_epoch(stop))
            if stop.stop_requested:
                raise Interrupted(f"interrupted after epoch {metrics['epoch']}; the last checkpoint is saved")
    except Interrupted as exc:
        command = " ".join(["tformer", "pretrain", *[o for o in overrides if not o.startswith("resume=")],
                            f"resume={run_dir}"])
        raise Interrupted(f"{exc}; resume with: {command}") from None
    finally:
        restore()
    report.print_history(state.history, console)  # (its pretraining columns)
    write_json(run_dir.history, state.history)
    best = state.best_metrics
    same = [o for o in overrides if o.split("=", 1)[0] in ("data", "data.dir", "model", "model.max_len", "seed")]
    if not any(o.startswith("model=") for o in same):
        same.append("model=small")  # (pretrain's default model; train's is tiny)
    if not any(o.startswith("data=") for o in same):
        same.append(f"data={config.data.name}")
    console.print(f"best checkpoint: {run_dir.best} (epoch {best.get('epoch')}, val_mlm_loss "
                  f"{best.get('val_mlm_loss', float('nan')):.4f}); fine-tune it with: tformer train "
                  f"model.init={run_dir} {' '.join(same)}", highlight=False)
    return float(best.get("val_mlm_loss", float("nan")))
