"""Two proxies on one store: one turn of a session at a time, each continuing from the store's
latest version of the session (``ctxengine.proxy.turns``).

The proxies run in this process (two :class:`ProxyServer` objects on one SQLite file: the turn
locks coordinate them as they do two processes); a real second process holds a lock in
:func:`test_a_lock_held_by_another_process_is_waited_for`. PostgreSQL: ``tests/store/test_proxy_shared_postgres.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

import ctxengine
from ctxengine.config import Config
from ctxengine.proxy.server import ProxyServer
from ctxengine.proxy.turns import FileTurns
from ctxengine.store import SqliteStore
from ctxengine.testing.stub_server import StubReply, StubServer

Msg = dict[str, Any]


def conversation(turns: int, size: int) -> list[Msg]:
    """An agent's session: a task, then tool calls whose outputs are ``size`` characters."""
    msgs: list[Msg] = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix the failing test in module alpha."}]
    for k in range(turns):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"cmd": f"cat file{k}.py"})}}
        msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        body = "\n".join(f"line {i} of file{k}.py: value_{k}_{i} = compute({i})" for i in range(size // 40))
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": body})
    return msgs


def cuts(msgs: list[Msg]) -> list[int]:
    return [*[j for j, m in enumerate(msgs) if m["role"] == "assistant"][1:], len(msgs)]


def config(stub: StubServer, db: Path, window: int) -> Config:
    return Config().with_overrides(
        proxy={"openai_base_url": stub.openai_base_url, "anthropic_base_url": stub.anthropic_base_url},
        store={"path": str(db)},
        models={"gpt-4o": {"context_length": window}},
    )


def replay(stub: StubServer, db: Path, n: int, msgs: list[Msg], window: int) -> list[list[Msg]]:
    """The session's turns sent to ``n`` proxies in turn; the bodies the upstream received."""
    proxies = [ProxyServer(config(stub, db, window)).start() for _ in range(n)]
    try:
        for k, end in enumerate(cuts(msgs)):
            url = proxies[k % n].openai_base_url + "/chat/completions"
            r = httpx.post(url, json={"model": "gpt-4o", "messages": msgs[:end]}, headers={"x-ctxengine-session": "s1", "authorization": "Bearer k"}, timeout=60)
            assert r.status_code == 200, r.text
    finally:
        for p in proxies:
            p.stop()
    return [list(q.body["messages"]) for q in stub.requests]


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer() as s:
        yield s


def test_turns_alternating_between_two_proxies_send_what_one_proxy_sends(stub: StubServer, tmp_path: Path) -> None:
    """No compaction due (a large window): the bodies are the client's, turn by turn, and the
    store holds every message once, in order."""
    msgs = conversation(8, 2_000)
    one = replay(stub, tmp_path / "one.db", 1, msgs, 1_000_000)
    stub.requests.clear()
    two = replay(stub, tmp_path / "two.db", 2, msgs, 1_000_000)
    assert two == one
    with SqliteStore(str(tmp_path / "two.db")) as store:
        assert store.originals("s1") == msgs


def test_each_turn_continues_from_the_stored_version_whatever_proxy_served_the_last(stub: StubServer, tmp_path: Path) -> None:
    """Compactions due (a small window): a turn served by the other proxy starts from what the
    last turn sent (its compacted context), never from a version of its own; the stored
    originals are exactly what the client sent and the stored history never moves back."""
    msgs = conversation(14, 6_000)
    bodies = replay(stub, tmp_path / "two.db", 2, msgs, 16_000)
    # a turn that does not compact sends the last turn's body and what is new; one that does
    # is a compaction in the store (a proxy continuing from a stale version of its own breaks
    # the prefix without one)
    breaks = sum(bodies[k][: len(bodies[k - 1])] != bodies[k - 1] for k in range(1, len(bodies)))
    with SqliteStore(str(tmp_path / "two.db")) as store:
        assert breaks >= 1
        assert breaks == len(store.compactions("s1"))
        assert store.originals("s1") == msgs
        seen: list[str] = []
        for ev in store.events("s1"):
            ids = store.history_ids("s1", at=f"event:{ev.number}")
            assert not (len(ids) < len(seen) and seen[: len(ids)] == ids), f"event {ev.number} moved the history back"
            seen = ids


def test_a_session_served_elsewhere_is_reloaded_and_counted(stub: StubServer, tmp_path: Path) -> None:
    msgs = conversation(4, 1_000)
    proxies = [ProxyServer(config(stub, tmp_path / "s.db", 1_000_000)).start() for _ in range(2)]
    try:
        for k, end in enumerate(cuts(msgs)):
            httpx.post(proxies[k % 2].openai_base_url + "/chat/completions", json={"model": "gpt-4o", "messages": msgs[:end]}, headers={"x-ctxengine-session": "s1"}, timeout=60)
        reloaded = [p.proxy.metrics.plans.labels("openai", "reloaded")._value.get() for p in proxies]
    finally:
        for p in proxies:
            p.stop()
    assert sum(reloaded) >= len(cuts(msgs)) - 2  # every turn after each proxy's first


def test_the_turn_lock_is_one_holder_at_a_time_and_moves_the_version(tmp_path: Path) -> None:
    a, b = FileTurns(str(tmp_path / "s.db")), FileTurns(str(tmp_path / "s.db"))
    try:
        t1 = a.take("s1", wait=0)
        assert t1 is not None and (t1.before, t1.after) == (0, 1)
        assert b.take("s1", wait=0) is None  # held by the other proxy
        again = a.take("s1", wait=0)  # its own holder takes it again (a record still pending)
        assert again is not None and again.before == 1
        other = b.take("s2", wait=0)
        assert other is not None  # another session is free
        other.release()
        again.release()
        assert b.take("s1", wait=0) is None  # still held once
        t1.release()
        t1.release()  # idempotent
        t2 = b.take("s1", wait=0)
        assert t2 is not None and t2.before == 2
        t2.release()
    finally:
        a.close()
        b.close()


def test_a_waiting_turn_gets_the_lock_once_it_is_released(tmp_path: Path) -> None:
    a, b = FileTurns(str(tmp_path / "s.db")), FileTurns(str(tmp_path / "s.db"))
    held = a.take("s1", wait=0)
    assert held is not None
    threading.Timer(0.1, held.release).start()
    started = time.monotonic()
    got = b.take("s1", wait=5)
    assert got is not None and got.before == 1 and time.monotonic() - started >= 0.09
    got.release()
    a.close()
    b.close()


def test_a_lock_held_by_another_process_is_waited_for(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    code = (
        "import sys, time; from ctxengine.proxy.turns import FileTurns\n"
        f"t = FileTurns({db!r}).take('s1', wait=0); print('held' if t else 'busy', flush=True); time.sleep(0.5); t.release(); time.sleep(5)\n"
    )
    src = str(Path(ctxengine.__file__).resolve().parents[1])
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": src})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        mine = FileTurns(db)
        assert mine.take("s1", wait=0) is None
        got = mine.take("s1", wait=10)
        assert got is not None and got.before == 1  # the other process's turn moved the version
        got.release()
        mine.close()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    ("replies", "stream"),
    [
        ([], False),
        ([], True),
        (["fail"], False),
        (["too_long"], False),  # rejected as over the window: planned again and sent once more
        (["too_long"], True),
    ],
)
def test_the_turn_is_free_for_another_process_once_the_response_is_out(stub: StubServer, tmp_path: Path, replies: list[str], stream: bool) -> None:
    made = {"fail": StubReply.fail(500), "too_long": StubReply.context_too_long()}
    stub.script(*(made[r] for r in replies))
    msgs = conversation(3, 2_000)
    db = tmp_path / "s.db"
    other = FileTurns(str(db))
    try:
        with ProxyServer(config(stub, db, 1_000_000)) as p:
            body = {"model": "gpt-4o", "messages": msgs, "stream": stream}
            httpx.post(p.openai_base_url + "/chat/completions", json=body, headers={"x-ctxengine-session": "s1"}, timeout=60).read()
            got = other.take("s1", wait=5)  # the turn's record is written after the response
            assert got is not None, "the session's turn stayed held after its response"
            assert got.before >= 1
            got.release()
    finally:
        other.close()
