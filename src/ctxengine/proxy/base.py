"""The proxy's shared parts: the plan of one request (:class:`Plan`), the headers it forwards
and relays, and :class:`ProxyBase`, the state every part of the request path reads (set by
:class:`~ctxengine.proxy.app.Proxy`) with the plain helpers on it.

The request path is layered, one concern per module, each layer using only those below it:
:mod:`~ctxengine.proxy.base` (this), :mod:`~ctxengine.proxy.settling` (after the response:
usage, the deferred write, metrics and the log line), :mod:`~ctxengine.proxy.planning` (the
session's route and the manager's plan), :mod:`~ctxengine.proxy.rounds` (the proxy's own recall
round trips and the retry after a context-length rejection), :mod:`~ctxengine.proxy.relay`
(the upstream call, streamed or not) and :mod:`~ctxengine.proxy.app` (the endpoints).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ctxengine.config import Config, ProxyConfig
from ctxengine.manager import ContextManager
from ctxengine.messages import Message
from ctxengine.models import UnknownModelWarning
from ctxengine.proxy.apis import Api
from ctxengine.proxy.limits import Windows
from ctxengine.proxy.metrics import ProxyMetrics
from ctxengine.proxy.session import (
    SESSION_HEADER,
    SessionRouter,
)
from ctxengine.proxy.state import ProxySession, SessionTable
from ctxengine.proxy.turns import Ticket, TurnLocks, turn_locks
from ctxengine.proxy.upstream import (
    AiohttpUpstream,
    HttpxUpstream,
    RawHeaders,
    Upstream,
    UpstreamResponse,
)
from ctxengine.storage import SessionRecorder

log = logging.getLogger("ctxengine.proxy")

TOKEN_HEADER = "x-ctxengine-token"
TOKENS_SAVED_HEADER = "x-ctxengine-tokens-saved"

# never forwarded in either direction (RFC 9110 §7.6.1 hop-by-hop, plus what the HTTP client and
# the server recompute)
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length"})
_OURS = (SESSION_HEADER, TOKEN_HEADER)
_SESSION_RAW, _SAVED_RAW = SESSION_HEADER.encode(), TOKENS_SAVED_HEADER.encode()
_HOP_RAW = frozenset(h.encode() for h in _HOP)
# a relayed response's headers the serving HTTP server writes itself (relaying them too would
# send them twice)
_SERVER_SET = frozenset({b"date", b"server"})
# request headers not forwarded (lowercased names): a passthrough request's, and a chat request's
_NOT_FORWARDED = _HOP_RAW | {h.encode() for h in _OURS}
_NOT_FORWARDED_CHAT = _NOT_FORWARDED | {b"accept-encoding"}
# a chat response's headers not relayed: also the encoding of a body the client gets decoded,
# and the proxy's own headers (it sets them itself)
_NOT_RELAYED = _HOP_RAW | _SERVER_SET | {b"content-encoding", SESSION_HEADER.encode(), TOKENS_SAVED_HEADER.encode()}
_NOT_RELAYED_PASSTHROUGH = _HOP_RAW | _SERVER_SET


class TooLarge(Exception):
    pass


@dataclass
class Plan:
    """What goes upstream for one request, and what the proxy needs to finish it."""

    api: Api
    session: str
    body: Mapping[str, Any]
    content: bytes
    state: ProxySession | None = None  # the session's proxy state (None: not planned)
    request: Mapping[str, Any] | None = None  # the client's body (``body`` is what goes upstream)
    request_raw: bytes = b""  # and its bytes
    retried: bool = False  # sent again after a context-length rejection (once at most)
    spent: int = 0  # tokens the proxy's own recall round trips added to the context
    gate: anyio.Event | None = None  # the next request waits for recall answered beside the client's calls
    manager: ContextManager | None = None
    engine_tools: frozenset[str] = frozenset()
    tokens_in: int = 0
    tokens_out: int = 0
    compactions: int = 0
    context: list[Message] = field(default_factory=list)
    started: float = 0.0  # perf_counter when planning began (worker thread or event loop)
    finished: float = 0.0  # and when it was done
    planned: str = ""  # where: "inline" (on the event loop, a turn that only appends) or "worker"
    opened: bool = False  # the session was opened in a worker thread for this request (_open)
    deferred: bool = False  # the turn's store write was left for after the response
    settled: bool = False  # the after-response work (usage, deferred write) is scheduled
    usage: dict[str, Any] | None = None  # the last response's usage, for the manager after the response
    # (stage, seconds) of the request's path, observed once the response is out (_settle_later)
    stages: list[tuple[str, float]] = field(default_factory=list)
    added: float | None = None  # the proxy's own time before the upstream call, in seconds
    client: str = ""  # the client's name (its user-agent's first product), for the request log
    outcome: str = ""  # how the request ended (the metrics' outcome) and the status the client got
    status: int = 0
    failed_open: bool = False  # context management failed somewhere and the request went on
    billed: list[int] = field(default_factory=lambda: [0, 0, 0, 0])  # usage reported: prompt, completion, cache read, cache write
    shadow: bool = False  # forwarded unchanged (proxy.shadow): tokens_out is what would have gone
    ticket: Ticket | None = None  # the session's turn across processes, released once the turn is recorded

    @property
    def saved(self) -> int:
        return max(0, self.tokens_in - self.tokens_out)


def is_local(store: SessionRecorder | None) -> bool:
    """Whether ``store`` is none or a SQLite file: one process's (a PostgreSQL store is shared by
    several proxy processes, which must find each turn written before the next one arrives)."""
    if store is None:
        return True
    try:
        from ctxengine.store.sqlite import SqliteStore
    except ImportError:  # pragma: no cover - the store's dependencies are part of the package
        return False
    return isinstance(store, SqliteStore)


def _same(a: list[Message], b: list[Message]) -> bool:
    # list equality compares element by element in C, identical objects without looking inside
    return len(a) == len(b) and a == b


class ProxyBase:
    """What every layer of the request path reads: set by :class:`~ctxengine.proxy.app.Proxy`
    at construction, declared here so that each layer is checked against it."""

    config: Config
    settings: ProxyConfig
    store: SessionRecorder | None
    metrics: ProxyMetrics
    auth_token: str | None
    sessions: SessionTable
    windows: Windows
    router: SessionRouter
    _transport: Any
    _client: Upstream | None
    _managers: dict[tuple[str, str], ContextManager]
    _local_store: bool
    _turns: TurnLocks | None  # the store's turn locks (opened on first use: _turns_opened)
    _turns_opened: bool
    _tasks: set[asyncio.Task[None]]
    _lock: threading.Lock

    @property
    def client(self) -> Upstream:
        """The upstream client (created on first use when the app runs without its lifespan,
        e.g. a bare ASGI call; it must then be created on the serving event loop)."""
        if self._client is None:
            self._client = self._new_client()
        return self._client

    def _new_client(self) -> Upstream:
        timeout = self.settings.timeout
        connect = min(30.0, timeout)
        if self._transport is not None:
            return HttpxUpstream(self._transport, timeout=timeout, connect_timeout=connect)
        return AiohttpUpstream(timeout=timeout, connect_timeout=connect, max_connections=256)

    # -- helpers ----------------------------------------------------------------------------
    def manager(self, api: Api, model: str) -> ContextManager:
        """The manager serving ``model`` on ``api`` (created on first use)."""
        key = (api.name, model)
        with self._lock:
            mgr = self._managers.get(key)
            if mgr is None:
                provider = "anthropic" if api.upstream == "anthropic" else self.config.model.provider
                window = self.windows.window_for(api.name, model)  # warns once for an unknown model
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UnknownModelWarning)
                    mgr = ContextManager(self.config, model=model, provider=provider, store=self.store, context_length=window.tokens)
                mgr.set_context_length(window.tokens, source=window.source)
                mgr.contain_engine_errors = True  # a failed compaction: the window cap holds the window
                self._managers[key] = mgr
            return mgr

    def close(self) -> None:
        """End every manager's sessions (the store stays open: it may be shared)."""
        with self._lock:
            managers = list(self._managers.values())
            self._managers.clear()
        for m in managers:
            with contextlib.suppress(Exception):
                m.close()
        turns, self._turns = self._turns, None
        if turns is not None:
            turns.close()

    def turns(self) -> TurnLocks | None:
        """The store's turn locks (:mod:`ctxengine.proxy.turns`), opened on first use; ``None``
        without a store shared by processes (none, in memory)."""
        if not self._turns_opened:
            with self._lock:
                if not self._turns_opened:
                    self._turns = turn_locks(self.store)
                    self._turns_opened = True
        return self._turns

    def _authorized(self, request: Request) -> bool:
        if not self.auth_token:
            return True
        sent = request.headers.get(TOKEN_HEADER, "")
        return hmac.compare_digest(sent.encode(), self.auth_token.encode())

    def _upstream(self, api: Api, path: str, query: str) -> str:
        if api.upstream == "anthropic":
            base = self.settings.anthropic_base_url.rstrip("/")
            url = base + path if not base.endswith("/v1") else base + path[3:]
        elif api.upstream == "gemini":  # /v1beta/… or /v1/…: a base ending in a version keeps its own
            base = self.settings.gemini_base_url.rstrip("/")
            url = base + path[path.find("/", 1) :] if base.rsplit("/", 1)[-1] in ("v1", "v1beta", "v1alpha") else base + path
        else:
            base = self.settings.openai_base_url.rstrip("/")
            url = base + path[3:] if base.endswith("/v1") else base + path
        return f"{url}?{query}" if query else url

    @staticmethod
    def _request_headers(request: Request, *, passthrough: bool = False) -> dict[str, str]:
        """The client's headers that go upstream (names as sent), from the raw ones: the same
        pairs :class:`~starlette.datastructures.Headers` would decode, without building it."""
        out = {}
        dropped = _NOT_FORWARDED if passthrough else _NOT_FORWARDED_CHAT
        for k, v in request.scope["headers"]:
            if k.lower() not in dropped:
                out[k.decode("latin-1")] = v.decode("latin-1")
        if not passthrough:
            out["accept-encoding"] = "identity"  # the proxy reads the stream it relays
        return out

    @staticmethod
    def _response_headers(resp: UpstreamResponse, *, keep_encoding: bool = False) -> RawHeaders:
        """The upstream response's headers the client gets (as sent, repeated names kept)."""
        dropped = _NOT_RELAYED_PASSTHROUGH if keep_encoding else _NOT_RELAYED
        return [(k, v) for k, v in resp.raw_headers if k.lower() not in dropped]

    async def _read_body(self, request: Request) -> bytes:
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise TooLarge
        chunks = []
        total = 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise TooLarge
            chunks.append(chunk)
        return b"".join(chunks)

    def _error(self, api: Api, status: int, message: str, outcome: str, kind: str | None = None) -> JSONResponse:
        self.metrics.requests.labels(api.name, outcome).inc()
        log.info("request rejected", extra={"fields": {"api": api.name, "status": status, "outcome": outcome, "reason": message}})
        return JSONResponse(api.error(status, message, kind), status_code=status)

    def _fail_open(self, api: Api, plan: Plan, stage: str, exc: BaseException) -> None:
        self.metrics.fail_open.labels(api.name, stage).inc()
        plan.failed_open = True
        log.warning(
            "context management failed; forwarding the request unchanged",
            extra={"fields": {"api": api.name, "session": plan.session, "stage": stage, "error": f"{type(exc).__name__}: {exc}"}},
            exc_info=log.isEnabledFor(logging.DEBUG),
        )

    # -- non-streaming ------------------------------------------------------------------------
    async def _post(self, url: str, headers: dict[str, str], content: bytes) -> tuple[UpstreamResponse, bytes]:
        """One upstream request, its body read whole."""
        resp = await self.client.send("POST", url, headers, content)
        return resp, await resp.read()

    def _relayed(self, resp: UpstreamResponse, content: bytes, extra: RawHeaders, status: int | None = None) -> Response:
        """An upstream response as the client gets it: its body and headers, plus ``extra``."""
        out = Response(content, status_code=resp.status if status is None else status)
        out.raw_headers += self._response_headers(resp) + extra
        return out
