"""The SQL core every part of :class:`~ctxengine.store.base.SqlStore` builds on: the backend's
hooks (connections, placeholders, full-text search, key hand-out), small statement helpers,
session keys, and the chain of a tip (the primitive every history read and write uses).

SQL here uses ``?`` placeholders and only syntax both SQLite (≥ 3.35) and PostgreSQL accept.
"""

from __future__ import annotations

import threading
import time
from abc import abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Literal

from ctxengine.errors import InputError, NotFoundError
from ctxengine.messages import Message
from ctxengine.store.ids import Memo
from ctxengine.store.interface import SessionStore
from ctxengine.store.migrations import Backend
from ctxengine.textsafe import dumps

__all__ = ["Chain", "SqlCore", "chunks"]

_IN_CHUNK = 500  # ids per IN (...) list; far below both backends' parameter limits
Chain = list["tuple[int | None, str]"]
"""``(pk, id)`` of each message of a history; ``pk`` is ``None`` for a message whose row is not
written yet (a backend that defers appends, see ``SqlStore._quick_append``): its key is looked
up when needed."""


def chunks(seq: Sequence[Any], n: int = _IN_CHUNK) -> Iterator[Sequence[Any]]:
    """``seq`` in slices of at most ``n`` (one ``IN (...)`` list each)."""
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


class SqlCore(SessionStore):
    """The store over a DB-API database; subclasses provide connections and full-text search."""

    backend: ClassVar[Backend]
    _instr: ClassVar[str] = "instr"

    redact_content: bool = False
    """Store messages with key shapes and registered secrets redacted (``redaction.content``)."""

    def __init__(self) -> None:
        self._closed = False
        self._local = threading.local()
        self._session_pks: dict[str, int] = {}  # committed sessions' keys (the append path skips the lookup)
        self._prepared: Memo = {}  # each message object serialised and hashed once (see ids.prepare)
        self._chains: dict[str, tuple[list[Message], Chain]] = {}  # see ChainWriter._known_chain
        self._chains_lock = threading.Lock()

    # -- backend hooks --------------------------------------------------------------------------
    @abstractmethod
    def _write(self) -> AbstractContextManager[Any]:
        """A cursor inside a write transaction that holds the database's write lock."""

    @abstractmethod
    def _read(self) -> AbstractContextManager[Any]:
        """A cursor inside a read transaction (one consistent snapshot)."""

    @abstractmethod
    def _sql(self, sql: str) -> str:
        """``sql`` with the backend's placeholder style."""

    @abstractmethod
    def _fts_candidates(self, cur: Any, table: Literal["blobs", "nodes"], needle: str, limit: int) -> list[tuple[Any, ...]] | None:
        """Rows ``(pk, role, text)`` (newest first) whose text contains ``needle`` (case-insensitive),
        found through the full-text index; ``None`` when the index cannot express the query."""

    def _index_blobs(self, cur: Any, rows: Sequence[tuple[int, str]]) -> None:
        """Add new blob texts to the full-text index (SQLite; PostgreSQL indexes by itself)."""

    def _index_node(self, cur: Any, pk: int, text: str) -> None:
        """Add a node text to the full-text index (SQLite; PostgreSQL indexes by itself)."""

    def _next_pks(self, cur: Any) -> tuple[int, int] | None:
        """The first free primary keys of ``blobs`` and ``messages`` when the backend can hand
        out keys itself inside a write transaction (SQLite, whose write lock is exclusive);
        ``None`` to let the database assign them (PostgreSQL, where writers run concurrently)."""
        return None

    def _lock_session(self, cur: Any, session_pk: int) -> None:
        """Serialise writers of one session (PostgreSQL row lock; SQLite's write lock is global)."""

    # -- small helpers ----------------------------------------------------------------------------
    def _x(self, cur: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        cur.execute(self._sql(sql), tuple(params))
        return cur

    def _xm(self, cur: Any, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            cur.executemany(self._sql(sql), rows)

    def _one(self, cur: Any, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        row = self._x(cur, sql, params).fetchone()
        return tuple(row) if row is not None else None

    def _all(self, cur: Any, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._x(cur, sql, params).fetchall()]

    def _ids_to_pks(self, cur: Any, table: str, ids: Sequence[str], column: str = "id") -> dict[str, int]:
        out: dict[str, int] = {}
        for chunk in chunks(list(dict.fromkeys(ids))):
            marks = ",".join("?" * len(chunk))
            for key, pk in self._all(cur, f"SELECT {column}, pk FROM {table} WHERE {column} IN ({marks})", chunk):
                out[str(key)] = int(pk)
        return out

    def _session_pk(self, cur: Any, session_id: str) -> int:
        row = self._one(cur, "SELECT pk FROM sessions WHERE id = ?", (session_id,))
        if row is None:
            raise NotFoundError(f"no session {session_id!r} in the store")
        return int(row[0])

    def _ensure_session(self, cur: Any, session_id: str, meta: Mapping[str, Any] | None = None) -> int:
        if not isinstance(session_id, str) or not session_id:
            raise InputError("a session id must be a non-empty string")
        now = time.time()
        self._x(
            cur,
            "INSERT INTO sessions (id, tip_pk, created_at, updated_at, meta) VALUES (?, NULL, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
            (session_id, now, now, dumps(dict(meta or {}))),
        )
        pk = self._session_pk(cur, session_id)
        if meta:
            self._x(cur, "UPDATE sessions SET meta = ? WHERE pk = ?", (dumps(dict(meta)), pk))
        return pk

    # -- the chain of a tip, and points ------------------------------------------------------------
    def _chain(self, cur: Any, tip_pk: int | None) -> list[tuple[int, str, str]]:
        """``(pk, id, body)`` from the root to ``tip_pk``."""
        if tip_pk is None:
            return []
        rows = self._all(
            cur,
            "WITH RECURSIVE chain(pk, parent_pk) AS ("
            " SELECT pk, parent_pk FROM messages WHERE pk = ?"
            " UNION ALL SELECT m.pk, m.parent_pk FROM messages m JOIN chain c ON m.pk = c.parent_pk)"
            " SELECT m.pk, m.id, b.body FROM chain c JOIN messages m ON m.pk = c.pk JOIN blobs b ON b.pk = m.blob_pk"
            " ORDER BY m.position",
            (tip_pk,),
        )
        return [(int(pk), str(mid), str(body)) for pk, mid, body in rows]

    def _resolve(self, cur: Any, session_pk: int, at: str | None) -> int | None:
        """The tip message pk of the point ``at`` in a session."""
        at = (at or "latest").strip()
        if at == "latest":
            row = self._one(cur, "SELECT tip_pk FROM sessions WHERE pk = ?", (session_pk,))
            return None if row is None or row[0] is None else int(row[0])
        kind, _, ref = at.partition(":")
        if kind == "event" and ref.isdigit() and int(ref) >= 1:
            row = self._one(cur, "SELECT tip_pk FROM events WHERE session_pk = ? ORDER BY seq LIMIT 1 OFFSET ?", (session_pk, int(ref) - 1))
            if row is None:
                raise NotFoundError(f"the session has no event {ref}")
            return None if row[0] is None else int(row[0])
        if kind in ("before", "after") and ref:
            column = "before_tip_pk" if kind == "before" else "after_tip_pk"
            row = self._one(cur, f"SELECT {column} FROM compactions WHERE id = ? AND session_pk = ?", (ref, session_pk))
            if row is None:
                raise NotFoundError(f"no compaction {ref!r} in this session")
            return None if row[0] is None else int(row[0])
        if kind == "message" and ref:
            row = self._one(
                cur,
                "SELECT m.pk FROM messages m JOIN session_messages sm ON sm.message_pk = m.pk AND sm.session_pk = ? WHERE m.id = ?",
                (session_pk, ref),
            )
            if row is None:
                raise NotFoundError(f"no message {ref!r} in this session")
            return int(row[0])
        raise InputError(f"unknown point {at!r}; use latest, event:N, before:<compaction id>, after:<compaction id> or message:<id>")
