"""The session-store seam: everything the rest of ctxengine needs from a store, in one module.

Backends live in :mod:`ctxengine.store` (SQLite by default, PostgreSQL for fleets; opened by
:func:`ctxengine.store.open_store`, their common interface
:class:`ctxengine.store.SessionStore`). Nothing else names a backend's methods: it goes through
the protocols here. :class:`ctxengine.ContextManager` records each turn through
:class:`SessionRecorder` (and :class:`SessionAppender`, the per-turn fast path);
:class:`ctxengine.recall.Recall` reads originals back through :class:`RecallStore` (and the
indexes of :class:`RecallIndexStore` when a store has them); a node engine (``lcm``), which never
imports the store, receives a :class:`NodeStore` through :class:`ctxengine.engine.Services`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ctxengine.messages import Message

__all__ = ["NodeBatchStore", "NodeSpec", "NodeStage", "NodeStore", "RecallIndexStore", "RecallStore", "RequestRecorder", "SessionAppender", "SessionRecorder"]


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One summary node to store (:meth:`NodeBatchStore.add_nodes`): its content-addressed id,
    depth, text and children ``(kind, id)``, ``kind`` ``message`` or ``node``."""

    id: str
    depth: int
    text: str
    children: Sequence[tuple[str, str]]
    meta: Mapping[str, Any] = field(default_factory=dict)


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
class RequestRecorder(Protocol):
    """A store that keeps the proxy's request log (one row per request: tokens received and
    sent, billed usage, compactions, outcome; a :class:`ctxengine.store.RequestRecord`), which
    the dashboard and ``ctxengine stats`` read. Stores from :mod:`ctxengine.store` implement it."""

    def record_request(self, record: Any) -> None:
        """Add one request to the log."""
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


@runtime_checkable
class RecallIndexStore(Protocol):
    """The indexes recall uses when a store has them (``ctxengine.store`` backends do): the
    whole texts holding a query, the identifier index of removed text, indexed candidates.
    Texts are ``(kind, role, ids, text)``: ``kind`` ``message`` or ``node``, ``ids`` the
    session's message ids carrying the text (or the node id)."""

    def search_texts(self, queries: Sequence[str], *, session_id: str, limit: int = 200, nodes: bool = True) -> list[tuple[str, str, list[str], str]]:
        """The texts of the session's messages (newest first) and nodes holding any query."""
        ...

    def unindexed_texts(self, session_id: str, *, limit: int = 500) -> list[tuple[int, str, str]]:
        """``(blob key, role, text)`` of the session's messages not identifier-indexed yet."""
        ...

    def add_identifiers(self, session_id: str, blob_keys: Sequence[int], rows: Sequence[tuple[int, str, str]]) -> None:
        """Record identifiers ``(blob key, kind, identifier)`` and mark ``blob_keys`` indexed."""
        ...

    def recall_candidates(self, queries: Sequence[str], *, session_id: str, limit: int = 200) -> list[tuple[str, str, list[str], str]] | None:
        """Like :meth:`search_texts`, from the indexes; ``None`` when they cannot answer."""
        ...


@runtime_checkable
class NodeStore(RecallStore, Protocol):
    """What a node engine (``lcm``) needs from a session store: recall's reads
    (:class:`RecallStore`: search, the originals under a node, messages by id), its history
    recorded (as :meth:`SessionRecorder.record_messages`) and summary nodes added."""

    def record_messages(self, session_id: str, messages: Sequence[Message]) -> list[str]: ...

    def add_node(
        self,
        session_id: str,
        node_id: str,
        *,
        depth: int,
        text: str,
        children: Sequence[tuple[str, str]],
        meta: Mapping[str, Any] | None = None,
    ) -> bool: ...


class NodeStage:
    """The nodes one compaction of a session wrote, held for the host to store with the
    compaction's record (:meth:`NodeBatchStore.record_compaction`): one transaction for the
    event, the compacted context and the nodes its markers name, and none of it in the turn
    when the host defers the turn's writes while the provider answers. The host makes one per
    session (``Services.nodes``), empties it before each compaction and takes what the engine
    staged after; an engine given none stores its nodes itself."""

    __slots__ = ("messages", "nodes")

    def __init__(self) -> None:
        self.nodes: list[NodeSpec] = []
        self.messages: list[Message] = []

    def stage(self, nodes: Sequence[NodeSpec], messages: Sequence[Message]) -> None:
        """Hold ``nodes`` over ``messages`` (the engine's compacted context, from the root)."""
        self.nodes.extend(nodes)
        if messages:
            self.messages = list(messages)

    def take(self) -> tuple[list[NodeSpec], list[Message]]:
        """What is staged, emptied."""
        out = (self.nodes, self.messages)
        self.nodes, self.messages = [], []
        return out


@runtime_checkable
class NodeBatchStore(Protocol):
    """A store that writes an engine's compacted context and the nodes over it in one
    transaction, alone or with the compaction's record (``ctxengine.store`` backends do);
    without it an engine records the messages and adds each node on its own."""

    def message_ids(self, messages: Sequence[Message]) -> list[str]:
        """The ids ``messages`` (a history from the root) have or will have in the store,
        computed without writing (content addresses)."""
        ...

    def add_nodes(self, session_id: str, nodes: Sequence[NodeSpec], *, messages: Sequence[Message] = ()) -> list[bool]:
        """Store ``nodes`` (each left unchanged when it exists) after ``messages``, a history
        from the root their message children belong to (stored when missing, the session's
        tip not moved), in one transaction; True for each node written."""
        ...

    def record_compaction(
        self,
        session_id: str,
        report: Mapping[str, Any],
        before: Sequence[Message],
        after: Sequence[Message],
        *,
        nodes: Sequence[NodeSpec] = (),
        node_messages: Sequence[Message] = (),
    ) -> str:
        """:meth:`SessionRecorder.record_compaction`, storing ``nodes`` (over ``node_messages``,
        stored too when they are not ``before``) in the same transaction."""
        ...
