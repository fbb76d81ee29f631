"""`tformer evaluate`: a checkpoint on a dataset split -> rich tables, metrics.json and report files."""
from __future__ import annotations

from pathlib import Path

from .. import cores
from ..store.atomic import write_json
from ..errors import TformerError
from ..store.layout import RunDir
from ..runs.config import EvaluateConfig
from ..runs.session import log_header


def reading(trained, config: EvaluateConfig, max_len: int, data_side: str):
    """How evaluate reads long texts: the way training did (saved in the checkpoint), unless long_text /
    head_tokens / chunk_overlap ask for another way, e.g. `long_text=chunks` to score whole reviews with a model
    trained on their last max_len tokens (every window's logits averaged per document). Checked here, against
    the checkpoint's max_len and under the keys the user typed, before any data is read. Returns the reading and
    the side a truncate reading keeps: None, the tokenizer file's (training's), unless training read head_tail or
    chunks and saved no side: then the data config's (data.truncation; `imdb` keeps the end)."""
    from ..data.tokenization import LONG_TEXT_MODES, LongText

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
    if overlap is not None and not 0 <= overlap < width:
        raise TformerError(f"chunk_overlap={overlap} must be between 0 and {width - 1} (a window holds "
                           f"{width} tokens of text at the checkpoint's max_len {max_len})")
    side = data_side if mode == "truncate" and trained.mode != "truncate" else None
    return LongText(mode, head if mode == "head_tail" else None, overlap if mode == "chunks" else None), side


def run(cfg) -> float:
    from hydra.core.hydra_config import HydraConfig

    from ..typed_config import plain

    hydra = HydraConfig.get()
    overrides = list(hydra.overrides.task)
    return evaluate(EvaluateConfig.from_hydra(cfg, overrides), RunDir(hydra.runtime.output_dir), plain(cfg), overrides)


def evaluate(config: EvaluateConfig, run_dir: RunDir, tree: dict | None = None, overrides=()) -> float:
    from ..console import output
    from ..hardware import keep_freed_host_memory, pick_device, pick_precision

    console = output()
    console.open_log(run_dir.log("evaluate"), log_header("evaluate", overrides, tree))
    device = pick_device(config.device)
    keep_freed_host_memory(device)
    precision = pick_precision(config.precision, device)
    with cores.claimed(config.threads, "threads", device.type, console.print):
        return _evaluate(config, run_dir, console, device, precision)


def _evaluate(config: EvaluateConfig, run_dir: RunDir, console, device, precision) -> float:
    from ..data import sanity, sources, tokenization
    from ..evaluation import report
    from ..evaluation.evaluate import count, score_split, write_reports
    from .. import checkpoint
    from ..store.locate import locate

    loaded = checkpoint.load(locate(config.checkpoint or None, config.outputs_dir), device)
    saved = loaded.saved_config()
    data_cfg = config.data_config((saved or {}).get("data"), f"{loaded.path} ({loaded.files.config.name})")
    from ..safe_text import markup

    console.print(f"[bold]checkpoint[/] {markup(loaded.path)}  [bold]data[/] {markup(data_cfg.name)}  [bold]split[/] "
                  f"{markup(config.split)}  [bold]device[/] {device} ({precision.name})", highlight=False)
    max_len = int(loaded.model_config["max_len"])
    trained = tokenization.LongText.from_meta(loaded.meta)
    long_text, side = reading(trained, config, max_len, data_cfg.truncation)
    if long_text != trained:
        console.print(f"[bold]long texts[/] read as {long_text.describe(max_len)} (trained as "
                      f"{trained.describe(max_len)})", highlight=False)
    seed = int((saved or {}).get("seed", 0))
    data = sources.load(data_cfg, seed=seed)
    if config.split not in data.splits:
        raise TformerError(f"split {config.split!r} not in the data; it has {', '.join(data.splits)}")
    if list(data.label_names) != list(loaded.label_names):
        raise TformerError(f"the data's labels {data.label_names[:5]} differ from the checkpoint's "
                           f"{loaded.label_names[:5]}; evaluate on the dataset the model was trained on")
    sanity.check(data, run_dir.data_report, evaluated=config.split)
    tok = tokenization.load_tokenizer(loaded.tokenizer_file, max_len, long_text, side)
    texts = data.splits[config.split]
    split = tokenization.TokenizedSplit.from_dataset(
        tokenization.tokenize_split(texts, tok, max_len, config.split, long_text))
    result = score_split(loaded.model, split, loaded.label_names, pad_id=tokenization.pad_id(tok), device=device,
                         precision=precision, batch_size=config.batch_size, thresholds=loaded.thresholds,
                         temperature=loaded.temperature,  # (the checkpoint's calibration; raw ones as *_raw)
                         label_sets=loaded.conformal)
    metrics = result.metrics
    metrics.update({"checkpoint": str(loaded.path), "split": config.split, "data": data_cfg.name,
                    **long_text.to_meta()})
    if isinstance(loaded.meta.get("calibrated_on"), dict):  # (a `tformer calibrate` checkpoint: the fit's texts)
        metrics["calibrated_on"] = loaded.meta["calibrated_on"]
    scored = getattr(data_cfg, f"{config.split}_file", None)  # a file given for this split is what was scored
    title = f"{Path(scored).name if scored else f'{data_cfg.name} {config.split}'} ({count(split)})"
    report.print_metrics(metrics, loaded.label_names, title, console)
    write_json(run_dir.eval_metrics, metrics)
    console.print(f"metrics written to {markup(run_dir.eval_metrics)}", highlight=False)
    write_reports(run_dir.root, result, loaded.label_names, texts, config.normalize, title, console)
    return float(metrics["accuracy"])
