"""The stub server itself, over raw HTTP (urllib), so its behaviour does not depend on an SDK."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from ctxengine.testing.stub_server import RecordedRequest, StubReply, StubServer


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_script_is_consumed_in_order_then_default() -> None:
    with StubServer([StubReply.ok("one"), StubReply.ok("two")], default=StubReply.ok("default")) as s:
        texts = [post(s.openai_base_url + "/chat/completions", BODY)[1]["choices"][0]["message"]["content"] for _ in range(3)]
        assert texts == ["one", "two", "default"]
        assert s.calls == 3
        assert s.requests[0].body == BODY and s.requests[0].api == "openai"


def test_openai_shapes() -> None:
    with StubServer([StubReply.empty(), StubReply.truncated("cut"), StubReply.rate_limited(25)]) as s:
        url = s.openai_base_url + "/chat/completions"
        status, body, _ = post(url, BODY)
        assert status == 200 and body["choices"][0]["message"]["content"] is None
        status, body, _ = post(url, BODY)
        assert body["choices"][0]["finish_reason"] == "length"
        status, body, headers = post(url, BODY)
        assert status == 429 and body["error"]["message"] == "rate limit exceeded"
        assert headers["retry-after-ms"] == "25"


def test_anthropic_shapes() -> None:
    with StubServer([StubReply.ok("hello"), StubReply.truncated("cut"), StubReply.unauthorized(), StubReply.fail(529, "overloaded")]) as s:
        url = s.anthropic_base_url + "/v1/messages"
        status, body, _ = post(url, {**BODY, "system": "sys", "max_tokens": 5})
        assert status == 200 and body["content"] == [{"type": "text", "text": "hello"}] and body["stop_reason"] == "end_turn"
        assert body["type"] == "message" and body["usage"]["input_tokens"] >= 1
        assert post(url, BODY)[1]["stop_reason"] == "max_tokens"
        status, body, _ = post(url, BODY)
        assert status == 401 and body["error"]["type"] == "authentication_error"
        status, body, _ = post(url, BODY)
        assert status == 529 and body["error"]["type"] == "overloaded_error"
        assert s.requests[0].api == "anthropic"
        assert "sys" in s.requests[0].prompt_text and "hi" in s.requests[0].prompt_text


def test_responder_decides_when_the_script_is_empty() -> None:
    def echo(req: RecordedRequest) -> StubReply:
        return StubReply.ok(f"{len(req.body['messages'])} messages")

    with StubServer(responder=echo) as s:
        assert post(s.openai_base_url + "/chat/completions", BODY)[1]["choices"][0]["message"]["content"] == "1 messages"
        s.script(StubReply.fail(500, "scripted"))
        assert post(s.openai_base_url + "/chat/completions", BODY)[0] == 500


def test_delay_is_applied() -> None:
    with StubServer([StubReply.slow("late", 0.3)]) as s:
        t0 = time.monotonic()
        post(s.openai_base_url + "/chat/completions", BODY)
        assert time.monotonic() - t0 >= 0.3


def test_unknown_route_is_404() -> None:
    with StubServer() as s:
        status, body, _ = post(f"http://127.0.0.1:{s.port}/v1/embeddings", BODY)
        assert status == 404 and "no route" in body["error"]["message"]
        assert s.calls == 0


def test_binds_loopback_and_stops() -> None:
    s = StubServer().start()
    port = s.port
    assert s.openai_base_url.startswith("http://127.0.0.1:")
    s.stop()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
    with pytest.raises(RuntimeError, match="not running"):
        _ = s.port
