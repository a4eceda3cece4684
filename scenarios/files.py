"""Scenario files in TOML or JSON: load with validation at the edge, save, and the built-in examples.

A file holds one scenario with the layout of :func:`nego.scenarios.io.scenario_to_dict`. Loading checks every
field before anything is built, and a problem raises :class:`ScenarioFileError` naming the file, the field path
(``seller.weights``) and the fix. Loading a directory is all-or-nothing: if any file is bad, nothing is returned
and the error lists every bad file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from .io import normalise_scenario, scenario_from_dict, scenario_to_dict
from .limits import MAX_FILE_BYTES
from .safeload import DataLimitError, decode_utf8, loads_json, loads_toml
from .scenario import Scenario

BUILTIN = "builtin"
"""Pass this name to :func:`load_scenarios` to get the example scenarios shipped with the package."""

SUFFIXES = (".toml", ".json")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a scenario file."""

    file: str
    field: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.message}. Fix: {self.fix}"


class ScenarioFileError(ValueError):
    """A scenario file (or several) that cannot be loaded; ``problems`` lists each with file, field and fix."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in problems))


def load_scenario(path: str | Path) -> Scenario:
    """Load and validate one ``.toml`` or ``.json`` scenario file."""
    path = Path(path)
    data = _read(path)
    return _build(str(path), data)


def load_scenarios(source: str | Path) -> list[Scenario]:
    """Load one file, every scenario file of a directory (sorted by name), or :data:`BUILTIN`."""
    if str(source) == BUILTIN:
        return [s for _, s in builtin_scenarios()]
    path = Path(source)
    if not path.is_dir():
        return [load_scenario(path)]
    files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
    return _load_all(files)


def builtin_scenarios() -> list[tuple[str, Scenario]]:
    """The example scenarios shipped as ``nego/scenarios/data/*.toml``, as (file name, scenario).

    Only TOML files count: the same folder also holds other data (frozen evaluation suites in JSON).
    """
    root = resources.files("nego.scenarios.data")
    files = sorted((p for p in root.iterdir() if p.name.endswith(".toml")), key=lambda p: p.name)
    return list(zip([p.name for p in files], _load_all([Path(str(p)) for p in files]), strict=True))


def _load_all(files: list[Path]) -> list[Scenario]:
    scenarios: list[Scenario] = []
    problems: list[Problem] = []
    seen: dict[str, Path] = {}
    for file in files:
        try:
            scenario = load_scenario(file)
        except ScenarioFileError as e:
            problems.extend(e.problems)
            continue
        if scenario.id in seen:
            problems.append(
                Problem(str(file), "id", f"{scenario.id!r} is already used by {seen[scenario.id]}", "give it a new id")
            )
        seen[scenario.id] = file
        scenarios.append(scenario)
    if problems:
        raise ScenarioFileError(problems)
    return scenarios


def save_scenario(scenario: Scenario, path: str | Path) -> Path:
    """Write ``scenario`` to ``path``; the suffix (.toml or .json) picks the format. Returns the path."""
    path = Path(path)
    if path.suffix == ".toml":
        text = dumps_toml(scenario_to_dict(scenario))
    elif path.suffix == ".json":
        text = json.dumps(scenario_to_dict(scenario), indent=2, ensure_ascii=False) + "\n"
    else:
        raise ValueError(f"{path}: unknown scenario file type {path.suffix!r}; use .toml or .json")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def scenario_from_text(text: str, fmt: str, name: str = "<text>") -> Scenario:
    """Parse and validate scenario text in ``fmt`` ("toml" or "json"); ``name`` labels errors."""
    return _build(name, _parse(text, fmt, name))


def _read(path: Path) -> dict[str, Any]:
    if path.suffix not in SUFFIXES:
        raise ScenarioFileError(
            [Problem(str(path), "(file)", f"unknown file type {path.suffix!r}", "use .toml or .json")]
        )
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ScenarioFileError(
            [Problem(str(path), "(file)", f"cannot read it ({e.strerror})", "check the path")]
        ) from None
    if len(raw) > MAX_FILE_BYTES:
        fix = "a scenario needs a few KiB; check that this is the right file"
        raise ScenarioFileError([Problem(str(path), "(file)", f"larger than {MAX_FILE_BYTES >> 20} MiB", fix)])
    try:
        text = decode_utf8(raw)
    except DataLimitError as e:
        raise ScenarioFileError([Problem(str(path), "(file)", e.reason, "save the file as UTF-8")]) from None
    return _parse(text, path.suffix[1:], str(path))


def _parse(text: str, fmt: str, name: str) -> dict[str, Any]:
    try:
        data = loads_toml(text) if fmt == "toml" else loads_json(text)
    except DataLimitError as e:
        fix = "fix the syntax" if e.syntax else "write plain numbers and at most a few levels of tables"
        raise ScenarioFileError(
            [Problem(name, e.path or ("(syntax)" if e.syntax else "(limits)"), e.reason, fix)]
        ) from None
    if not isinstance(data, dict):
        raise ScenarioFileError([Problem(name, "(top level)", "expected a table of fields", "see the examples")])
    return data


def _build(name: str, data: Mapping[str, Any]) -> Scenario:
    clean, problems = normalise_scenario(data)
    if problems:
        raise ScenarioFileError([Problem(name, f, m, fix) for f, m, fix in problems])
    try:
        scenario = scenario_from_dict(clean)
    except ValueError as e:  # a consistency rule of the core types that the field checks did not catch
        raise ScenarioFileError([Problem(name, "(scenario)", str(e), "make the fields consistent")]) from None
    return _check_zopa_flag(name, data, scenario)


def _check_zopa_flag(name: str, data: Mapping[str, Any], scenario: Scenario) -> Scenario:
    from dataclasses import replace

    from .analysis import analyse

    has_zopa = analyse(scenario).zopa
    if "zopa" not in data:
        return scenario if has_zopa else replace(scenario, zopa=False)
    if scenario.zopa and not has_zopa:
        fix = "lower a reservation value, or set zopa = false if the scenario is meant to have no agreement"
        raise ScenarioFileError([Problem(name, "zopa", "no outcome meets both reservation values", fix)])
    if not scenario.zopa and has_zopa:
        fix = "set zopa = true, or raise a reservation value so that no outcome satisfies both"
        raise ScenarioFileError([Problem(name, "zopa", "some outcome meets both reservation values", fix)])
    return scenario


# TOML output: just the shapes a scenario dict has (scalars, lists of scalars, tables, arrays of tables).

_BARE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def dumps_toml(data: Mapping[str, Any]) -> str:
    """Serialise a scenario dict as TOML that :mod:`tomllib` reads back to an equal dict."""
    lines: list[str] = []
    _emit_table(lines, (), data)
    return "\n".join(lines).strip() + "\n"


def _emit_table(lines: list[str], path: tuple[str, ...], table: Mapping[str, Any]) -> None:
    inline_ok = len(path) >= 2
    for key, value in table.items():
        if isinstance(value, Mapping) and inline_ok:
            lines.append(f"{_key(key)} = {_inline(value)}")
        elif not isinstance(value, Mapping) and not _is_table_array(value):
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in table.items():
        if _is_table_array(value):
            for item in value:
                lines += ["", f"[[{'.'.join(_key(k) for k in (*path, key))}]]"]
                _emit_table(lines, (*path, key), item)
    for key, value in table.items():
        if isinstance(value, Mapping) and not inline_ok:
            lines += ["", f"[{'.'.join(_key(k) for k in (*path, key))}]"]
            _emit_table(lines, (*path, key), value)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _key(key: str) -> str:
    return key if key and set(key) <= _BARE else _string(key)


def _inline(table: Mapping[str, Any]) -> str:
    return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in table.items()) + " }"


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot write non-finite number {value} to a scenario file")
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return _inline(value)
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}


def _string(text: str) -> str:
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
