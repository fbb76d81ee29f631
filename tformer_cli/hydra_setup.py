"""Hydra set-up in one place: where the configs are (`config_dir`), the resolvers they use (`tformer_job_dirname`),
composing a config without running a command (`compose_config` / `compose_tree`), the defaults the YAML files
hold that code outside a composed config needs, and shell completion.

Imported only by what composes configs: `tformer predict`, `serve`, `export`, `--help` and `--version` never load
Hydra (cli.py imports this module when a Hydra command runs)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
import yaml
from hydra import compose, initialize_config_dir
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from .errors import Refused, TformerError, interrupted_by
from .store.ownership import new_run_dir
from .sweeps.naming import job_dirname
from .typed_config import plain
from .yesno import bool_or_path

# ${tformer_job_dirname:...} in configs/{train,pretrain,evaluate}.yaml: short sweep job folder names
RESOLVERS = {"tformer_job_dirname": job_dirname}


def register_resolvers() -> None:
    for name, fn in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


def config_dir() -> str:
    """Installed wheels carry the configs inside the package; a source checkout has them at the top level. (The
    resolvers the configs use are registered here, since everything that composes them asks for this first.)"""
    register_resolvers()
    here = Path(__file__).resolve().parent
    for candidate in (here / "configs", here.parent / "configs"):
        if (candidate / "train.yaml").is_file():
            return str(candidate)
    raise RuntimeError(f"tformer configs not found next to {here}; reinstall the package")


def compose_config(name: str, overrides=(), return_hydra_config: bool = False) -> DictConfig:
    """The composed `configs/<name>.yaml` with Hydra overrides (real Hydra composition, nothing run). A Ctrl-C
    while it composes is a KeyboardInterrupt, as anywhere else (Hydra turns one inside its code into an error of
    its own)."""
    try:
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            return compose(config_name=name, overrides=list(overrides), return_hydra_config=return_hydra_config)
    except Exception as exc:
        if interrupted_by(exc):
            raise KeyboardInterrupt from exc
        raise


def compose_tree(name: str, overrides=()) -> dict:
    """`compose_config` as plain containers, interpolations resolved."""
    return plain(compose_config(name, overrides))


def group_defaults(group: str, option: str = "_base") -> dict:
    """One config file's own keys (configs/<group>/<option>.yaml, without its `defaults` list), for code that
    completes a saved config (checkpoints written before a key existed lack it)."""
    tree = yaml.safe_load((Path(config_dir()) / group / f"{option}.yaml").read_text()) or {}
    tree.pop("defaults", None)
    return tree


class NewRunDir(Callback):
    """A run starts only in a new or empty folder (store/ownership.py), checked before Hydra writes its `.hydra`
    record into the folder: `hydra.run.dir=<a finished or busy run>` leaves that run exactly as it was."""

    def on_run_start(self, config, **kwargs) -> None:
        try:
            resume = bool_or_path(config.get("resume"), "resume")  # train and pretrain; evaluate has none
            new_run_dir(Path(str(config.hydra.run.dir)), str(config.hydra.job.config_name), resume)
        except TformerError as exc:
            raise Refused(exc) from None
        except Exception as exc:  # (Hydra would turn it into a warning and start the run unchecked)
            raise Refused(TformerError(f"could not check hydra.run.dir: {exc}")) from None


def shell_completion(args: list[str], commands) -> None:
    """`eval "$(tformer -sc install=bash)"` registers completion for `tformer`; the shell then asks
    `tformer -sc query=bash` with COMP_LINE set. The first word after `tformer` is our command, so it is completed
    here, and the rest is handed to Hydra's completion of that command's config as if the command were the program."""
    words = os.environ.get("COMP_LINE", "").split()
    querying = any(a.startswith("query=") for a in args)
    if querying and (len(words) < 2 or (len(words) == 2 and not os.environ["COMP_LINE"].endswith(" "))):
        typed = words[1] if len(words) == 2 else ""
        print(" ".join(c for c in commands if c.startswith(typed)))
        return
    task = words[1] if querying else "train"
    if task not in ("train", "evaluate", "calibrate"):
        return  # predict and report take texts and paths: the shell's own file completion applies
    if querying:
        os.environ["COMP_LINE"] = " ".join(["tformer", *words[2:]]) + (" " if os.environ["COMP_LINE"].endswith(" ")
                                                                        else "")
    sys.argv = ["tformer", "-sc", *args]  # Hydra names the completed program after argv[0]

    def never_run(cfg) -> None:  # with -sc Hydra completes and returns without running the task
        raise AssertionError("shell completion ran the task")

    # Hydra prints what its completion raises as a traceback: raised to us instead, a closed pipe (`| head`) ends
    # quietly as everywhere else (cli.main)
    full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        hydra.main(version_base="1.3", config_path=config_dir(), config_name=task)(never_run)()
    finally:
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error
