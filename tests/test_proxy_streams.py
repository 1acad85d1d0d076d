"""Server-sent events as the proxy reads them: events split anywhere, either line ending."""

from __future__ import annotations

import json

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
