"""The classification job of the run engine (`tformer train`, the Python API, sweeps): data, tokenizer and encoder
(random, a pretrained table or encoder, a `tformer pretrain` run, or the resumed run's own), the `Run` with the
classification objective, and at the end the history, curves and the best checkpoint's test metrics."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from omegaconf import OmegaConf

from .. import timing
from ..console import output
from .. import checkpoint
from ..store.atomic import JsonLines, sha256_file, write_json
from .config import TrainConfig
from ..data import sanity, sources, tokenization
from ..data.tokenization import TokenizedSplit
from ..errors import ConfigError, TformerError
from ..evaluation import report
from ..evaluation.artifacts import training_curves_png
from ..hydra_setup import config_dir, group_defaults
from ..evaluation import calibration, conformal
from ..evaluation.evaluate import count, every_text_cuts, score_split, write_reports
from ..inference import logit_blocks
from ..model import pretrained
from ..model.encoder import CLASSIFIER_KEYS, EncoderConfig, TransformerClassifier, init_shape_keys
from ..model.mlm import encoder_state
from ..store.layout import PRETRAINING, CheckpointDir, RunDir, read_small
from ..tasks import TASKS
from ..store.locate import locate
from ..safe_text import markup
from ..training import distributed
from ..training.loop import Run
from ..training import recipe
from ..training.early_stopping import mode_for
from ..training.objectives import Classification
from ..training.state import TrainingState
from ..typed_config import typed_keys, typed_values
from .resume import check_same_data, resume_plan
from .session import Session, Trained, execute


def configure(tree: dict, overrides: list[str] | None = None) -> tuple[TrainConfig, dict]:
    """The typed config of a composed tree, with data locations made absolute in both (the saved config must
    find the data from any directory). Shared by the Hydra entry point and the Python API. overrides: the keys
    typed (a classifier's command, which may start from a pretraining run: `check_init_model`)."""
    if overrides is not None:
        check_init_model(tree, overrides)
    config = TrainConfig.from_dict(tree)
    if overrides is not None and "data.chunk_overlap" in typed_keys(overrides) and config.long_text.mode == "chunks" \
            and not tree.get("resume"):  # a new run's windows move on enough (a resume reads as the run began)
        config.long_text.overlap(int(recipe.numeric_max_len(config.model)))
    located = sources.absolute_locations(config.data)
    tree["data"].update(located)
    config.data = dataclasses.replace(config.data, **located)
    stopping, saved = config.trainer.early_stopping, tree["trainer"]["early_stopping"]
    if stopping.monitor == AUTO_MONITOR:  # (resolved in the saved tree too: a resume compares the metric chosen)
        stopping.monitor = saved["monitor"] = monitor_for(config.data.multi_label)
    stopping.mode = saved["mode"] = mode_for(stopping.monitor, stopping.mode)  # (auto: the metric's direction)
    return config, tree


AUTO_MONITOR = "auto"


def monitor_for(multi_label: bool) -> str:
    """What trainer.early_stopping.monitor=auto watches: validation accuracy; for multi-label data micro-F1, since
    exact-match accuracy (every label of a text right) can sit at 0 for epochs while the model learns."""
    return "val_f1" if multi_label else "val_accuracy"


def train(config: TrainConfig, run_dir: RunDir, tree: dict, overrides: list[str] = ()) -> Trained:
    """Train one run into `run_dir` (or continue the run named by config.resume); `tree` is the composed config
    as plain containers, saved with every checkpoint and compared on resume."""
    finished, resume_from = resume_plan(config.resume, run_dir, "train")
    if finished is not None:  # (a finished job of a resumed `-m` sweep: read, not retrained)
        return Trained(run_dir, finished)
    return execute(ClassifierJob(), config, tree, run_dir, overrides, resume_from)


class ClassifierJob:
    task, resumes_sweeps = "train", TASKS["train"].resumes_sweeps

    def load(self, ckpt: CheckpointDir):
        return checkpoint.load(ckpt), checkpoint.read_training_state(ckpt)

    def build(self, session: Session) -> tuple[Run, str]:
        writes = session.dist is None or session.dist.is_main
        prepared = prepare(session.config, session.resume, session.console,
                           session.run_dir.data_report if writes else None)
        session.prepared = prepared
        return build_run(session, prepared), f"[bold]model[/] {prepared.describe(session.config)}"

    def report(self, session: Session, state: TrainingState) -> float:
        report_run(session, state)
        if session.run_dir.test_metrics.is_file():
            session.logger.log_test(json.loads(session.run_dir.test_metrics.read_text()))
        return float(state.best_metrics["best_value"])


@dataclass
class Prepared:
    """The run's data, tokenizer and model, ready for the loop."""

    data: Any  # sources.LoadedData
    tokenizer: Any  # tokenizers.Tokenizer
    tokenized: dict  # split -> TokenizedSplit
    model: Any  # TransformerClassifier
    model_cfg: Any  # EncoderConfig
    embeddings_source: str | None  # where a pretrained table or encoder came from (None: random or resumed)
    data_fingerprint: dict  # sources.fingerprint: saved with every checkpoint, checked on resume
    cut_from_teacher: bool = False  # a distillation student that is its teacher with fewer blocks
    resumed: bool = False  # the weights are a resumed run's own

    @property
    def pad_id(self) -> int:
        return tokenization.pad_id(self.tokenizer)

    def describe(self, config: TrainConfig) -> str:
        c, options = self.model_cfg, config.model_options
        epochs, layers = freeze_plan(config)
        frozen = (f", frozen for {epochs} epoch(s)" + (f" with the lowest {layers} blocks" if layers else "")
                  if epochs else "")
        if self.resumed:
            source = "weights of the run being resumed"
        elif self.cut_from_teacher:
            source = f"started as {self.embeddings_source}"
        elif options.init and self.embeddings_source:
            source = f"encoder from the {self.embeddings_source}"
        elif self.embeddings_source and not (options.pretrained or config.embedding_init.pretrained):
            source = f"embeddings from {self.embeddings_source}"  # a table prepare() was given (a teacher's)
        else:
            source = ("encoder" if options.pretrained else f"embeddings {config.embedding_init.name}") + \
                (f" pretrained, from {self.embeddings_source}" if self.embeddings_source else "")
        return (f"{self.model.num_parameters():,} parameters ({c.n_layers} layers, d_model {c.d_model}, {c.n_heads} "
                f"heads, {c.positions} positions, {c.norm}-norm, {c.pooling} pooling"
                + (f", {c.pair_buckets:,} buckets of token pairs" if c.pair_buckets else "") + f"); {source}{frozen}"
                + (f"; layer-wise lr decay {options.layer_lr_decay}" if options.layer_lr_decay != 1.0 else ""))


@dataclass
class TeacherLayers:
    """A distillation student that starts as its teacher with fewer blocks (runs/distill.py: distill.layers): the
    teacher's model config with its n_layers, its weights with the kept blocks renumbered, and its tokenizer."""

    model_config: dict
    state: dict
    tokenizer_file: Any  # Path
    source: str


def prepare(config: TrainConfig, resume, console, data_report=None, table=None,
            student: TeacherLayers | None = None) -> Prepared:
    """Data (checked by data/sanity.py, its report saved at `data_report` unless None), tokenizer (the run's own
    when resuming) and model (built, or the checkpoint's, checked on load). table: a token table and its tokenizer
    (pretrained.PretrainedEmbeddings) to start from instead of embedding_init's (a distillation teacher's);
    student: a distillation student cut from its teacher, which brings its own tokenizer, length and weights."""
    with timing.phase("load"):
        # (a resumed run keeps the splits it began with: one left out then is left out again, its fingerprint compared)
        data = sources.load(config.data, seed=config.seed, unlabelled_files="refuse" if resume is None else "drop")
    console.print(f"[bold]data[/] {markup(config.data.name)} from {markup(data.source)}: " + ", ".join(
        f"{s} {len(ds):,}" for s, ds in data.splits.items()) + f"; {len(data.label_names)} classes")
    with timing.phase("checks"):
        fingerprint = sources.fingerprint(data)
        if resume is not None:
            check_same_data(resume.run_dir, resume.loaded.meta.get("data"), resume.loaded.label_names, fingerprint,
                            config.resume_ignore_data_change, console)
        sanity.check(data, data_report)
    with timing.phase("vocabulary"):
        tok, pre, encoder, init, max_len = tokenizer_for(config, data, resume, console, table, student)
    with timing.phase("tokenize"):
        tokenization.configure(tok, max_len, config.data.truncation, config.long_text)
        tokenized = {s: TokenizedSplit.from_dataset(tokenization.tokenize_split(ds, tok, max_len, s, config.long_text))
                     for s, ds in data.splits.items()}
    if resume is not None:
        model, model_cfg = resume.loaded.model, EncoderConfig.from_dict(resume.loaded.model_config)
        return Prepared(data, tok, tokenized, model, model_cfg, None, fingerprint, resumed=True)
    if init is not None:
        return _from_pretraining(config, init, data, tok, tokenized, fingerprint, console)
    if student is not None:
        return _cut_from_teacher(config, student, data, tok, tokenized, fingerprint)
    if encoder is not None:
        model_cfg = config.encoder_config(**encoder.shape, num_classes=len(data.label_names),
                                          multi_label=config.data.multi_label)
        model = TransformerClassifier(model_cfg)
        pretrained.load_into(model, encoder)
        return Prepared(data, tok, tokenized, model, model_cfg, f"{encoder.family} model {encoder.source}", fingerprint)
    model_cfg = config.encoder_config(
        vocab_size=pre.weight.shape[0] if pre is not None else tok.get_vocab_size(),
        num_classes=len(data.label_names), embedding_dim=pre.weight.shape[1] if pre is not None else 0,
        pad_id=tokenization.pad_id(tok), multi_label=config.data.multi_label)
    model = TransformerClassifier(model_cfg)
    if pre is not None:
        with torch.no_grad():
            model.token_embedding.weight.copy_(pre.weight)
    return Prepared(data, tok, tokenized, model, model_cfg, pre.source if pre is not None else None, fingerprint)


def tokenizer_for(config: TrainConfig, data, resume, console, table=None, student: TeacherLayers | None = None):
    """(tokenizer, a pretrained token table, a pretrained encoder, a pretraining run to start from (each or None),
    max_len): the
    resumed run's tokenizer, a pretraining run's, a pretrained encoder's, or one learned from the train texts
    (with embedding_init's table when it has one); model.max_len=auto fitted with it (training/recipe.py)."""
    if student is not None:  # the teacher's tokenizer and length (runs/distill.py puts it in the config)
        max_len = int(student.model_config["max_len"])
        return tokenization.load_tokenizer(student.tokenizer_file, max_len), None, None, None, max_len
    options, train = config.model_options, data.splits["train"]
    (max_len, fit_later), pre, encoder, init = recipe.planned_max_len(config, train, resume, console), None, \
        None, None
    if resume is not None:
        tok = tokenization.load_tokenizer(resume.loaded.tokenizer_file, max_len)
    elif options.init:
        init = checkpoint.load_pretraining(options.init, key="model.init")
        tok = tokenization.load_tokenizer(init.tokenizer_file, max_len)
    elif options.pretrained:
        encoder = pretrained.load_encoder(options.pretrained, options.pretrained_package, max_len)
        tok = tokenization.load_tokenizer(encoder.tokenizer_file, max_len)
    else:
        tok, pre = build_tokenizer_and_embeddings(config, train, table)
        if pre is None:  # learned from the texts: under DDP, rank 0's (WordPiece training is not reproducible
            tok = distributed.same_tokenizer(tok, max_len)  # across processes when merges tie)
    if fit_later:  # model.max_len=auto, fitted with the tokenizer just built (training/recipe.py)
        max_len = recipe.fit_max_len(config, tok, train, init, console)
    return tok, pre, encoder, init, max_len


def freeze_plan(config: TrainConfig) -> tuple[int, int]:
    """(epochs, lower blocks) to freeze: a whole pretrained encoder's model.freeze_*, else a pretrained
    embedding table's embedding_init.freeze_epochs (the table alone)."""
    options, emb = config.model_options, config.embedding_init
    if options.pretrained or options.freeze_epochs:
        return options.freeze_epochs, options.freeze_layers
    return (emb.freeze_epochs, 0) if emb.pretrained else (0, 0)


# A classifier started from a saved encoder (a `tformer pretrain` run, a teacher cut by distill.layers) keeps its
# shape; these come from the classifier's own model config (the head, pooling, regularisation, the length it reads).
_FROM_CLASSIFIER = CLASSIFIER_KEYS


def _as_classifier(config: TrainConfig, encoder_config: dict, data) -> dict:
    """A saved encoder's model config (a pretraining run's, a teacher's) with the classifier keys of this run:
    _FROM_CLASSIFIER from its model config, and the data's classes."""
    c = encoder_config
    mine = config.encoder_config(vocab_size=int(c["vocab_size"]), num_classes=len(data.label_names),
                                 multi_label=config.data.multi_label, pad_id=int(c["pad_id"]),
                                 embedding_dim=int(c.get("embedding_dim") or 0))
    return {**c, **{k: getattr(mine, k) for k in _FROM_CLASSIFIER}, "num_classes": mine.num_classes,
            "multi_label": mine.multi_label}


def _from_pretraining(config: TrainConfig, init, data, tok, tokenized, fingerprint, console) -> Prepared:
    """The classifier whose encoder is the pretraining run's (weights copied key for key; the head is new)."""
    saved = yaml.safe_load(init.files.config.read_text()) if init.files.config.is_file() else {}
    if (saved.get("data") or {}).get("name") == config.data.name and saved.get("seed") != config.seed:
        raise TformerError(f"model.init: the pretraining run split {config.data.name} with seed={saved.get('seed')}; "
                           f"with seed={config.seed} the validation (and a carved test) split would hold texts it "
                           f"pretrained on: pass seed={saved.get('seed')}")
    merged = _as_classifier(config, init.model_config, data)
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
    new = lambda k: k.startswith("head.") or k == "pair_embedding.weight"  # noqa: E731  (a static model's pairs: 0)
    if unexpected or any(not new(k) for k in missing):
        raise TformerError(f"the pretraining run {init.files.path} does not fit this encoder (missing "
                           f"{[k for k in missing if not new(k)][:3]}, unexpected {unexpected[:3]})")
    source = f"pretraining run {init.files.path.parent.parent}"
    if init.meta.get("continued_from"):  # the chain: a pretrained encoder, pretrained further on the task's text
        source += f", continued from the {init.meta['continued_from']}"
    console.print(f"[bold]encoder[/] from {markup(source)} ({model_cfg.n_layers} layers, d_model {model_cfg.d_model}, "
                  f"its tokenizer); a new {model_cfg.num_classes}-way head", highlight=False)
    return Prepared(data, tok, tokenized, model, model_cfg, source, fingerprint)


def check_init_model(tree: dict, overrides) -> None:
    """model.init=<pretraining run> typed: the classifier is that run's encoder (its shape, its weights), so what
    the command line says of the model must not contradict it, or the run would record a model it never built. A
    typed shape key (model.d_model=128 over a 256-wide run) is refused in one line; so is a typed preset or
    model.pretrained that names another model than the run began from (roberta-base over a run continued from
    MiniLM, a from-scratch preset over a continued run, a pretrained one over a from-scratch run). The same model in
    another folder passes (its weights' sha256). The preset's own shape keys are defaults the run's shape replaces.
    Not checked on a resume (the run was checked when it began) nor when the run cannot be read (load_pretraining
    then says what it is)."""
    typed = typed_keys(overrides)
    init = (tree.get("model") or {}).get("init")
    if not init or "model.init" not in typed or tree.get("resume"):
        return
    try:
        ckpt = locate(str(init))
        encoder, meta = json.loads(read_small(ckpt.model_config)), json.loads(read_small(ckpt.meta))
        saved = checkpoint.read_config(ckpt) if ckpt.config.is_file() else None
    except (TformerError, OSError, ValueError):
        return
    if not isinstance(encoder, dict) or not isinstance(meta, dict) or meta.get("kind") != PRETRAINING:
        return
    model, begun = tree["model"], meta.get("continued_from")
    what = f"an encoder of {encoder.get('n_layers')} layers, d_model {encoder.get('d_model')}, " + (
        f"continued from the {begun}" if begun else "pretrained from scratch")
    for k in [k for k in model if f"model.{k}" in typed and k in encoder and k not in _FROM_CLASSIFIER]:
        if model[k] != encoder[k]:
            raise ConfigError(f"model.init={init} is {what} ({k}={encoder[k]}), but model.{k}={model[k]} is typed; "
                              f"a classifier started from it keeps that encoder: drop model.{k}=")
    mine = model.get("pretrained")
    theirs = ((saved or {}).get("model") or {}).get("pretrained") if isinstance(saved, dict) else None
    if not {"model", "model.pretrained"} & set(typed):
        if begun and not mine:  # (the default preset: a from-scratch recipe, lr 1e-3, would undo the pretraining)
            raise ConfigError(f"model.init={init} is {what}; without a model= preset it would be fine-tuned with the "
                              f"default from-scratch recipe: add {_preset_of(theirs)}, the preset it was pretrained "
                              f"with")
        return
    preset = (typed_values(overrides, "model") or [""])[-1]
    said = "model.pretrained" if "model.pretrained" in typed else f"model={preset}"
    if not mine and not begun or mine and begun and (mine == theirs or _same_weights(model, meta)):
        return
    names = f"names {mine}" if mine else "is a model trained from scratch"
    raise ConfigError(f"model.init={init} is {what}, but {said} {names}; a classifier started from it keeps that "
                      f"encoder: pass the model= preset the pretraining run used, or drop {said.split('=')[0]}=")


def _preset_of(name) -> str:
    """The model= preset of a pretrained model's name (model=minilm_l6 for all-MiniLM-L6-v2), else the generic
    preset with the name."""
    folder = Path(config_dir()) / "model"
    for option in sorted(p.stem for p in folder.glob("*.yaml") if not p.stem.startswith("_")):
        if name and group_defaults("model", option).get("pretrained") == name:
            return f"model={option}"
    return f"model=pretrained model.pretrained={name}"


def _same_weights(model: dict, meta: dict) -> bool:
    """Whether the `pretrained` model named here is the one the pretraining run continued: its weights file's
    sha256 (the same model in another folder or venv passes), where it is on this machine (never downloaded)."""
    weights = meta.get("continued_sha256")
    if not model.get("pretrained") or not isinstance(weights, str):
        return False
    folder = pretrained.local_model(model["pretrained"], model.get("pretrained_package"))
    return folder is not None and sha256_file(pretrained.weights_file(folder)) == weights


def _cut_from_teacher(config: TrainConfig, student: TeacherLayers, data, tok, tokenized, fingerprint) -> Prepared:
    """The student that is its teacher with fewer blocks: the teacher's shape, length and weights; pooling, head
    width and dropout from this run's model config (the head is copied when its shape is the teacher's)."""
    model_cfg = EncoderConfig.from_dict(_as_classifier(config, student.model_config, data))  # (max_len: the
    model = TransformerClassifier(model_cfg)  # teacher's, which runs/distill.py puts in the config)
    ours = model.state_dict()
    missing, _ = model.load_state_dict({k: v for k, v in student.state.items()
                                        if k in ours and ours[k].shape == v.shape}, strict=False)
    if any(not k.startswith("head.") for k in missing):  # (the same shape as the teacher's: never)
        raise TformerError(f"distill.layers: {student.source} does not fit the student (missing {missing[:3]})")
    return Prepared(data, tok, tokenized, model, model_cfg, student.source, fingerprint, cut_from_teacher=True)


def build_tokenizer_and_embeddings(config: TrainConfig, train, table=None):
    """(tokenizer, pretrained weight or None) for the chosen embedding_init, or for `table` when given. train: the
    train split (a datasets.Dataset, its vocabulary learned from a sample when it is big) or a list of texts."""
    emb, max_len = config.embedding_init, int(config.model["max_len"])
    if table is not None:
        return tokenization.load_tokenizer(table.tokenizer_file, max_len), table
    if not emb.pretrained:
        texts, sampled, rows = tokenization.vocabulary_sample(train, config.seed) if hasattr(train, "select") \
            else (train, len(train), len(train))
        if sampled < rows:
            output().print(f"[bold]vocabulary[/] learned from a seeded sample of {sampled:,} of the {rows:,} train texts "
                           f"(about {tokenization.VOCABULARY_CHARS // 1_000_000:,} million characters)", highlight=False)
        return tokenization.train_wordpiece(texts, int(emb.vocab_size), max_len, total=sampled), None
    pre = pretrained.load(emb, int(config.model["d_model"]))
    return tokenization.load_tokenizer(pre.tokenizer_file, max_len), pre


def build_run(session: Session, prepared: Prepared, objective=None, train: TokenizedSplit | None = None,
              meta: dict | None = None) -> Run:
    """The loop's Run of a classifier: classification on the train split, unless a job gives its own objective
    and train split (distillation: the teacher's logits, and unlabeled texts too) and `meta` for its checkpoints."""
    config, run_dir, resume = session.config, session.run_dir, session.resume
    train = train if train is not None else prepared.tokenized["train"]
    if recipe.said_auto(config.trainer.epochs):  # (a resume took the run's own number: session.load_resume)
        epochs, why = recipe.auto_epochs(len(train), config.trainer.batch_size, prepared.model_cfg.multi_label)
        config.trainer.epochs = session.tree["trainer"]["epochs"] = epochs  # saved as the number
        session.console.print(f"[bold]epochs[/] {epochs} (trainer.epochs=auto: {why})", highlight=False)
    if recipe.said_auto(config.optimizer.lr):  # (a resume took the run's own number: session.load_resume)
        lengths = recipe.token_lengths(prepared.tokenizer, prepared.data.splits["train"], seed=config.seed)  # uncut
        lr, why = recipe.auto_lr(config.model_options, lengths, prepared.model_cfg.multi_label)
        config.optimizer.lr = session.tree["optimizer"]["lr"] = lr  # saved as the number
        session.console.print(f"[bold]lr[/] {lr:g} (optimizer.lr=auto: {why})", highlight=False)
    if config.model_options.init:  # the pretraining run's encoder was built, not the preset's shape: saved as built
        built = prepared.model_cfg.to_dict()
        session.tree["model"].update({k: built[k] for k in init_shape_keys() if k in session.tree["model"]})
    config_yaml = OmegaConf.to_yaml(OmegaConf.create(session.tree))
    tokenizer_json = prepared.tokenizer.to_str()
    model_config, label_names = prepared.model_cfg.to_dict(), prepared.data.label_names

    def save(which: str, metrics: dict, training_state=None) -> None:
        checkpoint.save(run_dir.checkpoint(which), prepared.model, model_config=model_config,
                        tokenizer_json=tokenizer_json, label_names=label_names, config_yaml=config_yaml,
                        metrics=metrics, meta={"epoch": metrics.get("epoch"), "step": metrics.get("step"),
                                               "data": prepared.data_fingerprint, **config.long_text.to_meta(),
                                               **(meta or {}),
                                               **({"thresholds": metrics.get("thresholds")}
                                                  if prepared.model_cfg.multi_label else {})},
                        training_state=training_state)

    metrics_log = JsonLines(run_dir.metrics_log)
    if resume is not None:
        metrics_log.truncate_after(resume.step)  # what came after the checkpoint is trained (and logged) again
    freeze_epochs, freeze_layers = freeze_plan(config)
    if objective is None:
        objective = Classification(label_names, class_weights_of(session, prepared), config.loss.label_smoothing)
    return Run(model=prepared.model, train=train,
               validation=prepared.tokenized["validation"],
               objective=objective, pad_id=prepared.pad_id, device=session.device, precision=session.precision,
               trainer=config.trainer, optimizer=config.optimizer, schedule=config.schedule, save_checkpoint=save,
               freeze_epochs=freeze_epochs, freeze_layers=freeze_layers,
               embedding_lr_multiplier=config.embedding_init.lr_multiplier,
               layer_lr_decay=config.model_options.layer_lr_decay,
               resume=(resume.tensors, resume.state) if resume is not None else None, log_metrics=metrics_log)


def report_run(session: Session, state: TrainingState) -> None:
    """Training curves, calibration, and the best checkpoint's metrics and reports on the test split (history.json,
    the run's finished mark, is written after these: session.py)."""
    config, run_dir, console, prepared = session.config, session.run_dir, session.console, session.prepared
    report.print_history(state.history, console)
    with timing.phase("reports"):  # (history.json, the run's finished mark, is written after these: session.py)
        if state.history:
            training_curves_png(run_dir.training_curves, state.history, state.best_metrics.get("epoch"))
    best = state.best_metrics
    console.print(f"best checkpoint: {markup(run_dir.best)} (epoch {best.get('epoch')}, {markup(best['monitor'])} "
                  f"{best['best_value']:.4f})", highlight=False)
    with timing.phase("calibrate"):
        loaded = calibrate(session)
    test = prepared.tokenized.get("test")
    if not config.trainer.test_after_fit or test is None:
        return
    with timing.phase("test"):
        scored = score_split(loaded.model, test, loaded.label_names, pad_id=prepared.pad_id, device=session.device,
                             precision=session.precision, batch_size=config.trainer.eval_batch_size,
                             thresholds=loaded.thresholds, temperature=loaded.temperature,
                             label_sets=loaded.conformal)
    title = f"test ({count(test)}; best checkpoint)"
    with timing.phase("test reports"):
        report.print_metrics(scored.metrics, loaded.label_names, title, console)
        write_json(run_dir.test_metrics, scored.metrics)
        write_reports(run_dir.test_report, scored, loaded.label_names, prepared.data.splits["test"], True, title,
                      console)


def calibrate(session: Session) -> checkpoint.Loaded:
    """Temperature scaling of the best checkpoint (trainer.calibrate, evaluation/calibration.py): T fitted on the
    validation split's logits and saved in `best`'s meta.json, with a multi-label model's thresholds moved to the
    calibrated scale (the same cut on the logits: no predicted label changes). After the best checkpoint is
    chosen, so a resumed or extended run fits again for whichever model is best now; with trainer.calibrate=false
    a temperature an earlier fit saved is removed (and the thresholds moved back). Returns the best checkpoint."""
    config, run_dir, console, prepared = session.config, session.run_dir, session.console, session.prepared
    loaded = checkpoint.load(run_dir.best, session.device)
    multi = bool(loaded.model.cfg.multi_label)
    if not config.trainer.calibrate:
        if loaded.temperature is None:
            return loaded
        checkpoint.update_meta(run_dir.best, {"temperature": None, "conformal": None, **(
            {"thresholds": calibration.rescaled_thresholds(loaded.thresholds, None, loaded.temperature)}
            if multi else {})})
        console.print("calibration: off (trainer.calibrate=false); the earlier temperature and label-set cuts are "
                      "removed", highlight=False)
        return checkpoint.load(run_dir.best, session.device)
    validation = prepared.tokenized["validation"]
    fitted_on = calibration.fit_rows(validation.n_docs, len(loaded.label_names), config.seed, multi)
    logits = sampled_logits(loaded.model, validation, fitted_on, batch_size=config.trainer.eval_batch_size,
                            pad_id=prepared.pad_id, device=session.device, precision=session.precision)
    y = validation.doc_labels.numpy()
    y = y if fitted_on is None else y[fitted_on]
    every_text = None if fitted_on is None else every_text_cuts(
        loaded.model, validation, multi, config.seed,
        calibration.cut_rows(validation.n_docs, len(loaded.label_names), config.seed, multi), pad_id=prepared.pad_id,
        device=session.device, precision=session.precision, batch_size=config.trainer.eval_batch_size)
    changes = calibration.fitted(logits, y, multi, config.seed, loaded.thresholds, loaded.temperature,
                                 every_text=every_text)
    temperature, sets = changes["temperature"], changes["conformal"]
    checkpoint.update_meta(run_dir.best, changes)
    before, after = (calibration.ece(calibration.probabilities(logits, t, multi), y, multi)
                     for t in (None, temperature))
    edge = calibration.at_the_edge(temperature) + calibration.kept_note(logits, y, multi, config.seed,
                                                                         every_text is not None)
    sample = "" if fitted_on is None else (f" (the temperature and ECE on a seeded sample of {len(fitted_on):,} of "
                                           f"the {validation.n_docs:,} validation texts: "
                                           f"{len(loaded.label_names):,} classes)")
    console.print(f"calibration: temperature {calibration.describe(temperature)}{edge}; validation ECE {before:.4f} -> "
                  f"{after:.4f}{sample} (saved in {markup(run_dir.best)})", highlight=False)
    at = sets["cuts"][conformal.key(conformal.DEFAULT_LEVEL)]
    half = " (the half the per-label temperatures were not fitted on)" if multi else ""
    console.print(f"label sets: conformal cuts ({sets['method']}) for the levels 0.50 to 0.99 fitted on "
                  f"{sets['n']:,} validation texts{half}; at 0.90 the cut is "
                  f"{'every label (too few texts)' if at is None else f'{at:.4f}'} (predict --coverage 0.9)",
                  highlight=False)
    if (few := conformal.too_few(sets)) is not None:
        console.print(f"[yellow]warning:[/] {few}", highlight=False)
    return checkpoint.load(run_dir.best, session.device)


def sampled_logits(model, split: TokenizedSplit, rows, each=None, **kwargs) -> np.ndarray:
    """The document logits (float32) of the rows `rows` of a split (None: every row), in that order, from one pass
    that keeps only them. `each(index, logits)` sees every block of the pass as evaluation's scoring does (all
    rows, in the order batches run), for counts that must match what `tformer evaluate` reports."""
    n = split.n_docs if rows is None else len(rows)
    where = np.arange(split.n_docs) if rows is None else np.full(split.n_docs, -1, dtype=np.int64)
    if rows is not None:
        where[rows] = np.arange(len(rows))
    out = np.zeros((n, model.cfg.num_classes), dtype=np.float32)
    for index, logits in logit_blocks(model, split, progress="calibrating", **kwargs):
        if each is not None:
            each(index.numpy(), logits.numpy())
        at = where[index.numpy()]
        keep = at >= 0
        out[at[keep]] = logits.numpy()[keep]
    return out


def class_weights_of(session: Session, prepared: Prepared) -> torch.Tensor | None:
    """loss.class_weights of the labelled train split, on the run's device (None: unweighted)."""
    labels, mode = prepared.tokenized["train"].labels, session.config.loss.class_weights
    weight = class_weights(labels, len(prepared.data.label_names), mode)
    if weight is not None and labels.dim() == 2:
        session.console.print(f"[bold]loss[/] each label's positives weighted sqrt(negatives / positives): "
                              f"{float(weight.min()):.2f} .. {float(weight.max()):.2f} (loss.class_weights={mode}; "
                              f"null: unweighted)", highlight=False)
    return weight.to(session.device) if weight is not None else None


def class_weights(labels, num_classes: int, mode: str | None):
    """'balanced': n / (k * count_c), scikit-learn's inverse-frequency weights; for multi-label data the weight of
    each label's positives, sqrt(negatives / positives) (BCE's pos_weight: a label on 0.2% of the texts has its
    positives counted 22 times, not 500); 'auto': balanced for multi-label data, unweighted for single-label (on
    GoEmotions the weights, with the logits adjusted in the loss (inference.weighted_bce), lifted test macro-F1 from
    0.513 to 0.525 at micro-F1 0.600 -> 0.597; single-label figures in the docs are unweighted); None: unweighted."""
    if mode == "auto":
        mode = "balanced" if labels.dim() == 2 else None
    if not mode:
        return None
    if mode != "balanced":
        raise TformerError(f"loss.class_weights={mode} must be auto, null or balanced")
    if labels.dim() == 2:
        positives = labels.sum(0).float()  # (summed as integers: no float copy of the split)
        return ((len(labels) - positives).clamp(min=1) / positives.clamp(min=1)).sqrt()
    counts = torch.bincount(labels, minlength=num_classes).float().clamp(min=1)
    return counts.sum() / (num_classes * counts)
