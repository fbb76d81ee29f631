"""`tformer serve [checkpoint=PATH] [runtime=torch|onnx] [host=127.0.0.1] [port=8000] ...`"""
from __future__ import annotations

import contextlib
import sys

from .. import cores
from ..classifier import MAX_BATCH
from ..errors import TformerError
from ..safe_text import terminal
from ..yesno import parse_bool
from .options import parse_key_values

USAGE = """usage: tformer serve [checkpoint=PATH] [runtime=torch|onnx] [host=127.0.0.1] [port=8000]
                     [max_batch=64] [max_wait_ms=5] [max_texts=256] [max_chars=20000]
                     [max_body_bytes=2000000] [device=auto|cpu|cuda] [access_log=false]
                     [header_timeout_s=10] [body_timeout_s=30] [keep_alive_s=5] [max_connections=512]

Serves the checkpoint (default: the newest run's best; runtime=onnx: its export) over HTTP:
  POST /predict  ["text", ...] or {"texts": [...], "top_k": 2}  ->  {"predictions": [...]}
  GET  /labels   GET /health
Concurrent requests are batched (up to max_batch texts gathered for max_wait_ms). port=0 picks a free port
(printed). Ctrl-C stops it after the requests in flight. Listens on loopback unless host= says otherwise.
Slow clients: a request whose headers take over header_timeout_s seconds (from the connection, or from its
first byte on a kept-alive one), or whose body takes over body_timeout_s (from the end of its headers), gets
408 and is closed; an idle connection is closed after keep_alive_s; beyond max_connections open connections
a new one gets 503 and is closed at once."""

DEFAULTS = {"checkpoint": None, "runtime": "torch", "host": "127.0.0.1", "port": "8000", "max_batch": "64",
            "max_wait_ms": "5", "max_texts": "256", "max_chars": "20000", "max_body_bytes": "2000000",
            "device": "auto", "access_log": "false", "outputs_dir": "outputs", "header_timeout_s": "10",
            "body_timeout_s": "30", "keep_alive_s": "5", "max_connections": "512"}
INTEGERS = ("port", "max_batch", "max_texts", "max_chars", "max_body_bytes", "max_connections")
HIGHEST = {"port": (0, 65535), "max_batch": (1, MAX_BATCH)}  # (least, most); the others: at least 1
SECONDS = ("header_timeout_s", "body_timeout_s", "keep_alive_s")


def parse_args(argv: list[str]) -> dict:
    opts = parse_key_values(argv, DEFAULTS, USAGE, "serve")
    for key in INTEGERS:
        try:
            opts[key] = int(opts[key])
        except ValueError:
            raise TformerError(f"{key}={opts[key]!r} must be an integer") from None
        low, high = HIGHEST.get(key, (1, None))
        if opts[key] < low or (high is not None and opts[key] > high):
            raise TformerError(f"{key}={opts[key]} is out of range ({low}-{high})" if high is not None else
                               f"{key}={opts[key]} is out of range (at least {low})")
    try:
        opts["max_wait_ms"] = float(opts["max_wait_ms"])
    except ValueError:
        raise TformerError(f"max_wait_ms={opts['max_wait_ms']!r} must be a number") from None
    if not 0 <= opts["max_wait_ms"] <= 1000:
        raise TformerError(f"max_wait_ms={opts['max_wait_ms']} must be between 0 and 1000")
    for key in SECONDS:
        try:
            seconds = float(opts[key])
        except ValueError:
            raise TformerError(f"{key}={terminal(repr(opts[key]))} must be a number of seconds") from None
        if not 0 < seconds <= 86400:  # (NaN fails this too; inf and huge values overflow the event loop's timer)
            raise TformerError(f"{key}={terminal(opts[key])} must be a number of seconds above 0 (at most 86400)")
        opts[key] = seconds
    opts["access_log"] = parse_bool(opts["access_log"], "access_log")
    if opts["runtime"] not in ("torch", "onnx"):
        raise TformerError(f"runtime={opts['runtime']!r} must be torch (the checkpoint) or onnx (its export)")
    return opts


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise TformerError("tformer serve needs FastAPI and uvicorn: pip install 'tformer[serve]'") from None
    from ..deploy.serve import ConnectionLimits, ServeLimits, bind, create_app, run_server
    from ..classifier import threads_by_work
    from .predict import load_predictor

    sock = bind(opts["host"], opts["port"])  # before the model loads: a taken port fails at once
    clf = load_predictor({**opts, "runtime": opts["runtime"]})
    limits = ServeLimits(max_texts=opts["max_texts"], max_chars=opts["max_chars"],
                         max_body_bytes=opts["max_body_bytes"])
    app = create_app(clf, limits=limits, max_batch=opts["max_batch"], max_wait_ms=opts["max_wait_ms"])
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"[tformer] serving {terminal(clf.path)} ({clf.runtime}, {len(clf.labels)} labels) on http://{shown}:{port}  "
          f"(POST /predict, GET /labels, GET /health; Ctrl-C stops)", flush=True)
    connections = ConnectionLimits(**{key: opts[key] for key in (*SECONDS, "max_connections")})
    share = contextlib.nullcontext()
    if opts["runtime"] == "torch":  # a little work on one thread, more on this process's share of the cores
        threads_by_work()  # (beside a training: the share the training leaves, cores.py)
        share = cores.claimed(None, "OMP_NUM_THREADS", sets_torch=False)
    with share:
        run_server(app, sock, access_log=opts["access_log"], connections=connections)
    print("[tformer] server stopped", file=sys.stderr, flush=True)
    return 0
