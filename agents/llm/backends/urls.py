"""Model-server URLs: checked before any call, and named honestly when a connection to one fails.

Imports no SDK. A URL is never echoed with credentials in it: a message shows scheme, host, port and path only.
"""

from __future__ import annotations

import socket
from urllib.parse import SplitResult, urlsplit


def check_base_url(url: str | None, what: str = "the base URL", key_env: str = "") -> str | None:
    """``url`` if a client can send requests to it (None stays None); otherwise ``ValueError`` saying why.

    A URL must be http(s) with a host and a numeric port if any, and must not carry a user name or password:
    an SDK refuses those only when the first request is made, and then in words that look like a bad reply.
    """
    if url is None:
        return None
    parts = urlsplit(url.strip())
    if "@" in parts.netloc:
        raise ValueError(
            f"{what} carries a user name or password before '@' ({_shown(parts)} with credentials); "
            f"credentials do not belong in a server URL: give the key in {key_env or 'the API-key variable'}"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        shown = url if "@" not in url else "a URL with '@' in it"
        raise ValueError(f"{what} must look like http://host:port/v1, got {shown!r}")
    try:
        parts.port  # noqa: B018 (reading it is the check: a port that is not a number raises)
    except ValueError:
        raise ValueError(f"{what} has a port that is not a number from 0 to 65535: {_shown(parts)}") from None
    return url.strip()


def _shown(parts: SplitResult) -> str:
    """scheme://host:port/path, without user name, password, query or fragment."""
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        port = ":<port>"
    return f"{parts.scheme}://{host}{port}{parts.path}"


def host_port(url: str | None) -> str | None:
    """``host:port`` of a base URL (the scheme's default port when none is given), None if there is no URL."""
    if not url:
        return None
    parts = urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        port = None
    return f"{parts.hostname}:{port}" if parts.hostname and port else parts.hostname


def connection_problem(error: BaseException, base_url: str | None) -> str | None:
    """What went wrong with the connection behind ``error``, read from its chain of causes, in plain words; None
    when no operating-system connection error is in the chain (a timeout is not one). SDK transports wrap a
    refused connection in a "connect timeout" or a bare "Connection error."; the cause they wrap says what
    happened, and an aiohttp connector error in the chain names the address that was tried."""
    where = refused = unresolved = other = None
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        host, port = getattr(cause, "host", None), getattr(cause, "port", None)
        if where is None and isinstance(host, str) and isinstance(port, int):
            where = f"{host}:{port}"
        if isinstance(cause, ConnectionRefusedError):
            refused = cause
        elif isinstance(cause, socket.gaierror):
            unresolved = cause
        elif isinstance(cause, OSError) and not isinstance(cause, TimeoutError) and other is None:
            other = cause
        cause = cause.__cause__ or cause.__context__
    where = where or host_port(base_url) or "the server"
    if refused is not None:
        return f"connection refused to {where}: is a server listening there?"
    if unresolved is not None:
        return f"cannot resolve host {where.rsplit(':', 1)[0]}: {unresolved.strerror or unresolved}"
    if other is not None:
        return f"connection to {where} failed: {str(other.strerror or other)[:200]}"
    return None
