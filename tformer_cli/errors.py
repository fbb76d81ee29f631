"""User-facing errors: one line that names the problem and the fix, no traceback unless debugging."""
from __future__ import annotations


class TformerError(Exception):
    """An error caused by input or configuration; the CLI prints its message on one line and exits 2."""

    exit_code = 2


class ConfigError(TformerError, ValueError):
    """A configuration value that cannot work (also a ValueError for library callers)."""
