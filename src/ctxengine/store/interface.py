"""The session store's interface: what every backend offers (:class:`SessionStore`).

It implements the seam's protocols (:mod:`ctxengine.storage`: ``SessionRecorder``,
``SessionAppender``, ``RecallStore``, ``NodeStore``); the SQL shared by the backends is
:class:`ctxengine.store.base.SqlStore`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from ctxengine.messages import Message
from ctxengine.storage import NodeSpec
from ctxengine.store.values import (
    CompactionInfo,
    Event,
    NodeInfo,
    RequestRecord,
    SearchHit,
    SearchMode,
    SessionInfo,
    UsageRow,
)

__all__ = ["SessionStore"]


class SessionStore(ABC):
    """What every backend offers; implements every protocol of the store seam, :mod:`ctxengine.storage`.

    Thread-safe: one store object may be shared by every thread of a process, and several
    processes may open the same database.
    """

    backend: ClassVar[str]

    # writes
    @abstractmethod
    def record_messages(self, session_id: str, messages: Sequence[Message], *, meta: Mapping[str, Any] | None = None) -> list[str]:
        """Make ``messages`` the session's history (its tip moves to the last); return their ids.

        Messages already stored are not stored again; the session is created on first use.
        """

    @abstractmethod
    def record_many(self, histories: Iterable[tuple[str, Sequence[Message]]]) -> dict[str, list[str]]:
        """Record the histories of many sessions at once (one transaction); ids by session."""

    @abstractmethod
    def append_messages(self, session_id: str, messages: Sequence[Message], *, after: str | None = None) -> list[str]:
        """Append ``messages`` after the session's current tip, atomically; return their ids.

        ``after`` (a message id, e.g. the last id a previous call returned) chains them after
        that message instead, without reading the tip: the per-turn path of a caller that knows
        what it recorded last, which then hashes and writes only the new messages.
        """

    @abstractmethod
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
        """Store a compaction event (the session's tip moves to ``after``); return its id.

        ``report`` is a :meth:`CompactionReport.to_dict` (``engine``, ``tokens_before``,
        ``tokens_after``, ``replaced`` indices into ``before``) plus an optional ``config``.
        ``nodes``: the engine's records over its compacted context ``node_messages`` (staged in
        a :class:`~ctxengine.storage.NodeStage`), stored in the same transaction.
        """

    @abstractmethod
    def restore(self, session_id: str, at: str) -> list[Message]:
        """Move the session's tip back to the point ``at`` (a new event) and return that history."""

    @abstractmethod
    def add_node(
        self,
        session_id: str,
        node_id: str,
        *,
        depth: int,
        text: str,
        children: Sequence[tuple[str, str]],
        meta: Mapping[str, Any] | None = None,
    ) -> bool:
        """Store a summary node (children: ``("message", id)`` or ``("node", id)``, in order).

        Returns False when a node with this id already exists (it is left unchanged).
        """

    @abstractmethod
    def add_nodes(self, session_id: str, nodes: Sequence[NodeSpec], *, messages: Sequence[Message] = ()) -> list[bool]:
        """Store ``nodes`` in one transaction, after ``messages`` (a history from the root their
        message children belong to: stored when missing, the session's tip not moved); True
        for each node written, False for one that existed."""

    @abstractmethod
    def message_ids(self, messages: Sequence[Message]) -> list[str]:
        """The ids ``messages`` (a history from the root) have or will have here, computed
        without writing (content addresses)."""

    @abstractmethod
    def import_session(self, document: Mapping[str, Any], *, session_id: str | None = None) -> str:
        """Load an :meth:`export_session` document (under ``session_id`` if given); return the id."""

    @abstractmethod
    def record_request(self, record: RequestRecord) -> None:
        """Add one proxied request to the request log (the session is created when new)."""

    # reads
    @abstractmethod
    def requests(self, session_id: str, *, limit: int = 5000) -> list[RequestRecord]:
        """The session's last ``limit`` logged requests, oldest first."""

    @abstractmethod
    def usage(
        self,
        by: Sequence[str] = (),
        *,
        since: float | None = None,
        bucket: float | None = None,
        session_id: str | None = None,
        after: int = 0,
        upto: int | None = None,
    ) -> list[UsageRow]:
        """The request log added up per group: ``by`` names ``model``, ``client``, ``api``,
        ``session``, ``outcome`` or ``bucket`` (``bucket``-second intervals); ``after`` and
        ``upto`` bound the rows' positions (:meth:`request_log_position`)."""

    @abstractmethod
    def request_log_position(self) -> int:
        """The position of the request log's newest row (0: empty)."""

    @abstractmethod
    def get_session(self, session_id: str) -> SessionInfo: ...

    @abstractmethod
    def list_sessions(self, *, limit: int = 100, offset: int = 0) -> list[SessionInfo]:
        """Sessions, most recently updated first."""

    @abstractmethod
    def history(self, session_id: str, at: str = "latest") -> list[Message]:
        """The session's message list at the point ``at`` (read only)."""

    @abstractmethod
    def history_ids(self, session_id: str, at: str = "latest") -> list[str]:
        """The message ids of :meth:`history`."""

    @abstractmethod
    def originals(self, session_id: str) -> list[Message]:
        """The full uncompacted history: every compaction undone, later messages kept."""

    @abstractmethod
    def events(self, session_id: str) -> list[Event]: ...

    @abstractmethod
    def compactions(self, session_id: str) -> list[CompactionInfo]: ...

    @abstractmethod
    def get_compaction(self, compaction_id: str) -> CompactionInfo: ...

    @abstractmethod
    def get_messages(self, ids: Sequence[str]) -> list[Message]:
        """The messages with these ids, in the given order."""

    @abstractmethod
    def search(self, query: str, *, session_id: str | None = None, mode: SearchMode = "text", limit: int = 20, nodes: bool = True) -> list[SearchHit]:
        """Find messages (and summary nodes) whose text contains ``query``.

        ``mode="text"``: case-insensitive substring (full-text index first, a scan where the
        index cannot match, e.g. short CJK words); ``"regex"``: a regular expression run by a
        linear-time engine (RE2 syntax: no backreferences or lookarounds; see
        :mod:`ctxengine.safe_regex`), so no pattern can hang a search.
        ``session_id=None`` searches every session, newest first.
        """

    @abstractmethod
    def get_node(self, node_id: str) -> NodeInfo: ...

    @abstractmethod
    def node_messages(self, node_id: str) -> list[tuple[str, Message]]:
        """The original messages under a node, in order, verbatim: ``(message id, message)``."""

    @abstractmethod
    def export_session(self, session_id: str) -> dict[str, Any]:
        """Everything about a session as one JSON-ready document (see :meth:`import_session`)."""

    @abstractmethod
    def schema_version(self) -> int: ...

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

