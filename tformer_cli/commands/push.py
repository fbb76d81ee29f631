"""`tformer push checkpoint=PATH repo=<owner>/<name> [private=true] [message=...] [stage=DIR]`."""
from __future__ import annotations

from pathlib import Path

from ..deploy import hub_repo
from ..errors import TformerError
from ..safe_text import terminal
from ..store.locate import newest
from ..yesno import parse_bool
from .options import parse_key_values

USAGE = """usage: tformer push [checkpoint=PATH] repo=<owner>/<name> [private=true] [message=TEXT] [stage=DIR]

Uploads the run's best checkpoint (safetensors + JSON, no optimizer state), its ONNX export if it has one, and a
model card to a Hugging Face Hub model repository (created if needed; log in with `hf auth login` or set
HF_TOKEN). Load it back anywhere with checkpoint=hf://<owner>/<name>. stage=DIR writes what would be uploaded
into DIR and uploads nothing."""

DEFAULTS = {"checkpoint": None, "repo": None, "private": "false", "message": None, "stage": None,
            "outputs_dir": "outputs"}


def main(argv: list[str]) -> int:
    opts = parse_key_values(argv, DEFAULTS, USAGE, "push")
    source = opts["checkpoint"] or newest(opts["outputs_dir"], instead="<run dir>")
    if opts["stage"]:
        folder = hub_repo.stage(source, Path(opts["stage"]))
        print(f"[tformer] staged {terminal(source)} in {terminal(folder)} (nothing uploaded)")
        return 0
    if not opts["repo"]:
        raise TformerError("push needs repo=<owner>/<name> (the Hub model repository to upload to)")
    url = hub_repo.push(source, opts["repo"], private=parse_bool(opts["private"], "private"),
                        message=opts["message"])
    print(f"[tformer] pushed {terminal(source)} to {terminal(url)}; load it with "
          f"checkpoint=hf://{terminal(opts['repo'])}")
    return 0
