"""The recording stage: the session store opened from the config, every original recorded
before any cut, a turn's write deferred while the provider answers and written before anything
reads or writes the session's record, compactions and window cuts recorded as events."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from ctxengine.config import Config
from ctxengine.errors import ConfigError, StoreError
from ctxengine.history import TurnInput, without_markers
from ctxengine.kernel.state import SessionState
from ctxengine.messages import Message
from ctxengine.storage import NodeBatchStore, NodeSpec, SessionAppender, SessionRecorder

__all__ = ["Recorder", "StoreArg", "default_store"]

log = logging.getLogger("ctxengine.manager")  # the kernel logs under the manager's name

StoreArg = SessionRecorder | Literal["default"] | None


def default_store(config: Config) -> SessionRecorder | None:
    """The store the config asks for (SQLite by default), or ``None`` when storage is off.

    ``ctxengine.store`` is imported lazily, so this module never depends on it; its
    ``open_store(config.store)`` returns a :class:`~ctxengine.storage.SessionRecorder`.

    A store that cannot be opened (a directory that cannot be created, a file that is not a
    database, a PostgreSQL server that refuses the connection) is an error here, at
    construction: :class:`~ctxengine.errors.StoreError` naming the backend and the path,
    never a warning followed by a session that is silently not recorded. Set
    ``store.enabled: false`` to run without one.
    """
    if not config.store.enabled:
        return None
    try:
        module = importlib.import_module("ctxengine.store")
    except ImportError as exc:
        raise StoreError(f"the session store is enabled but cannot be loaded ({exc}); set store.enabled: false to run without it") from exc
    factory = getattr(module, "open_store", None)
    if not callable(factory):
        raise StoreError("the session store is enabled but ctxengine.store has no open_store()")
    where = _store_location(config)
    try:
        store = factory(config.store)
    except ConfigError:
        raise
    except StoreError as exc:
        message = str(exc)
        raise StoreError(message if where in message else f"cannot open the session store at {where}: {message}") from exc
    except Exception as exc:
        raise StoreError(f"cannot open the session store at {where}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(store, SessionRecorder):
        raise StoreError(f"the session store at {where} ({type(store).__name__}) cannot record sessions")
    return store


def _store_location(config: Config) -> str:
    """Where the configured store lives, for error messages (never a DSN: it may hold a password)."""
    st = config.store
    if st.backend == "postgres":
        return f"PostgreSQL (DSN from ${st.dsn_env})"
    if st.path:
        return str(st.path)
    try:
        import platformdirs

        return str(Path(platformdirs.user_data_dir("ctxengine")) / "sessions.db")
    except ImportError:  # pragma: no cover - platformdirs is a dependency
        return "the default SQLite path"


class Recorder:
    """Writes a session's record to ``store`` (``None``: nothing is recorded). A failed write is
    counted in the session's ``store_errors`` and logged: the agent keeps going."""

    def __init__(self, store: SessionRecorder | None) -> None:
        self.store = store
        # checked once: a runtime protocol check costs more than recording a turn
        self.appender: SessionAppender | None = store if isinstance(store, SessionAppender) else None

    def record(self, s: SessionState, turn: TurnInput, history: list[Message], *, defer: bool = False) -> Callable[[], list[str] | None]:
        """Record the turn's input (every original, before any cut): only what is new when the
        store's tip is the last working context (:meth:`SessionHistory.record`). Returns what
        gives the store ids of all of ``history`` (``None`` without a store or when recording
        failed); with ``defer``, an appending turn is left pending (:meth:`flush`) and asking
        for its ids records it now."""
        s.defer_writes = defer
        if self.store is None:
            return lambda: None
        if defer:
            job = s.history.record_later(self.store, s.id, turn, history, appender=self.appender)
            if job is not None:
                done: list[list[str] | None] = []

                def once() -> list[str] | None:
                    if not done:
                        try:
                            done.append(job())
                        except Exception as exc:
                            self._failed(s, exc)
                            done.append(None)
                    return done[0]

                s.pending = once
                return once
        try:
            ids = s.history.record(self.store, s.id, turn, history, appender=self.appender)
        except Exception as exc:
            self._failed(s, exc)
            return lambda: None
        return lambda: ids

    def originals(self, session_id: str, messages: list[Message]) -> list[str] | None:
        """Record ``messages`` as ``session_id``'s history outside any turn (a caller cutting a
        request with no session state: ``ContextManager.fit_window``), without their cache
        markers; their store ids, or ``None`` without a store or when the write failed (logged)."""
        if self.store is None:
            return None
        try:
            return list(self.store.record_messages(session_id, [without_markers(m) for m in messages]))
        except Exception as exc:
            log.warning("session store: recording the history of %s failed: %s", session_id, exc)
            return None

    def _failed(self, s: SessionState, exc: Exception) -> None:
        s.history.forget_tip()
        s.store_errors += 1
        log.warning("session store: recording the history of %s failed: %s", s.id, exc)

    @staticmethod
    def flush(s: SessionState) -> list[str] | None:
        """Run the session's deferred recording, if any (under the session's lock)."""
        job, s.pending = s.pending, None
        return job() if job is not None else None

    def compaction(
        self,
        s: SessionState,
        data: dict[str, Any],
        before: list[Message],
        after: list[Message],
        *,
        what: str = "a compaction",
        defer: bool = True,
        nodes: tuple[list[NodeSpec], list[Message]] | None = None,
    ) -> None:
        """Record a compaction event (the session's tip moves to ``after``) with the nodes its
        engine staged (``nodes``: :meth:`NodeStage.take <ctxengine.storage.NodeStage.take>`),
        in one transaction. In a turn whose
        caller defers its store write (``prepare(defer_record=True)``) the event is left
        pending like the turn's own write, after anything already pending: it is written by
        :meth:`flush`, before anything else reads or writes the session's record (``defer=False``:
        written now, after what is pending)."""
        store = self.store
        if store is None:
            return
        before_plain, after_plain = s.history.plain(before), s.history.plain(after)

        staged, over = nodes if nodes is not None else ([], [])

        def write() -> list[str] | None:
            try:
                if staged and isinstance(store, NodeBatchStore):
                    store.record_compaction(s.id, data, before_plain, after_plain, nodes=staged, node_messages=over)
                else:
                    store.record_compaction(s.id, data, before_plain, after_plain)
            except Exception as exc:  # the agent keeps going; status() reports it
                s.store_errors += 1
                log.warning("session store: recording %s of %s failed: %s", what, s.id, exc)
            return None

        if not (defer and s.defer_writes):
            self.flush(s)
            write()
            return
        earlier = s.pending

        def later() -> list[str] | None:
            if earlier is not None:
                earlier()
            return write()

        s.pending = later

    def cut(self, s: SessionState, before: list[Message], after: list[Message], tokens_before: int, tokens_after: int) -> None:
        """Record the window cap's cut like a compaction (the session's tip moves to ``after``),
        at once (what is pending first), so that the store knows the cut messages for what they are: the next turn appends to
        ``after``, and the session's originals (a restart's resume, a router's seed, an export)
        are the messages as sent, never their cut copies."""
        if self.store is None:
            return
        data: dict[str, Any] = {"engine": "window-cap", "trigger": "window", "messages_before": len(before), "messages_after": len(after), "tokens_before": tokens_before, "tokens_after": tokens_after}
        self.compaction(s, data, before, after, what="a window cut", defer=False)
