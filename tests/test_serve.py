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


@pytest.mark.parametrize("body, status, words", [
    (b"not json", 400, "not valid JSON"),
    (b'{"texts": "one string"}', 400, "list of strings"),
    (b'{"text": ["typo"]}', 400, "unknown field"),
    (b"[1, 2]", 400, "texts[0] is int"),
    (b"[]", 400, "at least one text"),
    (json.dumps(["x"] * 9).encode(), 400, "at most 8"),
    (json.dumps(["y" * 501]).encode(), 400, "at most 500"),
    (b'{"texts": ["x"], "top_k": 0}', 400, "top_k=0"),
    (json.dumps(["z" * 500] * 8).encode(), 413, "at most 4000"),
    (b"[" * 3000, 400, "too deeply"),
])
def test_bad_requests_get_a_4xx_with_one_line(server, body, status, words):
    got, answer = server.request("/predict", raw=body, headers={"Content-Type": "application/json"})
    assert got == status and set(answer) == {"error"} and words in answer["error"]
    assert "\n" not in answer["error"] and "Traceback" not in answer["error"]


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
