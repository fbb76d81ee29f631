"""`tformer serve`: a trained classifier behind HTTP (FastAPI on uvicorn).

    POST /predict   body: ["text", ...]  or  {"texts": ["text", ...], "top_k": 2, "raw": false, "coverage": 0.9}
                    -> {"predictions": [{"text", "label", "probability", "top_k"?} | {"text", "empty": true}, ...]}
                    probabilities are calibrated (the checkpoint's temperature); "raw": true in the body, or
                    ?raw=true, gives the model's uncalibrated ones (the same labels); "coverage": 0.9 (or
                    ?coverage=0.9) adds each text's conformal label set ("label_set", evaluation/conformal.py);
                    any other query parameter is a 400
    GET  /labels    -> {"labels": [...]}
    GET  /health    -> {"status": "ok", "runtime", "checkpoint", "requests", "batches", "texts", ...}

Why FastAPI + uvicorn: the most used and best kept Python ASGI pair, small (no model-server framework with its
own packaging), async so that many clients can wait on one model. Requests arriving together are batched: a
single worker takes every text queued within `max_wait_ms` (up to `max_batch` texts) and runs them as one
forward pass in a thread, so the event loop keeps answering (/health stays responsive under load) and concurrent
small requests cost about one batch. The model runs one batch at a time.

Every refusal is a 4xx with {"error": "<one line naming the problem and the fix>"}: a body that is not JSON or
has the wrong shape, too many texts, a text too long, a body over max_body_bytes (413). An unexpected failure is
a 500 with one line and no traceback (the server logs the same line to stderr).

Slow and vanished clients (ConnectionLimits): uvicorn bounds idle keep-alive connections (timeout_keep_alive) and
header size (h11), but not how long a client may take to send its headers or its body, nor how many connections
may be open: a client trickling one byte at a time held a connection (and a file descriptor) for ever. Its h11
protocol is subclassed (GuardedH11Protocol) to add those three, and to log a client that disconnects before its
answer as one line (uvicorn logged "Exception in ASGI application" and a traceback for each).
"""

import asyncio
import json
import math
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass

from ..classifier import MAX_BATCH, whole_number
from ..errors import TformerError
from ..evaluation import conformal
from ..safe_text import terminal, valid_unicode
from ..yesno import is_bool_word, parse_bool


@dataclass
class ServeLimits:
    max_texts: int = 256  # per request
    max_chars: int = 20_000  # per text
    max_body_bytes: int = 2_000_000
    max_top_k: int = 100


@dataclass
class ConnectionLimits:
    """What a client may hold: without these a client that sends its request slowly, or not at all, keeps its
    connection open for as long as it likes, and a few hundred such clients exhaust the server's file descriptors."""
    # request line + headers complete within this, from the connection (on a kept-alive connection: from the next
    # request's first byte, the idle time before it being keep_alive_s's); else 408 and closed
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0  # the whole body, counted from the end of the headers; else 408 and closed
    keep_alive_s: float = 5.0  # an idle connection between requests is closed after this (uvicorn's own timer)
    max_connections: int = 512  # open connections served at once; one more gets 503 and is closed at once


class Notices:
    """The server's lines about clients (timed out, disconnected, refused) on stderr: each kind at most once every
    `every_s` seconds, the next line counting those held back, so a flood (a slow-client attack, a load balancer
    dropping hundreds of connections) costs a few lines, not one per client."""

    def __init__(self, every_s: float = 10.0):
        self.every_s = every_s
        self.last: dict[str, float] = {}
        self.held: dict[str, int] = {}

    def __call__(self, kind: str, line: str) -> None:
        now = time.monotonic()
        if now - self.last.get(kind, -math.inf) < self.every_s:
            self.held[kind] = self.held.get(kind, 0) + 1
            return
        self.last[kind] = now
        held = self.held.pop(kind, 0)
        more = f" (and {held} more like it since the last such line)" if held else ""
        print(f"[tformer serve] {line}{more}", file=sys.stderr, flush=True)


def refusal(status: int, reason: str, message: str) -> bytes:
    """A complete HTTP/1.1 response that closes the connection, written by the protocol itself where no
    application answers (a connection over the cap, a request too slow)."""
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n\r\n").encode() + body


def guarded_protocol(limits: ConnectionLimits, notices: Notices):
    """uvicorn's h11 protocol class with a header deadline, a body deadline, a connection cap and one-line
    disconnects (uvicorn creates one protocol per connection, passing only its own config: hence a class made
    here around `limits`)."""
    import h11  # deferred: the optional serve extra
    from uvicorn.protocols.http.h11_impl import H11Protocol

    lingering = [0]  # refused connections still open for their 503 to be read: bounded too

    class GuardedH11Protocol(H11Protocol):
        timer: asyncio.TimerHandle | None = None
        timer_kind: str | None = None  # "headers" or "body": what the running deadline waits for
        refused = timed_out = client_closed = lingers = False

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                self.refuse()
            else:
                self.arm("headers")

        def refuse(self) -> None:
            """503 at once, then a lingering close: the client's request, arriving after our answer, must not
            turn into a TCP reset that can destroy the 503 before the client reads it."""
            self.refused = True
            self.connections.discard(self)  # the cap counts the connections being served
            notices("refused", f"max_connections={limits.max_connections} reached: new connections get 503 and are "
                               f"closed (start the server with a larger max_connections if this is expected load)")
            self.transport.write(refusal(503, "Service Unavailable", f"the server is at max_connections="
                                         f"{limits.max_connections} open connections; retry shortly"))
            self.transport.write_eof()
            if lingering[0] >= limits.max_connections:  # a flood: no more open sockets for courtesy
                self.transport.close()
                return
            lingering[0] += 1
            self.lingers = True  # (counted down when the connection goes, whoever closes it)
            self.timer = self.loop.call_later(2.0, self.transport.close)

        def data_received(self, data: bytes) -> None:
            if self.refused:  # (a refused client's request: read and dropped until it closes)
                return
            super().data_received(data)
            self.watch(bytes_waiting=True)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self.watch(bytes_waiting=bool(self.conn.trailing_data[0]))

        def eof_received(self):
            self.client_closed = True
            return super().eof_received()

        def connection_lost(self, exc) -> None:
            self.cancel()
            if self.lingers:
                lingering[0] -= 1
                self.lingers = False
            gone = exc is not None or self.client_closed
            if gone and self.cycle is not None and not self.cycle.response_complete and not (
                    self.timed_out or self.refused):
                mid = "while sending its body" if self.conn.their_state is h11.SEND_BODY else "before its answer"
                notices("disconnect", f"{self.request_name()}: the client disconnected {mid}")
            super().connection_lost(exc)

        def watch(self, bytes_waiting: bool) -> None:
            """The deadline that fits where the request is: its headers (armed at the connection, or at the first
            byte of a kept-alive connection's next request, idle time being keep_alive_s's), its body (from the
            end of its headers), or none (the application has the request)."""
            state = self.conn.their_state
            want = None
            if self.transport.is_closing():
                want = None
            elif state is h11.IDLE and (bytes_waiting or self.timer_kind == "headers"):
                want = "headers"
            elif state is h11.SEND_BODY:
                want = "body"
            if want != self.timer_kind:
                self.cancel()
                if want:
                    self.arm(want)

        def arm(self, kind: str) -> None:
            seconds = limits.header_timeout_s if kind == "headers" else limits.body_timeout_s
            self.timer, self.timer_kind = self.loop.call_later(seconds, self.late), kind

        def cancel(self) -> None:
            if self.timer is not None:
                self.timer.cancel()
            self.timer = self.timer_kind = None

        def late(self) -> None:
            kind, self.timer, self.timer_kind = self.timer_kind, None, None
            if self.transport.is_closing():
                return
            self.timed_out = True
            who = "%s:%d" % self.client if self.client else "a client"
            if kind == "headers":
                partial = bool(self.conn.trailing_data[0])
                if partial:
                    self.transport.write(refusal(408, "Request Timeout", f"the request headers did not arrive "
                                                 f"within header_timeout_s={limits.header_timeout_s:g}"))
                notices("headers", f"{who}: {'no complete request headers' if partial else 'no request'} within "
                                   f"header_timeout_s={limits.header_timeout_s:g}; connection closed")
            else:
                answered = self.cycle is None or self.cycle.response_started
                if not answered:
                    self.transport.write(refusal(408, "Request Timeout", f"the request body did not arrive within "
                                                 f"body_timeout_s={limits.body_timeout_s:g}; send it faster, or "
                                                 f"fewer texts per request"))
                if self.cycle is not None:  # the application, waiting for the body, is told the client is gone
                    self.cycle.disconnected = True
                    self.cycle.message_event.set()
                notices("body", f"{self.request_name()}: the body did not arrive within body_timeout_s="
                                f"{limits.body_timeout_s:g}; {'connection closed' if answered else '408, closed'}")
            self.transport.close()

        def request_name(self) -> str:
            who = "%s:%d" % self.client if self.client else "a client"
            if self.scope is None:
                return who
            return f"{self.scope['method']} {terminal(self.scope['path'][:200])} from {who}"

    return GuardedH11Protocol


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def unique_keys(pairs: list[tuple]) -> dict:
    """A JSON object whose key is given twice with two values would keep its last value unsaid ({"top_k": 1,
    "top_k": 5}): refused. (The same value twice chooses nothing and passes, as on a command line.)"""
    seen = {}
    for key, value in pairs:  # (compared as JSON: true is not 1)
        if key in seen and json.dumps(seen[key], sort_keys=True) != json.dumps(value, sort_keys=True):
            raise BadRequest(f"the key {json.dumps(key)[:80]} is given twice in one JSON object with two values; "
                             f"give it once")
        seen[key] = value
    return seen


def read_body(body: bytes):
    """The JSON value of a /predict body (a key given twice with two values in an object refused), or BadRequest."""
    try:
        return json.loads(body, object_pairs_hook=unique_keys)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON ({exc}); send a JSON list of texts or "
                         f'{{"texts": [...], "top_k": 1}}') from None
    except ValueError:  # an integer past Python's limit on digits read (4,300)
        raise BadRequest("the body holds a number too long to read (thousands of digits); top_k is a small "
                         "integer and texts are strings") from None
    except RecursionError:
        raise BadRequest("the body nests JSON too deeply; send a flat list of texts") from None


def parse_request(body, limits: ServeLimits, n_labels: int) -> tuple[list[str], int]:
    """(texts, top_k) of a /predict body (its bytes, or its JSON value as `read_body` read it), or BadRequest saying
    what is wrong with it (its "raw" and "coverage": `parse_query`)."""
    data = read_body(body) if isinstance(body, (bytes, bytearray)) else body
    top_k = 1
    if isinstance(data, dict):
        unknown = sorted(set(data) - {"texts", "top_k", "raw", "coverage"})
        if unknown:
            raise BadRequest(f"unknown field(s) {', '.join(map(repr, unknown))}; the body takes texts, top_k, raw "
                             f"and coverage")
        if "texts" not in data:
            raise BadRequest('the body has no "texts"; send {"texts": ["..."]} or a JSON list of texts')
        top_k = data.get("top_k", 1)
        data = data["texts"]
    if not isinstance(data, list):
        raise BadRequest("texts must be a JSON list of strings")
    if not data:
        raise BadRequest("texts is empty; send at least one text")
    if len(data) > limits.max_texts:
        raise BadRequest(f"{len(data)} texts in one request; at most {limits.max_texts} (split the request, or "
                         f"start the server with a larger max_texts)")
    bad = next((i for i, t in enumerate(data) if not isinstance(t, str)), None)
    if bad is not None:
        raise BadRequest(f"texts[{bad}] is {type(data[bad]).__name__}, not a string")
    long = next((i for i, t in enumerate(data) if len(t) > limits.max_chars), None)
    if long is not None:
        raise BadRequest(f"texts[{long}] has {len(data[long])} characters; at most {limits.max_chars} (cut it, or "
                         f"start the server with a larger max_chars)")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= limits.max_top_k:
        raise BadRequest(f"top_k={repr(top_k)[:40]} must be an integer from 1 to {limits.max_top_k}")
    # a lone surrogate ("\ud800" is valid JSON) is U+FFFD, as predict reads it: no UTF-8 answer could echo it
    return [valid_unicode(t) for t in data], min(top_k, n_labels)


def parse_query(data, query, classifier) -> tuple[bool, float | None]:
    """(raw, coverage) of a /predict request: its ?raw= and ?coverage= (`query`: Starlette's multi-dict), or the
    same keys of its JSON body (`data`: the body's JSON value, checked by parse_request); any other query
    parameter, and one given twice with two values, refused."""
    unknown = sorted(set(query) - {"raw", "coverage"})
    if unknown:
        raise BadRequest(f"unknown query parameter {unknown[0][:40]!r}; /predict takes ?raw= and ?coverage= (or the "
                         f"same keys in a JSON body)")
    for key, meaning in (("raw", lambda v: parse_bool(v, "raw") if is_bool_word(v) else v),
                         ("coverage", lambda v: conformal.level_of(v, "?coverage"))):
        values = query.getlist(key)
        meanings = [meaning(v) for v in values]
        wrong = next((v for v, m in zip(values, meanings) if isinstance(m, str)), None)  # (what no value means)
        if wrong is not None and len(values) > 1:  # the first wrong one's own line, as if given once
            parse_raw({}, wrong) if key == "raw" else parse_coverage({}, classifier, wrong)
        if len(set(meanings)) > 1:  # (one value twice, or two spellings of it, choose nothing)
            raise BadRequest(f"?{key}= is given {len(values)} times with different values; give it once")
    return parse_raw(data, query.get("raw")), parse_coverage(data, classifier, query.get("coverage"))


def parse_raw(data, query: str | None) -> bool:
    """Whether a /predict request asks for raw (uncalibrated) probabilities: "raw": true|false in a JSON object
    body (`data`: its JSON value), or ?raw=true|false (yes/no/1/0/on/off too, as yesno.parse_bool reads them);
    both given must agree."""
    given = data.get("raw") if isinstance(data, dict) else None
    if given is not None and not isinstance(given, bool):
        raise BadRequest(f"raw={json.dumps(given)[:80]} must be true or false")
    if query is not None:
        try:
            asked = parse_bool(query, "raw")
        except TformerError as exc:  # (parse_bool's ConfigError)
            raise BadRequest(f"?raw={query[:80]!r}: {exc}") from None
        if given is not None and given != asked:
            raise BadRequest(f"?raw={query[:80]} and the body's raw={json.dumps(given)} disagree; give one")
        given = asked
    return bool(given)


def parse_coverage(data, classifier, query: str | None = None) -> float | None:
    """The label-set level a /predict request asks for ("coverage": 0.9 in a JSON object body, `data` its JSON
    value, or ?coverage=0.9; both given must agree; None: no set), or BadRequest."""
    given = data.get("coverage") if isinstance(data, dict) else None
    if given is not None and (isinstance(given, bool) or not isinstance(given, (int, float))):
        raise BadRequest(f"coverage={json.dumps(given)[:80]} must be a number from 0.50 to 0.99")
    if query is not None:
        said, asked = (None if given is None else conformal.level_of(given)), conformal.level_of(query, "?coverage")
        for level in (said, asked):
            if isinstance(level, str):
                raise BadRequest(level)
        if said is not None and said != asked:
            raise BadRequest(f"?coverage={query[:80]} and the body's coverage={json.dumps(given)[:80]} disagree; "
                             f"give one")
        given = asked
    if given is None:
        return None
    try:
        return classifier.label_set_cut(given)[0]  # (the predictor's own checks: the level, the saved cuts)
    except TformerError as exc:
        raise BadRequest(str(exc)) from None


class MicroBatcher:
    """Gathers the texts of concurrent requests into batches for one model worker."""

    def __init__(self, classifier, max_batch: int, max_wait_ms: float):
        max_batch = whole_number(max_batch, "max_batch", high=MAX_BATCH)  # (an app built from Python)
        self.classifier, self.max_batch, self.max_wait = classifier, max_batch, max_wait_ms / 1000
        self.queue: asyncio.Queue | None = None
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tformer-model")
        self.batches = self.texts = 0
        self._worker = None

    def start(self) -> None:
        self.queue = asyncio.Queue()
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def predict(self, texts: list[str], top_k: int, raw: bool = False,
                      coverage: float | None = None) -> list[dict]:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((texts, top_k, future, raw, coverage))
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = [await self.queue.get()]
            size = len(jobs[0][0])
            deadline = loop.time() + self.max_wait
            while size < self.max_batch:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self.queue.get(), timeout)
                except asyncio.TimeoutError:
                    break
                jobs.append(job)
                size += len(job[0])
            k = max(job[1] for job in jobs)
            # one pass per kind of answer asked for (calibrated or raw, a label-set level): nearly always one
            kinds = list(dict.fromkeys((job[3], job[4]) for job in jobs))
            groups = [[job for job in jobs if (job[3], job[4]) == kind] for kind in kinds]
            jobs = [job for group in groups for job in group]
            try:
                results = []
                for group in groups:
                    texts = [t for job in group for t in job[0]]
                    results += await loop.run_in_executor(self.executor, lambda: self.classifier.predict(
                        texts, top_k=k, batch_size=self.max_batch, calibrated=not group[0][3],
                        coverage=group[0][4]))
            except Exception as exc:  # every waiting request learns of it; the worker goes on
                for job in jobs:
                    if not job[2].done():
                        job[2].set_exception(exc)
                continue
            self.batches += 1
            self.texts += len(results)
            start = 0
            for job_texts, job_k, future, _, _ in jobs:
                answers = results[start:start + len(job_texts)]
                start += len(job_texts)
                for a in answers:
                    a["top_k"] = a["top_k"][:job_k]
                    if job_k == 1 or a.get("empty"):
                        a.pop("top_k")
                if not future.done():  # (a client that went away)
                    future.set_result(answers)


def create_app(classifier, *, limits: ServeLimits = ServeLimits(), max_batch: int = 64, max_wait_ms: float = 5.0):
    """The ASGI app serving `classifier` (a Classifier or an OnnxClassifier)."""
    # deferred (fastapi, starlette here; uvicorn in run_server): the optional serve extra
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.requests import ClientDisconnect

    batcher = MicroBatcher(classifier, max_batch, max_wait_ms)
    stats = {"requests": 0, "started": time.time()}

    @asynccontextmanager
    async def lifespan(app):
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="tformer", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def error(message: str, status: int) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):  # 404, 405: the same {"error": ...} shape as every other refusal
        return error(f"{exc.detail}: {request.method} {request.url.path}; the server answers POST /predict, "
                     f"GET /labels and GET /health", exc.status_code)

    def internal(request, exc: Exception) -> JSONResponse:
        """A failure of the server or the model, not of the request: one line to the client and to stderr.
        (Returned from the endpoint itself: Starlette's handler for Exception would log a traceback too.)"""
        text = str(exc).splitlines()[0][:300] if str(exc) else ""
        line = text if isinstance(exc, TformerError) else f"internal error ({type(exc).__name__}: {text})"
        print(f"[tformer serve] {request.method} {terminal(request.url.path)}: {terminal(line)}", file=sys.stderr,
              flush=True)
        return error(line, 500)

    @app.get("/health")
    async def health():
        return {"status": "ok", "runtime": classifier.runtime, "checkpoint": str(classifier.path),
                "temperature": classifier.temperature,  # (null: an uncalibrated checkpoint, T = 1)
                "labels": len(classifier.labels), "requests": stats["requests"], "batches": batcher.batches,
                "texts": batcher.texts, "uptime_s": round(time.time() - stats["started"], 3)}

    @app.get("/labels")
    async def labels():
        return {"labels": classifier.labels}

    @app.post("/predict")
    async def predict(request: Request):
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
            return error(f"the body has {declared} bytes; at most {limits.max_body_bytes} (send fewer texts per "
                         f"request)", 413)
        body = bytearray()
        try:
            async for chunk in request.stream():  # also bounds a body sent without a length (chunked)
                body += chunk
                if len(body) > limits.max_body_bytes:
                    return error(f"the body is over {limits.max_body_bytes} bytes; send fewer texts per request",
                                 413)
        except ClientDisconnect:  # gone, or its body too slow: the protocol has logged it; no one reads this
            return Response(status_code=400)
        try:
            data = read_body(bytes(body))
            texts, top_k = parse_request(data, limits, len(classifier.labels))
            raw, coverage = parse_query(data, request.query_params, classifier)
        except BadRequest as exc:
            return error(str(exc), exc.status)
        stats["requests"] += 1
        try:
            return {"predictions": await batcher.predict(texts, top_k, raw, coverage)}
        except Exception as exc:  # (asyncio.CancelledError, a client gone, is a BaseException and passes)
            return internal(request, exc)

    return app


def bind(host: str, port: int):
    """A listening socket (port 0: a free one), so a port in use is one clear line before anything starts."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise TformerError(f"host={host} cannot be resolved ({exc.strerror}); use 127.0.0.1 or 0.0.0.0") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise TformerError(f"cannot listen on {host}:{port} ({exc.strerror}); pass another port=<n> (port=0 picks "
                           f"a free one)") from None
    # Accepted connections inherit this: without it a keep-alive client waits ~40 ms per response (Nagle's
    # algorithm holding the body until the headers' delayed ACK), as uvicorn sets it only on sockets it binds.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.listen(2048)
    return sock


def run_server(app, sock, *, access_log: bool = False, connections: ConnectionLimits = ConnectionLimits()) -> None:
    """Serve until Ctrl-C or SIGTERM (uvicorn finishes the requests in flight, then returns)."""
    import uvicorn  # deferred: the optional serve extra

    # limit_concurrency: uvicorn's own 503 once a request's headers are in, counting connections and requests in
    # flight; connections over the cap never get that far (refused at once), so at +1 it bounds the requests
    # still running for clients already gone.
    config = uvicorn.Config(app, log_level="warning", access_log=access_log, timeout_graceful_shutdown=10,
                            http=guarded_protocol(connections, Notices()), timeout_keep_alive=connections.keep_alive_s,
                            limit_concurrency=connections.max_connections + 1)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the signal once it has shut down: the stop it asked for
        pass
