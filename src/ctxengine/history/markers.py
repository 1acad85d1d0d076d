"""Cache markers are not edits: two messages that differ only in per-turn transport details
(:data:`MARKER_KEYS`) are the same message, and how two histories relate once markers are set
aside (see :mod:`ctxengine.history`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "MARKER_KEYS",
    "common_prefix",
    "extends",
    "first_difference",
    "marker_moves",
    "one_extends_the_other",
    "same_but_markers",
    "same_but_tail",
    "without_markers",
]


MARKER_KEYS = frozenset({"cache_control"})
"""Keys that are per-turn transport details, not content: a client moves them from message to
message (and changes a marker's ``ttl``) without editing anything."""


def _plain_parts(parts: list[Any]) -> list[Any] | None:
    """``parts`` without marker keys (on a part, and on the blocks of a tool result's own
    ``content`` list), ``None`` when there is none to remove."""
    for p in parts:  # the usual list holds no marker: looked at once, nothing built
        if type(p) is dict and ("cache_control" in p or type(p.get("content")) is list):
            break
    else:
        return None
    out: list[Any] | None = None
    for i, p in enumerate(parts):
        if type(p) is not dict:
            continue
        q = p
        if not MARKER_KEYS.isdisjoint(p):
            q = {k: v for k, v in p.items() if k not in MARKER_KEYS}
        inner = q.get("content")
        if type(inner) is list:
            plain = _plain_parts(inner)
            if plain is not None:
                q = {**q, "content": plain}
        if q is not p:
            if out is None:
                out = list(parts)
            out[i] = q
    return out


def without_markers(message: Any, *, keep_shape: bool = False) -> Any:
    """``message`` without its transport details (:data:`MARKER_KEYS` on the message, on its
    content parts or blocks, on blocks nested in a tool result, on tool calls), and a content
    list left as one plain text part (what a marker on string content makes of it) written as
    that string, unless ``keep_shape``. The same object when there is nothing to remove; never
    edits the input."""
    if type(message) is not dict:
        return message
    content = message.get("content")
    calls = message.get("tool_calls")
    if "cache_control" not in message and type(content) is not list and calls is None:
        return message  # the usual message: string content, no marker
    out = message
    if not MARKER_KEYS.isdisjoint(message):
        out = {k: v for k, v in message.items() if k not in MARKER_KEYS}
    if type(content) is list:
        plain = _plain_parts(content)
        new = content if plain is None else plain
        if not keep_shape and len(new) == 1 and type(new[0]) is dict and new[0].get("type") == "text" and len(new[0]) == 2 and type(new[0].get("text")) is str:
            new = new[0]["text"]
        if new is not content:
            out = {**out, "content": new}
    if type(calls) is list:
        plain = _plain_parts(calls)
        if plain is not None:
            out = {**out, "tool_calls": plain}
    return out


def same_but_markers(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same message once their transport details are left out
    (:func:`without_markers`)."""
    return a is b or a == b or without_markers(a) == without_markers(b)


def _extends_content(longer: Any, shorter: Any) -> bool:
    """Whether content ``longer`` is ``shorter`` with something appended: a longer string that
    starts with it, or parts that start with its parts, the last shared text part's text
    extended and/or more parts after it (a string counts as one text part)."""
    if isinstance(longer, str) and isinstance(shorter, str):
        return len(longer) > len(shorter) and longer.startswith(shorter)
    if not isinstance(longer, list):
        return False
    parts = [{"type": "text", "text": shorter}] if isinstance(shorter, str) else shorter
    if not isinstance(parts, list) or not parts or len(longer) < len(parts):
        return False
    n = len(parts)
    if longer[: n - 1] != parts[: n - 1]:
        return False
    a, b = longer[n - 1], parts[-1]
    if a == b:
        return len(longer) > n
    if not (isinstance(a, dict) and isinstance(b, dict) and a.get("type") == "text" == b.get("type")):
        return False
    ta, tb = a.get("text"), b.get("text")
    rest_a = {k: v for k, v in a.items() if k != "text"}
    rest_b = {k: v for k, v in b.items() if k != "text"}
    return isinstance(ta, str) and isinstance(tb, str) and rest_a == rest_b and len(ta) > len(tb) and ta.startswith(tb)


def same_but_tail(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same message but for a tail one of them has appended to
    its content (markers aside): aider appends its reminder to the newest user message and
    sends that message without it next turn. Every other key must be the same."""
    if same_but_markers(a, b):
        return True
    if type(a) is not dict or type(b) is not dict:
        return False
    pa, pb = without_markers(a), without_markers(b)
    if {k: v for k, v in pa.items() if k != "content"} != {k: v for k, v in pb.items() if k != "content"}:
        return False
    ca, cb = pa.get("content"), pb.get("content")
    return _extends_content(ca, cb) or _extends_content(cb, ca)


def first_difference(a: list[Any], b: list[Any], n: int) -> int:
    """The first index below ``n`` where ``a`` and ``b`` differ (``n`` when none does). The
    differences a moved marker makes lie at the end, so the prefixes before the last 1, 2, 4 …
    items are compared first (each in C, stopping at its own first difference); the index is
    then looked for among those last items only."""
    if a[:n] == b[:n]:
        return n
    t = 1
    while t < n:
        k = n - t
        if a[:k] == b[:k]:
            break
        t *= 2
    else:
        k = 0
    while k < n and (a[k] is b[k] or a[k] == b[k]):
        k += 1
    return k


def marker_moves(given: list[Any], seen: list[Any]) -> list[int] | None:
    """The indices where ``given`` holds a message of ``seen`` that differs only in its markers,
    when ``given`` starts with every message of ``seen`` that way; ``None`` otherwise. Only the
    messages from the first difference on are looked at (a real difference ends the search
    there)."""
    n = len(seen)
    if len(given) < n:
        return None
    moved: list[int] = []
    p = 0
    while p < n:
        p += first_difference(given[p:n], seen[p:], n - p)
        if p >= n:
            break
        if without_markers(given[p]) != without_markers(seen[p]):
            return None
        moved.append(p)
        p += 1
    return moved


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Length of the common prefix of two message lists (same objects first, then by value)."""
    n = min(len(a), len(b))
    if n and a[n - 1] is b[n - 1] and list(a[:n]) == list(b[:n]):
        return n
    lo, hi = 0, n
    # binary search on "the first k match": equality of prefixes is monotonic
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if list(a[:mid]) == list(b[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def extends(given: Sequence[Any], seen: list[Any]) -> bool:
    """``given`` starts with every message of ``seen``."""
    n = len(seen)
    if len(given) < n:
        return False
    if n == 0:
        return True
    # the last one first: a mismatch (another list) is found without walking the prefix
    last = given[n - 1]
    if last is not seen[-1] and last != seen[-1]:
        return False
    # a list's slice is a list already: copying it again would touch every message once more
    return (given[:n] if isinstance(given, list) else list(given[:n])) == seen


def one_extends_the_other(a: list[Any], b: list[Any]) -> bool:
    """The shorter of ``a`` and ``b`` is a prefix of the longer."""
    n = min(len(a), len(b))
    return a[:n] == b[:n]
