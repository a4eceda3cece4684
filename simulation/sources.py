"""Where a simulation's scenarios come from: the ``--scenarios`` value read as a file, a directory, the builtin
set, an evaluation suite or a plugin source."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nego.market.population import ScenarioSource


def load_scenario_source(source: str) -> ScenarioSource:
    """Scenarios from a file, a directory, 'builtin', the name of an evaluation suite, or a plugin source
    (``plugin:NAME`` or ``py:MODULE:ATTR``: a list, or a ``seed -> Scenario`` function)."""
    from nego.scenarios.files import builtin_scenarios, load_scenarios

    if source == "builtin":
        return [s for _, s in builtin_scenarios()]
    if source.startswith(("plugin:", "py:")):
        from nego.agents.plugins import load_scenario_source as load_plugin_source

        return load_plugin_source(source)
    path = Path(source)
    try:
        exists = path.exists()
    except (OSError, ValueError):  # a name no file system takes (a NUL byte, too long): not a file, maybe a suite
        exists = False
    if exists:
        try:
            return load_scenarios(path)  # a bad file raises ScenarioFileError naming the file and the field
        except OSError as e:  # a directory that cannot be listed
            raise ValueError(f"--scenarios {source}: cannot read it ({e.strerror or e})") from None
    if path.suffix in (".toml", ".json") or "/" in source:
        raise ValueError(f"--scenarios {source}: no such file or directory")
    from nego.evaluation.suites import load_suite

    try:
        return list(load_suite(source).scenarios)
    except (KeyError, ValueError) as e:
        raise ValueError(f"--scenarios {source!r} is not a file, a directory, 'builtin' or a suite ({e})") from None
