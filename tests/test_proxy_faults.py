"""The proxy under upstream faults (issue 24, item 5): a body trickled or a stream stalled or
cut before its last event ends in a clear error in the API's shape within the configured
timeout, never a hang and never half an answer that looks whole; the session continues.
Scripted raw HTTP/1.1 upstreams on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from ctxengine.config import Config
from ctxengine.proxy import ProxyServer
from ctxengine.proxy.streams import StreamEnd, failure_event

TIMEOUT = 1.0


def _openai_events() -> list[bytes]:
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hello "}}]}
    last = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}
    return [b"data: " + json.dumps(chunk).encode() + b"\n\n"] * 3 + [b"data: " + json.dumps(last).encode() + b"\n\n", b"data: [DONE]\n\n"]


def _anthropic_events() -> list[bytes]:
    def ev(kind: str, data: dict[str, Any]) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()

    return [
        ev("message_start", {"message": {"id": "m", "type": "message", "role": "assistant", "content": [], "model": "claude-sonnet-4-5", "usage": {"input_tokens": 9, "output_tokens": 1}}}),
        ev("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        ev("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "hello"}}),
        ev("content_block_stop", {"index": 0}),
        ev("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 2}}),
        ev("message_stop", {}),
    ]


class Upstream:
    """Answers each request as the next fault of ``script`` says (then ``ok``)."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.stop = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            buf = b""
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                length = next(int(v.split(":", 1)[1]) for v in lines if v.lower().startswith("content-length:"))
                while len(buf) < length:
                    buf += conn.recv(65536)
                req, buf = json.loads(buf[:length]), buf[length:]
                fault = self.script.pop(0) if self.script else "ok"
                anthropic = lines[0].split(" ")[1].endswith("/messages")
                if not self._answer(conn, req, fault, anthropic):
                    return

    def _answer(self, conn: socket.socket, req: dict[str, Any], fault: str, anthropic: bool) -> bool:
        if not req.get("stream"):
            if anthropic:
                payload: dict[str, Any] = {"id": "m", "type": "message", "role": "assistant", "model": "m", "content": [{"type": "text", "text": "hello"}], "stop_reason": "end_turn", "usage": {"input_tokens": 9, "output_tokens": 2}}
            else:
                payload = {"id": "c", "object": "chat.completion", "model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}]}
            data = json.dumps(payload).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(data))
            if fault == "trickle-body":  # 2 bytes a second: each resets a per-read timeout
                for i in range(0, len(data), 2):
                    if self.stop.wait(0.5 * TIMEOUT):
                        return False
                    conn.sendall(data[i : i + 2])
                return True
            conn.sendall(data)
            return True
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for n, event in enumerate(_anthropic_events() if anthropic else _openai_events()):
            if n == 2 and fault == "stall":
                self.stop.wait(30)
                return False
            if n == 2 and fault == "cut-clean":
                conn.sendall(b"0\r\n\r\n")
                return True
            if n == 2 and fault == "cut-abrupt":
                return False
            conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
        conn.sendall(b"0\r\n\r\n")
        return True


@pytest.fixture
def proxy_for(tmp_path: Path) -> Iterator[Any]:
    opened: list[tuple[Upstream, ProxyServer]] = []

    def make(script: list[str]) -> ProxyServer:
        up = Upstream(script)
        cfg = Config.from_dict(
            {
                "proxy": {"timeout": TIMEOUT, "openai_base_url": f"http://127.0.0.1:{up.port}/v1", "anthropic_base_url": f"http://127.0.0.1:{up.port}"},
                "store": {"path": str(tmp_path / f"s{len(opened)}.db")},
            }
        )
        p = ProxyServer(cfg).start()
        opened.append((up, p))
        return p

    yield make
    for up, p in opened:
        up.close()
        p.stop()


def _request(p: ProxyServer, api: str, stream: bool) -> tuple[int, list[str], bytes, float]:
    """Status, the stream's data lines (or none), the body, seconds."""
    if api == "anthropic":
        url, headers = f"{p.url}/v1/messages", {"x-api-key": "k", "anthropic-version": "2023-06-01"}
        body: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
    else:
        url, headers = f"{p.url}/v1/chat/completions", {"authorization": "Bearer k"}
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    body["stream"] = stream
    headers["x-ctxengine-session"] = f"faults-{api}"
    t0 = time.monotonic()
    with httpx.Client(timeout=TIMEOUT + 5) as client, client.stream("POST", url, headers=headers, json=body) as r:
        raw = r.read()  # an incomplete body raises here: not a clear error
    lines = [ln[5:].strip() for ln in raw.decode().splitlines() if ln.startswith("data:")] if stream else []
    return r.status_code, lines, raw, time.monotonic() - t0


def _is_api_error(api: str, data: Any) -> bool:
    if api == "anthropic":
        return data.get("type") == "error" and bool(data["error"]["message"])
    return bool(data["error"]["message"])


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_trickled_json_body_is_a_clear_error_within_the_timeout_then_the_session_continues(proxy_for: Any, api: str) -> None:
    p = proxy_for(["trickle-body"])
    status, _, raw, took = _request(p, api, stream=False)
    assert status == 502 and _is_api_error(api, json.loads(raw)), raw
    assert b"took longer than" in raw
    assert took < TIMEOUT + 1.5  # the body alone takes a minute
    status, _, raw, _ = _request(p, api, stream=False)
    assert status == 200 and b"hello" in raw


@pytest.mark.parametrize("fault", ["stall", "cut-clean", "cut-abrupt"])
@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_stream_that_fails_before_its_last_event_ends_in_an_error_event(proxy_for: Any, api: str, fault: str) -> None:
    p = proxy_for([fault])
    status, lines, _raw, took = _request(p, api, stream=True)
    assert status == 200  # the head was out before the fault
    last = json.loads(lines[-1])
    assert _is_api_error(api, last), lines
    assert took < TIMEOUT + 1.5
    status, lines, _, _ = _request(p, api, stream=True)  # the session continues
    assert lines[-1] == "[DONE]" if api == "openai" else json.loads(lines[-1])["type"] == "message_stop"


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_whole_stream_gets_no_error_event(proxy_for: Any, api: str) -> None:
    p = proxy_for([])
    _, lines, _, _ = _request(p, api, stream=True)
    assert not any('"error"' in ln for ln in lines)


@pytest.mark.parametrize(
    ("anthropic", "stream", "complete"),
    [
        (False, b'data: {"a": 1}\n\ndata: [DONE]\n\n', True),
        (False, b'data: {"a": 1}\r\n\r\ndata: [DONE]\r\n\r\n', True),
        (False, b'data: {"a": 1}\n\n', False),
        (False, b"", False),
        (False, b'data: {"a": 1}\n\ndata: {"error": {"message": "overloaded"}}\n\n', True),
        (True, b'event: message_stop\ndata: {"type": "message_stop"}\n\n', True),
        (True, b'event: content_block_delta\ndata: {"type": "content_block_delta"}\n\n', False),
        (True, b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "x"}}\n\n', True),
    ],
)
def test_stream_end_knows_a_whole_stream_from_a_cut_one(anthropic: bool, stream: bytes, complete: bool) -> None:
    end = StreamEnd(anthropic)
    for i in range(0, len(stream), 7):  # in pieces, as it arrives
        end.feed(stream[i : i + 7])
    assert end.complete is complete
    end.feed(failure_event(anthropic, "cut"))
    assert end.complete
