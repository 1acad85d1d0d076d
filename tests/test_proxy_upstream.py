"""The proxy's upstream client (:mod:`ctxengine.proxy.upstream`): aiohttp on the network, httpx
over an injected transport, and what both must keep: encodings, repeated headers, redirects,
environment proxies, unreachable upstreams."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from yarl import URL

from ctxengine.config import Config
from ctxengine.proxy import SESSION_HEADER, TOKENS_SAVED_HEADER, ProxyServer, create_app
from ctxengine.proxy.upstream import _env_proxy

REPLY = {"id": "c1", "object": "chat.completion", "model": "gpt-4o", "choices": [{"index": 0, "message": {"role": "assistant", "content": "zipped"}, "finish_reason": "stop"}]}


class _Odd(BaseHTTPRequestHandler):
    """An upstream that gzips whatever the client asked for, repeats set-cookie, and redirects."""

    protocol_version = "HTTP/1.1"
    seen: list[dict[str, str]] = []  # noqa: RUF012 (one server per test)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        self.seen.append({k.lower(): v for k, v in self.headers.items()} | {"path": self.path})
        if self.path.startswith("/v1/moved"):
            self.send_response(302)
            self.send_header("location", "/v1/elsewhere")
            self.send_header("content-length", "0")
            self.end_headers()
            return
        body = gzip.compress(json.dumps(REPLY).encode())
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-encoding", "gzip")
        self.send_header("set-cookie", "a=1")
        self.send_header("set-cookie", "b=2")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _answer
    do_POST = _answer


@pytest.fixture
def odd() -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    handler = type("Handler", (_Odd,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _config(base: str, tmp_path: Path) -> Config:
    return Config().with_overrides(proxy={"openai_base_url": base + "/v1", "anthropic_base_url": base}, store={"path": str(tmp_path / "s.db")})


def test_a_chat_reply_is_decoded_and_a_passthrough_reply_relayed_as_it_came(odd: tuple[str, list[dict[str, str]]], tmp_path: Path) -> None:
    base, seen = odd
    with ProxyServer(_config(base, tmp_path)) as p:
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(p.openai_base_url + "/chat/completions", json=body)
        assert r.status_code == 200 and r.json() == REPLY
        assert "content-encoding" not in r.headers  # the proxy read it, the client gets it decoded
        assert seen[-1]["accept-encoding"] == "identity"
        assert r.headers.get_list("set-cookie") == ["a=1", "b=2"]  # repeated headers kept apart
    # passthrough: the bytes as the upstream sent them, encoding header included
    with ProxyServer(_config(base, tmp_path)) as p, httpx.Client() as c:
        with c.stream("GET", p.openai_base_url + "/models", headers={"accept-encoding": "gzip"}) as r:
            raw = b"".join(r.iter_raw())
        assert r.headers["content-encoding"] == "gzip"
        assert json.loads(gzip.decompress(raw)) == REPLY
        assert seen[-1]["accept-encoding"] == "gzip"
        assert "content-type" not in seen[-1]  # none added that the client did not send


def test_redirects_are_returned_not_followed(odd: tuple[str, list[dict[str, str]]], tmp_path: Path) -> None:
    base, seen = odd
    with ProxyServer(_config(base, tmp_path)) as p:
        r = httpx.get(p.openai_base_url + "/moved?x=%2F&y=1")
        assert r.status_code == 302 and r.headers["location"] == "/v1/elsewhere"
        assert [s["path"] for s in seen] == ["/v1/moved?x=%2F&y=1"]  # the query exactly as sent


def test_an_unreachable_upstream_is_a_502_in_the_apis_error_shape(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with ProxyServer(_config(f"http://127.0.0.1:{port}", tmp_path)) as p:
        r = httpx.post(p.url + "/v1/messages", json={"model": "claude-opus-4-5", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 502 and r.json()["error"]["type"] == "api_error"
        assert "upstream unreachable" in r.json()["error"]["message"]
        r = httpx.get(p.openai_base_url + "/models")
        assert r.status_code == 502


def test_environment_proxies_are_honoured_and_no_proxy_respected(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert _env_proxy(URL("https://api.openai.com/v1")) == (None, None)
    monkeypatch.setenv("HTTPS_PROXY", "http://user:pw@corp-proxy:3128")
    monkeypatch.setenv("NO_PROXY", "internal.example")
    proxy, auth = _env_proxy(URL("https://api.openai.com/v1"))
    assert proxy == URL("http://corp-proxy:3128") and auth is not None and (auth.login, auth.password) == ("user", "pw")
    assert _env_proxy(URL("https://llm.internal.example/v1")) == (None, None)
    assert _env_proxy(URL("http://api.openai.com/v1")) == (None, None)  # no http proxy set


def test_an_injected_transport_serves_the_upstream_calls() -> None:
    seen: list[httpx.Request] = []

    class Body(httpx.AsyncByteStream):  # streamed, as a network transport's responses are
        def __init__(self, data: Any) -> None:
            self.data = json.dumps(data).encode()

        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield self.data

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/models"):
            return httpx.Response(418, stream=Body({"error": "teapot"}))
        return httpx.Response(200, stream=Body(REPLY), headers={"x-upstream": "yes"})

    app = create_app(Config(), store=None, transport=httpx.MockTransport(handler))

    async def run() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as c:
            chat = await c.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, headers={"authorization": "Bearer k"})
            models = await c.get("/v1/models")
            await app.state.proxy.client.aclose()
            return chat, models

    chat, models = asyncio.run(run())
    assert chat.status_code == 200 and chat.json() == REPLY
    assert chat.headers["x-upstream"] == "yes" and chat.headers[TOKENS_SAVED_HEADER] == "0" and chat.headers[SESSION_HEADER].startswith("px-")
    assert seen[0].headers["authorization"] == "Bearer k" and json.loads(seen[0].content)["messages"] == [{"role": "user", "content": "hi"}]
    assert models.status_code == 418 and models.json() == {"error": "teapot"}  # status and body verbatim


def test_each_upstream_url_is_parsed_once_and_the_parsed_urls_are_bounded(odd: tuple[str, list[dict[str, str]]], monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxengine.proxy import upstream

    base, seen = odd
    monkeypatch.setattr(upstream, "_URLS_KEPT", 2)
    paths = ["/v1/models?x=%2F&y=1", "/v1/models?x=%2F&y=1", "/v1/a%2Fb", "/v1/c", "/v1/models?x=%2F&y=1"]

    async def run() -> list[int]:
        client = upstream.AiohttpUpstream(timeout=5, connect_timeout=5)
        sizes = []
        try:
            for p in paths:
                resp = await client.send("GET", base + p, {}, None)
                await resp.read()
                sizes.append(len(client._urls))
        finally:
            await client.aclose()
        return sizes

    assert asyncio.run(run()) == [1, 1, 2, 1, 2]
    assert [s["path"] for s in seen] == paths  # sent as the client named them, reused or not
