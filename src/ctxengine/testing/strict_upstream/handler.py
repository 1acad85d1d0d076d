"""HTTP: the one request flow the three APIs share (read the body, log it, validate, count the
window, reject in the provider's shape or let the script reply, answer as JSON or SSE), and the
GET routes."""

from __future__ import annotations

import contextlib
import json
import re
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from .api import Api
from .chat import ChatApi
from .messages import MessagesApi
from .responses import ResponsesApi
from .script import RECALL_TOOL
from .stats import note_answered, note_rejection, note_request
from .task import Reply
from .tokens import count_request_tokens

if TYPE_CHECKING:
    from .server import StrictUpstream

# path suffix -> API, tried in order ("/messages/count_tokens" is answered before these)
_ROUTES: tuple[tuple[str, Api], ...] = (
    ("/chat/completions", ChatApi()),
    ("/messages", MessagesApi()),
    ("/responses", ResponsesApi()),
)


class RequestHandler(BaseHTTPRequestHandler):
    server_ref: StrictUpstream
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server_ref.log(
            {
                "t": time.time(),
                "method": "GET",
                "path": self.path,
                "headers": dict(self.headers.items()),
            }
        )
        if self.path.rstrip("/").endswith("/models"):
            model = {"id": "bench-model", "object": "model", "created": 0, "owned_by": "bench"}
            self._json(200, {"object": "list", "data": [model], "models": []})
            return
        self._json(
            404,
            {
                "error": {
                    "message": f"no route {self.path}",
                    "type": "invalid_request_error",
                    "code": "not_found",
                }
            },
        )

    def do_POST(self) -> None:
        up = self.server_ref
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?")[0]
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_raw": raw[:2000].decode("utf-8", "replace")}
        record: dict[str, Any] = {
            "t": time.time(),
            "method": "POST",
            "path": self.path,
            "headers": dict(self.headers.items()),
            "body": body,
        }
        if path.endswith("/messages/count_tokens"):
            n = count_request_tokens(body)
            record.update(status=200, tokens=n)
            up.log(record)
            self._json(200, {"input_tokens": n})
            return
        api = next((a for suffix, a in _ROUTES if path.endswith(suffix)), None)
        if api is None:
            record.update(status=404)
            up.log(record)
            message = f"Invalid URL (POST {self.path})"
            self._json(
                404, {"error": {"message": message, "type": "invalid_request_error", "code": None}}
            )
            return
        self._serve(api, path, body, record)

    def _serve(self, api: Api, path: str, body: dict[str, Any], record: dict[str, Any]) -> None:
        """The shared flow: count, validate, reject or reply, then tell ``on_step``."""
        up = self.server_ref
        with up._lock:
            note_request(up.stats, path)
        tokens = count_request_tokens(body)
        record["tokens"] = tokens
        bad = api.validate(up, body)
        if bad is None and tokens > up.window:
            bad = ("over_window", "")
        if bad is not None:
            reason, message = bad
            with up._lock:
                note_rejection(up.stats, reason)
            record.update(status=400, rejected=reason)
            up.log(record)
            self._json(400, api.error(up, reason, message, tokens))
            return
        reply = up.script(api.name, body)
        with up._lock:
            note_answered(up.stats, body, tokens)
        record.update(
            status=200,
            reply={"text": (reply.text or "")[:200], "tool": reply.tool, "args": reply.args},
        )
        up.log(record)
        model = str(body.get("model") or "bench-model")
        payload = api.build(up, reply, model, tokens, body)
        if body.get("stream"):
            self._stream(api.events(payload, body))
        else:
            self._json(200, payload)
        self._announce_step(reply)

    def _announce_step(self, reply: Reply) -> None:
        """Call ``on_step`` with the file this reply asks for: a call of the client's tool, or
        (no tools) a request in words."""
        up = self.server_ref
        asked = json.dumps(reply.args) if reply.tool else (reply.text or "")
        if up.on_step is not None and reply.tool != RECALL_TOOL and "TASK DONE" not in asked:
            m = re.search(r"part(\d+)\.txt", asked)
            if m:
                up.on_step(int(m.group(1)))

    # ----------------------------------------------------------------- wire
    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, events: list[bytes]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for e in events:
                self.wfile.write(f"{len(e):x}\r\n".encode() + e + b"\r\n")
                self.wfile.flush()
                if self.server_ref.chunk_delay:
                    time.sleep(self.server_ref.chunk_delay)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
