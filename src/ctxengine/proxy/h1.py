"""A lean HTTP/1.1 client for the proxy's chat requests (``POST`` to an upstream reached directly).

Why not aiohttp alone: per chat request, aiohttp's client runs about 0.5 M instructions of
Python between being handed the body and holding the response's head (a request object, its
header multidicts, cookie filtering, timers, tracing hooks, the connector's bookkeeping): a
third of everything the proxy did before the first streamed byte of a 10K-token turn. This
client does only what a chat request to a known upstream needs: a keep-alive connection pool
per origin, the request head and body written with one call, the response parsed by
``httptools`` (the C parser uvicorn uses, already a dependency of the proxy), its body handed
over chunk by chunk as it arrives: 0.19 M instructions from the request to its response's head
(aiohttp: 0.53 M), the first streamed byte of a proxied turn 0.3-0.5 ms sooner (measured side by
side, ``scripts/bench_proxy.py --only ttfb``). Anything else (another method, an upstream behind an
environment proxy, the pool at its limit) stays with aiohttp:
:class:`ctxengine.proxy.upstream.AiohttpUpstream` picks.

What it keeps of aiohttp's behaviour: the same timeouts (connecting; each wait for the head or
the next bytes), no redirects followed, no cookies kept, ``Host`` and ``Content-Length``
computed, a connection reused only after its response was read to its end, a ``gzip`` or
``deflate`` body decoded when asked, and no request sent twice (a ``POST`` is not idempotent:
an upstream that drops the connection fails the request). An idle pooled connection is reused
for 4 s at most, under the 5 s after which servers commonly close one (aiohttp's pool kept them
5 s). Every failure is an :class:`UpstreamError`.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import zlib
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import httptools

__all__ = ["H1Client", "H1Response", "UpstreamError"]

_HIGH_WATER = 1 << 20  # unread response bytes at which the socket stops being read
_LOW_WATER = 1 << 18  # and is read again
_MAX_HEAD = 64 * 1024  # a response head larger than this is refused
_IDLE_SECONDS = 4.0  # a pooled connection idle longer is not reused (servers often idle out at 5 s)
_IDLE_KEPT = 64  # idle connections kept per origin
_JOIN_BELOW = 64 * 1024  # a body this small goes out in one buffer with its head

Origin = tuple[str, str, int]  # scheme, host, port


class UpstreamError(Exception):
    """The upstream could not be reached, timed out, or broke off its response."""


class _Connection(asyncio.Protocol):
    """One connection: its transport, the response being read on it, write flow control."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client: H1Client) -> None:
        self.loop = loop
        self.client = client
        self.counted = True  # in ``client.open`` until :meth:`forget`
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.response: H1Response | None = None
        self._drain: asyncio.Future[None] | None = None
        self._paused_writing = False

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        resp = self.response
        if resp is None:  # bytes nobody asked for: the connection cannot be trusted any more
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            resp.fail(UpstreamError("the upstream switched protocols"))
            self.close()
        except httptools.HttpParserError as exc:
            resp.fail(UpstreamError(f"the upstream's response is not valid HTTP/1.1: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.forget()
        resp = self.response
        if resp is not None:
            resp.lost(exc)
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(UpstreamError("the connection closed while the request was written"))

    def pause_writing(self) -> None:
        self._paused_writing = True

    def resume_writing(self) -> None:
        self._paused_writing = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    async def drain(self) -> None:
        """Wait until the transport's write buffer is low again (a large request body)."""
        if self._paused_writing and not self.closed:
            self._drain = self.loop.create_future()
            try:
                await self._drain
            finally:
                self._drain = None

    # -- httptools' callbacks, for the response being read
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is not None:
            self.response.on_header(name, value)

    def on_headers_complete(self) -> None:
        if self.response is not None:
            self.response.on_headers_complete(self.parser.get_status_code(), self.parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response.on_body(body)

    def on_message_complete(self) -> None:
        if self.response is not None:
            self.response.on_message_complete()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()  # connection_lost follows
        else:
            self.forget()

    def forget(self) -> None:
        """No longer counted as open (once)."""
        if self.counted:
            self.counted = False
            self.client.open -= 1


class H1Response:
    """A response whose head is in (``status``, ``raw_headers``); its body is read with
    :meth:`read` or :meth:`stream`, then :meth:`aclose`: the connection goes back to the pool
    when the body was read to its end, else it is closed."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_client",
        "_conn",
        "_decoder",
        "_done",
        "_error",
        "_head",
        "_head_size",
        "_keep_alive",
        "_origin",
        "_paused",
        "_timeout",
        "_waiter",
        "raw_headers",
        "status",
    )

    def __init__(self, client: H1Client, origin: Origin, conn: _Connection, timeout: float) -> None:
        self._client = client
        self._origin = origin
        self._conn = conn
        self._timeout = timeout
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self._head: asyncio.Future[None] = conn.loop.create_future()
        self._head_size = 0
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self._error: BaseException | None = None
        self._keep_alive = False
        self._decoder: Any = None

    # -- fed by the connection
    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4
        if self._head_size > _MAX_HEAD:
            raise httptools.HttpParserError(f"a response head larger than {_MAX_HEAD} bytes")
        self.raw_headers.append((name, value))

    def on_headers_complete(self, status: int, keep_alive: bool) -> None:
        if 100 <= status < 200:  # an interim response (100 Continue, 103 Early Hints): the real one follows
            self.raw_headers = []
            self._head_size = 0
            return
        self.status = status
        self._keep_alive = keep_alive
        if not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if not self.status:
            return
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered >= _HIGH_WATER and not self._paused and self._conn.transport is not None:
            self._paused = True
            self._conn.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if not self.status:
            return  # an interim response's end
        self._done = True
        self._wake()

    def fail(self, exc: BaseException) -> None:
        if self._error is None and not self._done:
            self._error = exc
        if not self._head.done():
            self._head.set_exception(exc)
        self._wake()

    def lost(self, exc: Exception | None) -> None:
        """The connection closed: the end of a body delimited by it, else a failure."""
        if self._done:
            return
        if self.status and self._reads_to_close():
            self._done = True
            self._wake()
            return
        what = "in the middle of its response" if self.status else "before its response"
        self.fail(UpstreamError(f"the upstream closed the connection {what}" + (f" ({exc})" if exc else "")))

    def _reads_to_close(self) -> bool:
        names = {k.lower() for k, _ in self.raw_headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # -- the caller's side
    async def wait_head(self) -> None:
        await self._wait(self._head)

    async def _wait(self, fut: asyncio.Future[None], timeout: float | None = None) -> None:
        handle = self._conn.loop.call_later(self._timeout if timeout is None else timeout, _expire, fut)
        try:
            await fut
        finally:
            handle.cancel()

    def _take(self) -> bytes:
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._paused and self._buffered <= _LOW_WATER and self._conn.transport is not None:
            self._paused = False
            self._conn.transport.resume_reading()
        return chunk

    async def _next(self, until: float | None = None) -> bytes | None:
        """The body's next chunk as it came; ``None`` at its end. ``until`` (loop time): the
        whole body's deadline, on top of the wait for each chunk."""
        while True:
            if self._chunks:
                return self._take()
            if self._error is not None:
                raise self._error
            if self._done:
                return None
            wait = self._timeout
            if until is not None:
                wait = min(wait, until - self._conn.loop.time())
                if wait <= 0:
                    raise UpstreamError(f"the upstream's response body took longer than {self._timeout:g} s")
            self._waiter = self._conn.loop.create_future()
            try:
                await self._wait(self._waiter, wait)
            except TimeoutError:
                if until is not None and self._conn.loop.time() >= until:
                    raise UpstreamError(f"the upstream's response body took longer than {self._timeout:g} s") from None
                raise UpstreamError(f"no bytes from the upstream for {self._timeout:g} s") from None
            finally:
                self._waiter = None

    def decode_body(self) -> None:
        """Undo the body's ``content-encoding`` (gzip or deflate) as it is read."""
        encoding = b""
        for k, v in self.raw_headers:
            if k.lower() == b"content-encoding":
                encoding = v.strip().lower()
        if encoding in (b"", b"identity"):
            return
        if encoding in (b"gzip", b"x-gzip"):
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == b"deflate":
            self._decoder = _Deflate()
        else:
            raise UpstreamError(f"the upstream's response is encoded with {encoding.decode('latin-1')!r}, which the proxy cannot decode")

    def _decoded(self, chunk: bytes) -> bytes:
        if self._decoder is None:
            return chunk
        try:
            return bytes(self._decoder.decompress(chunk))
        except zlib.error as exc:
            raise UpstreamError(f"the upstream's response body does not decode: {exc}") from exc

    def _flushed(self) -> bytes:
        if self._decoder is None:
            return b""
        try:
            return bytes(self._decoder.flush())
        except zlib.error as exc:
            raise UpstreamError(f"the upstream's response body does not decode: {exc}") from exc

    async def read(self) -> bytes:
        """The whole body (then the connection goes back to the pool), within the timeout in
        all: a body read whole is what a client waits for without seeing a byte, so a server
        that trickles it (each byte resetting the wait for the next) must not hold it longer."""
        parts = []
        until = self._conn.loop.time() + self._timeout
        try:
            while (chunk := await self._next(until)) is not None:
                parts.append(self._decoded(chunk))
            parts.append(self._flushed())
        finally:
            self.release()
        return b"".join(parts)

    async def stream(self) -> AsyncIterator[bytes]:
        """The body in chunks, each as soon as it arrives."""
        while (chunk := await self._next()) is not None:
            out = self._decoded(chunk)
            if out:
                yield out
        tail = self._flushed()
        if tail:
            yield tail

    def release(self) -> None:
        """A body read to its end on a keep-alive connection returns the connection to the
        pool; anything else closes it."""
        conn = self._conn
        if conn.response is not self:
            return
        conn.response = None
        if self._done and not self._chunks and self._error is None and self._keep_alive and not conn.closed:
            self._client.put_back(self._origin, conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        self.release()


class _Deflate:
    """``deflate`` as servers send it: zlib-wrapped, or (some) raw."""

    def __init__(self) -> None:
        self._obj: Any = None

    def decompress(self, data: bytes) -> bytes:
        if self._obj is None:
            if not data:
                return b""
            raw = (data[0] & 0x0F) != 8  # a zlib stream's first byte names the deflate method
            self._obj = zlib.decompressobj(-zlib.MAX_WBITS if raw else zlib.MAX_WBITS)
        return bytes(self._obj.decompress(data))

    def flush(self) -> bytes:
        return bytes(self._obj.flush()) if self._obj is not None else b""


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


class H1Client:
    """Keep-alive connection pools per origin, one request at a time per connection."""

    def __init__(self, *, timeout: float, connect_timeout: float, ssl_context: ssl.SSLContext, max_connections: int = 256) -> None:
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.ssl_context = ssl_context
        self.max_connections = max_connections
        self.open = 0  # connections open or opening (idle or busy)
        self._idle: dict[Origin, list[_Connection]] = {}
        self._heads: dict[tuple[Origin, str], bytes] = {}  # request line and Host, per origin and target

    def full(self) -> bool:
        """Whether every connection allowed is open (a request then goes elsewhere)."""
        return self.open >= self.max_connections

    async def post(self, origin: Origin, target: str, headers: Mapping[str, str], content: bytes, *, decode: bool = True) -> H1Response:
        """``POST target`` (the path and query, encoded) with ``headers`` and ``content`` to
        ``origin``; returns once the response's head is in."""
        head = self._heads.get((origin, target))
        if head is None:
            head = self._heads[(origin, target)] = _request_line(origin, target)
            if len(self._heads) > 1024:
                self._heads = {(origin, target): head}
        lines = [head]
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name or not name:
                raise UpstreamError(f"header {name!r} cannot be sent: a line break or colon in it")
            try:
                lines.append(f"{name}: {value}\r\n".encode("latin-1"))
            except UnicodeEncodeError:
                raise UpstreamError(f"header {name!r} cannot be sent: not latin-1") from None
        lines.append(b"content-length: %d\r\n\r\n" % len(content))
        request = b"".join(lines)
        conn = await self._connection(origin)
        resp = H1Response(self, origin, conn, self.timeout)
        conn.response = resp
        try:
            await _write(conn, request, content)
            await resp.wait_head()
            if decode:
                resp.decode_body()
        except TimeoutError:
            conn.response = None
            conn.close()
            raise UpstreamError(f"no response head from the upstream within {self.timeout:g} s") from None
        except BaseException:
            # never sent again: the upstream may have acted on it (a POST is not idempotent)
            conn.response = None
            conn.close()
            raise
        return resp

    async def _connection(self, origin: Origin) -> _Connection:
        """A pooled connection to ``origin``, else a new one."""
        loop = asyncio.get_running_loop()
        idle = self._idle.get(origin)
        if idle:
            now = loop.time()
            while idle:
                conn = idle.pop()
                if not conn.closed and conn.transport is not None and not conn.transport.is_closing() and now - conn.idle_since < _IDLE_SECONDS:
                    return conn
                conn.close()
        scheme, host, port = origin
        conn = _Connection(loop, self)
        self.open += 1
        tls = scheme == "https"
        try:
            async with asyncio.timeout(self.connect_timeout):
                await loop.create_connection(lambda: conn, host, port, ssl=self.ssl_context if tls else None, server_hostname=host if tls else None)
        except TimeoutError:
            conn.close()
            raise UpstreamError(f"connecting to {host}:{port} timed out after {self.connect_timeout:g} s") from None
        except OSError as exc:
            conn.close()
            raise UpstreamError(f"cannot connect to {host}:{port}: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def put_back(self, origin: Origin, conn: _Connection) -> None:
        """``conn``, its response read to its end, to the pool."""
        idle = self._idle.setdefault(origin, [])
        if len(idle) >= _IDLE_KEPT:
            conn.close()
            return
        conn.idle_since = conn.loop.time()
        idle.append(conn)

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()


def _request_line(origin: Origin, target: str) -> bytes:
    scheme, host, port = origin
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    authority = host if port == (443 if scheme == "https" else 80) else f"{host}:{port}"
    return f"POST {target} HTTP/1.1\r\nHost: {authority}\r\n".encode("latin-1")


async def _write(conn: _Connection, request: bytes, content: bytes) -> None:
    transport = conn.transport
    if transport is None or conn.closed or transport.is_closing():
        raise UpstreamError("the connection closed before the request was written")
    if len(content) < _JOIN_BELOW:
        transport.write(request + content)
    else:
        transport.writelines((request, content))
    await conn.drain()
