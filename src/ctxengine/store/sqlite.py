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
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any, ClassVar, Literal

from ctxengine.errors import StoreError
from ctxengine.store.base import SearchHit, SearchMode, SqlStore
from ctxengine.store.journal import AppendJournal
from ctxengine.store.migrations import Backend, current_version

__all__ = ["SqliteStore", "default_path"]

log = logging.getLogger(__name__)

FILE_CHECK_SECONDS = 0.5
"""How often (at most) an open store checks that its file is still the one it opened."""

JOURNAL_VERSION = 4
"""The schema version that has the append journal."""

_FTS_TOKEN = re.compile(r"\w+")


def default_path() -> Path:
    """``<user data dir>/ctxengine/sessions.db`` (e.g. ``~/.local/share/ctxengine/sessions.db``)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("ctxengine")) / "sessions.db"


_WINDOW = 6


def _rarity(word: str) -> int:
    """A guess at how rare a word is, without reading the index: long words, numbers and
    identifiers (digits, inner capitals) are rare; "the", "in", "for" are everywhere."""
    score = len(word)
    if any(c.isdigit() for c in word):
        score += 6
    if any(c.isupper() for c in word[1:]):
        score += 4
    return score


_IDENT_ROWS = 5_000
"""Identifier rows (newest first) one recall lookup reads at most: a query that names thousands
(``java``) still answers from the newest messages, in bounded time."""


def fts5_query(needle: str) -> str | None:
    """An FTS5 query whose matches include every text containing ``needle`` as a substring.

    The query is a phrase of at most six adjacent words of the needle, the window with the
    rarest-looking words (:func:`_rarity`): one rare word makes the phrase selective, so few
    candidates reach the exact substring check, and a short phrase keeps the index lookups few.
    The first word of the needle may be the tail of a longer word in the text, so it is used
    only when nothing else is left; the last may be the head of one, so it matches as a prefix.
    ``None`` when the needle has no word: the caller scans instead.
    """
    words = _FTS_TOKEN.findall(needle)
    if not words:
        return None
    first_cut = needle[0].isalnum() or needle[0] == "_"
    start = 1 if first_cut and len(words) > 1 else 0
    inner = words[start:]
    size = min(_WINDOW, len(inner))
    best = max(range(len(inner) - size + 1), key=lambda i: (sum(_rarity(w) for w in inner[i : i + size]), -i))
    window = inner[best : best + size]
    prefix = " *" if best + size == len(inner) else ""
    return '"' + " ".join(window) + '"' + prefix


class SqliteStore(AppendJournal, SqlStore):
    """Session store in one SQLite file (or ``":memory:"``)."""

    backend: ClassVar[Backend] = "sqlite"
    _join_in_order: ClassVar[str] = "CROSS JOIN"  # SQLite joins tables in the order written

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
            # 64 MiB of page cache: the hash indexes of a million-message store stay in memory
            conn.execute("PRAGMA cache_size = -65536")
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

    def _index_missing(self, cur: Any) -> None:
        """Index blobs written after the last indexed one (pks grow, so they are a suffix)."""
        if current_version(cur, "sqlite", ensure_table=False) < 2:
            return
        last = cur.execute("SELECT COALESCE(MAX(id), 0) FROM blobs_fts_docsize").fetchone()[0]
        top = cur.execute("SELECT COALESCE(MAX(pk), 0) FROM blobs").fetchone()[0]
        if top > last:
            cur.execute("INSERT INTO blobs_fts (rowid, text) SELECT pk, text FROM blobs WHERE pk > ?", (last,))

    def _index_blobs(self, cur: Any, rows: Sequence[tuple[int, str]]) -> None:
        """Messages are indexed lazily: a write only stores them (indexing a turn's text cost
        more than the rest of recording it), and the rows written since the last search are
        indexed, in one pass, by the next search that needs the index (:meth:`search`), by
        :meth:`integrity_check` and when the store is opened. Unindexed rows are always the
        newest (primary keys grow and every catch-up indexes up to the newest row)."""

    def _index_lag(self, cur: Any) -> bool:
        """Whether messages were written since the full-text index last caught up."""
        last = cur.execute("SELECT COALESCE(MAX(id), 0) FROM blobs_fts_docsize").fetchone()[0]
        top = cur.execute("SELECT COALESCE(MAX(pk), 0) FROM blobs").fetchone()[0]
        return bool(top > last)

    def catch_up_index(self) -> None:
        """Index the messages written since the last catch-up (a no-op when there are none)."""
        with self._read() as cur:
            if current_version(cur, "sqlite", ensure_table=False) < 2 or not self._index_lag(cur):
                return
        with self._write() as cur:
            self._index_missing(cur)

    def search(self, query: str, *, session_id: str | None = None, mode: SearchMode = "text", limit: int = 20, nodes: bool = True) -> list[SearchHit]:
        if session_id is None and mode == "text":
            with suppress(StoreError):  # read-only or busy: the search scans where the index is behind
                self.catch_up_index()
        return super().search(query, session_id=session_id, mode=mode, limit=limit, nodes=nodes)

    def _index_node(self, cur: Any, pk: int, text: str) -> None:
        cur.execute("INSERT INTO nodes_fts (rowid, text) VALUES (?, ?)", (pk, text))

    def _fts_candidates(self, cur: Any, table: Literal["blobs", "nodes"], needle: str, limit: int) -> list[tuple[Any, ...]] | None:
        query = fts5_query(needle)
        if query is None or (table == "blobs" and self._index_lag(cur)):
            return None  # no word to look up, or rows the index does not hold yet: scan
        role = "b.role" if table == "blobs" else "'summary'"
        sql = (
            f"SELECT b.pk, {role}, b.text FROM {table}_fts f JOIN {table} b ON b.pk = f.rowid"
            f" WHERE {table}_fts MATCH ? AND instr(lower(b.text), lower(?)) > 0 ORDER BY f.rowid DESC LIMIT ?"
        )
        try:
            cur.execute(sql, (query, needle, limit))
        except sqlite3.OperationalError:
            return None  # a term FTS5 cannot parse: the caller scans instead
        return [tuple(r) for r in cur.fetchall()]

    # -- recall's identifier index ------------------------------------------------------------------
    def _index_identifiers(self, cur: Any, session_pk: int, blob_keys: Sequence[int]) -> None:
        for chunk in [blob_keys[i : i + 500] for i in range(0, len(blob_keys), 500)]:
            marks = ",".join("?" * len(chunk))
            cur.execute(
                f"INSERT INTO recall_idents_fts (rowid, ident) SELECT pk, ident FROM recall_idents WHERE session_pk = ? AND blob_pk IN ({marks})",
                (session_pk, *chunk),
            )

    def _identifier_blobs(self, cur: Any, session_pk: int, query: str, limit: int) -> list[int] | None:
        if len(query) < 3:
            return None
        phrase = '"' + query.replace('"', '""') + '"'
        try:
            cur.execute(
                # the trigram lookup first, then each row it found by key (CROSS JOIN keeps that
                # order: the planner would otherwise walk every identifier row of the session
                # and test it against the lookup's list, or run MATCH per row)
                "SELECT r.blob_pk FROM (SELECT rowid AS id FROM recall_idents_fts WHERE recall_idents_fts MATCH ?"
                " ORDER BY rowid DESC LIMIT ?) f CROSS JOIN recall_idents r ON r.pk = f.id WHERE r.session_pk = ?"
                " GROUP BY r.blob_pk ORDER BY r.blob_pk DESC LIMIT ?",
                (phrase, _IDENT_ROWS, session_pk, limit),
            )
        except sqlite3.OperationalError:
            return None
        return [int(r[0]) for r in cur.fetchall()]

    def _word_blobs(self, cur: Any, session_pk: int, query: str, limit: int) -> list[int] | None:
        fts = fts5_query(query)
        if fts is None or self._index_lag(cur):
            return None
        try:
            cur.execute(
                "SELECT DISTINCT m.blob_pk FROM messages m JOIN session_messages sm ON sm.message_pk = m.pk AND sm.session_pk = ?"
                " WHERE m.blob_pk IN (SELECT rowid FROM blobs_fts WHERE blobs_fts MATCH ?) ORDER BY m.blob_pk DESC LIMIT ?",
                (session_pk, fts, limit),
            )
        except sqlite3.OperationalError:
            return None
        return [int(r[0]) for r in cur.fetchall()]

    def recall_candidates(self, queries: Sequence[str], *, session_id: str, limit: int = 200) -> list[tuple[str, str, list[str], str]] | None:
        with suppress(StoreError):  # read-only or busy: the words' index may lag, then recall scans
            self.catch_up_index()
        return super().recall_candidates(queries, session_id=session_id, limit=limit)

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
