"""The input stage: the caller's messages mapped onto the session's working context
(:mod:`ctxengine.history`), only the new ones validated."""

from __future__ import annotations

from collections.abc import Sequence

from ctxengine.history import TurnInput
from ctxengine.kernel.state import CompactionDue, SessionState
from ctxengine.messages import Message, check

__all__ = ["map_input"]


def map_input(s: SessionState, messages: Sequence[Message], *, strict: bool = True, quiet: bool = False) -> TurnInput:
    """Which messages are new, validated (``strict``; else logged by the caller's engine).
    ``quiet`` (``prepare(may_compact=False)``): :class:`CompactionDue` instead of an engine
    reset. Under the session's lock."""
    if not isinstance(messages, list | tuple):
        check(messages, context="messages passed to prepare")  # raises: not a list
    turn = s.history.begin(messages)
    # the user message the caller rewrites in place each turn (its working set) stays verbatim
    s.reach.live = s.history.live_texts(turn, messages)
    if strict:
        turn.check(context="messages passed to prepare")
    if quiet and turn.reset_engine:
        raise CompactionDue("the history changed where it was compacted (the engine is reset)")
    if turn.reset_engine:
        # the caller's history changed where it was already compacted: the engine's
        # per-session state (a previous summary) belongs to the dropped branch
        s.engine.on_session_reset()
        s.counter.reset()
        s.hygiene_armed = True
    return turn
