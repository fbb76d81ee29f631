"""`tformer evaluate`: a checkpoint on a dataset split -> rich tables and metrics.json."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import TformerError


def evaluate_split(model, split, label_names, *, pad_id, device, precision, batch_size):
    """(metrics, class probabilities (N, C)) of a model on a tokenized split."""
    from ..evaluation.metrics import compute
    from ..training.inference import predict_proba

    probs, loss = predict_proba(model, split, batch_size=batch_size, pad_id=pad_id, device=device,
                                precision=precision, progress="evaluating")
    return compute(split.labels.numpy(), probs.argmax(-1).numpy(), label_names, loss), probs.numpy()


def write_reports(out_dir, metrics, label_names, texts, split, probs, normalize, title, console) -> None:
    from ..evaluation import artifacts

    paths = artifacts.write(out_dir, metrics, label_names, texts, split.labels.numpy(), probs, normalize=normalize,
                            title=title)
    console.print("reports: " + ", ".join(str(p) for p in paths.values()), highlight=False)


def run(cfg) -> float:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict
    from rich.console import Console

    from .. import checkpoint
    from ..data import sources, tokenization
    from ..evaluation import report
    from ..training.hardware import pick_device, pick_precision

    console = Console()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    device = pick_device(cfg.device)
    precision = pick_precision(cfg.precision, device)
    path = checkpoint.resolve(cfg.checkpoint) if cfg.checkpoint else checkpoint.newest(cfg.outputs_dir)
    loaded = checkpoint.load(path, device)
    saved = OmegaConf.load(loaded.path / "config.yaml") if (loaded.path / "config.yaml").is_file() else None
    data_cfg = cfg.get("data") or (saved.data if saved is not None else None)
    if data_cfg is None:
        raise TformerError(f"checkpoint {loaded.path} has no config.yaml to say which data it was trained on; "
                           f"pass data=<name>")
    data_cfg = OmegaConf.create(OmegaConf.to_container(data_cfg, resolve=True))
    with open_dict(data_cfg):
        if cfg.get("data_dir"):
            data_cfg.dir = cfg.data_dir
        data_cfg.max_eval_samples = cfg.get("max_samples")
    console.print(f"[bold]checkpoint[/] {loaded.path}  [bold]data[/] {data_cfg.name}  [bold]split[/] {cfg.split}  "
                  f"[bold]device[/] {device} ({precision.name})", highlight=False)
    seed = int(saved.seed) if saved is not None and "seed" in saved else 0
    data = sources.load(data_cfg, seed=seed)
    if cfg.split not in data.splits:
        raise TformerError(f"split {cfg.split!r} not in the data; it has {', '.join(data.splits)}")
    if list(data.label_names) != list(loaded.label_names):
        raise TformerError(f"the data's labels {data.label_names[:5]} differ from the checkpoint's "
                           f"{loaded.label_names[:5]}; evaluate on the dataset the model was trained on")
    max_len = int(loaded.model_config["max_len"])
    tok = tokenization.load_tokenizer(loaded.tokenizer_file, max_len)
    ds = tokenization.tokenize_split(data.splits[cfg.split], tok, max_len, cfg.split)
    split = tokenization.TokenizedSplit.from_dataset(ds)
    metrics, probs = evaluate_split(loaded.model, split, loaded.label_names, pad_id=tokenization.pad_id(tok),
                                    device=device, precision=precision, batch_size=int(cfg.batch_size))
    metrics.update({"checkpoint": str(loaded.path), "split": cfg.split, "data": str(data_cfg.name)})
    title = f"{data_cfg.name} {cfg.split} ({len(split):,} examples)"
    report.print_metrics(metrics, loaded.label_names, title, console)
    out = run_dir / "metrics.json"
    out.write_text(json.dumps(metrics, indent=2))
    console.print(f"metrics written to {out}", highlight=False)
    write_reports(run_dir, metrics, loaded.label_names, data.splits[cfg.split]["text"], split, probs,
                  bool(cfg.get("normalize", True)), title, console)
    return float(metrics["accuracy"])
