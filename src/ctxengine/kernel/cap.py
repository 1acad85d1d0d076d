"""The window cap stage, after any engine (:mod:`ctxengine.window`): no request over the window
minus the completion reserve and margin, tool definitions included; what is cut stays in the
store, retrievable through recall, and the cut is recorded like a compaction."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ctxengine.kernel.recording import Recorder
from ctxengine.kernel.state import SessionState
from ctxengine.kernel.tools import ToolDesk
from ctxengine.messages import Message
from ctxengine.window import CapResult, WindowCap

__all__ = ["CapStage"]

log = logging.getLogger("ctxengine.manager")  # the kernel logs under the manager's name


def _refs(history: list[Message], ids: list[str]) -> Callable[[int, Message], str | None]:
    """The store id of a tool result or a user message of ``history``, for the cut's ``ref=``
    (the maps built on the first cut only)."""
    maps: list[dict[Any, str]] = []

    def ref_for(i: int, m: Message) -> str | None:
        if not maps:
            pairs = list(zip(history, ids, strict=True))
            maps.append({h.get("tool_call_id"): mid for h, mid in pairs if h.get("role") == "tool"})
            maps.append({json.dumps(h, sort_keys=True, default=str): mid for h, mid in pairs if h.get("role") == "user"})
        if m.get("role") == "tool":
            return maps[0].get(m.get("tool_call_id"))
        return maps[1].get(json.dumps(m, sort_keys=True, default=str))

    return ref_for


class CapStage:
    """Holds ``window`` for every session; ``enabled=False`` (the benchmark's no-compaction
    baseline only) lets every request through."""

    def __init__(self, window: WindowCap, recorder: Recorder, tools: ToolDesk, *, enabled: bool = True) -> None:
        self.window = window
        self.recorder = recorder
        self.tools = tools
        self.enabled = enabled

    def over(self, s: SessionState, msgs: list[Message], reserve: int) -> bool:
        """Whether the cap would cut ``msgs`` (with ``reserve`` tokens of tool definitions)."""
        return self.enabled and self.window.over(msgs, tally=s.tally, reserve=reserve)

    def room(self, s: SessionState, messages: Sequence[Message], reserve: int) -> int:
        return self.window.room(messages, tally=s.tally, reserve=reserve)

    def fit_request(self, s: SessionState, messages: Sequence[Message]) -> Sequence[Message]:
        """``messages`` held under the window with the session's last tool definitions."""
        if not self.enabled:
            return messages
        return self.window.fit(messages, tally=s.tally, reserve=s.tool_window).messages

    def fit_alone(self, messages: Sequence[Message], reserve: int, session_id: str | None) -> CapResult:
        """``messages`` held under the window by the cap alone, no session state used or changed
        (``ContextManager.fit_window``). When they are over and ``session_id`` is given, they are
        recorded in that session's store first (:meth:`Recorder.originals`), so every cut points
        at its original; without a store or ``session_id``, nothing is recorded, no message is
        folded away and no marker names a ref."""
        ref_for = None
        if session_id is not None and self.recorder.store is not None and self.window.over(messages, reserve=reserve):
            history = list(messages)
            ids = self.recorder.originals(session_id, history)
            if ids is not None and len(ids) == len(history):
                ref_for = _refs(history, ids)
        return self.window.fit(messages, ref_for=ref_for, reserve=reserve, recall=False)

    def cap(
        self,
        s: SessionState,
        msgs: list[Message],
        tokens: int,
        history: list[Message],
        ids_of: Callable[[], list[str] | None],
        tools: Sequence[Mapping[str, Any]] | None = None,
        reserve: int = 0,
    ) -> CapResult:
        """Hold the window after the engine, ``reserve`` tokens of tool definitions included;
        ``history`` and ``ids_of`` give the store ids of the originals a cut refers to."""
        if not self.enabled:
            return CapResult(msgs, tokens, self.window.limit)
        ref_for = None
        over = self.window.over(msgs, tally=s.tally, reserve=reserve)
        if over and not s.lost and tools is not None and self.tools.would_offer_recall(s):
            reserve = self.tools.cost(s, tools, recall=True)[1]  # a cut offers the recall tools
        # the ids only when something is cut (a deferred recording is written then)
        ids = ids_of() if self.recorder.store is not None and over else None
        if ids is not None and len(ids) == len(history):
            ref_for = _refs(history, ids)
        result = self.window.fit(msgs, ref_for=ref_for, tally=s.tally, reserve=reserve, recall=s.reach.tools)
        if result.changed:
            s.window_cuts += len(result.cut) + len(result.stubbed_users)
            s.lost = True
            for note in result.notes:
                log.info("session %s: %s", s.id, note)
        return result
