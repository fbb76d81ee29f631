"""A checkpoint read against labelled data, as `tformer evaluate` and `tformer calibrate` both do: the command's
shell (log, device, precision, threads), how long texts are read, the data loaded and checked against the
checkpoint's labels, and the split tokenized the checkpoint's way."""
from __future__ import annotations

import shlex

from .. import cores
from ..console import output
from ..data import sources, tokenization
from ..data.tokenization import LONG_TEXT_MODES, LongText
from ..errors import TformerError
from ..hardware import keep_freed_host_memory, pick_device, pick_precision
from ..store.layout import RunDir
from .config import EvaluateConfig
from .session import log_header


def scoring(task: str, work, config: EvaluateConfig, run_dir: RunDir, tree: dict | None, overrides) -> float:
    """`work(config, run_dir, console, device, precision)` under the command's log (`<task>.log`), on its device and
    precision, with its share of the CPU threads."""
    console = output()
    console.open_log(run_dir.log(task), log_header(task, overrides, tree))
    device = pick_device(config.device, "device")
    keep_freed_host_memory(device)
    precision = pick_precision(config.precision, device)
    with cores.claimed(config.threads, "threads", device.type, console.print):
        return work(config, run_dir, console, device, precision)


def reading(trained, config: EvaluateConfig, max_len: int, data_side: str):
    """How evaluate reads long texts: the way training did (saved in the checkpoint), unless long_text /
    head_tokens / chunk_overlap ask for another way, e.g. `long_text=chunks` to score whole reviews with a model
    trained on their last max_len tokens (every window's logits averaged per document). Checked here, against
    the checkpoint's max_len and under the keys the user typed, before any data is read. Returns the reading and
    the side a truncate reading keeps: None, the tokenizer file's (training's), unless training read head_tail or
    chunks and saved no side: then the data config's (data.truncation; `imdb` keeps the end)."""
    mode = trained.mode if config.long_text is None else config.long_text
    if mode not in LONG_TEXT_MODES:
        raise TformerError(f"long_text={mode!r} is not one of {', '.join(LONG_TEXT_MODES)}; "
                           f"leave it unset to read texts the way training did")
    for key, owner in (("head_tokens", "head_tail"), ("chunk_overlap", "chunks")):
        if getattr(config, key) is not None and mode != owner:
            raise TformerError(f"{key}= is a setting of long_text={owner}, and this evaluation reads texts as {mode}; "
                               f"add long_text={owner} or drop {key}=")
    same = mode == trained.mode  # keep training's sizes unless asked otherwise
    head = config.head_tokens if config.head_tokens is not None else trained.head_tokens if same else None
    overlap = config.chunk_overlap if config.chunk_overlap is not None else trained.chunk_overlap if same else None
    width = max_len - 2
    if head is not None and not 0 <= head <= width:
        raise TformerError(f"head_tokens={head} must be between 0 and {width} (the checkpoint's max_len {max_len} "
                           f"less the 2 special tokens around a text)")
    if overlap is not None:  # (the rule every reader of windows follows; a checkpoint's own value as it trained)
        LongText("chunks", chunk_overlap=overlap).overlap(max_len, key="chunk_overlap",
                                                          given=config.chunk_overlap is not None)
    side = data_side if mode == "truncate" and trained.mode != "truncate" else None
    return LongText(mode, head if mode == "head_tail" else None, overlap if mode == "chunks" else None), side


def checked_data(config: EvaluateConfig, loaded, data_cfg, seed: int, fix: str):
    """The data `data_cfg` names, with the split the command reads in it and the checkpoint's labels; `fix` ends the
    line that refuses other labels."""
    layouts = config.file_layouts((loaded.saved_config() or {}).get("data"))  # (a new file's own columns)
    data = sources.load(data_cfg, seed=seed, file_layouts=layouts, unlabelled_files="quiet")  # (said below)
    named = getattr(data_cfg, f"{config.split}_file", None)
    if config.split not in data.splits and named:  # (sources drops a split whose labels are all missing)
        layout = {**{k: getattr(data_cfg, k) for k in ("text_column", "header")}, **(layouts.get(config.split) or {})}
        column = layout["text_column"]
        flag = f" --text-column {shlex.quote(column)}" if isinstance(column, str) and column != "text" else ""
        how = f"`tformer predict --file {shlex.quote(str(named))}{flag}`" if isinstance(column, str) and \
            layout["header"] else "`tformer predict --file` (one text per line, or a table's text column)"
        raise TformerError(f"{named} has no labels (every label cell is empty or -1): this command needs labelled texts; "
                           f"{how} labels unlabelled ones")
    if config.split not in data.splits:
        raise TformerError(f"split {config.split!r} not in the data; it has {', '.join(data.splits)}")
    if list(data.label_names) != list(loaded.label_names):
        raise TformerError(f"the data's labels {data.label_names[:5]} differ from the checkpoint's "
                           f"{loaded.label_names[:5]}; {fix}")
    return data


def tokenized(loaded, texts, split: str, max_len: int, long_text, side):
    """(the checkpoint's tokenizer, `texts` read with it as a TokenizedSplit)."""
    tok = tokenization.load_tokenizer(loaded.tokenizer_file, max_len, long_text, side)
    return tok, tokenization.TokenizedSplit.from_dataset(
        tokenization.tokenize_split(texts, tok, max_len, split, long_text))
