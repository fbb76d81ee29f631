"""Reaching the Hugging Face Hub: one quick check, then the libraries' own code, or offline mode at once.

Without a network, `datasets` and `huggingface_hub` retry for half a minute and print a warning per retry before
failing. tformer asks once (a TCP connect to the Hub's host, a few seconds at most); when that fails, or when
HF_HUB_OFFLINE is set, both libraries are switched to offline mode, so a cached copy is still used and anything
else fails at once with our one-line message.
"""
from __future__ import annotations

import os
import sys

from . import network
from .yesno import parse_bool

CONNECT_TIMEOUT_S = 3.0


def _offline_set() -> bool:
    """HF_HUB_OFFLINE as `yesno.parse_bool` reads it (unset or empty: no); its yes words are huggingface_hub's."""
    value = os.environ.get("HF_HUB_OFFLINE", "")
    return bool(value.strip()) and parse_bool(value, "HF_HUB_OFFLINE")


def offline() -> bool:
    """True when the Hub is not to be (or cannot be) reached; then the libraries are in offline mode too."""
    if _offline_set():
        _set_offline()
        return True
    if network.unreachable(os.environ.get("HF_ENDPOINT") or "https://huggingface.co", CONNECT_TIMEOUT_S) is None:
        return False
    _set_offline()
    return True


def _set_offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"  # read at import by libraries imported later
    # deferred, and only when already loaded: predict imports this module and must not pay for either library
    if "huggingface_hub" in sys.modules:  # and by those already imported, from their constants
        import huggingface_hub.constants

        huggingface_hub.constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        import datasets.config

        datasets.config.HF_HUB_OFFLINE = True


def unreachable() -> str:
    """For error messages: why the Hub could not serve the request, where the message says what the cache lacked."""
    return "the Hub is unreachable or HF_HUB_OFFLINE is set" if _offline_set() else "the Hub did not serve it"


def why_unavailable() -> str:
    """For error messages: why the Hub could not serve the request, the cache included."""
    return f"{unreachable()}, and there is no cached copy" if _offline_set() else unreachable()
