"""Server-sent events as the proxy reads them: events split anywhere, either line ending."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx2 as httpx

from ctxengine.proxy.streams import EventSplitter, OpenAIStream


def test_events_split_across_chunks_and_crlf() -> None:
    raw = b'data: {"a": 1}\r\n\r\nevent: x\ndata: {"b":\ndata: 2}\n\ndata: [DONE]\n\n'
    for size in (1, 3, 7, len(raw)):
        splitter = EventSplitter()
        events = []
        for i in range(0, len(raw), size):
            events += list(splitter.feed(raw[i : i + size]))
        events += list(splitter.flush())
        assert [e.data for e in events] == [{"a": 1}, {"b": 2}, None]
        assert events[-1].done and b"".join(e.raw for e in events) == raw


def test_only_events_naming_the_key_are_parsed() -> None:
    splitter = EventSplitter(only=b'"usage"')
    events = list(splitter.feed(b'data: {"x": 1}\n\ndata: {"usage": {"prompt_tokens": 3}}\n\n'))
    assert [e.data for e in events] == [{"usage": {"prompt_tokens": 3}}]


def test_engine_tool_calls_are_hidden_and_client_calls_renumbered() -> None:
    def chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
        return ("data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n").encode()

    stream = OpenAIStream(engine_tools=frozenset({"ctx_grep"}))
    shown = []
    for raw in (
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "ctx_grep", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "read", "arguments": "{}"}}]}),
        chunk({}, "tool_calls"),
    ):
        (event,) = EventSplitter().feed(raw)
        stream.feed(event)
        out = stream.visible(event)
        if out:
            shown.append(json.loads(out[6:]))
    calls = [tc for c in shown for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert calls == [{"index": 0, "id": "b", "function": {"name": "read", "arguments": "{}"}}]
    assert shown[-1]["choices"][0]["finish_reason"] == "tool_calls"  # the client's call is shown
    assert not stream.engine_calls_only()


def test_a_client_that_leaves_mid_stream_ends_the_upstream_stream(tmp_path: Path) -> None:
    # forty events 0.1 s apart: a relay that kept reading after the client left would take 4 s
    from ctxengine.config import Config
    from ctxengine.proxy import ProxyServer
    from ctxengine.testing.stub_server import StubReply, StubServer

    with StubServer([StubReply(text=" ".join(["word"] * 40), chunks=40, chunk_delay=0.1)]) as stub:
        cfg = Config().with_overrides(
            proxy={"openai_base_url": stub.openai_base_url, "anthropic_base_url": stub.anthropic_base_url}, store={"path": str(tmp_path / "s.db")}
        )
        with ProxyServer(cfg) as p:
            body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "x"}]}
            with httpx.stream("POST", p.openai_base_url + "/chat/completions", json=body, timeout=30) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        break  # the client leaves after the first event
            left = time.monotonic()
            while time.monotonic() - left < 3.0:
                text = httpx.get(p.url + "/metrics").text
                if 'ctxengine_proxy_requests_total{api="openai",outcome="ok"} 1.0' in text:
                    break
                time.sleep(0.05)
            assert time.monotonic() - left < 2.0, "the relay went on after the client left"
