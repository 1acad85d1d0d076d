"""The proxy application: an ASGI app (Starlette) in front of an OpenAI- and an Anthropic-style
upstream (aiohttp, see :mod:`ctxengine.proxy.upstream`), running a :class:`~ctxengine.ContextManager` per model and session.

Per chat request (``POST /v1/chat/completions``, ``POST /v1/messages``):

1. the body is read (at most ``proxy.max_body_bytes``: 413 beyond) and parsed; a body that is
   not a chat request gets the error the client's SDK expects (400, the API's error shape);
2. the session is named by ``x-ctxengine-session`` or derived (:mod:`ctxengine.proxy.session`);
3. the manager maps the client's whole resent history onto the session's working context
   (``prepare``: what is new is appended, an edited history is a new branch) and compacts when
   due: in a worker thread, or on the event loop for a turn that only appends (see
   :meth:`Proxy._plan_inline`); for Claude models (native Anthropic, or OpenRouter) cache
   breakpoints are placed unless the client placed its own ``cache_control`` markers (then
   they, and their TTLs, are left exactly as sent); when the client sends tools and the
   engine offers recall tools, those are added (and stay added for the rest of the session,
   so the tool list, and the cache prefix after it, stays stable);
4. if nothing changed, the client's bytes go upstream as they came; otherwise the body with
   its messages (and tools) replaced, every other key untouched. What is written costs what
   changed since the session's last turn, not the whole history: cache markers are spliced
   into the client's bytes, and a context that differs from the history (every turn after a
   compaction) is converted to the Anthropic form from the first message that changed on
   (:mod:`ctxengine.proxy.incoming`);
5. the response comes back verbatim (errors and status codes too); a streamed response is
   relayed chunk by chunk as it arrives, and its usage is read from the final events;
6. calls the model makes to the engine's tools are answered by the proxy (another upstream
   round trip, up to ``proxy.max_tool_rounds``); the client sees only its own tools' calls;
7. once the response is out, in a worker thread: its usage goes to the manager and, with a
   local store, the turn is written (:meth:`Proxy._settle_later`); the session's next request
   waits for that.

**Fail open**: any internal error in steps 2–4 or 6 sends the client's original request
unchanged and logs why (``ctxengine_proxy_fail_open_total`` counts them). Every other path
under ``/v1/`` is forwarded unchanged (``/v1/responses``, ``/v1/models``,
``/v1/messages/count_tokens`` …): to the Anthropic upstream when the request carries
``x-api-key`` or ``anthropic-version``, else to the OpenAI upstream.

**Keys** (``Authorization``, ``x-api-key``) are forwarded upstream and never stored or logged;
the session store records messages only, never headers. When a proxy token is set, every
``/v1/`` and ``/metrics`` request must carry it in ``x-ctxengine-token``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import hmac
import logging
import threading
import time
import warnings
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import httpx2 as httpx
import orjson
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ctxengine.config import Config
from ctxengine.engine import normalize_usage
from ctxengine.manager import CompactionDue, ContextManager, default_store
from ctxengine.messages import Message
from ctxengine.models import UnknownModelWarning
from ctxengine.proxy.apis import ANTHROPIC, OPENAI, Api, Marking, ToolCall, has_cache_control
from ctxengine.proxy.limits import Windows, context_limit_from_error, is_context_length_error
from ctxengine.proxy.metrics import CONTENT_TYPE, ProxyMetrics
from ctxengine.proxy.rawbody import BodyCache
from ctxengine.proxy.responses import RESPONSES, compact_input, compact_reply
from ctxengine.proxy.session import (
    SESSION_HEADER,
    SessionIdError,
    SessionKey,
    SessionRouter,
    client_session_id,
    derive_session_id,
    session_for,
    session_from_header,
    session_key,
    system_prompt_digest,
)
from ctxengine.proxy.state import ProxySession, SessionTable
from ctxengine.proxy.streams import EventSplitter, StreamTracker
from ctxengine.proxy.upstream import (
    AiohttpUpstream,
    HttpxUpstream,
    RawHeaders,
    Upstream,
    UpstreamError,
    UpstreamResponse,
)
from ctxengine.proxy.writer import encode, outgoing, tool_name
from ctxengine.storage import SessionRecorder
from ctxengine.tokens import estimate

__all__ = ["TOKENS_SAVED_HEADER", "TOKEN_HEADER", "Proxy", "create_app"]

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


class _TooLarge(Exception):
    pass


@dataclass
class _Plan:
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
    deferred: bool = False  # the turn's store write was left for after the response
    settled: bool = False  # the after-response work (usage, deferred write) is scheduled
    usage: dict[str, Any] | None = None  # the last response's usage, for the manager after the response
    # (stage, seconds) of the request's path, observed once the response is out (_settle_later)
    stages: list[tuple[str, float]] = field(default_factory=list)
    added: float | None = None  # the proxy's own time before the upstream call, in seconds

    @property
    def saved(self) -> int:
        return max(0, self.tokens_in - self.tokens_out)


def _is_local(store: SessionRecorder | None) -> bool:
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


class Proxy:
    """The proxy's state: config, store, managers (one per API and model), HTTP client, metrics.

    ``store="default"`` opens the configured store (SQLite unless configured otherwise);
    upstream requests go out through aiohttp (:mod:`ctxengine.proxy.upstream`), or, when
    ``transport`` is given (tests, an in-process fake upstream), through httpx over it.

    ``freeze_gc`` (what ``ctxengine proxy`` uses; off for a proxy embedded in another program):
    at startup, everything allocated so far (the imported modules, the app, the config: some
    45 000 objects the cyclic collector would otherwise walk) moves to the collector's
    permanent generation (:func:`gc.freeze`). A full collection of that heap took 15–30 ms on
    an idle machine and over 100 ms on a busy one, in the middle of whichever request happened
    to trigger it; afterwards it walks only what requests and sessions keep.
    """

    def __init__(
        self,
        config: Config | None = None,
        *,
        auth_token: str | None = None,
        store: SessionRecorder | Literal["default"] | None = "default",
        transport: httpx.AsyncBaseTransport | None = None,
        freeze_gc: bool = False,
    ) -> None:
        self.config = config or Config()
        self.freeze_gc = freeze_gc
        self._gc_started = 0.0
        self._gc_pauses: collections.deque[tuple[int, float]] = collections.deque(maxlen=10_000)
        self.settings = self.config.proxy
        self.auth_token = auth_token or None
        self.store: SessionRecorder | None = default_store(self.config) if store == "default" else store
        self.metrics = ProxyMetrics()
        self._transport = transport
        self._client: Upstream | None = None
        self._managers: dict[tuple[str, str], ContextManager] = {}
        self.sessions = SessionTable(self.settings.session_idle_seconds)
        self.windows = Windows(self.config)
        self.router = SessionRouter()
        # a local store (SQLite) or none: the turn's write waits until the response is out, and
        # a quick turn is planned on the event loop (a shared store is written before the
        # request goes upstream, so another process serving the session's next turn sees it)
        self._local_store = _is_local(self.store)
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[
                Route("/healthz", self.healthz, methods=["GET"]),
                Route("/metrics", self.metrics_endpoint, methods=["GET"]),
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/messages", self.messages, methods=["POST"]),
                Route("/v1/responses", self.responses, methods=["POST"]),
                Route("/v1/responses/compact", self.responses_compact, methods=["POST"]),
                Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
                Route("/v1/{path:path}", self.forward, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
                Route("/{path:path}", self.not_served, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
            ],
            middleware=[Middleware(_ChatFront, proxy=self)],
            lifespan=self._lifespan,
        )

    # -- lifecycle ----------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._client = self._new_client()
        if self.freeze_gc:
            gc.collect()  # garbage is not frozen: only what is still alive
            gc.freeze()
            gc.callbacks.append(self._gc_timer)
        try:
            yield
        finally:
            if self._gc_timer in gc.callbacks:
                gc.callbacks.remove(self._gc_timer)
            if self._tasks:  # the last responses' usage and store writes
                await asyncio.wait(list(self._tasks), timeout=30)
            client, self._client = self._client, None
            await client.aclose()
            self.close()

    def _new_client(self) -> Upstream:
        timeout = self.settings.timeout
        connect = min(30.0, timeout)
        if self._transport is not None:
            return HttpxUpstream(self._transport, timeout=timeout, connect_timeout=connect)
        return AiohttpUpstream(timeout=timeout, connect_timeout=connect, max_connections=256)

    def _gc_timer(self, phase: str, info: dict[str, int]) -> None:
        """``gc.callbacks`` hook: each collection's pause, queued for ``ctxengine_proxy_gc_pause_seconds``.

        Queued rather than observed here: a collection can start inside the metrics' own
        locked sections (rendering ``/metrics`` allocates), and observing takes those locks."""
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started:
            self._gc_pauses.append((info.get("generation", -1), time.perf_counter() - self._gc_started))
            self._gc_started = 0.0

    def _drain_gc_pauses(self) -> None:
        while self._gc_pauses:
            generation, seconds = self._gc_pauses.popleft()
            self.metrics.gc_pause.labels(str(generation)).observe(seconds)

    @property
    def client(self) -> Upstream:
        """The upstream client (created on first use when the app runs without its lifespan,
        e.g. a bare ASGI call; it must then be created on the serving event loop)."""
        if self._client is None:
            self._client = self._new_client()
        return self._client

    def close(self) -> None:
        """End every manager's sessions (the store stays open: it may be shared)."""
        with self._lock:
            managers = list(self._managers.values())
            self._managers.clear()
        for m in managers:
            with contextlib.suppress(Exception):
                m.close()

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
                self._managers[key] = mgr
            return mgr

    def _authorized(self, request: Request) -> bool:
        if not self.auth_token:
            return True
        sent = request.headers.get(TOKEN_HEADER, "")
        return hmac.compare_digest(sent.encode(), self.auth_token.encode())

    def _upstream(self, api: Api, path: str, query: str) -> str:
        if api.upstream == "anthropic":
            base = self.settings.anthropic_base_url.rstrip("/")
            url = base + path if not base.endswith("/v1") else base + path[3:]
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
            raise _TooLarge
        chunks = []
        total = 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise _TooLarge
            chunks.append(chunk)
        return b"".join(chunks)

    def _error(self, api: Api, status: int, message: str, outcome: str, kind: str | None = None) -> JSONResponse:
        self.metrics.requests.labels(api.name, outcome).inc()
        log.info("request rejected", extra={"fields": {"api": api.name, "status": status, "outcome": outcome, "reason": message}})
        return JSONResponse(api.error(status, message, kind), status_code=status)

    # -- endpoints ----------------------------------------------------------------------------
    async def healthz(self, request: Request) -> Response:
        with self._lock:
            sessions = sum(len(m.sessions) for m in self._managers.values())
        store = type(self.store).__name__ if self.store is not None else None
        return JSONResponse({"status": "ok", "store": store, "sessions": sessions})

    async def metrics_endpoint(self, request: Request) -> Response:
        if not self._authorized(request):
            return JSONResponse({"error": {"message": f"missing or wrong {TOKEN_HEADER}", "type": "authentication_error"}}, status_code=401)
        self._drain_gc_pauses()
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def chat_completions(self, request: Request) -> Response:
        return await self._chat(request, OPENAI)

    async def messages(self, request: Request) -> Response:
        return await self._chat(request, ANTHROPIC)

    async def responses(self, request: Request) -> Response:
        return await self._chat(request, RESPONSES)

    async def not_served(self, request: Request) -> Response:
        """A path outside ``/v1/`` (e.g. Gemini's ``/v1beta/…``): a JSON 404 saying what is served."""
        message = (
            f"ctxengine proxy: {request.method} {request.url.path} is not served; it serves the OpenAI chat-completions "
            "(/v1/chat/completions) and Responses (/v1/responses) APIs and the Anthropic messages API (/v1/messages), "
            "and forwards every other /v1/ path"
        )
        self.metrics.requests.labels("passthrough", "not_found").inc()
        return JSONResponse({"error": {"code": 404, "message": message, "status": "NOT_FOUND", "type": "not_found"}}, status_code=404)

    async def responses_compact(self, request: Request) -> Response:
        """``POST /v1/responses/compact`` (Codex's remote compaction), answered here with any
        upstream: the session's engine compacts the conversation now, and the reply's one
        compaction item carries the result, which later requests expand again
        (:mod:`ctxengine.proxy.responses`). A body whose history is on the server, or a
        failure, goes upstream unchanged."""
        api = RESPONSES
        if not self._authorized(request):
            return self._error(api, 401, f"missing or wrong {TOKEN_HEADER} (this proxy requires a token)", "unauthorized", "authentication_error")
        try:
            raw = await self._read_body(request)
        except _TooLarge:
            return self._error(api, 413, f"request body larger than {self.settings.max_body_bytes} bytes (proxy.max_body_bytes)", "too_large")
        try:
            body = orjson.loads(raw)
            msgs = compact_input(body)
            named = session_from_header(request.headers.get(SESSION_HEADER))
            session = named or session_for(self.router, api.name, request.headers, body, api.system(body), api.history(body))
            await self._settled(api, session)
            reply = await anyio.to_thread.run_sync(self._compact, api, session, body, msgs)
        except Exception as exc:  # forwarded: the upstream may compact it itself, or say why not
            log.info("responses/compact forwarded: %s", f"{type(exc).__name__}: {exc}")
            return await self.forward_body(request, api, raw)
        self.metrics.requests.labels(api.name, "ok").inc()
        return JSONResponse(reply, headers={SESSION_HEADER: session})

    def _compact(self, api: Api, session: str, body: Mapping[str, Any], msgs: list[Message]) -> dict[str, Any]:
        """The reply to a compaction request (worker thread): the session's context compacted now."""
        s = self.sessions.open(api.name, session)
        with s.lock:
            mgr = self._open_manager(api, s, str(body["model"]))
            before = mgr.counters(session)["compactions"]
            out = mgr.prepare(msgs, session_id=session, compact=True)
            tokens = mgr.counters(session)["last_tokens"]
            self.metrics.child(self.metrics.compactions, api.name).inc(mgr.counters(session)["compactions"] - before)
        return compact_reply(body, out, {"input_tokens": tokens, "output_tokens": 0})

    async def forward_body(self, request: Request, api: Api, raw: bytes) -> Response:
        """``request`` (its body already read: ``raw``) forwarded unchanged to ``api``'s upstream."""
        url = self._upstream(api, request.url.path, request.url.query)
        try:
            resp = await self.client.send(request.method, url, self._request_headers(request, passthrough=True), raw or None, decode=False)
        except UpstreamError as exc:
            return self._error(api, 502, f"upstream unreachable: {exc}", "upstream_unreachable", api.unreachable_kind)
        self.metrics.requests.labels("passthrough", "ok" if resp.status < 400 else "upstream_error").inc()
        out = StreamingResponse(resp.stream(), status_code=resp.status, background=BackgroundTask(resp.aclose))
        out.raw_headers.extend(self._response_headers(resp, keep_encoding=True))
        return out

    async def count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``: the count of what the proxy would send. A body
        that continues a session's last request is counted with that request's working context
        (as it went upstream) plus the messages new since; any other body goes as it came."""
        api = ANTHROPIC
        if not self._authorized(request):
            return self._error(api, 401, f"missing or wrong {TOKEN_HEADER} (this proxy requires a token)", "unauthorized", "authentication_error")
        try:
            raw = await self._read_body(request)
        except _TooLarge:
            return self._error(api, 413, f"request body larger than {self.settings.max_body_bytes} bytes", "too_large", "request_too_large")
        content = raw
        try:
            body = orjson.loads(raw)
            if api.problem(body) is None:
                named = session_from_header(request.headers.get(SESSION_HEADER))
                key = named or client_session_id(api.name, request.headers, body) or derive_session_id(api.name, request.headers, api.system(body), api.history(body))
                # the key's conversations (the router may have told several apart): the one this body continues
                for s in self.sessions:
                    if s.api == api.name and (s.id == key or (not named and s.id.startswith(key + "."))):
                        counted = _count_body(s, body)
                        if counted is not None:
                            content = encode(counted)
                            break
        except (orjson.JSONDecodeError, SessionIdError):
            pass  # the upstream answers a body it cannot count
        url = self._upstream(api, request.scope["path"], request.scope.get("query_string", b"").decode())
        try:
            resp = await self.client.send("POST", url, self._request_headers(request), content)
            data = await resp.read()
        except UpstreamError as exc:
            return self._error(api, 502, f"upstream unreachable: {exc}", "upstream_unreachable", api.unreachable_kind)
        self.metrics.requests.labels("passthrough", "ok" if resp.status < 400 else "upstream_error").inc()
        return self._relayed(resp, data, [])

    async def forward(self, request: Request) -> Response:
        """Any other ``/v1/`` path, unchanged both ways."""
        anthropic = "x-api-key" in request.headers or "anthropic-version" in request.headers
        api = ANTHROPIC if anthropic else OPENAI
        if not self._authorized(request):
            return self._error(api, 401, f"missing or wrong {TOKEN_HEADER} (this proxy requires a token)", "unauthorized", "authentication_error")
        if request.headers.get("upgrade", "").lower() == "websocket":
            # Codex tries the Responses API over a WebSocket first; a clear refusal sends it to
            # HTTP with server-sent events at once
            return self._error(api, 426, "ctxengine proxy serves the Responses API over HTTP (server-sent events), not WebSocket", "websocket_refused")
        try:
            raw = await self._read_body(request)
        except _TooLarge:
            return self._error(api, 413, f"request body larger than {self.settings.max_body_bytes} bytes", "too_large", "request_too_large")
        return await self.forward_body(request, api, raw)

    async def _chat(self, request: Request, api: Api) -> Response:
        t0 = time.perf_counter()
        if not self._authorized(request):
            return self._error(api, 401, f"missing or wrong {TOKEN_HEADER} (this proxy requires a token)", "unauthorized", "authentication_error")
        try:
            raw = await self._read_body(request)
        except _TooLarge:
            return self._error(api, 413, f"request body larger than {self.settings.max_body_bytes} bytes (proxy.max_body_bytes)", "too_large")
        t_read = time.perf_counter()
        try:
            named = session_from_header(request.headers.get(SESSION_HEADER))
            bad_session = None
        except SessionIdError as exc:
            named, bad_session = None, str(exc)
        try:
            # a named session's body is parsed incrementally: only what is new since last turn
            body = self._body_cache(api, named).parse(raw) if named else orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return self._error(api, 400, f"the request body is not valid JSON: {exc}", "bad_request")
        t_parse = time.perf_counter()
        problem = api.problem(body)
        if problem:
            return self._error(api, 400, problem, "bad_request")
        if bad_session is not None:
            return self._error(api, 400, bad_session, "bad_request")
        headers = self._request_headers(request)
        plan = _Plan(api, named or "", body, raw)
        passthrough = api.passthrough_reason(body)
        try:
            if passthrough is not None:
                log.debug("request forwarded unchanged: %s", passthrough)
                self.metrics.child(self.metrics.plans, api.name, "passthrough").inc()
            else:
                if not named:  # the client's own id, or a derived one: routed by the history
                    plan.session = await self._route(api, request, body)
                await self._settled(api, plan.session)
                t_queue = time.perf_counter()
                quick = self._plan_inline(api, plan.session, body, raw)
                if isinstance(quick, _Plan):
                    plan = quick
                    plan.stages.append(("plan_inline", plan.finished - plan.started))
                else:
                    plan = await anyio.to_thread.run_sync(self._plan, api, plan.session, body, raw)
                    plan.planned = f"worker: {quick}"
                    t_back = time.perf_counter()
                    plan.stages += [("plan_queue", plan.started - t_queue), ("plan", plan.finished - plan.started), ("plan_return", t_back - plan.finished)]
        except Exception as exc:  # fail open: the client's request goes upstream unchanged
            self._fail_open(api, plan, "prepare", exc)
            plan = _Plan(api, plan.session, body, raw)
        # the metrics are updated once the response is out (_settle_later), off this path
        plan.stages += [("read", t_read - t0), ("parse", t_parse - t_read)]
        plan.added = time.perf_counter() - t0
        if api.upstream == "anthropic":
            self._sticky_betas(plan.state, headers)
        # the route's own path; the query as Starlette's URL gives it (without building one)
        url = self._upstream(api, request.scope["path"], request.scope.get("query_string", b"").decode())
        extra = [(_SESSION_RAW, plan.session.encode("latin-1")), (_SAVED_RAW, str(plan.saved).encode())]
        try:
            if body.get("stream") is True:
                return await self._stream(plan, url, headers, extra)
            return await self._complete(plan, url, headers, extra, raw)
        except UpstreamError as exc:
            return self._after(self._error(api, 502, f"upstream unreachable: {exc}", "upstream_unreachable", api.unreachable_kind), plan)
        except BaseException:
            self._settle_later(plan)  # the deferred write still runs
            raise

    async def _route(self, api: Api, request: Request, body: Mapping[str, Any]) -> str:
        """The session of a request that names none (:func:`session_key`, then the router); a
        key's first request since this process started seeds the router with the key's stored
        conversation first, so that after a restart a request resumes the conversation it
        continues and no other one."""
        history = api.history(body)
        k = session_key(api.name, request.headers, body, api.system(body), history)
        if not k.routed:
            return k.key
        if self.store is not None and not self.router.knows(k.key):
            await anyio.to_thread.run_sync(self._seed, api, k)
        return self.router.route(k.key, history, branches=k.branches, prompt=k.prompt)

    def _seed(self, api: Api, k: SessionKey) -> None:
        """Give the router the stored conversation named by ``k`` (worker thread; best effort)."""
        originals = getattr(self.store, "originals", None)
        try:
            stored = list(originals(k.key)) if callable(originals) else []
            if stored:
                system, history = api.as_history(stored)
                self.router.seed(k.key, k.key, history, prompt=system_prompt_digest(system, history) if k.branches else None)
        except Exception as exc:  # no such session, an unreadable record: routed without it
            log.debug("router not seeded for %s: %s", k.key, exc)

    def _body_cache(self, api: Api, session: str) -> BodyCache:
        """The session's last body (the session is opened here when new)."""
        return self.sessions.open(api.name, session).body

    def _sticky_betas(self, s: ProxySession | None, headers: dict[str, str]) -> None:
        """Keep a session's ``anthropic-beta`` flags once sent: a turn that drops one would
        change how the request is processed and miss the cache built with it."""
        if s is None:
            return
        key = next((k for k in headers if k.lower() == "anthropic-beta"), None)
        if key is None and not s.betas:
            return  # the usual request: no flags sent, none kept
        key = key or "anthropic-beta"
        sent = [b.strip() for b in headers.get(key, "").split(",") if b.strip()]
        s.betas.extend(b for b in sent if b not in s.betas)  # on the event loop: no other writer
        if s.betas:
            headers[key] = ",".join(s.betas)

    def _fail_open(self, api: Api, plan: _Plan, stage: str, exc: BaseException) -> None:
        self.metrics.fail_open.labels(api.name, stage).inc()
        log.warning(
            "context management failed; forwarding the request unchanged",
            extra={"fields": {"api": api.name, "session": plan.session, "stage": stage, "error": f"{type(exc).__name__}: {exc}"}},
            exc_info=log.isEnabledFor(logging.DEBUG),
        )

    # -- the manager's part (worker thread, or the event loop when quick) -----------------
    def _plan(self, api: Api, session: str, body: Mapping[str, Any], raw: bytes) -> _Plan:
        started = time.perf_counter()
        now = time.monotonic()
        s = self.sessions.open(api.name, session, now)
        if self.sessions.sweep_due(now, claim=True):
            self.end_idle_sessions(now)
        with s.lock:
            plan = self._plan_locked(api, s, body, raw)
        plan.started, plan.finished, plan.planned = started, time.perf_counter(), "worker"
        self.metrics.child(self.metrics.plans, api.name, "worker").inc()
        return plan

    def _plan_inline(self, api: Api, session: str, body: Mapping[str, Any], raw: bytes) -> _Plan | str:
        """The plan, made on the event loop when that is quick and cannot block it; else why it
        must go to a worker thread (:meth:`_plan`; the request's log line says it).

        Quick means: a local store (or none); the session open here on the same model (a
        first request resumes the session from the store); no idle sweep due; no other
        thread planning the session or holding its lock; and a turn that only appends
        (``prepare(may_compact=False)``: no compaction, which may call a summarizer for
        seconds, no window cut, no store write now). A worker thread costs 0.2-0.8 ms of
        hand-over each way; the quick turn is a fraction of a millisecond."""
        if not self._local_store:
            return "a shared store"
        now = time.monotonic()
        s = self.sessions.get(api.name, session)
        if s is None or s.model != body["model"] or self.sessions.sweep_due(now):
            return "a session to open" if s is None or s.model != body["model"] else "an idle sweep"
        s.seen = now
        if not s.lock.acquire(blocking=False):
            return "the session is busy"
        try:
            started = time.perf_counter()
            try:
                plan = self._plan_locked(api, s, body, raw, quick=True)
            except CompactionDue as exc:
                return exc.reason
        finally:
            s.lock.release()
        plan.started, plan.finished, plan.planned = started, time.perf_counter(), "inline"
        self.metrics.child(self.metrics.plans, api.name, "inline").inc()
        return plan

    def end_idle_sessions(self, now: float | None = None) -> int:
        """End the sessions idle longer than ``proxy.session_idle_seconds`` (``on_session_end``,
        their in-memory state dropped; the store keeps their record, and a returning client
        resumes from it). Runs on its own every so often; returns how many were ended."""
        now = time.monotonic() if now is None else now
        ended = 0
        for s in self.sessions.idle(now):
            with s.lock:
                if not self.sessions.drop(s, now):  # a request came in meanwhile
                    continue
                if s.model is not None:
                    mgr = self._managers.get((s.api, s.model))
                    if mgr is not None:
                        try:
                            mgr.end_session(s.id)
                        except Exception as exc:  # an engine's on_session_end must not stop the sweep
                            log.warning("ending an idle session failed", extra={"fields": {"session": s.id, "error": f"{type(exc).__name__}: {exc}"}})
            ended += 1
        if ended:
            self.metrics.idle_ended.inc(ended)
            log.info("idle sessions ended", extra={"fields": {"ended": ended, "idle_seconds": self.sessions.idle_seconds}})
        return ended

    def _open_manager(self, api: Api, s: ProxySession, model: str) -> ContextManager:
        """The manager of ``model`` holding the session (under ``s.lock``): a session new in
        this process resumes from the store; a session whose client switched models moves to
        the new model's manager the same way (its working context as recorded, not the full
        history compacted again)."""
        mgr = self.manager(api, model)
        if s.model == model:
            return mgr
        if s.model is not None:
            old = self._managers.get((api.name, s.model))
            if old is not None:
                old.end_session(s.id)  # writes what is pending first
        mgr.resume_session(s.id)
        s.model = model
        return mgr

    def _plan_locked(self, api: Api, s: ProxySession, body: Mapping[str, Any], raw: bytes, *, quick: bool = False) -> _Plan:
        """The plan of one request, under the session's lock. ``quick``: only a turn that
        appends, else :class:`CompactionDue` before anything changed (:meth:`_plan_inline`)."""
        session = s.id
        mgr = self._open_manager(api, s, str(body["model"]))
        msgs, conv = api.read(body, s)
        recalled = s.pending_recall.apply(msgs) if s.pending_recall else None
        if recalled is not None:  # the recall turns the client never sends back
            msgs, conv = recalled, None
        before = 0 if quick else mgr.counters(session)["compactions"]  # a quick turn never compacts
        tools = body.get("tools")  # the window counts the tool definitions as the provider does
        if not isinstance(tools, list):
            tools = None
        # the recall tools reach the model only beside the client's own tools (_engine_tools):
        # otherwise no marker or summary may point to them
        reach = None if self.settings.recall_tools and tools else False
        out = mgr.prepare(msgs, tools, session_id=session, defer_record=self._local_store, may_compact=not quick, recall=reach)
        after_status = mgr.counters(session)
        plan = _Plan(api, session, body, raw, state=s, request=body, request_raw=raw, manager=mgr, context=out, deferred=self._local_store and mgr.store is not None)
        plan.compactions = 0 if quick else after_status["compactions"] - before
        changed = recalled is not None or not _same(out, msgs) or api.expands(raw)
        incoming = s.incoming
        if changed:  # after a compaction, every turn: each message estimated once
            plan.tokens_in, plan.tokens_out = incoming.tokens_in.count(msgs), incoming.tokens_out.count(out)
        else:
            plan.tokens_in = plan.tokens_out = after_status["last_tokens"]
        indices: list[int] = []
        # the byte check is quick (only the bytes new since last turn, when the cache parsed
        # this body); only a body that names the key is walked
        if mgr.caching.enabled and not (s.body.contains(raw, b'"cache_control"') and has_cache_control(body)):
            indices = mgr.breakpoints(out, session_id=session)
        marking = Marking(indices, mgr.caching.cache_ttl, mgr.caching.native_anthropic)
        sent = outgoing(api, s, body, raw, conv, out, changed, marking, self._engine_tools(api, mgr, s, body))
        plan.body, plan.content, plan.engine_tools = sent.body, sent.content, sent.engine_tools
        client = api.history(body)
        s.last_out = (len(client), client[-1] if client else None, sent.body)
        return plan

    def _engine_tools(self, api: Api, mgr: ContextManager, s: ProxySession, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The engine's tools to add: only when enabled and the client sends tools of its own;
        once added for a session they stay (a stable tool list keeps the cache warm)."""
        client_tools = body.get("tools")
        if not self.settings.recall_tools or not isinstance(client_tools, list) or not client_tools:
            return []
        offered = mgr.tools([], session_id=s.id)
        sticky = s.injected  # under the session's lock
        known = {tool_name(t) for t in sticky}
        for t in offered:
            name = tool_name(t)
            if name not in known:
                sticky.append(dict(t))
                known.add(name)
        taken = api.tool_names(body)
        return [t for t in sticky if tool_name(t) not in taken]

    def _answers(self, plan: _Plan, calls: list[ToolCall], assistant: Mapping[str, Any] | None) -> list[tuple[ToolCall, str]]:
        """The answers to the model's calls to the proxy's tools (worker thread), sized to the
        room the window leaves: the follow-up request is the context, the proxy's earlier
        round trips, ``assistant`` (the reply that made the calls) and these answers, and each
        call gets an equal share of what is left."""
        assert plan.manager is not None
        made = estimate(orjson.dumps(assistant).decode()) if assistant else 0
        try:
            room = plan.manager.room(plan.context, None, session_id=plan.session) - plan.spent - made
        except Exception as exc:  # sizing must not cost the answer
            log.debug("room unknown, recall answers unbounded: %s", exc)
            room = None
        share = max(64, room // max(1, len(calls))) if room is not None else None
        out = [(c, self._run_tool(plan, c, share)) for c in calls]
        plan.spent += made + sum(estimate(r) for _, r in out)
        return out

    def _run_tool(self, plan: _Plan, call: ToolCall, max_tokens: int | None = None) -> str:
        """Answer one call to a tool the proxy added, through the manager (the engine's own
        tools and the store-backed recall tools, ``ctx_grep`` …, with the dispatch ``prepare``
        uses), in at most ``max_tokens``."""
        assert plan.manager is not None
        try:
            return plan.manager.handle_tool_call(call.name, call.arguments, session_id=plan.session, messages=plan.context, max_tokens=max_tokens)
        except Exception as exc:  # the model sees the failure, the client never does
            log.warning("engine tool failed", extra={"fields": {"session": plan.session, "tool": call.name, "error": f"{type(exc).__name__}: {exc}"}})
            return orjson.dumps({"error": f"{call.name} failed: {type(exc).__name__}: {exc}"}).decode()

    async def _shrink(self, plan: _Plan, status: int, content: bytes) -> bool:
        """A rejection of ``plan``'s request as longer than the model's window: learn the window
        it names (remembered per model; one that names none: 80 % of the window assumed), plan
        the client's request again for it, once. True when the plan was made again (send it);
        False for any other response, a second rejection, or a request the proxy did not plan."""
        if plan.retried or plan.manager is None or plan.state is None or plan.request is None:
            return False
        named = context_limit_from_error(status, content)
        if named is None and not is_context_length_error(status, content):
            return False
        mgr, api = plan.manager, plan.api
        model = str(plan.request["model"])
        before = mgr.context_length
        window = self.windows.learn(api.name, model, named if named is not None else max(1024, int(before * 0.8)))
        if window.tokens >= before and named is not None and named >= before:
            # the window was right: the provider counts more than our estimate; leave a margin
            window = self.windows.learn(api.name, model, max(1024, int(before * 0.9)))
        log.warning(
            "the upstream rejected a request as over the model's window; compacting to it and sending again",
            extra={"fields": {"api": api.name, "session": plan.session, "model": model, "window": window.tokens, "was": before}},
        )
        await anyio.to_thread.run_sync(lambda: mgr.set_context_length(window.tokens, source=window.source))
        try:
            again = await anyio.to_thread.run_sync(self._plan, api, plan.session, plan.request, plan.request_raw)
        except Exception as exc:
            self._fail_open(api, plan, "retry", exc)
            return False
        plan.retried = True
        plan.body, plan.content, plan.context, plan.engine_tools = again.body, again.content, again.context, again.engine_tools
        plan.tokens_out, plan.compactions = again.tokens_out, plan.compactions + again.compactions
        self.metrics.child(self.metrics.context_retries, api.name).inc()
        return True

    async def _answer_beside(self, plan: _Plan, calls: list[ToolCall]) -> None:
        """Recall calls made beside the client's own calls in one reply: answered now, and put
        back into the client's next requests (:mod:`ctxengine.proxy.pending`); the client gets
        its own calls only."""
        ours = [c for c in calls if c.name in plan.engine_tools]
        anchor = next((c.id for c in calls if c.name not in plan.engine_tools), None)
        if plan.state is None or not ours or anchor is None:
            return
        # the client has its answer already: its next request must wait for these answers
        # (they go into it), until _settle_later hands over to its own work
        gate = plan.gate = plan.gate or anyio.Event()
        plan.state.settling = gate
        answers = await anyio.to_thread.run_sync(self._answers, plan, ours, None)
        answered = [(c.id, c.name, c.arguments, r) for c, r in answers]
        plan.state.pending_recall.add(anchor, answered)
        self.metrics.tool_rounds.labels(plan.api.name).inc()

    def _usage_metrics(self, plan: _Plan, usage: Mapping[str, Any] | None) -> bool:
        """Count a response's usage in the metrics; True when the manager should see it too."""
        if plan.manager is None or not usage:
            return False
        api = plan.api.name
        u = normalize_usage(usage)
        self.metrics.child(self.metrics.prompt_tokens, api).inc(u.prompt_tokens)
        self.metrics.child(self.metrics.completion_tokens, api).inc(u.completion_tokens)
        self.metrics.child(self.metrics.cache_read, api).inc(u.cache_read_tokens)
        self.metrics.child(self.metrics.cache_write, api).inc(u.cache_write_tokens)
        return True

    async def _usage(self, plan: _Plan, usage: Mapping[str, Any] | None) -> None:
        """The usage of a response feeds the session's manager (in a worker thread: it takes the
        session's lock, which a compaction may hold)."""
        if not self._usage_metrics(plan, usage):
            return
        await self._usage_to_manager(plan, dict(usage or {}))

    def _settle_later(self, plan: _Plan, usage: Mapping[str, Any] | None = None) -> None:
        """What is left of a request once its response is out, off the response path, in one
        worker thread: the last response's usage to the manager and the turn's deferred store
        write (a local store: :meth:`ContextManager.flush_records`). The client has its answer
        by then; the session's next request waits for it (:meth:`_settled`), so every turn is
        planned with the previous usage and finds the previous turn recorded. Once per plan.

        A write that fails is counted (the session's ``store_errors``) and logged by the
        manager, and the next turn records the session in full: no message is lost. A process
        that dies before the write loses no message either: the client resends its history,
        and the turn is recorded with the next one."""
        if plan.settled:
            return
        plan.settled = True
        self._observe(plan)
        feed = self._usage_metrics(plan, usage)
        state = plan.state
        gate, plan.gate = plan.gate, None  # recall answered beside the client's calls (_answer_beside)
        if not (feed or plan.deferred):
            if gate is not None:
                gate.set()
                if state is not None and state.settling is gate:
                    state.settling = None
            return
        done = anyio.Event()
        if state is not None:
            state.settling = done
        if gate is not None:  # its waiters now wait for ``done``
            gate.set()

        async def run() -> None:
            started = time.perf_counter()
            try:
                await anyio.to_thread.run_sync(self._settle, plan, dict(usage or {}) if feed else None)
            finally:
                done.set()
                if state is not None and state.settling is done:
                    state.settling = None
                self.metrics.child(self.metrics.stage, plan.api.name, "settle").observe(time.perf_counter() - started)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _observe(self, plan: _Plan) -> None:
        """The request's stage timings and added latency to the metrics (once the response is out)."""
        api = plan.api.name
        self.metrics.observe_stages(api, plan.stages)
        plan.stages = []
        if plan.added is not None:
            self.metrics.child(self.metrics.added_latency, api).observe(plan.added)
            plan.added = None

    def _settle(self, plan: _Plan, usage: dict[str, Any] | None) -> None:
        """:meth:`_settle_later`'s work (worker thread)."""
        mgr = plan.manager
        assert mgr is not None
        if usage is not None:
            self._feed_usage(plan, usage)
        if plan.deferred:
            started = time.perf_counter()
            try:  # store errors are the manager's to count and log; anything else is logged here
                mgr.flush_records(plan.session)
            except Exception as exc:
                log.warning("writing a turn to the store failed", extra={"fields": {"session": plan.session, "error": f"{type(exc).__name__}: {exc}"}})
            self.metrics.child(self.metrics.stage, plan.api.name, "record").observe(time.perf_counter() - started)

    def _after(self, response: Response, plan: _Plan) -> Response:
        """``response`` with :meth:`_settle_later` (and ``plan.usage``) to run once it has been
        sent: the last byte of the body, or of the stream, is out."""

        async def settle() -> None:
            self._settle_later(plan, plan.usage)

        response.background = BackgroundTask(settle)
        return response

    async def _usage_to_manager(self, plan: _Plan, usage: dict[str, Any]) -> None:
        await anyio.to_thread.run_sync(self._feed_usage, plan, usage)

    def _feed_usage(self, plan: _Plan, usage: dict[str, Any]) -> None:
        """A response's usage to the session's manager (worker thread); a failure is logged."""
        mgr = plan.manager
        assert mgr is not None
        try:
            mgr.update_from_response(usage, session_id=plan.session)
        except Exception as exc:
            self._fail_open(plan.api, plan, "usage", exc)

    async def _settled(self, api: Api, session: str) -> None:
        """Wait for the session's previous request's :meth:`_settle_later` work."""
        s = self.sessions.get(api.name, session)
        if s is None or s.settling is None:
            return
        started = time.perf_counter()
        # one wait may hand over to the next (recall answers, then the usage and the write);
        # bounded: a response whose after-work never ran must not stall the session
        with anyio.move_on_after(self.settings.timeout):
            while (pending := s.settling) is not None and not pending.is_set():
                await pending.wait()
        self.metrics.stage.labels(api.name, "wait_settle").observe(time.perf_counter() - started)

    def _account(self, plan: _Plan, outcome: str, status: int, started: float) -> None:
        api = plan.api.name
        self.metrics.child(self.metrics.requests, api, outcome).inc()
        self.metrics.child(self.metrics.tokens_in, api).inc(plan.tokens_in)
        self.metrics.child(self.metrics.tokens_out, api).inc(plan.tokens_out)
        if plan.compactions:
            self.metrics.child(self.metrics.compactions, api).inc(plan.compactions)
        log.info(
            "request",
            extra={
                "fields": {
                    "api": api,
                    "session": plan.session,
                    "model": plan.body.get("model"),
                    "status": status,
                    "outcome": outcome,
                    "stream": plan.body.get("stream") is True,
                    "tokens_in": plan.tokens_in,
                    "tokens_out": plan.tokens_out,
                    "compactions": plan.compactions,
                    "planned": plan.planned or None,
                    "ms": round((time.perf_counter() - started) * 1000, 2),
                }
            },
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

    async def _complete(self, plan: _Plan, url: str, headers: dict[str, str], extra: RawHeaders, original: bytes) -> Response:
        return self._after(await self._complete_response(plan, url, headers, extra, original), plan)

    async def _complete_response(self, plan: _Plan, url: str, headers: dict[str, str], extra: RawHeaders, original: bytes) -> Response:
        started = time.perf_counter()
        api = plan.api
        resp, content = await self._post(url, headers, plan.content)
        plan.stages.append(("upstream", time.perf_counter() - started))
        if resp.status >= 400 and await self._shrink(plan, resp.status, content):
            resp, content = await self._post(url, headers, plan.content)
        if resp.status >= 400:
            self._account(plan, "upstream_error", resp.status, started)
            return self._relayed(resp, content, extra)
        try:
            data = orjson.loads(content)
        except orjson.JSONDecodeError:
            self._account(plan, "ok", resp.status, started)
            return self._relayed(resp, content, extra)
        if not plan.engine_tools or not isinstance(data, dict):
            plan.usage = api.usage(data) if isinstance(data, dict) else None
            self._account(plan, "ok", resp.status, started)
            return self._relayed(resp, content, extra)
        await self._usage(plan, api.usage(data))
        try:
            status, data, resp, content = await self._answer_tools(plan, url, headers, data, resp, content)
        except Exception as exc:  # fail open: the client's own request, unchanged
            self._fail_open(api, plan, "tools", exc)
            resp, content = await self._post(url, headers, original)
            self._account(plan, "fail_open", resp.status, started)
            return self._relayed(resp, content, extra)
        self._account(plan, "ok" if status < 400 else "upstream_error", status, started)
        if status >= 400:
            return self._relayed(resp, content, extra, status)
        out = JSONResponse(data, status_code=status)
        out.raw_headers += [(k, v) for k, v in self._response_headers(resp) if k.lower() != b"content-type"] + extra
        return out

    async def _answer_tools(
        self, plan: _Plan, url: str, headers: dict[str, str], data: dict[str, Any], resp: UpstreamResponse, content: bytes
    ) -> tuple[int, dict[str, Any], UpstreamResponse, bytes]:
        api = plan.api
        body = plan.body
        for _ in range(self.settings.max_tool_rounds):
            calls = api.calls(data)
            if not calls or not any(c.name in plan.engine_tools for c in calls):
                break
            if not all(c.name in plan.engine_tools for c in calls):  # the client's calls too
                await self._answer_beside(plan, calls)
                break
            assistant = api.assistant_message(data)
            results = await anyio.to_thread.run_sync(self._answers, plan, calls, assistant)
            body = api.followup(body, assistant, results)
            self.metrics.tool_rounds.labels(api.name).inc()
            resp, content = await self._post(url, headers, encode(body))
            if resp.status >= 400:
                return resp.status, {}, resp, content
            data = orjson.loads(content)
            await self._usage(plan, api.usage(data))
        return resp.status, api.without_calls(data, set(plan.engine_tools)), resp, content

    # -- streaming ------------------------------------------------------------------------------
    async def _stream(self, plan: _Plan, url: str, headers: dict[str, str], extra: RawHeaders) -> Response:
        started = time.perf_counter()
        resp = await self.client.send("POST", url, headers, plan.content)
        plan.stages.append(("upstream", time.perf_counter() - started))
        if resp.status >= 400:
            content = await resp.read()
            if await self._shrink(plan, resp.status, content):
                resp = await self.client.send("POST", url, headers, plan.content)
                content = await resp.read() if resp.status >= 400 else b""
        if resp.status >= 400:
            self._account(plan, "upstream_error", resp.status, started)
            return self._after(self._relayed(resp, content, extra), plan)
        out = _RelayResponse(self._relay(plan, url, headers, resp, started), status_code=resp.status)
        out.raw_headers += self._response_headers(resp) + extra
        return self._after(out, plan)

    async def _relay(self, plan: _Plan, url: str, headers: dict[str, str], resp: UpstreamResponse, started: float) -> AsyncIterator[bytes]:
        api = plan.api
        tracker: StreamTracker = api.tracker(plan.engine_tools)
        body = plan.body
        rounds = 0
        outcome = "ok"
        try:
            while True:
                splitter = EventSplitter(only=None if plan.engine_tools else b'"usage"')
                end = api.stream_end()
                if not plan.engine_tools:
                    async for chunk in resp.stream():
                        yield chunk  # relayed as it arrives
                        end.feed(chunk)
                        for event in splitter.feed(chunk):
                            tracker.feed(event)
                else:
                    async for chunk in resp.stream():
                        end.feed(chunk)
                        for event in splitter.feed(chunk):
                            tracker.feed(event)
                            shown = tracker.visible(event)
                            if shown:
                                yield shown
                for event in splitter.flush():
                    tracker.feed(event)
                    if plan.engine_tools:
                        shown = tracker.visible(event)
                        if shown:
                            yield shown
                await resp.aclose()
                if not end.complete:  # cut before its last event: the client must not take it as whole
                    outcome = "upstream_error"
                    yield api.stream_failure("the upstream ended the stream before its last event", tracker)
                    break
                if not (plan.engine_tools and tracker.engine_calls_only()):
                    plan.usage = dict(tracker.usage) if tracker.usage else None
                    if plan.engine_tools:
                        await self._answer_beside(plan, [ToolCall(i, n, a) for i, n, a in tracker.calls()])
                    break
                await self._usage(plan, tracker.usage)
                if rounds >= self.settings.max_tool_rounds:
                    yield api.closing(tracker)
                    break
                calls = [ToolCall(i, n, a) for i, n, a in tracker.calls()]
                assistant = tracker.assistant_message()
                results = await anyio.to_thread.run_sync(self._answers, plan, calls, assistant)
                body = api.followup(body, assistant, results)
                self.metrics.tool_rounds.labels(api.name).inc()
                rounds += 1
                resp = await self.client.send("POST", url, headers, encode(body))
                if resp.status >= 400:
                    content = await resp.read()
                    outcome = "upstream_error"
                    yield api.stream_error(resp.status, content, tracker)
                    break
                tracker = api.tracker(plan.engine_tools, first_round=False, previous=tracker)
        except UpstreamError as exc:  # stalled or cut mid-stream: an error event in the API's shape
            outcome = "upstream_error"
            yield api.stream_failure(f"the upstream failed mid-stream: {exc}", tracker)
        finally:
            await resp.aclose()
            self._account(plan, outcome, 200, started)
            # the stream's end goes out in the same step of the event loop, before the work
            # starts; waiting for the response's background would leave a moment (the
            # disconnect watcher stopping) in which the session's next request finds the
            # previous turn's write neither done nor announced
            with contextlib.suppress(RuntimeError):  # no running loop: a generator collected elsewhere
                self._settle_later(plan, plan.usage)


class _ChatFront:
    """The chat endpoints (``POST /v1/chat/completions``, ``POST /v1/messages``) straight to
    :meth:`Proxy._chat`, every other request to the router.

    Starlette's router and its exception middleware (route matching, a request-response wrapper,
    exception-handler lookups, a wrapped ``send`` for every chunk) cost the chat path about
    0.05 ms before the first byte, measured in-process; the handler needs none of it (it maps
    its own errors to the API's error shape and raises no HTTP exceptions). Sits inside the
    server-error middleware, so an unexpected exception still becomes a 500."""

    def __init__(self, app: ASGIApp, proxy: Proxy) -> None:
        self.app = app
        self.proxy = proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            api = _CHAT_PATHS.get(scope["path"])
            if api is not None:
                response = await self.proxy._chat(Request(scope, receive), api)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


_CHAT_PATHS = {"/v1/chat/completions": OPENAI, "/v1/messages": ANTHROPIC, "/v1/responses": RESPONSES}


class _RelayResponse(StreamingResponse):
    """A relayed stream whose first chunk goes out from the request's own task.

    Starlette streams from a second task while the request's task watches for the client
    leaving (uvicorn reports ASGI spec 2.3, whose ``send`` does not fail once the client is
    gone). Starting that task group before the first chunk cost time to first byte about
    0.3 ms, measured. Here the response head and the first chunk are sent first, then the
    rest is streamed Starlette's way, watcher included: a client that left while the
    upstream prepared its first chunk is noticed right after that chunk, and the upstream
    stream is closed then as before.
    """

    _head_sent = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        chunks = self.body_iterator.__aiter__()
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        self._head_sent = True
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            if self.background is not None:
                await self.background()
            return
        await send({"type": "http.response.body", "body": first if isinstance(first, bytes | memoryview) else first.encode(self.charset), "more_body": True})
        self.body_iterator = chunks
        await super().__call__(scope, receive, send)

    async def stream_response(self, send: Send) -> None:
        if not self._head_sent:
            await super().stream_response(send)
            return
        async for chunk in self.body_iterator:
            await send({"type": "http.response.body", "body": chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _count_body(s: ProxySession | None, body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``body`` (a token count's) with the session's last outgoing context in place of the
    history it shares with the session's last request, or None when it does not continue it."""
    if s is None or s.last_out is None:
        return None
    n, last, sent = s.last_out
    messages = body["messages"]
    if n == 0 or len(messages) < n or _without_markers(messages[n - 1]) != _without_markers(last):
        return None
    out = dict(body)
    out["messages"] = [*sent["messages"], *messages[n:]]
    if "system" in sent:
        out["system"] = sent["system"]
    return out


def _without_markers(value: Any) -> Any:
    """``value`` without its ``cache_control`` keys (clients move their markers every turn)."""
    if isinstance(value, Mapping):
        return {k: _without_markers(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_without_markers(v) for v in value]
    return value


def create_app(
    config: Config | None = None,
    *,
    auth_token: str | None = None,
    store: SessionRecorder | Literal["default"] | None = "default",
    transport: httpx.AsyncBaseTransport | None = None,
) -> Starlette:
    """The ASGI app of a :class:`Proxy` (its ``state.proxy`` is the proxy object)."""
    proxy = Proxy(config, auth_token=auth_token, store=store, transport=transport)
    proxy.app.state.proxy = proxy
    return proxy.app

