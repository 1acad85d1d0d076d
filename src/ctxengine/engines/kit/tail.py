"""Protected-tail policies: where the part of the context no compaction touches begins.

Each returns an index into ``messages`` (``len(messages)`` when nothing is protected); a tool
group (an assistant message with its results) is never split.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ctxengine.boundaries import group_spans

__all__ = ["tail_by_budget", "tail_by_exchanges", "tail_by_turns"]

Spans = list[tuple[int, int]]


def tail_by_turns(messages: Sequence[Mapping[str, Any]], n: int, spans: Spans | None = None) -> int:
    """The last ``n`` turns, a turn being a user message or an assistant message with its tool
    results (agent sessions hold few user messages and many exchanges; counting both keeps the
    recent working set in either kind of session)."""
    if n <= 0:
        return len(messages)
    spans = group_spans(messages) if spans is None else spans
    counted = 0
    for start, _end in reversed(spans):
        if messages[start].get("role") in ("user", "assistant"):
            counted += 1
            if counted == n:
                return start
    return 0


def tail_by_exchanges(messages: Sequence[Mapping[str, Any]], n: int, spans: Spans | None = None) -> int:
    """The last ``n`` tool exchanges (assistant call + results) and everything after them."""
    if n <= 0:
        return len(messages)
    spans = group_spans(messages) if spans is None else spans
    groups = [a for a, b in spans if b - a > 1 and messages[a].get("role") == "assistant"]
    if not groups:
        return len(messages)
    return groups[-n] if len(groups) >= n else groups[0]


def tail_by_budget(
    messages: Sequence[Mapping[str, Any]],
    *,
    max_messages: int,
    max_tokens: int,
    count: Callable[[Sequence[Mapping[str, Any]]], int],
    spans: Spans | None = None,
) -> int:
    """Whole units from the end, at most ``max_messages`` messages and ``max_tokens`` tokens,
    at least one unit."""
    spans = group_spans(messages) if spans is None else spans
    n = tokens = 0
    start = len(messages)
    for s, e in reversed(spans):
        t = count(messages[s:e])
        if start < len(messages) and (n + (e - s) > max_messages or tokens + t > max_tokens):
            break
        n += e - s
        tokens += t
        start = s
    return start
