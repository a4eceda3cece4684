"""Parse untrusted JSON and TOML text into plain data within the limits of :mod:`nego.scenarios.limits`.

Python's parsers fail on hostile text in ways a caller does not expect from a syntax error: ``RecursionError``
on deep nesting, ``ValueError`` on integers past 4,300 digits, ``inf`` for ``1e999`` and ``NaN`` for the
non-standard JSON constants. These functions turn every such case into one :class:`DataLimitError` that names
the field path (``issues[0].high``) when the text could be parsed, and reject nesting deeper than
:data:`~nego.scenarios.limits.MAX_DEPTH` and integers longer than :data:`~nego.scenarios.limits.MAX_INT_DIGITS`
digits. Scenario files and both ends of the agent server use them.
"""

from __future__ import annotations

import json
import math
import tomllib
from typing import Any

from .limits import MAX_DEPTH, MAX_INT_DIGITS


class DataLimitError(ValueError):
    """Text that is not valid data (``syntax``), or data past a limit; ``path`` names the field ("" when unknown)."""

    def __init__(self, path: str, reason: str, *, syntax: bool = False) -> None:
        self.path = path
        self.reason = reason
        self.syntax = syntax
        super().__init__(f"{path}: {reason}" if path else reason)


class _Rejected:
    """A number the JSON parser met that must not become a Python number; reported with its path afterwards."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _parse_int(text: str) -> int | _Rejected:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        return _Rejected(f"an integer of {digits:,} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _parse_float(text: str) -> float | _Rejected:
    value = float(text)
    if not math.isfinite(value):
        return _Rejected(f"the number {text[:40]} is out of range")
    return value


def _parse_constant(name: str) -> _Rejected:
    return _Rejected(f"{name} is not a JSON number")


def loads_json(text: str | bytes) -> Any:
    """Parse JSON text (bytes must be UTF-8); raise :class:`DataLimitError` on bad syntax or data past a limit."""
    if isinstance(text, bytes | bytearray):
        text = decode_utf8(bytes(text))
    try:
        data = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except json.JSONDecodeError as e:
        raise DataLimitError("", f"not valid JSON: {e}", syntax=True) from None
    except RecursionError:
        raise DataLimitError("", f"nested deeper than {MAX_DEPTH} levels") from None
    check_tree(data)
    return data


def loads_toml(text: str) -> dict[str, Any]:
    """Parse TOML text; raise :class:`DataLimitError` on bad syntax or data past a limit."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise DataLimitError("", f"not valid TOML: {e}", syntax=True) from None
    except RecursionError:
        raise DataLimitError("", f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:  # an integer literal past Python's conversion limit of 4,300 digits
        raise DataLimitError("", f"an integer far longer than {MAX_INT_DIGITS} digits") from None
    check_tree(data)
    return data


def decode_utf8(raw: bytes) -> str:
    """``raw`` as text, or :class:`DataLimitError` saying which byte is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataLimitError("", f"not UTF-8 text: {_byte_error(e)}") from None


def _byte_error(e: UnicodeDecodeError) -> str:
    return f"byte 0x{e.object[e.start]:02x} at offset {e.start} ({e.reason})"


def check_tree(data: Any) -> None:
    """Raise :class:`DataLimitError` at the first node deeper than the limit, a rejected number, or an integer
    with too many digits (walked without recursion, so any depth is safe)."""
    limit = 10**MAX_INT_DIGITS
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth >= MAX_DEPTH:
                raise DataLimitError(path, f"nested deeper than {MAX_DEPTH} levels")
            items = list(node.items() if isinstance(node, dict) else enumerate(node))
            for key, child in reversed(items):  # popped in document order
                child_path = f"{path}[{key}]" if isinstance(node, list) else (f"{path}.{key}" if path else str(key))
                stack.append((child, child_path, depth + 1))
        elif isinstance(node, _Rejected):
            raise DataLimitError(path, node.reason)
        elif isinstance(node, int) and not isinstance(node, bool) and not -limit < node < limit:
            raise DataLimitError(path, f"an integer of more than {MAX_INT_DIGITS} digits")
