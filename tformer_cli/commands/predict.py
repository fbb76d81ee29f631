"""`tformer predict`: label texts with a trained checkpoint.

Start-up matters here, so this command parses its few options itself instead of composing the Hydra tree,
and imports only torch, safetensors and tokenizers (no transformers, datasets or scikit-learn); with
runtime=onnx (an exported model, `tformer export`) not even torch: onnxruntime, tokenizers and numpy.
"""
from __future__ import annotations

import json
import re
import sys

from ..errors import TformerError
from ..evaluation import answers
from ..yesno import parse_bool
from .options import KEY_VALUE

USAGE = """usage: tformer predict [TEXT ...] [checkpoint=PATH] [top_k=N] [file=PATH|-] [json=true]
                       [explain=true] [batch_size=N] [device=auto|cpu|cuda] [max_chars=N] [max_lines=N]
                       [runtime=torch|onnx]

Labels each TEXT (or each line of file=PATH, or of standard input when no TEXT is given and input is piped).
checkpoint defaults to the best checkpoint of the newest run under outputs/. explain=true (--explain) shows which tokens
drove each decision (last-layer attention from the pooled position, and attention rollout). runtime=onnx runs
the run's ONNX export (`tformer export`; checkpoint= may be the export dir) with onnxruntime, without torch.
Flags --top-k N, --file PATH, --json, --explain, --checkpoint PATH and --runtime NAME are accepted too."""

DEFAULTS = {"checkpoint": None, "top_k": 1, "file": None, "json": False, "explain": False, "batch_size": 64,
            "device": "auto", "runtime": "torch",
            "max_chars": 100_000, "max_lines": 1_000_000, "outputs_dir": "outputs"}
_FLAGS = {"--top-k": "top_k", "-k": "top_k", "--file": "file", "-f": "file", "--checkpoint": "checkpoint",
          "--batch-size": "batch_size", "--device": "device", "--runtime": "runtime"}
_SWITCHES = ("--json", "--explain")
_FLAG_LIKE = re.compile(r"^--?[A-Za-z][\w-]*$")  # one word after - or --: a flag, never a text


def parse_args(argv: list[str]) -> tuple[dict, list[str]]:
    opts, texts, i, only_texts = dict(DEFAULTS), [], 0, False
    while i < len(argv):
        arg = argv[i]
        m = KEY_VALUE.match(arg)
        if only_texts:
            texts.append(arg)
        elif arg == "--":
            only_texts = True
        elif arg in ("-h", "--help"):
            print(USAGE)
            raise SystemExit(0)
        elif arg in ("--json", "--explain"):
            opts[arg[2:]] = True
        elif arg in _FLAGS:
            if i + 1 >= len(argv):
                raise TformerError(f"{arg} needs a value; see `tformer predict --help`")
            opts[_FLAGS[arg]] = argv[i + 1]
            i += 1
        elif m and m.group(1) in DEFAULTS:
            opts[m.group(1)] = m.group(2)
        elif m and " " not in m.group(1):
            raise TformerError(f"unknown option {m.group(1)!r}; predict takes {', '.join(DEFAULTS)} "
                               f"(put `--` before texts that contain '=')")
        elif _FLAG_LIKE.match(arg):
            raise TformerError(f"unknown flag {arg!r}; predict knows {', '.join([*_FLAGS, *_SWITCHES, '--help'])} "
                               f"(put `--` before texts that start with '-')")
        else:
            texts.append(arg)
        i += 1
    counts = ("top_k", "batch_size", "max_chars", "max_lines")
    try:
        opts.update({key: int(opts[key]) for key in counts})
    except ValueError as exc:
        raise TformerError(f"top_k, batch_size, max_chars and max_lines must be integers ({exc})") from exc
    opts.update({key: parse_bool(opts[key], key) for key in ("json", "explain") if isinstance(opts[key], str)})
    for key in counts:
        if opts[key] < 1:
            raise TformerError(f"{key}={opts[key]} must be at least 1")
    if opts["runtime"] not in ("torch", "onnx"):
        raise TformerError(f"runtime={opts['runtime']!r} must be torch (the checkpoint) or onnx (its export)")
    if opts["runtime"] == "onnx" and opts["device"] not in ("auto", "cpu"):
        raise TformerError(f"runtime=onnx runs on the CPU; drop device={opts['device']} or use runtime=torch")
    return opts, texts


def load_predictor(opts: dict):
    """The classifier predict runs: the checkpoint under torch, or its ONNX export under onnxruntime."""
    from ..store.locate import newest

    if opts["runtime"] == "onnx":
        from ..deploy.onnx_classifier import OnnxClassifier

        clf = OnnxClassifier.load(opts["checkpoint"], outputs_dir=opts["outputs_dir"])
        if not opts["checkpoint"]:
            print(f"[tformer] using the newest run's export: {clf.path}", file=sys.stderr)
        return clf
    from ..classifier import Classifier

    path = opts["checkpoint"] or newest(opts["outputs_dir"])
    if not opts["checkpoint"]:
        print(f"[tformer] using the newest checkpoint: {path}", file=sys.stderr)
    return Classifier.load(path, device=opts["device"])


def read_lines(source: str, max_lines: int) -> list[str]:
    stream = sys.stdin.buffer if source == "-" else None
    try:
        fh = stream or open(source, "rb")
    except OSError as exc:
        raise TformerError(f"cannot read {source}: {exc.strerror}; check the path") from exc
    lines = []
    with fh:
        for n, raw in enumerate(fh, start=1):
            if n > max_lines:
                raise TformerError(f"{source} has more than max_lines={max_lines} lines; split the file or raise "
                                   f"max_lines")
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise TformerError(f"{source} line {n} is not valid UTF-8 (byte {exc.start}); convert the file, "
                                   f"e.g. `iconv -f latin1 -t utf-8`") from exc
            lines.append(line)  # blank lines too: the answers line up with the input lines
    return lines


def main(argv: list[str]) -> int:
    opts, texts = parse_args(argv)
    if opts["file"]:
        texts += read_lines(str(opts["file"]), opts["max_lines"])
    elif not texts and not sys.stdin.isatty():
        texts = read_lines("-", opts["max_lines"])
    if not texts:
        raise TformerError("no text to label; pass texts as arguments, file=PATH, or pipe lines on stdin")
    truncated = sum(len(t) > opts["max_chars"] for t in texts)
    if truncated:
        print(f"[tformer] {truncated} text(s) longer than max_chars={opts['max_chars']} were cut", file=sys.stderr)
        texts = [t[: opts["max_chars"]] for t in texts]

    clf = load_predictor(opts)
    blank = sum(not t.strip() for t in texts)
    if blank:
        print(f"[tformer] {blank} empty text(s) have no label (marked empty)", file=sys.stderr)
    results = clf.predict(texts, top_k=opts["top_k"], explain=opts["explain"], batch_size=opts["batch_size"])
    k = min(opts["top_k"], len(clf.labels))
    if opts["json"]:
        for r in results:
            if k == 1:
                r.pop("top_k")
            print(json.dumps(r, ensure_ascii=False, allow_nan=False))
        return 0
    answers.print_table(results, k, opts["explain"])
    return 0
