"""The distillation job of the run engine (`tformer distill`): a student (any model preset, usually a small fast one)
learns from a trained classifier, the teacher, in the same run directories, loop, checkpoints, Ctrl-C and `resume=`
as `train`, and ends as an ordinary classifier checkpoint (evaluate, predict, export, serve and push read it as any).

What the student learns from (`Distillation`, below): the teacher's probabilities, softened by a
temperature, on every training text, mixed with the given labels where a text has one. The texts are the data's
train split plus any unlabeled texts (distill.unlabeled: files, or a split such as IMDB's `unsupervised`), which is
where distillation gains most: the teacher labels texts nobody labelled. Unlabeled texts that are copies of the
data's own texts are dropped, so validation and test scores stay honest.

The teacher runs once per (teacher weights, texts), reading each text as it was trained to (its own tokenizer,
max_len and long-text reading), and its logits are kept in a cache (store/layout.py: `TeacherCache`) shared by every
student of that teacher on those texts: a sweep over students, or a resumed run, never runs the teacher again.

By default a from-scratch student reads with the teacher's tokenizer and starts from the teacher's token table
(projected to the student's width when they differ): `distill.embeddings`. With `distill.layers=[0,2,4]` the student
is the teacher itself with only those blocks (DistilBERT's initialisation, Sanh et al. 2019): its tokenizer,
embeddings, the chosen blocks in order and its head are copied, so it starts close to the teacher's answers.

Beyond the logits, a student can match two things of the teacher: how it relates the texts of a batch
(distill.relations: pooled vectors, cached with the logits) and how its last attention layer relates the tokens of
a text (distill.attention: queries, keys and values per token, too many to cache, so the teacher runs on each batch
beside the student, which must read the same tokens). Both compare relations, so any student width works without
a learned projection.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

import datasets
import safetensors.torch
import torch
import torch.nn.functional as F

from ..data import sanity, sources, tokenization
from ..data.tokenization import LongText, TokenizedSplit
from ..errors import ConfigError, TformerError
from ..hydra_setup import group_defaults
from ..console import progress
from ..inference import logit_blocks, weighted_bce
from ..model import pretrained
from ..safe_text import markup
from .. import checkpoint
from ..store.atomic import sha256_file, write_json, write_with
from ..store.layout import DISTILLED_FROM, TEACHER_WEIGHTS, CheckpointDir, RunDir, TeacherCache, read_small
from ..tasks import TASKS
from ..store.locate import locate
from ..store.mapped import ShardedRows, mapped_safetensors
from ..training.loop import Interrupted, Optimization, Run, sliced_update
from ..training.objectives import Classification
from ..typed_config import build, typed_keys
from .classify import ClassifierJob, Prepared, TeacherLayers, build_run, class_weights_of, configure, prepare
from .resume import check_unchanged, resume_plan
from .session import Session, Trained, execute

EMBEDDINGS = ("auto", "teacher", "own")
SHARD_TEXTS = 2048  # texts per cache shard: what an interrupted teacher pass can lose at most


@dataclass
class DistillOptions:
    """The `distill:` keys of configs/distill.yaml (their defaults and comments live there)."""

    temperature: float
    alpha: float
    unlabeled: list
    max_unlabeled: int | None
    embeddings: str
    cache_dir: str
    batch_size: int
    layers: list | None = None
    relations: float = 0.0
    attention: float = 0.0
    attention_heads: int | None = None

    # temperature: Hinton et al. use 1..20; far outside 0.1..100 the softened probabilities are all equal (or one-hot)
    # and the T²-scaled loss over- or underflows (1e30 ended in NaN)
    RANGES = {"temperature": (0.1, 100, "[]"), "alpha": (0, 1, "[]"), "max_unlabeled": (1, None, "[)"),
              "batch_size": (1, 1 << 20, "[]"), "relations": (0, 1000, "[]"),
              "attention": (0, 1000, "[]"), "attention_heads": (1, 1 << 16, "[]")}


def options_of(tree: dict) -> DistillOptions:
    options = build(DistillOptions, tree.get("distill") or {}, "distill")
    if options.embeddings not in EMBEDDINGS:
        raise ConfigError(f"distill.embeddings={options.embeddings} is not one of {', '.join(EMBEDDINGS)}")
    options.unlabeled = [str(u) for u in options.unlabeled]
    layers = options.layers
    if layers is not None and (not isinstance(layers, list) or not layers or any(
            isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in layers) or layers != sorted(set(layers))):
        raise ConfigError(f"distill.layers={layers!r} must list the teacher's blocks to keep, lowest first, each once "
                          f"(0 = the lowest), e.g. distill.layers=[0,2,4]; or null for the model= preset's student")
    return options


def distill(tree: dict, run_dir: RunDir, overrides=()) -> Trained:
    """Distill into run_dir (or continue the run named by resume=): where the run was written and the monitored
    metric's best value. Without data=<name> the student reads the teacher's data (its saved data config;
    data.<key>= still applies)."""
    tree = copy.deepcopy(tree)
    options = options_of(tree)
    teacher = find_teacher(tree.get("teacher"))
    tree["teacher"] = str(teacher.path.resolve()) if not str(tree["teacher"]).startswith("hf://") else tree["teacher"]
    options.cache_dir = tree["distill"]["cache_dir"] = str(Path(options.cache_dir).expanduser().resolve())
    tree = with_teacher_data(tree, list(overrides), teacher)
    if options.layers is not None:
        tree = with_teacher_model(tree, list(overrides), teacher, options.layers)
    config, located = configure({k: v for k, v in tree.items() if k not in ("teacher", "distill")}, list(overrides))
    tree.update(located)
    if options.layers is None:
        teacher_table(options, config)  # (refuses a conflict now, before any data is read)
    finished, resume_from = resume_plan(config.resume, run_dir, "distill")
    if finished is not None:  # (a finished job of a resumed `-m` sweep: read, not retrained)
        return Trained(run_dir, finished)
    return execute(DistillJob(options, teacher), config, tree, run_dir, overrides, resume_from)


def find_teacher(ref) -> CheckpointDir:
    """The teacher's checkpoint: a run dir (its best), a checkpoint dir or hf://owner/name; a classifier."""
    if not ref:
        raise ConfigError("tformer distill needs teacher=<run dir> (a trained classifier: tformer train, or "
                          "hf://owner/name)")
    found = locate(str(ref), key="teacher")
    if found.task() == "pretrain":
        raise TformerError(f"teacher={ref} is a `tformer pretrain` run (a masked-LM encoder, no classes); a teacher is "
                           f"a trained classifier: tformer train ... model.init={ref}, then distill from that run")
    return found


def with_teacher_data(tree: dict, overrides: list[str], teacher: CheckpointDir) -> dict:
    """The composed tree with the teacher's data config where no data=<name> was given (data.<key>= overrides typed
    on the command line still apply on top of it)."""
    keys = typed_keys(overrides)
    if "data" in keys:
        return tree
    saved = checkpoint.read_config(teacher) if teacher.config.is_file() else None
    if not isinstance(saved, dict) or not isinstance(saved.get("data"), dict):
        raise ConfigError(f"teacher {teacher} has no saved config to say which data it was trained on; pass "
                          f"data=<name> (or data=files data.train_file=...)")
    # (keys the teacher's tformer did not save yet: the defaults it trained with, as evaluate completes them)
    older = {k: v for k, v in group_defaults("data").items() if k not in saved["data"] and "${" not in str(v)}
    tree["data"] = with_typed({**older, **saved["data"]}, tree, keys, "data")
    return tree


def with_typed(section: dict, tree: dict, keys: list[str], name: str) -> dict:
    """A section of the teacher's saved config with the `name.<key>=` values typed on this command line on top."""
    typed = {k.split(".", 1)[1]: tree[name][k.split(".", 1)[1]] for k in keys
             if k.startswith(f"{name}.") and k.split(".", 1)[1] in tree[name]}
    return {**section, **typed}


# What a student cut from its teacher cannot take: it has the teacher's tokenizer, table, shape and length; of the
# model keys it takes only its own head, regularisation and recipe.
_NOT_WITH_LAYERS = ("distill.embeddings", "embedding_init", "model.init", "model.pretrained", "model.max_len")
_MODEL_KEYS_WITH_LAYERS = ("pooling", "head_hidden", "dropout", "attention_dropout", "recommended_lr", "lr_texts",
                           "lr_short_texts", "layer_lr_decay", "freeze_epochs", "freeze_layers")


def with_teacher_model(tree: dict, overrides: list[str], teacher: CheckpointDir, layers: list[int]) -> dict:
    """distill.layers: the student trains with the teacher's model config and learning rate (its recipe: layer-wise
    decay, pooling, dropout...; no freezing) unless model=<preset> or optimizer.lr is typed; model.<key>= overrides
    of the classifier's own keys apply on top. It reads at the teacher's length, which the saved config says."""
    keys = typed_keys(overrides)
    clash = next((k for k in keys if k in _NOT_WITH_LAYERS or (k.startswith("model.") and k.split(".", 1)[1]
                                                                not in _MODEL_KEYS_WITH_LAYERS)), None)
    if clash:
        raise ConfigError(f"distill.layers makes the student from the teacher's own tokenizer, token table, blocks and "
                          f"length, so {clash}= cannot apply; drop {clash}=, or drop distill.layers for a student of "
                          f"its own")
    if "model" in keys and tree["model"].get("n_layers") == 0:
        raise ConfigError("distill.layers makes the student from the teacher's blocks, and a static model has none; "
                          "drop distill.layers for a static student (model=static), or drop model=")
    saved = checkpoint.read_config(teacher) if teacher.config.is_file() else None
    if "model" not in keys and isinstance(saved, dict) and isinstance(saved.get("model"), dict):
        tree["model"] = with_typed({**saved["model"], "freeze_epochs": 0, "freeze_layers": 0}, tree, keys, "model")
        lr = (saved.get("optimizer") or {}).get("lr")
        if not {"optimizer", "optimizer.lr"} & set(keys) and isinstance(lr, (int, float)):
            tree["optimizer"]["lr"] = lr
    frozen = tree["model"].get("freeze_layers") or 0
    if isinstance(frozen, int) and frozen > len(layers):
        raise ConfigError(f"model.freeze_layers={frozen} is more than the student's {len(layers)} blocks; pass "
                          f"model.freeze_layers<={len(layers)}")
    tree["model"]["max_len"] = int(json.loads(read_small(teacher.model_config))["max_len"])
    return tree


def teacher_table(options: DistillOptions, config) -> bool:
    """Whether the student starts from the teacher's tokenizer and token table (distill.embeddings): `auto` does
    for a from-scratch student with random embeddings; a student with a pretrained encoder or table has its own."""
    own = config.model_options.pretrained or config.model_options.init or config.embedding_init.pretrained
    if options.embeddings == "teacher" and own:
        what = ("model.pretrained" if config.model_options.pretrained else "model.init" if config.model_options.init
                else f"embedding_init={config.embedding_init.name}")
        raise ConfigError(f"distill.embeddings=teacher gives the student the teacher's tokenizer and token table, but "
                          f"{what} gives it its own; pass distill.embeddings=own, or drop {what}")
    return options.embeddings == "teacher" or (options.embeddings == "auto" and not own)


# -----------------------------------------------------------------------------------------------------------------
# The objective: what a student learns from

def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, labelled: torch.Tensor, *,
                      temperature: float, alpha: float, multi_label: bool = False,
                      class_weight: torch.Tensor | None = None, label_smoothing: float = 0.0) -> torch.Tensor:
    """Hinton et al. (2015)'s loss, averaged over the rows: alpha * T^2 * KL(teacher_T || student_T) on every row
    (both softmaxes at temperature T; T^2 keeps the gradients' scale as T changes) plus (1 - alpha) * the usual
    cross-entropy on the rows that have a label (`labelled`; texts without one learn from the teacher alone).
    Multi-label: the KL of each label's yes/no (sigmoids at T), averaged over labels, and binary cross-entropy.
    student, teacher: (B, C) logits; labels: (B,) ids or (B, C) multi-hot; labelled: (B,) bool."""
    s, t = student.float() / temperature, teacher.float() / temperature
    if multi_label:
        p = torch.sigmoid(t)  # KL of Bernoulli(p) from Bernoulli(q): BCE(q; p) - H(p), zero when they agree
        soft = (F.binary_cross_entropy_with_logits(s, p, reduction="none")
                - F.binary_cross_entropy_with_logits(t, p, reduction="none")).mean(-1)
    else:
        soft = F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), reduction="none", log_target=True).sum(-1)
    loss = alpha * temperature ** 2 * soft
    if alpha < 1 and bool(labelled.any()):
        if multi_label:
            targets = labels.float() * (1 - label_smoothing) + 0.5 * label_smoothing
            hard = weighted_bce(student.float(), targets, class_weight, reduction="none").mean(-1)
        else:  # (a class weight scales its rows' term: the mean over rows keeps micro-batch and rank shares exact)
            hard = F.cross_entropy(student.float(), labels.clamp(min=0), reduction="none",
                                   label_smoothing=label_smoothing)
            if class_weight is not None:
                hard = hard * class_weight[labels.clamp(min=0)]
        loss = loss + (1 - alpha) * torch.where(labelled, hard, torch.zeros_like(hard))
    return loss.mean()


def relation_loss(student: torch.Tensor, teacher: torch.Tensor, docs: torch.Tensor | None = None) -> torch.Tensor:
    """How far the student is from relating the batch's texts to one another as the teacher does: the mean squared
    difference of their (B, B) cosine-similarity matrices off the diagonal, each side's vectors centred on the
    batch's mean first (similarity-preserving distillation, Tung & Mori 2019; MiniLM matches relations, not states,
    for the same reason). Relations are B x B whatever the widths, so a student of another width needs no
    projection, and the teacher's side is one vector per text, small enough to cache. Centring: a pretrained
    encoder's pooled vectors share one direction that makes most of their cosine (0.6 to 0.9 between any two
    texts); without it the loss would mostly teach that direction. student: (B, Ds), teacher: (B, Dt) pooled
    vectors; docs: (B,) each row's document, where a document is read as several windows: pairs of windows of one
    document are left out (the teacher has one vector for the document, the student one per window). 0 for fewer
    than 3 rows: two centred vectors are always opposite, so there is nothing to relate."""
    b = student.shape[0]
    pairs = ~torch.eye(b, dtype=torch.bool, device=student.device) if docs is None else docs[:, None] != docs[None, :]
    if b < 3 or not bool(pairs.any()):
        return student.float().sum() * 0
    s, t = student.float(), teacher.float()
    s, t = F.normalize(s - s.mean(0), dim=-1), F.normalize(t - t.mean(0), dim=-1)
    return (s @ s.T - t @ t.T)[pairs].pow(2).mean()


def attention_loss(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, heads: int) -> torch.Tensor:
    """How far the student's last attention layer is from relating a text's tokens as the teacher's does, per text
    (B,): MiniLMv2's self-attention relation distillation (Wang et al. 2021). For each of queries, keys and values,
    each side's (T, D) vectors are split into `heads` relation heads of D / heads dimensions, and a token's relation
    to the others is softmax(X_h X_h^T / sqrt(D / heads)) over the text's real tokens; the loss is the KL divergence
    of the student's from the teacher's, averaged over real tokens, heads and the three. Relations are T x T
    whatever the widths, so a student of another width or head count needs no learned projection (the relation
    heads are the same number on both sides, not the models' own heads). student: (B, T, 3Ds), teacher:
    (B, T, 3Dt) queries, keys and values (`TransformerClassifier.forward(with_qkv=True)`); mask: (B, T) bool, True
    at real tokens."""
    keys = mask[:, None, None, :]  # (B, 1, 1, T)
    real = mask.float()
    per_text = torch.zeros(mask.shape[0], device=mask.device)
    for s, t in zip(student.float().chunk(3, -1), teacher.float().chunk(3, -1)):
        log_s, log_t = _relations(s, keys, heads), _relations(t, keys, heads)  # (B, R, T, T)
        kl = torch.where(keys, log_t.exp() * (log_t - log_s), 0.0).sum(-1).mean(1)  # (B, T): per query token
        per_text = per_text + (kl * real).sum(-1) / real.sum(-1).clamp(min=1)
    return per_text / 3


def _relations(x: torch.Tensor, keys: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, T, D) -> (B, heads, T, T) log-softmax of the scaled dot products of each relation head's vectors, padded
    keys at the lowest float (their probability 0, their log finite: no NaN in the KL's unused terms)."""
    B, T, D = x.shape
    x = x.view(B, T, heads, D // heads).transpose(1, 2)  # (B, R, T, D / R)
    scores = (x @ x.transpose(-1, -2)) * (D // heads) ** -0.5
    return scores.masked_fill(~keys, torch.finfo(scores.dtype).min).log_softmax(-1)


class Distillation(Classification):
    """A student learning from a teacher's logits (computed once, runs/distill.py) on labelled and unlabeled texts:
    `distillation_loss` per row. Validation is classification's (the student's own loss, accuracy and F1 on the
    labelled validation split), so a distilled run is compared, monitored and reported like a trained one.

    teacher: (documents, C) logits of the training split's documents; labelled: (documents,) whether a document
    has a label; docs: the split's document of each sequence (None: one sequence per document); features:
    (documents, D) the teacher's pooled vectors, matched by `relation_loss` with weight `relations` (0: not read);
    online: the teacher's model, run on each batch for `attention_loss` with weight `attention` (None: not run)."""

    loss_label = "distillation loss"

    def __init__(self, label_names: list[str], teacher: torch.Tensor, labelled: torch.Tensor,
                 docs: torch.Tensor | None, *, temperature: float, alpha: float, multi_label: bool = False,
                 loss_weight: torch.Tensor | None = None, label_smoothing: float = 0.0,
                 features: torch.Tensor | None = None, relations: float = 0.0,
                 online: torch.nn.Module | None = None, attention: float = 0.0, attention_heads: int = 1):
        super().__init__(label_names, loss_weight, label_smoothing)
        self.teacher, self.labelled, self.docs = teacher, labelled, docs
        self.temperature, self.alpha, self.multi_label = temperature, alpha, multi_label
        self.features, self.relations = (features, relations) if relations else (None, 0.0)
        self.online, self.attention, self.heads = (online, attention, attention_heads) if attention else (None, 0.0, 1)
        self.exact_slices = not relations  # (relations are taken within a micro-batch)

    def step(self, opt: Optimization, batch: dict, step: int, share: float, micro_batches: int) -> torch.Tensor:
        device = opt.device
        rows = batch["index"] if self.docs is None else self.docs[batch["index"]]
        ids = batch["input_ids"].to(device, non_blocking=True)
        mask = batch["attention_mask"].to(device, non_blocking=True)
        labels = batch["labels"].to(device, non_blocking=True)
        teacher, labelled = self.teacher[rows].to(device), self.labelled[rows].to(device)
        vectors = self.features[rows].to(device) if self.features is not None else None
        n = labels.shape[0]

        def slice_loss(part: slice) -> torch.Tensor:  # a row mean: a slice carries its rows' share
            with opt.precision.autocast():
                out = opt.forward(ids[part], mask[part], with_features=vectors is not None,
                                  with_qkv=self.online is not None)
            logits, features, qkv = (out + (None,) * (3 - len(out))) if isinstance(out, tuple) else (out, None, None)
            loss = distillation_loss(logits, teacher[part], labels[part], labelled[part],
                                     temperature=self.temperature, alpha=self.alpha, multi_label=self.multi_label,
                                     class_weight=self.loss_weight, label_smoothing=self.label_smoothing)
            if vectors is not None:  # (windows of one document: `rows` repeats its index)
                docs = rows[part].to(device) if self.docs is not None else None
                loss = loss + self.relations * relation_loss(features, vectors[part], docs)
            if self.online is not None:  # the teacher reads the same tokens (runs/distill.py checks the tokenizer)
                with torch.no_grad(), opt.precision.autocast():
                    theirs = self.online(ids[part], mask[part], with_qkv=True)[2]
                loss = loss + self.attention * attention_loss(qkv, theirs, mask[part].bool(), self.heads).mean()
            return loss if part.stop - part.start == n else loss * ((part.stop - part.start) / n)

        return sliced_update(opt, n, micro_batches, slice_loss, share)

    def share(self, split: TokenizedSplit, rows: torch.Tensor, whole: torch.Tensor, world: int) -> float:
        return world * len(rows) / len(whole)  # a row mean, class weights included (see distillation_loss)

    def epoch_line(self, m: dict) -> str:
        return (f"train_loss {m['train_loss']:.4f} (distillation)  val_loss {m['val_loss']:.4f}  "
                f"val_acc {m['val_accuracy']:.4f}  val_f1 {m['val_f1']:.4f}")


class DistillJob(ClassifierJob):
    task, resumes_sweeps = "distill", TASKS["distill"].resumes_sweeps

    def __init__(self, options: DistillOptions, teacher: CheckpointDir):
        self.options, self.teacher = options, teacher

    def build(self, session: Session) -> tuple[Run, str]:
        config, console, resume, options = session.config, session.console, session.resume, self.options
        writes = session.dist is None or session.dist.is_main
        table = student = None
        if resume is None and options.layers is not None:
            student = teacher_layers(self.teacher, options.layers)
        elif resume is None and teacher_table(options, config):
            loaded = checkpoint.load(self.teacher, "cpu")
            table = pretrained.table(loaded.model.token_embedding.weight, loaded.tokenizer_file,
                                     f"the teacher's token table ({self.teacher})", int(config.model["d_model"]))
        weights = sha256_file(self.teacher.weights)
        if resume is not None:
            self.check_same_teacher(resume, weights)
            self.check_same_slices(resume, session.tree)
        prepared = prepare(config, resume, console, session.run_dir.data_report if writes else None, table=table,
                           student=student)
        session.prepared = prepared
        self.check_classes(prepared)
        loaded = checkpoint.load(self.teacher, session.device) if options.attention else None  # (loaded once)
        online, heads = online_teacher(self.teacher, loaded, options, prepared) if loaded else (None, 1)
        unlabeled = unlabeled_texts(config, options, prepared.data, console)
        texts_of_files = {"unlabeled": sources.texts_fingerprint(unlabeled)}
        if resume is not None:
            self.check_same_unlabeled(resume, texts_of_files, config.resume_ignore_data_change, console)
        labelled = prepared.tokenized["train"]
        train = labelled if not unlabeled else TokenizedSplit.concat(
            [labelled, tokenize_unlabeled(unlabeled, prepared, config)])
        texts = list(prepared.data.splits["train"]["text"]) + unlabeled
        logits, features = teacher_logits(self.teacher, weights, texts, Path(options.cache_dir), session.device,
                                          session.precision, options.batch_size, console,
                                          with_features=options.relations > 0, loaded=loaded)
        has_label = torch.arange(len(texts)) < labelled.n_docs
        objective = Distillation(prepared.data.label_names, logits, has_label, train.docs,
                                 temperature=options.temperature, alpha=options.alpha,
                                 multi_label=prepared.model_cfg.multi_label,
                                 loss_weight=class_weights_of(session, prepared),
                                 label_smoothing=config.loss.label_smoothing, features=features,
                                 relations=options.relations, online=online, attention=options.attention,
                                 attention_heads=heads)
        run = build_run(session, prepared, objective, train,
                        meta={DISTILLED_FROM: str(self.teacher.path), TEACHER_WEIGHTS: weights,
                              UNLABELED: texts_of_files})
        how = f"temperature {options.temperature:g}, alpha {options.alpha:g}" + (
            f", relations {options.relations:g}" if options.relations else "") + (
            f", attention {options.attention:g} over {heads} relation heads" if options.attention else "")
        return run, (f"[bold]student[/] {prepared.describe(config)}; [bold]teacher[/] {markup(self.teacher.path)} "
                     f"({how}), {labelled.n_docs:,} labelled "
                     f"+ {len(unlabeled):,} unlabeled texts")

    @staticmethod
    def check_same_unlabeled(resume, texts: dict, ignore: bool, console) -> None:
        """distill.unlabeled's files rewritten since the run began would teach the remaining epochs other texts
        (the config names the files, not what is in them): resume.check_unchanged's rule, as for labelled data."""
        check_unchanged(resume.run_dir, resume.loaded.meta.get(UNLABELED), texts, ignore, console,
                        "unlabeled texts", "the distillation", "the same files")

    def check_same_teacher(self, resume, weights: str) -> None:
        """A student resumed from the teacher it began with: a teacher trained further since (its best checkpoint
        replaced) would teach the remaining epochs other answers, and the closing comparison would be with it."""
        try:
            meta = json.loads(read_small(resume.run_dir.last.meta))  # (the checkpoint being continued)
        except (OSError, ValueError):
            meta = {}
        before = meta.get(TEACHER_WEIGHTS) if isinstance(meta, dict) else None
        if before is not None and before != weights:
            raise TformerError(f"cannot resume {resume.run_dir}: the teacher's weights changed since the "
                               f"distillation began ({self.teacher.path} was trained further or replaced); start a "
                               f"new distillation from it (drop resume=)")

    def check_same_slices(self, resume, tree: dict) -> None:
        """With distill.relations a step relates the texts of one micro-batch on one device: unlike the rest of
        the loss, which slices add up to exactly, another trainer.micro_batches or trainer.devices would change
        what the remaining epochs teach (the engine lets a resume change them)."""
        if not self.options.relations:
            return
        for key in ("micro_batches", "devices"):
            before, now = (resume.config.get("trainer") or {}).get(key), (tree.get("trainer") or {}).get(key)
            if before is not None and before != now:
                raise TformerError(f"cannot resume {resume.run_dir}: with distill.relations a step relates the texts "
                                   f"of one micro-batch on one device, so trainer.{key}={now} (the run had {before}) "
                                   f"would change what the student learns; resume with trainer.{key}={before}")

    def check_classes(self, prepared: Prepared) -> None:
        """The teacher must answer with the data's classes, in the same order."""
        names = json.loads(read_small(self.teacher.labels))
        multi = bool(json.loads(read_small(self.teacher.model_config)).get("multi_label", False))
        if list(names) != list(prepared.data.label_names):
            raise TformerError(f"the teacher's classes {names[:6]} are not the data's {prepared.data.label_names[:6]} "
                               f"(same names, same order); distill on the data the teacher was trained for")
        if multi != bool(prepared.model_cfg.multi_label):
            kind = lambda m: "multi-label" if m else "single-label"  # noqa: E731
            raise TformerError(f"the teacher is {kind(multi)} and the data {kind(not multi)}; pass "
                               f"data.multi_label={str(multi).lower()}")

    def report(self, session: Session, state) -> float:
        best = super().report(session, state)
        mine, theirs = session.run_dir.test_metrics, RunDir.of_checkpoint(self.teacher).test_metrics
        if mine.is_file() and theirs.is_file():
            try:
                student, teacher = (json.loads(read_small(p)).get("accuracy") for p in (mine, theirs))
            except (OSError, ValueError, AttributeError):  # (the teacher run's file: shown if readable)
                student = teacher = None
            if isinstance(student, float) and isinstance(teacher, float):
                session.console.print(f"test accuracy: student {student:.4f}, teacher {teacher:.4f} (its run's test "
                                      f"split; {100 * (student - teacher):+.2f} points)", highlight=False)
        return best


def online_teacher(teacher: CheckpointDir, loaded, options: DistillOptions, prepared: Prepared) -> tuple:
    """distill.attention: (the teacher's model (`loaded`, on the run's device) in eval mode, the number of relation
    heads), once the student is known to be comparable token by token: both have attention layers, the student
    reads with the teacher's tokenizer (token i is the same piece of text on both sides) and no longer than the
    teacher can, and the relation heads divide both widths."""
    student = prepared.model_cfg
    if not student.n_layers:
        raise ConfigError(f"distill.attention={options.attention:g} matches the student's last attention layer to the "
                          f"teacher's, but a static student has none; use distill.relations (pooled vectors) or a "
                          f"student with layers (e.g. model=small)")
    cfg = loaded.model.cfg
    if not cfg.n_layers:
        raise ConfigError(f"distill.attention: the teacher {teacher.path} is a static model with no attention "
                          f"to match; drop distill.attention")
    reading = lambda tok: {k: v for k, v in json.loads(tok.to_str()).items()  # noqa: E731
                           if k not in ("truncation", "padding")}
    if reading(tokenization.load_tokenizer(loaded.tokenizer_file, cfg.max_len)) != reading(prepared.tokenizer):
        raise ConfigError("distill.attention compares the student's and the teacher's attention token by token, so "
                          "the student must read with the teacher's tokenizer; pass distill.embeddings=teacher, or "
                          "drop distill.attention")
    if student.max_len > cfg.max_len:
        raise ConfigError(f"distill.attention runs the teacher on the student's texts, but the student reads "
                          f"{student.max_len} tokens and the teacher at most {cfg.max_len}; pass "
                          f"model.max_len={cfg.max_len} (or less)")
    heads = options.attention_heads or student.n_heads
    if student.d_model % heads or cfg.d_model % heads:
        common = math.gcd(student.d_model, cfg.d_model)
        raise ConfigError(f"distill.attention_heads={heads} must divide both widths (the student's "
                          f"{student.d_model}, the teacher's {cfg.d_model}); pass distill.attention_heads=<a divisor "
                          f"of {common}>, e.g. {max(d for d in range(1, min(common, 64) + 1) if common % d == 0)}")
    model = loaded.model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, heads


def teacher_layers(teacher: CheckpointDir, layers: list[int]) -> TeacherLayers:
    """The student that is the teacher with only `layers` of its blocks (renumbered 0..k-1), everything else copied."""
    loaded = checkpoint.load(teacher, "cpu")
    cfg = dict(loaded.model_config)
    n = int(cfg.get("n_layers", 0))
    check_cut(cfg, layers, str(teacher.path))
    state = {}
    for key, value in loaded.model.state_dict().items():
        if key.startswith("blocks."):
            index, rest = key.split(".", 2)[1:]
            if int(index) in layers:
                state[f"blocks.{layers.index(int(index))}.{rest}"] = value.clone()
        else:
            state[key] = value.clone()
    source = f"the teacher's blocks {', '.join(map(str, layers))} of {n} ({teacher.path})"
    return TeacherLayers({**cfg, "n_layers": len(layers)}, state, loaded.tokenizer_file, source)


def check_cut(cfg: dict, layers: list[int], teacher: str) -> None:
    """The kept blocks exist, and each computes in the student what it computed in the teacher: a block's index
    decides whether it normalises its input (ModernBERT's block 0 does not) and attends globally or locally."""
    n = int(cfg.get("n_layers", 0))
    if layers[-1] >= n:
        raise ConfigError(f"distill.layers={layers} names block {layers[-1]}, but the teacher has {n} blocks (0 to "
                          f"{n - 1})" if n else f"distill.layers: the teacher {teacher} has no blocks to keep")
    if cfg.get("first_block_norm") is False and layers[0] != 0:
        raise ConfigError(f"distill.layers={layers}: the teacher's block 0 reads the normalised embeddings without a "
                          f"norm of its own, and no other block can take its place; keep block 0 (distill.layers=[0,"
                          f"...])")
    every = int(cfg.get("global_every") or 1)
    moved = [(i, j) for j, i in enumerate(layers) if (i % every == 0) != (j % every == 0)]
    if cfg.get("local_window") and every > 1 and moved:
        (i, j), kind = moved[0], "global" if moved[0][0] % every == 0 else "local"
        raise ConfigError(f"distill.layers={layers}: block {i} attends {kind}ly, but as the student's block {j} it "
                          f"would not (every {every}th block from 0 is global); keep blocks whose kind stays, e.g. "
                          f"distill.layers=[{', '.join(map(str, range(min(n, every + 1))))}]")


UNLABELED = "unlabeled_texts"  # meta.json: the count and SHA-256 of distill.unlabeled's texts, compared on resume


def unlabeled_texts(config, options: DistillOptions, data, console) -> list[str]:
    """distill.unlabeled's texts (at most distill.max_unlabeled, a seeded sample), without copies of the data's
    labelled texts: a copy of a test text would let the student learn the teacher's answer to it."""
    if not options.unlabeled:
        return []
    texts, where = [], []
    for entry in options.unlabeled:
        found, source = sources.unlabeled_texts(config.data, entry)
        texts += found
        where.append(source)
    known = sanity.TrainTexts(list(data.splits.values())).known(texts)
    kept = [t for t, copy in zip(texts, known) if not copy]
    copies = len(texts) - len(kept)
    if options.max_unlabeled is not None and len(kept) > options.max_unlabeled:
        chosen = sorted(random.Random(config.seed).sample(range(len(kept)), options.max_unlabeled))
        kept = [kept[i] for i in chosen]
    repeats = len(kept) - len(set(kept))  # (kept, each weighing as a text: said, as a file listed twice would be)
    console.print(f"[bold]unlabeled[/] {len(kept):,} texts from {', '.join(markup(w) for w in where)}"
                  + (f" ({copies:,} copies of the data's own texts dropped)" if copies else "")
                  + (f"; {repeats:,} of them repeat another (each copy counts as a text)" if repeats else ""),
                  highlight=False)
    return kept


def tokenize_unlabeled(texts: list[str], prepared: Prepared, config) -> TokenizedSplit:
    """The unlabeled texts as the student reads them (its tokenizer, max_len and long-text reading); their label is
    a placeholder the loss never reads (-1, or an empty set for multi-label data)."""
    feature = prepared.data.splits["train"].features["label"]
    empty = [] if prepared.model_cfg.multi_label else -1
    ds = datasets.Dataset.from_dict({"text": texts, "label": [empty] * len(texts)},
                                    features=datasets.Features({"text": datasets.Value("string"), "label": feature}))
    return TokenizedSplit.from_dataset(tokenization.tokenize_split(ds, prepared.tokenizer, prepared.model_cfg.max_len,
                                                                   "unlabeled", config.long_text))


def cache_key(weights_sha256: str, reading: str) -> str:
    """A teacher as its logits depend on it: its weights and how it reads a text (max_len, long-text reading,
    tokenizer). Its cache folder holds shards named by their texts (`shard_key`)."""
    return hashlib.sha256(f"{weights_sha256}|{reading}".encode()).hexdigest()[:24]


def shard_key(texts: list[str]) -> str:
    """A shard's texts, in order: two runs whose texts start alike (train, then train + unlabeled) share shards."""
    digest = hashlib.sha256(str(len(texts)).encode())
    for t in texts:
        digest.update(hashlib.sha256(t.encode("utf-8", "surrogatepass")).digest())
    return digest.hexdigest()[:24]


def teacher_logits(teacher: CheckpointDir, weights_sha256: str, texts: list[str], cache_root: Path, device,
                   precision, batch_size: int, console, with_features: bool = False, loaded=None):
    """(len(texts), classes) float32 logits of the teacher and, with_features, its (len(texts), D) pooled vectors
    (else None): `ShardedRows` tables over the cache's files, memory-mapped (texts x classes never in the process's
    own memory). Shards computed before are read from the cache; the others are computed SHARD_TEXTS texts at a
    time, each kept as it is done (Ctrl-C loses at most one). A shard holds both, the vectors in bfloat16 (only
    their cosines are used; half the bytes of float32 for a million texts); one written without vectors is
    computed again when they are asked for. loaded: the teacher's checkpoint already loaded on `device` (else
    loaded here)."""
    loaded = loaded if loaded is not None else checkpoint.load(teacher, device)
    max_len, long_text = int(loaded.model_config["max_len"]), LongText.from_meta(loaded.meta)
    tok = tokenization.load_tokenizer(loaded.tokenizer_file, max_len, long_text)
    classes, width = int(loaded.model.cfg.num_classes), int(loaded.model.cfg.d_model)
    wanted = width if with_features else None
    cache = TeacherCache(cache_root, cache_key(weights_sha256,
                                               f"{max_len}|{long_text}|{tokenization.tokenizer_hash(tok)}"))
    parts = [texts[a:a + SHARD_TEXTS] for a in range(0, len(texts), SHARD_TEXTS)]
    files = [cache.shard(shard_key(part)) for part in parts]
    done = {k: t for k, (part, f) in enumerate(zip(parts, files))
            if (t := _read_shard(f, len(part), classes, wanted)) is not None}

    def joined():  # (read in place: the shards stay files in the page cache, rows x classes never in memory)
        logits = ShardedRows([done[k][0] for k in range(len(parts))], SHARD_TEXTS, classes, torch.float32)
        return logits, (ShardedRows([done[k][1] for k in range(len(parts))], SHARD_TEXTS, width, torch.bfloat16)
                        if with_features else None)

    kept = sum(len(parts[k]) for k in done)
    what = "logits and pooled vectors" if with_features else "logits"
    if len(done) == len(parts):
        console.print(f"[bold]teacher[/] {what} of {len(texts):,} texts read from the cache {markup(cache)}",
                      highlight=False)
        return joined()
    if not cache.info.is_file():
        write_json(cache.info, {"teacher": str(teacher.path), "classes": classes, "reading": long_text.describe(max_len),
                                "max_len": max_len})
    console.print(f"[bold]teacher[/] scoring {len(texts) - kept:,} texts ({long_text.describe(max_len)}, "
                  f"{precision.name})" + (f"; {kept:,} already in the cache" if kept else "") + f"; cache {markup(cache)}",
                  highlight=False)
    pad, layout = tokenization.pad_id(tok), tokenization.special_layout(tok)
    bar = progress(total=len(texts), initial=kept, desc="teacher logits", unit="text")
    warned = False  # (an unreadable cache file is said once)
    try:
        for k, (part, file) in enumerate(zip(parts, files)):
            if k in done:
                continue
            split = TokenizedSplit.from_windows(tokenization.encode_batch(tok, part, max_len, long_text, layout))
            rows = torch.empty(split.n_docs, classes + width)
            for index, block in logit_blocks(loaded.model, split, batch_size=batch_size, pad_id=pad, device=device,
                                             precision=precision, with_features=True):
                rows[index] = block
            logits, vectors = rows[:, :classes].contiguous(), rows[:, classes:].to(torch.bfloat16).contiguous()
            if not bool(torch.isfinite(rows).all()):
                raise TformerError(f"the teacher {teacher} gives NaN or infinite logits or pooled vectors; distill from a "
                                   f"checkpoint of a run that trained well")
            write_with(file, lambda tmp, t=logits, v=vectors: safetensors.torch.save_file(
                {"logits": t, "features": v}, str(tmp)))
            done[k] = _read_shard(file, len(part), classes, wanted)
            if done[k] is None:  # (written but not readable back mapped: kept in memory, said once)
                done[k] = (logits, vectors if with_features else None)
                if not warned:
                    warned = True
                    console.print(f"[yellow]warning:[/] the teacher cache file {markup(file)} was written but cannot "
                                  f"be memory-mapped back; its rows stay in memory (as will any other such file's, "
                                  f"memory growing with the texts) and the next run scores them again: check the "
                                  f"file system of {markup(cache)}", highlight=False)
            bar.update(len(part))
    except KeyboardInterrupt:
        kept = sum(len(parts[k]) for k in done)
        raise Interrupted(f"interrupted while the teacher scored the texts; {kept:,} of {len(texts):,} are kept in "
                          f"{cache}: the same command goes on from there") from None
    finally:
        bar.close()
    return joined()


def _read_shard(path: Path, rows: int, classes: int, width: int | None = None):
    """(logits, pooled vectors in bfloat16 or None) of a cache shard, memory-mapped, when the file is whole, of the
    expected shapes and finite, and has the vectors when `width` asks for them; else None (computed again)."""
    if not path.is_file():
        return None
    try:
        tensors = mapped_safetensors(path)
        logits = tensors["logits"]
        vectors = tensors["features"] if width is not None else None
    except (OSError, KeyError, ValueError, TypeError):
        return None
    ok = logits.shape == (rows, classes) and logits.dtype == torch.float32 and bool(torch.isfinite(logits).all())
    if ok and vectors is not None:
        ok = vectors.shape == (rows, width) and vectors.dtype == torch.bfloat16 and bool(torch.isfinite(vectors).all())
    return (logits, vectors) if ok else None
