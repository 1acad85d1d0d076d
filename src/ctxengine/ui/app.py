"""The dashboard as an ASGI app (:class:`Dashboard`), mounted at ``/ui`` by ``ctxengine proxy``
and served alone by ``ctxengine ui``.

Pages (under ``/ui``): ``/`` the overview, ``/sessions``, ``/sessions/{id}`` (``?q=`` searches it
with ``ctx_grep``), ``/sessions/{id}/compactions/{id}`` (a compaction's audit),
``/sessions/{id}/expand/{ref}`` (what ``ctx_expand`` returns); the same data as JSON under
``/ui/api/…`` (the pages poll it to refresh while agents run); the stylesheet and script under
``/ui/static``, shipped in the package.

With a token (the proxy's, ``x-ctxengine-token``) every path needs it: the header, or once
``?token=…`` in the address, which sets a cookie for the rest of the visit; without it, 401. A
session or compaction that does not exist is a 404 page; a store that cannot be read a 503 page
that says why (secrets redacted).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from ctxengine.errors import CtxEngineError, InputError, NotFoundError
from ctxengine.redact import redact
from ctxengine.store import SessionStore
from ctxengine.ui import data, pages
from ctxengine.ui.usage import UsageReader

__all__ = ["BASE", "TOKEN_COOKIE", "TOKEN_HEADER", "Dashboard"]

log = logging.getLogger("ctxengine.ui")

BASE = "/ui"
TOKEN_HEADER = "x-ctxengine-token"
TOKEN_COOKIE = "ctxengine_token"
_STATIC = Path(__file__).parent / "static"
_SESSIONS_SHOWN = 200  # the most recently active; ?all=1 for the rest (a page stays light)
_ALL_SESSIONS = 10_000


class _NoStore(CtxEngineError):
    pass


class Dashboard:
    """The dashboard over ``store`` (``None``: every page says there is no store to read)."""

    def __init__(self, store: SessionStore | None, *, auth_token: str | None = None) -> None:
        self.store = store
        self.auth_token = auth_token or None
        self.reader = UsageReader(store) if store is not None else None
        page = self._page
        routes = [
            Route("/", page(self._overview)),
            Route("/sessions", page(self._sessions)),
            Route("/sessions/{sid}", page(self._session)),
            Route("/sessions/{sid}/compactions/{cid}", page(self._audit)),
            Route("/sessions/{sid}/expand/{ref}", page(self._expand)),
            Route("/api/overview", self._json(self._api_overview)),
            Route("/api/sessions", self._json(self._api_sessions)),
            Route("/api/sessions/{sid}", self._json(self._api_session)),
            Route("/api/sessions/{sid}/compactions/{cid}", self._json(self._api_audit)),
            Mount("/static", app=StaticFiles(directory=_STATIC)),
        ]
        self.pages: ASGIApp = _TokenGate(Starlette(routes=routes), self.auth_token)
        """The pages, paths relative to :data:`BASE` (what ``ctxengine proxy`` mounts there)."""
        self.app: ASGIApp = Starlette(routes=[Route(BASE, _to_base), Route("/", _to_base), Mount(BASE, app=self.pages)])
        """The pages at :data:`BASE` (``/`` and ``/ui`` lead there): what ``ctxengine ui`` serves."""

    def warm(self) -> None:
        """Add up the whole request log once (the first overview of a large store), so the first
        page is as quick as the next."""
        if self.store is None:
            return
        try:
            data.overview(self.store, reader=self.reader)
            data.sessions_table(self.store, limit=_SESSIONS_SHOWN + 1, reader=self.reader)
        except Exception as exc:  # the pages will say what is wrong with the store
            log.debug("adding up the request log failed: %s", redact(str(exc)))

    # -- plumbing -----------------------------------------------------------------------------------
    def _store(self) -> SessionStore:
        if self.store is None:
            raise _NoStore("no session store is configured (store: in the config), so there is nothing to show")
        return self.store

    def _page(self, render: Callable[[Request], str]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            from starlette.concurrency import run_in_threadpool

            try:
                return HTMLResponse(await run_in_threadpool(render, request))
            except Exception as exc:
                status, title, detail = _problem(exc)
                return HTMLResponse(pages.error_page(status, title, detail, base=BASE), status_code=status)

        return endpoint

    def _json(self, make: Callable[[Request], dict[str, Any]]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            from starlette.concurrency import run_in_threadpool

            try:
                return JSONResponse(await run_in_threadpool(make, request))
            except Exception as exc:
                status, title, detail = _problem(exc)
                return JSONResponse({"error": title, "detail": detail}, status_code=status)

        return endpoint

    def _version(self, session_id: str | None = None) -> str:
        store = self._store()
        u = (self.reader or store).usage([], session_id=session_id)[0]
        if session_id is not None:
            info = store.get_session(session_id)
            return f"{u.requests}:{u.last_at}:{info.updated_at}:{info.compactions}"
        latest = store.list_sessions(limit=1)
        return f"{u.requests}:{u.last_at}:{latest[0].updated_at if latest else 0}"

    # -- pages ---------------------------------------------------------------------------------------
    def _overview(self, request: Request) -> str:
        return pages.overview_page(data.overview(self._store(), reader=self.reader), base=BASE)

    def _sessions(self, request: Request) -> str:
        shown = _ALL_SESSIONS if request.query_params.get("all") else _SESSIONS_SHOWN
        rows = data.sessions_table(self._store(), limit=shown + 1, reader=self.reader)
        return pages.sessions_page(rows[:shown], base=BASE, more=len(rows) > shown)

    def _session(self, request: Request) -> str:
        sid = request.path_params["sid"]
        store = self._store()
        detail = data.session_detail(store, sid)
        query = request.query_params.get("q", "").strip()
        hits = data.grep(store, sid, query) if query else None
        return pages.session_page(detail, base=BASE, query=query, hits=hits)

    def _audit(self, request: Request) -> str:
        return pages.audit_page(self._audit_data(request), base=BASE)

    def _audit_data(self, request: Request) -> dict[str, Any]:
        sid, cid = request.path_params["sid"], request.path_params["cid"]
        found = data.audit(self._store(), cid)
        if found["session_id"] != redact(sid):
            raise NotFoundError(f"no compaction {cid!r} in session {sid!r}")
        return found

    def _expand(self, request: Request) -> str:
        sid, ref = request.path_params["sid"], request.path_params["ref"]
        return pages.expand_page(sid, ref, data.expand(self._store(), sid, ref), base=BASE)

    # -- JSON ----------------------------------------------------------------------------------------
    def _api_overview(self, request: Request) -> dict[str, Any]:
        return {"version": self._version(), **data.overview(self._store(), reader=self.reader)}

    def _api_sessions(self, request: Request) -> dict[str, Any]:
        return {"version": self._version(), "sessions": data.sessions_table(self._store(), reader=self.reader)}

    def _api_session(self, request: Request) -> dict[str, Any]:
        sid = request.path_params["sid"]
        return {"version": self._version(sid), **data.session_detail(self._store(), sid)}

    def _api_audit(self, request: Request) -> dict[str, Any]:
        return self._audit_data(request)


async def _to_base(request: Request) -> Response:
    return RedirectResponse(f"{BASE}/", status_code=307)


def _problem(exc: Exception) -> tuple[int, str, str]:
    """The status, title and (redacted) detail of a page that failed."""
    detail = redact(str(exc))
    if isinstance(exc, NotFoundError):
        return 404, "Not found", detail
    if isinstance(exc, InputError):
        return 400, "Bad request", detail
    if isinstance(exc, _NoStore):
        return 503, "No store", detail
    log.warning("a dashboard page failed", extra={"fields": {"error": f"{type(exc).__name__}: {detail}"}})
    return 503, "The store cannot be read", f"{type(exc).__name__}: {detail}"


class _TokenGate:
    """401 for a request without the token (when there is one); ``?token=`` sets a cookie."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.token:
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        given = request.query_params.get("token")
        if given is not None and self._ok(given):
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            url = request.url.path + (f"?{urlencode(rest)}" if rest else "")
            response: Response = RedirectResponse(url, status_code=303)
            response.set_cookie(TOKEN_COOKIE, self.token, httponly=True, samesite="strict", path=BASE)
            await response(scope, receive, send)
            return
        sent = request.headers.get(TOKEN_HEADER) or request.cookies.get(TOKEN_COOKIE) or ""
        if not self._ok(sent):
            detail = f"this dashboard needs the proxy token: send it in {TOKEN_HEADER}, or open {BASE}/?token=<token> once"
            if request.url.path.startswith(f"{BASE}/api/"):
                response = JSONResponse({"error": "unauthorized", "detail": detail}, status_code=401)
            else:
                response = HTMLResponse(pages.error_page(401, "Unauthorized", detail, base=BASE), status_code=401)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _ok(self, sent: str) -> bool:
        assert self.token is not None
        return hmac.compare_digest(sent.encode(), self.token.encode())
