"""The command boundary: a composed Hydra config becomes a typed `TrainConfig` / `EvaluateConfig` here, before
any data is read, so a wrong key or value costs a second, not a data load."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from ..data.config import DataConfig
from ..data.sources import DEMO_SIZES, FILE_LAYOUT_KEYS, SPLIT_KEYS
from ..errors import ConfigError
from ..hydra_setup import compose_tree, group_defaults
from ..model.encoder import EncoderConfig
from ..model import pretrained
from ..model.pretrained import EmbeddingInitConfig
from ..training import optim, recipe
from ..training.config import LoggerConfig, LossConfig, OptimizerConfig, ScheduleConfig, TrainerConfig
from ..typed_config import build, number_or_auto, plain, typed_keys
from ..yesno import bool_or_path

# Filled in from the data and the tokenizer (or a pretrained model), never from the model YAML.
MODEL_FROM_DATA = ("vocab_size", "num_classes", "embedding_dim", "pad_id", "multi_label")


@dataclass
class ModelOptions:
    """The model YAML's keys that are not the encoder's shape."""

    recommended_lr: float | str  # optimizer.lr interpolates it; auto: lr_texts / lr_short_texts (training/recipe.py)
    pretrained: str | None  # load the whole encoder from this BERT-family folder or Hub id
    pretrained_package: str | None  # an installed package with an offline copy, tried first
    layer_lr_decay: float  # lr of layer l = lr * decay^(top - l)
    freeze_layers: int  # frozen for freeze_epochs: the token table, and with N > 0 all embeddings + N blocks
    freeze_epochs: int
    init: str | None = None  # a `tformer pretrain` run dir: the encoder (and tokenizer) to start from
    long_text: str | None = None  # data.long_text's default for this model (configs/data/_base.yaml reads it)
    max_len_limit: int | None = None  # model.max_len=auto chooses at most this (training/recipe.py)
    lr_texts: float | None = None  # recommended_lr=auto: the lr, unless the texts are short and single-label
    lr_short_texts: float | None = None  # recommended_lr=auto: the lr for short single-label texts

    RANGES = {"recommended_lr": (0, None, "[)"), "lr_texts": (0, None, "()"), "lr_short_texts": (0, None, "()"),
              "layer_lr_decay": (0, 1, "(]"), "freeze_layers": (0, None, "[)"),
              "freeze_epochs": (0, None, "[)"), "max_len_limit": (1, None, "[)")}

    def __post_init__(self) -> None:
        self.recommended_lr = number_or_auto(self.recommended_lr, "model.recommended_lr")


OPTION_KEYS = tuple(f.name for f in fields(ModelOptions))


@dataclass
class TrainConfig:
    model: dict[str, Any]  # the encoder's shape; EncoderConfig once the vocabulary and classes are known
    data: DataConfig
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    embedding_init: EmbeddingInitConfig
    trainer: TrainerConfig
    loss: LossConfig
    logger: LoggerConfig
    seed: int
    resume: str | bool | None  # True: the newest unfinished run; a path: that run (yesno.bool_or_path)
    resume_ignore_data_change: bool

    @classmethod
    def from_dict(cls, tree: dict) -> "TrainConfig":
        """From the composed config as plain containers (`typed_config.plain(cfg)`)."""
        out = build(cls, tree)
        out.resume = bool_or_path(out.resume, "resume")  # resume=yes is resume=true, with or without -m
        if out.long_text.mode != "truncate":  # head_tokens / chunk_overlap fit max_len (auto: its ceiling)
            out.long_text.head(int(recipe.numeric_max_len(out.model)))
            if out.long_text.mode == "chunks":  # (a value typed now is held to the stricter rule: classify.configure)
                out.long_text.overlap(int(recipe.numeric_max_len(out.model)), given=False)
        optim.check(out.optimizer)  # the optimizer's own keys (betas, eps, ...) too
        if recipe.said_auto(out.optimizer.lr):  # auto needs the model's lr (chosen once the texts are read)
            recipe.base_lr(out.model_options)
        options = out.model_options  # checks the model's options and shape now, not after the data
        if options.pretrained is None:
            vocab = out.embedding_init.vocab_size if not out.embedding_init.pretrained else None
            shape = out.encoder_config(vocab_size=vocab or BERT_VOCAB, num_classes=2,
                                       max_len=recipe.numeric_max_len(out.model))  # auto: fitted once data is read
        elif out.embedding_init.pretrained:
            raise ConfigError(f"model.pretrained={options.pretrained} brings its own embeddings and tokenizer; "
                              f"drop embedding_init={out.embedding_init.name}")
        else:  # a folder on this machine is checked now (its kind, its shape); one from the Hub when it is fetched
            folder = pretrained.local_model(options.pretrained, options.pretrained_package)
            shape = None
            if folder is not None:
                from_folder = pretrained.encoder_shape(folder, int(recipe.numeric_max_len(out.model, folder)))
                vocab = pretrained.read_model_config(folder).get("vocab_size")
                vocab = vocab if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0 else BERT_VOCAB
                shape = out.encoder_config(**from_folder, vocab_size=vocab, num_classes=2)
        if shape is not None:
            memory_check(out, shape)
        return out

    @classmethod
    def compose(cls, overrides=()) -> "TrainConfig":
        """The typed config `tformer train <overrides>` would run with (real Hydra composition, nothing run)."""
        return cls.from_dict(compose_tree("train", overrides))

    @property
    def long_text(self):
        from ..data.tokenization import LongText

        return LongText(self.data.long_text, self.data.head_tokens, self.data.chunk_overlap)

    @property
    def model_options(self) -> ModelOptions:
        return build(ModelOptions, {k: v for k, v in self.model.items() if k in OPTION_KEYS}, "model")

    def encoder_config(self, **from_data) -> EncoderConfig:
        """The encoder's config: the model YAML's shape keys, with `from_data` (vocabulary, classes, or the
        shape of a pretrained model) taking precedence."""
        known = {f.name for f in fields(EncoderConfig)}
        unknown = sorted(set(self.model) - known - set(OPTION_KEYS))
        if unknown:
            raise ConfigError(f"model.{unknown[0]} is not a known key; model takes "
                              f"{', '.join(sorted((known - set(MODEL_FROM_DATA)) | set(OPTION_KEYS)))}")
        shape = {k: v for k, v in self.model.items() if k in known and k not in MODEL_FROM_DATA}
        return build(EncoderConfig, {**shape, **from_data}, "model")


@dataclass
class EvaluateConfig:
    checkpoint: str | None
    outputs_dir: str
    split: str
    data_dir: str | None
    test_file: str | None
    max_samples: int | None
    batch_size: int
    device: str
    precision: str
    threads: int | str  # auto or a number (cores.py)
    normalize: bool = True  # confusion_matrix.png with rows normalised
    data: dict | None = None  # data=<name> composes one; else the data config saved in the checkpoint
    long_text: str | None = None  # None: read long texts the way training did (the checkpoint says)
    head_tokens: int | None = None
    chunk_overlap: int | None = None
    data_typed: dict = field(default_factory=dict)  # the data.<key>=value typed on the command line

    RANGES = {"max_samples": (1, None, "[)"), "batch_size": (1, 1 << 20, "[]"), "head_tokens": (0, None, "[)"),
              "chunk_overlap": (0, None, "[)")}

    @classmethod
    def from_hydra(cls, cfg, overrides=()) -> "EvaluateConfig":
        """Without data=<name>, configs/evaluate.yaml's `data:` keys are all null ("the checkpoint's"): the ones set
        are those typed. With data=<name> the composed group holds its own values too, so the typed keys are read
        from the overrides (`data.text_column=review`, `+data.x=1`, `data.split_names.test=dev` -> split_names)."""
        tree = plain(cfg)
        node = tree.get("data") or {}
        if "name" not in node:  # no data group chosen: evaluate.yaml's own all-null `data:` keys
            tree["data"], typed = None, {k: v for k, v in node.items() if v is not None}
        else:
            keys = {key.split(".")[1] for key in typed_keys(overrides) if key.startswith("data.")}
            typed = {k: node[k] for k in keys if k in node}
        config = build(cls, tree)
        config.data_typed = typed
        return config

    def data_config(self, saved: dict | None, where: str) -> "DataConfig":
        """The data this evaluation reads. By default the data config saved in the checkpoint, so a new labelled
        file (`test_file=new.csv` or `data.test_file=new.csv`) is read with the run's own column settings (text and
        label columns, label names, separators); every data.<key> typed wins. `data=files` (new files) or
        `data=<the run's dataset>` keeps the run's settings too, under what that config sets itself; `data=<another
        dataset>` is that dataset as its YAML says. The top-level test_file / data_dir / max_samples are the short
        forms of data.test_file / data.dir / data.max_eval_samples. `where` names the checkpoint in the error."""
        aliases = {"test_file": self.test_file, "dir": self.data_dir, "max_eval_samples": self.max_samples}
        for key, value in aliases.items():
            if value is not None and key in self.data_typed and self.data_typed[key] != value:
                short = {"dir": "data_dir", "max_eval_samples": "max_samples"}.get(key, key)
                raise ConfigError(f"{short}={value} and data.{key}={self.data_typed[key]} disagree; give one of them")
        base = group_defaults("data")
        if self.data is None or (saved and self.data.get("name") in ("files", saved.get("name"))):
            if saved is None:
                raise ConfigError(f"checkpoint {where} has no saved config to say which data it was trained on; "
                                  f"pass data=<name> (or data=files data.train_file=... data.test_file=...)")
            own = {k: v for k, v in (self.data or {}).items()  # (a key the YAML interpolates is not its own)
                   if k not in SPLIT_KEYS and (k not in base or (base[k] != v and not str(base[k]).startswith("${")))}
            if own.get("name", saved.get("name")) != "demo":  # (the demo run's sizes: generated data only)
                saved = {k: v for k, v in saved.items() if k not in DEMO_SIZES}
            tree = {**saved, **own}
        else:
            tree = dict(self.data)
        layout = self.file_layout(saved)
        typed = {k: v for k, v in self.data_typed.items() if k not in layout}  # (those read the new files alone)
        if self.test_file:  # (absolute: the metrics and the log say which file was scored)
            aliases["test_file"] = str(Path(self.test_file).expanduser().resolve())
        elif typed.get("test_file") and Path(str(typed["test_file"])).expanduser().is_file():  # (the same file as
            typed["test_file"] = str(Path(str(typed["test_file"])).expanduser().resolve())  # test_file= names)
        if (self.test_file or typed.get("test_file")) and self.max_samples is None and \
                "max_eval_samples" not in typed:  # a new file is scored whole: the run's sample size was its own
            typed["max_eval_samples"] = None
        return data_config(tree, **{**typed, **{k: v for k, v in aliases.items() if v is not None}})

    def new_files(self) -> list[str]:
        """The splits a file typed here replaces (test_file= / data.test_file= -> test, data.validation_file=)."""
        return [split for split, given in (("validation", self.data_typed.get("validation_file")),
                                           ("test", self.test_file or self.data_typed.get("test_file"))) if given]

    def file_layout(self, saved: dict | None) -> dict:
        """The typed data.<key>s that say how the new files are laid out (their text and label columns, CSV
        header), checked as any data key: `sources.load(file_layouts=)` reads those files alone with them. The
        run's own splits and files (its train split is read too, for the overlap checks) keep the layout they were
        trained with. Empty when no new file is given or the data is not the run's (data=<another dataset>,
        data.dir=, data.train_file=): then a typed key is the whole data's."""
        runs_own = saved is not None and (self.data is None or self.data.get("name") in ("files", saved.get("name")))
        elsewhere = self.data_dir or {"dir", "train_file", "split_names"} & set(self.data_typed)
        layout = {k: self.data_typed[k] for k in FILE_LAYOUT_KEYS if k in self.data_typed}
        if not (self.new_files() and runs_own and layout) or elsewhere:
            return {}
        read = data_config(saved, **layout)
        return {k: getattr(read, k) for k in layout}

    def file_layouts(self, saved: dict | None) -> dict[str, dict]:
        """{split: its new file's layout} for `sources.load(file_layouts=)`."""
        layout = self.file_layout(saved)
        return {split: layout for split in self.new_files()} if layout else {}


@dataclass
class CalibrateConfig(EvaluateConfig):
    """`tformer calibrate`: evaluate's keys for what to read (the checkpoint's data by default, data.<key>=...), and
    which texts to fit on, said outright: `file` (a labelled file, read with the run's own column settings: it is
    evaluate's test_file, under any of its three spellings) or `split` of the run's own data."""

    split: str | None
    file: str | None = None

    @classmethod
    def from_hydra(cls, cfg, overrides=()) -> "CalibrateConfig":
        config = super().from_hydra(cfg, overrides)
        typed = set(typed_keys(overrides))
        named = [f"{k}={v}" for k, v in (("file", config.file), ("test_file", config.test_file),
                                         ("data.test_file", config.data_typed.get("test_file"))) if v is not None]
        if any(not str(v).strip() for v in (config.file, config.test_file, config.data_typed.get("test_file"))
               if v is not None):
            raise ConfigError("file= is empty; give the labelled file to calibrate on, e.g. file=recent.csv")
        if len(named) > 1 and len({n.split("=", 1)[1] for n in named}) > 1:
            raise ConfigError(f"{' and '.join(named)} both name a file to calibrate on; give file= alone")
        if named:
            if "split" in typed:  # (split=test too: the run's test split is not the file)
                raise ConfigError(f"file= and split={config.split} both say which texts to calibrate on; give one")
            config.file = config.test_file = named[0].split("=", 1)[1]
            config.split = "test"
            config.data_typed.pop("test_file", None)
        elif config.split is None:
            raise ConfigError("say which texts to calibrate on: file=<labelled texts like the ones the model will "
                              "serve>, or split=validation|test of the run's own data (training already calibrated "
                              "on its validation split)")
        for key in ("long_text", "head_tokens", "chunk_overlap"):
            if getattr(config, key) is not None:
                raise ConfigError(f"{key}= is not a calibrate key: it reads texts the way the checkpoint does, as "
                                  f"predict and serve will")
        if config.split == "train":
            raise ConfigError("split=train is what the model learned from: its answers there are surer than on new "
                              "texts, and so would be the calibration; use split=validation or file=<labelled "
                              "texts it never saw>")
        return config


BERT_VOCAB = 30522  # the vocabulary assumed for a pretrained table before it is read (BERT's)
GiB = 1 << 30


def available_memory(device: str, needed: int) -> tuple[int | None, str]:
    """(bytes the run may use, where): the GPU's memory on CUDA, else the host's available memory
    (/proc/meminfo's MemAvailable); None where it cannot be told. The GPU is asked only when `needed` could
    exceed a small one, so a tiny run never initialises CUDA here."""
    name = str(device)
    cuda = name.startswith("cuda") or (name == "auto" and torch.cuda.is_available())
    if cuda:
        if needed < 2 * GiB or not torch.cuda.is_available():
            return None, "the GPU"
        index = int(name.split(":", 1)[1]) if ":" in name and name.split(":", 1)[1].isdigit() else 0
        try:
            return int(torch.cuda.get_device_properties(index).total_memory), f"GPU {index}"
        except (RuntimeError, AssertionError):
            return None, "the GPU"
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f if ":" in line)
        return int(info["MemAvailable"].split()[0]) * 1024, "this machine's available memory"
    except (OSError, KeyError, ValueError):
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"), "this machine's available memory"
        except (ValueError, OSError, AttributeError):
            return None, "this machine"


def memory_estimate(config: "TrainConfig", shape: EncoderConfig) -> dict[str, int]:
    """Bytes a training run of this config needs whatever its data, by part: the parameters with their gradients
    and optimizer state (4 copies in fp32) and the sinusoidal position table, for each process of a CPU DDP run.
    Activations are left out on purpose: batches are padded to their longest text, not to max_len, and the GPU's
    attention kernels never hold max_len^2 scores, so they depend on the data (a run out of memory stops with the
    batch size to lower). What this refuses cannot run."""
    t, T, D = config.trainer, shape.max_len, shape.d_model
    processes = t.devices if not str(t.device).startswith("cuda") else 1  # CPU ranks share the host's memory
    return {"parameters": 16 * shape.num_parameters() * processes,
            "positions": 4 * T * D * (shape.positions != "learned") * processes}


PART_KEYS = {"parameters": "model.d_model, model.n_layers, model.d_ff, model.pair_buckets or the vocabulary",
             "positions": "model.max_len or model.d_model"}


def memory_check(config: "TrainConfig", shape: EncoderConfig) -> None:
    """Refuse, before any data is read or anything allocated, a config whose model cannot fit."""
    parts = memory_estimate(config, shape)
    needed = sum(parts.values())
    available, where = available_memory(config.trainer.device, needed)
    if available is None or needed <= available:
        return
    biggest = max(parts, key=parts.get)
    raise ConfigError(f"this config needs at least {needed / GiB:,.1f} GiB ({biggest}: {parts[biggest] / GiB:,.1f} "
                      f"GiB for a {shape.num_parameters():,}-parameter model) but {where} is {available / GiB:,.1f} "
                      f"GiB; lower {PART_KEYS[biggest]}")


def data_config(saved: dict, **overrides) -> DataConfig:
    """A data config saved in a checkpoint, completed from configs/data/_base.yaml (checkpoints written before a
    key existed lack it) and with the given keys replaced."""
    base = group_defaults("data")
    return build(DataConfig, {**base, **saved, **overrides}, "data")
