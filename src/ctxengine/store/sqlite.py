"""The embedded default store: one SQLite file, WAL mode, FTS5 full-text search.

* The file is created on first use (parent directories too); the default location is
  ``<user data dir>/ctxengine/sessions.db`` (``platformdirs``), overridable by ``store.path``.
* WAL lets readers run while one writer writes, across threads and processes. Every write is
  one ``BEGIN IMMEDIATE`` transaction, so a writer takes the lock before reading what it will
  change (no lost updates between processes); ``busy_timeout`` makes waiting writers queue
  instead of failing.
* ``synchronous=NORMAL``: in WAL mode a process crash (even SIGKILL) never loses a committed
  transaction; only a power cut may lose the last few. ``durable=True`` selects ``FULL`` for
  machines where that matters.
* A turn's append after the message the same store object wrote last is one row of an append
  journal (one small commit), folded into the tables, in commit order, by the next transaction
  of any process before it reads or writes them (see :mod:`ctxengine.store.journal`).
* Each thread gets its own connection (SQLite connections must not be shared across threads
  while in use); a forked child opens fresh ones. ``":memory:"`` gives a private in-memory
  store with one connection guarded by a lock (tests, the ``lcm`` engine without a store).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any, ClassVar

from ctxengine.errors import StoreError
from ctxengine.store.base import SqlStore
from ctxengine.store.journal import AppendJournal
from ctxengine.store.migrations import Backend, current_version
from ctxengine.store.sqlite_index import SqliteIndexes, fts5_query

__all__ = ["SqliteStore", "default_path", "fts5_query"]

log = logging.getLogger(__name__)

FILE_CHECK_SECONDS = 0.5
"""How often (at most) an open store checks that its file is still the one it opened."""

JOURNAL_VERSION = 4
"""The schema version that has the append journal."""



def default_path() -> Path:
    """``<user data dir>/ctxengine/sessions.db`` (e.g. ``~/.local/share/ctxengine/sessions.db``)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("ctxengine")) / "sessions.db"


class SqliteStore(AppendJournal, SqliteIndexes, SqlStore):
    """Session store in one SQLite file (or ``":memory:"``)."""

    backend: ClassVar[Backend] = "sqlite"

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        timeout: float = 30.0,
        durable: bool = False,
        migrate: bool = True,
        target_version: int | None = None,
        journal: bool = True,
    ) -> None:
        """Open (creating if needed) the store at ``path`` (default: :func:`default_path`).

        ``timeout``: seconds a writer waits for the lock before failing (30 s: longer than any
        single write, short enough to surface a stuck process). ``target_version`` stops the
        migrations at that schema version (tests of the migrations). ``journal``: a turn that
        appends after the message this object wrote last for the session is one row of the
        append journal, folded into the tables before anything reads them (``False``: every
        append writes the tables at once; both give the same store).
        """
        super().__init__()
        self.memory = str(path) == ":memory:"
        self.path = ":memory:" if self.memory else str(Path(path) if path is not None else default_path())
        self.timeout = float(timeout)
        self.durable = durable
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._all_conns: list[sqlite3.Connection] = []
        self._shared: sqlite3.Connection | None = None
        self._file_checked = float("inf")
        self._inode: int | None = None
        self._journal_wanted = journal
        self.generation = 0
        """How many times the store's file was found removed or replaced and opened anew."""
        if not self.memory:
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create the store directory for {self.path}: {exc}") from exc
        self._setup(migrate, target_version, journal)

    def _setup(self, migrate: bool, target_version: int | None, journal: bool) -> None:
        self._file_checked = float("inf")  # no check of the file while it is set up
        try:
            self._migrate_file(migrate, target_version, journal)
        finally:
            self._file_checked = time.monotonic()

    def _migrate_file(self, migrate: bool, target_version: int | None, journal: bool) -> None:
        if migrate:
            with self._write() as cur:
                self._migrate(cur, target_version)
                self._journal = journal and current_version(cur, "sqlite", ensure_table=False) >= JOURNAL_VERSION
                if self._journal:
                    self._fold_journal(cur)  # appends a killed process left
                self._index_missing(cur)
        elif journal:
            with self._read() as cur:
                self._journal = current_version(cur, "sqlite", ensure_table=False) >= JOURNAL_VERSION
        self._inode = self._file_inode()

    def _file_inode(self) -> int | None:
        try:
            return os.stat(self.path).st_ino
        except OSError:
            return None

    def _check_file(self) -> None:
        """Open the store anew when its file was removed or replaced under the open connections
        (they would go on writing to a file no one can open again: every later turn lost).
        The new file is created and migrated; what this object remembered of the old one (the
        sessions' keys and chains) is dropped, so a session's next append after a message that
        is not in the new file fails and its next write records it in full (the manager's
        rule after a failed write): nothing the clients resend is lost."""
        inode = self._file_inode()
        if inode == self._inode:
            return
        with self._lock:
            if inode != self._file_inode() or self._closed:
                return
            conns, self._all_conns = self._all_conns, []
            self._local = threading.local()
        for conn in conns:
            with suppress(sqlite3.Error):
                conn.close()
        self._session_pks.clear()
        self._forget_texts()
        with self._chains_lock:
            self._chains.clear()
        self._journaled = False
        self._journal = False  # the new file has no journal table until it is migrated
        self.generation += 1  # the operation that found it fails (its plan named the old file's rows)
        log.warning("session store %s: its file was removed or replaced while open; opened it anew (sessions are recorded in full from their next write)", self.path)
        self._setup(True, None, self._journal_wanted)

    # -- connections ---------------------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            if not self.memory:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
                if mode is None or str(mode[0]).lower() != "wal":
                    raise StoreError(f"{self.path}: cannot switch the store to WAL mode (got {mode})")
            conn.execute(f"PRAGMA synchronous = {'FULL' if self.durable else 'NORMAL'}")
            conn.execute("PRAGMA foreign_keys = OFF")
            # 64 MiB of page cache for the first connection: the hash indexes of a
            # million-message store stay in memory; 8 MiB for each further one (a thread of
            # its own each: a proxy under load opens dozens, whose caches would otherwise
            # grow with the file to 64 MiB each)
            with self._lock:
                first = not self._all_conns
            conn.execute(f"PRAGMA cache_size = {-65536 if first else -8192}")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the session store {self.path}: {exc}") from exc
        with self._lock:
            self._all_conns.append(conn)
        return conn

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError(f"the session store {self.path} is closed")
        if self.memory:
            if self._shared is None:
                self._shared = self._open()
            return self._shared
        if os.getpid() != self._pid:  # forked: never reuse the parent's connections
            self._pid = os.getpid()
            self._local = threading.local()
            self._all_conns = []
        now = time.monotonic()
        if now >= self._file_checked + FILE_CHECK_SECONDS:  # one stat at most so often
            self._file_checked = now
            self._check_file()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._open()
            self._local.conn = conn
        return conn

    def _tx(self, begin: str) -> _Transaction:
        return _Transaction(self, begin)

    def _journal_insert(self, row: Sequence[Any]) -> int:
        # one statement: SQLite runs it as its own transaction (no BEGIN and COMMIT to send)
        if self.memory:
            with self._lock:
                return self._insert_now(row)
        return self._insert_now(row)

    def _insert_now(self, row: Sequence[Any]) -> int:
        generation = self.generation
        conn = self._conn()
        if self.generation != generation:
            raise StoreError(f"session store {self.path}: its file was replaced; the session is recorded in full from its next write")
        try:
            return int(conn.execute(self._JOURNAL_INSERT, tuple(row)).lastrowid or 0)
        except sqlite3.Error as exc:
            raise StoreError(f"session store {self.path}: {exc}") from exc

    def _write(self) -> AbstractContextManager[sqlite3.Cursor]:
        return _Transaction(self, "BEGIN IMMEDIATE")

    def _read(self) -> AbstractContextManager[sqlite3.Cursor]:
        return _Transaction(self, "BEGIN")

    def _sql(self, sql: str) -> str:
        return sql

    def _next_pks(self, cur: Any) -> tuple[int, int] | None:
        # every write holds SQLite's exclusive write lock (BEGIN IMMEDIATE): nobody else can
        # take these keys before the commit
        cur.execute("SELECT (SELECT COALESCE(MAX(pk), 0) + 1 FROM blobs), (SELECT COALESCE(MAX(pk), 0) + 1 FROM messages)")
        blob, message = cur.fetchone()
        return int(blob), int(message)

    # -- full-text search ----------------------------------------------------------------------
    @contextmanager
    def bulk(self) -> Iterator[SqliteStore]:
        """Bulk import: full-text indexing of what this thread writes inside the block is
        deferred to its end and done in one pass (about 15 % less CPU and half the I/O of
        indexing batch by batch). Searches from elsewhere miss those rows until the block
        ends; a process killed inside the block leaves them unindexed until the store is next
        opened, which indexes them."""
        with self._read() as cur:
            start = cur.execute("SELECT COALESCE(MAX(pk), 0) FROM blobs").fetchone()[0]
        self._local.defer_fts = True
        try:
            yield self
        finally:
            self._local.defer_fts = False
            with self._write() as cur:
                # other threads or processes may have indexed their own rows meanwhile
                cur.execute(
                    "INSERT INTO blobs_fts (rowid, text) SELECT pk, text FROM blobs WHERE pk > ?"
                    " AND pk NOT IN (SELECT id FROM blobs_fts_docsize WHERE id > ?)",
                    (start, start),
                )

    # -- maintenance -------------------------------------------------------------------------------
    def integrity_check(self) -> list[str]:
        """``PRAGMA integrity_check`` plus FTS5's own check; ``["ok"]`` when both pass."""
        with self._read() as cur:
            rows = [str(r[0]) for r in cur.execute("PRAGMA integrity_check").fetchall()]
        try:
            with self._write() as cur:
                self._index_missing(cur)
                cur.execute("INSERT INTO blobs_fts (blobs_fts) VALUES ('integrity-check')")
        except StoreError as exc:
            rows.append(f"full-text index: {exc}")
        return rows

    def close(self) -> None:
        if self._journaled and not self._closed:
            # fold what this object journaled (a store opened later, or any read, would too)
            with suppress(StoreError), self._write():
                pass
        with self._lock:
            self._closed = True
            conns, self._all_conns = self._all_conns, []
            self._shared = None
        for conn in conns:
            with suppress(sqlite3.Error):
                conn.close()
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"


class _Transaction:
    """One transaction on the calling thread's connection: ``begin`` on entry, ``COMMIT`` on a
    clean exit, ``ROLLBACK`` on any exception; database errors become :class:`StoreError`.
    (A class rather than a generator: it runs on every recorded turn.)

    With the append journal on, a transaction first folds the journal: a write folds it
    inside itself; a read that finds it not empty folds it in a write of its own first (when
    it cannot, read-only or locked, it reads what is folded)."""

    __slots__ = ("begin", "conn", "cur", "locked", "store")

    def __init__(self, store: SqliteStore, begin: str) -> None:
        self.store = store
        self.begin = begin
        self.locked = False

    def __enter__(self) -> sqlite3.Cursor:
        store = self.store
        if store.memory:  # one shared connection: one transaction at a time
            store._lock.acquire()
            self.locked = True
        try:
            generation = store.generation
            self.conn = conn = store._conn()
            if store.generation != generation and self.begin != "BEGIN":  # a write planned on the old file's rows
                raise StoreError(f"session store {store.path}: its file was replaced; the session is recorded in full from its next write")
            self.cur = cur = conn.cursor()
            try:
                cur.execute(self.begin)
                if store._journal:
                    self._fold(cur)
            except sqlite3.Error as exc:
                _rollback(conn)
                cur.close()
                raise StoreError(f"session store {store.path}: {exc}") from exc
            except BaseException:
                _rollback(conn)
                cur.close()
                raise
        except BaseException:
            self._unlock()
            raise
        return cur

    def _fold(self, cur: sqlite3.Cursor) -> None:
        if self.begin != "BEGIN":
            self.store._fold_journal(cur)
            return
        if cur.execute("SELECT 1 FROM append_journal LIMIT 1").fetchone() is None:
            return
        cur.execute("COMMIT")
        try:
            with _Transaction(self.store, "BEGIN IMMEDIATE"):
                pass  # folds on entry
        except StoreError as exc:
            log.debug("session store %s: reading without folding the append journal: %s", self.store.path, exc)
        cur.execute("BEGIN")

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        conn = self.conn
        try:
            if kind is None:
                try:
                    conn.execute("COMMIT")
                except sqlite3.Error as err:
                    _rollback(conn)
                    raise StoreError(f"session store {self.store.path}: {err}") from err
                return
            _rollback(conn)
            if isinstance(exc, sqlite3.Error):
                raise StoreError(f"session store {self.store.path}: {exc}") from exc
        finally:
            self.cur.close()
            self._unlock()

    def _unlock(self) -> None:
        if self.locked:
            self.locked = False
            self.store._lock.release()


def _rollback(conn: sqlite3.Connection) -> None:
    with suppress(sqlite3.Error):  # no transaction left when the error already ended it
        conn.execute("ROLLBACK")
