"""The typed `data` config. Every key has its default in configs/data/_base.yaml (each data/*.yaml starts from
it), so a dataset file only says what is its own."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DataConfig:
    name: str  # a loader in data/sources.py LOADERS, or a named dataset read from data.dir / fetched
    dir: str | None  # local folder with train/validation/test files (+ labels.txt)
    hub_id: str | None  # Hugging Face Hub dataset, used when no local folder is given
    hub_config: str | None
    hub_split_names: dict | None  # {our split: hub split}
    hub_text_column: str | None  # when the Hub copy names columns differently from the original files
    hub_label_column: str | None
    split_names: dict | None  # {our split: file stem}; when set, the whole mapping (a split left out is carved)
    train_file: str | None
    validation_file: str | None
    test_file: str | None
    text_column: str | list[str]  # a list is joined with text_separator
    text_separator: str
    label_column: str
    label_offset: int  # subtracted from integer labels (AG News numbers classes 1..4)
    label_names: list[str] | None
    multi_label: bool  # each text has a set of labels (a list, or one string split on label_separator)
    label_separator: str
    header: bool  # CSV/TSV: false when the file has no header row
    column_names: list[str] | None  # CSV/TSV without header: the names to give the columns
    validation_fraction: float  # carved from train (stratified, seeded) when there is no validation split
    group_column: str | None  # rows sharing its value stay on one side of a carved split; thread: derived
    test_fraction: float | None  # carved from train when the data has no test split
    remove: list[str]  # 20 Newsgroups: headers, footers, quotes
    truncation: str  # right: keep the start of long texts; left: keep the end
    long_text: str  # truncate (data.truncation) | head_tail (the first head_tokens + the end)
    head_tokens: int | None  # head_tail: tokens kept from the start (null: a quarter of model.max_len)
    chunk_overlap: int | None  # chunks: tokens neighbouring windows share (null: a quarter of model.max_len)
    max_train_samples: int | None
    max_eval_samples: int | None
    n_train: int | None  # demo only: generated sizes and seed
    n_validation: int | None
    n_test: int | None
    seed: int | None

    RANGES = {"validation_fraction": (0, 1, "()"), "test_fraction": (0, 1, "()"), "label_offset": (0, None, "[)"),
              "max_train_samples": (1, None, "[)"), "max_eval_samples": (1, None, "[)"),
              "head_tokens": (0, None, "[)"), "chunk_overlap": (0, None, "[)"), "n_train": (4, 10_000_000, "[]"),
              "n_validation": (2, 10_000_000, "[]"), "n_test": (2, 10_000_000, "[]")}
