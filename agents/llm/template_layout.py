"""The ``[layout]`` section of a conversation template: how the rest of a conversation writes this side's replies.
Plain parsing, no rendering (see :mod:`nego.agents.llm.chat_layout` for what each option does)."""

from __future__ import annotations

LAYOUT_OPTIONS: dict[str, tuple[str, ...]] = {"invalid_replies": ("shown", "withheld", "last_move")}
"""The keys of a ``[layout]`` section and their values, the first of each the default."""


class TemplateError(ValueError):
    """A prompt template file that cannot be used (missing section, unknown field, unreadable)."""


def read_layout(lines: list[str], origin: str) -> dict[str, str]:
    """The ``[layout]`` section's options, each checked against :data:`LAYOUT_OPTIONS` (defaults for the rest)."""
    options = {key: values[0] for key, values in LAYOUT_OPTIONS.items()}
    for line in lines:
        if not line.strip():
            continue
        key, sep, value = (part.strip() for part in line.partition("="))
        if not sep or key not in LAYOUT_OPTIONS or value not in LAYOUT_OPTIONS[key]:
            known = "; ".join(f"{k} = {' | '.join(v)}" for k, v in LAYOUT_OPTIONS.items())
            raise TemplateError(f"{origin}, [layout]: cannot read {line.strip()!r}; the options are {known}")
        options[key] = value
    return options
