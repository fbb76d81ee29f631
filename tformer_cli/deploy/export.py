"""`tformer export`: a checkpoint as an ONNX model plus what reading texts needs (tokenizer, labels, long-text
settings), so it runs under onnxruntime without torch (`OnnxClassifier`, `tformer predict --runtime onnx`).

The graph is traced with dynamic batch and sequence axes and keeps the padding mask. It outputs the raw logits
(what the parity check compares); the checkpoint's calibration temperature goes in export.json and the runtime
divides by it (`OnnxClassifier`), so both runtimes give the same calibrated probabilities. Every export is checked
before it is kept: onnxruntime and PyTorch run the same padded batches of shapes the trace never saw, and an fp32
export whose logits differ by more than `PARITY_TOLERANCE` is refused. Dynamic int8 quantization (weights int8,
activations quantized on the fly) is offered for a smaller, often faster model; its difference from PyTorch is
measured and reported, not bounded (benchmarks/inference.py measures its accuracy change on a test split).
"""
from __future__ import annotations

import logging
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..errors import TformerError
from ..store import manifest, ownership
from ..store.atomic import json_text, sha256_file, write_problem
from ..store.layout import ExportDir, RunDir
from ..store.locate import exported_from, is_ref, locate

PARITY_TOLERANCE = 1e-4  # max |logit difference| allowed between the fp32 ONNX model and PyTorch
QUANTIZATIONS = (None, "int8")
# `quantize=int8`: dynamic quantization, weights int8 with one scale per output channel. Against fp32 ONNX, on
# IMDB and 20 Newsgroups test texts, per-channel scales lost 0.02-0.28 accuracy points where onnxruntime's
# per-tensor default lost up to 0.62; 7-bit weights (reduce_range, a guard against the int16 saturation of u8*s8
# kernels on CPUs without VNNI) lost up to 0.52 on a VNNI CPU (benchmarks/inference.py --int8-recipes).
INT8_RECIPE = {"weight_type": "QInt8", "per_channel": True, "reduce_range": False}


@dataclass
class Exported:
    path: Path
    max_abs_logit_diff: float  # against PyTorch, on the parity batches
    label_agreement: float  # share of parity sequences given the same answer (top label, or label set)
    seconds: float
    bytes: int
    answer: str = "top label"  # what label_agreement compares: "top label", or "label set" (multi-label)


def parity_batches(vocab_size: int, max_len: int, pad_id: int, seed: int = 0):
    """Padded (ids, mask) int64 batches of shapes unlike the trace's: one token, full length, mixed lengths."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    mixed = [max_len, max_len // 2 + 1, min(7, max_len), min(2, max_len), 1]  # (the trace's batch)
    for batch, lengths in ((1, [1]), (2, [max_len, max_len]), (5, mixed),
                           (9, [min(max_len, 3 + 5 * i) for i in range(9)])):
        width = max(lengths)
        ids = torch.randint(0, vocab_size, (batch, width), generator=g)
        mask = torch.zeros(batch, width, dtype=torch.int64)
        for r, n in enumerate(lengths):
            mask[r, :n] = 1
        out.append((ids.masked_fill(mask == 0, pad_id), mask))
    return out


def quantize_int8(model: Path) -> None:
    """Replace an fp32 ONNX file by its int8 version (INT8_RECIPE)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp32 = model.with_name("fp32.onnx")
    model.rename(fp32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)  # its advice to pre-process goes to the root logger
        try:
            quantize_dynamic(str(fp32), str(model), **{**INT8_RECIPE,
                                                       "weight_type": QuantType[INT8_RECIPE["weight_type"]]})
        finally:
            logging.disable(logging.NOTSET)
    fp32.unlink()


def quantization(value) -> str | None:
    """quantize= as a user may write it (INT8, none, null, an empty value) -> None or "int8"; anything else is
    refused before the command says what it is exporting."""
    name = value.strip().lower() if isinstance(value, str) else value
    name = None if name in ("none", "null", "") else name
    if name not in QUANTIZATIONS:
        raise TformerError(f"quantize={value!r} is not one of none, int8")
    return name


def export_onnx(checkpoint: str | Path, out: str | Path | None = None, *, quantize: str | None = None,
                opset: int = 17) -> Exported:
    """Write an export dir (default: <run dir>/export/onnx, or onnx-int8) and check it against PyTorch."""
    import torch

    from ..data.tokenization import LongText, load_tokenizer, pad_id
    from .onnx_classifier import EXPORT_FORMAT_VERSION, session
    from .. import checkpoint as ckpt

    quantize = quantization(quantize)
    try:
        import onnx  # noqa: F401  (the exporter and the quantizer need it)
        import onnxruntime  # noqa: F401
    except ImportError:
        raise TformerError("export needs onnx and onnxruntime: pip install 'tformer[onnx]'") from None
    if is_ref(str(checkpoint)) and out is None:
        raise TformerError(f"export checkpoint={checkpoint} needs out=<folder>: a Hub checkpoint lives in the "
                           f"download cache, which is no place to write (its repository may already have onnx/)")
    start = time.perf_counter()
    source = locate(checkpoint)
    target = (ExportDir(Path(out).expanduser()) if out is not None
              else RunDir.of_checkpoint(source).export_of(source, quantized=quantize is not None))
    # before anything is loaded: a folder of the user's, or another checkpoint's export, is never replaced
    ownership.check_replaceable(target.path, "export", "out", legacy=_legacy_export_files)
    other = exported_from(target)
    if other is not None and other != source.path.resolve():
        raise TformerError(f"out={target} holds the export of another checkpoint ({other}); pass a new folder, or "
                           f"remove that export first")
    loaded = ckpt.load(source, "cpu")
    model, cfg = loaded.model.eval(), loaded.model.cfg
    long_text = LongText.from_meta(loaded.meta)
    pad = pad_id(load_tokenizer(loaded.tokenizer_file, cfg.max_len, long_text))
    try:
        # written whole in a temporary sibling, swapped in only once checked and complete, and marked as ours
        with ownership.replacing(target.path, "export", "out", legacy=_legacy_export_files) as staging:
            tmp = ExportDir(staging)
            ids, mask = parity_batches(cfg.vocab_size, cfg.max_len, pad)[2]
            with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
                warnings.simplefilter("ignore")  # tracer and deprecation notices about the exporter, not the model
                torch.onnx.export(model, (ids, mask), str(tmp.model), dynamo=False, opset_version=opset,
                                  input_names=["input_ids", "attention_mask"], output_names=["logits"],
                                  dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                                                "attention_mask": {0: "batch", 1: "sequence"},
                                                "logits": {0: "batch"}})
            if quantize == "int8":
                quantize_int8(tmp.model)
            worst, same, total = _parity(model, session(tmp.model, threads=0), cfg, pad,
                                         _answers(cfg.multi_label, loaded.temperature, loaded.thresholds))
            if not worst <= (PARITY_TOLERANCE if quantize is None else float("inf")):  # NaN: never kept
                raise TformerError(f"the ONNX export of {source} differs from PyTorch by {worst:.2e} in the logits "
                                   f"(allowed {PARITY_TOLERANCE:.0e}); nothing was written. Report this with the "
                                   f"checkpoint's model config")
            shutil.copyfile(loaded.tokenizer_file, tmp.tokenizer)
            tmp.labels.write_text(json_text(list(loaded.label_names)))
            from .. import __version__

            info = {"format_version": EXPORT_FORMAT_VERSION, "format": "onnx", "opset": opset,
                    "quantization": quantize, **({"int8_recipe": INT8_RECIPE} if quantize else {}),
                    "source_checkpoint": _relative_or_absolute(source.path, target.path),
                    "source_weights_sha256": sha256_file(source.weights), "max_len": cfg.max_len, "pad_id": pad,
                    "multi_label": cfg.multi_label, "thresholds": loaded.thresholds,
                    "temperature": loaded.temperature,  # applied to the graph's logits by OnnxClassifier
                    "conformal": loaded.conformal,  # label-set cuts (predict --coverage)
                    **long_text.to_meta(), "parity": {"max_abs_logit_diff": worst, "label_agreement": same / total,
                                                      "sequences": total},
                    "tformer_version": __version__, "exported_at": time.time()}
            tmp.info.write_text(json_text(info, allow_nan=True))  # a NaN parity is the news, not null
            manifest.write(tmp)
    except OSError as exc:
        raise TformerError(f"could not write the export to {target}: {write_problem(exc)}") from exc
    return Exported(target.path, worst, same / total, time.perf_counter() - start, target.model.stat().st_size,
                    "label set" if cfg.multi_label else "top label")


def _answers(multi_label: bool, temperature, thresholds):
    """logits (n, C) -> the answers compared for parity, one row per sequence: the top label, or for a multi-label
    model the label set at its calibrated probabilities and thresholds (a set can change where the top label
    does not)."""
    import numpy as np

    from ..evaluation.calibration import probabilities

    if not multi_label:
        return lambda logits: logits.argmax(1)[:, None]
    cut = np.asarray(thresholds if thresholds is not None else 0.5, dtype=np.float64)
    return lambda logits: probabilities(logits, temperature, True) >= cut


def _parity(model, session, cfg, pad: int, answers) -> tuple[float, int, int]:
    """(max |logit difference|, sequences given the same answer (`_answers`), sequences) of the ONNX session
    against the PyTorch model, on padded batches of shapes the trace never saw."""
    import numpy as np
    import torch

    worst, same, total = 0.0, 0, 0
    with torch.no_grad():
        for ids, mask in parity_batches(cfg.vocab_size, cfg.max_len, pad, seed=1):
            ref = model(ids, mask).numpy()
            if not np.isfinite(ref).all():  # (max() over NaN differences would report 0 and pass)
                raise TformerError("the checkpoint's model gives NaN or infinite logits (its weights are not "
                                   "finite); nothing was exported. Export a checkpoint of a run that trained well")
            got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
            diff = float(np.abs(ref - got).max())
            if worst == worst and not diff <= worst:  # a NaN difference (a broken export) sticks: max() hides it
                worst = diff
            same += int((answers(ref) == answers(got)).all(1).sum())
            total += len(ref)
    return worst, same, total


def _legacy_export_files(folder: Path) -> set[str] | None:
    """The files of an export written before folders were marked: those its manifest lists, when it is one."""
    export = ExportDir(folder)
    listed = manifest.entries(export) if export.is_export() else None
    return None if listed is None else {*listed, export.manifest.name}


def _relative_or_absolute(source: Path, export: Path) -> str:
    """The source checkpoint as seen from the export (portable when the run dir moves or is published)."""
    import os

    try:
        return os.path.relpath(source.resolve(), export.resolve())
    except ValueError:  # another drive (Windows)
        return str(source.resolve())
