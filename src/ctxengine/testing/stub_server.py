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

A request with ``"stream": true`` is answered with server-sent events in each API's shape
(OpenAI chunks ending in ``[DONE]``; Anthropic ``message_start`` … ``message_stop``), the text
split into ``StubReply.chunks`` pieces sent ``chunk_delay`` seconds apart, so streaming
clients and relays can be tested. ``StubReply.tool_calls`` makes the reply call tools.
Besides the two chat routes the server answers ``POST /v1/responses`` (a minimal Responses
API reply), ``POST /v1/messages/count_tokens``, ``GET /v1/models`` and the Gemini API
(``/v1beta/models/{model}:generateContent``, ``:streamGenerateContent``, ``:countTokens``; see
:mod:`ctxengine.testing.gemini_stub`): ``server.gemini_base_url``.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ctxengine.testing import gemini_stub

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
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """Tools the reply calls: ``{"name": ..., "arguments": {...}}`` each (ids are generated)."""
    usage: dict[str, int] = field(default_factory=dict)
    """Usage fields added to (or replacing) the computed ones, e.g. ``cache_read_input_tokens``."""
    chunks: int = 4
    """Pieces the text is split into when streaming."""
    chunk_delay: float = 0.0
    """Seconds between two streamed events."""
    trickle: float = 0.0
    reset: bool = False
    raw_body: bytes | None = None
    echo_auth: bool = False

    @classmethod
    def ok(cls, text: str, *, delay: float = 0.0) -> StubReply:
        return cls(text=text, delay=delay)

    @classmethod
    def calling(cls, *calls: tuple[str, dict[str, Any]], text: str | None = None) -> StubReply:
        """A reply that calls tools: ``StubReply.calling(("read_file", {"path": "a.py"}))``."""
        return cls(text=text, finish_reason="tool_calls", tool_calls=[{"name": n, "arguments": a} for n, a in calls])

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
    """One request the server received (``api`` is ``"openai"``, ``"anthropic"`` or ``"gemini"``)."""

    api: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    received_at: float
    raw: bytes = b""
    """The request body exactly as received."""
    query: str = ""
    """The request's query string (without ``?``)."""

    @property
    def prompt_text(self) -> str:
        """All message text of the request (system included), for assertions."""
        if "contents" in self.body:
            return gemini_stub.contents_text(self.body)
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
        self.counted: list[RecordedRequest] = []  # the token-count requests (not in ``requests``)
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

    @property
    def gemini_base_url(self) -> str:
        """The base URL for a Gemini SDK or Gemini CLI (``GOOGLE_GEMINI_BASE_URL``)."""
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
    # headers and body go out in two writes: without TCP_NODELAY the second waits for the
    # peer's delayed ACK (~40 ms), which would swamp any latency measured through the stub
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        return

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path.endswith("/models"):
            self._send(200, {"object": "list", "data": [{"id": "stub-model", "object": "model", "created": 0, "owned_by": "stub"}]}, {})
        else:
            self._send(404, {"error": {"message": f"no route for GET {path}", "type": "not_found"}}, {})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_raw": raw.decode("utf-8", "replace")}
        path = self.path.split("?", 1)[0]
        headers = {k.lower(): v for k, v in self.headers.items()}
        if path.endswith("/messages/count_tokens"):
            req = RecordedRequest("anthropic", path, headers, body if isinstance(body, dict) else {}, time.time(), raw)
            with self.stub._lock:
                self.stub.counted.append(req)
            self._send(200, {"input_tokens": _tokens(req)}, {})
            return
        if path.endswith("/responses"):
            req = RecordedRequest("openai", path, headers, body if isinstance(body, dict) else {}, time.time(), raw)
            with self.stub._lock:
                self.stub.requests.append(req)
            self._send(200, _responses_body(req), {})
            return
        model = ""
        if ":" in path.rsplit("/", 1)[-1] and "/models/" in path:
            model = self._gemini_model(path, headers, body, raw)
            if not model:
                return
            api = "gemini"
        elif path.endswith("/chat/completions"):
            api = "openai"
        elif path.endswith("/messages"):
            api = "anthropic"
        else:
            self._send(404, {"error": {"message": f"no route for {path}", "type": "not_found"}}, {})
            return
        query = self.path.split("?", 1)[1] if "?" in self.path else ""
        request = RecordedRequest(api, path, headers, body if isinstance(body, dict) else {}, time.time(), raw, query)
        reply = self.stub._next(request)
        if reply.delay > 0:
            time.sleep(reply.delay)
        if reply.reset:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(2)  # socket.SHUT_RDWR
            return
        model = model or str(request.body.get("model", "stub-model"))
        n = len(self.stub.requests)
        if reply.echo_auth:
            creds = " ".join(f"{k}: {v}" for k, v in request.headers.items() if k in ("authorization", "x-api-key", "api-key"))
            reply = StubReply(text=None, status=reply.status if reply.status >= 400 else 401, error=f"{reply.error} (you sent {creds})".strip(), headers=reply.headers)
        self._answer(api, reply, request, model, n)

    def _answer(self, api: str, reply: StubReply, request: RecordedRequest, model: str, n: int) -> None:
        """Send ``reply`` to ``request`` in its API's shape."""
        if reply.raw_body is not None:
            self._send_bytes(reply.status, reply.raw_body, reply.headers, reply.trickle)
        elif reply.status >= 400:
            self._send(reply.status, _error_body(api, reply), reply.headers, reply.trickle)
        elif api == "gemini":
            if request.path.endswith(":streamGenerateContent"):
                self._stream(gemini_stub.events(reply, request, model), reply)
            else:
                self._send(200, gemini_stub.body(reply, request, model), reply.headers, reply.trickle)
        elif request.body.get("stream") is True:
            events = _openai_events(reply, model, n, request) if api == "openai" else _anthropic_events(reply, model, n, request)
            self._stream(events, reply)
        elif api == "openai":
            self._send(200, _openai_body(reply, model, n, request), reply.headers, reply.trickle)
        else:
            self._send(200, _anthropic_body(reply, model, n, request), reply.headers, reply.trickle)

    def _gemini_model(self, path: str, headers: dict[str, str], body: Any, raw: bytes) -> str:
        """The model a Gemini path names; "" when the request was answered here (``countTokens``)."""
        model, method = path.rsplit("/", 1)[-1].rsplit(":", 1)
        if method != "countTokens":
            return model
        req = RecordedRequest("gemini", path, headers, body if isinstance(body, dict) else {}, time.time(), raw)
        with self.stub._lock:
            self.stub.counted.append(req)
        self._send(200, gemini_stub.count(req), {})
        return ""

    def _stream(self, events: list[bytes], reply: StubReply) -> None:
        try:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("transfer-encoding", "chunked")
            for k, v in reply.headers.items():
                self.send_header(k, v)
            self.end_headers()
            for i, event in enumerate(events):
                if i and reply.chunk_delay > 0:
                    time.sleep(reply.chunk_delay)
                self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str], trickle: float = 0.0) -> None:
        self._send_bytes(status, json.dumps(payload).encode("utf-8"), headers, trickle)

    def _send_bytes(self, status: int, data: bytes, headers: dict[str, str], trickle: float = 0.0) -> None:
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if trickle > 0:
                # bounded: a trickle stops when the client has gone or after 120 s
                stop = time.monotonic() + 120.0
                for i in range(len(data)):
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()
                    if time.monotonic() > stop:
                        break
                    time.sleep(trickle)
            else:
                self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError, OSError):  # the client gave up (timeout test)
            self.close_connection = True


def _tokens(request: RecordedRequest) -> int:
    return max(1, len(request.prompt_text) // 4)


def _error_body(api: str, reply: StubReply) -> dict[str, Any]:
    if api == "gemini":
        return gemini_stub.error_body(reply)
    if api == "anthropic":
        etype = _ANTHROPIC_ERROR_TYPES.get(reply.status, "api_error")
        return {"type": "error", "error": {"type": etype, "message": reply.error}}
    etype = _OPENAI_ERROR_TYPES.get(reply.status, "server_error")
    return {"error": {"message": reply.error, "type": etype, "param": None, "code": etype}}


def _openai_usage(reply: StubReply, request: RecordedRequest) -> dict[str, Any]:
    out_tokens = len(reply.text or "") // 4 + 10 * len(reply.tool_calls)
    usage: dict[str, Any] = {"prompt_tokens": _tokens(request), "completion_tokens": out_tokens, "total_tokens": _tokens(request) + out_tokens}
    usage.update(reply.usage)
    return usage


def _openai_calls(reply: StubReply, n: int) -> list[dict[str, Any]]:
    return [
        {"id": f"call_stub_{n}_{i}", "type": "function", "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments") or {})}}
        for i, c in enumerate(reply.tool_calls)
    ]


def _openai_body(reply: StubReply, model: str, n: int, request: RecordedRequest) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.tool_calls:
        message["tool_calls"] = _openai_calls(reply, n)
    return {
        "id": f"chatcmpl-stub-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
        "usage": _openai_usage(reply, request),
    }


def _pieces(text: str, count: int) -> list[str]:
    if not text:
        return []
    size = max(1, -(-len(text) // max(1, count)))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + json.dumps(data) + "\n\n").encode("utf-8")


def _openai_events(reply: StubReply, model: str, n: int, request: RecordedRequest) -> list[bytes]:
    base = {"id": f"chatcmpl-stub-{n}", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in _pieces(reply.text or "", reply.chunks)]
    for i, call in enumerate(_openai_calls(reply, n)):
        fn = call["function"]
        events.append(chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": ""}}]}))
        events += [chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}) for piece in _pieces(fn["arguments"], 2)]
    events.append(chunk({}, reply.finish_reason))
    options = request.body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        events.append(_sse({**base, "choices": [], "usage": _openai_usage(reply, request)}))
    events.append(b"data: [DONE]\n\n")
    return events


def _anthropic_usage(reply: StubReply, request: RecordedRequest) -> dict[str, Any]:
    usage: dict[str, Any] = {"input_tokens": _tokens(request), "output_tokens": len(reply.text or "") // 4 + 10 * len(reply.tool_calls)}
    usage.update(reply.usage)
    return usage


def _anthropic_stop(reply: StubReply) -> str:
    if reply.tool_calls:
        return "tool_use"
    return "max_tokens" if reply.finish_reason == "length" else "end_turn"


def _anthropic_events(reply: StubReply, model: str, n: int, request: RecordedRequest) -> list[bytes]:
    usage = _anthropic_usage(reply, request)
    start_usage = {k: v for k, v in usage.items() if k != "output_tokens"} | {"output_tokens": 1}
    message: dict[str, Any] = {"id": f"msg_stub_{n}", "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": None, "stop_sequence": None, "usage": start_usage}
    events = [_sse({"type": "message_start", "message": message}, "message_start")]
    index = 0
    if reply.text:
        events.append(_sse({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}, "content_block_start"))
        for piece in _pieces(reply.text, reply.chunks):
            events.append(_sse({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}}, "content_block_delta"))
        events.append(_sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    for i, call in enumerate(reply.tool_calls):
        block = {"type": "tool_use", "id": f"toolu_stub_{n}_{i}", "name": call["name"], "input": {}}
        events.append(_sse({"type": "content_block_start", "index": index, "content_block": block}, "content_block_start"))
        for piece in _pieces(json.dumps(call.get("arguments") or {}), 2):
            events.append(_sse({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}}, "content_block_delta"))
        events.append(_sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    delta = {"type": "message_delta", "delta": {"stop_reason": _anthropic_stop(reply), "stop_sequence": None}, "usage": {"output_tokens": usage["output_tokens"]}}
    events.append(_sse(delta, "message_delta"))
    events.append(_sse({"type": "message_stop"}, "message_stop"))
    return events


def _responses_body(request: RecordedRequest) -> dict[str, Any]:
    return {
        "id": f"resp_{uuid.uuid4().hex[:12]}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": str(request.body.get("model", "stub-model")),
        "output": [{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "content": [{"type": "output_text", "text": "ok", "annotations": []}]}],
        "usage": {"input_tokens": _tokens(request), "output_tokens": 1, "total_tokens": _tokens(request) + 1},
    }


def _anthropic_body(reply: StubReply, model: str, n: int, request: RecordedRequest) -> dict[str, Any]:
    stop = _anthropic_stop(reply)
    content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
    content += [{"type": "tool_use", "id": f"toolu_stub_{n}_{i}", "name": c["name"], "input": c.get("arguments") or {}} for i, c in enumerate(reply.tool_calls)]
    return {
        "id": f"msg_stub_{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": _anthropic_usage(reply, request),
    }
