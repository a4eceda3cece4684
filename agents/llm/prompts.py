"""Prompt templates for language-model negotiators: loading, checking, and rendering an Observation.

A template is a text file with a ``[system]`` and a ``[user]`` section written in :class:`string.Template`
syntax (``$field``); comment lines starting with ``#`` may precede the first section. Only the fields in
:data:`FIELDS` exist, and every one is computed from the :class:`~nego.market.types.Observation` alone (this
side's own brief and preferences, the public scenario and history), so a template cannot leak the other side's
private information. A template with an ``[update]`` section lays a negotiation out as one conversation (see
:mod:`nego.agents.llm.chat_layout`): the system and user messages open it, and after each of this side's replies the
update section, rendered from the observation before that reply and the next one, becomes the next user message;
it may also use the fields in :data:`UPDATE_FIELDS`. A conversation template may end with a ``[layout]`` section of
``key = value`` lines (see :mod:`.template_layout`): ``invalid_replies = withheld`` writes each of this side's replies
that was not a legal move as an empty assistant message in the rest of the conversation, so the model never reads its
own mistakes back (the feedback still says what was wrong); ``invalid_replies = last_move`` writes this side's last
legal reply there instead, so that what a model copies from its own earlier replies is a legal move. Built-in templates
live in ``nego/agents/llm/prompts/<name>.txt``; any other file can be given by path. A template's id,
``<name>:<first 8 hex of the file's sha256>``, is recorded with every action.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from string import Template

from nego.market.types import ActionKind, Observation, Offer, PublicMove
from nego.scenarios.issues import IssueKind
from nego.scenarios.preferences import Direction
from nego.scenarios.scenario import ScenarioView

from ..trend import trend_sentence
from .backends.base import ACTION_TOOLS, ChatMessage
from .template_layout import TemplateError, read_layout

DEFAULT_TEMPLATE = "negotiator-v2"

FIELDS: dict[str, str] = {
    "role": "this side: seller or buyer",
    "other_role": "the other side",
    "product": "what is being traded",
    "context": "the public context of the deal",
    "brief": "this side's private instructions (a line of its own, or empty)",
    "issues": "one line per issue: name, type, range or options, unit, description",
    "priorities": "one line per issue: this side's weight and what it prefers, most important first",
    "reservation": "a sentence giving this side's walk-away value",
    "opener": "the side that makes the first offer",
    "max_rounds": "the number of rounds",
    "round": "the current round (1-based)",
    "rounds_left": "rounds left including this one",
    "rounds_left_text": "rounds left in words ('this is your last turn' on the last one)",
    "history": "every public move so far with its message and its value to this side",
    "standing_offer": "the other side's offer on the table and its value to this side, or a note that none is",
    "feedback": "why this side's previous reply was rejected (empty on a first attempt)",
    "trend": "what the other side has conceded since its first offer and how its last offer moved, in this side's "
    "score, as a line ending in a newline (empty before its second offer)",
    "reply_format": "how to answer: the tools, or the JSON block to write",
    "terms": "one short line per issue, most important first: its range or options and this side's weight and "
    "preference (the issues and priorities of small-model templates in one list)",
    "reply_line": "how to answer in one line of JSON, for small models (a template using it is answered in that "
    "form by the rule sellers a warm start imitates)",
    "reply_line_ranges": "the same line with each issue's range or options written where its value goes",
}


UPDATE_FIELDS: dict[str, str] = {
    "news": "what happened since this side's last reply: that its turn passed when that reply was invalid to the "
    "end, then the other side's move as a line of the history, or that its turn passed (empty on a retry)",
    "news_brief": "the same as news in fewer words: offers without units or messages",
}
"""Fields only the ``[update]`` section of a conversation template can use."""

SECTIONS = ("system", "user", "update", "layout")


STATIC_FIELDS = frozenset(FIELDS) - {
    "round",
    "rounds_left",
    "rounds_left_text",
    "history",
    "standing_offer",
    "feedback",
    "trend",
}
"""Fields that do not change during one side's negotiation (computed once per negotiator)."""


@dataclass(frozen=True, slots=True)
class PromptTemplate:
    """A checked template: its name, its id (name plus content hash), its two sections and, for a conversation
    template, the section that renders the user message after each of this side's replies."""

    name: str
    id: str
    system: Template
    user: Template
    update: Template | None = None
    invalid_replies: str = "shown"
    """How the rest of a conversation writes a reply that was not a legal move: as it was (``shown``), as an empty
    assistant message (``withheld``), or as this side's last legal reply, empty before the first (``last_move``)."""

    @property
    def withhold_invalid(self) -> bool:
        """True when the conversation does not show this side's invalid replies."""
        return self.invalid_replies != "shown"

    @property
    def line_replies(self) -> bool:
        """True when the template asks for a reply of one line of JSON (the ``reply_line`` or ``reply_line_ranges``
        field)."""
        used = {name for t in (self.system, self.user) for name in t.get_identifiers()}
        return bool(used & {"reply_line", "reply_line_ranges"})

    @property
    def turn_fields_used(self) -> frozenset[str]:
        """The turn fields the system and user sections use (only those are computed for a turn)."""
        return _turn_fields_used((self.system, self.user))

    @property
    def update_fields_used(self) -> frozenset[str]:
        """The turn fields the update section uses."""
        return _turn_fields_used((self.update,) if self.update is not None else ())

    @property
    def conversational(self) -> bool:
        """True when a negotiation is one growing conversation (the template has an ``[update]`` section), False when
        every turn is a fresh system and user message."""
        return self.update is not None

    def render(self, obs: Observation, *, tools: bool, cache: RenderCache | None = None) -> tuple[ChatMessage, ...]:
        """The system and user messages for one turn; ``tools`` says whether the action tools are offered.
        ``cache`` keeps what one side's earlier turns of the same negotiation already rendered (same text)."""
        cache = cache if cache is not None else RenderCache()
        static = cache.static(obs.scenario, tools)
        if cache.system is None or cache.system[0] is not self:
            system = None  # a section that uses only fixed fields is rendered once per negotiation
            if set(self.system.get_identifiers()) <= STATIC_FIELDS:
                system = ChatMessage("system", _tidy(self.system.substitute(static)))
            cache.system = (self, system)
        values = {**static, **turn_fields(obs, cache, self.turn_fields_used)}
        return (
            cache.system[1] or ChatMessage("system", _tidy(self.system.substitute(values))),
            ChatMessage("user", _tidy(self.user.substitute(values))),
        )

    def render_update(
        self, before: Observation, obs: Observation, *, tools: bool, cache: RenderCache | None = None
    ) -> ChatMessage:
        """The user message that follows this side's reply to ``before``, when it must act again on ``obs``."""
        if self.update is None:
            raise TemplateError(f"template {self.name!r} has no [update] section: it renders every turn afresh")
        cache = cache if cache is not None else RenderCache()
        fields = self.update_fields_used
        values = {**cache.static(obs.scenario, tools), **turn_fields(obs, cache, fields), **update_fields(before, obs)}
        return ChatMessage("user", _tidy(self.update.substitute(values)))


@lru_cache(maxsize=256)
def _turn_fields_used(sections: tuple[Template, ...]) -> frozenset[str]:
    return frozenset(i for t in sections for i in t.get_identifiers()) - STATIC_FIELDS


class RenderCache:
    """What one side's prompts keep between its turns in one negotiation: the fixed fields, a system message
    that uses only them, and the history lines already rendered (the history only grows). Everything is
    rebuilt when the scenario view or the tools setting changes, so a cache can never mix two negotiations."""

    __slots__ = ("_key", "_offers", "_scorer", "_static", "lines", "moves", "system")

    def __init__(self) -> None:
        self._key: tuple[ScenarioView, bool] | None = None
        self._static: dict[str, str] = {}
        self._scorer: tuple[ScenarioView, Callable[[Offer], float]] | None = None
        self._offers: dict[int, tuple[Offer, str, float]] = {}
        self.system: tuple[PromptTemplate, ChatMessage | None] | None = None
        self.moves: list[PublicMove] = []
        self.lines: list[str] = []

    def static(self, view: ScenarioView, tools: bool) -> dict[str, str]:
        """:func:`static_fields` of ``view``, computed once while the view object stays the same."""
        if self._key is None or self._key[0] is not view or self._key[1] != tools:
            self._key, self._static = (view, tools), static_fields(view, tools=tools)
            self.system, self.moves, self.lines = None, [], []
        return self._static

    def offer_text(self, offer: Offer, view: ScenarioView) -> tuple[str, float]:
        """(:func:`describe_offer`, ``view.utility(offer)``: the same float), computed once per offer object while the
        view stays the same (the cache keeps each offer alive, so its id is not reused meanwhile)."""
        if self._scorer is None or self._scorer[0] is not view:
            self._scorer, self._offers = (view, view.preferences.scorer(view.issues)), {}
        hit = self._offers.get(id(offer))
        if hit is None:
            hit = self._offers[id(offer)] = (offer, describe_offer(offer, view), self._scorer[1](offer))
        return hit[1], hit[2]

    def history_lines(self, history: tuple[PublicMove, ...], view: ScenarioView) -> list[str]:
        kept = 0
        for cached, move in zip(self.moves, history, strict=False):
            if cached is not move and cached != move:
                break
            kept += 1
        del self.moves[kept:], self.lines[kept:]
        for move in history[kept:]:
            self.moves.append(move)
            self.lines.append(_move_line(move, view, self))
        return self.lines


def builtin_templates() -> list[str]:
    """Names of the templates shipped with nego."""
    folder = resources.files("nego.agents.llm") / "prompts"
    return sorted(p.name.removesuffix(".txt") for p in folder.iterdir() if p.name.endswith(".txt"))


def load_template(name_or_path: str = DEFAULT_TEMPLATE) -> PromptTemplate:
    """A built-in template by name, or a template file by path; raises :class:`TemplateError` saying what to fix."""
    if name_or_path in builtin_templates():
        text = (resources.files("nego.agents.llm") / "prompts" / f"{name_or_path}.txt").read_text(encoding="utf-8")
        return parse_template(name_or_path, text, origin=f"built-in template {name_or_path!r}")
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise TemplateError(
            f"prompt template {name_or_path!r} is neither a built-in template ({', '.join(builtin_templates())}) "
            "nor an existing file"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TemplateError(f"prompt template {path}: cannot read it ({e})") from None
    return parse_template(path.stem, text, origin=str(path))


def parse_template(name: str, text: str, *, origin: str = "<string>") -> PromptTemplate:
    """Split ``text`` into its sections and check that it uses only known fields."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        header = re.fullmatch(r"\[(\w+)\]\s*", line)
        if header:
            if header.group(1) not in SECTIONS or header.group(1) in sections:
                raise TemplateError(f"{origin}, line {lineno}: unexpected section [{header.group(1)}]")
            current = sections.setdefault(header.group(1), [])
        elif current is not None:
            current.append(line)
        elif line.strip() and not line.startswith("#"):
            raise TemplateError(f"{origin}, line {lineno}: text before the first section ([system], [user])")
    missing = [s for s in ("system", "user") if s not in sections]
    if missing:
        raise TemplateError(f"{origin}: missing section(s) {', '.join(f'[{s}]' for s in missing)}")
    layout = read_layout(sections.pop("layout", []), origin)
    if layout["invalid_replies"] != "shown" and "update" not in sections:
        raise TemplateError(f"{origin}, [layout]: only a conversation template (one with [update]) has a layout")
    parts = {k: Template("\n".join(v)) for k, v in sections.items()}
    for section, template in parts.items():
        if not template.is_valid():
            raise TemplateError(f"{origin}, [{section}]: a '$' that starts no field; write '$$' for a dollar sign")
        known = {**FIELDS, **UPDATE_FIELDS} if section == "update" else FIELDS
        unknown = sorted(set(template.get_identifiers()) - set(known))
        if unknown:
            raise TemplateError(
                f"{origin}, [{section}]: unknown field(s) {', '.join('$' + u for u in unknown)}; "
                f"the fields are {', '.join('$' + f for f in known)}"
            )
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    return PromptTemplate(
        name,
        f"{name}:{digest}",
        parts["system"],
        parts["user"],
        parts.get("update"),
        invalid_replies=layout["invalid_replies"],
    )


def prompt_fields(obs: Observation, *, tools: bool) -> dict[str, str]:
    """Every template field for this observation (see :data:`FIELDS`)."""
    return {**static_fields(obs.scenario, tools=tools), **turn_fields(obs)}


def static_fields(view: ScenarioView, *, tools: bool) -> dict[str, str]:
    """The fields that stay the same for one side during a whole negotiation (see :data:`STATIC_FIELDS`)."""
    return {
        "role": view.role.value,
        "other_role": view.role.other.value,
        "product": view.product,
        "context": view.context,
        "brief": f"Your private instructions: {view.brief}\n" if view.brief else "",
        "issues": "\n".join(f"- {i.describe()}" for i in view.issues),
        "priorities": _priorities(view),
        "reservation": (
            f"Walking away, or reaching no deal, is worth {view.preferences.reservation:.2f} to you, so a deal "
            f"worth less than {view.preferences.reservation:.2f} is worse than no deal."
        ),
        "opener": view.opener.value,
        "max_rounds": str(view.max_rounds),
        "reply_format": _reply_format(view, tools),
        "reply_line": _reply_line(view),
        "reply_line_ranges": _reply_line(view, ranges=True),
        "terms": _terms(view),
    }


def turn_fields(
    obs: Observation, cache: RenderCache | None = None, fields: frozenset[str] | None = None
) -> dict[str, str]:
    """The fields that change from turn to turn (``cache``: reuse history lines rendered for earlier turns);
    ``fields``: only these (the ones a template uses), else all."""
    wanted = TURN_FIELDS if fields is None else fields
    return {name: _TURN_FIELD[name](obs, cache) for name in wanted if name in _TURN_FIELD}


def _rounds_left_text(obs: Observation, cache: RenderCache | None) -> str:
    return "this is your last turn" if obs.is_last_turn else f"{obs.rounds_left} rounds left including this one"


def _trend(obs: Observation, cache: RenderCache | None) -> str:
    trend = trend_sentence(obs.history, obs.scenario)
    return trend + "\n" if trend else ""


def _feedback_field(obs: Observation, cache: RenderCache | None) -> str:
    if not obs.feedback:
        return ""
    return f"Your previous reply was not a valid move: {obs.feedback}\nReply again with one valid move.\n"


_TURN_FIELD = {
    "round": lambda obs, cache: str(obs.round),
    "rounds_left": lambda obs, cache: str(obs.rounds_left),
    "rounds_left_text": _rounds_left_text,
    "history": lambda obs, cache: _history(obs.history, obs.scenario, cache),
    "standing_offer": lambda obs, cache: _standing(obs.standing_offer, obs.scenario, cache),
    "trend": _trend,
    "feedback": _feedback_field,
}
TURN_FIELDS = frozenset(_TURN_FIELD)
"""The fields computed per turn: every field outside :data:`STATIC_FIELDS`."""


def update_fields(before: Observation, obs: Observation) -> dict[str, str]:
    """The fields of :data:`UPDATE_FIELDS` for acting on ``obs`` after replying to ``before``.

    Both observations belong to one side of one negotiation, ``before`` the earlier. Everything comes from them: a
    retry is an observation of the same round (its feedback says why); otherwise the other side had one turn in
    between, and the public history's new entries show what this side's reply and that turn came to (a reply that is
    not among them was invalid to the end, a turn without a move of the other side passed)."""
    if obs.scenario is not before.scenario and obs.scenario != before.scenario:
        raise ValueError("an update joins two observations of the same side of the same negotiation")
    if obs.round == before.round:
        return {"news": "", "news_brief": ""}
    new = obs.history[len(before.history) :]
    passed = [] if was_a_move(before, obs) else ["Your last reply was not a valid move."]
    theirs = [move for move in new if move.role is not obs.role]
    other = obs.role.other.value
    none = [f"The {other} made no valid move, so its turn passed."]
    lines = [_move_line(move, obs.scenario) for move in theirs] or none
    brief = [_brief_line(move, obs.scenario) for move in theirs] or none
    if passed:
        lines.insert(0, "Your last reply was not a valid move, so your turn passed.")
        brief = passed + brief
    return {"news": "\n".join(lines), "news_brief": "\n".join(brief)}


def was_a_move(before: Observation, following: Observation) -> bool:
    """Whether this side's reply to ``before`` was a legal move, seen from its next observation ``following``."""
    if following.round == before.round:
        return False  # asked again in the same round: the reply was refused
    return any(move.role is before.role for move in following.history[len(before.history) :])


def describe_offer(offer: Offer, view: ScenarioView) -> str:
    """``price=120 USD, warranty=1y``: an offer with units, in issue order."""
    parts = []
    for issue in view.issues:
        unit = f" {issue.unit}" if issue.unit and issue.kind is not IssueKind.CATEGORICAL else ""
        parts.append(f"{issue.name}={offer[issue.name]}{unit}")
    return ", ".join(parts)


def _priorities(view: ScenarioView) -> str:
    prefs = view.preferences
    lines = []
    ranked = sorted(view.issues, key=lambda i: -prefs.weights[i.name])
    for rank, issue in enumerate(ranked):
        weight = prefs.weights[issue.name]
        label = " (most important)" if rank == 0 and len(ranked) > 1 else ""
        vf = prefs.values[issue.name]
        if issue.kind is IssueKind.CATEGORICAL:
            table = dict(vf.table)
            wants = "value of each option to you: " + ", ".join(f"{o}={table[o]:.2f}" for o in issue.options)
        else:
            better = "higher" if vf.direction is Direction.INCREASING else "lower"
            wants = f"{better} is better for you (linear from {issue.low} to {issue.high})"
        lines.append(f"- {issue.name}: weight {weight:.2f}{label}; {wants}")
    return "\n".join(lines)


def _history(history: tuple[PublicMove, ...], view: ScenarioView, cache: RenderCache | None) -> str:
    if not history:
        return "Nothing yet: no offer has been made."
    if cache is not None:
        return "\n".join(cache.history_lines(history, view))
    return "\n".join(_move_line(move, view) for move in history)


def _move_line(move: PublicMove, view: ScenarioView, cache: RenderCache | None = None) -> str:
    who = f"{move.role.value} (you)" if move.role is view.role else move.role.value
    if move.kind is ActionKind.OFFER and move.offer is not None:
        text, worth = _offer_text(move.offer, view, cache)
        what = f"offered {text} (worth {worth:.2f} to you)"
    elif move.kind is ActionKind.ACCEPT:
        what = "accepted"
    else:
        what = "walked away"
    said = f" Message: {json.dumps(move.message, ensure_ascii=False)}" if move.message else ""
    return f"- Round {move.round}, {who}: {what}.{said}"


def _brief_line(move: PublicMove, view: ScenarioView) -> str:
    who = move.role.value.capitalize()
    if move.kind is ActionKind.OFFER and move.offer is not None:
        values = ", ".join(f"{issue.name}={move.offer[issue.name]}" for issue in view.issues)
        return f"{who} offered {values} (worth {view.utility(move.offer):.2f} to you)."
    return f"{who} accepted." if move.kind is ActionKind.ACCEPT else f"{who} walked away."


def _terms(view: ScenarioView) -> str:
    prefs = view.preferences
    lines = []
    for issue in sorted(view.issues, key=lambda i: -prefs.weights[i.name]):
        vf = prefs.values[issue.name]
        if issue.kind is IssueKind.CATEGORICAL:
            table = dict(vf.table)
            domain = " | ".join(issue.options)
            wants = "worth " + ", ".join(f"{o}={table[o]:.2f}" for o in issue.options)
        else:
            step = f" step {issue.step}" if issue.kind is IssueKind.INT and issue.step != 1 else ""
            unit = f" {issue.unit}" if issue.unit else ""
            domain = f"{issue.kind.value} {issue.low}..{issue.high}{step}{unit}"
            wants = f"{'higher' if vf.direction is Direction.INCREASING else 'lower'} is better"
        lines.append(f"- {issue.name} ({domain}): weight {prefs.weights[issue.name]:.2f}, {wants}")
    return "\n".join(lines)


def _offer_text(offer: Offer, view: ScenarioView, cache: RenderCache | None) -> tuple[str, float]:
    if cache is not None:
        return cache.offer_text(offer, view)
    return describe_offer(offer, view), view.utility(offer)


def _standing(offer: Offer | None, view: ScenarioView, cache: RenderCache | None = None) -> str:
    other = view.role.other.value
    if offer is None:
        return f"There is no offer from the {other} on the table, so you cannot accept now."
    text, worth = _offer_text(offer, view, cache)
    return f"The {other}'s offer on the table: {text}. It is worth {worth:.2f} to you."


def _reply_format(view: ScenarioView, tools: bool) -> str:
    if tools:
        return f"Reply by calling exactly one of the tools {', '.join(ACTION_TOOLS)}."
    shape = ", ".join(f'"{i.name}": <{_value_hint(i)}>' for i in view.issues)
    return (
        "End your reply with exactly one JSON object in a ```json block, one of:\n"
        f'{{"action": "offer", "offer": {{{shape}}}, "message": "..."}}\n'
        '{"action": "accept", "message": "..."}\n'
        '{"action": "walk_away", "message": "..."}\n'
        "Numbers are plain JSON numbers without units; options are JSON strings."
    )


def _reply_line(view: ScenarioView, *, ranges: bool = False) -> str:
    shape = ", ".join(f'"{i.name}": {f"<{_value_hint(i)}>" if ranges else "..."}' for i in view.issues)
    return (
        f'Reply with one line of JSON: {{"action": "offer", "offer": {{{shape}}}}}, {{"action": "accept"}} or '
        '{"action": "walk_away"}.'
    )


def _value_hint(issue) -> str:
    if issue.kind is IssueKind.CATEGORICAL:
        return " | ".join(json.dumps(o) for o in issue.options)
    step = f" step {issue.step}" if issue.kind is IssueKind.INT and issue.step != 1 else ""
    return f"{issue.kind.value} {issue.low}..{issue.high}{step}"


def _tidy(text: str) -> str:
    # empty optional fields leave runs of blank lines behind
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.strip() + "\n"
