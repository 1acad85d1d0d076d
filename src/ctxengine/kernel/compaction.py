"""When a turn compacts: gateway session hygiene (seed 000), the engine's trigger through the
engine host, a client's forced compaction, the no-thrash rest after consecutive compactions,
and the quick turn's check that nothing of this would happen (:class:`CompactionDue`)."""

from __future__ import annotations

import logging

from ctxengine.config import Config
from ctxengine.engines.kit.pacing import MAX_CONSECUTIVE
from ctxengine.errors import EngineError
from ctxengine.history import TurnInput
from ctxengine.kernel.cap import CapStage
from ctxengine.kernel.engines import EngineHost
from ctxengine.kernel.recording import Recorder
from ctxengine.kernel.state import CompactionDue, ModelWindow, SessionState
from ctxengine.kernel.tools import ToolDesk, pending_calls
from ctxengine.loop import should_compact
from ctxengine.messages import Message

__all__ = ["HYGIENE_MIN_MESSAGES", "HYGIENE_RATIO", "MAX_CONSECUTIVE_COMPACTIONS", "Compaction"]

log = logging.getLogger("ctxengine.manager")  # the kernel logs under the manager's name

HYGIENE_RATIO = 0.85
"""Gateway hygiene fires at 85 % of the window (seed 000): high enough that it never competes
with the engine's own trigger (50–75 %), low enough to leave room for the next turn."""

HYGIENE_MIN_MESSAGES = 4
"""Hygiene ignores histories shorter than this (seed 000): nothing to compact yet."""

MAX_CONSECUTIVE_COMPACTIONS = MAX_CONSECUTIVE
"""After compactions on this many consecutive turns, neither hygiene nor the engine's trigger
runs on the next turn (the window cap still holds the window): the kit's no-thrash limit
(:data:`ctxengine.engines.kit.pacing.MAX_CONSECUTIVE`), counted by the session's
:class:`~ctxengine.engines.kit.pacing.Streak`."""


class Compaction:
    """The compaction decisions of a turn, over the engine host and the window cap."""

    def __init__(self, config: Config, window: ModelWindow, host: EngineHost, cap: CapStage, tools: ToolDesk, recorder: Recorder) -> None:
        self.config = config
        self.window = window
        self.host = host
        self.cap = cap
        self.tools = tools
        self.recorder = recorder

    @property
    def hygiene_threshold(self) -> int:
        return int(self.window.context_length * HYGIENE_RATIO)

    def hygiene_due(self, s: SessionState, tokens: int, msgs: list[Message]) -> bool:
        """Whether session hygiene compacts ``msgs`` (``tokens``) when compaction may run."""
        return tokens >= self.hygiene_threshold and s.hygiene_armed and len(msgs) >= HYGIENE_MIN_MESSAGES

    def _resting(self, s: SessionState, msgs: list[Message], reserve: int, may_compact: bool) -> bool:
        """Whether compaction rests this turn (after consecutive compactions), unless the window
        cap would cut: a compaction cuts less blindly (a client whose every turn is a large
        share of the window, e.g. aider's pasted files)."""
        resting = s.streak.resting
        if resting and may_compact and self.cap.over(s, msgs, reserve):
            resting = False
            log.info("session %s: %d consecutive compactions, but the window cap would cut: compacting", s.id, s.streak.count)
        if resting:
            log.info("session %s: %d consecutive compactions, compaction rests this turn (the window cap holds the window)", s.id, s.streak.count)
        return resting

    def run(
        self, s: SessionState, msgs: list[Message], tokens: int, extra: int, reserve: int, *, focus_topic: str | None, may_compact: bool, compact: bool
    ) -> tuple[list[Message], int, bool]:
        """Hygiene, then the engine's trigger (or the client's ``compact``): ``(messages, tokens,
        compacted)``. ``tokens`` include ``extra`` tokens of tool definitions (``reserve`` in the
        window cap's count); the engine judges its messages against its room."""
        enabled = self.config.compression.enabled
        compacted = False
        resting = self._resting(s, msgs, reserve, may_compact)
        if tokens < self.hygiene_threshold:
            s.hygiene_armed = True
        elif enabled and not resting and self.hygiene_due(s, tokens, msgs):
            s.hygiene_armed = False
            s.hygiene_fired += 1
            log.info("session hygiene: %s at %d tokens (>= %d), compacting", s.id, tokens, self.hygiene_threshold)
            out = self.host.compress(s, msgs, tokens - extra, focus_topic, trigger="hygiene")
            compacted = out is not msgs
            msgs = out
            tokens = s.counter.count(msgs) + extra
        forced = compact and may_compact and not compacted
        if enabled and may_compact and (forced or (not resting and self.host.should_compact(s, tokens - extra, msgs))):
            # a forced compaction is judged as at the threshold (the seed's manual /compress)
            judged = max(tokens - extra, int(getattr(s.engine, "threshold_tokens", 0) or 0)) if forced else tokens - extra
            out = self.host.compress(s, msgs, judged, focus_topic, trigger="client" if forced else "engine")
            compacted = compacted or out is not msgs
            msgs = out
            tokens = s.counter.count(msgs) + extra
        s.streak.record(compacted)
        return msgs, tokens, compacted

    def check_quiet(self, s: SessionState, turn: TurnInput, defer_record: bool, extra: int = 0, extra_window: int = 0) -> int:
        """:class:`CompactionDue` unless this turn (``prepare(may_compact=False)``) only appends:
        the decisions the turn makes next, asked before anything changes (under the session's
        lock). Returns the tokens of the turn's messages and ``extra`` (its tool definitions:
        the count the turn uses); ``extra_window`` is their size for the window cap."""
        msgs = turn.messages
        if pending_calls(msgs, lambda: self.tools.names(s)):
            raise CompactionDue("tool calls to answer")
        rec = self.recorder
        if rec.store is not None and not (defer_record and rec.appender is not None and s.history.defers(turn)):
            raise CompactionDue("the turn is written to the store now")
        tokens = s.counter.count(msgs) + extra
        if self.config.compression.enabled and not s.streak.resting:
            if self.hygiene_due(s, tokens, msgs):
                raise CompactionDue("session hygiene fires", local=True, tokens=tokens - extra)
            try:
                due = should_compact(s.engine, tokens - extra, msgs)
            except EngineError as exc:
                raise CompactionDue(f"the engine's trigger failed: {exc}") from exc
            if due:
                raise CompactionDue("the engine compacts", local=True, tokens=tokens - extra)
        if self.cap.over(s, msgs, extra_window):
            raise CompactionDue("the window cap cuts", local=True, tokens=tokens - extra)
        return tokens
