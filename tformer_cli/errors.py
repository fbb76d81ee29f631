"""User-facing errors: one line that names the problem and the fix, no traceback unless debugging."""
from __future__ import annotations


class TformerError(Exception):
    """An error caused by input or configuration; the CLI prints its message on one line and exits 2."""

    exit_code = 2


class ConfigError(TformerError, ValueError):
    """A configuration value that cannot work (also a ValueError for library callers)."""


class ArgumentTypeError(TformerError, TypeError):
    """A Python API argument of the wrong type (top_k=1.5, batch_size="2"): a TypeError for library callers."""


class Refused(BaseException):
    """A TformerError raised in a Hydra callback, carried out of Hydra to the CLI's one line: Hydra turns an
    Exception raised there into a warning and goes on, which would start the very run the callback refused."""

    def __init__(self, error: TformerError):
        super().__init__(str(error))
        self.error = error


SIGNALLED: list[int] = []  # the stop signals (SIGINT, SIGTERM) the CLI's own handlers took in this process


def interrupted_by(exc: BaseException) -> bool:
    """Whether `exc` ends the command because a stop was asked for: a KeyboardInterrupt (Ctrl-C, or SIGTERM raised
    as one) behind it, or any error after the CLI took a stop signal. A library stopped inside its own code may
    turn the KeyboardInterrupt into an error of its own: Hydra an UnboundLocalError or a wordless
    ConfigCompositionException, `datasets` a DatasetGenerationError that tformer words as an unreadable file, numpy
    half imported an ImportError with nothing behind it."""
    if SIGNALLED:
        return True
    todo, seen = [exc], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        todo += [e.__cause__, e.__context__]
    return False


def hydra_error_line(task: str, exc: Exception) -> str:
    """One line for an override Hydra could not apply. Hydra's own message is six lines ending in advice to write
    `+key=value`, which for a typo would add a new key that nothing reads and train on without the intended
    setting; this one names the key, its nearest real neighbours and where the settings are listed."""
    # deferred: `tformer --version` / `--help` import this module; difflib and re are 7 of their ~17 ms, and
    # predict must never import hydra
    import difflib
    import re

    from hydra.errors import MissingConfigException, OverrideParseException

    listed = f"`tformer {task} --help` lists the settings"
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file and "/" in exc.missing_cfg_file:
        group, name = exc.missing_cfg_file.rsplit("/", 1)
        options = sorted(exc.options or [])
        near = difflib.get_close_matches(name, options, n=1)
        return (f"{group}={name}: there is no such {group} config" + (f"; did you mean {group}={near[0]}?" if near else "")
                + (f" (the choices: {', '.join(options)})" if options else ""))
    if isinstance(exc, OverrideParseException):
        shown = (str(exc).splitlines() or [type(exc).__name__])[0]
        return (f"could not read an override ({shown}); write key=value, quoting values with "
                f"brackets or spaces, e.g. 'model.d_model=128' \"data.text_column='review text'\"")
    found = re.search(r"Could not override '([^']+)'", str(exc))
    cause = exc.__cause__
    if found and cause is not None and "not in struct" in str(cause):
        key = found.group(1)
        parent = getattr(cause, "parent_node", None)
        missing = str(getattr(cause, "full_key", None) or key)  # the first part of the key that does not exist
        prefix = missing.rsplit(".", 1)[0] + "." if "." in missing else ""
        known = [prefix + str(k) for k in parent.keys()] if parent is not None and hasattr(parent, "keys") else []
        rest = key[len(missing):] if key.startswith(missing) else ""  # trainer.early_stoping[.patience]
        # the whole key (evaluate's data.dir -> data_dir) or its missing part with the rest kept, whichever is closer
        scored = [(difflib.SequenceMatcher(None, typed, k).ratio(), k + tail)
                  for typed, tail in ((key, ""), (missing, rest)) for k in known]
        best = max(scored, default=(0.0, ""))
        guess = f"; did you mean {best[1]}?" if best[0] >= 0.6 else ""
        if not guess and "." not in key and parent is not None and hasattr(parent, "keys"):
            nested = [f"{group}.{key}" for group in parent.keys()  # (a group's key typed bare: text_column=body)
                      if hasattr(parent.get(group), "keys") and key in parent.get(group).keys()]
            guess = f"; did you mean {nested[0]}?" if nested else ""
        return f"{key} is not a setting of `tformer {task}`{guess} ({listed})"
    lines = [line for e in (exc, exc.__cause__) if e is not None for line in str(e).splitlines() if line.strip()]
    return f"{lines[0] if lines else 'the config could not be composed: ' + type(exc.__cause__ or exc).__name__}" \
        f" ({listed})"
