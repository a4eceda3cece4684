"""``nego serve-agent SPEC``: serve one negotiator spec over HTTP for markets elsewhere to reach as ``remote:URL``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
from collections.abc import Callable
from typing import Annotated

import typer

from .options import BaseUrl, MaxTokens, ModelOptions, Prices, Temperature, Template, Tools

TOKEN_ENV = "NEGO_AGENT_TOKEN"
log = logging.getLogger(__name__)


async def run_server(
    factory,
    token: str,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    max_body_bytes: int = 1 << 20,
    timeout_s: float = 120.0,
    max_sessions: int = 4096,
    read_timeout_s: float = 15.0,
    max_connections: int = 256,
    generated_token: bool = False,
    on_ready: Callable[[str], None] | None = None,
    on_warning: Callable[[str], None] = log.warning,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve ``factory`` until ``stop`` is set (or SIGINT/SIGTERM arrives); ``on_ready`` gets the bound URL and
    ``on_warning`` each warning about the bind address and the token (see ``bind_warnings``)."""
    from nego.agents.remote.server import bind_warnings, make_app, start

    app = make_app(
        factory,
        token,
        max_body_bytes=max_body_bytes,
        timeout_s=timeout_s,
        max_sessions=max_sessions,
        read_timeout_s=read_timeout_s,
        max_connections=max_connections,
    )
    for warning in bind_warnings(host, token, generated=generated_token):
        on_warning(warning)
    runner, url = await start(app, host, port)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not on every platform/thread
            loop.add_signal_handler(sig, stop.set)
    try:
        if on_ready is not None:
            on_ready(url)
        await stop.wait()
    finally:
        await runner.cleanup()


def serve_agent(
    spec: Annotated[str, typer.Argument(help="Negotiator spec to serve, e.g. 'tft', 'boulware', 'openai:gpt-5-mini'.")],
    port: Annotated[int, typer.Option(help="TCP port to listen on (0 picks a free one).")] = 8765,
    host: Annotated[
        str, typer.Option(help="Interface to bind. The default serves this machine only; 0.0.0.0 serves the network.")
    ] = "127.0.0.1",
    token: Annotated[
        str | None,
        typer.Option(
            envvar=TOKEN_ENV,
            show_default=False,
            help=f"Bearer token clients must send (default: ${TOKEN_ENV}, else a fresh one printed at start).",
        ),
    ] = None,
    max_body_kb: Annotated[int, typer.Option(help="Largest request accepted, in KiB (413 past it).")] = 1024,
    timeout_s: Annotated[float, typer.Option(help="Longest one move may take, in seconds (504 past it).")] = 120.0,
    max_sessions: Annotated[int, typer.Option(help="Negotiations remembered at once (oldest dropped first).")] = 4096,
    read_timeout_s: Annotated[
        float, typer.Option(help="Longest a client may take to send a request's headers or body, in seconds.")
    ] = 15.0,
    max_connections: Annotated[
        int,
        typer.Option(help="Connections held at once (fewer under a low open-file limit); idle ones make room."),
    ] = 256,
    base_url: BaseUrl = None,
    template: Template = None,
    tools: Tools = None,
    prices: Prices = None,
    temperature: Temperature = None,
    max_tokens: MaxTokens = None,
) -> None:
    """Serve a negotiator over HTTP; a market elsewhere plays it as ``remote:http://HOST:PORT``."""
    from nego.agents.registry import resolve
    from nego.agents.remote.server import check_token

    try:
        settings = ModelOptions(base_url, template, tools, prices, temperature, max_tokens).settings()
        factory = resolve(spec, settings)
    except ValueError as e:  # an unknown spec, or a model spec that cannot be played here (key, extra, file)
        raise typer.BadParameter(str(e), param_hint="SPEC") from None
    if min(max_body_kb, timeout_s, max_sessions, read_timeout_s, max_connections) <= 0:
        raise typer.BadParameter(
            "--max-body-kb, --timeout-s, --max-sessions, --read-timeout-s and --max-connections must be positive"
        )
    generated = not token
    token = token or secrets.token_urlsafe(24)
    try:
        check_token(token)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint=f"--token / ${TOKEN_ENV}") from None

    def ready(url: str) -> None:
        typer.echo(f"serving {factory.spec} at {url} (POST /act, GET /health); stop with Ctrl-C")
        if generated:
            typer.echo(f"token: {token}  (clients: export {TOKEN_ENV}={token})")
        typer.echo(f"play it with: --sellers remote:{url}  or  --buyers remote:{url}")

    asyncio.run(
        run_server(
            factory,
            token,
            host=host,
            port=port,
            max_body_bytes=max_body_kb * 1024,
            timeout_s=timeout_s,
            max_sessions=max_sessions,
            read_timeout_s=read_timeout_s,
            max_connections=max_connections,
            generated_token=generated,
            on_ready=ready,
            on_warning=lambda text: typer.echo(f"warning: {text}", err=True),
        )
    )
