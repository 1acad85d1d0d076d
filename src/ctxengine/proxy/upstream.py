"""The proxy's HTTP client towards its upstreams, behind one small interface.

:class:`Upstream` sends one request and returns its response as soon as the head is in
(:class:`UpstreamResponse`: status, raw headers, then the body read whole or streamed as it
arrives). Two implementations:

- :class:`AiohttpUpstream`, for real network upstreams (what ``ctxengine proxy`` uses): aiohttp's
  client parses HTTP/1.1 in C and hands a response over with fewer layers between the socket and
  the proxy. Relaying a 400 KB request to a loopback stub, it added about 1 ms less than httpx2's
  client per request, and reached the first streamed byte about 1 ms sooner (measured
  interleaved, medians of 5 runs × 40 requests, with a bare forwarder: issue 10). A ``POST`` to
  an upstream reached directly (every chat request, unless an environment proxy is set) goes
  through :class:`~ctxengine.proxy.h1.H1Client` instead, which does the same in about a third
  of aiohttp's instructions (0.19 M against 0.53 M per chat request; see its module);
- :class:`HttpxUpstream`, over an ``httpx.AsyncBaseTransport`` that a test or an embedding
  program injects (``Proxy(transport=...)``), so an in-process fake upstream keeps working.

Both behave alike: no redirects followed, no cookies kept, connections kept alive and pooled,
the same timeouts, proxies from the environment (``HTTP_PROXY``, ``HTTPS_PROXY``,
``ALL_PROXY``, ``NO_PROXY``) and the same certificate store as httpx (``SSL_CERT_FILE`` and
``SSL_CERT_DIR`` honoured). ``decode=True`` gives the body with its ``content-encoding`` undone
(what the proxy parses); ``decode=False`` gives its bytes as they came (what it relays
verbatim). Every failure to reach or read the upstream is an :class:`UpstreamError`.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import aiohttp
import httpx2 as httpx
from yarl import URL

from ctxengine import __version__
from ctxengine.proxy.h1 import H1Client, UpstreamError

__all__ = ["AiohttpUpstream", "HttpxUpstream", "Upstream", "UpstreamError", "UpstreamResponse"]

Headers = Mapping[str, str]
RawHeaders = list[tuple[bytes, bytes]]


_URLS_KEPT = 1024  # distinct upstream URLs remembered (parsed) before starting over


class UpstreamResponse(Protocol):
    """A response whose head is in; its body is read with :meth:`read` or :meth:`stream`."""

    @property
    def status(self) -> int: ...

    @property
    def raw_headers(self) -> RawHeaders:
        """The response's headers as sent (name and value bytes, repeated names kept)."""
        ...

    async def read(self) -> bytes:
        """The whole body (then the connection goes back to the pool)."""
        ...

    def stream(self) -> AsyncIterator[bytes]:
        """The body in chunks, each as soon as it arrives."""
        ...

    async def aclose(self) -> None:
        """Done with the response: a body not read to its end closes the connection."""
        ...


class Upstream(Protocol):
    async def send(self, method: str, url: str, headers: Headers, content: bytes | None, *, decode: bool = True) -> UpstreamResponse:
        """Send a request; return once the response's head is in."""
        ...

    async def aclose(self) -> None: ...


# -- aiohttp (the network) ------------------------------------------------------------------------
class _AiohttpResponse:
    __slots__ = ("_resp", "_timeout")

    def __init__(self, resp: aiohttp.ClientResponse, timeout: float) -> None:
        self._resp = resp
        self._timeout = timeout

    @property
    def status(self) -> int:
        return self._resp.status

    @property
    def raw_headers(self) -> RawHeaders:
        return list(self._resp.raw_headers)

    async def read(self) -> bytes:
        try:
            async with asyncio.timeout(self._timeout):  # the whole body (see H1Response.read)
                return await self._resp.read()
        except TimeoutError:
            raise UpstreamError(f"the upstream's response body took longer than {self._timeout:g} s") from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(_describe(exc)) from exc
        finally:
            self._resp.release()

    async def stream(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamError(_describe(exc)) from exc

    async def aclose(self) -> None:
        if self._resp.content.at_eof():
            self._resp.release()  # back to the pool
        else:
            self._resp.close()  # a body left unread: that connection cannot be reused


class AiohttpUpstream:
    """Upstream requests through one :class:`aiohttp.ClientSession` (create it on the event loop
    that serves the proxy).

    ``timeout`` bounds connecting (``connect_timeout``), waiting for a pooled connection, and
    each wait for the response's head or its next bytes, as httpx's timeout did; the whole
    response has no limit (a long stream is fine while it moves).
    """

    def __init__(self, *, timeout: float, connect_timeout: float, max_connections: int = 256) -> None:
        context = httpx.create_ssl_context()
        connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, ssl=context, keepalive_timeout=5.0)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, connect=timeout, sock_connect=connect_timeout, sock_read=timeout),
            auto_decompress=True,
            # the environment's proxies are read once per upstream origin (_proxy_for), not per
            # request as trust_env=True would (two worker-thread hops each); no netrc either
            trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(),  # the clients' cookies are theirs: never kept here
            # a request without a content-type goes without one (aiohttp would add octet-stream)
            skip_auto_headers=("Content-Type",),
            # a response head as large as httpx's parser took (16 KB), not aiohttp's 8 KB lines
            max_line_size=16_384,
            max_field_size=16_384,
        )
        self._proxies: dict[str, tuple[URL | None, aiohttp.BasicAuth | None]] = {}
        # each URL parsed once: a chat endpoint is the same URL every request, and yarl keeps
        # what aiohttp reads from it (host, port, origin, path) on the object
        self._urls: dict[str, URL] = {}
        # a POST to an upstream reached directly goes through the lean client (see its module)
        self._timeout = timeout
        self._h1 = H1Client(timeout=timeout, connect_timeout=connect_timeout, ssl_context=context, max_connections=max_connections)

    async def send(self, method: str, url: str, headers: Headers, content: bytes | None, *, decode: bool = True) -> UpstreamResponse:
        target = self._urls.get(url)
        if target is None:
            if len(self._urls) >= _URLS_KEPT:
                self._urls.clear()
            # the path and query exactly as the client sent them
            target = self._urls[url] = URL(url, encoded=True)
        proxy, proxy_auth = self._proxy_for(target)
        if method == "POST" and content is not None and proxy is None and target.host and target.scheme in ("http", "https") and not self._h1.full():
            return await self._h1.post((target.scheme, target.host, target.port or 0), target.raw_path_qs, _with_defaults(headers), content, decode=decode)
        try:
            resp = await self._session.request(
                method,
                target,
                data=content,
                headers=headers,
                allow_redirects=False,
                auto_decompress=decode,
                proxy=proxy,
                proxy_auth=proxy_auth,
            )
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamError(_describe(exc)) from exc
        return _AiohttpResponse(resp, self._timeout)

    def _proxy_for(self, url: URL) -> tuple[URL | None, aiohttp.BasicAuth | None]:
        origin = f"{url.scheme}://{url.host}:{url.port}"
        found = self._proxies.get(origin)
        if found is None:
            found = self._proxies[origin] = _env_proxy(url)
        return found

    async def aclose(self) -> None:
        await self._h1.aclose()
        await self._session.close()


def _with_defaults(headers: Headers) -> Headers:
    """``headers`` with what aiohttp would add when they lack it (``Accept``, ``User-Agent``)."""
    names = {k.lower() for k in headers}
    if "accept" in names and "user-agent" in names:
        return headers
    out = dict(headers)
    if "accept" not in names:
        out["Accept"] = "*/*"
    if "user-agent" not in names:
        out["User-Agent"] = _USER_AGENT
    return out


_USER_AGENT = f"ctxengine-proxy/{__version__}"


def _env_proxy(url: URL) -> tuple[URL | None, aiohttp.BasicAuth | None]:
    """The proxy the environment names for ``url`` (``NO_PROXY`` respected), if any."""
    proxies = urllib.request.getproxies()
    chosen = proxies.get(url.scheme or "http") or proxies.get("all")
    if not chosen or (url.host and urllib.request.proxy_bypass(url.host)):
        return None, None
    proxy = URL(chosen if "://" in chosen else "http://" + chosen)
    auth = aiohttp.BasicAuth.from_url(proxy)
    return proxy.with_user(None), auth


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# -- httpx (an injected transport) --------------------------------------------------------------------
class _HttpxResponse:
    __slots__ = ("_decode", "_resp", "_timeout")

    def __init__(self, resp: httpx.Response, decode: bool, timeout: float) -> None:
        self._resp = resp
        self._decode = decode
        self._timeout = timeout

    @property
    def status(self) -> int:
        return self._resp.status_code

    @property
    def raw_headers(self) -> RawHeaders:
        return list(self._resp.headers.raw)

    async def read(self) -> bytes:
        try:
            async with asyncio.timeout(self._timeout):  # the whole body (see H1Response.read)
                if self._decode:
                    return await self._resp.aread()
                return b"".join([chunk async for chunk in self._resp.aiter_raw()])
        except TimeoutError:
            raise UpstreamError(f"the upstream's response body took longer than {self._timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise UpstreamError(_describe(exc)) from exc
        finally:
            await self._resp.aclose()

    async def stream(self) -> AsyncIterator[bytes]:
        chunks = self._resp.aiter_bytes() if self._decode else self._resp.aiter_raw()
        try:
            async for chunk in chunks:
                yield chunk
        except httpx.HTTPError as exc:
            raise UpstreamError(_describe(exc)) from exc

    async def aclose(self) -> None:
        await self._resp.aclose()


class HttpxUpstream:
    """Upstream requests through an :class:`httpx.AsyncClient` over ``transport``."""

    def __init__(self, transport: httpx.AsyncBaseTransport, *, timeout: float, connect_timeout: float) -> None:
        self._timeout = timeout
        self._client = httpx.AsyncClient(
            transport=transport, timeout=httpx.Timeout(timeout, connect=connect_timeout), follow_redirects=False
        )

    async def send(self, method: str, url: str, headers: Headers, content: bytes | None, *, decode: bool = True) -> _HttpxResponse:
        try:
            req = self._client.build_request(method, url, content=content, headers=headers)
            return _HttpxResponse(await self._client.send(req, stream=True), decode, self._timeout)
        except httpx.HTTPError as exc:
            raise UpstreamError(_describe(exc)) from exc

    async def aclose(self) -> None:
        await self._client.aclose()

