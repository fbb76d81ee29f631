"""A trained classifier on the Hugging Face Hub: `tformer push` uploads it, `checkpoint=hf://<repo>[@revision]`
loads it (train's evaluate, predict, serve, export, `Classifier.load`).

The repository's layout (this module owns it):
    <checkpoint files>      model.safetensors model.json tokenizer.json labels.json meta.json metrics.json
                            config.yaml manifest.json, exactly as in checkpoints/best (the manifest is checked
                            on load like any local checkpoint's)
    onnx/                   the run's ONNX export, when it has one (`predict runtime=onnx checkpoint=hf://...`)
    README.md               a model card: labels, test metrics, how to use it

A downloaded repository is just a checkpoint dir in the Hub's cache, so everything a local checkpoint gets
applies: no pickle, manifest and shape checks before anything is allocated. Downloads go through
`huggingface_hub.snapshot_download` (offline: its cache only, see hub.py).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from .errors import TformerError
from .run_dir import CheckpointDir, RunDir

PREFIX = "hf://"
ONNX_FOLDER = "onnx"


def is_ref(path) -> bool:
    return isinstance(path, str) and path.startswith(PREFIX)


def parse_ref(ref: str) -> tuple[str, str | None]:
    """hf://owner/name[@revision] -> (repo id, revision or None)."""
    body = ref[len(PREFIX):].strip("/")
    repo, _, revision = body.partition("@")
    parts = repo.split("/")
    if len(parts) != 2 or not all(parts) or any(c in repo for c in " \\:"):
        raise TformerError(f"checkpoint={ref} is not a Hub reference; use hf://<owner>/<name> or "
                           f"hf://<owner>/<name>@<revision>")
    return repo, revision or None


def download(ref: str, *, onnx: bool = False) -> Path:
    """The local folder of a Hub checkpoint (its onnx/ export with onnx=True), downloaded or from the cache."""
    from . import hub

    repo, revision = parse_ref(ref)
    offline = hub.offline()
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    patterns = [f"{ONNX_FOLDER}/*"] if onnx else None
    try:
        folder = Path(snapshot_download(repo, revision=revision, allow_patterns=patterns,
                                        ignore_patterns=None if onnx else [f"{ONNX_FOLDER}/*"],
                                        local_files_only=offline))
    except (LocalEntryNotFoundError, FileNotFoundError):
        raise TformerError(f"{ref} is not in the local Hub cache and {hub.why_unavailable()}; connect to the "
                           f"network once, or copy the repository into a folder and pass checkpoint=<folder>") from None
    except RepositoryNotFoundError:
        raise TformerError(f"{ref}: no such model repository on the Hub (or it is private: log in with `hf auth "
                           f"login` or set HF_TOKEN)") from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise TformerError(f"could not download {ref}: {str(exc).splitlines()[0][:200]}") from None
    found = folder / ONNX_FOLDER if onnx else folder
    if onnx and not found.is_dir():
        raise TformerError(f"{ref} has no ONNX export ({ONNX_FOLDER}/); predict with runtime=torch or push a run "
                           f"that was exported (`tformer export` before `tformer push`)")
    return found


def stage(checkpoint: str | Path, folder: Path) -> Path:
    """Write into `folder` exactly what `push` uploads: the run's best checkpoint (no training state), its ONNX
    export if it has one, and a model card."""
    from . import checkpoint as ckpt

    source = ckpt.resolve(checkpoint)
    if source.is_pretraining():
        raise TformerError(f"{source} is a pretraining (masked-LM) checkpoint, not a classifier; push a run trained "
                           f"with tformer train (model.init=<this run> fine-tunes one from it)")
    ckpt.verify_manifest(source)  # never publish a damaged checkpoint
    export = RunDir.of_checkpoint(source).export_of(source)
    stale = export.stale_for(source) if export.is_export() else None
    if stale:
        raise TformerError(f"{stale} (before pushing)")
    if folder.exists() and not folder.is_dir():
        raise TformerError(f"stage={folder} is a file; pass a new or empty folder")
    inside = folder.resolve()
    if inside == source.path.resolve() or source.path.resolve().is_relative_to(inside) or \
            inside.is_relative_to(source.path.resolve()):
        raise TformerError(f"stage={folder} is, holds or lies inside the checkpoint being staged; pass another folder")
    if folder.is_dir() and any(folder.iterdir()):
        if not (CheckpointDir(folder).manifest.is_file() and (folder / "README.md").is_file()):
            raise TformerError(f"stage={folder} is not empty; pass a new or empty folder (a previous stage is "
                               f"replaced, anything else is left alone)")
        shutil.rmtree(folder)  # an earlier stage: a fresh copy, not a merge of two checkpoints
    folder.mkdir(parents=True, exist_ok=True)
    listed = json.loads(source.manifest.read_text())
    for name in [*listed, source.manifest.name]:
        if name in (source.training_tensors.name, source.training_json.name):
            raise TformerError(f"checkpoint {source} holds optimizer state; push the run's best checkpoint "
                               f"(pass the run dir)")
        shutil.copy2(source.path / name, folder / name)
    if export.is_export():
        _stage_export(export, folder / ONNX_FOLDER)
    (folder / "README.md").write_text(model_card(source, export.is_export()))
    return folder


def _stage_export(export, into: Path) -> None:
    """The export as published: its source is the repository's root checkpoint (not a path on this machine)."""
    from .export import write_manifest
    from .run_dir import ExportDir

    shutil.copytree(export.path, into)
    staged = ExportDir(into)
    info = json.loads(staged.info.read_text())
    info["source_checkpoint"] = ".."
    staged.info.write_text(json.dumps(info, indent=2) + "\n")
    write_manifest(staged)


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
    lines += ["```", "tformer predict checkpoint=hf://<this repo> \"some text\"",
              *(["tformer predict runtime=onnx checkpoint=hf://<this repo> \"some text\"   # no torch"]
                if has_onnx else []),
              "```", "", "```python", "from tformer_cli import Classifier",
              "clf = Classifier.load(\"hf://<this repo>\")", "clf.predict([\"some text\"])", "```", ""]
    return "\n".join(lines)


def push(checkpoint: str | Path, repo: str, *, private: bool = False, message: str | None = None) -> str:
    """Upload the staged folder as one commit; returns the repository URL."""
    import tempfile

    from . import hub

    parse_ref(PREFIX + repo)  # the same checks as a reference
    with tempfile.TemporaryDirectory(prefix="tformer-push-") as tmp:
        folder = stage(checkpoint, Path(tmp) / "repo")
        if hub.offline():
            raise TformerError(f"cannot push to {repo}: {hub.why_unavailable().split(', and')[0]}; push from a "
                               f"machine with network access (stage=<folder> writes what would be uploaded)")
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError, HFValidationError

        api = HfApi()
        try:
            url = api.create_repo(repo, private=private, exist_ok=True)
            api.upload_folder(repo_id=repo, folder_path=str(folder),
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
