"""The proxy's memory follows its live sessions: a session it ended (idle) leaves nothing behind
in the proxy's, the manager's or the store object's memory (its record stays in the store)."""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from ctxengine.config import Config
from ctxengine.proxy.server import ProxyServer
from ctxengine.store import ids as store_ids
from ctxengine.testing.stub_server import StubServer
from test_proxy_shared_store import conversation, cuts


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[ProxyServer]:
    with StubServer() as stub:
        stub.requests = deque(maxlen=2)  # type: ignore[assignment]
        cfg = Config().with_overrides(
            proxy={"openai_base_url": stub.openai_base_url, "anthropic_base_url": stub.anthropic_base_url, "session_idle_seconds": 3600},
            store={"path": str(tmp_path / "s.db")},
            models={"gpt-4o": {"context_length": 16_000}},  # compactions happen
        )
        with ProxyServer(cfg) as p:
            yield p


def serve(p: ProxyServer, sessions: range) -> None:
    msgs = conversation(6, 4_000)
    with httpx.Client(timeout=60) as c:
        for n in sessions:
            for end in cuts(msgs):
                r = c.post(p.openai_base_url + "/chat/completions", json={"model": "gpt-4o", "messages": msgs[:end]}, headers={"x-ctxengine-session": f"s{n}"})
                assert r.status_code == 200, r.text


def end_all(p: ProxyServer) -> int:
    time.sleep(0.3)  # the last turns' writes, after their responses
    p.proxy.sessions.idle_seconds = 0.0
    ended = p.proxy.end_idle_sessions(time.monotonic() + 1)
    p.proxy.sessions.idle_seconds = 3600
    return ended


def test_ended_sessions_leave_no_state_in_any_owner(proxy: ProxyServer) -> None:
    store_ids._by_text.clear()  # process-wide: other tests' stores may have left entries
    store_ids._by_text_chars[0] = 0
    serve(proxy, range(12))
    assert end_all(proxy) == 12
    px = proxy.proxy
    assert len(px.sessions) == 0
    for mgr in px._managers.values():
        assert mgr._table.ids() == []
        assert mgr.window_counter._by_message == {}
        store = mgr.store
        assert store is not None
        assert store._chains == {}  # type: ignore[attr-defined]
        assert len(store._prepared) == 0  # type: ignore[attr-defined]
    assert all(seen[0] is not None for seen in store_ids._by_text.values())
    assert len(store_ids._by_text) <= 2  # the shared system/user texts at most, not 12 sessions' outputs


def test_memory_does_not_grow_with_the_sessions_served(proxy: ProxyServer) -> None:
    serve(proxy, range(10))  # warm: imports, first-use caches
    end_all(proxy)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        serve(proxy, range(10, 50))
        assert end_all(proxy) == 40
        gc.collect()
        grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    # each session sent ~25 KB of tool outputs, kept as recorded, compacted and written; what
    # an ended session may leave is a few kilobytes of caches, not its messages
    assert grown / 40 < 8_000, f"{grown / 40:.0f} bytes kept per ended session"


def test_a_session_ended_and_forgotten_resumes_from_the_store(proxy: ProxyServer) -> None:
    msgs = conversation(8, 4_000)
    ends = cuts(msgs)
    with httpx.Client(timeout=60) as c:

        def turn(end: int) -> None:
            r = c.post(proxy.openai_base_url + "/chat/completions", json={"model": "gpt-4o", "messages": msgs[:end]}, headers={"x-ctxengine-session": "back"})
            assert r.status_code == 200, r.text

        for end in ends[:5]:
            turn(end)
        assert end_all(proxy) == 1
        for end in ends[5:]:
            turn(end)
    time.sleep(0.3)
    store = next(iter(proxy.proxy._managers.values())).store
    assert store is not None
    assert store.originals("back") == msgs  # type: ignore[attr-defined]
