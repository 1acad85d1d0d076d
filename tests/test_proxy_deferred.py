"""The proxy's store write after the response, and quick turns planned on the event loop.

With a local store (SQLite) a turn that only appends is planned on the event loop and its store
write runs once the response is out; the session's next request waits for it. Whatever goes
wrong with that write (an error, a process that dies first), no message is lost: the client
resends its history, and the turn is recorded with the next one.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ctxengine.kernel.engines import EngineHost
from ctxengine.messages import Message
from ctxengine.proxy.apis import ANTHROPIC, OPENAI
from ctxengine.proxy.base import is_local as _is_local
from ctxengine.proxy.server import ProxyServer
from ctxengine.proxy.session import SESSION_HEADER
from ctxengine.store import SqliteStore
from ctxengine.testing.stub_server import StubReply, StubServer
from test_proxy import make_config  # the proxy tests' config: stub upstreams, a store in tmp_path

KEY = "sk-deferred-0123456789"


@pytest.fixture
def stub() -> StubServer:
    with StubServer() as s:
        s.responder = lambda req: StubReply(text="re:" + _last_text(req.body["messages"]), chunks=3, usage={"cache_read_input_tokens": 5})
        yield s


def _last_text(messages: list[Any]) -> str:
    content = messages[-1].get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _metric(p: ProxyServer, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(httpx.get(p.url + "/metrics").text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


class _GatedStore(SqliteStore):
    """A SQLite store whose appends wait for ``gate`` (a slow disk), or fail while ``fail``."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()
        self.fail = False

    def append_messages(self, session_id: str, messages: Sequence[Message], *, after: str | None = None) -> list[str]:
        self.waiting.set()
        assert self.gate.wait(20)
        if self.fail:
            raise OSError("disk full")
        return super().append_messages(session_id, messages, after=after)


def _turn(p: ProxyServer, api: str, sid: str, msgs: list[dict[str, Any]]) -> str:
    """One turn through the official SDK (Anthropic streamed, OpenAI not); the reply's text."""
    if api == "openai":
        r = openai.OpenAI(base_url=p.openai_base_url, api_key=KEY, max_retries=0).chat.completions.create(
            model="gpt-4o", messages=msgs, extra_headers={SESSION_HEADER: sid}  # type: ignore[arg-type]
        )
        return str(r.choices[0].message.content)
    c = anthropic.Anthropic(base_url=p.anthropic_base_url, api_key=KEY, max_retries=0)
    with c.messages.stream(model="claude-sonnet-4-5", max_tokens=16, messages=msgs, extra_headers={SESSION_HEADER: sid}) as s:  # type: ignore[arg-type]
        final = s.get_final_message()
    return "".join(b.text for b in final.content if b.type == "text")


def _stored(store: SqliteStore, api: str, sid: str) -> list[str]:
    return [_last_text([m]) for m in store.history(sid) if m.get("role") != "system"]


def _texts(msgs: list[dict[str, Any]]) -> list[str]:
    return [_last_text([m]) for m in msgs]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_the_write_runs_after_the_response_and_before_the_next_turn(stub: StubServer, tmp_path: Path, api: str) -> None:
    store = _GatedStore(tmp_path / "gated.db")
    with ProxyServer(make_config(stub, tmp_path), store=store) as p:
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "one"}]
        msgs.append({"role": "assistant", "content": _turn(p, api, "g", msgs)})  # a first turn is written before it goes upstream
        msgs.append({"role": "user", "content": "two"})
        store.gate.clear()
        store.waiting.clear()
        reply = _turn(p, api, "g", msgs)  # answered while its write waits for the disk
        assert reply == "re:two"
        assert store.waiting.wait(5) and _stored(store, api, "g") == ["one"]
        msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "three"}]
        done: list[str] = []
        nxt = threading.Thread(target=lambda: done.append(_turn(p, api, "g", msgs)))
        nxt.start()
        time.sleep(0.3)
        assert not done and len(stub.requests) == 2  # the next turn waits for the previous write
        store.gate.set()
        nxt.join(10)
        assert done == ["re:three"]
        assert len(stub.requests) == 3
        assert _metric(p, "ctxengine_proxy_plans_total", api=api, where="inline") >= 1
        manager = p.proxy.manager(OPENAI if api == "openai" else ANTHROPIC, "gpt-4o" if api == "openai" else "claude-sonnet-4-5")
        assert manager.status("g")["cache_read_tokens"] >= 10  # every earlier response's usage reached the manager
    assert _stored(store, api, "g") == _texts(msgs)  # every message once, in order (the last reply comes with the next turn)


def test_a_failed_write_is_counted_logged_and_nothing_is_lost(stub: StubServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = _GatedStore(tmp_path / "failing.db")
    with caplog.at_level(logging.WARNING, logger="ctxengine"), ProxyServer(make_config(stub, tmp_path), store=store) as p:
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "one"}]
        msgs += [{"role": "assistant", "content": _turn(p, "openai", "f", msgs)}, {"role": "user", "content": "two"}]
        store.fail = True
        msgs += [{"role": "assistant", "content": _turn(p, "openai", "f", msgs)}, {"role": "user", "content": "three"}]
        deadline = time.monotonic() + 5
        manager = p.proxy.manager(OPENAI, "gpt-4o")
        while manager.status("f")["store_errors"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert manager.status("f")["store_errors"] == 1
        assert "disk full" in caplog.text
        store.fail = False
        assert _turn(p, "openai", "f", msgs) == "re:three"  # the client never noticed
    assert _stored(store, "openai", "f") == _texts(msgs)  # the lost turn's messages came with the next


def test_a_turn_lost_to_a_crash_is_recorded_with_the_next(stub: StubServer, tmp_path: Path) -> None:
    """The process serving turn 2 dies before writing it; another process serves turn 3 (the
    client resends its history) and the store ends up with every message once."""
    cfg = make_config(stub, tmp_path)
    crashed = _GatedStore(tmp_path / "sessions.db")
    first = ProxyServer(cfg, store=crashed).start()
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one"}]
    msgs += [{"role": "assistant", "content": _turn(first, "openai", "c", msgs)}, {"role": "user", "content": "two"}]
    crashed.gate.clear()
    msgs += [{"role": "assistant", "content": _turn(first, "openai", "c", msgs)}, {"role": "user", "content": "three"}]
    assert crashed.waiting.wait(5)  # turn 2's write never makes it to the disk
    with SqliteStore(tmp_path / "sessions.db") as store:
        assert _stored(store, "openai", "c") == ["one"]
        with ProxyServer(cfg) as second:  # the restarted proxy (the same SQLite file)
            assert _turn(second, "openai", "c", msgs) == "re:three"
        assert _stored(store, "openai", "c") == _texts(msgs[1:])
        assert [m["content"] for m in store.originals("c")] == _texts(msgs)
    crashed.fail = True  # the dead process's write: nothing reaches the file
    crashed.gate.set()
    first.stop()
    with SqliteStore(tmp_path / "sessions.db") as store:
        assert _stored(store, "openai", "c") == _texts(msgs[1:])


@pytest.mark.parametrize("summarizer", ["llm", "extractive", "extractive-over-the-bound"])
def test_where_a_turn_that_compacts_is_planned(stub: StubServer, tmp_path: Path, caplog: pytest.LogCaptureFixture, summarizer: str) -> None:
    """A compaction that may call a summarizer for seconds never runs on the event loop; one
    that is local work (the extractive summary) on a small context is planned there like a
    quick turn."""
    loop_threads: set[int] = set()
    compacting_threads: set[int] = set()
    real = EngineHost.compress

    def spy(self: EngineHost, *args: Any, **kwargs: Any) -> Any:
        compacting_threads.add(threading.get_ident())
        return real(self, *args, **kwargs)

    stub.responder = lambda req: StubReply.ok("ack " + "z" * 40)
    # the summarizing path: it compacts a chat of user turns (digests fold tool exchanges)
    llm = {"compression": {"model": "gpt-4o-mini", "base_url": stub.openai_base_url, "api_key_env": "CTXENGINE_TEST_SUMMARY_KEY"}}
    cfg = make_config(
        stub, tmp_path, context={"engine": "compressor"}, compression={"mode": "summary"}, model={"context_length": 6000}, **({"auxiliary": llm} if summarizer == "llm" else {}),
        proxy={"inline_compaction_tokens": 0 if summarizer.endswith("bound") else 32_000},
    )
    with pytest.MonkeyPatch.context() as mp, caplog.at_level(logging.DEBUG, logger="ctxengine.proxy"):
        mp.setenv("CTXENGINE_TEST_SUMMARY_KEY", KEY)
        mp.setattr(EngineHost, "compress", spy)
        with ProxyServer(cfg) as p:
            assert p._thread is not None
            loop_threads.add(p._thread.ident or 0)
            c = openai.OpenAI(base_url=p.openai_base_url, api_key=KEY, max_retries=0, default_headers={SESSION_HEADER: "compacting"})
            msgs: list[Any] = [{"role": "system", "content": "You are a careful agent."}, {"role": "user", "content": "fix the build"}]
            for turn in range(30):
                msgs.append({"role": "user", "content": f"turn {turn}: " + "log line with details about the build\n" * 30})
                r = c.chat.completions.create(model="gpt-4o", messages=msgs)
                msgs.append({"role": "assistant", "content": r.choices[0].message.content})
            assert p.proxy.manager(OPENAI, "gpt-4o").status("compacting")["compactions"] >= 1
            inline = _metric(p, "ctxengine_proxy_plans_total", api="openai", where="inline")
            worker = _metric(p, "ctxengine_proxy_plans_total", api="openai", where="worker")
    planned = [getattr(r, "fields", {}).get("planned") for r in caplog.records if r.getMessage() == "request"]
    assert planned.count("inline") == inline and inline + worker == 30
    if summarizer == "extractive":  # local work: the loop compacts, only opening took a worker
        assert compacting_threads and compacting_threads <= loop_threads
        assert inline >= 29 and "worker: the engine compacts" not in planned
        return
    assert compacting_threads and not compacting_threads & loop_threads
    assert inline >= 5 and worker >= 2
    # each request's log line says where it was planned, and why a worker thread
    assert any(str(p).startswith("worker: ") and p != "worker: " for p in planned)
    assert "worker: the engine compacts" in planned


class _SharedStore:
    """A store the proxy cannot tell to be local (a PostgreSQL store, for what matters here)."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_shared_store_has_each_turn_before_it_goes_upstream(stub: StubServer, tmp_path: Path) -> None:
    """Another proxy process may serve the session's next turn: it must find this one written."""
    inner = SqliteStore(tmp_path / "shared.db")
    seen: list[list[str]] = []
    stub.responder = lambda req: (seen.append(_stored(inner, "openai", "sh")), StubReply.ok("ok"))[1]
    assert _is_local(None) and _is_local(inner) and not _is_local(_SharedStore(inner))  # type: ignore[arg-type]
    with ProxyServer(make_config(stub, tmp_path), store=_SharedStore(inner)) as p:  # type: ignore[arg-type]
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "one"}]
        for turn in range(3):
            msgs += [{"role": "assistant", "content": _turn(p, "openai", "sh", msgs)}, {"role": "user", "content": f"more {turn}"}]
        assert _metric(p, "ctxengine_proxy_plans_total", api="openai", where="inline") == 0
    assert seen == [_texts(msgs[: 2 * k + 1]) for k in range(3)]  # the upstream was called with each turn already in the store
    assert json.dumps(inner.history("sh"))
