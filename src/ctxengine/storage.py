"""The session-store seam: what the rest of ctxengine needs from a store.

Backends live in :mod:`ctxengine.store` (SQLite by default, PostgreSQL for fleets). Engines
never import them: an engine that keeps originals (``lcm``) receives an object implementing
this protocol through its constructor, and :class:`ctxengine.ContextManager` records each turn
through it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ctxengine.messages import Message

__all__ = ["SessionAppender", "SessionRecorder"]


@runtime_checkable
class SessionRecorder(Protocol):
    """The two writes the per-turn loop makes.

    ``record_messages`` receives the whole current history of a session (on its first turn, on
    a branch, after a compaction, or every turn when the store cannot append); the store keeps
    each message once (content-addressed, parent-linked), so re-sending the history only adds
    what is new. ``record_compaction`` stores a compaction as an event: the engine's
    report, the history before and the list the engine returned; it never edits originals.
    """

    def record_messages(self, session_id: str, messages: Sequence[Message]) -> list[str]:
        """Store ``messages`` as the session's history; return their message ids."""
        ...

    def record_compaction(
        self,
        session_id: str,
        report: Mapping[str, Any],
        before: Sequence[Message],
        after: Sequence[Message],
    ) -> str:
        """Store one compaction event; return its id."""
        ...


@runtime_checkable
class SessionAppender(Protocol):
    """A recorder that can also append after a known message (the per-turn fast path).

    With it, the manager records only each turn's new messages: ``append_messages(session,
    new, after=<id of the last message recorded>)`` hashes and writes the new messages alone
    and returns their ids. Stores from :mod:`ctxengine.store` implement it.
    """

    def append_messages(self, session_id: str, messages: Sequence[Message], *, after: str | None = None) -> list[str]:
        """Store ``messages`` chained after message ``after`` (the session's tip when ``None``),
        make the last one the session's tip; return their ids."""
        ...
