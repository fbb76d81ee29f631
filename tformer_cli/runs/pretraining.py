"""The masked-language-model job of the run engine (`tformer pretrain`): the encoder learns from unlabeled text, in
the same run directories, loop, checkpoints, progress, Ctrl-C and `resume=` as `train`. Then
`tformer train model.init=<this run dir>` fine-tunes a classifier from it (runs/classify.py: `_from_pretraining`).

The encoder starts from scratch (model=tiny|small|base) or from a pretrained one (model=minilm_l6, model=pretrained
model.pretrained=<folder>): continued pretraining on the task's own text (domain-adaptive pretraining, Gururangan
et al. 2020), with the checkpoint's own masked-LM head where its family saves one that our head computes
(families/: MlmHead), else a new head tied to the token table; its tokenizer is kept as it is.

Texts: the data config's train split, plus data.dir/unsupervised.parquet when present (mlm.use_unsupervised) and
mlm.extra_files; never the test split. A text longer than model.max_len is read as consecutive windows of it
(mlm.windows), so every token is learned from: keeping each text's first max_len tokens, pretraining at 128 tokens
left out 62% of IMDB's tokens. The validation split's texts measure the MLM loss and masked-token accuracy each
epoch (on masks drawn from a fixed seed, so epochs are comparable).
"""
from __future__ import annotations

import copy
import random
import shlex
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer

from .. import checkpoint
from ..store.atomic import JsonLines, sha256_file, write_json
from ..data import sources, tokenization
from ..data.tokenization import TokenizedSplit
from ..errors import ConfigError, TformerError
from ..evaluation import report
from ..evaluation.artifacts import training_curves_png
from ..model import pretrained
from ..overrides import override_value
from ..model.encoder import EncoderConfig
from ..model.mlm import IGNORE, MaskedLM, continued, mask_tokens, predicted_targets
from ..store.layout import PRETRAINING, CheckpointDir, RunDir
from ..tasks import TASKS
from ..safe_text import markup
from ..data.batching import BatchLoader
from ..training.loop import Optimization, Run, sliced_update
from ..training import recipe
from ..training.state import TrainingState
from ..typed_config import build, typed_overrides
from .classify import build_tokenizer_and_embeddings, configure
from .resume import check_unchanged, find_resumable
from .session import Session, execute


class MaskedLanguageModeling:
    """Masked-token prediction (model/mlm.py) on unlabeled text. The masks come from a seed per step, so a resumed
    run draws the same ones; validation uses masks that are the same every epoch, so epochs are comparable."""

    loss_name, loss_label, bar_prefix = "mlm_loss", "MLM loss", "pretrain "

    def __init__(self, *, mask_id: int, vocab_size: int, special_ids: list[int], seed: int, mask_prob: float,
                 head_warmup_steps: int = 0):
        self.mask_id, self.vocab_size, self.special_ids = mask_id, vocab_size, special_ids
        self.seed, self.mask_prob, self.head_warmup_steps = seed, mask_prob, head_warmup_steps

    @property
    def best_from_step(self) -> int:  # an epoch within the head warm-up holds the encoder as loaded
        return self.head_warmup_steps

    def loss_options(self) -> dict:  # after a head warm-up the schedule starts again, its own warm-up first
        return {"schedule_restart": self.head_warmup_steps}

    def masked(self, batch: dict, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return mask_tokens(batch["input_ids"], batch["attention_mask"], mask_id=self.mask_id,
                           vocab_size=self.vocab_size, special_ids=self.special_ids, generator=g, prob=self.mask_prob)

    def step(self, opt: Optimization, batch: dict, step: int, share: float, micro_batches: int) -> torch.Tensor:
        device = opt.device
        inputs, labels = self.masked(batch, step)
        inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        mask = batch["attention_mask"].to(device, non_blocking=True)
        predicted, head_only = labels.ne(IGNORE), step < self.head_warmup_steps

        def slice_loss(part: slice) -> torch.Tensor:  # weighted by its share of the batch's masked tokens
            with opt.precision.autocast():
                logits = opt.forward(inputs[part], mask[part], labels[part], head_only=head_only)
            loss = opt.model.loss(logits, labels[part])
            if part.stop - part.start < labels.shape[0]:
                loss = loss * (predicted[part].sum() / predicted.sum().clamp(min=1))
            return loss

        return sliced_update(opt, labels.shape[0], micro_batches, slice_loss, share)

    def share(self, split: TokenizedSplit, rows: torch.Tensor, whole: torch.Tensor, world: int) -> float:
        raise NotImplementedError("masked-LM pretraining runs in one process (launch.py refuses trainer.devices>1)")

    def validate(self, run: Run) -> dict:
        """MLM loss and masked-token accuracy on the validation texts."""
        model = run.model
        model.eval()
        total, correct, count = 0.0, 0, 0
        with torch.no_grad():
            for i, batch in enumerate(BatchLoader(run.validation, run.trainer.eval_batch_size, run.pad_id,
                                                  shuffle=False)):
                inputs, labels = self.masked(batch, -1 - i)
                labels = labels.to(run.device)
                with run.precision.autocast():
                    logits = model(inputs.to(run.device), batch["attention_mask"].to(run.device), labels)
                targets = predicted_targets(labels)
                if len(targets) == 0:
                    continue
                total += float(model.loss(logits, labels)) * len(targets)
                correct += int(logits[:len(targets)].argmax(-1).eq(targets).sum())
                count += len(targets)
        model.train()
        if count == 0:  # nothing to predict (texts too short): not a perfect score
            return {"val_mlm_loss": float("nan"), "val_mlm_accuracy": float("nan")}
        return {"val_mlm_loss": total / count, "val_mlm_accuracy": correct / count}

    def epoch_line(self, m: dict) -> str:
        return (f"train_mlm_loss {m['train_mlm_loss']:.4f}  val_mlm_loss {m['val_mlm_loss']:.4f}  "
                f"val_mlm_acc {m['val_mlm_accuracy']:.4f}"
                + ("  (head warm-up: the encoder as loaded, never the best)" * (m["step"] <= self.head_warmup_steps)))


@dataclass
class MlmOptions:
    """The `mlm:` keys of configs/pretrain.yaml (their defaults and comments live there)."""

    mask_prob: float
    use_unsupervised: bool
    extra_files: list
    max_texts: int | None
    windows: bool
    head_warmup_steps: int

    RANGES = {"mask_prob": (0, 1, "()"), "max_texts": (1, None, "[)"), "head_warmup_steps": (0, None, "[)")}


def pretrain(tree: dict, run_dir: RunDir, overrides=(), model_name: str | None = None) -> float:
    """Pretrain into run_dir (or continue the run named by resume=); returns the best validation MLM loss.
    model_name: the `model=` preset, named in the closing fine-tune command."""
    tree = copy.deepcopy(tree)
    options = build(MlmOptions, tree.get("mlm") or {}, "mlm")  # (typed first: a bare path is no list of files)
    if options.extra_files:  # found again from any directory
        tree["mlm"]["extra_files"] = [str(Path(f).expanduser().resolve()) for f in options.extra_files]
        twice = [(a, b) for i, a in enumerate(options.extra_files) for b in options.extra_files[:i]
                 if tree["mlm"]["extra_files"][i] == str(Path(b).expanduser().resolve())]
        if twice:  # (its texts would be pretrained on twice as often as the rest, unsaid)
            raise ConfigError(f"mlm.extra_files lists one file twice ({twice[0][1]} and {twice[0][0]}); list each "
                              f"file once")
        options = build(MlmOptions, tree["mlm"], "mlm")
    config, located = configure({k: v for k, v in tree.items() if k != "mlm"})  # (data paths made absolute)
    tree.update(located)
    if config.model_options.init:
        raise TformerError("model.init names the pretraining run tformer train starts from; tformer pretrain starts "
                           "from scratch or from model.pretrained, and a pretraining run is continued with "
                           "resume=<its run dir> (trainer.epochs=<more> to extend a finished one)")
    if options.head_warmup_steps and not config.model_options.pretrained:
        raise ConfigError(f"mlm.head_warmup_steps={options.head_warmup_steps} lets a new masked-LM head learn before it "
                          f"may move a pretrained encoder, but this model starts from scratch (all of it new); drop "
                          f"it, or continue a pretrained encoder (model=minilm_l6, model=pretrained "
                          f"model.pretrained=<folder>)")
    if recipe.is_auto(config.model) and not config.model_options.pretrained:  # (a pretrained one: build())
        raise ConfigError("tformer pretrain reads texts as windows of model.max_len tokens and has no length to fit: "
                          "give a number, e.g. model.max_len=128")
    if recipe.said_auto(config.trainer.epochs):
        raise ConfigError("trainer.epochs=auto is chosen from labelled data by tformer train and distill; tformer "
                          "pretrain takes a number, e.g. trainer.epochs=3")
    resume_from = find_resumable(config.resume, "pretrain") if config.resume else None
    if recipe.said_auto(config.optimizer.lr) and resume_from is None:  # windows of text to unmask: the model's lr for
        config.optimizer.lr = tree["optimizer"]["lr"] = recipe.base_lr(config.model_options)  # texts (a resume: its own)
    return execute(PretrainJob(options, model_name), config, tree, run_dir, overrides, resume_from).best_value


class PretrainJob:
    task, resumes_sweeps = "pretrain", TASKS["pretrain"].resumes_sweeps  # (no: a job of a pretrain -m sweep is
    # resumed by its run dir)

    def __init__(self, options: MlmOptions, model_name: str | None):
        self.options, self.model_name = options, model_name

    def load(self, ckpt: CheckpointDir):
        return checkpoint.load_pretraining(ckpt), checkpoint.read_training_state(ckpt)

    def build(self, session: Session) -> tuple[Run, str]:
        config, resume, console, tree = session.config, session.resume, session.console, session.tree
        if session.dist.enabled:
            raise TformerError("tformer pretrain runs in one process; pass trainer.devices=1")
        train_texts, val_texts = pretraining_texts(config, self.options, console)
        texts = {"train": sources.texts_fingerprint(train_texts), "validation": sources.texts_fingerprint(val_texts)}
        if resume is not None:
            check_same_texts(resume, texts, config.resume_ignore_data_change, console)
        options, encoder = config.model_options, None
        max_len = window_length(config, tree, resume, console)
        if resume is not None:
            tok, pre = tokenization.load_tokenizer(resume.loaded.tokenizer_file, max_len), None
        elif options.pretrained:  # continued pretraining: the encoder, its tokenizer and (where saved) its MLM head
            encoder = pretrained.load_encoder(options.pretrained, options.pretrained_package, max_len)
            tok, pre = tokenization.load_tokenizer(encoder.tokenizer_file, max_len), None
        else:
            tok, pre = build_tokenizer_and_embeddings(config, train_texts)
        tokenization.configure(tok, max_len)  # (cut: the first max_len tokens; the saved tokenizer stays so)
        before_windows = resume is not None and "windows" not in (resume.config.get("mlm") or {})
        windows = self.options.windows and not before_windows
        if before_windows:  # its batches are cut texts, on this resume and every later one: the key stays out of
            tree.get("mlm", {}).pop("windows", None)  # the config it saves
            console.print(f"this run began before mlm.windows: it goes on reading each text's first {max_len} tokens",
                          highlight=False)
        encode = lambda texts: TokenizedSplit.from_ids(text_windows(tok, texts, max_len, windows))  # noqa: E731
        pad = tokenization.pad_id(tok)
        if resume is not None:
            model_cfg = EncoderConfig.from_dict(resume.loaded.model_config)
        elif encoder is not None:
            model_cfg = config.encoder_config(**encoder.shape, num_classes=2)
        else:
            model_cfg = config.encoder_config(  # (the masked LM reads token vectors: no static model's pairs)
                vocab_size=pre.weight.shape[0] if pre is not None else tok.get_vocab_size(), num_classes=2,
                embedding_dim=pre.weight.shape[1] if pre is not None else 0, pad_id=pad, pair_buckets=0,
                token_dropout=0.0)
        model = continued(model_cfg, encoder) if encoder is not None else MaskedLM(model_cfg)
        if resume is not None:  # where a continued encoder came from, in every checkpoint's meta
            chain = {k: resume.loaded.meta[k] for k in ("continued_from", "continued_sha256") if k in resume.loaded.meta}
        elif encoder is not None:
            chain = {"continued_from": f"{encoder.family} model {Path(encoder.source).resolve()}",
                     "continued_sha256": sha256_file(pretrained.weights_file(encoder.source))}
        else:
            chain = {}
        continued_from = chain.get("continued_from")
        if resume is not None:
            model.load_state_dict(resume.loaded.state)
        elif pre is not None:
            with torch.no_grad():
                model.encoder.token_embedding.weight.copy_(pre.weight)
        mask_id, specials = mlm_tokens(tok)
        objective = MaskedLanguageModeling(mask_id=mask_id, vocab_size=model_cfg.vocab_size,
                                           special_ids=specials, seed=config.seed, mask_prob=self.options.mask_prob,
                                           head_warmup_steps=self.options.head_warmup_steps)
        val_split, train_split = encode(val_texts), encode(train_texts)
        self.check_head_warmup(resume, len(train_split), config.trainer)
        read_as = (f"{len(train_split):,} windows of at most {max_len} tokens" if windows else
                   f"{len(train_split):,} texts cut at {max_len} tokens")
        metrics_log = JsonLines(session.run_dir.metrics_log)
        if resume is not None:
            metrics_log.truncate_after(resume.step)
        run = Run(model=model, train=train_split, validation=val_split, objective=objective, pad_id=pad,
                  device=session.device, precision=session.precision, trainer=config.trainer,
                  optimizer=config.optimizer, schedule=config.schedule,
                  save_checkpoint=self._saver(session, model, model_cfg, tok, {**chain, TEXTS: texts}),
                  resume=(resume.tensors, resume.state) if resume is not None else None, log_metrics=metrics_log)
        head = (encoder.mlm_head_note if encoder is not None else "the MLM head the run saved" if continued_from else
                "MLM head (output layer tied to the token table)")
        start = f"continued from the {markup(continued_from)}: " if continued_from else ""
        return run, (f"[bold]model[/] {start}{model_cfg.n_layers} layers, d_model {model_cfg.d_model}, vocabulary "
                     f"{model_cfg.vocab_size:,}, {sum(p.numel() for p in model.parameters()):,} parameters with "
                     f"{head}; texts read as {read_as}" + (
                         f"; the first {self.options.head_warmup_steps:,} steps train the head alone (mlm.head_warmup_"
                         f"steps), then the schedule starts again" if self.options.head_warmup_steps else ""))

    def check_head_warmup(self, resume, windows: int, trainer) -> None:
        """mlm.head_warmup_steps counts the run's optimizer steps from its first: a run that began without the key
        trained its encoder from step 0 and cannot freeze it now, and a warm-up as long as the run would train the
        head alone."""
        n = self.options.head_warmup_steps
        if n and resume is not None and "head_warmup_steps" not in (resume.config.get("mlm") or {}):
            raise TformerError(f"cannot resume {resume.run_dir} with mlm.head_warmup_steps={n}: the run began "
                               f"without a head warm-up (its encoder trained from the first step); drop the override")
        batches = -(-windows // trainer.batch_size)  # (BatchLoader's length)
        if n >= trainer.epochs * batches:
            raise ConfigError(f"mlm.head_warmup_steps={n} is at least the run's {trainer.epochs * batches:,} steps "
                              f"({trainer.epochs} epoch(s) of {batches:,} batches): the encoder would never train; "
                              f"give fewer steps (a tenth to a third of the run) or more epochs")

    @staticmethod
    def _saver(session: Session, model: MaskedLM, model_cfg: EncoderConfig, tok, chain: dict):
        """chain: where a continued encoder came from (`continued_from`) and its weights' sha256 (a fine-tune from
        this run names the chain, and refuses a preset of another model), and the texts' fingerprint (TEXTS), in
        every checkpoint's meta."""
        config_yaml, tokenizer_json = OmegaConf.to_yaml(OmegaConf.create(session.tree)), tok.to_str()

        def save(which: str, metrics: dict, training_state=None) -> None:
            checkpoint.save(session.run_dir.checkpoint(which), model, model_config=model_cfg.to_dict(),
                            tokenizer_json=tokenizer_json, label_names=[], config_yaml=config_yaml,
                            metrics=metrics, training_state=training_state,
                            meta={"kind": PRETRAINING, "epoch": metrics.get("epoch"), "step": metrics.get("step"),
                                  **chain})
        return save

    def report(self, session: Session, state: TrainingState) -> float:
        config, run_dir, console = session.config, session.run_dir, session.console
        report.print_history(state.history, console)  # (its pretraining columns; history.json: session.py)
        if state.history:  # the same plot as train's, of the masked-LM loss and masked-token accuracy
            training_curves_png(run_dir.training_curves, state.history, state.best_metrics.get("epoch"),
                                metric="mlm_", name="masked-LM ")
        best = state.best_metrics
        if best.get("epoch") is None:  # (every validation loss NaN: no token of the validation texts was masked)
            console.print(f"[bold yellow]no best checkpoint[/]: no epoch gave a validation MLM loss (no token of the "
                          f"validation texts was masked: mlm.mask_prob={self.options.mask_prob:g} is too small for "
                          f"them, or they are too short); the weights are in {markup(run_dir.last)}", highlight=False)
            return float("nan")
        same = [typed for key, _, typed in typed_overrides(session.overrides)
                if key in ("data", "data.dir", "model", "model.max_len", "model.pretrained", "seed",
                           "model.pretrained_package")]
        if self.model_name and not any(o.startswith("model=") for o in same):
            same.append(f"model={self.model_name}")  # (pretrain's default preset may not be train's)
        if not any(o.startswith("data=") for o in same):
            same.append(f"data={config.data.name}")
        init = override_value("model.init", str(run_dir))  # (pastes back: quoted for Hydra, then for the shell)
        command = shlex.join(["tformer", "train", f"model.init={init}", *same])
        console.print(f"best checkpoint: {markup(run_dir.best)} (epoch {best.get('epoch')}, val_mlm_loss "
                      f"{best.get('val_mlm_loss', float('nan')):.4f}); fine-tune it with: {markup(command)}",
                      highlight=False)
        return float(best.get("val_mlm_loss", float("nan")))


def window_length(config, tree: dict, resume, console) -> int:
    """model.max_len as a number: as given; `auto` (a pretrained encoder's presets) is the resumed run's own length,
    else the most max_len=auto may choose for the model (model.max_len_limit within its positions): windows have no
    length to fit to the texts. The number replaces `auto` in the config the run saves."""
    model = config.model
    if recipe.is_auto(model):
        if resume is not None:
            model["max_len"] = int(resume.loaded.model_config["max_len"])
        else:
            folder = pretrained.locate_model(config.model_options.pretrained, config.model_options.pretrained_package)
            model["max_len"] = recipe.usable_positions(folder, recipe.limit(model))
            console.print(f"[bold]windows[/] of {model['max_len']} tokens (model.max_len=auto: the model's "
                          f"max_len_limit within its positions; give model.max_len=<n> for another)", highlight=False)
        tree["model"]["max_len"] = model["max_len"]
    return int(model["max_len"])


TEXTS = "texts"  # meta.json: per split the count and SHA-256 of the texts pretrained on, compared on resume


def check_same_texts(resume, texts: dict, ignore: bool, console) -> None:
    """A resume on other texts (data.dir at another corpus, an mlm.extra_files file rewritten) would go on
    pretraining the encoder on them under the same run (resume.check_unchanged's rule)."""
    check_unchanged(resume.run_dir, resume.loaded.meta.get(TEXTS), texts, ignore, console, "texts",
                    "the pretraining", "the same texts")


def pretraining_texts(config, options: MlmOptions, console) -> tuple[list[str], list[str]]:
    """(train texts, validation texts): the data's texts and any unlabeled files. Labels are not learned from; data
    a classifier could read keeps the validation split it always had (carved stratified by its labels: the texts a
    run began with, which its resume compares), and data it could not (no label column, one class, label sets
    without data.multi_label) is read as texts alone, its validation split carved at random."""
    extra = [Path(f) for f in options.extra_files]  # (absolute: pretrain() resolved them)
    folder = sources.resolve_dir(config.data)
    unsupervised = folder / "unsupervised.parquet" if folder is not None else None
    if options.use_unsupervised and unsupervised and unsupervised.is_file():
        if unsupervised.resolve() in [p.resolve() for p in extra]:  # (read twice, as a file listed twice would be)
            raise ConfigError(f"mlm.extra_files lists {unsupervised}, which mlm.use_unsupervised=true reads already; "
                              f"drop it from the list, or set mlm.use_unsupervised=false")
        extra.append(unsupervised)
    try:
        data = sources.load(config.data, seed=config.seed)
    except TformerError:  # (what is wrong with the texts themselves is said again by the reading of texts alone)
        data = sources.load(config.data, seed=config.seed, texts_only=True)
    train, validation = list(data.splits["train"]["text"]), list(data.splits["validation"]["text"])
    for path in extra:
        train += sources.read_texts(path)
    if options.max_texts is not None and len(train) > options.max_texts:
        train = random.Random(config.seed).sample(train, options.max_texts)
    train = [t for t in train if t and t.strip()]
    console.print(f"[bold]texts[/] {len(train):,} to pretrain on ({markup(config.data.name)} train split"
                  + "".join(f" + {markup(p.name)}" for p in extra) + f"), {len(validation):,} to validate on",
                  highlight=False)
    return train, validation


def mlm_tokens(tok) -> tuple[int, list[int]]:
    """(mask id, the ids never masked nor drawn as a random replacement): the tokenizer's own mask token and
    special tokens ([CLS] [SEP] [PAD] or <s> </s> <pad> ...), by what tokenizer.json marks special, not by name.
    The unknown token stays maskable (as it always was: it stands for real text)."""
    layout = tokenization.special_layout(tok)
    if layout.mask is None:
        raise TformerError("the tokenizer has no mask token ([MASK] or <mask>) for masked-LM pretraining; add one "
                           "to its special tokens")
    mask_id = tok.token_to_id(layout.mask)
    unk = getattr(tok.model, "unk_token", None)
    keep = {mask_id, tok.token_to_id(unk) if unk else None}
    specials = set(layout.ids) | {tokenization.pad_id(tok)}
    return mask_id, sorted(specials - keep)


def text_windows(tok, texts: list[str], max_len: int, windows: bool) -> list[list[int]]:
    """Token ids to pretrain on: each text's first max_len tokens, or (windows) all of them, in consecutive windows
    of max_len tokens, each with the text's special tokens around its part ([CLS] part [SEP], <s> part </s>),
    sharing none (a mask draws from every token once per epoch).
    Only the ids are kept, a chunk of texts at a time (tokenization.encodings)."""
    layout = tokenization.special_layout(tok)
    before, after = layout.before, layout.after
    if windows and max_len < layout.count + 1:
        raise ConfigError(f"model.max_len={max_len} leaves no room for a token between the tokenizer's {layout.count} "
                          f"special tokens; pretrain with model.max_len >= {layout.count + 1}")
    if windows:
        tok = Tokenizer.from_str(tok.to_str())
        tok.no_truncation()
    width, out = max_len - layout.count, []
    for e in tokenization.encodings(tok, texts):
        ids = e.ids  # specials body specials
        if not windows:
            out.append(ids)
            continue
        head, body, tail = ids[:before], ids[before:len(ids) - after], ids[len(ids) - after:]
        out += [head + body[a:a + width] + tail for a in range(0, max(len(body), 1), width)]
    return out
