"""The proxy's lean HTTP/1.1 client for chat requests (:mod:`ctxengine.proxy.h1`), against
scripted servers on 127.0.0.1: what goes on the wire, connection reuse and its limits, bodies
delimited every way HTTP/1.1 allows, encodings, timeouts, broken upstreams, flow control both
ways, TLS, and which requests :class:`~ctxengine.proxy.upstream.AiohttpUpstream` hands it."""

from __future__ import annotations

import asyncio
import gzip
import ssl
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trustme

from ctxengine.proxy import h1
from ctxengine.proxy.h1 import H1Client, UpstreamError
from ctxengine.proxy.upstream import AiohttpUpstream

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "_Server"], Awaitable[None]]


class _Server:
    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []  # (head, body) as received
        self.port = 0


@asynccontextmanager
async def _serve(handler: Handler, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[_Server]:
    """A server calling ``handler(reader, writer, state)`` for each connection (``state.connections``
    counts them, this one included)."""
    state = _Server()
    tasks: set[asyncio.Task[None]] = set()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await handler(reader, writer, state)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went, or the test is over
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0, ssl=ssl_context)
    state.port = server.sockets[0].getsockname()[1]
    try:
        yield state
    finally:
        server.close()
        for t in tasks:
            t.cancel()


async def _request(reader: asyncio.StreamReader, state: _Server) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    body = await reader.readexactly(length)
    state.requests.append((head, body))
    return head, body


def _reply(body: bytes, *, status: str = "200 OK", headers: tuple[str, ...] = ()) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


def _chunked(parts: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def _client(timeout: float = 5.0, **kw: Any) -> H1Client:
    return H1Client(timeout=timeout, connect_timeout=kw.pop("connect_timeout", 5.0), ssl_context=kw.pop("ssl_context", ssl.create_default_context()), **kw)


def _origin(state: _Server) -> tuple[str, str, int]:
    return ("http", "127.0.0.1", state.port)


def test_a_request_goes_out_as_given_and_its_connection_is_reused() -> None:

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _Server) -> None:
        while True:
            await _request(reader, state)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-a: 1\r\nx-a: 2\r\ntransfer-encoding: chunked\r\n\r\n")
            writer.write(_chunked([b"data: one\n\n", b"data: two\n\n"]))
            await writer.drain()

    async def run() -> list[list[bytes]]:
        async with _serve(handler) as state:
            client = _client()
            got = []
            for k in range(3):
                resp = await client.post(_origin(state), "/v1/messages?beta=true", {"Authorization": "Bearer k", "content-type": "application/json"}, b'{"k": %d}' % k)
                assert resp.status == 200
                assert resp.raw_headers == [(b"content-type", b"text/event-stream"), (b"x-a", b"1"), (b"x-a", b"2"), (b"transfer-encoding", b"chunked")]
                got.append([chunk async for chunk in resp.stream()])
                await resp.aclose()
                assert client.open == 1
            assert state.connections == 1  # one keep-alive connection for all three
            head, body = state.requests[2]
            assert head.split(b"\r\n")[:2] == [b"POST /v1/messages?beta=true HTTP/1.1", b"Host: 127.0.0.1:%d" % state.port]
            assert b"\r\nAuthorization: Bearer k\r\n" in head and b"\r\ncontent-length: 8\r\n" in head and body == b'{"k": 2}'
            await client.aclose()
            return got

    got = asyncio.run(run())
    assert all(b"".join(chunks) == b"data: one\n\ndata: two\n\n" for chunks in got)


def test_bodies_delimited_by_length_chunks_or_the_connections_end() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _Server) -> None:
        while True:
            _, body = await _request(reader, state)
            if body == b"length":
                writer.write(_reply(b"x" * 100_000))
            elif body == b"chunks":
                writer.write(b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n" + _chunked([b"a" * 10, b"b" * 70_000]))
            else:  # no length: the body ends with the connection
                writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")
                await writer.drain()
                return
            await writer.drain()


    async def run() -> None:
        async with _serve(handler) as state:
            client = _client()
            for body, status, want in ((b"length", 200, b"x" * 100_000), (b"chunks", 201, b"a" * 10 + b"b" * 70_000), (b"close", 200, b"until the end")):
                resp = await client.post(_origin(state), "/", {}, body)
                assert resp.status == status and await resp.read() == want
            assert state.connections == 1  # kept alive until the body that ends with it
            await asyncio.sleep(0.05)
            assert client.open == 0

    asyncio.run(run())


def test_a_request_on_a_pooled_connection_the_upstream_drops_is_not_sent_again() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _Server) -> None:
        while True:
            _, body = await _request(reader, state)
            if body == b"drop":
                return  # read, then the connection goes without a byte of response
            writer.write(_reply(b"ok " + body))
            await writer.drain()


    async def run() -> None:
        async with _serve(handler) as state:
            client = _client()
            assert await (await client.post(_origin(state), "/", {}, b"1")).read() == b"ok 1"
            with pytest.raises(UpstreamError, match="closed the connection before its response"):
                await client.post(_origin(state), "/", {}, b"drop")  # on the pooled connection
            assert await (await client.post(_origin(state), "/", {}, b"2")).read() == b"ok 2"
            # the dropped request reached the upstream once (it may have acted on it): never resent
            assert [b for _, b in state.requests] == [b"1", b"drop", b"2"] and state.connections == 2
            await client.aclose()

    asyncio.run(run())


def test_a_connection_dropped_before_or_during_the_head_is_an_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _Server) -> None:
        _, body = await _request(reader, state)
        if body == b"partial":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-le")
            await writer.drain()
        # otherwise: closed without a byte of response


    async def run() -> None:
        async with _serve(handler) as state:
            client = _client()
            with pytest.raises(UpstreamError, match="closed the connection before its response"):
                await client.post(_origin(state), "/", {}, b"nothing")
            with pytest.raises(UpstreamError, match="closed the connection"):
                await client.post(_origin(state), "/", {}, b"partial")
            assert state.connections == 2 and len(state.requests) == 2  # each sent once
            await asyncio.sleep(0.05)
            assert client.open == 0

    asyncio.run(run())


def test_a_body_cut_short_is_an_error_and_its_connection_is_not_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _Server) -> None:
        await _request(reader, state)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
        await writer.drain()


    async def run() -> None:
        async with _serve(handler) as state:
            client = _client()
            resp = await client.post(_origin(state), "/", {}, b"x")
            with pytest.raises(UpstreamError, match="in the middle of its response"):
                await resp.read()
            await asyncio.sleep(0.05)
            assert client.open == 0

    asyncio.run(run())


def test_timeouts_for_the_head_and_between_body_chunks() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _Server) -> None:
        _, body = await _request(reader, state)
        if body == b"stall-body":
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            await writer.drain()
        await asyncio.sleep(30)


    async def run() -> None:
        async with _serve(handler) as state:
            client = _client(timeout=0.2)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(UpstreamError, match=r"no response head from the upstream within 0\.2 s"):
                await client.post(_origin(state), "/", {}, b"stall-head")
            assert loop.time() - t0 < 2
            resp = await client.post(_origin(state), "/", {}, b"stall-body")
            chunks = []
            with pytest.raises(UpstreamError, match=r"no bytes from the upstream for 0\.2 s"):
                async for chunk in resp.stream():
                    chunks.append(chunk)
            assert chunks == [b"first"]
            await resp.aclose()
            await asyncio.sleep(0.05)
            assert client.open == 0

    asyncio.run(run())


def test_encodings_are_undone_only_when_asked() -> None:
    text = b'{"reply": "' + b"z" * 5000 + b'"}'
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    bodies = {
        b"gzip": gzip.compress(text),
        b"deflate": zlib.compress(text),
        b"raw-deflate": raw_deflate.compress(text) + raw_deflate.flush(),
        b"br": b"not really brotli",
    }

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _Server) -> None:
        while True:
            _, body = await _request(reader, state)
            encoding = b"deflate" if body == b"raw-deflate" else body
            writer.write(_reply(bodies[body], headers=(f"content-encoding: {encoding.decode()}",)))
            await writer.drain()


    async def run() -> None:
        async with _serve(handler) as state:
            client = _client()
            for name in (b"gzip", b"deflate", b"raw-deflate"):
                assert await (await client.post(_origin(state), "/", {}, name)).read() == text
                resp = await client.post(_origin(state), "/", {}, name, decode=False)
                assert await resp.read() == bodies[name]  # as it came, to be relayed with its header
            with pytest.raises(UpstreamError, match="encoded with 'br'"):
                await client.post(_origin(state), "/", {}, b"br")
            assert await (await client.post(_origin(state), "/", {}, b"br", decode=False)).read() == bodies[b"br"]
            await client.aclose()

    asyncio.run(run())


def test_an_interim_response_is_skipped_and_a_broken_one_is_an_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _Server) -> None:
        while True:
            _, body = await _request(reader, state)
            if body == b"interim":
                writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" + _reply(b"final", headers=("x-final: yes",)))
            else:
                writer.write(b"SMTP ready\r\n\r\n")
            await writer.drain()


    async def run() -> None:
        async with _serve(handler) as state:
            client = _client()
            resp = await client.post(_origin(state), "/", {}, b"interim")
            assert resp.status == 200 and resp.raw_headers == [(b"content-length", b"5"), (b"x-final", b"yes")]
            assert await resp.read() == b"final"
            with pytest.raises(UpstreamError, match=r"not valid HTTP/1\.1"):
                await client.post(_origin(state), "/", {}, b"garbage")
            await client.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("headers", [{"x-evil": "a\r\nx-injected: 1"}, {"x\nbad": "1"}, {"x-name:": "1"}, {"x-text": "naïve ☃"}])
def test_a_header_that_cannot_be_sent_safely_is_refused_before_connecting(headers: dict[str, str]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _Server) -> None:
        await reader.read()

    async def run() -> None:
        async with _serve(handler) as state:
            client = _client()
            with pytest.raises(UpstreamError, match="cannot be sent"):
                await client.post(_origin(state), "/", headers, b"x")
            assert state.connections == 0 and client.open == 0

    asyncio.run(run())


def test_large_bodies_both_ways_with_flow_control() -> None:
    big = bytes(range(256)) * (8 * 4096)  # 8 MiB

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _Server) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        got = bytearray()
        while len(got) < length:
            got += await reader.read(65536)
            await asyncio.sleep(0)  # a slow reader: the client's writes wait for it
        assert bytes(got) == big
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for k in range(0, len(big), 1 << 16):
            writer.write(b"%x\r\n%s\r\n" % (1 << 16, big[k : k + (1 << 16)]))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async def run() -> None:
        async with _serve(handler) as state:
            client = _client()
            resp = await client.post(_origin(state), "/", {}, big)
            out = bytearray()
            most = 0
            async for chunk in resp.stream():
                out += chunk
                most = max(most, resp._buffered)
                await asyncio.sleep(0.001)  # a slow consumer: reading the socket pauses
            assert bytes(out) == big
            assert most <= h1._HIGH_WATER + (1 << 18)  # bounded, not the whole 8 MiB
            await resp.aclose()
            await client.aclose()

    asyncio.run(run())


def test_a_response_left_unread_closes_its_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _Server) -> None:
        while True:
            await _request(reader, state)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
            await writer.drain()


    async def run() -> None:
        async with _serve(handler) as state:
            client = _client()
            resp = await client.post(_origin(state), "/", {}, b"a")
            stream = resp.stream()
            assert await stream.__anext__() == b"first"
            await resp.aclose()  # the client went: the rest is never read
            resp = await client.post(_origin(state), "/", {}, b"b")
            assert await resp.read() == b"firstsecond"
            assert state.connections == 2
            await client.aclose()

    asyncio.run(run())


def test_connecting_fails_clearly() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def run() -> None:
        client = _client()
        with pytest.raises(UpstreamError, match=f"cannot connect to 127.0.0.1:{port}"):
            await client.post(("http", "127.0.0.1", port), "/", {}, b"x")
        assert client.open == 0

    asyncio.run(run())


def test_https_with_the_servers_name_checked() -> None:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_ctx)
    trusted = ssl.create_default_context()
    ca.configure_trust(trusted)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _Server) -> None:
        while True:
            _, body = await _request(reader, state)
            writer.write(_reply(b"secure " + body))
            await writer.drain()


    async def run() -> None:
        async with _serve(handler, ssl_context=server_ctx) as state:
            client = _client(ssl_context=trusted)
            for k in range(2):
                resp = await client.post(("https", "localhost", state.port), "/v1/messages", {}, b"%d" % k)
                assert await resp.read() == b"secure %d" % k
            assert state.connections == 1
            assert state.requests[0][0].split(b"\r\n")[1] == b"Host: localhost:%d" % state.port
            await client.aclose()
            stranger = _client(ssl_context=ssl.create_default_context())  # does not trust the CA
            with pytest.raises(UpstreamError, match="cannot connect"):
                await stranger.post(("https", "localhost", state.port), "/", {}, b"x")

    asyncio.run(run())


def test_the_host_line_for_default_ports_and_ipv6() -> None:
    assert h1._request_line(("https", "api.anthropic.com", 443), "/v1/messages") == b"POST /v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\n"
    assert h1._request_line(("http", "::1", 8080), "/x") == b"POST /x HTTP/1.1\r\nHost: [::1]:8080\r\n"
    assert h1._request_line(("http", "example.com", 80), "/") == b"POST / HTTP/1.1\r\nHost: example.com\r\n"


def test_the_upstream_hands_direct_posts_to_the_lean_client_and_the_rest_to_aiohttp(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _Server) -> None:
        while True:
            head, _ = await _request(reader, state)
            writer.write(_reply(head.split(b" ")[0]))
            await writer.drain()


    async def run() -> None:
        async with _serve(handler) as state:
            up = AiohttpUpstream(timeout=5, connect_timeout=5)
            base = f"http://127.0.0.1:{state.port}"
            try:
                resp = await up.send("POST", base + "/v1/chat/completions", {"content-type": "application/json"}, b"{}")
                assert isinstance(resp, h1.H1Response) and await resp.read() == b"POST"
                head = state.requests[-1][0].lower()
                assert b"\r\naccept: */*\r\n" in head and b"\r\nuser-agent: ctxengine-proxy/" in head  # what aiohttp would add
                resp2 = await up.send("GET", base + "/v1/models", {}, None)
                assert not isinstance(resp2, h1.H1Response) and await resp2.read() == b"GET"
                monkeypatch.setattr(up._h1, "max_connections", 0)  # the lean pool at its limit
                resp3 = await up.send("POST", base + "/v1/chat/completions", {}, b"{}")
                assert not isinstance(resp3, h1.H1Response) and await resp3.read() == b"POST"
            finally:
                await up.aclose()

    asyncio.run(run())
    # an upstream behind an environment proxy goes through aiohttp (which speaks to the proxy)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")

    async def via_proxy() -> None:
        up = AiohttpUpstream(timeout=2, connect_timeout=2)
        calls: list[Any] = []
        monkeypatch.setattr(up._h1, "post", lambda *a, **k: calls.append(a))
        try:
            with pytest.raises(UpstreamError):  # aiohttp could not reach the (absent) environment proxy
                await up.send("POST", "http://upstream.example/v1/chat/completions", {}, b"{}")
        finally:
            await up.aclose()
        assert calls == []

    asyncio.run(via_proxy())


def test_the_upstreams_https_requests_trust_ssl_cert_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """What the README promises for every upstream request: certificates checked against the
    system store, or the one ``SSL_CERT_FILE`` names (read when the client is made)."""
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_ctx)
    pem = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(pem))
    for name in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _Server) -> None:
        while True:
            await _request(reader, state)
            writer.write(_reply(b"trusted"))
            await writer.drain()


    async def run(trust: bool) -> None:
        if trust:
            monkeypatch.setenv("SSL_CERT_FILE", str(pem))
        else:
            monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        async with _serve(handler, ssl_context=server_ctx) as state:
            up = AiohttpUpstream(timeout=5, connect_timeout=5)
            try:
                if trust:
                    resp = await up.send("POST", f"https://localhost:{state.port}/v1/messages", {}, b"{}")
                    assert isinstance(resp, h1.H1Response) and await resp.read() == b"trusted"
                else:
                    with pytest.raises(UpstreamError, match="certificate verify failed"):
                        await up.send("POST", f"https://localhost:{state.port}/v1/messages", {}, b"{}")
            finally:
                await up.aclose()

    asyncio.run(run(trust=True))
    asyncio.run(run(trust=False))
