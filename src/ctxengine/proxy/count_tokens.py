"""The token-count routes (``POST /v1/messages/count_tokens``, Gemini's ``…:countTokens``): the
count of what the proxy would send, asked of the upstream. A body that continues a session's
last request is counted with that request's working context (as it went upstream) plus what is
new since; any other body goes as it came."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ctxengine.proxy.apis import ANTHROPIC
from ctxengine.proxy.base import TOKEN_HEADER, ProxyBase, TooLarge
from ctxengine.proxy.gemini import GEMINI, count_body
from ctxengine.proxy.session import (
    SESSION_HEADER,
    SessionIdError,
    client_session_id,
    derive_session_id,
    session_from_header,
)
from ctxengine.proxy.state import ProxySession
from ctxengine.proxy.upstream import UpstreamError
from ctxengine.proxy.writer import encode

__all__ = ["TokenCounts"]


class TokenCounts(ProxyBase):
    """The proxy's token-count routes (a part of :class:`~ctxengine.proxy.app.Proxy`)."""

    async def count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``: the count of what the proxy would send. A body
        that continues a session's last request is counted with that request's working context
        (as it went upstream) plus the messages new since; any other body goes as it came."""
        api = ANTHROPIC
        if not self._authorized(request):
            return self._error(api, 401, f"missing or wrong {TOKEN_HEADER} (this proxy requires a token)", "unauthorized", "authentication_error")
        try:
            raw = await self._read_body(request)
        except TooLarge:
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

    async def gemini_count_tokens(self, request: Request) -> Response:
        """``POST …/models/{model}:countTokens``: the count of what the proxy would send. A body
        that continues a Gemini session's last request (its ``contents``, or those of its
        ``generateContentRequest``) is counted with that request's working context plus the
        contents new since; any other body goes as it came."""
        api = GEMINI
        if not self._authorized(request):
            return self._error(api, 401, f"missing or wrong {TOKEN_HEADER} (this proxy requires a token)", "unauthorized")
        try:
            raw = await self._read_body(request)
        except TooLarge:
            return self._error(api, 413, f"request body larger than {self.settings.max_body_bytes} bytes", "too_large")
        content = raw
        try:
            body = orjson.loads(raw)
            named = session_from_header(request.headers.get(SESSION_HEADER))
            if isinstance(body, dict):
                for s in self.sessions:
                    if s.api == api.name and s.last_out is not None and (named is None or s.id == named):
                        counted = count_body(body, s.last_out[2], s.last_out[0], s.last_out[1])
                        if counted is not None:
                            content = encode(counted)
                            break
        except (orjson.JSONDecodeError, SessionIdError):
            pass  # the upstream answers a body it cannot count
        query = request.scope.get("query_string", b"").decode()
        try:
            resp = await self.client.send("POST", self._upstream(api, request.scope["path"], query), self._request_headers(request), content)
            data = await resp.read()
        except UpstreamError as exc:
            return self._error(api, 502, f"upstream unreachable: {exc}", "upstream_unreachable", api.unreachable_kind)
        self.metrics.requests.labels("passthrough", "ok" if resp.status < 400 else "upstream_error").inc()
        return self._relayed(resp, data, [])


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
