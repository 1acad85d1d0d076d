"""The shared store: PostgreSQL through psycopg 3, full-text search with a GIN tsvector index.

For fleets of agents or proxies on several machines writing one store. The interface and the
behaviour are those of :class:`ctxengine.store.sqlite.SqliteStore` (one test suite runs on
both). Differences: writers of one session are serialised by a row lock (``SELECT … FOR
UPDATE``) instead of a database-wide lock; migrations run under a transaction-scoped advisory
lock so that processes starting together apply each step once; full-text candidates come from
``to_tsvector('simple', text)`` (no stemming, no stop words: identifiers stay as written).

psycopg is an optional dependency (``pip install 'ctxengine[postgres]'``), imported only when a
PostgreSQL store is opened.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any, ClassVar, Literal

from ctxengine.errors import StoreError
from ctxengine.store.base import SqlStore
from ctxengine.store.migrations import Backend

__all__ = ["PostgresStore"]

_PLAIN_WORDS = re.compile(r"[^\W_]+(?:\s+[^\W_]+)*")
_MIGRATION_LOCK = 0x63747865  # "ctxe": the advisory lock id taken while migrating


class PostgresStore(SqlStore):
    """Session store in a PostgreSQL database named by a DSN (``postgresql://…`` or ``key=value``)."""

    backend: ClassVar[Backend] = "postgres"
    _instr: ClassVar[str] = "strpos"

    def __init__(self, dsn: str, *, connect_timeout: int = 10, migrate: bool = True, target_version: int | None = None) -> None:
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise StoreError("the PostgreSQL store needs psycopg: pip install 'ctxengine[postgres]'") from exc
        super().__init__()
        self._psycopg = psycopg
        self.dsn = dsn
        self.connect_timeout = int(connect_timeout)
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._all_conns: list[Any] = []
        if migrate:
            with self._write() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
                self._migrate(cur, target_version)

    def _conn(self) -> Any:
        if self._closed:
            raise StoreError("the PostgreSQL session store is closed")
        if os.getpid() != self._pid:  # forked: never reuse the parent's connections
            self._pid = os.getpid()
            self._local = threading.local()
            self._all_conns = []
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            try:
                conn = self._psycopg.connect(self.dsn, autocommit=True, connect_timeout=self.connect_timeout)
            except self._psycopg.Error as exc:
                raise StoreError(f"cannot connect to the PostgreSQL session store: {exc}") from exc
            self._local.conn = conn
            with self._lock:
                self._all_conns.append(conn)
        return conn

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        conn = self._conn()
        try:
            with conn.transaction(), conn.cursor() as cur:
                yield cur
        except self._psycopg.Error as exc:
            raise StoreError(f"PostgreSQL session store: {exc}") from exc

    @contextmanager
    def _write(self) -> Iterator[Any]:
        with self._tx() as cur:
            yield cur

    @contextmanager
    def _read(self) -> Iterator[Any]:
        with self._tx() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield cur

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s")

    def _lock_session(self, cur: Any, session_pk: int) -> None:
        cur.execute("SELECT pk FROM sessions WHERE pk = %s FOR UPDATE", (session_pk,))

    def _fts_candidates(self, cur: Any, table: Literal["blobs", "nodes"], needle: str, limit: int) -> list[tuple[Any, ...]] | None:
        role = "b.role" if table == "blobs" else "'summary'"
        if not _PLAIN_WORDS.fullmatch(needle):
            # PostgreSQL's parser keeps paths, URLs and hosts as single tokens, so a piece of
            # one cannot be found through the index: scan instead (exact)
            return None
        words = needle.split()
        # the first word may end a longer word of the text and the last may start one
        inner = words[1:-1]
        query = " & ".join([*dict.fromkeys(inner), f"{words[-1]}:*"])
        cur.execute(
            f"SELECT b.pk, {role}, b.text FROM {table} b"
            " WHERE to_tsvector('simple', b.text) @@ to_tsquery('simple', %s) AND strpos(lower(b.text), lower(%s)) > 0"
            " ORDER BY b.pk DESC LIMIT %s",
            (query, needle, limit),
        )
        return [tuple(r) for r in cur.fetchall()]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._all_conns = self._all_conns, []
        for conn in conns:
            with suppress(self._psycopg.Error):
                conn.close()
        self._local = threading.local()

    def __repr__(self) -> str:
        return "PostgresStore(<dsn>)"
