"""`tformer evaluate`: a checkpoint on a dataset split -> rich tables, metrics.json and report files."""
from __future__ import annotations

from pathlib import Path

from ..store.atomic import write_json
from ..store.layout import RunDir
from ..runs.config import EvaluateConfig
from ..runs.scoring import checked_data, reading, scoring, tokenized


def run(cfg) -> float:
    from hydra.core.hydra_config import HydraConfig

    from ..typed_config import plain

    hydra = HydraConfig.get()
    overrides = list(hydra.overrides.task)
    return evaluate(EvaluateConfig.from_hydra(cfg, overrides), RunDir(hydra.runtime.output_dir), plain(cfg), overrides)


def evaluate(config: EvaluateConfig, run_dir: RunDir, tree: dict | None = None, overrides=()) -> float:
    return scoring("evaluate", _evaluate, config, run_dir, tree, overrides)


def _evaluate(config: EvaluateConfig, run_dir: RunDir, console, device, precision) -> float:
    from ..data import sanity, tokenization
    from ..evaluation import report
    from ..evaluation.evaluate import count, score_split, write_reports
    from .. import checkpoint
    from ..store.locate import locate

    loaded = checkpoint.load(locate(config.checkpoint or None, config.outputs_dir), device)
    saved = loaded.saved_config()
    data_cfg = config.data_config((saved or {}).get("data"), f"{loaded.path} ({loaded.files.config.name})")
    from ..safe_text import markup

    scored = getattr(data_cfg, f"{config.split}_file", None)  # a file given for this split is what is scored
    what = f"[bold]file[/] {markup(Path(scored).name)}" if scored else \
        f"[bold]data[/] {markup(data_cfg.name)}  [bold]split[/] {markup(config.split)}"
    console.print(f"[bold]checkpoint[/] {markup(loaded.path)}  {what}  [bold]device[/] {device} ({precision.name})",
                  highlight=False)
    max_len = int(loaded.model_config["max_len"])
    trained = tokenization.LongText.from_meta(loaded.meta)
    long_text, side = reading(trained, config, max_len, data_cfg.truncation)
    if long_text != trained:
        console.print(f"[bold]long texts[/] read as {long_text.describe(max_len)} (trained as "
                      f"{trained.describe(max_len)})", highlight=False)
    data = checked_data(config, loaded, data_cfg, int((saved or {}).get("seed", 0)),
                        "evaluate on the dataset the model was trained on")
    sanity.check(data, run_dir.data_report, evaluated=config.split)
    texts = data.splits[config.split]
    tok, split = tokenized(loaded, texts, config.split, max_len, long_text, side)
    result = score_split(loaded.model, split, loaded.label_names, pad_id=tokenization.pad_id(tok), device=device,
                         precision=precision, batch_size=config.batch_size, thresholds=loaded.thresholds,
                         temperature=loaded.temperature,  # (the checkpoint's calibration; raw ones as *_raw)
                         label_sets=loaded.conformal)
    metrics = result.metrics
    metrics.update({"checkpoint": str(loaded.path), "split": config.split, "data": data_cfg.name,
                    **long_text.to_meta()})
    if isinstance(loaded.meta.get("calibrated_on"), dict):  # (a `tformer calibrate` checkpoint: the fit's texts)
        metrics["calibrated_on"] = loaded.meta["calibrated_on"]
    title = f"{Path(scored).name if scored else f'{data_cfg.name} {config.split}'} ({count(split)})"
    report.print_metrics(metrics, loaded.label_names, title, console)
    write_json(run_dir.eval_metrics, metrics)
    console.print(f"metrics written to {markup(run_dir.eval_metrics)}", highlight=False)
    write_reports(run_dir.root, result, loaded.label_names, texts, config.normalize, title, console)
    return float(metrics["accuracy"])
