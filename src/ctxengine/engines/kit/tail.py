"""Protected-tail policies: where the part of the context no compaction touches begins.

Each returns an index into ``messages`` (``len(messages)`` when nothing is protected); a tool
group (an assistant message with its results) is never split.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxengine.boundaries import align_cut, group_spans
from ctxengine.messages import is_summary

__all__ = ["HeadTailPlan", "Layout", "plan_head_tail", "tail_by_budget", "tail_by_exchanges", "tail_by_turns"]

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


@dataclass(frozen=True, slots=True, eq=False)
class Layout:
    """The tool groups of a message list and what a policy reads of each message (role, tokens,
    whether ctxengine wrote it), built once per list. :meth:`of` extends the layout of an
    earlier list: only what follows the messages both share (equal messages, in order: what is
    read of a message depends on its value alone; the same objects compare at once) is read
    again, so a turn that appends to the context it was sent costs what it appended.
    Never changed once built (a compaction on a worker thread may read one too)."""

    messages: list[Mapping[str, Any]]
    roles: list[Any]
    tokens: list[int]
    totals: list[int]
    """``totals[i]`` is ``sum(tokens[:i])`` (one more entry than there are messages)."""
    marked: list[bool]
    spans: Spans
    """:func:`~ctxengine.boundaries.group_spans` of the list."""
    exchanges: list[int]
    """Where each tool exchange (an assistant message with its results) begins, in order."""
    memo: dict[Any, Any] = field(default_factory=dict)
    """What a policy derives from this very list (the same answer for every caller)."""

    @classmethod
    def of(
        cls,
        messages: Sequence[Mapping[str, Any]],
        *,
        count: Callable[[Mapping[str, Any]], int],
        marked: Callable[[Mapping[str, Any]], bool],
        previous: Layout | None = None,
    ) -> Layout:
        """The layout of ``messages``; ``previous`` (built with the same ``count`` and
        ``marked``) lends what its list shares with ``messages``."""
        keep = 0 if previous is None else previous.shared(messages)
        if previous is None or keep == 0:
            previous = _EMPTY
        msgs = list(messages)
        new = msgs[keep:]
        roles = previous.roles[:keep] + [m.get("role") for m in new]
        tokens = previous.tokens[:keep] + [count(m) for m in new]
        totals = previous.totals[: keep + 1]
        for t in tokens[keep:]:
            totals.append(totals[-1] + t)
        flags = previous.marked[:keep] + [marked(m) for m in new]
        # a group ending before the first new message is whole in both lists; the one reaching
        # it may take new tool results: the groups are read again from its start
        k = len(previous.spans)
        while k and previous.spans[k - 1][1] >= keep:
            k -= 1
        start = previous.spans[k - 1][1] if k else 0
        spans = previous.spans[:k] + group_spans(msgs, start)
        exchanges = previous.exchanges[: bisect.bisect_left(previous.exchanges, start)]
        exchanges += [a for a, b in spans[k:] if b - a > 1 and roles[a] == "assistant"]
        return cls(msgs, roles, tokens, totals, flags, spans, exchanges)

    def shared(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """How many leading messages of ``messages`` equal this layout's (one C-level
        comparison when all of them do: a list compares the same objects without reading them)."""
        old = self.messages
        k = len(old)
        if k <= len(messages) and old == (messages[:k] if isinstance(messages, list) else list(messages[:k])):
            return k
        n = 0
        for a, b in zip(old, messages, strict=False):
            if a is not b and a != b:
                break
            n += 1
        return n

    def describes(self, messages: Sequence[Mapping[str, Any]]) -> bool:
        """Whether this is the layout of ``messages`` (equal messages, in order)."""
        return len(self.messages) == len(messages) and self.messages == (messages if isinstance(messages, list) else list(messages))

    def tail(self, n: int) -> int:
        """:func:`tail_by_exchanges` of the list."""
        ex = self.exchanges
        if n <= 0 or not ex:
            return len(self.messages)
        return ex[-n] if len(ex) >= n else ex[0]

    def total(self, a: int, b: int) -> int:
        """Tokens of ``messages[a:b]``."""
        return self.totals[b] - self.totals[a]


_EMPTY = Layout([], [], [], [0], [], [], [])


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


@dataclass(slots=True)
class HeadTailPlan:
    """What a summarizing compaction keeps: ``[0, head_end)`` and ``[tail_start, n)``, the latest
    user message when it is ``pulled`` out of the middle, the ``live`` messages of the middle
    (kept verbatim, in order, before it), and the ``middle`` it replaces."""

    head_end: int
    tail_start: int
    pulled_user: int | None
    middle: list[int]
    live: list[int] = field(default_factory=list)


def plan_head_tail(
    msgs: Sequence[Mapping[str, Any]],
    toks: Sequence[int],
    *,
    protect_first_n: int,
    protect_last_n: int,
    tail_budget: int,
    soft_cap: Callable[[int], int],
    frozen: tuple[int, Mapping[str, Any]] | None = None,
    is_own_summary: Callable[[Any], bool] = is_summary,
    live: Callable[[Mapping[str, Any]], bool] | None = None,
) -> HeadTailPlan:
    """The head is ``protect_first_n`` messages, extended to the first user message and to the
    ``frozen`` prefix ``(length, last message)`` an earlier compaction left (never past a
    summary: every later compaction can compress again); the tail walks back by
    ``tail_budget`` tokens and keeps up to ``protect_last_n`` messages while under
    ``soft_cap(head_tokens)``. The latest user message stays verbatim: in the tail, or pulled
    out of the middle. Tool groups are never split. A user message of the middle that ``live``
    accepts (one the client rewrites in place every turn: its working set, e.g. aider's files)
    stays verbatim too, pulled out of the middle like the latest user message."""
    n = len(msgs)
    head_end = _head_end(msgs, protect_first_n, frozen, is_own_summary)
    cap = soft_cap(sum(toks[:head_end]))
    spans = [(a + head_end, b + head_end) for a, b in group_spans(msgs[head_end:])]
    start = _tail_walk(spans, toks, n, tail_budget, protect_last_n, cap)
    # the user's latest message, not an engine's user-role digest or summary after it (rule 5)
    last_user = next((i for i in range(n - 1, -1, -1) if msgs[i].get("role") == "user" and not is_summary(msgs[i])), None)
    start = _middle_kept(spans, start, head_end, last_user)
    acc = sum(toks[start:])
    pulled: int | None = None
    if last_user is not None and head_end <= last_user < start:
        if acc + sum(toks[last_user:start]) <= cap and last_user > head_end:
            start = last_user
        else:
            pulled = last_user
    kept = [i for i in range(head_end, start) if i != pulled and msgs[i].get("role") == "user" and live(msgs[i])] if live is not None else []
    middle = [i for i in range(head_end, start) if i != pulled and i not in kept]
    return HeadTailPlan(head_end, start, pulled, middle, kept)


def _head_end(
    msgs: Sequence[Mapping[str, Any]],
    protect_first_n: int,
    frozen: tuple[int, Mapping[str, Any]] | None,
    is_own_summary: Callable[[Any], bool],
) -> int:
    """Where the head ends: ``protect_first_n`` messages, extended to the first user message
    and to the ``frozen`` prefix, cut back before the first summary after the first message."""
    n = len(msgs)
    head_end = align_cut(msgs, min(protect_first_n, n), direction="forward")
    first_user = next((i for i, m in enumerate(msgs) if m.get("role") == "user"), None)
    if first_user is not None and first_user >= head_end and not is_summary(msgs[first_user]):
        head_end = align_cut(msgs, first_user + 1, direction="forward")
    if frozen is not None:
        k, last = frozen
        if head_end < k <= n and msgs[k - 1] == last:
            head_end = align_cut(msgs, k, direction="forward")
    for i in range(1, head_end):
        if is_own_summary(msgs[i]):
            return i
    return head_end


def _tail_walk(spans: Spans, toks: Sequence[int], n: int, budget: int, protect_last_n: int, cap: int) -> int:
    """Where the tail begins: whole groups of ``spans`` from the end while they fit ``budget``
    tokens, or ``cap`` while the tail holds fewer than ``protect_last_n`` messages; ``n`` (no
    tail) when there are none."""
    start = n
    acc = 0
    count = 0
    for a, b in reversed(spans):
        g = sum(toks[a:b])
        if start < n and not (acc + g <= budget or (count < protect_last_n and acc + g <= cap)):
            break
        acc += g
        count += b - a
        start = a
    return start


def _middle_kept(spans: Spans, start: int, head_end: int, last_user: int | None) -> int:
    """``start`` moved on when everything after the head fits the tail (or the middle would
    hold only the latest user message): the middle gets the oldest groups back, the last group
    stays in the tail."""
    k = 0
    while k < len(spans) - 1 and (start <= head_end or all(i == last_user for i in range(head_end, start))):
        start = max(start, spans[k][1])
        k += 1
    return start
