"""The open sessions of a manager: each created on first use with its own engine, token anchor
and lock (calls for one session are serialised, different sessions run in parallel), reset,
resumed from the store's record, and ended (seed 002's lifecycle hooks)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from ctxengine.engines.kit.records import RecallReach
from ctxengine.history import SessionHistory
from ctxengine.kernel.counting import Counting
from ctxengine.kernel.engines import EngineHost
from ctxengine.kernel.recording import Recorder
from ctxengine.kernel.state import SessionState
from ctxengine.messages import Message
from ctxengine.recall import Recall
from ctxengine.storage import NodeStage, RecallStore

log = logging.getLogger("ctxengine.manager")

__all__ = ["SessionTable"]


class SessionTable:
    """``by_id``: the open sessions, guarded by ``lock``; ``default``: the id of a call without one."""

    def __init__(self, host: EngineHost, counting: Counting, recorder: Recorder, *, default: str = "default") -> None:
        self.host = host
        self.counting = counting
        self.recorder = recorder
        self.default = default
        self.by_id: dict[str, SessionState] = {}
        self.lock = threading.Lock()

    def get(self, session_id: str | None) -> SessionState:
        """The session (created and its engine started on first use)."""
        sid = session_id or self.default
        with self.lock:
            s = self.by_id.get(sid)
            if s is None:
                s = self.by_id[sid] = self._new(sid)
        if not s.started:
            with s.lock:
                if not s.started:
                    self.host.on_start(s)
                    s.started = True
        return s

    def _new(self, sid: str) -> SessionState:
        history = SessionHistory()
        reach = RecallReach()
        nodes = NodeStage()
        s = SessionState(sid, self.host.start_engine(sid, history, reach, nodes), self.counting.anchored(history), history=history, reach=reach, nodes=nodes)
        store = self.recorder.store
        if isinstance(store, RecallStore):
            s.recall = Recall(store, sid)
        return s

    def ids(self) -> list[str]:
        with self.lock:
            return sorted(self.by_id)

    def has(self, sid: str) -> bool:
        with self.lock:
            return sid in self.by_id

    @staticmethod
    def reset(s: SessionState) -> None:
        """``/new`` or ``/reset``: the engine clears per-session state; counters start over."""
        with s.lock:
            Recorder.flush(s)
            s.engine.on_session_reset()
            s.counter.reset()
            s.hygiene_armed = True
            s.last_sent = []
            s.last_request = None
            s.last_tokens = 0
            s.pressure_warning = None
            s.lost = False
            s.streak.reset()
            s.history.reset()
            s.tally.reset()

    def end(self, session_id: str | None, messages: Sequence[Message] | None = None) -> None:
        """``on_session_end`` runs and the session's state is dropped."""
        sid = session_id or self.default
        with self.lock:
            s = self.by_id.pop(sid, None)
        if s is None:
            return
        with s.lock:
            Recorder.flush(s)
            if s.started:
                s.engine.on_session_end(sid, list(messages) if messages is not None else list(s.last_sent))
            self._forget(s)

    def _forget(self, s: SessionState) -> None:
        """What the manager's shared memos (the window counter's, the store object's) remember
        of an ended session's messages is dropped with it: memory follows the live sessions."""
        held = [*s.history.raw, *s.history.working, *s.last_sent, *(s.last_request or ())]
        self.counting.window.forget(held)
        forget = getattr(self.recorder.store, "forget_session", None)
        if callable(forget):
            try:
                forget(s.id, held)
            except Exception as exc:  # a memo: never worth failing the session's end
                log.debug("session %s: the store's memos not dropped: %s", s.id, exc)

    def resume(self, session_id: str) -> bool:
        """The session started from its record in the store (``ContextManager.resume_session``)."""
        store = self.recorder.store
        history = getattr(store, "history", None)
        originals = getattr(store, "originals", None)
        with self.lock:
            if session_id in self.by_id or not callable(history) or not callable(originals):
                return False
        try:
            working, raw = list(history(session_id)), list(originals(session_id))
        except Exception:  # no such session (NotFoundError) or an unreadable record
            return False
        if not raw:
            return False
        s = self.get(session_id)
        with s.lock:
            if s.turns or s.history.turns:
                return False
            s.history.resume(raw, working)
            s.last_sent = s.history.working
            s.lost = working != raw
        return True

    def flush(self, session_id: str | None = None) -> None:
        """Write the deferred recordings of ``session_id``, or of every session when ``None``."""
        with self.lock:
            targets = [self.by_id[session_id]] if session_id in self.by_id else [] if session_id is not None else list(self.by_id.values())
        for s in targets:
            with s.lock:
                Recorder.flush(s)
                if s.lost and s.recall is not None:
                    # the session lost text: index the identifiers of what was recorded now,
                    # after the response, rather than in the next ctx_grep (whose first call on a
                    # long session would index thousands of messages)
                    try:
                        s.recall.index_identifiers()
                    except Exception as exc:  # best effort: ctx_grep indexes what is left
                        log.warning("session %s: indexing its identifiers failed: %s: %s", s.id, type(exc).__name__, exc)
