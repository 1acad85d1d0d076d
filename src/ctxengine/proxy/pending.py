"""Recall calls the model made beside the client's own calls, answered by the proxy.

When one reply calls both the engine's recall tools and the client's tools, the client gets its
own calls (it cannot answer the others), and the proxy answers the recall calls itself. The
client's next request carries the assistant turn as the client saw it; the proxy puts the
recall calls back into that turn and their results after the client's results, every request
from then on (the client never sends them), so the model sees what it asked for and every
call keeps its result: the request stays valid.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxengine.messages import Message

__all__ = ["PendingRecall"]

_MAX = 64  # insertions kept per session (the oldest go first; a long session compacts them away)


@dataclass(slots=True)
class _Insertion:
    anchor: str  # the id of one of the client's calls in the same assistant turn
    calls: list[dict[str, Any]]  # the recall calls (OpenAI ``tool_calls`` entries)
    results: list[Message]  # their answers (``role: "tool"`` messages)
    source: Any = None  # the client's assistant message last seen, and the merged one made from it
    merged: Message | None = None
    at: int = -1  # where the assistant message was last found


@dataclass(slots=True)
class PendingRecall:
    """The recall round trips one session's client never sends back (see the module docstring)."""

    items: list[_Insertion] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.items)

    def add(self, anchor: str, answered: Sequence[tuple[str, str, Mapping[str, Any], str]]) -> None:
        """Remember recall calls ``(id, name, arguments, result)`` made in the turn holding the
        client's call ``anchor``."""
        calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(dict(a), ensure_ascii=False)}} for i, n, a, _ in answered]
        results: list[Message] = [{"role": "tool", "tool_call_id": i, "content": r} for i, _, _, r in answered]
        self.items.append(_Insertion(anchor, calls, results))
        del self.items[:-_MAX]

    def apply(self, messages: list[Message]) -> list[Message] | None:
        """``messages`` with the recall turns put back (a new list), or None when none applies.
        An insertion whose turn is no longer in the history (the client rewrote it) is dropped."""
        found: list[tuple[int, _Insertion]] = []
        kept: list[_Insertion] = []
        for ins in self.items:
            i = self._find(messages, ins)
            if i is not None:
                found.append((i, ins))
                kept.append(ins)
        self.items = kept
        if not found:
            return None
        out = list(messages)
        for i, ins in sorted(found, key=lambda f: f[0], reverse=True):
            msg = out[i]
            if ins.source is not msg or ins.merged is None:
                merged = dict(msg)
                merged["tool_calls"] = [*(msg.get("tool_calls") or []), *ins.calls]
                ins.source, ins.merged = msg, merged
            out[i] = ins.merged
            j = i + 1
            while j < len(out) and isinstance(out[j], Mapping) and out[j].get("role") == "tool":
                j += 1
            out[j:j] = ins.results
        return out

    @staticmethod
    def _find(messages: list[Message], ins: _Insertion) -> int | None:
        def holds(i: int) -> bool:
            m = messages[i]
            if not isinstance(m, Mapping) or m.get("role") != "assistant":
                return False
            return any(isinstance(c, Mapping) and c.get("id") == ins.anchor for c in m.get("tool_calls") or [])

        if 0 <= ins.at < len(messages) and holds(ins.at):
            return ins.at
        for i in range(len(messages) - 1, -1, -1):
            if holds(i):
                ins.at = i
                return i
        return None
