"""The proxy's fail-open path never sends an over-window history: an engine that raises or
whose output is rejected leaves the turn to the window cap, and a failure elsewhere in planning
sends the client's request held under the window by the window cap alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from ctxengine.config import Config
from ctxengine.engines.compressor import ContextCompressor
from ctxengine.manager import ContextManager
from ctxengine.messages import Message, validate
from ctxengine.proxy import SESSION_HEADER, ProxyServer
from ctxengine.proxy.apis import OPENAI
from ctxengine.testing.stub_server import StubReply, StubServer

WINDOW = 8000


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer() as s:
        s.responder = lambda req: StubReply.ok("ack")
        yield s


def config(stub: StubServer, tmp_path: Path) -> Config:
    return Config().with_overrides(
        proxy={"openai_base_url": stub.openai_base_url, "anthropic_base_url": stub.anthropic_base_url},
        store={"path": str(tmp_path / "sessions.db")},
        model={"context_length": WINDOW},
        context={"engine": "compressor"},
    )


def long_history(turns: int) -> list[Message]:
    """A tool-using history of about ``turns`` × 700 tokens: well over the window at 30 turns."""
    msgs: list[Message] = [{"role": "system", "content": "You are a careful agent."}, {"role": "user", "content": "fix the failing build"}]
    for t in range(turns):
        call = {"id": f"call_{t}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/mod{t}.py"})}}
        body = "\n".join(f"line {i} of src/mod{t}.py: value = compute({i}, {t})" for i in range(60))
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": f"call_{t}", "content": body}]
    msgs.append({"role": "user", "content": "now run the tests"})
    return msgs


def post(p: ProxyServer, msgs: list[Message], session: str) -> httpx.Response:
    return httpx.post(
        p.openai_base_url + "/chat/completions",
        json={"model": "gpt-4o", "messages": msgs},
        headers={"authorization": "Bearer sk-test", SESSION_HEADER: session},
        timeout=30,
    )


def assert_within_window(p: ProxyServer, sent: list[Message], history: list[Message]) -> None:
    mgr = p.proxy.manager(OPENAI, "gpt-4o")
    assert mgr.window.measure(history) > mgr.window.limit  # the client's history is over the window
    assert mgr.window.measure(sent) <= mgr.window.limit
    assert validate(sent) == []
    assert sent[0] == history[0] and sent[-1] == history[-1]  # the anchors are kept


def test_an_engine_that_raises_leaves_the_window_to_the_cap(stub: StubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self: ContextCompressor, messages: list[Message], *a: Any, **k: Any) -> list[Message]:
        raise RuntimeError("engine exploded")

    monkeypatch.setattr(ContextCompressor, "compress", boom)
    history = long_history(30)
    with ProxyServer(config(stub, tmp_path)) as p:
        r = post(p, history, "raises")
        assert r.status_code == 200
        assert_within_window(p, stub.requests[-1].body["messages"], history)
        status = p.proxy.manager(OPENAI, "gpt-4o").status("raises")
        assert status["engine_errors"] >= 1


def test_a_rejected_engine_output_leaves_the_window_to_the_cap(stub: StubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def drops_the_user(self: ContextCompressor, messages: list[Message], *a: Any, **k: Any) -> list[Message]:
        return [messages[0]] + [m for m in messages[-8:] if m.get("role") != "user"]  # rule 5 broken

    monkeypatch.setattr(ContextCompressor, "compress", drops_the_user)
    history = long_history(30)
    with ProxyServer(config(stub, tmp_path)) as p:
        assert post(p, history, "rejected").status_code == 200
        assert_within_window(p, stub.requests[-1].body["messages"], history)
        # the next turn is planned as usual
        history2 = [*history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and again"}]
        assert post(p, history2, "rejected").status_code == 200
        assert_within_window(p, stub.requests[-1].body["messages"], history2)


def test_a_failure_outside_the_engine_sends_the_request_held_under_the_window(stub: StubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self: ContextManager, *a: Any, **k: Any) -> Any:
        raise RuntimeError("planning exploded")

    monkeypatch.setattr(ContextManager, "prepare", boom)
    history = long_history(30)
    with ProxyServer(config(stub, tmp_path)) as p:
        assert post(p, history, "outside").status_code == 200
        sent = stub.requests[-1].body["messages"]
        assert_within_window(p, sent, history)
        # what the window cap cut is in the session's store first, and its markers point there
        cut = [m for m, h in zip(sent, history, strict=False) if m != h and m.get("role") == "tool"]
        assert cut and all("kept verbatim in the session store" in m["content"].split("\n")[0] for m in cut)
        store = p.proxy.manager(OPENAI, "gpt-4o").store
        assert store is not None
        hits = store.search("line 37 of src/mod3.py: value = compute(37, 3)")
        assert hits and all(hit.role == "tool" for hit in hits)
        # a request that fits goes as the client sent it
        small = [{"role": "user", "content": "hello"}]
        assert post(p, small, "outside-small").status_code == 200
        assert stub.requests[-1].body["messages"] == small
