"""Command-line options shared by commands: agent spec lists, per-kind caps, and model settings (server, prompt
template, tools, sampling, prices)."""

from __future__ import annotations

import inspect
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any

import typer
from nego.agents.model_options import ModelOptions

BaseUrl = Annotated[
    str | None,
    typer.Option(help="OpenAI-compatible server for openai: specs and size aliases (e.g. a `vllm serve` URL)."),
]
Template = Annotated[str | None, typer.Option(help="Prompt template for model agents: a name or a file path.")]
Tools = Annotated[
    bool | None,
    typer.Option("--tools/--no-tools", help="Actions as tool calls (default: for OpenAI and Anthropic models)."),
]
Prices = Annotated[Path | None, typer.Option(help="Price table (TOML/JSON, USD per 1M tokens) for cost accounting.")]
Temperature = Annotated[
    float | None,
    typer.Option(help="Sampling temperature of model agents (tiny models: as trained unless set; 0: greedy)"),
]
MaxTokens = Annotated[int | None, typer.Option(help="Most tokens a model agent may write per move.")]
Client = Annotated[
    str | None,
    typer.Option(
        help="Client of openai: and vllm: specs: lean (aiohttp, the default) or sdk (the openai package); "
        "default: $NEGO_OPENAI_CLIENT, else lean."
    ),
]
PerKind = Annotated[
    str | None, typer.Option(help="Concurrency caps per agent kind, e.g. 'openai=16,anthropic=8,hf=32'.")
]


_MODEL_ANNOTATIONS: dict[str, Any] = {
    "per_kind": PerKind,
    "base_url": BaseUrl,
    "template": Template,
    "tools": Tools,
    "temperature": Temperature,
    "max_tokens": MaxTokens,
    "prices": Prices,
    "client": Client,
}


def model_parameters() -> list[inspect.Parameter]:
    """The shared model-agent options (and ``--per-kind``) as keyword-only parameters of a generated command."""
    return [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
        for name, annotation in _MODEL_ANNOTATIONS.items()
    ]


def take_model_options(values: dict[str, Any]) -> tuple[ModelOptions, dict[str, int]]:
    """Pop the shared options out of a command's ``values``: the model options and the per-kind caps."""
    model = ModelOptions(**{f.name: values.pop(f.name, None) for f in fields(ModelOptions)})
    return model, parse_per_kind(values.pop("per_kind", None))


def parse_per_kind(text: str | None) -> dict[str, int]:
    """'openai=16,hf=32' -> {'openai': 16, 'hf': 32}; raises ValueError naming the bad entry."""
    caps: dict[str, int] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        kind, eq, value = item.partition("=")
        try:
            caps[kind.strip()] = int(value)
        except ValueError:
            eq = ""
        if not eq or not kind.strip() or caps.get(kind.strip(), 0) < 1:
            raise ValueError(f"--per-kind entry {item.strip()!r} must look like KIND=N with N >= 1")
    return caps


def split_specs(text: str) -> list[str]:
    """Comma-separated specs; a piece like ``patience=0.4..1`` (a parameter, no family name) continues the spec
    before it, so ``timedep:e=1,patience=0.5,tft`` is two specs."""
    out: list[str] = []
    for piece in (s.strip() for s in text.split(",")):
        if not piece:
            continue
        if out and "=" in piece and ":" not in piece:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def parse_specs(text: str, what: str) -> tuple[str, ...]:
    """'a, b,c' -> ('a', 'b', 'c') (parameters after a comma stay with their spec, see :func:`split_specs`); a
    usage error if nothing is left."""
    specs = tuple(split_specs(text))
    if not specs:
        raise typer.BadParameter(f"give at least one {what} spec, comma-separated")
    return specs
