"""Where a compaction may cut, and how to leave a valid list behind.

An assistant message with tool calls and the tool results that follow it form one atomic
*group*: a cut never separates them. Tool results are matched to their call by position (the
results that follow an assistant message answer its calls), because real trajectories reuse
tool-call ids across groups.

All functions are pure: they take a list and return indices or a new list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ctxengine.messages import Message, tool_call_id, tool_calls

__all__ = [
    "STUB_RESULT",
    "align_cut",
    "group_spans",
    "sanitize_tool_pairs",
    "turn_starts",
]

STUB_RESULT = "[Result of this tool call was removed during context compaction]"


def group_spans(messages: Sequence[Mapping[str, Any]], start: int = 0) -> list[tuple[int, int]]:
    """Partition ``messages`` into atomic units ``[start, end)``.

    Each unit is one message, except that an assistant message with tool calls absorbs the
    tool results that directly follow it. Stray tool messages form units of their own.
    With ``start``, the units of ``messages[start:]`` (numbered in ``messages``): where a unit
    of the whole list begins, the units after it are those of the whole list.
    """
    spans: list[tuple[int, int]] = []
    i = start
    n = len(messages)
    while i < n:
        j = i + 1
        if messages[i].get("role") == "assistant" and tool_calls(messages[i]):
            while j < n and messages[j].get("role") == "tool":
                j += 1
        spans.append((i, j))
        i = j
    return spans


def align_cut(messages: Sequence[Mapping[str, Any]], index: int, *, direction: str = "backward") -> int:
    """Move a cut position so it does not fall inside a tool group.

    A cut at ``index`` means ``messages[:index]`` and ``messages[index:]``. If
    ``messages[index]`` is a tool result, the cut moves ``backward`` to the assistant message
    that issued the call (keeping the group after the cut) or ``forward`` past the last result
    (keeping it before the cut).
    """
    n = len(messages)
    index = max(0, min(index, n))
    if direction == "backward":
        while 0 < index < n and messages[index].get("role") == "tool":
            index -= 1
        return index
    if direction == "forward":
        while 0 < index < n and messages[index].get("role") == "tool":
            index += 1
        return index
    raise ValueError(f"direction must be 'backward' or 'forward', not {direction!r}")


def turn_starts(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices of user messages: each starts a turn (seed 004 counts turns by user messages)."""
    return [i for i, m in enumerate(messages) if m.get("role") == "user"]


def sanitize_tool_pairs(messages: Sequence[Message], *, stub: str = STUB_RESULT) -> list[Message]:
    """Return a copy-on-write list in which every tool call has exactly one adjacent result.

    * a tool result whose call is not in the assistant message right before its group is dropped;
    * a second result for the same call is dropped;
    * a call without a result gets a stub result (``stub``) inserted after the group's last
      result, so the provider never sees an unanswered call.

    Messages that need no change are returned as the same objects (never mutated).
    """
    out: list[Message] = []
    pending: dict[str, None] = {}
    pending_owner = -1

    def flush() -> None:
        for cid in pending:
            out.append({"role": "tool", "tool_call_id": cid, "content": stub})
        pending.clear()

    for m in messages:
        role = m.get("role")
        if role == "tool":
            cid = m.get("tool_call_id")
            if pending_owner >= 0 and isinstance(cid, str) and cid in pending:
                del pending[cid]
                out.append(m)
            # else: orphan or duplicate result: dropped
            continue
        flush()
        pending_owner = -1
        out.append(m)
        if role == "assistant":
            ids = [tool_call_id(c) for c in tool_calls(m)]
            if ids:
                pending_owner = len(out) - 1
                pending.update(dict.fromkeys(i for i in ids if i))
    flush()
    return out
