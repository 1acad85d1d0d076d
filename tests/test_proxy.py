"""``ctxengine proxy`` driven by the official OpenAI and Anthropic SDKs against StubServer.

Every test runs a real proxy (uvicorn on 127.0.0.1, a background thread) in front of a real
stub upstream (another loopback server), with a real SQLite store in the test's temp dir.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ctxengine.config import Config
from ctxengine.errors import ConfigError
from ctxengine.manager import ContextManager
from ctxengine.proxy import (
    SESSION_HEADER,
    TOKEN_HEADER,
    TOKENS_SAVED_HEADER,
    ProxyServer,
    check_bind,
)
from ctxengine.proxy.apis import ANTHROPIC, OPENAI
from ctxengine.store import SqliteStore
from ctxengine.testing.stub_server import RecordedRequest, StubReply, StubServer

KEY = "sk-secret-key-0123456789"
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
ANTHROPIC_TOOLS = [{"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer() as s:
        yield s


def make_config(stub: StubServer, tmp_path: Path, **sections: Any) -> Config:
    base: dict[str, Any] = {
        "proxy": {"openai_base_url": stub.openai_base_url, "anthropic_base_url": stub.anthropic_base_url},
        "store": {"path": str(tmp_path / "sessions.db")},
    }
    for k, v in sections.items():
        base.setdefault(k, {}).update(v)
    return Config().with_overrides(**base)


@pytest.fixture
def proxy(stub: StubServer, tmp_path: Path) -> Iterator[ProxyServer]:
    with ProxyServer(make_config(stub, tmp_path)) as p:
        yield p


def oai(p: ProxyServer, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=p.openai_base_url, api_key=KEY, max_retries=0, **kw)


def ant(p: ProxyServer, **kw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=p.anthropic_base_url, api_key=KEY, max_retries=0, **kw)


def settled_metric(p: ProxyServer, name: str, expected: float, **labels: str) -> float:
    """:func:`metric` once it reaches ``expected`` (or after 5 s): a streamed response's usage
    is read at the end of its stream, which the client may not wait for (it stops at the
    last event)."""
    deadline = time.monotonic() + 5
    while (value := metric(p, name, **labels)) != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return value


def metric(p: ProxyServer, name: str, **labels: str) -> float:
    text = httpx.get(p.url + "/metrics").text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


# -- the happy paths --------------------------------------------------------------------------
def test_openai_non_streaming_relays_the_reply_and_names_the_session(proxy: ProxyServer, stub: StubServer) -> None:
    stub.script(StubReply.ok("hello from upstream"))
    raw = oai(proxy).chat.completions.with_raw_response.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert raw.parse().choices[0].message.content == "hello from upstream"
    assert raw.headers[SESSION_HEADER].startswith("px-")
    assert raw.headers[TOKENS_SAVED_HEADER] == "0"
    sent = stub.requests[-1]
    assert sent.body["messages"] == [{"role": "user", "content": "hi"}]
    assert sent.headers["authorization"] == f"Bearer {KEY}"  # the key is forwarded


def test_unchanged_requests_go_upstream_byte_for_byte(proxy: ProxyServer, stub: StubServer) -> None:
    body = b'{"model": "gpt-4o",   "messages": [{"role": "user", "content": "caf\\u00e9"}], "temperature": 0.25, "x_extra": {"kept": true}}'
    r = httpx.post(proxy.openai_base_url + "/chat/completions", content=body, headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code == 200
    assert stub.requests[-1].raw == body


def test_openai_streaming_is_relayed_and_usage_read_from_the_final_chunk(proxy: ProxyServer, stub: StubServer) -> None:
    stub.script(StubReply(text="one two three four five six", chunks=6))
    stream = oai(proxy).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "count"}], stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three four five six"
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0
    prompt = chunks[-1].usage.prompt_tokens
    assert settled_metric(proxy, "ctxengine_proxy_upstream_prompt_tokens_total", prompt, api="openai") == prompt


def test_streaming_is_relayed_as_it_arrives_not_buffered(proxy: ProxyServer, stub: StubServer) -> None:
    stub.script(StubReply(text="a b c d e", chunks=5, chunk_delay=0.25))
    arrivals: list[float] = []
    with httpx.stream(
        "POST", proxy.openai_base_url + "/chat/completions", json={"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "x"}]}, timeout=30
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                arrivals.append(time.monotonic())
    assert len(arrivals) >= 7
    # upstream spaces its events 0.25 s apart: a relay that buffered would deliver them together
    assert arrivals[-1] - arrivals[0] >= 1.0


def test_anthropic_non_streaming_and_cache_breakpoints_for_claude(proxy: ProxyServer, stub: StubServer) -> None:
    stub.script(StubReply.ok("bonjour"))
    system = "Rule 17: never edit generated files; ask first. " * 800  # long enough to be cached
    msg = ant(proxy).messages.create(model="claude-opus-4-5", max_tokens=64, system=system, messages=[{"role": "user", "content": "hello"}])
    assert msg.content[0].text == "bonjour"  # type: ignore[union-attr]
    sent = stub.requests[-1].body
    assert sent["system"] == [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
    assert sent["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert sent["max_tokens"] == 64 and sent["model"] == "claude-opus-4-5"


def test_the_clients_own_cache_control_and_its_ttl_are_left_as_sent(proxy: ProxyServer, stub: StubServer) -> None:
    system = [{"type": "text", "text": "Long instructions.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    messages = [{"role": "user", "content": [{"type": "text", "text": "first"}]}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "second"}]
    ant(proxy).messages.create(model="claude-opus-4-5", max_tokens=8, system=system, messages=messages)  # type: ignore[arg-type]
    sent = stub.requests[-1].body
    assert sent["system"] == system
    assert sent["messages"] == messages
    assert json.dumps(sent).count("cache_control") == 1


def test_anthropic_streaming_via_the_sdk(proxy: ProxyServer, stub: StubServer) -> None:
    stub.script(StubReply(text="streamed reply here", chunks=3, usage={"cache_read_input_tokens": 7}))
    with ant(proxy).messages.stream(model="claude-opus-4-5", max_tokens=32, messages=[{"role": "user", "content": "go"}]) as s:
        final = s.get_final_message()
    assert final.content[0].text == "streamed reply here"  # type: ignore[union-attr]
    assert final.usage.output_tokens > 0
    assert settled_metric(proxy, "ctxengine_proxy_upstream_cache_read_tokens_total", 7, api="anthropic") == 7


@pytest.mark.parametrize("stream", [False, True])
def test_usage_reaches_the_manager_before_the_sessions_next_turn(proxy: ProxyServer, stub: StubServer, stream: bool) -> None:
    """The manager sees a response's usage off the response path, but always before the
    session's next request is planned."""
    stub.script(*[StubReply(text="ok", chunks=2, usage={"cache_read_input_tokens": 7}) for _ in range(3)])
    c = ant(proxy, default_headers={SESSION_HEADER: "usage"})
    msgs: list[Any] = [{"role": "user", "content": "one"}]
    manager = proxy.proxy.manager(ANTHROPIC, "claude-opus-4-5")
    for turn in range(3):
        if stream:
            with c.messages.stream(model="claude-opus-4-5", max_tokens=8, messages=msgs) as s:
                s.get_final_message()
        else:
            c.messages.create(model="claude-opus-4-5", max_tokens=8, messages=msgs)
        msgs += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"turn {turn}"}]
        # every earlier turn's usage is in; this one's may still be on its way
        assert manager.status("usage")["cache_read_tokens"] >= 7 * turn
    c.messages.create(model="claude-opus-4-5", max_tokens=8, messages=msgs)
    assert manager.status("usage")["cache_read_tokens"] >= 21


def test_client_tool_calls_pass_through_both_apis(proxy: ProxyServer, stub: StubServer) -> None:
    stub.script(StubReply.calling(("read_file", {"path": "src/app.py"})), StubReply.ok("done"))
    c = oai(proxy)
    msgs: list[Any] = [{"role": "user", "content": "open app"}]
    r = c.chat.completions.create(model="gpt-4o", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
    call = r.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "read_file" and json.loads(call.function.arguments) == {"path": "src/app.py"}  # type: ignore[union-attr]
    msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "print('hi')"}]
    r2 = c.chat.completions.create(model="gpt-4o", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
    assert r2.choices[0].message.content == "done"
    assert stub.requests[-1].body["messages"][-1] == {"role": "tool", "tool_call_id": call.id, "content": "print('hi')"}

    stub.script(StubReply.calling(("read_file", {"path": "b.py"})))
    with ant(proxy).messages.stream(model="claude-opus-4-5", max_tokens=32, tools=ANTHROPIC_TOOLS, messages=[{"role": "user", "content": "open b"}]) as s:  # type: ignore[arg-type]
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [("read_file", {"path": "b.py"})]  # type: ignore[union-attr]


def test_anthropic_beta_flags_stay_for_the_session(proxy: ProxyServer, stub: StubServer) -> None:
    c = ant(proxy, default_headers={SESSION_HEADER: "betas"})
    msgs = [{"role": "user", "content": "x"}]
    c.messages.create(model="claude-opus-4-5", max_tokens=4, messages=msgs, extra_headers={"anthropic-beta": "context-1m-2025-08-07"})  # type: ignore[arg-type]
    c.messages.create(model="claude-opus-4-5", max_tokens=4, messages=msgs, extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"})  # type: ignore[arg-type]
    c.messages.create(model="claude-opus-4-5", max_tokens=4, messages=msgs)  # type: ignore[arg-type]
    assert [r.headers.get("anthropic-beta") for r in stub.requests] == [
        "context-1m-2025-08-07",
        "context-1m-2025-08-07,interleaved-thinking-2025-05-14",
        "context-1m-2025-08-07,interleaved-thinking-2025-05-14",
    ]


def test_anthropic_beta_flags_start_with_the_first_request_that_sends_one(proxy: ProxyServer, stub: StubServer) -> None:
    c = ant(proxy, default_headers={SESSION_HEADER: "late-betas"})
    msgs = [{"role": "user", "content": "x"}]
    c.messages.create(model="claude-opus-4-5", max_tokens=4, messages=msgs)  # type: ignore[arg-type]
    c.messages.create(model="claude-opus-4-5", max_tokens=4, messages=msgs, extra_headers={"anthropic-beta": "context-1m-2025-08-07"})  # type: ignore[arg-type]
    c.messages.create(model="claude-opus-4-5", max_tokens=4, messages=msgs)  # type: ignore[arg-type]
    assert [r.headers.get("anthropic-beta") for r in stub.requests] == [None, "context-1m-2025-08-07", "context-1m-2025-08-07"]


@pytest.mark.parametrize("passthrough", [False, True])
def test_request_headers_go_upstream_as_named_without_hop_by_hop_or_the_proxys_own(passthrough: bool) -> None:
    from starlette.requests import Request

    from ctxengine.proxy.app import Proxy

    raw = [
        (b"Host", b"127.0.0.1:1"), (b"Connection", b"keep-alive"), (b"content-length", b"2"), (b"Accept-Encoding", b"gzip"),
        (b"X-Api-Key", b"sk-\xe9"), (b"anthropic-version", b"2023-06-01"), (b"x-ctxengine-session", b"s"), (b"X-Ctxengine-Token", b"t"),
        (b"TE", b"trailers"), (b"content-type", b"application/json"),
    ]
    out = Proxy._request_headers(Request({"type": "http", "headers": raw}), passthrough=passthrough)
    expected = {"X-Api-Key": "sk-\xe9", "anthropic-version": "2023-06-01", "content-type": "application/json"}
    expected |= {"Accept-Encoding": "gzip"} if passthrough else {"accept-encoding": "identity"}
    assert out == expected


def test_parallel_sessions_never_cross(proxy: ProxyServer, stub: StubServer) -> None:
    stub.responder = lambda req: StubReply.ok("echo:" + req.body["messages"][-1]["content"])
    errors: list[str] = []

    def run(n: int) -> None:
        c = oai(proxy, default_headers={SESSION_HEADER: f"par-{n}"})
        msgs: list[Any] = [{"role": "system", "content": f"agent {n}"}]
        for turn in range(5):
            msgs.append({"role": "user", "content": f"s{n}-t{turn}"})
            r = c.chat.completions.create(model="gpt-4o", messages=msgs)
            reply = r.choices[0].message.content
            if reply != f"echo:s{n}-t{turn}":
                errors.append(f"session {n} turn {turn} got {reply!r}")
            msgs.append({"role": "assistant", "content": reply})

    threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for req in stub.requests:
        owner = req.body["messages"][0]["content"].split()[-1]
        assert all(m["content"].startswith((f"s{owner}-", "echo:s" + owner + "-")) for m in req.body["messages"][1:])
    assert len(stub.requests) == 40


def test_sessions_are_derived_deterministically_without_a_header(proxy: ProxyServer, stub: StubServer) -> None:
    c = oai(proxy)
    a1 = c.chat.completions.with_raw_response.create(model="gpt-4o", messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "task A"}])
    a2 = c.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "task A"}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    )
    b = c.chat.completions.with_raw_response.create(model="gpt-4o", messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "task B"}])
    other_key = openai.OpenAI(base_url=proxy.openai_base_url, api_key="sk-other", max_retries=0)
    a3 = other_key.chat.completions.with_raw_response.create(model="gpt-4o", messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "task A"}])
    assert a1.headers[SESSION_HEADER] == a2.headers[SESSION_HEADER]
    assert len({a1.headers[SESSION_HEADER], b.headers[SESSION_HEADER], a3.headers[SESSION_HEADER]}) == 3


def test_client_history_edits_never_resurrect_dropped_turns(proxy: ProxyServer, stub: StubServer) -> None:
    c = oai(proxy, default_headers={SESSION_HEADER: "edits"})
    history: list[Any] = [{"role": "system", "content": "sys"}]
    for i in range(6):
        history.append({"role": "user", "content": f"question {i}"})
        c.chat.completions.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": f"answer {i}"})
    # the client compacts its own history (its /compact): one summary replaces turns 0-4
    edited = [history[0], {"role": "user", "content": "summary of questions 0-4"}, {"role": "assistant", "content": "noted"}, {"role": "user", "content": "question 6"}]
    r = c.chat.completions.create(model="gpt-4o", messages=edited)
    assert r.choices[0].message.content == "ok"
    sent = stub.requests[-1].body["messages"]
    assert sent == edited
    # and a truncation (the client dropped its last turn) is valid as well
    c.chat.completions.create(model="gpt-4o", messages=history[:5])
    assert stub.requests[-1].body["messages"] == history[:5]


# -- recall: the engine's tools are answered by the proxy ---------------------------------------
def test_engine_tools_are_answered_by_the_proxy_and_invisible_to_the_client(stub: StubServer, tmp_path: Path) -> None:
    cfg = make_config(stub, tmp_path, context={"engine": "lcm"})
    fact = "ERROR: /srv/app/config.toml missing key 'port'"

    def responder(req: RecordedRequest) -> StubReply:
        names = [t["function"]["name"] for t in req.body.get("tools") or []]
        last = req.body["messages"][-1]
        if last["role"] == "tool" and last["tool_call_id"].startswith("call_stub") and "lcm_grep" in json.dumps(req.body["messages"][-2]):
            return StubReply.ok("recalled: " + last["content"][:2000])
        if "lcm_grep" in names and "recall" in str(last.get("content")):
            return StubReply.calling(("lcm_grep", {"query": "config.toml"}))
        return StubReply.ok("plain")

    stub.responder = responder
    with ProxyServer(cfg) as p:
        c = oai(p, default_headers={SESSION_HEADER: "recall"})
        msgs: list[Any] = [{"role": "system", "content": "sys"}, {"role": "user", "content": f"the build said {fact}"}, {"role": "assistant", "content": "noted"}]
        msgs.append({"role": "user", "content": "please recall what the build said"})
        r = c.chat.completions.create(model="gpt-4o", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
        assert r.choices[0].message.tool_calls is None
        assert r.choices[0].message.content is not None and "config.toml" in r.choices[0].message.content
        assert metric(p, "ctxengine_proxy_tool_rounds_total", api="openai") == 1
        # the engine's tools were added to the client's own, after them
        assert stub.requests[0].body["tools"][0]["function"]["name"] == "read_file"
        # without client tools, none are added
        c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "recall nothing"}])
        assert "tools" not in stub.requests[-1].body


def test_engine_tools_streamed_round_trip_both_apis(stub: StubServer, tmp_path: Path) -> None:
    cfg = make_config(stub, tmp_path, context={"engine": "lcm"})
    stub.script(
        StubReply.calling(("lcm_grep", {"query": "needle"}), text="let me look"),
        StubReply(text="found the needle", chunks=3),
        StubReply.calling(("lcm_grep", {"query": "needle"})),
        StubReply(text="anthropic found it", chunks=2),
    )
    with ProxyServer(cfg) as p:
        stream = oai(p).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "needle?"}], tools=TOOLS, stream=True)  # type: ignore[arg-type]
        chunks = list(stream)
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == "let mefound the needle" or text == "let me lookfound the needle"
        assert not any(ch.choices and ch.choices[0].delta.tool_calls for ch in chunks)
        followup = stub.requests[1].body["messages"]
        assert followup[-2]["tool_calls"][0]["function"]["name"] == "lcm_grep"
        assert followup[-1]["role"] == "tool"

        with ant(p).messages.stream(model="claude-opus-4-5", max_tokens=32, tools=ANTHROPIC_TOOLS, messages=[{"role": "user", "content": "needle?"}]) as s:  # type: ignore[arg-type]
            final = s.get_final_message()
        assert [b.type for b in final.content] == ["text"]
        assert final.content[0].text == "anthropic found it"  # type: ignore[union-attr]
        assert final.stop_reason == "end_turn"
        sent = stub.requests[3].body["messages"]
        assert sent[-1]["content"][0]["type"] == "tool_result" and sent[-2]["content"][0]["name"] == "lcm_grep"


def test_a_long_replayed_session_compacts_and_recalls(stub: StubServer, tmp_path: Path) -> None:
    cfg = make_config(stub, tmp_path, context={"engine": "lcm"}, model={"context_length": 6000})
    secret = "sha 9f3c2e1 failed: tests/test_io.py::test_roundtrip"

    def responder(req: RecordedRequest) -> StubReply:
        last = req.body["messages"][-1]
        if last.get("role") == "tool" and "lcm_grep" in json.dumps(req.body["messages"][-2]):
            return StubReply.ok("recall result seen" if "9f3c2e1" in last["content"] else "recall found nothing")
        if "which sha" in str(last.get("content")):
            return StubReply.calling(("lcm_grep", {"query": "9f3c2e1"}))
        return StubReply.ok("ack " + "z" * 40)

    stub.responder = responder
    with ProxyServer(cfg) as p:
        c = oai(p, default_headers={SESSION_HEADER: "long"})
        msgs: list[Any] = [{"role": "system", "content": "You are a careful agent."}, {"role": "user", "content": "fix the failing build"}]
        for turn in range(30):
            output = f"turn {turn}: " + ("log line with details about the build\n" * 30)
            if turn == 1:
                output += secret
            call = {"id": f"call_{turn}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"log{turn}.txt"})}}
            msgs += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": f"call_{turn}", "content": output}]
            r = c.chat.completions.create(model="gpt-4o", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
            msgs.append({"role": "assistant", "content": r.choices[0].message.content})
            msgs.append({"role": "user", "content": f"continue {turn}"})
        assert metric(p, "ctxengine_proxy_compactions_total", api="openai") >= 1
        last = json.dumps(stub.requests[-1].body["messages"])
        assert len(last) < len(json.dumps(msgs)) * 0.6  # what went upstream was compacted
        assert "turn 1: log line" not in last  # the original output left the context (its facts may stay)
        msgs.append({"role": "user", "content": "which sha failed earlier?"})
        r = c.chat.completions.create(model="gpt-4o", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
        assert r.choices[0].message.content == "recall result seen"
        assert r.choices[0].message.tool_calls is None


def test_recall_through_the_manager_after_compaction(stub: StubServer, tmp_path: Path) -> None:
    """The kernel's store-backed ``ctx_grep`` (offered once the context lost text) is added by
    the proxy, answered by the manager, and never seen by the client."""
    # the summarizing path: it compacts this chat at a known point (digests fold tool exchanges)
    cfg = make_config(stub, tmp_path, context={"engine": "compressor"}, compression={"mode": "summary"}, model={"context_length": 6000})
    secret = "sha 9f3c2e1 failed: tests/test_io.py::test_roundtrip"
    grep_results: list[str] = []

    def responder(req: RecordedRequest) -> StubReply:
        last = req.body["messages"][-1]
        if last.get("role") == "tool" and "ctx_grep" in json.dumps(req.body["messages"][-2]):
            grep_results.append(last["content"])
            return StubReply.ok("the sha was 9f3c2e1" if "9f3c2e1" in last["content"] else "recall found nothing")
        if "which sha" in str(last.get("content")):
            return StubReply.calling(("ctx_grep", {"query": "9f3c2e1"}))
        return StubReply.ok("ack " + "z" * 40)

    stub.responder = responder
    with ProxyServer(cfg) as p:
        c = oai(p, default_headers={SESSION_HEADER: "kernel-recall"})
        msgs: list[Any] = [{"role": "system", "content": "You are a careful agent."}, {"role": "user", "content": "fix the failing build"}]
        for turn in range(30):
            output = f"turn {turn}: " + ("log line with details about the build\n" * 30)
            if turn == 1:
                output += secret
            call = {"id": f"call_{turn}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"log{turn}.txt"})}}
            msgs += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": f"call_{turn}", "content": output}]
            r = c.chat.completions.create(model="gpt-4o", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
            msgs.append({"role": "assistant", "content": r.choices[0].message.content})
            msgs.append({"role": "user", "content": f"continue {turn}"})
        manager = p.proxy.manager(OPENAI, "gpt-4o")
        assert manager.status("kernel-recall")["recall_offered"] is True
        assert manager.counters("kernel-recall")["compactions"] == manager.status("kernel-recall")["compactions"] >= 1
        assert "ctx_grep" in manager.tool_names(session_id="kernel-recall")
        last = stub.requests[-1].body
        first_output = next(m["content"] for m in msgs if m.get("tool_call_id") == "call_1")
        assert all(m.get("content") != first_output for m in last["messages"])  # the original left the context
        assert next(t["function"]["name"] for t in last["tools"]) == "read_file"
        assert "ctx_grep" in [t["function"]["name"] for t in last["tools"]]
        n = len(stub.requests)
        msgs.append({"role": "user", "content": "which sha failed earlier?"})
        r = c.chat.completions.create(model="gpt-4o", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
        assert r.choices[0].message.tool_calls is None  # the client sees only its own tools' calls
        assert r.choices[0].message.content == "the sha was 9f3c2e1"
        assert len(stub.requests) == n + 2  # one extra round trip, answered inside the proxy
        assert grep_results and "9f3c2e1" in grep_results[-1]
        # streamed, the same: no ctx_grep call reaches the client
        msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "which sha failed earlier? (again)"}]
        chunks = list(c.chat.completions.create(model="gpt-4o", messages=msgs, tools=TOOLS, stream=True))  # type: ignore[arg-type]
        assert not any(ch.choices and ch.choices[0].delta.tool_calls for ch in chunks)
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "the sha was 9f3c2e1"


def test_idle_sessions_end_and_a_returning_client_resumes_from_the_store(stub: StubServer, tmp_path: Path) -> None:
    # the summarizing path: it compacts this chat at a known point (digests fold tool exchanges)
    cfg = make_config(stub, tmp_path, context={"engine": "compressor"}, compression={"mode": "summary"}, model={"context_length": 6000}, proxy={"session_idle_seconds": 0.3})
    stub.responder = lambda req: StubReply.ok("ack " + "z" * 40)
    with ProxyServer(cfg) as p:
        c = oai(p, default_headers={SESSION_HEADER: "idle"})
        msgs: list[Any] = [{"role": "system", "content": "You are a careful agent."}, {"role": "user", "content": "fix the failing build"}]
        for turn in range(24):
            call = {"id": f"call_{turn}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"log{turn}.txt"})}}
            output = f"turn {turn}: " + ("log line with details about the build\n" * 30)
            msgs += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": f"call_{turn}", "content": output}]
            r = c.chat.completions.create(model="gpt-4o", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
            msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": f"continue {turn}"}]
        manager = p.proxy.manager(OPENAI, "gpt-4o")
        compactions = metric(p, "ctxengine_proxy_compactions_total", api="openai")
        assert compactions >= 1 and "idle" in manager.sessions
        before = stub.requests[-1].body["messages"]
        # idle past proxy.session_idle_seconds: the next request (another session) sweeps it away
        time.sleep(0.4)
        oai(p, default_headers={SESSION_HEADER: "other"}).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        assert manager.sessions == ["other"]
        assert metric(p, "ctxengine_proxy_idle_sessions_ended_total") == 1
        assert httpx.get(p.url + "/healthz").json()["sessions"] == 1
        # the client comes back with its whole history: it maps onto the stored working context
        msgs += [{"role": "user", "content": "and now?"}]
        c.chat.completions.create(model="gpt-4o", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
        after = stub.requests[-1].body["messages"]
        assert metric(p, "ctxengine_proxy_compactions_total", api="openai") == compactions  # not compacted anew
        assert after[: len(before)] == before  # the cached prefix is the one sent before the pause
        assert after[len(before) :] == msgs[-3:]  # plus only what is new
        assert "idle" in manager.sessions and manager.status("idle")["recall_offered"] is True


# -- never break the agent -----------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_upstream_errors_come_back_verbatim(proxy: ProxyServer, stub: StubServer, stream: bool) -> None:
    stub.script(StubReply.fail(429, "slow down", retry_after_ms=None), StubReply.fail(529, "overloaded", retry_after_ms=None))
    with pytest.raises(openai.RateLimitError) as e1:
        oai(proxy).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}], stream=stream)
    assert e1.value.status_code == 429 and "slow down" in str(e1.value)
    with pytest.raises(anthropic.APIStatusError) as e2:
        ant(proxy).messages.create(model="claude-opus-4-5", max_tokens=8, messages=[{"role": "user", "content": "x"}], stream=stream)
    assert e2.value.status_code == 529
    assert e2.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "overloaded"}}


def test_unauthorized_upstream_is_verbatim(proxy: ProxyServer, stub: StubServer) -> None:
    stub.script(StubReply.unauthorized())
    with pytest.raises(openai.AuthenticationError) as e:
        oai(proxy).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert e.value.body == {"message": "invalid api key", "type": "invalid_api_key", "param": None, "code": "invalid_api_key"}


def test_malformed_requests_get_the_providers_error_shape(proxy: ProxyServer, stub: StubServer) -> None:
    r = httpx.post(proxy.openai_base_url + "/chat/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error" and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(proxy.url + "/v1/messages", json={"model": "claude-opus-4-5", "max_tokens": 5})
    assert r.status_code == 400 and r.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": "'messages' is required and must be a list"}}
    r = httpx.post(proxy.openai_base_url + "/chat/completions", json=[1, 2])
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        oai(proxy, default_headers={SESSION_HEADER: "bad session id!"}).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert stub.calls == 0
    assert metric(proxy, "ctxengine_proxy_requests_total", outcome="bad_request") == 4


def test_body_size_limit(stub: StubServer, tmp_path: Path) -> None:
    with ProxyServer(make_config(stub, tmp_path, proxy={"max_body_bytes": 2000})) as p:
        with pytest.raises(anthropic.APIStatusError) as e:
            ant(p).messages.create(model="claude-opus-4-5", max_tokens=8, messages=[{"role": "user", "content": "x" * 5000}])
        assert e.value.status_code == 413 and e.value.body["error"]["type"] == "request_too_large"  # type: ignore[index]
        with pytest.raises(openai.APIStatusError) as e2:
            oai(p).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x" * 5000}])
        assert e2.value.status_code == 413
    assert stub.calls == 0


def test_internal_errors_fail_open_with_the_original_request(proxy: ProxyServer, stub: StubServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def boom(self: ContextManager, *a: Any, **k: Any) -> Any:
        raise RuntimeError("engine exploded")

    monkeypatch.setattr(ContextManager, "prepare", boom)
    body = b'{"model":"claude-opus-4-5","max_tokens":9,"messages":[{"role":"user","content":"keep me"}]}'
    with caplog.at_level(logging.WARNING, logger="ctxengine.proxy"):
        r = httpx.post(proxy.url + "/v1/messages", content=body, headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"})
    assert r.status_code == 200 and r.json()["content"][0]["text"] == "ok"
    assert stub.requests[-1].raw == body
    assert any("engine exploded" in str(getattr(rec, "fields", {}).get("error")) for rec in caplog.records)
    assert metric(proxy, "ctxengine_proxy_fail_open_total", reason="prepare") == 1


def test_invalid_histories_fail_open_too(proxy: ProxyServer, stub: StubServer) -> None:
    # a tool result without its call: ctxengine refuses it, the upstream decides
    msgs = [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "nope", "content": "orphan"}]
    r = httpx.post(proxy.openai_base_url + "/chat/completions", json={"model": "gpt-4o", "messages": msgs})
    assert r.status_code == 200
    assert stub.requests[-1].body["messages"] == msgs


def test_unreachable_upstream_is_a_502_in_the_providers_shape(tmp_path: Path) -> None:
    with StubServer() as s:
        dead = make_config(s, tmp_path)
    with ProxyServer(dead) as p:
        with pytest.raises(anthropic.InternalServerError) as e:
            ant(p).messages.create(model="claude-opus-4-5", max_tokens=8, messages=[{"role": "user", "content": "x"}])
        assert e.value.status_code == 502 and "upstream unreachable" in str(e.value)


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_that_drops_or_stalls_is_a_502_and_the_next_request_is_served(stub: StubServer, tmp_path: Path, stream: bool) -> None:
    cfg = make_config(stub, tmp_path).with_overrides(proxy={"timeout": 0.5})
    with ProxyServer(cfg) as p:
        msgs: list[Any] = [{"role": "user", "content": "x"}]
        assert oai(p).chat.completions.create(model="gpt-4o", messages=msgs).choices[0].message.content  # a pooled connection now
        for broken in (StubReply(reset=True), StubReply(text="late", delay=1.5)):
            stub.script(broken, StubReply(text="fine"))
            before = len(stub.requests)
            with pytest.raises(openai.InternalServerError) as e1:
                oai(p).chat.completions.create(model="gpt-4o", messages=msgs, stream=stream)
            assert e1.value.status_code == 502 and "upstream unreachable" in str(e1.value)
            assert len(stub.requests) == before + 1  # sent once: the upstream may have acted on it
            reply = oai(p).chat.completions.create(model="gpt-4o", messages=msgs)
            assert reply.choices[0].message.content == "fine"
        stub.script(StubReply(reset=True))
        with pytest.raises(anthropic.InternalServerError) as e2:
            ant(p).messages.create(model="claude-opus-4-5", max_tokens=8, messages=[{"role": "user", "content": "x"}], stream=stream)
        assert e2.value.status_code == 502 and e2.value.body["error"]["type"] == "api_error"  # type: ignore[index]


# -- passthrough -------------------------------------------------------------------------------------
def test_other_v1_paths_are_forwarded_unchanged(proxy: ProxyServer, stub: StubServer) -> None:
    c = oai(proxy)
    assert [m.id for m in c.models.list()] == ["stub-model"]
    body = b'{"model":"gpt-4o","input":[{"role":"user","content":"hi"}],"store":false}'
    r = httpx.post(proxy.openai_base_url + "/responses", content=body, headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.json()["object"] == "response"
    assert stub.requests[-1].raw == body and stub.requests[-1].path == "/v1/responses"
    count = ant(proxy).messages.count_tokens(model="claude-opus-4-5", messages=[{"role": "user", "content": "count these words"}])
    assert count.input_tokens > 0
    r = httpx.post(proxy.openai_base_url + "/embeddings", json={"input": "x"})
    assert r.status_code == 404  # the upstream's own answer


def test_only_a_post_to_a_chat_path_is_a_chat_request(proxy: ProxyServer, stub: StubServer) -> None:
    # those skip the router (see _ChatFront); any other method or path is forwarded as before
    for path in ("/v1/chat/completions", "/v1/messages"):
        assert httpx.post(proxy.url + path, content=b"not json").status_code == 400  # the proxy's own answer
        assert httpx.get(proxy.url + path).status_code == 404  # the upstream's own answers: forwarded
        assert httpx.post(proxy.url + path + "/extra", content=b"not json").status_code == 404


# -- security and operations ---------------------------------------------------------------------------
def test_keys_are_forwarded_but_never_stored_or_logged(stub: StubServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="ctxengine"), ProxyServer(make_config(stub, tmp_path)) as p:
        oai(p, default_headers={SESSION_HEADER: "k"}).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
        ant(p, default_headers={SESSION_HEADER: "k2"}).messages.create(model="claude-opus-4-5", max_tokens=4, messages=[{"role": "user", "content": "y"}])
        httpx.post(p.url + "/v1/messages", json={"model": "claude-opus-4-5", "max_tokens": 4, "messages": [{"role": "user", "content": "z"}]}, headers={"x-api-key": KEY})
    assert stub.requests[0].headers["authorization"] == f"Bearer {KEY}" == stub.requests[1].headers["authorization"]
    assert stub.requests[2].headers["x-api-key"] == KEY
    assert KEY not in caplog.text and all(KEY not in json.dumps(getattr(r, "fields", {})) for r in caplog.records)
    db = (tmp_path / "sessions.db").read_bytes() + b"".join(f.read_bytes() for f in tmp_path.glob("sessions.db-*"))
    assert KEY.encode() not in db
    with SqliteStore(tmp_path / "sessions.db") as store:
        assert [m["content"] for m in store.history("k")] == ["x"]


def test_a_proxy_token_guards_everything_but_healthz(stub: StubServer, tmp_path: Path) -> None:
    with ProxyServer(make_config(stub, tmp_path), auth_token="tok-1") as p:
        with pytest.raises(openai.AuthenticationError):
            oai(p).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(anthropic.AuthenticationError):
            ant(p, default_headers={TOKEN_HEADER: "wrong"}).messages.create(model="claude-opus-4-5", max_tokens=4, messages=[{"role": "user", "content": "x"}])
        assert httpx.get(p.url + "/metrics").status_code == 401
        assert httpx.get(p.openai_base_url + "/models").status_code == 401
        assert stub.calls == 0
        r = oai(p, default_headers={TOKEN_HEADER: "tok-1"}).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
        assert r.choices[0].message.content == "ok"
        assert TOKEN_HEADER not in stub.requests[-1].headers  # the proxy's token stays here
        assert httpx.get(p.url + "/healthz").json()["status"] == "ok"


def test_binding_beyond_loopback_needs_a_token() -> None:
    with pytest.raises(ConfigError, match="auth-token"):
        check_bind("0.0.0.0", None, "CTXENGINE_PROXY_TOKEN")
    check_bind("0.0.0.0", "t", "CTXENGINE_PROXY_TOKEN")
    check_bind("127.0.0.1", None, "CTXENGINE_PROXY_TOKEN")
    check_bind("::1", None, "CTXENGINE_PROXY_TOKEN")


def test_metrics_and_healthz(proxy: ProxyServer, stub: StubServer) -> None:
    for _ in range(3):
        oai(proxy).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert metric(proxy, "ctxengine_proxy_requests_total", api="openai", outcome="ok") == 3
    # the request's timings are observed once its response is out
    assert settled_metric(proxy, "ctxengine_proxy_added_latency_seconds_count", 3, api="openai") == 3
    assert metric(proxy, "ctxengine_proxy_tokens_in_total", api="openai") > 0
    health = httpx.get(proxy.url + "/healthz").json()
    assert health == {"status": "ok", "store": "SqliteStore", "sessions": 1}


def test_mixed_calls_show_only_the_clients_and_a_failed_round_is_returned(stub: StubServer, tmp_path: Path) -> None:
    cfg = make_config(stub, tmp_path, context={"engine": "lcm"})
    stub.script(
        StubReply.calling(("lcm_grep", {"query": "x"}), ("read_file", {"path": "a.py"})),
        StubReply.calling(("lcm_grep", {"query": "x"})),
        StubReply.fail(500, "upstream broke", retry_after_ms=None),
        StubReply.calling(("lcm_grep", {"query": "x"})),
        StubReply.fail(529, "overloaded", retry_after_ms=None),
    )
    with ProxyServer(cfg) as p:
        c = oai(p)
        r = c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "go"}], tools=TOOLS)  # type: ignore[arg-type]
        assert [tc.function.name for tc in r.choices[0].message.tool_calls or []] == ["read_file"]  # type: ignore[union-attr]
        assert r.choices[0].finish_reason == "tool_calls"
        # the extra round's error is the client's answer, verbatim
        with pytest.raises(openai.InternalServerError) as e:
            c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "go"}], tools=TOOLS)  # type: ignore[arg-type]
        assert "upstream broke" in str(e.value)
        # in a stream already under way it arrives as the API's error event
        events = []
        with httpx.stream(
            "POST", p.url + "/v1/messages", json={"model": "claude-opus-4-5", "max_tokens": 8, "stream": True, "tools": ANTHROPIC_TOOLS, "messages": [{"role": "user", "content": "go"}]}
        ) as resp:
            events = [line for line in resp.iter_lines() if line.startswith("event:")]
        assert events[-1] == "event: error" and "event: message_stop" not in events


def test_each_stage_of_a_request_is_timed(proxy: ProxyServer, stub: StubServer) -> None:
    msgs: list[Any] = [{"role": "user", "content": "x"}]
    for turn in range(3):
        oai(proxy, default_headers={SESSION_HEADER: "timed"}).chat.completions.create(model="gpt-4o", messages=msgs)
        msgs += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"turn {turn}"}]
    # each request's timings are observed once its response is out
    for stage in ("read", "parse", "upstream"):
        assert settled_metric(proxy, "ctxengine_proxy_stage_seconds_count", 3, api="openai", stage=stage) == 3, stage
    # the session's first request opens it in a worker thread; every turn only appends: on the event loop
    assert metric(proxy, "ctxengine_proxy_stage_seconds_count", api="openai", stage="open") == 1
    assert metric(proxy, "ctxengine_proxy_stage_seconds_count", api="openai", stage="plan_inline") == 3
    assert metric(proxy, "ctxengine_proxy_plans_total", api="openai", where="inline") == 3
    assert metric(proxy, "ctxengine_proxy_stage_seconds_sum", api="openai", stage="plan_inline") > 0
    # after each response: the usage and the turn's store write (the last may still be running)
    deadline = time.monotonic() + 5
    while metric(proxy, "ctxengine_proxy_stage_seconds_count", api="openai", stage="settle") < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert metric(proxy, "ctxengine_proxy_stage_seconds_count", api="openai", stage="record") == 3
    assert metric(proxy, "ctxengine_proxy_stage_seconds_count", api="openai", stage="settle") == 3
    # an edited turn branches, and its store write cannot wait: planned in a worker thread
    oai(proxy, default_headers={SESSION_HEADER: "timed"}).chat.completions.create(model="gpt-4o", messages=[*msgs[:2], {"role": "user", "content": "edited"}])
    for stage in ("plan_queue", "plan", "plan_return"):
        assert settled_metric(proxy, "ctxengine_proxy_stage_seconds_count", 1, api="openai", stage=stage) == 1, stage
    assert metric(proxy, "ctxengine_proxy_plans_total", api="openai", where="worker") == 1
    assert metric(proxy, "ctxengine_proxy_stage_seconds_sum", api="openai", stage="plan") > 0
