"""A scriptable OpenAI- and Anthropic-compatible HTTP server on 127.0.0.1, for tests.

Point any OpenAI SDK (``base_url=server.openai_base_url``) or Anthropic SDK
(``base_url=server.anthropic_base_url``) at it, script what each call returns, and read back
what was sent::

    from ctxengine.testing.stub_server import StubReply, StubServer

    with StubServer([StubReply.rate_limited(), StubReply.ok(summary_text)]) as server:
        ...  # the first call gets a 429, the SDK retries, the second gets the summary
        assert len(server.requests) == 2

Replies are consumed one per call, in order; when the script runs out, ``default`` answers
(or ``responder(request)`` decides, for dynamic behaviour). Error bodies follow each API's
shape, so the official SDKs raise their usual exception classes. Nothing leaves the machine.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["RecordedRequest", "StubReply", "StubServer"]

_OPENAI_ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_api_key", 403: "permission_denied", 404: "not_found", 429: "rate_limit_exceeded"}
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


@dataclass(slots=True)
class StubReply:
    """What one call gets back.

    ``text=None`` sends an empty reply (``content: null`` / no text block). ``status`` ≥ 400
    sends an error with ``error`` as its message. ``delay`` (seconds) is waited before
    answering, to exercise timeouts. ``finish_reason="length"`` marks a reply cut at
    ``max_tokens``. ``headers`` are added to the response (``retry-after-ms`` …).
    """

    text: str | None = "ok"
    status: int = 200
    error: str = ""
    delay: float = 0.0
    finish_reason: str = "stop"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def ok(cls, text: str, *, delay: float = 0.0) -> StubReply:
        return cls(text=text, delay=delay)

    @classmethod
    def empty(cls) -> StubReply:
        return cls(text=None)

    @classmethod
    def truncated(cls, text: str) -> StubReply:
        return cls(text=text, finish_reason="length")

    @classmethod
    def fail(cls, status: int = 500, message: str = "internal error", *, retry_after_ms: int | None = 1) -> StubReply:
        """An error reply. ``retry_after_ms`` keeps SDK backoff short in tests (None: no header)."""
        headers = {"retry-after-ms": str(retry_after_ms)} if retry_after_ms is not None else {}
        return cls(text=None, status=status, error=message, headers=headers)

    @classmethod
    def rate_limited(cls, retry_after_ms: int = 1) -> StubReply:
        return cls.fail(429, "rate limit exceeded", retry_after_ms=retry_after_ms)

    @classmethod
    def unauthorized(cls) -> StubReply:
        return cls.fail(401, "invalid api key", retry_after_ms=None)

    @classmethod
    def context_too_long(cls) -> StubReply:
        return cls.fail(400, "This model's maximum context length is 8192 tokens; your prompt is too long", retry_after_ms=None)

    @classmethod
    def slow(cls, text: str, delay: float) -> StubReply:
        return cls(text=text, delay=delay)


@dataclass(slots=True)
class RecordedRequest:
    """One request the server received (``api`` is ``"openai"`` or ``"anthropic"``)."""

    api: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    received_at: float

    @property
    def prompt_text(self) -> str:
        """All message text of the request (system included), for assertions."""
        parts: list[str] = []
        system = self.body.get("system")
        if isinstance(system, str):
            parts.append(system)
        for m in self.body.get("messages") or []:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                parts.append(c)
            elif isinstance(c, list):
                parts.extend(str(p.get("text", "")) for p in c if isinstance(p, dict))
        return "\n".join(parts)


Responder = Callable[[RecordedRequest], StubReply]


class StubServer:
    """The server (see the module docstring). Use as a context manager or call
    :meth:`start` / :meth:`stop`."""

    def __init__(
        self,
        replies: Iterable[StubReply] = (),
        *,
        default: StubReply | None = None,
        responder: Responder | None = None,
    ) -> None:
        self._script: deque[StubReply] = deque(replies)
        self.default = default or StubReply()
        self.responder = responder
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- scripting --------------------------------------------------------------------------------
    def script(self, *replies: StubReply) -> None:
        """Append replies to the script."""
        with self._lock:
            self._script.extend(replies)

    def _next(self, request: RecordedRequest) -> StubReply:
        with self._lock:
            self.requests.append(request)
            if self._script:
                return self._script.popleft()
        if self.responder is not None:
            return self.responder(request)
        return self.default

    @property
    def calls(self) -> int:
        return len(self.requests)

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the stub server is not running")
        return int(self._httpd.server_address[1])

    @property
    def openai_base_url(self) -> str:
        """``base_url`` for the OpenAI SDK (…/v1)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """``base_url`` for the Anthropic SDK (it appends /v1/messages)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> StubServer:
        if self._httpd is not None:
            return self
        server = self

        class Handler(_Handler):
            stub = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="ctxengine-stub-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    stub: StubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        return

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_raw": raw.decode("utf-8", "replace")}
        path = self.path.split("?", 1)[0]
        if path.endswith("/chat/completions"):
            api = "openai"
        elif path.endswith("/messages"):
            api = "anthropic"
        else:
            self._send(404, {"error": {"message": f"no route for {path}", "type": "not_found"}}, {})
            return
        request = RecordedRequest(api, path, {k.lower(): v for k, v in self.headers.items()}, body if isinstance(body, dict) else {}, time.time())
        reply = self.stub._next(request)
        if reply.delay > 0:
            time.sleep(reply.delay)
        model = str(request.body.get("model", "stub-model"))
        n = len(self.stub.requests)
        if reply.status >= 400:
            self._send(reply.status, _error_body(api, reply), reply.headers)
        elif api == "openai":
            self._send(200, _openai_body(reply, model, n, request), reply.headers)
        else:
            self._send(200, _anthropic_body(reply, model, n, request), reply.headers)

    def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
        data = json.dumps(payload).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
            pass


def _tokens(request: RecordedRequest) -> int:
    return max(1, len(request.prompt_text) // 4)


def _error_body(api: str, reply: StubReply) -> dict[str, Any]:
    if api == "anthropic":
        etype = _ANTHROPIC_ERROR_TYPES.get(reply.status, "api_error")
        return {"type": "error", "error": {"type": etype, "message": reply.error}}
    etype = _OPENAI_ERROR_TYPES.get(reply.status, "server_error")
    return {"error": {"message": reply.error, "type": etype, "param": None, "code": etype}}


def _openai_body(reply: StubReply, model: str, n: int, request: RecordedRequest) -> dict[str, Any]:
    out_tokens = len(reply.text or "") // 4
    return {
        "id": f"chatcmpl-stub-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply.text},
                "finish_reason": reply.finish_reason,
            }
        ],
        "usage": {"prompt_tokens": _tokens(request), "completion_tokens": out_tokens, "total_tokens": _tokens(request) + out_tokens},
    }


def _anthropic_body(reply: StubReply, model: str, n: int, request: RecordedRequest) -> dict[str, Any]:
    stop = "max_tokens" if reply.finish_reason == "length" else "end_turn"
    content = [{"type": "text", "text": reply.text}] if reply.text else []
    return {
        "id": f"msg_stub_{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": _tokens(request), "output_tokens": len(reply.text or "") // 4},
    }
