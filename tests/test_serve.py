"""`tformer serve`: a real server process on a loopback port, real HTTP requests (urllib), real answers."""
import json
import os
import select
import signal
import sys
import subprocess
import threading
import urllib.error
import urllib.request

import pytest

from helpers import TFORMER, ctrl_c_reaches_it

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tformer_cli import Classifier  # noqa: E402

pytestmark = pytest.mark.slow  # real `tformer` processes


@pytest.fixture(scope="module")
def run(tiny_run):
    """The session's shared tiny run (conftest.py): served, never changed."""
    return tiny_run.run_dir


class Server:
    def __init__(self, *args, cwd):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("TFORMER_DEBUG", None)
        self.proc = subprocess.Popen([TFORMER, "serve", "port=0", *args], cwd=cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, preexec_fn=ctrl_c_reaches_it)
        ready, _, _ = select.select([self.proc.stdout], [], [], 180)  # a hung start fails the test, not CI
        if not ready:
            self.proc.kill()
            pytest.fail("the server printed nothing within 180 s")
        line = self.proc.stdout.readline()  # "[tformer] serving ... on http://127.0.0.1:<port> ..."
        assert "http://127.0.0.1:" in line, line + self.proc.stderr.read()
        self.url = "http://127.0.0.1:" + line.split("http://127.0.0.1:")[1].split()[0]

    def request(self, path, body=None, *, raw: bytes | None = None, headers=None):
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers=headers or {},
                                     method="POST" if data is not None else "GET")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=20)


@pytest.fixture(scope="module")
def server(run, tmp_path_factory):
    s = Server(f"checkpoint={run}", "max_texts=8", "max_chars=500", "max_body_bytes=4000", "max_wait_ms=20",
               cwd=tmp_path_factory.mktemp("serve_cwd"))
    yield s
    if s.proc.poll() is None:
        s.stop()


def test_health_and_labels(server, run):
    status, health = server.request("/health")
    assert status == 200 and health["status"] == "ok" and health["runtime"] == "torch" and health["labels"] == 2
    assert server.request("/labels") == (200, {"labels": ["negative", "positive"]})


def test_predict_gives_the_classifier_answers(server, run):
    texts = ["a gripping, beautifully shot film", "", "never boring"]
    expected = Classifier.load(run).predict(texts, top_k=2)
    status, body = server.request("/predict", texts)
    assert status == 200 and [p["label"] for p in body["predictions"]] == [e["label"] for e in expected]
    assert body["predictions"][1]["empty"] and "top_k" not in body["predictions"][0]
    status, body = server.request("/predict", {"texts": texts, "top_k": 2})
    assert status == 200
    for got, want in zip(body["predictions"], expected):
        assert got.get("top_k", []) == [dict(x, probability=pytest.approx(x["probability"], abs=1e-5))
                                        for x in want["top_k"]]


def test_a_request_may_ask_for_label_sets_and_gets_the_classifiers(server, run):
    texts = ["a gripping, beautifully shot film", "never boring", "dull"]
    expected = Classifier.load(run).predict(texts, coverage=0.9)
    status, body = server.request("/predict", {"texts": texts, "coverage": 0.9})
    assert status == 200 and [p["label_set"] for p in body["predictions"]] == [e["label_set"] for e in expected]
    assert {p["coverage"] for p in body["predictions"]} == {0.9}
    status, body = server.request("/predict?coverage=0.90", texts)  # (the same, asked in the query)
    assert status == 200 and [p["label_set"] for p in body["predictions"]] == [e["label_set"] for e in expected]
    for query, level, words in [("?coverage=0.8", 0.9, "disagree"), ("?coverage=abc", 0.9, "must be a number"),
                                ("?coverage=0.9", 0.905, "two decimals"), ("?cov=0.9", 0.9, "unknown query parameter"),
                                ("?coverage=0.9&coverage=0.8", 0.9, "?coverage= is given 2 times with different "
                                                                    "values; give it once"),
                                ("?coverage=abc&coverage=0.8x", 0.9, "?coverage='abc' must be a number"),
                                ("?raw=maybe&raw=perhaps", 0.9, "?raw='maybe': raw='maybe' must be")]:
        status, body = server.request(f"/predict{query}", {"texts": texts, "coverage": level})
        assert status == 400 and words in body["error"], (query, body)
    status, body = server.request("/predict?coverage=0.9&coverage=0.90&raw=no&raw=false", texts)  # (one value)
    assert status == 200 and [p["label_set"] for p in body["predictions"]] == [e["label_set"] for e in expected]
    status, body = server.request("/predict", raw=b'{"texts": ["dull"], "top_k": 2, "top_k": 2}',
                                  headers={"Content-Type": "application/json"})
    assert status == 200 and len(body["predictions"][0]["top_k"]) == 2


@pytest.mark.parametrize("body, status, words", [
    (b"not json", 400, "not valid JSON"),
    (b'{"texts": "one string"}', 400, "list of strings"),
    (b'{"text": ["typo"]}', 400, "unknown field"),
    (b"[1, 2]", 400, "texts[0] is int"),
    (b"[]", 400, "at least one text"),
    (json.dumps(["x"] * 9).encode(), 400, "at most 8"),
    (json.dumps(["y" * 501]).encode(), 400, "at most 500"),
    (b'{"texts": ["x"], "top_k": 0}', 400, "top_k=0"),
    (b'{"texts": ["x"], "coverage": 0.905}', 400, "two decimals"),
    (b'{"texts": ["x"], "coverage": "0.9"}', 400, "must be a number"),
    (json.dumps(["z" * 500] * 8).encode(), 413, "at most 4000"),
    (b"[" * 3000, 400, "too deeply"),
    (b'{"texts": ["a"], "texts": ["b", "c"]}', 400, 'the key "texts" is given twice in one JSON object'),
])
def test_bad_requests_get_a_4xx_with_one_line(server, body, status, words):
    got, answer = server.request("/predict", raw=body, headers={"Content-Type": "application/json"})
    assert got == status and set(answer) == {"error"} and words in answer["error"]
    assert "\n" not in answer["error"] and "Traceback" not in answer["error"]


@pytest.mark.parametrize("declared", [True, False])
def test_a_body_far_over_the_limit_gets_its_413_not_a_reset(server, declared):
    """A 413 answered while megabytes are still arriving must reach the client, not a connection reset (with or
    without a declared length: chunked bodies are bounded as they come)."""
    import http.client

    host, port = server.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    big = json.dumps(["w" * 1000] * 20000).encode()  # 20 MB: more than the sockets' buffers hold
    body = big if declared else iter([big[i:i + 65536] for i in range(0, len(big), 65536)])
    conn.request("POST", "/predict", body=body, headers={"Content-Type": "application/json"},
                 encode_chunked=not declared)
    answer = conn.getresponse()
    assert answer.status == 413 and "4000" in json.loads(answer.read())["error"]
    conn.close()
    assert server.request("/health")[0] == 200


def test_unknown_paths_and_methods_use_the_same_error_shape(server):
    assert server.request("/nope")[0] == 404 and "POST /predict" in server.request("/nope")[1]["error"]
    assert server.request("/predict")[0] == 405


def test_concurrent_requests_are_batched_and_each_gets_its_own_answers(server, run):
    texts = [f"review number {i}: " + ("great film" if i % 2 else "dull and boring") for i in range(24)]
    expected = {t: r["label"] for t, r in zip(texts, Classifier.load(run).predict(texts))}
    before = server.request("/health")[1]
    answers, errors = {}, []

    def ask(chunk):
        try:
            status, body = server.request("/predict", chunk)
            assert status == 200
            answers.update({p["text"]: p["label"] for p in body["predictions"]})
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=([texts[i], texts[i + 1]],)) for i in range(0, 24, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and answers == expected
    after = server.request("/health")[1]
    requests, batches = after["requests"] - before["requests"], after["batches"] - before["batches"]
    assert requests == 12 and batches < requests, (requests, batches)  # several requests shared a forward pass


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_the_server_cleanly(run, tmp_path, sig):
    s = Server(f"checkpoint={run}", cwd=tmp_path)
    assert s.request("/health")[0] == 200
    s.proc.send_signal(sig)
    assert s.proc.wait(timeout=20) == 0
    err = s.proc.stderr.read()
    assert "Traceback" not in err and "server stopped" in err


def test_refusals_before_serving_are_one_line(run, tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([TFORMER, "serve", f"checkpoint={run}", f"port={port}"], capture_output=True, text=True,
                           cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and f"{port}" in r.stderr and "port=0" in r.stderr
    r = subprocess.run([TFORMER, "serve", f"checkpoint={tmp_path / 'missing'}"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "does not exist" in r.stderr
    r = subprocess.run([TFORMER, "serve", "max_batch=0"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and "max_batch=0" in r.stderr


FAILING_MODEL = """
import sys
from tformer_cli import Classifier
from tformer_cli.deploy.serve import bind, create_app, run_server

clf = Classifier.load(sys.argv[1])
def predict(texts, **kwargs):  # the model failing mid-request (a fault injected into the real classifier)
    raise RuntimeError("the model fell over\\nsecond line")
clf.predict = predict
sock = bind("127.0.0.1", 0)
print(f"serving on http://127.0.0.1:{sock.getsockname()[1]} ...", flush=True)
run_server(create_app(clf), sock)
"""


def test_a_failing_model_is_a_500_with_one_line_and_no_traceback(run, tmp_path):
    s = Server.__new__(Server)
    s.proc = subprocess.Popen([sys.executable, "-c", FAILING_MODEL, str(run)], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    line = s.proc.stdout.readline()
    s.url = "http://127.0.0.1:" + line.split("http://127.0.0.1:")[1].split()[0]
    status, answer = s.request("/predict", ["hello"])
    assert status == 500 and answer == {"error": "internal error (RuntimeError: the model fell over)"}
    assert s.request("/health")[0] == 200  # the worker goes on
    assert s.stop() == 0
    err = s.proc.stderr.read()
    assert "Traceback" not in err and "[tformer serve] POST /predict: internal error (RuntimeError" in err, err


def test_serve_limits_are_options_refused_in_one_line_when_not_a_positive_number(tmp_path):
    from tformer_cli.commands.serve import DEFAULTS, parse_args
    from tformer_cli.deploy.serve import ConnectionLimits
    from tformer_cli.errors import TformerError

    defaults = ConnectionLimits()  # the --help page and the library state the same defaults
    assert {k: float(DEFAULTS[k]) for k in ("header_timeout_s", "body_timeout_s", "keep_alive_s")} == {
        "header_timeout_s": defaults.header_timeout_s, "body_timeout_s": defaults.body_timeout_s,
        "keep_alive_s": defaults.keep_alive_s}
    assert int(DEFAULTS["max_connections"]) == defaults.max_connections
    assert parse_args(["header_timeout_s=0.5", "--max-connections=7"])["header_timeout_s"] == 0.5
    for bad in ("header_timeout_s=nan", "body_timeout_s=-1", "keep_alive_s=0", "keep_alive_s=inf",
                "body_timeout_s=soon", "max_connections=0", "max_connections=1.5"):
        with pytest.raises(TformerError, match=bad.split("=")[0]):
            parse_args([bad])
    r = subprocess.run([TFORMER, "serve", "header_timeout_s=nan"], capture_output=True, text=True, cwd=tmp_path,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "header_timeout_s=nan" in r.stderr
    r = subprocess.run([TFORMER, "serve", "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    for option in ("header_timeout_s=10", "body_timeout_s=30", "keep_alive_s=5", "max_connections=512"):
        assert option in r.stdout


class GuardedServer(Server):
    """A server whose stderr lines are collected as they come (a thread), so a test can wait for one."""

    def __init__(self, *args, cwd):
        super().__init__(*args, cwd=cwd)
        self.port = int(self.url.rsplit(":", 1)[1])
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True)
        self.reader.start()

    def connect(self):
        import socket

        sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        return sock

    def wait_for_line(self, words: str, after: int = 0) -> list[str]:
        import time

        for _ in range(300):  # a generous 30 s
            new = self.lines[after:]
            if any(words in line for line in new):
                return new
            time.sleep(0.1)
        pytest.fail(f"no stderr line with {words!r} within 30 s: {self.lines}")

    def finish(self) -> str:
        """Stopped; all it wrote to stderr."""
        assert self.stop() == 0
        self.reader.join(timeout=20)
        err = "".join(self.lines)
        assert "Traceback" not in err and "Exception in ASGI application" not in err, err
        return err


def read_until_closed(sock) -> bytes:
    """All the server sends until it closes the connection (a reset counts as closed); the socket's 30 s timeout
    fails the test if it never does."""
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    return got


def post(sock, body: bytes, *, length: int | None = None, close: bool = True) -> None:
    sock.sendall(b"POST /predict HTTP/1.1\r\nHost: tformer\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                 b"%s\r\n" % (len(body) if length is None else length, b"Connection: close\r\n" if close else b"")
                 + body)


@pytest.fixture(scope="module")
def guarded(run, tmp_path_factory):
    s = GuardedServer(f"checkpoint={run}", "header_timeout_s=1", "body_timeout_s=1", "keep_alive_s=1",
                      "max_connections=100", cwd=tmp_path_factory.mktemp("guarded_cwd"))
    yield s
    if s.proc.poll() is None:
        s.finish()


def test_stalled_clients_are_closed_after_header_timeout_while_others_are_answered(guarded):
    stalled = [guarded.connect() for _ in range(50)]
    for sock in stalled:  # a request line and one header, then nothing (slowloris)
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: tformer\r\n")
    with guarded.connect() as sock:  # the server still answers while they stall
        post(sock, json.dumps(["a gripping film"]).encode())
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200") and b'"label"' in answer
    for sock in stalled:  # each one answered 408 and closed by the server (a test timeout if not)
        with sock:
            got = read_until_closed(sock)
        assert got.startswith(b"HTTP/1.1 408") and b"header_timeout_s=1" in got, got
    silent = guarded.connect()  # a connection that sends nothing is closed too, without an answer
    with silent:
        assert read_until_closed(silent) == b""
    guarded.wait_for_line("no complete request headers within header_timeout_s=1; connection closed")


def test_a_body_that_stops_half_way_gets_408_and_is_closed(guarded):
    with guarded.connect() as sock:
        post(sock, b'["half a re', length=200, close=False)
        got = read_until_closed(sock)
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower()
    assert "body_timeout_s=1" in json.loads(body)["error"]
    guarded.wait_for_line("POST /predict from 127.0.0.1:")
    with guarded.connect() as sock:  # a kept-alive connection idle after its answer is closed (keep_alive_s)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: tformer\r\n\r\n")
        assert read_until_closed(sock).startswith(b"HTTP/1.1 200")


def test_a_client_disconnecting_mid_body_is_one_log_line(guarded):
    before = len(guarded.lines)
    with guarded.connect() as sock:
        post(sock, b'["the client goes aw', length=200, close=False)
    new = guarded.wait_for_line("the client disconnected while sending its body", after=before)
    with guarded.connect() as sock:  # (the server has handled what followed the disconnect)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: tformer\r\nConnection: close\r\n\r\n")
        assert read_until_closed(sock).startswith(b"HTTP/1.1 200")
    new = guarded.lines[before:]
    assert len(new) == 1 and "POST /predict from 127.0.0.1:" in new[0], new
    for _ in range(20):  # clients gone before their answer: no traceback, the server goes on
        with guarded.connect() as sock:
            post(sock, json.dumps(["gone before the answer"] * 8).encode(), close=False)
    assert guarded.request("/health")[0] == 200
    err = guarded.finish()  # (no Traceback, no "Exception in ASGI application": asserted there)
    assert err.count("disconnected") <= 2, err  # a flood of them is a line or two, not one per client


def test_connections_over_max_connections_get_503_at_once(run, tmp_path):
    s = GuardedServer(f"checkpoint={run}", "max_connections=4", "header_timeout_s=60", cwd=tmp_path)
    held = [s.connect() for _ in range(4)]
    for sock in held:
        sock.sendall(b"GET /hea")  # open, unfinished: each holds one of the 4 places
    for _ in range(3):
        with s.connect() as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: tformer\r\n\r\n")
            head, _, body = read_until_closed(extra).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and "max_connections=4" in json.loads(body)["error"]
    for sock in held:
        sock.close()
    for _ in range(300):  # the places free once they close (within a generous 30 s)
        with s.connect() as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: tformer\r\nConnection: close\r\n\r\n")
            if read_until_closed(sock).startswith(b"HTTP/1.1 200"):
                break
    else:
        pytest.fail("a connection was still refused 30 s after the others closed")
    err = s.finish()
    assert err.count("max_connections=4 reached") == 1, err
