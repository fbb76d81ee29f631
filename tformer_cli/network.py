"""Whether a server answers, asked in seconds before a library that would retry for minutes is given its address
(the Hugging Face Hub, an MLflow tracking server)."""
from __future__ import annotations

import socket
import urllib.request
from urllib.parse import urlsplit


def unreachable(url: str, timeout_s: float) -> str | None:
    """Why nothing answers at the url's host and port, in a few words; None when something does, or when that
    cannot be told from here: a proxy set for the url's scheme (HTTPS_PROXY, ...: the library goes through it,
    this check could not) or a url without a host. Only a connection is made (what answers, and its credentials,
    are the library's to check)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # (a port that is not a number, or out of range)
        return f"{url!r} has no valid port"
    if urllib.request.getproxies().get(parts.scheme) and not urllib.request.proxy_bypass(parts.hostname):
        return None
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        if isinstance(exc, socket.timeout):
            return f"no answer at {parts.hostname}:{port} within {timeout_s:g} s"
        return f"{parts.hostname}:{port}: {exc.strerror or exc}"
    return None
