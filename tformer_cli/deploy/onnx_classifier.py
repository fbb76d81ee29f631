"""An exported model (`tformer export`) as a classifier, run by onnxruntime: no torch, safetensors or Hydra, so
`tformer predict --runtime onnx` starts in a fraction of the time `import torch` takes.

    from tformer_cli.deploy.onnx_classifier import OnnxClassifier
    clf = OnnxClassifier.load("outputs/train/<date>/<time>")    # its export/onnx, or an export dir itself
    clf.predict(["a gripping, beautifully shot film"], top_k=2)

Same answers as `Classifier` (tests hold the two to 1e-4 in probability, calibrated: the checkpoint's temperature
travels in export.json and is applied to the graph's logits here, as `Classifier` applies it), same handling of
blank texts and long ones (the tokenizer and long-text settings travel in the export dir); no `explain`, which
needs attention weights.
"""
from __future__ import annotations

from pathlib import Path

from ..classifier import TextPredictor, whole_number
from ..errors import ConfigError, TformerError
from ..evaluation.calibration import checked
from ..evaluation.conformal import checked as conformal_checked
from ..store.layout import ExportDir, resolve_checkpoint
from ..store.locate import exported_from, locate_export
from ..store.manifest import finite_number, read_json, verify_export

EXPORT_FORMAT_VERSION = 1


class OnnxClassifier(TextPredictor):
    runtime = "onnx"

    def __init__(self, export: ExportDir, session, tokenizer, info: dict, labels: list[str], long_text):
        self._export, self._session, self._tok, self._info = export, session, tokenizer, info
        self._labels, self._long_text = labels, long_text
        self._max_len, self._pad_id = int(info["max_len"]), int(info["pad_id"])
        self.multi_label = bool(info.get("multi_label", False))
        self.thresholds = info.get("thresholds") or ([0.5] * len(labels) if self.multi_label else None)
        self.temperature = info.get("temperature")  # (None: an export without calibration, T = 1)
        self.conformal = info.get("conformal")  # (None: an export without label-set cuts)

    @classmethod
    def load(cls, path: str | Path | None = None, *, outputs_dir: str | Path = "outputs",
             threads: int = 0) -> "OnnxClassifier":
        """threads: onnxruntime's intra-op threads (0: one per core)."""
        from ..data.tokenization import load_tokenizer

        threads = whole_number(threads, "threads", low=0)
        export = locate_export(path, outputs_dir)
        verify_export(export)
        info = read_json(export, export.info, allow_nan=True)  # (its measured parity may be NaN)
        labels = read_json(export, export.labels)
        if not isinstance(info, dict):
            raise TformerError(f"export {export}: {export.info.name} is not a mapping; export the checkpoint again")
        version = info.get("format_version")
        long_text, max_len = checked_info(export, info)
        if isinstance(version, bool) or version != EXPORT_FORMAT_VERSION:
            raise TformerError(f"export {export} has format version {version}, this tformer reads "
                               f"{EXPORT_FORMAT_VERSION}; export the checkpoint again with this version")
        if not (isinstance(labels, list) and labels and all(isinstance(n, str) for n in labels)):
            raise TformerError(f"export {export}: {export.labels.name} must be a list of label names; export again")
        if len(set(labels)) < len(labels):
            raise TformerError(f"export {export}: {export.labels.name} names a label more than once; export again")
        cuts = info.get("thresholds")
        if cuts is not None and not (isinstance(cuts, list) and len(cuts) == len(labels)
                                     and all(finite_number(t) and 0 < t < 1 for t in cuts)):
            raise TformerError(f"export {export}: {export.info.name} has invalid thresholds; export again")
        wrong = checked(info.get("temperature"), len(labels), bool(info.get("multi_label", False)))
        if wrong:
            raise TformerError(f"export {export}: {export.info.name} has temperature="
                               f"{info.get('temperature')!r:.80}, not {wrong}; export the checkpoint again")
        table = info.get("conformal")
        wrong = None if table is None else conformal_checked(table, bool(info.get("multi_label", False)))
        if wrong:
            raise TformerError(f"export {export}: {export.info.name} has conformal label-set cuts that are not "
                               f"{wrong}; export the checkpoint again")
        runner = session(export.model, threads)
        classes = runner.get_outputs()[0].shape[-1]
        if classes != len(labels):
            raise TformerError(f"export {export}: the model has {classes} outputs but {export.labels.name} names "
                               f"{len(labels)} labels; the files are from different exports")
        return cls(export, runner, load_tokenizer(export.tokenizer, max_len, long_text), info, labels, long_text)

    @property
    def labels(self) -> list[str]:
        return list(self._labels)

    @property
    def path(self) -> Path:
        return self._export.path

    def _cuts_fix(self) -> str:
        source = exported_from(self._export)
        if source is None or resolve_checkpoint(source) is None:  # (an export copied away from its run)
            source = "<the checkpoint it was exported from>"
        return (f"export {source} again (if it has none either, fit them first without training again: tformer "
                f"calibrate checkpoint={source} split=validation, then export the calibrate run)")

    @property
    def info(self) -> dict:
        """export.json: the checkpoint it came from, its parity with PyTorch, its quantization."""
        return dict(self._info)

    def logits(self, ids: list[list[int]], batch_size: int = 64):
        """(sequences, classes) logits of token-id sequences (each at most max_len), padded per batch."""
        import numpy as np

        out = np.empty((len(ids), len(self._labels)), dtype=np.float32)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths together: less padding
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            width = max(len(ids[i]) for i in rows)
            batch = np.full((len(rows), width), self._pad_id, dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for r, i in enumerate(rows):
                batch[r, :len(ids[i])] = ids[i]
                mask[r, :len(ids[i])] = 1
            out[rows] = self._session.run(None, {"input_ids": batch, "attention_mask": mask})[0]
        return out

    def _document_logits(self, windows, batch_size: int):
        import numpy as np

        flat = [ids for ws in windows for ids, _ in ws]
        docs = np.array([d for d, ws in enumerate(windows) for _ in ws])
        logits = self.logits(flat, batch_size)
        mean = np.zeros((len(windows), logits.shape[1]), dtype=np.float64)
        np.add.at(mean, docs, logits)
        mean /= np.bincount(docs, minlength=len(windows))[:, None]  # a document's windows averaged, as in training
        return mean  # (TextPredictor turns them into probabilities at the temperature)


def checked_info(export: ExportDir, info: dict):
    """(LongText, max_len) of export.json, every value it is read by checked first: one line naming the key."""
    from ..data.tokenization import LongText

    def bad(key: str, want: str):
        return TformerError(f"export {export}: {export.info.name} has {key}={info.get(key)!r}, not {want}; export the "
                            f"checkpoint again")

    max_len, pad_id = info.get("max_len"), info.get("pad_id")
    if isinstance(max_len, bool) or not isinstance(max_len, int) or not 2 <= max_len <= 1 << 20:
        raise bad("max_len", "a whole number from 2 to 1048576")
    if isinstance(pad_id, bool) or not isinstance(pad_id, int) or pad_id < 0:
        raise bad("pad_id", "a token id (a whole number >= 0)")
    if not isinstance(info.get("multi_label", False), bool):
        raise bad("multi_label", "true or false")
    for key in ("head_tokens", "chunk_overlap"):
        value = info.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise bad(key, "a whole number or null")
    if not isinstance(info.get("long_text", "truncate"), str):
        raise bad("long_text", "a long-text mode")
    try:
        long_text = LongText.from_meta(info)
        long_text.head(max_len) if long_text.mode == "head_tail" else None
        long_text.overlap(max_len, given=False) if long_text.mode == "chunks" else None
    except ConfigError as exc:
        raise TformerError(f"export {export}: {export.info.name} is invalid ({exc}); export the checkpoint "
                           f"again") from None
    return long_text, max_len


def session(model: Path, threads: int = 0):
    """An onnxruntime session of an ONNX model file on the CPU (threads: intra-op threads, 0: one per core);
    a missing onnxruntime or an unloadable file is one line."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise TformerError("the ONNX runtime needs onnxruntime: pip install 'tformer[onnx]'") from None
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: its optimizer's notices are not the user's business
    options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types for a bad file
        raise TformerError(f"{model} is not a loadable ONNX model ({str(exc).splitlines()[0][:200]}); export the "
                           f"checkpoint again") from None
