"""The proxy application: an ASGI app (Starlette) in front of an OpenAI- and an Anthropic-style
upstream (aiohttp, see :mod:`ctxengine.proxy.upstream`), running a :class:`~ctxengine.ContextManager` per model and session.

Per chat request (``POST /v1/chat/completions``, ``POST /v1/messages``, ``POST /v1/responses``,
Gemini's ``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent``):

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

**Fail open**: an engine that fails or whose output is rejected leaves the turn's messages as
they were, and the window cap still holds the window. Any other internal error in steps 2–4
sends the client's request held under the window by the window cap alone (unchanged when it
fits, or when even that fails), and in step 6 the request as planned; either way it logs why
(``ctxengine_proxy_fail_open_total`` counts them). Every other path
under ``/v1/`` is forwarded unchanged (``/v1/models`` …): to the Anthropic upstream when the
request carries ``x-api-key`` or ``anthropic-version``, else to the OpenAI upstream;
``/v1/responses/compact`` is answered by the session's engine and
``/v1/messages/count_tokens`` counts what the proxy would send.

The request path is split by concern into layers, each using only those below it (see
:mod:`ctxengine.proxy.base`); this module holds the endpoints and :class:`Proxy` itself.

**Keys** (``Authorization``, ``x-api-key``, ``x-goog-api-key``; a Gemini ``?key=`` is moved into
``x-goog-api-key``) are forwarded upstream and never stored or logged;
the session store records messages only, never headers. When a proxy token is set, every
``/v1/`` and ``/metrics`` request must carry it in ``x-ctxengine-token``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
import threading
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

import anyio
import httpx2 as httpx
import orjson
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ctxengine.config import Config
from ctxengine.manager import ContextManager, default_store
from ctxengine.messages import Message
from ctxengine.proxy.apis import ANTHROPIC, OPENAI, Api
from ctxengine.proxy.base import (
    _SAVED_RAW,
    _SESSION_RAW,
    TOKEN_HEADER,
    TOKENS_SAVED_HEADER,
    Plan,
    TooLarge,
    is_local,
)
from ctxengine.proxy.count_tokens import TokenCounts
from ctxengine.proxy.gemini import GEMINI, key_into_scope, split_target
from ctxengine.proxy.limits import Windows
from ctxengine.proxy.metrics import CONTENT_TYPE, ProxyMetrics
from ctxengine.proxy.planning import OPENING
from ctxengine.proxy.relay import Relaying
from ctxengine.proxy.responses import RESPONSES, compact_input, compact_reply
from ctxengine.proxy.session import (
    SESSION_HEADER,
    SessionIdError,
    SessionRouter,
    session_for,
    session_from_header,
)
from ctxengine.proxy.state import SessionTable
from ctxengine.proxy.upstream import (
    Upstream,
    UpstreamError,
)
from ctxengine.storage import SessionRecorder
from ctxengine.store import SessionStore
from ctxengine.ui.app import BASE, Dashboard

__all__ = ["TOKENS_SAVED_HEADER", "TOKEN_HEADER", "Proxy", "create_app"]

log = logging.getLogger("ctxengine.proxy")

class Proxy(TokenCounts, Relaying):
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
        self._local_store = is_local(self.store)
        self._turns, self._turns_opened = None, False
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = threading.Lock()
        self.dashboard = Dashboard(self.store if isinstance(self.store, SessionStore) else None, auth_token=self.auth_token)
        self.app = Starlette(
            routes=[
                Route("/healthz", self.healthz, methods=["GET"]),
                Route("/metrics", self.metrics_endpoint, methods=["GET"]),
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/messages", self.messages, methods=["POST"]),
                Route("/v1/responses", self.responses, methods=["POST"]),
                Route("/v1/responses/compact", self.responses_compact, methods=["POST"]),
                Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
                Route("/v1beta/models/{target}", self.gemini, methods=["POST"]),
                Route("/v1/models/{target}", self.gemini, methods=["POST"]),
                Route("/v1beta/{path:path}", self.forward_gemini, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
                Route("/v1/{path:path}", self.forward, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
                Route(BASE, self.to_dashboard, methods=["GET"]),
                Mount(BASE, app=self.dashboard.pages),
                Route("/{path:path}", self.not_served, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
            ],
            middleware=[Middleware(_ChatFront, proxy=self)],
            lifespan=self._lifespan,
        )

    # -- lifecycle ----------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._client = self._new_client()
        # the request log added up once, off the request path, so the first /ui page is quick
        threading.Thread(target=self.dashboard.warm, name="ctxengine-ui-warm", daemon=True).start()
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


    # -- endpoints ----------------------------------------------------------------------------
    async def healthz(self, request: Request) -> Response:
        with self._lock:
            sessions = sum(len(m.sessions) for m in self._managers.values())
        store = type(self.store).__name__ if self.store is not None else None
        return JSONResponse({"status": "ok", "store": store, "sessions": sessions})

    async def to_dashboard(self, request: Request) -> Response:
        """``/ui`` → ``/ui/`` (the dashboard's overview)."""
        return RedirectResponse(f"{BASE}/", status_code=307)

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

    async def gemini(self, request: Request) -> Response:
        """``POST /v1beta/models/{model}:{method}`` (and ``/v1/models/…``): ``generateContent``
        and ``streamGenerateContent`` are chat requests, ``countTokens`` counts what the proxy
        would send (:meth:`gemini_count_tokens`); any other method is forwarded. A ``?key=`` is
        moved into the ``x-goog-api-key`` header first."""
        key_into_scope(request.scope)
        request = Request(request.scope, request.receive)
        target = split_target(request.path_params.get("target", ""))
        if target is not None and target[1] in ("generateContent", "streamGenerateContent"):
            return await self._chat(request, GEMINI)
        if target is not None and target[1] == "countTokens":
            return await self.gemini_count_tokens(request)
        if target is None and request.url.path.startswith("/v1/"):
            return await self.forward(request)  # not Gemini's: an OpenAI-style /v1/models/… path
        return await self.forward_gemini(request)

    async def forward_gemini(self, request: Request) -> Response:
        """Any other Gemini API path (``/v1beta/models`` …), unchanged both ways (the key moved
        from the query into its header)."""
        key_into_scope(request.scope)
        request = Request(request.scope, request.receive)
        if not self._authorized(request):
            return self._error(GEMINI, 401, f"missing or wrong {TOKEN_HEADER} (this proxy requires a token)", "unauthorized")
        try:
            raw = await self._read_body(request)
        except TooLarge:
            return self._error(GEMINI, 413, f"request body larger than {self.settings.max_body_bytes} bytes", "too_large")
        return await self.forward_body(request, GEMINI, raw)

    async def not_served(self, request: Request) -> Response:
        """A path outside ``/v1/`` and ``/v1beta/``: a JSON 404 saying what is served."""
        message = (
            f"ctxengine proxy: {request.method} {request.url.path} is not served; it serves the OpenAI chat-completions "
            "(/v1/chat/completions) and Responses (/v1/responses) APIs, the Anthropic messages API (/v1/messages) and "
            "the Gemini API (/v1beta/models/…), and forwards every other /v1/ and /v1beta/ path"
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
        except TooLarge:
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
            ticket = self._take_turn(api, s, wait=self.settings.timeout)
            try:
                mgr = self._open_manager(api, s, str(body["model"]))
                before = mgr.counters(session)["compactions"]
                out = mgr.prepare(msgs, session_id=session, compact=True)
            finally:
                if ticket is not None:
                    ticket.release()
            tokens = mgr.counters(session)["last_tokens"]
            self.metrics.child(self.metrics.compactions, api.name).inc(mgr.counters(session)["compactions"] - before)
        return compact_reply(body, out, {"input_tokens": tokens, "output_tokens": 0})

    async def forward_body(self, request: Request, api: Api, raw: bytes) -> Response:
        """``request`` (its body already read: ``raw``) forwarded unchanged to ``api``'s upstream."""
        headers = self._request_headers(request, passthrough=True)
        url = self._upstream(api, request.url.path, request.url.query)
        try:
            resp = await self.client.send(request.method, url, headers, raw or None, decode=False)
        except UpstreamError as exc:
            return self._error(api, 502, f"upstream unreachable: {exc}", "upstream_unreachable", api.unreachable_kind)
        self.metrics.requests.labels("passthrough", "ok" if resp.status < 400 else "upstream_error").inc()
        out = StreamingResponse(resp.stream(), status_code=resp.status, background=BackgroundTask(resp.aclose))
        out.raw_headers.extend(self._response_headers(resp, keep_encoding=True))
        return out

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
        except TooLarge:
            return self._error(api, 413, f"request body larger than {self.settings.max_body_bytes} bytes", "too_large", "request_too_large")
        return await self.forward_body(request, api, raw)

    async def _shadow(self, request: Request, api: Api, plan: Plan, named: str | None, headers: dict[str, str], t0: float) -> Response:
        """A request in shadow mode: forwarded unchanged at once (routed to its session like any
        other); :meth:`_settle` plans it after the response and logs what would have gone."""
        plan.shadow, plan.client = True, _client_name(request.headers.get("user-agent"))
        try:
            if not named:
                plan.session = await self._route(api, request, plan.body)
        except Exception as exc:  # no session: forwarded all the same, nothing to plan
            self._fail_open(api, plan, "prepare", exc)
            plan.shadow = False
        plan.added = time.perf_counter() - t0
        url = self._upstream(api, request.scope["path"], request.scope.get("query_string", b"").decode())
        extra = [(_SESSION_RAW, plan.session.encode("latin-1"))] if plan.session else []
        try:
            if plan.body.get("stream") is True:
                return await self._stream(plan, url, headers, extra)
            return await self._complete(plan, url, headers, extra, plan.content)
        except UpstreamError as exc:
            plan.outcome, plan.status = "upstream_unreachable", 502
            return self._after(self._error(api, 502, f"upstream unreachable: {exc}", "upstream_unreachable", api.unreachable_kind), plan)

    async def _planned(self, api: Api, session: str, body: Mapping[str, Any], raw: bytes) -> Plan:
        """The plan of a chat request, once the session's previous request has settled: on the
        event loop when the turn only appends (a session new in this process opened first, in
        a worker thread), else in a worker thread; its stages timed."""
        await self._settled(api, session)
        t_queue = time.perf_counter()
        quick = self._plan_inline(api, session, body, raw)
        if quick == OPENING:  # the store and the engine in a worker thread, the plan here
            await anyio.to_thread.run_sync(self._open, api, session, body)
            quick = self._plan_inline(api, session, body, raw)
        if isinstance(quick, Plan):
            quick.stages.append(("plan_inline", quick.finished - quick.started))
            return quick
        plan = await anyio.to_thread.run_sync(self._plan, api, session, body, raw)
        plan.planned = f"worker: {quick}"
        t_back = time.perf_counter()
        plan.stages += [("plan_queue", plan.started - t_queue), ("plan", plan.finished - plan.started), ("plan_return", t_back - plan.finished)]
        return plan

    async def _chat(self, request: Request, api: Api) -> Response:
        t0 = time.perf_counter()
        if not self._authorized(request):
            return self._error(api, 401, f"missing or wrong {TOKEN_HEADER} (this proxy requires a token)", "unauthorized", "authentication_error")
        try:
            raw = await self._read_body(request)
        except TooLarge:
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
        body = api.routed(body, request.scope["path"], request.scope.get("query_string", b""))
        t_parse = time.perf_counter()
        problem = api.problem(body) or bad_session
        if problem:
            return self._error(api, 400, problem, "bad_request")
        headers = self._request_headers(request)
        plan = Plan(api, named or "", body, raw)
        passthrough = api.passthrough_reason(body)
        if self.settings.shadow and passthrough is None:
            return await self._shadow(request, api, plan, named, headers, t0)
        try:
            if passthrough is not None:
                log.debug("request forwarded unchanged: %s", passthrough)
                self.metrics.child(self.metrics.plans, api.name, "passthrough").inc()
            else:
                if not named:  # the client's own id, or a derived one: routed by the history
                    plan.session = await self._route(api, request.headers, body)
                plan = await self._planned(api, plan.session, body, raw)
        except Exception as exc:  # fail open: the client's request, held under the window
            self._fail_open(api, plan, "prepare", exc)
            plan = await anyio.to_thread.run_sync(self._plan_capped, api, plan.session, body, raw)
        plan.client = _client_name(request.headers.get("user-agent"))
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
            plan.outcome, plan.status = "upstream_unreachable", 502
            return self._after(self._error(api, 502, f"upstream unreachable: {exc}", "upstream_unreachable", api.unreachable_kind), plan)
        except BaseException:
            self._settle_later(plan)  # the deferred write still runs
            raise


class _Shadow:
    """Shadow mode (``proxy.shadow``): the request goes upstream as the client sent it; what
    ctxengine would have sent is planned after the response, in the after-response worker
    thread (:meth:`~ctxengine.proxy.settling.Settling._settle`), and logged with the request."""


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


def _client_name(user_agent: str | None) -> str:
    """A client's name for the request log: its user-agent's first product (``claude-cli/2.1.3
    (external, cli)`` → ``claude-cli``), at most 40 printable characters."""
    first = (user_agent or "").strip().split(" ", 1)[0].split("/", 1)[0]
    return "".join(c for c in first if c.isprintable())[:40]


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

