"""A trained classifier on the Hugging Face Hub: `tformer push` uploads it; `checkpoint=hf://<repo>[@revision]`
loads it (train's evaluate, predict, serve, export, `Classifier.load`) through store/locate.py, which downloads.

The repository's layout (written here; its names are in store/layout.py):
    <checkpoint files>      model.safetensors model.json tokenizer.json labels.json meta.json metrics.json
                            config.yaml manifest.json, as in checkpoints/best (the manifest is checked on load
                            like any local checkpoint's; paths in config.yaml and meta.json as <local>/<last part>)
    onnx/                   the run's ONNX export, when it has one (`predict --runtime onnx --checkpoint hf://...`):
                            its fp32 export, else its int8 one
    README.md               a model card: labels, test metrics, how to use it

A downloaded repository is just a checkpoint dir in the Hub's cache, so everything a local checkpoint gets
applies: no pickle, manifest and shape checks before anything is allocated. Downloads go through
`huggingface_hub.snapshot_download` (offline: its cache only, see hub.py).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import yaml

from .. import hub
from ..errors import TformerError
from ..safe_text import terminal
from ..store import manifest, ownership
from ..store.atomic import write_json
from ..store.layout import HUB_ONNX_FOLDER, MARKER, CheckpointDir, ExportDir, RunDir
from ..store.locate import PREFIX, locate, parse_ref


def stage(checkpoint: str | Path, folder: Path) -> Path:
    """Write into `folder` exactly what `push` uploads: the run's best checkpoint (no training state), the ONNX
    export predict would use (fp32, else int8) if it has one, and a model card."""
    source = locate(checkpoint)
    if source.is_pretraining():
        raise TformerError(f"{source} is a pretraining (masked-LM) checkpoint, not a classifier; push a run trained "
                           f"with tformer train (model.init=<this run> fine-tunes one from it)")
    manifest.verify_checkpoint(source)  # never publish a damaged checkpoint
    export = RunDir.of_checkpoint(source).served_export(source)  # (onnx-int8/ when it is the only export)
    stale = manifest.stale_export(export, source) if export.is_export() else None
    if stale:
        raise TformerError(f"{stale} (before pushing)")
    inside = folder.resolve()
    if inside == source.path.resolve() or source.path.resolve().is_relative_to(inside) or \
            inside.is_relative_to(source.path.resolve()):
        raise TformerError(f"stage={folder} is, holds or lies inside the checkpoint being staged; pass another folder")
    names = [*manifest.entries(source), source.manifest.name]
    if source.training_tensors.name in names or source.training_json.name in names:
        raise TformerError(f"checkpoint {source} holds optimizer state; push the run's best checkpoint "
                           f"(pass the run dir)")
    # a new or empty folder, or an earlier stage (by its marker) holding only what was staged: written whole in
    # a temporary sibling and swapped in, so a refusal or a full disk leaves the folder as it was
    with ownership.replacing(folder, "stage", "stage") as tmp:
        for name in names:
            shutil.copy2(source.path / name, tmp / name)
        _without_local_paths(CheckpointDir(tmp))
        if export.is_export():
            _stage_export(export, tmp / HUB_ONNX_FOLDER)
        (tmp / "README.md").write_text(model_card(source, export.is_export()))
    return folder


# Where a path is data, never a place on this machine: the class names and the columns they are read from
DATA_KEYS = frozenset({"label_names", "text_column", "label_column", "thresholds"})
WHOLE_PATH = re.compile(r"^((?:file|sqlite):/*)?((?:/[^/\n]+){2,}/?|[A-Za-z]:[\\/][^\n]*)$")  # a value that is a path
WORD_PATH = re.compile(r"(?<![^\s(\"'])(?:(?:/[^/\s()'\",;]+){2,}/?|[A-Za-z]:[\\/][^\s()'\",;]*)")  # in a sentence
LOCAL = "<local>"  # what stands for the folders a published path was in: no file of the downloader's is read by it


def _without_local_paths(ckpt: CheckpointDir) -> None:
    """The published config.yaml and meta.json name the files and folders the run read (its data, model.init, a
    calibration file, the pretrained folder) as <local>/<last part>: an absolute path says where the author keeps
    things (`/home/<name>/<client>/...`), and a bare name would read a file of the same name wherever the download
    is used. The manifest is written again for the two files."""
    if ckpt.config.is_file():
        tree = yaml.safe_load(ckpt.config.read_text())
        ckpt.config.write_text(yaml.safe_dump(_scrubbed(tree), sort_keys=False, allow_unicode=True))
    if ckpt.meta.is_file():
        write_json(ckpt.meta, _scrubbed(json.loads(ckpt.meta.read_text())), allow_nan=True)
    manifest.write(ckpt)


def _scrubbed(value, key: str = ""):
    """`value` with every absolute path in it (a whole string, or a word of one: "BERT model /x/y/minilm") as
    <local>/<its last part>; the DATA_KEYS' values as they are."""
    if key in DATA_KEYS:
        return value
    if isinstance(value, dict):
        return {k: _scrubbed(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v, key) for v in value]
    if isinstance(value, str):
        whole = WHOLE_PATH.match(value.strip())
        if whole:
            return f"{whole.group(1) or ''}{_local(whole.group(2))}"
        return WORD_PATH.sub(lambda m: _local(m.group(0)), value)
    return value


def _local(path: str) -> str:
    return LOCAL + "/" + re.split(r"[\\/]", path.rstrip("/\\"))[-1]


def _stage_export(export, into: Path) -> None:
    """The export as published: its source is the repository's root checkpoint (not a path on this machine)."""
    shutil.copytree(export.path, into, ignore=shutil.ignore_patterns(MARKER))  # the stage has its own
    staged = ExportDir(into)
    info = json.loads(staged.info.read_text())
    info["source_checkpoint"] = ".."
    write_json(staged.info, info, allow_nan=True)  # export.json keeps its numbers as written (json_text's rule)
    manifest.write(staged)


def model_card(source: CheckpointDir, has_onnx: bool) -> str:
    labels = json.loads(source.labels.read_text())
    model = json.loads(source.model_config.read_text())
    metrics = json.loads(source.metrics.read_text()) if source.metrics.is_file() else {}
    test_file = RunDir.of_checkpoint(source).test_metrics
    test = json.loads(test_file.read_text()) if test_file.is_file() else {}
    shown = lambda m: ", ".join(f"{k} {m[k]:.4f}" for k in ("accuracy", "f1", "f1_macro", "loss")
                                if isinstance(m.get(k), (int, float)))
    kind = "multi-label" if model.get("multi_label") else "single-label"
    lines = ["---", "library_name: tformer", "pipeline_tag: text-classification", "tags: [tformer, safetensors"
             + (", onnx" if has_onnx else "") + "]", "---", "", "# tformer text classifier", "",
             f"A {kind} classifier ({model.get('n_layers')} layers, d_model {model.get('d_model')}, max_len "
             f"{model.get('max_len')}) trained with [tformer](https://pypi.org/project/tformer/).", "",
             f"Labels ({len(labels)}): " + ", ".join(f"`{n}`" for n in labels), ""]
    if test:
        lines += [f"Test split: {shown(test)} (n={test.get('n')}).", ""]
    if metrics:
        lines += ["Validation at the saved epoch: "
                  + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k.startswith("val_")
                              and isinstance(v, (int, float))) + ".", ""]
    lines += ["```", "tformer predict --checkpoint hf://<this repo> \"some text\"",
              *(["tformer predict --runtime onnx --checkpoint hf://<this repo> \"some text\"   # no torch"]
                if has_onnx else []),
              "```", "", "```python", "from tformer_cli import Classifier",
              "clf = Classifier.load(\"hf://<this repo>\")", "clf.predict([\"some text\"])", "```", ""]
    return "\n".join(lines)


def push(checkpoint: str | Path, repo: str, *, private: bool = False, message: str | None = None) -> str:
    """Upload the staged folder as one commit; returns the repository URL."""
    import tempfile

    parse_ref(PREFIX + repo, f"repo={terminal(repo)}")  # the same checks as a reference
    with tempfile.TemporaryDirectory(prefix="tformer-push-") as tmp:
        folder = stage(checkpoint, Path(tmp) / "repo")
        if hub.offline():
            raise TformerError(f"cannot push to {repo}: {hub.unreachable()}; push from a "
                               f"machine with network access (stage=<folder> writes what would be uploaded)")
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError, HFValidationError

        api = HfApi()
        try:
            url = api.create_repo(repo, private=private, exist_ok=True)
            api.upload_folder(repo_id=repo, folder_path=str(folder), ignore_patterns=[MARKER],
                              commit_message=message or f"tformer push of {Path(str(checkpoint)).name}")
        except HfHubHTTPError as exc:
            raise TformerError(f"could not push to {repo}: {_first_line(exc)} (log in with `hf auth login` or set "
                               f"HF_TOKEN with write access)") from None
        except (HFValidationError, ValueError) as exc:
            raise TformerError(f"could not push to {repo}: {_first_line(exc)}") from None
        except Exception as exc:  # no route, DNS, TLS, timeouts: requests' errors are OSErrors; httpx (or
            # the httpx2 huggingface_hub may ship) has its own
            if not (isinstance(exc, OSError) or type(exc).__module__.startswith(("httpx", "httpcore", "requests",
                                                                                   "urllib3"))):
                raise
            raise TformerError(f"could not reach the Hub to push to {repo}: {_first_line(exc)}; check the network "
                               f"(or HF_ENDPOINT), or stage=<folder> and upload it later") from None
        return str(url)


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
