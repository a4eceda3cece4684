"""What every negotiator spec's parameter text shares: ``name:key=value,key2=value2`` split into raw values.

The registry (rule families) and the plugins (``py:`` targets, entry points) each give the raw values their own
types; both read the text the same way, and both report a bad spec with :class:`UnknownSpecError`.
"""

from __future__ import annotations

ParamValue = float | int | str
"""A parameter's value once typed: what a family or a plugin target is built with."""


class UnknownSpecError(ValueError):
    """A spec that names no known negotiator, or names one with a bad parameter."""


def parse_params(spec: str, text: str) -> dict[str, str]:
    """``"k=4,delta=0.02"`` -> ``{"k": "4", "delta": "0.02"}``, values still raw; ``spec`` (the whole spec) names the
    culprit when a part is not ``key=value`` or a key is given twice."""
    out: dict[str, str] = {}
    for part in text.split(","):
        key, eq, raw = (s.strip() for s in part.partition("="))
        if not eq or not key or not raw:
            raise UnknownSpecError(f"{spec!r}: parameters must look like name:key=value,key2=value2; got {part!r}")
        if key in out:
            raise UnknownSpecError(f"{spec!r}: parameter {key!r} given twice")
        out[key] = raw
    return out
