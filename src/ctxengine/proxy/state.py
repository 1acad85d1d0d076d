"""The proxy's per-session state: one :class:`ProxySession` per conversation, found by one key.

Everything the proxy keeps about a conversation between two of its requests lives on the
session object (the lock its planning holds, the incrementally converted history, last
request's body, the engine tools added to its tool list, sticky beta flags, the pending
after-response work, when it was last seen, which model's manager holds its working context);
ending a session is dropping the object. A new per-session field is one attribute here.

The managers' own per-session state (the working context, the engine) is the manager's:
:class:`SessionTable` only says which sessions are idle and which model served them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from ctxengine.proxy.incoming import IncomingHistory
from ctxengine.proxy.pending import PendingRecall
from ctxengine.proxy.rawbody import BodyCache

__all__ = ["ProxySession", "SessionKey", "SessionTable"]

SessionKey = tuple[str, str]
"""``(api name, session id)``: one conversation on one API."""


@dataclass(eq=False, slots=True)
class ProxySession:
    """One conversation's state in this proxy process (see the module docstring)."""

    api: str
    id: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Held while a request of the session is planned (worker thread or event loop)."""
    incoming: IncomingHistory = field(default_factory=IncomingHistory)
    """The history of the last request, converted incrementally (the Anthropic API), and its
    token tallies."""
    converter: Any = None
    """Another API adapter's incremental conversion of the last request (the Responses API's
    :class:`~ctxengine.proxy.responses.ResponsesHistory`), made by the adapter on first use."""
    body: BodyCache = field(default_factory=BodyCache)
    """Last request's body, so the next one is parsed and written from what changed."""
    injected: list[dict[str, Any]] = field(default_factory=list)
    """The engine tools added to the client's tool list, in order (once added they stay: a
    stable tool list keeps the cache prefix after it warm)."""
    betas: list[str] = field(default_factory=list)
    """``anthropic-beta`` flags sent once, kept for every later request."""
    seen: float = 0.0
    """``time.monotonic()`` of the last request."""
    settling: anyio.Event | None = None
    """Set once the previous request's after-response work (usage, store write) is done."""
    model: str | None = None
    """The model whose manager holds the working context (``None``: not opened in this process)."""
    last_out: tuple[int, Any, Mapping[str, Any]] | None = None
    """``(n, m, body)``: the last request's client history held ``n`` messages, the last of them
    ``m``, and ``body`` went upstream for it (what a token count of the session counts)."""
    fresh: float = 0.0
    """Seconds :meth:`~ctxengine.proxy.planning.Planning._open` took to open the session in a
    worker thread, while not planned since (0.0: planned since): the next plan says so (its
    log line's ``opened``, the ``open`` stage)."""
    version: int | None = None
    """The session's version (:mod:`ctxengine.proxy.turns`) this process last left or found when
    it opened the session: another one found at a turn's start means another process served the
    session since, and the working context here is reloaded from the store (``None``: not
    served here yet)."""
    pending_recall: PendingRecall = field(default_factory=PendingRecall)
    """Recall calls the model made beside the client's own calls, answered here, put back into
    every history the client sends from then on (:mod:`ctxengine.proxy.pending`)."""

    @property
    def key(self) -> SessionKey:
        return (self.api, self.id)

    @property
    def opened(self) -> bool:
        """Whether a manager holds the session in this process (else the next plan resumes it)."""
        return self.model is not None


class SessionTable:
    """The proxy's sessions by key, thread-safe; idle ones are swept every so often."""

    def __init__(self, idle_seconds: float) -> None:
        self.idle_seconds = idle_seconds
        self._sessions: dict[SessionKey, ProxySession] = {}
        self._lock = threading.Lock()
        self._last_sweep = time.monotonic()

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[ProxySession]:
        with self._lock:
            return iter(list(self._sessions.values()))

    def get(self, api: str, session: str) -> ProxySession | None:
        return self._sessions.get((api, session))

    def open(self, api: str, session: str, now: float | None = None) -> ProxySession:
        """The session (created on first use), marked seen ``now``."""
        key = (api, session)
        s = self._sessions.get(key)
        if s is None:
            with self._lock:
                s = self._sessions.get(key)
                if s is None:
                    s = self._sessions[key] = ProxySession(api, session)
        s.seen = time.monotonic() if now is None else now
        return s

    def sweep_due(self, now: float, *, claim: bool = False) -> bool:
        """Whether idle sessions are due to be ended; ``claim``: and this caller ends them."""
        due = now - self._last_sweep >= min(60.0, self.idle_seconds / 2)
        if due and claim:
            with self._lock:
                due = now - self._last_sweep >= min(60.0, self.idle_seconds / 2)
                if due:
                    self._last_sweep = now
        return due

    def idle(self, now: float) -> list[ProxySession]:
        with self._lock:
            return [s for s in self._sessions.values() if now - s.seen > self.idle_seconds]

    def drop(self, s: ProxySession, now: float) -> bool:
        """Forget ``s`` unless a request came in meanwhile (call with ``s.lock`` held)."""
        with self._lock:
            if now - s.seen <= self.idle_seconds or self._sessions.get(s.key) is not s:
                return False
            del self._sessions[s.key]
            return True
