"""Two proxies on one PostgreSQL database: one turn of a session at a time, each continuing from
the store's latest version (``ctxengine.proxy.turns.PgTurns``); see ``tests/test_proxy_shared_store.py``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2 as httpx
import pytest

from ctxengine.config import Config
from ctxengine.proxy.server import ProxyServer
from ctxengine.proxy.turns import PgTurns
from ctxengine.store.postgres import PostgresStore
from ctxengine.testing.stub_server import StubServer
from test_proxy_shared_store import conversation, cuts

pytestmark = pytest.mark.postgres


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer() as s:
        yield s


def test_turns_alternating_between_two_proxies_continue_from_the_stored_version(stub: StubServer, pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXENGINE_STORE_DSN", pg_dsn)
    cfg = Config().with_overrides(
        proxy={"openai_base_url": stub.openai_base_url, "anthropic_base_url": stub.anthropic_base_url},
        store={"backend": "postgres"},
        models={"gpt-4o": {"context_length": 16_000}},
    )
    msgs = conversation(14, 6_000)
    proxies = [ProxyServer(cfg).start() for _ in range(2)]
    try:
        for k, end in enumerate(cuts(msgs)):
            r = httpx.post(proxies[k % 2].openai_base_url + "/chat/completions", json={"model": "gpt-4o", "messages": msgs[:end]}, headers={"x-ctxengine-session": "s1"}, timeout=60)
            assert r.status_code == 200, r.text
    finally:
        for p in proxies:
            p.stop()
    bodies = [list(q.body["messages"]) for q in stub.requests]
    breaks = sum(bodies[k][: len(bodies[k - 1])] != bodies[k - 1] for k in range(1, len(bodies)))
    store = PostgresStore(pg_dsn)
    try:
        assert store.originals("s1") == msgs
        assert breaks >= 1
        assert breaks == len(store.compactions("s1"))
    finally:
        store.close()


def test_a_turn_held_by_another_connection_is_waited_for(pg_dsn: str) -> None:
    a, b = PgTurns(pg_dsn), PgTurns(pg_dsn)
    import threading

    try:
        held = a.take("s1", wait=1)
        assert held is not None and held.before == 0
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(b.take("s1", wait=0.05)))
        t.start()
        t.join()
        assert got == [None]
        held.release()
        again = b.take("s1", wait=1)
        assert again is not None and again.before == 1
        again.release()
    finally:
        a.close()
        b.close()
