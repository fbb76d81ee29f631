"""The command boundary: a composed Hydra config becomes a typed `TrainConfig` / `EvaluateConfig` here, before
any data is read, so a wrong key or value costs a second, not a data load."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ..data.config import DataConfig
from ..errors import ConfigError
from ..model.encoder import EncoderConfig
from ..model.pretrained import EmbeddingInitConfig
from ..training.config import LossConfig, OptimizerConfig, ScheduleConfig, TrainerConfig
from ..typed_config import build, plain

# Model keys that are not part of the encoder's shape: read by the YAML itself (optimizer.lr interpolates it).
MODEL_CONFIG_ONLY = ("recommended_lr",)
# Filled in from the data and the tokenizer, never from the model YAML.
MODEL_FROM_DATA = ("vocab_size", "num_classes", "embedding_dim", "pad_id")


@dataclass
class TrainConfig:
    model: dict[str, Any]  # the encoder's shape; EncoderConfig once the vocabulary and classes are known
    data: DataConfig
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    embedding_init: EmbeddingInitConfig
    trainer: TrainerConfig
    loss: LossConfig
    seed: int
    resume: str | bool | None

    @classmethod
    def from_dict(cls, tree: dict) -> "TrainConfig":
        """From the composed config as plain containers (`typed_config.plain(cfg)`)."""
        out = build(cls, tree)
        out.encoder_config(vocab_size=1, num_classes=2)  # checks the model's shape now, not after the data
        return out

    def encoder_config(self, **from_data) -> EncoderConfig:
        known = {f.name for f in fields(EncoderConfig)}
        unknown = sorted(set(self.model) - known - set(MODEL_CONFIG_ONLY))
        if unknown:
            raise ConfigError(f"model.{unknown[0]} is not a known key; model takes "
                              f"{', '.join(sorted(known - set(MODEL_FROM_DATA)))}")
        shape = {k: v for k, v in self.model.items() if k in known and k not in MODEL_FROM_DATA}
        return build(EncoderConfig, {**shape, **from_data}, "model")


@dataclass
class EvaluateConfig:
    checkpoint: str | None
    outputs_dir: str
    split: str
    data_dir: str | None
    max_samples: int | None
    batch_size: int
    normalize: bool
    device: str
    precision: str
    data: dict | None = None  # data=<name> composes one; else the data config saved in the checkpoint

    @classmethod
    def from_hydra(cls, cfg) -> "EvaluateConfig":
        return build(cls, plain(cfg))


def data_config(saved: dict, **overrides) -> DataConfig:
    """A data config saved in a checkpoint, completed from configs/data/_base.yaml (checkpoints written before a
    key existed lack it) and with the given keys replaced."""
    from pathlib import Path

    import yaml

    from ..cli import config_dir

    base = yaml.safe_load((Path(config_dir()) / "data" / "_base.yaml").read_text())
    base.pop("defaults", None)
    return build(DataConfig, {**base, **saved, **{k: v for k, v in overrides.items() if v is not None}}, "data")
