"""The command boundary: a composed Hydra config becomes a typed `TrainConfig` / `EvaluateConfig` here, before
any data is read, so a wrong key or value costs a second, not a data load."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ..data.config import DataConfig
from ..errors import ConfigError
from ..hydra_setup import compose_tree, group_defaults
from ..model.encoder import EncoderConfig
from ..model.pretrained import EmbeddingInitConfig
from ..training.config import LoggerConfig, LossConfig, OptimizerConfig, ScheduleConfig, TrainerConfig
from ..typed_config import build, plain
from ..yesno import bool_or_path

# Filled in from the data and the tokenizer (or a pretrained model), never from the model YAML.
MODEL_FROM_DATA = ("vocab_size", "num_classes", "embedding_dim", "pad_id", "multi_label")


@dataclass
class ModelOptions:
    """The model YAML's keys that are not the encoder's shape."""

    recommended_lr: float  # optimizer.lr interpolates it
    pretrained: str | None  # load the whole encoder from this BERT-family folder or Hub id
    pretrained_package: str | None  # an installed package with an offline copy, tried first
    layer_lr_decay: float  # lr of layer l = lr * decay^(top - l)
    freeze_layers: int  # frozen for freeze_epochs: the token table, and with N > 0 all embeddings + N blocks
    freeze_epochs: int
    init: str | None = None  # a `tformer pretrain` run dir: the encoder (and tokenizer) to start from
    long_text: str | None = None  # data.long_text's default for this model (configs/data/_base.yaml reads it)


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
        if out.long_text.mode != "truncate":  # head_tokens / chunk_overlap fit max_len
            out.long_text.head(int(out.model["max_len"]))
            if out.long_text.mode == "chunks":
                out.long_text.overlap(int(out.model["max_len"]))
        options = out.model_options  # checks the model's options and shape now, not after the data
        if options.pretrained is None:
            out.encoder_config(vocab_size=1, num_classes=2)
        elif out.embedding_init.pretrained:
            raise ConfigError(f"model.pretrained={options.pretrained} brings its own embeddings and tokenizer; "
                              f"drop embedding_init={out.embedding_init.name}")
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
    normalize: bool
    device: str
    precision: str
    data: dict | None = None  # data=<name> composes one; else the data config saved in the checkpoint
    long_text: str | None = None  # None: read long texts the way training did (the checkpoint says)
    head_tokens: int | None = None
    chunk_overlap: int | None = None

    @classmethod
    def from_hydra(cls, cfg) -> "EvaluateConfig":
        return build(cls, plain(cfg))


def data_config(saved: dict, **overrides) -> DataConfig:
    """A data config saved in a checkpoint, completed from configs/data/_base.yaml (checkpoints written before a
    key existed lack it) and with the given keys replaced."""
    base = group_defaults("data")
    return build(DataConfig, {**base, **saved, **{k: v for k, v in overrides.items() if v is not None}}, "data")
