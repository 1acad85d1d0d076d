"""What the agent used next, and whether it was in view: the bench's needed-context measure.

The preservation facts (:mod:`ctxengine.facts`) ask whether what the agent *could* need is still
in the context or one recall away. This asks a harder question of each recorded call: of the
identifiers the agent's next message actually uses (in its text or its tool call's arguments)
that it learned from an earlier tool output or user message, how many were verbatim in the
request the strategy sent for that call? A use is *in view* when the identifier is a substring
of that request's text (every message's content and tool call arguments); recall does not count
here: an agent that must first think of calling ``ctx_grep`` has already lost its footing.

An identifier is a token an agent copies rather than writes from its own knowledge:

* a URL, a file path (``src/a/b.py``) or a file name with an extension (``Foo.java``);
* a code name: ``snake_case`` or ``camelCase`` / ``PascalCase`` with an inner capital, a dotted
  name (``org.apache.Foo``), an error name (``NullPointerException``);
* an id: a token mixing letters and digits (``credit_card_2198526``, ``HAT170``, ``ZFA04Y``), a
  long number (5+ digits), a date (``2024-05-17``), an amount with cents (``1,234.50``);
* a short whole string argument of a tool call (``"sofia_kim_7287"``), a quoted or back-ticked
  span of the agent's text (4–80 characters, no line break).

It must be at least 4 characters long, appear verbatim in an earlier tool output or user
message (its *source*; the most recent one counts for the distance), and not appear in the
system prompt (which every strategy keeps). The distance of a use is the number of calls since
its source first reached the agent (1: the output of the previous call).

The extraction is this module's own: it shares nothing with what the engines keep
(:mod:`ctxengine.engines.kit.digest`), so an engine cannot score well by keeping what the
measure happens to look for.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxengine.loop import recorded_turns
from ctxengine.messages import Message, content_text

__all__ = ["BUCKETS", "CallUses", "InView", "identifiers", "session_uses"]

BUCKETS = ("1", "2-3", "4-10", ">10")
"""How far back a use's source is, in calls (the bench reports the share in view per bucket)."""

MIN_LEN = 4
MAX_QUOTED = 80

_PATTERNS = [
    r"(?:https?|file)://[^\s<>\"'`\\|^{}\[\]]+",  # URLs
    r"(?:[\w.-]*/)+[\w.-]+",  # paths
    r"\b[\w-]+\.[A-Za-z][A-Za-z0-9]{0,5}\b",  # file names, dotted names
    r"\b[A-Za-z][A-Za-z0-9]*(?:\.[A-Za-z_][A-Za-z0-9_]*){2,}\b",  # org.apache.Foo
    r"\b[A-Za-z_][A-Za-z0-9]*_[A-Za-z0-9_]+\b",  # snake_case, credit_card_2198526
    r"\b[a-z]+[A-Z][A-Za-z0-9]*\b",  # camelCase
    r"\b[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*\b",  # PascalCase, FooError
    r"\b(?=[A-Z0-9]*[0-9])(?=[A-Z0-9]*[A-Z])[A-Z0-9]{4,}\b",  # HAT170, ZFA04Y
    r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?)?\b",  # dates
    r"\b\d{1,3}(?:,\d{3})*\.\d{2}\b|\b\d+\.\d{2}\b",  # amounts
    r"\b\d{5,}\b",  # long numbers
]
_IDENT_RE = re.compile("|".join(f"(?:{p})" for p in _PATTERNS))
_QUOTED_RE = re.compile(r"\"([^\"\n]{4,80})\"|`([^`\n]{4,80})`|'([^'\n]{4,80})'")
_TRAIL = ".,;:!?)]}'\"/"


def identifiers(text: str) -> set[str]:
    """The identifiers of ``text`` (see the module docstring), at least :data:`MIN_LEN` long."""
    found: set[str] = set()
    for m in _IDENT_RE.finditer(text):
        tok = m.group(0).rstrip(_TRAIL)
        if len(tok) >= MIN_LEN:
            found.add(tok)
    for m in _QUOTED_RE.finditer(text):
        tok = next(g for g in m.groups() if g is not None).strip()
        if len(tok) >= MIN_LEN:
            found.add(tok)
    return found


def _argument_strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _argument_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _argument_strings(v)


def used_identifiers(message: Mapping[str, Any]) -> set[str]:
    """What an assistant message uses: the identifiers of its text and of its tool calls'
    arguments, plus each short whole string argument (no space, at most 80 characters)."""
    found = identifiers(content_text(message.get("content")))
    for call in message.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, Mapping) else None
        raw = fn.get("arguments") if isinstance(fn, Mapping) else None
        if not isinstance(raw, str):
            continue
        try:
            args: Any = json.loads(raw)
        except ValueError:
            args = raw
        for s in _argument_strings(args):
            found |= identifiers(s)
            s = s.strip()
            if MIN_LEN <= len(s) <= MAX_QUOTED and not any(c.isspace() for c in s):
                found.add(s)
    return found


def request_text(messages: Iterable[Mapping[str, Any]]) -> str:
    """What a use is looked up in: every message's content and tool calls' arguments."""
    parts: list[str] = []
    for m in messages:
        parts.append(content_text(m.get("content")))
        for call in m.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(fn, Mapping):
                parts.append(str(fn.get("arguments") or ""))
    return "\n".join(parts)


def bucket(distance: int) -> str:
    """The :data:`BUCKETS` label of a distance in calls."""
    if distance <= 1:
        return BUCKETS[0]
    if distance <= 3:
        return BUCKETS[1]
    if distance <= 10:
        return BUCKETS[2]
    return BUCKETS[3]


@dataclass(frozen=True, slots=True)
class CallUses:
    """The uses of one recorded call: ``(identifier, distance in calls)`` pairs."""

    uses: tuple[tuple[str, int], ...]


def session_uses(messages: Sequence[Message]) -> list[CallUses]:
    """Each recorded call's uses (:func:`ctxengine.loop.recorded_turns` cuts the calls, as the
    replay does): one entry per call, in order. Independent of the engine: computed once per
    session."""
    first, chunks = recorded_turns(messages)
    system = "\n".join(content_text(m.get("content")) for m in first if m.get("role") == "system")
    sources: list[tuple[int, str]] = []  # (call after which it arrived, text): newest last
    for m in first:
        if m.get("role") in ("user", "tool"):
            sources.append((-1, content_text(m.get("content"))))
    out: list[CallUses] = []
    for k, chunk in enumerate(chunks):
        used = used_identifiers(chunk[0]) if chunk and chunk[0].get("role") == "assistant" else set()
        uses: list[tuple[str, int]] = []
        for ident in sorted(used):
            if ident in system:
                continue
            src = next((j for j, text in reversed(sources) if ident in text), None)
            if src is not None:
                uses.append((ident, k - src))
        out.append(CallUses(tuple(uses)))
        for m in chunk:
            if m.get("role") in ("user", "tool"):
                sources.append((k, content_text(m.get("content"))))
    return out


@dataclass(slots=True)
class InView:
    """The uses counted in view, per distance bucket (what a :class:`SessionRun` carries)."""

    total: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0))
    kept: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0))
    missed: list[str] = field(default_factory=list)

    def check(self, call: int, uses: CallUses, request: Sequence[Message]) -> None:
        """Count the uses of call ``call`` against the request sent for it."""
        if not uses.uses:
            return
        text = request_text(request)
        for ident, distance in uses.uses:
            b = bucket(distance)
            self.total[b] += 1
            if ident in text:
                self.kept[b] += 1
            elif len(self.missed) < 20:
                self.missed.append(f"call {call}: {ident} ({distance} back)")

    def add(self, other: InView) -> None:
        for b in BUCKETS:
            self.total[b] += other.total.get(b, 0)
            self.kept[b] += other.kept.get(b, 0)

    def share(self, buckets: Sequence[str] = BUCKETS) -> float:
        """The share of uses in view over ``buckets`` (1.0 when there were none)."""
        total = sum(self.total[b] for b in buckets)
        return 1.0 if total == 0 else sum(self.kept[b] for b in buckets) / total

    def to_dict(self) -> dict[str, Any]:
        return {
            "uses": sum(self.total.values()),
            "in_view": round(self.share(), 4),
            "in_view_over_10_back": round(self.share((BUCKETS[3],)), 4),
            "by_distance": {b: {"uses": self.total[b], "in_view": self.kept[b]} for b in BUCKETS},
        }
