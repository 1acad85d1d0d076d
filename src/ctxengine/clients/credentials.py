"""Credentials written into a ``base_url`` never reach a client library.

``http://user:password@host/v1`` and ``https://host/v1?api_key=…`` are convenient to configure
and dangerous to hand to an SDK: the SDK and its HTTP library print the URL they were given in
their own log lines (``HTTP Request: POST http://user:password@host/v1/chat/completions``, at
INFO and DEBUG), where no redaction of ours runs. So the URL is split before any client is
built: the SDK gets the bare URL, and the credentials are added by a wrapper around the HTTP
library's transport, the layer below every log line, to requests for the configured origin
only (a redirect to another host never carries them):

* ``user:password@`` becomes ``Authorization: Basic …`` (what the HTTP library does with a
  URL's user part itself: it replaces the SDK's bearer header).
* The query string (a URL's query is where keys go: ``?key=``, ``?api-version=&api-key=``) is
  appended to each request's URL; an SDK would otherwise put its own path after the query.

The password and every query value that names a key are registered secrets
(:func:`ctxengine.redact.register_secret`), so they are redacted wherever else they appear.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from ctxengine.errors import SummarizerError
from ctxengine.redact import register_secret

__all__ = ["UrlCredentials", "http_client_for", "split_credentials"]

_KEY_PARAMS = frozenset(
    ("key", "api_key", "apikey", "api-key", "access_token", "token", "auth", "sig", "signature", "password", "passwd", "pwd", "secret", "client_secret", "x-api-key", "code")
)


@dataclass(frozen=True, slots=True)
class UrlCredentials:
    """What was taken out of a URL: the origin it belongs to, an ``Authorization`` header
    value (from ``user:password@``) and query parameters, in order."""

    scheme: str
    host: str
    port: int | None
    authorization: str | None
    query: tuple[tuple[str, str], ...]


def split_credentials(url: str | None) -> tuple[str | None, UrlCredentials | None]:
    """``url`` without its user part and query string, and what they carried (``None`` when
    the URL carries neither)."""
    if not url:
        return url, None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return url, None  # not a URL the SDK could use either: its own error names it
    if parts.username is None and parts.password is None and not parts.query:
        return url, None
    authorization = None
    if parts.username is not None or parts.password is not None:
        user, password = unquote(parts.username or ""), unquote(parts.password or "")
        register_secret(password)
        authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    query = tuple(parse_qsl(parts.query, keep_blank_values=True))
    for name, value in query:
        if name.lower() in _KEY_PARAMS:
            register_secret(value)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc = f"{netloc}:{port}"
    bare = urlunsplit((parts.scheme, netloc, parts.path, "", parts.fragment))
    return bare, UrlCredentials(parts.scheme.lower(), host.lower(), port, authorization, query)


class _Injecting:
    """Wraps an HTTP library transport: adds the credentials to each request for their origin
    while it is sent, then takes them off again (the library logs the request afterwards)."""

    def __init__(self, inner: Any, creds: UrlCredentials) -> None:
        self._inner = inner
        self._creds = creds

    def _ours(self, url: Any) -> bool:
        c = self._creds
        return str(url.scheme).lower() == c.scheme and str(url.host).lower() == c.host and url.port == c.port

    def handle_request(self, request: Any) -> Any:
        if not self._ours(request.url):
            return self._inner.handle_request(request)
        url, had_auth = request.url, request.headers.get("authorization")
        try:
            if self._creds.query:
                request.url = url.copy_merge_params(list(self._creds.query))
            if self._creds.authorization:
                request.headers["authorization"] = self._creds.authorization
            return self._inner.handle_request(request)
        finally:
            request.url = url
            if self._creds.authorization:
                if had_auth is None:
                    del request.headers["authorization"]
                else:
                    request.headers["authorization"] = had_auth

    def close(self) -> None:
        self._inner.close()

    def __enter__(self) -> _Injecting:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._inner.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def http_client_for(sdk: Any, creds: UrlCredentials | None) -> Any:
    """An HTTP client for an SDK (``openai`` or ``anthropic``, whose ``DefaultHttpxClient``
    keeps the SDK's own defaults: limits, redirects, proxies from the environment) that adds
    ``creds`` below its logging; ``None`` (the SDK's own client) when there are none."""
    if creds is None:
        return None
    client = sdk.DefaultHttpxClient()
    if not hasattr(client, "_transport") or not isinstance(getattr(client, "_mounts", None), dict):
        client.close()  # an HTTP library whose client is built differently: never send the URL's credentials unnoticed
        raise SummarizerError(f"this version of {sdk.__name__}'s HTTP client cannot take credentials from base_url: move them to an API key variable")
    client._transport = _Injecting(client._transport, creds)
    client._mounts = {k: (None if t is None else _Injecting(t, creds)) for k, t in client._mounts.items()}
    return client
