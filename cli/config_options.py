"""Command-line options generated from a config dataclass, so that a setting's name, type, default and help text
are written once, in the dataclass, and the command line, TOML files and code all fill the same dataclass.

A field takes part when its metadata holds ``help``; ``flag`` overrides the option's declaration (``"--gap/--no-gap"``,
``"--turn-timeout"``), and ``cli: False`` leaves a field to the command itself. Every option defaults to None
(not given), so a command can lay what was typed over a TOML file or a saved run; ``--help`` shows the dataclass
default. Lists and tuples are typed comma-separated (agent specs keep their parameters, see
:func:`~nego.cli.options.split_specs`); for an optional field, ``none`` means None.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, dataclass, fields
from pathlib import Path
from typing import Any, Optional

import typer

from .options import split_specs

SCALARS = (bool, int, float, str, Path)


@dataclass(frozen=True, slots=True)
class ConfigOption:
    """One generated option: the field it fills, its declaration and how a typed value becomes the field's."""

    name: str
    flag: str
    annotation: Any
    convert: Callable[[Any], Any]
    help: str
    default: Any
    """The field's default as the command line would type it (a list comma-joined); None if it has none."""
    required: bool


def config_options(cls: type, *, optional: Iterable[str] = ()) -> list[ConfigOption]:
    """The options of dataclass ``cls``: one per field with ``help`` metadata. Fields without a default are
    required options unless named in ``optional`` (for those the command supplies a default of its own)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        if "help" not in f.metadata or f.metadata.get("cli") is False:
            continue
        kind, nullable = _unwrap(hints[f.name])
        annotation, convert = _typed(f.name, kind, nullable)
        default = _default(f)
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        if kind is bool and "/" not in flag:
            flag = f"{flag}/--no-{flag[2:]}"
        required = default is MISSING and f.name not in set(optional)
        typed = None if default is MISSING else _as_typed(default)
        out.append(ConfigOption(f.name, flag, annotation, convert, f.metadata["help"], typed, required))
    return out


def parameters(options: Iterable[ConfigOption], *, layered: bool = False) -> list[inspect.Parameter]:
    """Keyword-only parameters carrying the typer options, for a command's ``__signature__``.

    With ``layered``, every option defaults to None, so that only what was typed is laid over a TOML file or a
    saved run (``--help`` still shows the dataclass default); otherwise typer gets the dataclass default itself.
    """
    out = []
    for o in options:
        shown = o.default is not None and o.default != ""
        if o.required:
            option = typer.Option(..., o.flag, help=o.help)
        elif layered:
            label = _label(o.default, o.flag) if shown else False
            option = typer.Option(None, o.flag, help=o.help, show_default=label)
        else:
            option = typer.Option(o.default, o.flag, help=o.help, show_default=shown)
        out.append(inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=o.annotation))
    return out


def given_values(options: Iterable[ConfigOption], values: Mapping[str, Any]) -> dict[str, Any]:
    """The options that were given (not None), converted to their fields' types; a bad value raises
    ``typer.BadParameter`` naming the option."""
    out = {}
    for o in options:
        value = values.get(o.name)
        if value is None:
            continue
        try:
            out[o.name] = o.convert(value)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint=f"'{o.flag.split('/')[0]}'") from None
    return out


def signature(*groups: Iterable[inspect.Parameter]) -> inspect.Signature:
    """A command signature from parameter groups, in order (required options first, as Python requires of
    positional ones; keyword-only ones may come in any order)."""
    return inspect.Signature([p for group in groups for p in group])


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (hint, False)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return hint, False


def _typed(name: str, kind: Any, nullable: bool) -> tuple[Any, Callable[[Any], Any]]:
    """The annotation typer parses the option with, and the conversion from it to the field's type."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind in SCALARS:
        if nullable and kind is str:
            return Optional[str], lambda v: None if v.strip().lower() == "none" else v  # noqa: UP045 - typer
        return Optional[kind], lambda v: v  # noqa: UP045 - typer reads the annotation at runtime
    if origin in (tuple, list) and args and args[0] in (str, int, float):
        item = args[0]
        make = tuple if origin is tuple else list

        def convert(text: str) -> Any:
            pieces = split_specs(text) if item is str else [p.strip() for p in text.split(",") if p.strip()]
            try:
                return make(item(p) for p in pieces)
            except ValueError:
                raise ValueError(f"{text!r} is not a comma-separated list of {item.__name__} values") from None

        return Optional[str], convert  # noqa: UP045
    raise TypeError(f"field {name!r} of type {kind!r} cannot be a command-line option: give it cli=False")


def _default(f: Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def _as_typed(default: Any) -> Any:
    return ",".join(str(v) for v in default) if isinstance(default, tuple | list) else default


def _label(default: Any, flag: str) -> str:
    if isinstance(default, bool):
        on, _, off = flag.partition("/")
        return (on if default else off).lstrip("-")
    return str(default)
