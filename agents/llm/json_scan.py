"""Reading JSON out of untrusted model replies in bounded time and depth.

:func:`loads_bounded` reads one JSON document but refuses nesting deeper than :data:`MAX_DEPTH` before the
decoder recurses into it, and reads integers longer than :data:`MAX_NUMBER_DIGITS` digits as an out-of-range
:class:`OversizedNumber` instead of converting them (Python refuses integers over 4,300 digits, and converting
long ones is quadratic). :func:`scan_objects` finds every JSON object embedded in free text in one pass over
the text: it matches braces and brackets outside strings, decodes each balanced ``{...}`` span that is not
nested too deep, and looks into the spans that are not valid JSON. Nothing here raises on any input text.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 32
"""Deepest nesting of objects and arrays that is read (an action block needs 2)."""
MAX_NUMBER_DIGITS = 100
"""Longest integer literal read as a number; a longer one becomes an :class:`OversizedNumber`."""

# inside JSON: a whole string (no raw control characters: not JSON), or one bracket, or a quote that opens a
# string that never closes properly
_STRING_BODY = re.compile(r'[^"\\\x00-\x1f]*(?:\\[^\x00-\x1f][^"\\\x00-\x1f]*)*')
# outside strings JSON holds only punctuation, numbers and true/false/null (and Python's NaN and Infinity)
_PROSE = r"[^ \t\n\r,:0-9+\-.eEtrufalsnNIiy]"
_TOKEN = re.compile(rf'"{_STRING_BODY.pattern}"|[{{}}\[\]"]|{_PROSE}')
_OBJECT_START = re.compile(r'\{[ \t\n\r]*["}]')  # a JSON object opens with a key or closes at once


class JSONLimitError(ValueError):
    """A JSON document that is refused for its shape (too deeply nested), not for its syntax."""


class OversizedNumber(float):
    """An integer literal longer than :data:`MAX_NUMBER_DIGITS` digits: an infinite float (so every range check
    refuses it) that shows itself by its length rather than by its digits."""

    digits: int

    def __new__(cls, literal: str) -> OversizedNumber:
        self = super().__new__(cls, -math.inf if literal.startswith("-") else math.inf)
        self.digits = len(literal.lstrip("-"))
        return self

    def __repr__(self) -> str:
        return f"a number of {self.digits} digits"

    __str__ = __repr__


def _read_int(literal: str) -> int | float:
    return int(literal) if len(literal) <= MAX_NUMBER_DIGITS else OversizedNumber(literal)


_DECODER = json.JSONDecoder(parse_int=_read_int)


def nesting_depth(text: str, stop_above: int = MAX_DEPTH) -> int:
    """The deepest nesting of ``{`` and ``[`` in ``text`` outside JSON strings, up to the first point where the
    text cannot be JSON (a string that never closes, a word that is no literal: a decoder stops there too);
    counting stops once it exceeds ``stop_above``. One pass over the text."""
    depth = deepest = 0
    pos, n = 0, len(text)
    search = _TOKEN.search
    while pos < n:
        m = search(text, pos)
        if m is None:
            break
        c, pos = m.group(), m.end()
        if c == "{" or c == "[":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > stop_above:
                    break
        elif c == "}" or c == "]":
            depth = max(0, depth - 1)
        elif len(c) == 1:  # a string that never closes, or prose: a decoder stops here
            break
    return deepest


def loads_bounded(text: str) -> Any:
    """``json.loads`` for untrusted text: raises :class:`JSONLimitError` if it nests deeper than
    :data:`MAX_DEPTH`, ``json.JSONDecodeError`` if it is not JSON; over-long numbers become
    :class:`OversizedNumber`."""
    if text.count("{") + text.count("[") > MAX_DEPTH and nesting_depth(text) > MAX_DEPTH:  # few openers: shallow
        raise JSONLimitError(f"nested more than {MAX_DEPTH} levels deep")
    return _DECODER.decode(text)


@dataclass(slots=True)
class _Span:
    """A balanced ``{...}`` in the text: where it is, how deep it nests, the balanced objects inside it."""

    start: int
    end: int
    depth: int
    children: list[_Span]


@dataclass(frozen=True, slots=True)
class ObjectScan:
    """What :func:`scan_objects` found: the decoded objects in text order and what it refused, and why."""

    objects: tuple[dict[str, Any], ...]
    too_deep: int = 0
    """Nesting depth of the deepest refused span (0: none refused)."""
    unclosed_at: int | None = None
    """Where the first ``{`` that is never closed starts (None: every object was closed)."""


class _SpanScanner:
    """Finds every outermost balanced ``{...}`` span of a text (with the balanced spans inside it), in order.

    Outside any span only a ``{`` followed by a key or ``}`` matters (prose is skipped); inside, strings are
    skipped and brackets matched. A span that cannot be valid JSON (a mismatched bracket, a line break inside a
    string, a ``{`` that starts no object, a word that is not a JSON literal) is abandoned with everything
    that encloses it; the spans already closed inside it are kept. If a ``{`` was read inside a string of
    what was abandoned (a stray quote before an object: ``{"{"action": ...}``), scanning goes back to it once;
    otherwise it goes on from where the span broke. No character is scanned more than twice.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.roots: list[_Span] = []
        # the open brackets, innermost last: [start, is "{", depth of what closed inside, spans closed inside]
        self.stack: list[list[Any]] = []
        self.unclosed: int | None = None
        """Where the first ``{`` that is never closed starts."""
        self.hidden: int | None = None
        """The first ``{`` read inside a string of what is open now."""
        self.floor = 0
        """Scanning never goes back before this point (the end of the last stretch scanned twice)."""
        self.closed: set[int] = set()
        """Starts of the spans closed so far: a second scan of a stretch finds them again."""

    def run(self) -> list[_Span]:
        text, n, stack = self.text, len(self.text), self.stack
        search, opens = _TOKEN.search, _OBJECT_START.match
        pos = 0
        while pos < n:
            if not stack:
                pos = text.find("{", pos)
                if pos < 0:
                    break
                if opens(text, pos):
                    stack.append([pos, True, 0, None])
                pos += 1
                continue
            m = search(text, pos)
            if m is None:
                break
            c, pos = m.group(), m.end()
            if c == "[" or (c == "{" and opens(text, pos - 1)):
                stack.append([pos - 1, c == "{", 0, None])
            elif c[0] == '"' and len(c) > 1:
                if self.hidden is None and "{" in c:
                    self.hidden = m.start() + c.index("{")
            elif c == '"':  # a string broken by a raw control character or by the end of the text
                pos = _STRING_BODY.match(text, pos).end()
                if pos >= n:
                    self.unclosed = stack[0][0]
                pos = self.abandon(pos)
            elif (c != "}" and c != "]") or (c == "}") is not stack[-1][1]:
                pos = self.abandon(pos)  # prose, a "{" that starts no object, a mismatched bracket
            else:
                self.close(pos)
        if stack:
            self.unclosed = stack[0][0] if self.unclosed is None else self.unclosed
            self.abandon(n)
        return self.roots

    def close(self, end: int) -> None:
        start, brace, below, inner = self.stack.pop()
        if brace and start in self.closed:
            inner, brace = None, False  # found before, on the first pass over this stretch
        elif brace:
            self.closed.add(start)
        # an array is not an object: the objects in it belong to what encloses it
        spans = [_Span(start, end, below + 1, inner or [])] if brace else inner
        if not self.stack:
            self.hidden = None
            if spans:
                self.roots.extend(spans)
            return
        parent = self.stack[-1]
        parent[2] = max(parent[2], below + 1)
        if spans and parent[3] is None:
            parent[3] = spans
        elif spans:
            parent[3].extend(spans)

    def abandon(self, pos: int) -> int:
        """Drop what is open, keeping the spans closed inside it; returns where scanning goes on."""
        for entry in self.stack:
            if entry[3]:
                self.roots.extend(entry[3])
        self.stack.clear()
        hidden, self.hidden = self.hidden, None
        if hidden is not None and hidden >= self.floor:
            self.floor = pos
            return hidden
        return pos


def scan_objects(text: str, needle: str = "") -> ObjectScan:
    """Every JSON object embedded in ``text`` whose text contains ``needle``, outermost first, in text order.

    A balanced span that decodes is one object (what it contains is part of it); one that does not decode is
    looked into for objects of its own. A span nested deeper than :data:`MAX_DEPTH` is refused whole, and
    a span with neither ``needle`` nor a ``\\u`` escape in it is skipped unread (a key written as ``"action"``, or
    spelled with escapes such as ``"\\u0061ction"``, cannot hide inside it).
    The text is read once to find spans; each span is searched and decoded at most once more, and a
    character lies in at most ``MAX_DEPTH`` spans that are read, so the work is linear in the text.
    """
    scanner = _SpanScanner(text)
    roots = scanner.run()
    objects: list[dict[str, Any]] = []
    too_deep = 0
    work = list(reversed(roots))
    while work:
        span = work.pop()
        if span.depth > MAX_DEPTH:
            too_deep = max(too_deep, span.depth)
            continue
        if needle and text.find(needle, span.start, span.end) < 0 and text.find("\\u", span.start, span.end) < 0:
            continue  # neither the needle nor a \u escape that could spell it
        try:  # decoding the span alone keeps the cost of an error message within the span
            obj, _ = _DECODER.raw_decode(text[span.start : span.end])
        except ValueError:  # not JSON (JSONDecodeError is a ValueError): what is inside may be
            work.extend(reversed(span.children))
            continue
        objects.append(obj)
    return ObjectScan(tuple(objects), too_deep, scanner.unclosed)
