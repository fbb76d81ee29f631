"""`tformer push` and checkpoint=hf://...: the staged repository, laid out in a Hugging Face cache exactly as the
Hub client stores a download (blobs + snapshot symlinks + refs/main), then loaded offline through
`huggingface_hub.snapshot_download` by predict (both runtimes) and `Classifier.load`. The upload itself needs the
network and is not exercised here."""
import hashlib
import json
import os
import subprocess
import sys

import pytest

from helpers import copy_run, run_tformer
from tformer_cli import Classifier

pytestmark = pytest.mark.slow  # real `tformer` processes

REPO = "someone/tiny-demo"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def run(tiny_run, tmp_path_factory):
    """A copy of the session's tiny run with its ONNX export (written into the copy)."""
    run_dir = copy_run(tiny_run.run_dir, tmp_path_factory.mktemp("hub") / "run")
    pytest.importorskip("onnxruntime")
    from tformer_cli.deploy.export import export_onnx

    export_onnx(run_dir)
    return run_dir


def as_hub_cache(staged, cache):
    """What `snapshot_download` leaves in HF_HUB_CACHE: blobs by hash, a snapshot of symlinks, refs/main."""
    repo = cache / f"models--{REPO.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    for f in sorted(p for p in staged.rglob("*") if p.is_file() and p.name != ".tformer"):  # (push skips it)
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        (repo / "blobs" / digest).write_bytes(f.read_bytes())
        link = snapshot / f.relative_to(staged)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(repo / "blobs" / digest, link.parent))
    return cache


@pytest.fixture(scope="module")
def cache(run, tmp_path_factory):
    staged = tmp_path_factory.mktemp("staged") / "repo"
    r = run_tformer("push", f"checkpoint={run}", f"stage={staged}", cwd=tmp_path_factory.mktemp("cwd"))
    assert r.returncode == 0, r.stderr
    return as_hub_cache(staged, tmp_path_factory.mktemp("hf_cache"))


def hub_env(cache):
    return {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


def test_the_staged_repository_holds_the_checkpoint_export_and_card(run, cache):
    snapshot = cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT
    names = {p.name for p in snapshot.iterdir()}
    assert {"model.safetensors", "model.json", "tokenizer.json", "labels.json", "meta.json", "manifest.json",
            "README.md", "onnx"} <= names
    assert not names & {"training_state.safetensors", "trainer_state.json"}
    assert (snapshot / "onnx" / "model.onnx").is_file()
    card = (snapshot / "README.md").read_text()
    assert "library_name: tformer" in card and "`negative`" in card and "hf://<this repo>" in card


def test_the_published_config_and_meta_name_local_files_by_their_last_part(tiny_run, tmp_path):
    """Absolute paths in config.yaml and meta.json (the data folder, a calibration file, the model a pretraining
    run continued) travelled with a push and told where the author keeps things; class names stay as they are."""
    import yaml

    from tformer_cli.deploy.hub_repo import stage
    from tformer_cli.store import manifest
    from tformer_cli.store.layout import RunDir

    run_dir = copy_run(tiny_run.run_dir, tmp_path / "run")
    best = RunDir(run_dir).best
    private = "/home/someone/client-x"
    tree = yaml.safe_load(best.config.read_text())
    tree["data"].update({"dir": f"{private}/data/reviews", "label_names": ["/r/negative", "/r/positive"]})
    best.config.write_text(yaml.safe_dump(tree))
    meta = json.loads(best.meta.read_text())
    meta.update({"calibrated_on": {"file": f"{private}/recent.csv"}, "continued_from": f"BERT model {private}/m"})
    best.meta.write_text(json.dumps(meta))
    manifest.write(best)
    staged = stage(run_dir, tmp_path / "repo")
    published = (staged / "config.yaml").read_text() + (staged / "meta.json").read_text()
    assert private not in published and "/r/negative" in published
    assert yaml.safe_load((staged / "config.yaml").read_text())["data"]["dir"] == "<local>/reviews"
    assert json.loads((staged / "meta.json").read_text())["continued_from"] == "BERT model <local>/m"
    got = Classifier.load(staged).predict(["a fine film"])  # (its manifest checked on load)
    assert got == Classifier.load(run_dir).predict(["a fine film"])


def test_a_run_exported_only_as_int8_stages_that_export(tiny_run, tmp_path):
    """predict --runtime onnx of a run with only onnx-int8/ uses it; a push that left it out published a repository
    whose --runtime onnx fails."""
    from tformer_cli.deploy.export import export_onnx
    from tformer_cli.deploy.hub_repo import stage

    run_dir = copy_run(tiny_run.run_dir, tmp_path / "run")
    export_onnx(run_dir, quantize="int8")
    staged = stage(run_dir, tmp_path / "repo")
    info = json.loads((staged / "onnx" / "export.json").read_text())
    assert (staged / "onnx" / "model.onnx").is_file() and "int8" in json.dumps(info)
    assert ", onnx]" in (staged / "README.md").read_text()


def test_predict_loads_hf_references_from_the_hub_cache(run, cache, tmp_path):
    expected = Classifier.load(run).predict(["never boring"])[0]
    for runtime in ("torch", "onnx"):
        for ref in (f"hf://{REPO}", f"hf://{REPO}@main"):
            r = run_tformer("predict", f"--runtime={runtime}", f"--checkpoint={ref}", "--json", "never boring",
                            cwd=tmp_path, env=hub_env(cache))
            assert r.returncode == 0, r.stderr
            got = json.loads(r.stdout)
            assert got["label"] == expected["label"]
            assert got["probability"] == pytest.approx(expected["probability"], abs=1e-4)


def test_classifier_load_of_an_hf_reference(run, cache, tmp_path):
    code = (f"from tformer_cli import Classifier\nc = Classifier.load('hf://{REPO}')\n"
            "import json\nprint(json.dumps(c.predict(['never boring'])[0]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, **hub_env(cache)})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["label"] == Classifier.load(run).predict(["never boring"])[0]["label"]


def test_missing_or_malformed_references_and_offline_push_are_one_line(run, cache, tmp_path):
    for ref, words in ((f"hf://{REPO}-nope", "not in the local Hub cache"), ("hf://just-a-name", "hf://<owner>")):
        r = run_tformer("predict", f"--checkpoint={ref}", "hello", cwd=tmp_path, env=hub_env(cache))
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr
        assert r.stderr.count("cache") == (words != "hf://<owner>")  # (said once, not "... cache ... no cached copy")
    r = run_tformer("push", f"checkpoint={run}", "repo=me/mo..del", cwd=tmp_path, env=hub_env(cache))
    assert r.returncode == 2 and "error: repo=me/mo..del is not a Hub repository; use <owner>/<name>" in r.stderr
    r = run_tformer("push", f"checkpoint={run}", f"repo={REPO}", cwd=tmp_path, env=hub_env(cache))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cannot push" in r.stderr, r.stderr


class _Refusing:
    """A local stand-in for the Hub endpoint: answers every request 401 (bad token), or drops every connection."""

    def __init__(self, mode: str):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_anything(self):
                if mode == "drop":
                    self.close_connection = True
                    self.connection.close()
                    return
                body = b'{"error": "Invalid credentials in Authorization header"}'
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_HEAD = do_anything

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()


@pytest.mark.parametrize("mode, words", [("401", "log in with `hf auth login`"), ("drop", "could not reach the Hub")])
def test_a_push_the_hub_refuses_or_cannot_reach_is_one_line(run, tmp_path, mode, words):
    hub = _Refusing(mode)
    try:
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_not_a_real_token", "HF_HUB_OFFLINE": "0",
               "HF_HOME": str(tmp_path / "hf")}
        r = run_tformer("push", f"checkpoint={run}", f"repo={REPO}", cwd=tmp_path, env=env)
    finally:
        hub.close()
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr and "Traceback" not in r.stderr, \
        r.stderr[-3000:]
