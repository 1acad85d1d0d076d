"""One turn, stage by stage (``ContextManager.prepare``): the input mapped, recall calls answered
outside the session's lock, tool definitions counted, engine calls answered, the input recorded,
an output the agent points back to put back in view (:mod:`.pointers`), compaction (hygiene, the engine's trigger), the window cap, and what the turn leaves behind."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxengine.config import Config
from ctxengine.history import TurnInput
from ctxengine.kernel.cap import CapStage
from ctxengine.kernel.compaction import Compaction
from ctxengine.kernel.engines import EngineHost
from ctxengine.kernel.inputs import map_input
from ctxengine.kernel.pointers import is_pointer, restore_pointed
from ctxengine.kernel.recording import Recorder
from ctxengine.kernel.state import CompactionDue, HeldNow, SessionState
from ctxengine.kernel.status import update_pressure
from ctxengine.kernel.tools import ToolDesk
from ctxengine.messages import Message

__all__ = ["TurnOptions", "TurnPlanner"]


@dataclass(frozen=True, slots=True)
class TurnOptions:
    """The keyword arguments of one ``ContextManager.prepare`` (documented there), passed to the
    stages as one value."""

    focus_topic: str | None = None
    defer_record: bool = False
    may_compact: bool = True
    compact: bool = False
    recall: bool | None = None


class TurnPlanner:
    """Runs the stages of a turn in their order; each stage keeps its own state."""

    def __init__(self, config: Config, host: EngineHost, recorder: Recorder, tools: ToolDesk, compaction: Compaction, cap: CapStage) -> None:
        self.config = config
        self.host = host
        self.recorder = recorder
        self.tools = tools
        self.compaction = compaction
        self.cap = cap

    def prepare(self, s: SessionState, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None, opts: TurnOptions) -> list[Message]:
        """What to send this turn (``ContextManager.prepare`` documents the arguments)."""
        may_compact = opts.may_compact
        with s.lock if may_compact else HeldNow(s.lock):
            s.reach.tools = opts.recall is not False
            if not may_compact and s.pending is not None:
                raise CompactionDue("a deferred store write is pending")
            self.recorder.flush(s)
            self.host.sync_window(s)
            turn = map_input(s, messages, strict=self.host.strict, quiet=not may_compact)
        msgs = self.tools.dispatch_recall(s, turn.messages) if may_compact else turn.messages
        with s.lock if may_compact else HeldNow(s.lock):
            return self._plan(s, turn, msgs, tools, opts)

    def _plan(self, s: SessionState, turn: TurnInput, msgs: list[Message], tools: Sequence[Mapping[str, Any]] | None, opts: TurnOptions) -> list[Message]:
        """The turn under the session's lock, once the recall calls are answered."""
        focus_topic, defer_record, may_compact, compact = opts.focus_topic, opts.defer_record, opts.may_compact, opts.compact
        pointed = any(is_pointer(m) for m in turn.new)  # a re-read answered "unchanged since last read"
        if pointed and not may_compact:
            raise CompactionDue("a new tool result points back to an earlier output")
        extra, extra_window = self.tools.cost(s, tools, quiet=not may_compact)
        self.host.fit(s, extra_window)
        counted = None if may_compact else self.compaction.check_quiet(s, turn, defer_record, extra, extra_window)
        if tools is not None and may_compact:
            self.tools.listing(s, tools)  # warns of a clash (once per turn that may compact)
        msgs = self.tools.dispatch_engine_tools(s, msgs)
        history = msgs
        ids = self.recorder.record(s, turn, history, defer=defer_record)
        if pointed:  # its earlier output back in view
            msgs = restore_pointed(msgs, turn.base, s.history.raw, s.recall.originals if s.recall is not None else None)
        # the quiet check counted this very list (no tool answer was added since)
        tokens = counted if counted is not None and msgs is turn.messages else s.counter.count(msgs) + extra
        msgs, tokens, compacted = self.compaction.run(s, msgs, tokens, extra, extra_window, focus_topic=focus_topic, may_compact=may_compact, compact=compact)
        if compacted and tools is not None:  # the recall tools may go out from now on
            extra, extra_window = self.tools.cost(s, tools)
            self.host.fit(s, extra_window)
        capped = self.cap.cap(s, msgs, tokens, history, ids, tools, extra_window)
        if capped.changed:
            self.recorder.cut(s, msgs, capped.messages, tokens - extra, capped.tokens)
            msgs = capped.messages
            extra, extra_window = self.tools.cost(s, tools)  # recall offered after a cut
            tokens = capped.tokens + extra
            s.counter.reset()
        s.tool_tokens, s.tool_window, s.agent_tools = extra, extra_window, tools
        s.last_sent = msgs
        s.last_tokens = tokens
        s.turns += 1
        if self.config.prompt_caching.pressure_warnings:
            update_pressure(s, tokens - extra)
        s.history.finish(turn, history, msgs)
        return msgs
