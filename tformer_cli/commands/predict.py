"""`tformer predict`: label texts with a trained checkpoint. Start-up matters here: no Hydra tree, only torch,
safetensors and tokenizers (no transformers, datasets or scikit-learn); --runtime onnx: onnxruntime, not torch."""
from __future__ import annotations

import contextlib
import sys

from ..console import progress
from ..data.given import texts_of
from ..data.visible import has_visible
from ..classifier import EXPLAIN_METHODS, MAX_BATCH
from ..errors import TformerError
from ..evaluation import answers, conformal
from ..safe_text import terminal
from ..yesno import parse_bool
from .options import flag_name, parse_flags, switch_or_word

USAGE = """usage: tformer predict [TEXT ...] [--checkpoint PATH] [--top-k N] [--file PATH|-] [--json] [--explain[=M]]
                       [--raw] [--batch-size N] [--device auto|cpu|cuda] [--max-chars N] [--max-lines N]
                       [--runtime torch|onnx] [--coverage LEVEL] [--outputs-dir DIR] [--text-column NAME] [--]
                       [TEXT ...]

Labels each TEXT (or each line of --file PATH, or of standard input when no TEXT is given and input is piped; a
.csv/.tsv/.json/.jsonl/.parquet file: each row's --text-column, default text).
Every argument that is not a flag is a text. One that looks like an old-style option (checkpoint=x) is refused:
write --checkpoint=x, or put -- before it to label it as a text; after --, every argument is a text.
Flags take their value as `--flag VALUE` or `--flag=VALUE`, spelled with - or _ (--top-k, --top_k); -k is
--top-k, -f is --file. --checkpoint defaults to the best checkpoint of the newest run under outputs/.
--explain shows which words drove each decision: how much the answer's probability falls when each is deleted
(occlusion; --explain=rollout: attention rollout over tokens, torch only). --runtime onnx runs the run's ONNX
export (`tformer export`; --checkpoint may be the export dir) with onnxruntime, without torch. Probabilities are
calibrated (the temperature fitted on the validation split); --raw shows the model's own (the same labels).
--coverage 0.9 (0.50 .. 0.99) adds each text's label set, which holds the true label at least that share of the
time (conformal, fitted on validation): several labels where the model is unsure, none where it is surer than the
level needs. Texts longer than --max-chars are cut (a warning says how many); a file line with no end in sight
(over 64 MiB, or 40 x max-chars bytes) is refused. --json: one JSON line per text, control characters as \\uXXXX."""

DEFAULTS = {"checkpoint": None, "top_k": 1, "file": None, "json": False, "explain": False, "raw": False,
            "batch_size": 64, "device": "auto", "runtime": "torch", "max_chars": 100_000, "max_lines": 1_000_000,
            "outputs_dir": "outputs", "coverage": None, "text_column": None}
_SHORT = {"-k": "top_k", "-f": "file"}
CHUNK = 4096  # texts labelled and written at a time (a table: one per chunk)


def parse_args(argv: list[str]) -> tuple[dict, list[str]]:
    opts, texts = parse_flags(argv, DEFAULTS, USAGE, "predict", short=_SHORT, switches=("json", "explain", "raw"))
    counts = ("top_k", "batch_size", "max_chars", "max_lines")
    try:
        opts.update({key: int(opts[key]) for key in counts})
    except ValueError as exc:
        raise TformerError(f"--top-k, --batch-size, --max-chars and --max-lines must be integers "
                           f"({terminal(exc)})") from exc
    opts.update({key: parse_bool(opts[key], flag_name(key)) for key in ("json", "raw") if isinstance(opts[key], str)},
                explain=switch_or_word(opts["explain"], EXPLAIN_METHODS, "--explain", argv))
    for key in counts:  # (a batch past MAX_BATCH is a typo that would overflow torch's split)
        bound = "at least 1" if opts[key] < 1 else f"at most {MAX_BATCH}" if key == "batch_size" else None
        if bound and (opts[key] < 1 or opts[key] > MAX_BATCH):
            raise TformerError(f"{flag_name(key)}={opts[key]} must be {bound}")
    opts["coverage"] = None if opts["coverage"] is None else conformal.level(opts["coverage"], "--coverage")
    if opts["runtime"] not in ("torch", "onnx"):
        raise TformerError(f"--runtime={terminal(opts['runtime'])!r} must be torch (the checkpoint) or onnx (its "
                           f"export)")
    if opts["runtime"] == "onnx" and opts["device"] not in ("auto", "cpu"):
        raise TformerError(f"--runtime=onnx runs on the CPU; drop --device={terminal(opts['device'])} or use "
                           f"--runtime=torch")
    return opts, texts


def load_predictor(opts: dict, own_process: bool = False):
    """The classifier predict runs: the checkpoint under torch, or its ONNX export under onnxruntime. In a process
    of its own (the predict command, not serve), a few texts run on one thread (classifier.py: LITTLE_WORK_FLOPS)."""
    from ..store.locate import newest

    if opts["runtime"] == "onnx":
        from ..deploy.onnx_classifier import OnnxClassifier

        clf = OnnxClassifier.load(opts["checkpoint"], outputs_dir=opts["outputs_dir"])
        if not opts["checkpoint"]:
            print(f"[tformer] using the newest run's export: {terminal(clf.path)}", file=sys.stderr)
        return clf
    from ..classifier import Classifier, threads_by_work

    if own_process:
        threads_by_work()
    path = opts["checkpoint"] or newest(opts["outputs_dir"])
    if not opts["checkpoint"]:
        print(f"[tformer] using the newest checkpoint: {terminal(path)}", file=sys.stderr)
    return Classifier.load(path, device=opts["device"], key="--checkpoint")


def main(argv: list[str]) -> int:
    opts, texts = parse_args(argv)
    if opts["file"]:
        texts += texts_of(str(opts["file"]), opts["max_lines"], opts["max_chars"], opts["text_column"])
    elif not texts and not sys.stdin.isatty():
        texts = texts_of("-", opts["max_lines"], opts["max_chars"], opts["text_column"])
    if not texts:
        raise TformerError("no text to label; pass texts as arguments, --file PATH, or pipe lines on stdin")
    truncated = sum(len(t) > opts["max_chars"] for t in texts)
    if truncated:
        print(f"[tformer] {truncated} text(s) longer than --max-chars={opts['max_chars']} were cut", file=sys.stderr)
        texts = [t[: opts["max_chars"]] for t in texts]
    clf = load_predictor(opts, own_process=True)
    blank = sum(not has_visible(t) for t in texts)
    if blank:
        print(f"[tformer] {blank} empty text(s) have no label (marked empty)", file=sys.stderr)
    k = min(opts["top_k"], len(clf.labels))
    starts = range(0, len(texts), CHUNK)
    # a file's answers come out a chunk at a time: memory stays flat in rows, and a stopped run keeps what it wrote
    with progress(total=len(texts), desc="labelling", unit="text") if len(starts) > 1 and not sys.stdout.isatty() \
            else contextlib.nullcontext() as bar:
        for start in starts:
            part = texts[start:start + CHUNK]
            results = clf.predict(part, top_k=opts["top_k"], explain=opts["explain"], batch_size=opts["batch_size"],
                                  calibrated=not opts["raw"], coverage=opts["coverage"])
            if opts["json"]:
                answers.print_json_lines(results, k)
            else:
                answers.print_table(results, k, opts["explain"], clf.word_pieces if opts["explain"] else None)
            sys.stdout.flush()
            if bar is not None:
                bar.update(len(part))
    return 0
