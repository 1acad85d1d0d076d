"""The session-store seam: what the rest of ctxengine needs from a store.

Backends live in :mod:`ctxengine.store` (SQLite by default, PostgreSQL for fleets). Engines
never import them: an engine that keeps originals (``lcm``) receives an object implementing
these protocols through :class:`ctxengine.engine.Services`, :class:`ctxengine.ContextManager`
records each turn through :class:`SessionRecorder`, and :class:`ctxengine.recall.Recall` reads
originals back through :class:`RecallStore`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ctxengine.messages import Message

__all__ = ["RecallStore", "SessionAppender", "SessionRecorder"]


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
class RecallStore(Protocol):
    """The reads recall needs (:class:`ctxengine.recall.Recall`): search over a session's
    originals and summary nodes, and the originals behind a message or node id.

    ``search`` returns hits with ``kind``, ``id``, ``role``, ``snippet`` (verbatim lines around
    the match, the match whole) and ``to_dict()``; unknown ids raise
    :class:`~ctxengine.errors.NotFoundError`. :class:`ctxengine.store.SessionStore` implements it.
    """

    def search(
        self,
        query: str,
        *,
        session_id: str | None = None,
        mode: Any = "text",
        limit: int = 20,
        nodes: bool = True,
    ) -> Sequence[Any]:
        """Messages and summary nodes whose text contains ``query`` (see the store)."""
        ...

    def get_messages(self, ids: Sequence[str]) -> list[Message]:
        """The messages with these ids, in the given order."""
        ...

    def get_node(self, node_id: str) -> Any:
        """A summary node (``id``, ``depth``, ``text``, ``children``, ``parents``, ``meta``)."""
        ...

    def node_messages(self, node_id: str) -> list[tuple[str, Message]]:
        """The original messages under a node, in order, verbatim: ``(message id, message)``."""
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
