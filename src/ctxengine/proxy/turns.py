"""One turn of a session at a time across processes, and the version it leaves (:class:`TurnLocks`).

Several proxy processes may serve one store (``--workers N``, or processes started by hand on
one SQLite file or one PostgreSQL database). The store is the truth; a process's working context
for a session is a cache, valid while nobody else moved the session. So each turn of a session
takes the session's *turn lock* through the store, and with it the session's *version* (a
counter every turn moves by one): when the version found is not the one this process left, another
process served the session meanwhile, and the session is reloaded from the store before the
turn is planned (:meth:`~ctxengine.proxy.planning.Planning._take_turn`). The lock is held until
the turn's record is written (after the response, with SQLite's deferred writes), so the next
turn, whichever process it lands on, finds it.

* **SQLite** (:class:`FileTurns`): POSIX byte-range locks on a file beside the database
  (``<db>-turns``), one 8-byte slot per session (its version, at an offset hashed from the
  session's id, in a sparse file). A lock is one system call, taken on the event loop without
  waiting; the kernel releases a dead process's locks. Two sessions whose ids hash to one slot
  only share a lock and a version: a turn of one reloads the other, which is slower, not wrong.
* **PostgreSQL** (:class:`PgTurns`): the session's row in ``ctxengine_turns``, updated in a
  transaction held for the turn (on a pooled connection of its own) (PostgreSQL's writes are not deferred: the turn is recorded
  while it is planned): a second process's turn of the session waits on the row lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger("ctxengine.proxy")

__all__ = ["FileTurns", "PgTurns", "Ticket", "TurnLocks", "turn_locks"]

SLOTS = 1 << 20
"""Slots of the SQLite lock file (8 bytes each: an 8 MiB sparse file)."""

POLL = 0.002
"""Seconds between two tries of a lock another process holds."""


@dataclass(eq=False, slots=True)
class Ticket:
    """A held turn of one session: the version the session had (``before``; 0: never served)
    and the one this turn leaves (``before + 1``); :meth:`release` once the turn is recorded
    (idempotent)."""

    before: int
    _release: Callable[[], None]
    _done: bool = False

    @property
    def after(self) -> int:
        return self.before + 1

    def release(self) -> None:
        if not self._done:
            self._done = True
            self._release()


class TurnLocks(Protocol):
    def take(self, session: str, *, wait: float) -> Ticket | None:
        """The session's turn, its version moved by one; ``None`` when another process still
        holds it after ``wait`` seconds (0: only when free now)."""
        ...

    def close(self) -> None: ...


def _slot(session: str) -> int:
    return int.from_bytes(hashlib.blake2b(session.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little") % SLOTS


class _LockFile:
    """One lock file, opened once per process: POSIX locks belong to the process, so who holds
    each slot in this process is kept here (the kernel lock taken by the first holder, released
    by the last)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self.mu = threading.Lock()
        self.held: dict[int, list[Any]] = {}  # slot -> [owner, count]
        self.users = 0

    def lock(self, slot: int) -> bool:
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 8, slot * 8)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return False
            raise
        return True


_FILES: dict[str, _LockFile] = {}
_FILES_MU = threading.Lock()


class FileTurns:
    """SQLite's turn locks (see the module docstring). A holder of a slot may take it again
    (this proxy's next turn of a session whose record is pending, another session on the same
    slot); another holder, in this process (a second proxy object on the same file) or in
    another, waits."""

    def __init__(self, db_path: str) -> None:
        self.path = os.path.realpath(db_path) + "-turns"
        with _FILES_MU:
            f = _FILES.get(self.path)
            if f is None:
                f = _FILES[self.path] = _LockFile(self.path)
            f.users += 1
        self._file = f

    def take(self, session: str, *, wait: float) -> Ticket | None:
        slot, f = _slot(session), self._file
        deadline = time.monotonic() + wait
        while True:
            with f.mu:
                h = f.held.get(slot)
                got = h is not None and h[0] is self
                if got:
                    h[1] += 1  # type: ignore[index]
                elif h is None and f.lock(slot):
                    f.held[slot], got = [self, 1], True
                if got:
                    raw = os.pread(f.fd, 8, slot * 8)
                    before = int.from_bytes(raw, "little") if len(raw) == 8 else 0
                    os.pwrite(f.fd, (before + 1).to_bytes(8, "little"), slot * 8)
                    return Ticket(before, lambda: self._release(slot))
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL)

    def _release(self, slot: int) -> None:
        f = self._file
        with f.mu:
            h = f.held.get(slot)
            if h is None or h[0] is not self:
                return
            h[1] -= 1
            if h[1] <= 0:
                del f.held[slot]
                fcntl.lockf(f.fd, fcntl.LOCK_UN, 8, slot * 8)

    def close(self) -> None:
        with _FILES_MU:
            f = self._file
            f.users -= 1
            if f.users <= 0 and _FILES.get(self.path) is f:
                del _FILES[self.path]
                with contextlib.suppress(OSError):
                    os.close(f.fd)


class PgTurns:
    """PostgreSQL's turn locks (see the module docstring): a transaction per held turn, on a
    connection taken from this object's idle ones (as many as turns held at once)."""

    TABLE = "ctxengine_turns"

    def __init__(self, dsn: str) -> None:
        import psycopg

        self._psycopg = psycopg
        self.dsn = dsn
        self._idle: list[Any] = []
        self._mu = threading.Lock()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.TABLE} (session_id TEXT PRIMARY KEY, version BIGINT NOT NULL)")

    def _conn(self) -> Any:
        with self._mu:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
        return self._psycopg.connect(self.dsn, autocommit=False)

    def _done(self, conn: Any, commit: bool) -> None:
        try:
            conn.commit() if commit else conn.rollback()
        except Exception:
            with contextlib.suppress(Exception):
                conn.close()
            return
        with self._mu:
            self._idle.append(conn)

    def take(self, session: str, *, wait: float) -> Ticket | None:
        conn = self._conn()
        ms = max(1, int(wait * 1000))
        try:
            conn.execute(f"SET LOCAL lock_timeout = {ms}")
            row = conn.execute(
                f"INSERT INTO {self.TABLE} (session_id, version) VALUES (%s, 1) "
                f"ON CONFLICT (session_id) DO UPDATE SET version = {self.TABLE}.version + 1 RETURNING version",
                (session,),
            ).fetchone()
        except self._psycopg.errors.LockNotAvailable:
            self._done(conn, False)
            return None
        except Exception:
            self._done(conn, False)
            raise
        return Ticket(int(row[0]) - 1, lambda: self._done(conn, True))

    def close(self) -> None:
        with self._mu:
            idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()


def turn_locks(store: object) -> TurnLocks | None:
    """The turn locks of ``store``: a SQLite file's, a PostgreSQL database's; ``None`` for no
    store or an in-memory one (one process only)."""
    from ctxengine.store.sqlite import SqliteStore

    if isinstance(store, SqliteStore):
        return None if store.memory else FileTurns(store.path)
    dsn = getattr(store, "dsn", None)
    if type(store).__name__ == "PostgresStore" and isinstance(dsn, str):
        return PgTurns(dsn)
    return None
