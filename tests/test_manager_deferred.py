"""``prepare(defer_record=True)``: a turn that continues the session leaves its store write for
``flush_records``; the result and the store's record end up as without deferral, and nothing
reads or writes the session's record before the write ran."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from ctxengine.config import Config
from ctxengine.manager import CompactionDue, ContextManager
from ctxengine.messages import Message
from ctxengine.recall import GREP_TOOL
from ctxengine.store.sqlite import SqliteStore

SESSION = "s"


def _session(trajectories: list[dict[str, Any]], n: int = 120) -> list[Message]:
    msgs = max((t["messages"] for t in trajectories), key=len)
    return [dict(m) for m in msgs[:n]]


def _turn_ends(msgs: list[Message], start: int) -> list[int]:
    """The index after each assistant message and what followed it (one agent turn each)."""
    ends, i = [], start
    while i < len(msgs):
        j = i + 1
        while j < len(msgs) and msgs[j].get("role") != "assistant":
            j += 1
        ends.append(j)
        i = j
    return ends


def _mgr(store: SqliteStore | None, window: int = 1_000_000) -> ContextManager:
    return ContextManager(Config(), model="claude-sonnet-4.5", provider="anthropic", store=store, context_length=window)


def _replay(tmp: Path, msgs: list[Message], *, defer: bool, window: int = 1_000_000, flush_each: bool = True) -> tuple[list[list[Message]], SqliteStore, ContextManager]:
    store = SqliteStore(tmp / ("defer.db" if defer else "sync.db"))
    mgr = _mgr(store, window)
    outs = []
    start = 3
    working = mgr.prepare(msgs[:start], session_id=SESSION, defer_record=defer)
    for end in _turn_ends(msgs, start):
        working = mgr.prepare([*working, *msgs[start:end]], session_id=SESSION, defer_record=defer)
        outs.append(working)
        if flush_each:
            mgr.flush_records(SESSION)
        start = end
    mgr.flush_records()
    return outs, store, mgr


@pytest.mark.parametrize("window", [1_000_000, 16_000])
def test_deferred_turns_give_the_same_context_and_the_same_record(tmp_path: Path, trajectories: list[dict[str, Any]], window: int) -> None:
    """Also across compactions (the default engine cuts old outputs in any window; at 16K it
    summarises too), which write the pending turn before the engine runs."""
    msgs = _session(trajectories)
    sync, s_store, s_mgr = _replay(tmp_path, msgs, defer=False, window=window)
    assert s_mgr.status(SESSION)["compactions"] >= (2 if window < 100_000 else 1)  # digests fold in batches: fewer at 1M
    for flush_each in (True, False):  # flushed by the caller, or by the next turn
        where = tmp_path / f"flush_each_{flush_each}"
        where.mkdir()
        deferred, d_store, d_mgr = _replay(where, msgs, defer=True, window=window, flush_each=flush_each)
        assert deferred == sync
        assert d_store.history(SESSION) == s_store.history(SESSION)
        assert d_store.history_ids(SESSION) == s_store.history_ids(SESSION)
        assert d_store.originals(SESSION) == s_store.originals(SESSION) == msgs[: len(d_store.originals(SESSION))]
        assert [c.id for c in d_store.compactions(SESSION)] == [c.id for c in s_store.compactions(SESSION)]
        assert d_mgr.status(SESSION)["store_errors"] == 0


def test_the_write_waits_for_flush_or_the_next_call(tmp_path: Path, trajectories: list[dict[str, Any]]) -> None:
    msgs = _session(trajectories)
    store = SqliteStore(tmp_path / "s.db")
    mgr = _mgr(store)
    first = mgr.prepare(msgs[:3], session_id=SESSION, defer_record=True)  # a first turn waits too
    assert SESSION not in {s.id for s in store.list_sessions()}  # nothing written yet
    mgr.flush_records(SESSION)
    assert len(store.history_ids(SESSION)) == 3
    end = _turn_ends(msgs, 3)[0]
    second = mgr.prepare([*first, *msgs[3:end]], session_id=SESSION, defer_record=True)
    assert len(store.history_ids(SESSION)) == 3  # left pending
    mgr.flush_records(SESSION)
    assert store.history(SESSION) == msgs[:end]
    mgr.flush_records(SESSION)  # nothing left: no second write
    assert len(store.events(SESSION)) == 2
    # pending again, then the next call writes it before its own turn
    nxt = _turn_ends(msgs, end)[0]
    third = mgr.prepare([*second, *msgs[end:nxt]], session_id=SESSION, defer_record=True)
    assert len(store.history_ids(SESSION)) == end
    mgr.prepare([*third, {"role": "user", "content": "and now?"}], session_id=SESSION)
    mgr.flush_records()  # nothing stale left to write over the tip
    assert store.history(SESSION)[:nxt] == msgs[:nxt]
    assert store.history(SESSION)[-1] == {"role": "user", "content": "and now?"}


def test_a_turn_the_window_cuts_is_recorded_before_it_returns(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    config = Config()
    config.compression.enabled = False  # only the window cap acts
    mgr = ContextManager(config, model="gpt-4o", context_length=4_000, store=store)
    history: list[Message] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "start"}]
    out = mgr.prepare(history, session_id=SESSION, defer_record=True)
    big = "FATAL: disk quota exceeded in /var/lib/app/data.db\n" + "x " * 6_000
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}
    turn = [*out, call, {"role": "tool", "tool_call_id": "c1", "content": big}, {"role": "user", "content": "what failed?"}]
    capped = mgr.prepare(turn, session_id=SESSION, defer_record=True)
    assert big not in json.dumps(capped)  # the cap cut the output ...
    assert store.originals(SESSION)[-2]["content"] == big  # ... and its original is in the store already
    assert big not in json.dumps(store.history(SESSION))  # the store's tip is what was sent (the cut recorded)
    assert mgr.retrievable("FATAL: disk quota exceeded in /var/lib/app/data.db", session_id=SESSION)


def test_the_turn_after_a_compaction_leaves_its_whole_write_pending_too(tmp_path: Path, trajectories: list[dict[str, Any]]) -> None:
    """A compaction leaves the store's tip unknown to the history: the next turn records its
    whole list, and that write waits for ``flush_records`` as an append does."""
    msgs = _session(trajectories)
    store = SqliteStore(tmp_path / "s.db")
    mgr = _mgr(store)
    start, compactions, after_compaction, checked = 3, 0, False, 0
    working = mgr.prepare(msgs[:start], session_id=SESSION, defer_record=True)
    mgr.flush_records(SESSION)
    for end in _turn_ends(msgs, start):
        events = len(store.events(SESSION))
        working = mgr.prepare([*working, *msgs[start:end]], session_id=SESSION, defer_record=True)
        now = mgr.counters(SESSION)["compactions"]
        if after_compaction and now == compactions:
            assert len(store.events(SESSION)) == events  # left pending
            mgr.flush_records(SESSION)
            assert len(store.events(SESSION)) == events + 1
            assert store.history(SESSION) == working
            checked += 1
        after_compaction, compactions = now > compactions, now
        mgr.flush_records(SESSION)
        start = end
    assert checked >= 1


def test_recall_sees_a_pending_turn(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    mgr = ContextManager(Config(), model="gpt-4o", context_length=1_000_000, store=store)
    history: list[Message] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "start"}]
    out = mgr.prepare(history, session_id=SESSION, defer_record=True)
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}
    out = mgr.prepare([*out, call, {"role": "tool", "tool_call_id": "c1", "content": "needle-4711 in the haystack"}], session_id=SESSION, defer_record=True)
    answer = json.loads(mgr.handle_tool_call(GREP_TOOL, {"query": "needle-4711"}, session_id=SESSION))
    assert answer["results"] and "needle-4711" in answer["results"][0]["snippet"]


class _FailingAppends(SqliteStore):
    fail = False

    def append_messages(self, session_id: str, messages: Any, *, after: str | None = None) -> list[str]:
        if self.fail:
            raise OSError("disk full")
        return super().append_messages(session_id, messages, after=after)


def test_a_failed_deferred_write_is_counted_and_the_next_turn_records_in_full(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = _FailingAppends(tmp_path / "s.db")
    mgr = _mgr(store)
    out = mgr.prepare([{"role": "system", "content": "sys"}, {"role": "user", "content": "one"}], session_id=SESSION, defer_record=True)
    out = mgr.prepare([*out, {"role": "assistant", "content": "a"}, {"role": "user", "content": "two"}], session_id=SESSION, defer_record=True)
    store.fail = True
    mgr.flush_records(SESSION)  # never raises: counted and logged, as a failed write in prepare
    assert mgr.status(SESSION)["store_errors"] == 1
    assert "disk full" in caplog.text
    store.fail = False
    final = [*out, {"role": "assistant", "content": "b"}, {"role": "user", "content": "three"}]
    mgr.prepare(final, session_id=SESSION)
    assert store.history(SESSION) == final  # the lost turn's messages are recorded with the next


def test_flush_records_without_pending_work_or_unknown_session_does_nothing() -> None:
    mgr = _mgr(SqliteStore(":memory:"))
    mgr.flush_records()
    mgr.flush_records("nobody")
    assert mgr.sessions == []


# -- prepare(may_compact=False): the cheap turn, or CompactionDue before anything changed ------
def _quiet_first(mgr: ContextManager, msgs: list[Message], reasons: list[str]) -> list[Message]:
    """What a caller on an event loop does: the cheap turn, else the full call."""
    try:
        return mgr.prepare(msgs, session_id=SESSION, defer_record=True, may_compact=False)
    except CompactionDue as exc:
        reasons.append(exc.reason)
        return mgr.prepare(msgs, session_id=SESSION, defer_record=True)


@pytest.mark.parametrize("window", [1_000_000, 16_000])
def test_the_cheap_turn_first_gives_the_same_contexts_and_record(tmp_path: Path, trajectories: list[dict[str, Any]], window: int) -> None:
    msgs = _session(trajectories)
    sync, s_store, s_mgr = _replay(tmp_path, msgs, defer=False, window=window)
    store = SqliteStore(tmp_path / "quiet.db")
    mgr = _mgr(store, window)
    reasons: list[str] = []
    working = _quiet_first(mgr, msgs[:3], reasons)
    outs, start = [], 3
    for i, end in enumerate(_turn_ends(msgs, start)):
        working = _quiet_first(mgr, [*working, *msgs[start:end]], reasons)
        outs.append(working)
        if i % 2:  # flushed after the reply, or left for the next call
            mgr.flush_records(SESSION)
        start = end
    mgr.flush_records()
    assert outs == sync
    assert store.history(SESSION) == s_store.history(SESSION)
    assert store.originals(SESSION) == s_store.originals(SESSION)
    assert mgr.status(SESSION)["compactions"] == s_mgr.status(SESSION)["compactions"] >= (2 if window < 100_000 else 1)  # digests fold in batches
    assert "a deferred store write is pending" in reasons  # the turns not flushed in between
    assert len(reasons) < len(outs)  # most turns were cheap
    if window == 16_000:
        assert {"the engine compacts", "session hygiene fires", "the window cap cuts"} & set(reasons)


def _state(mgr: ContextManager, store: SqliteStore) -> tuple[Any, ...]:
    st = mgr.status(SESSION)
    return st["turns"], st["compactions"], st["last_tokens"], st["window_cuts"], store.history_ids(SESSION), list(mgr._session(SESSION).history.working)


def test_compaction_due_is_raised_before_anything_changes(tmp_path: Path, trajectories: list[dict[str, Any]]) -> None:
    msgs = _session(trajectories)
    store = SqliteStore(tmp_path / "s.db")
    mgr = _mgr(store, 16_000)
    working = mgr.prepare(msgs[:3], session_id=SESSION)
    start, raised = 3, 0
    for end in _turn_ends(msgs, start):
        turn = [*working, *msgs[start:end]]
        before = _state(mgr, store)
        try:
            working = mgr.prepare(turn, session_id=SESSION, defer_record=True, may_compact=False)
            mgr.flush_records(SESSION)
            assert working == turn  # the cheap turn only appends
        except CompactionDue:
            raised += 1
            assert _state(mgr, store) == before
            working = mgr.prepare(turn, session_id=SESSION)
        start = end
    assert raised and mgr.status(SESSION)["compactions"] >= 2


def test_the_cheap_turn_never_waits_for_the_session_lock(tmp_path: Path) -> None:
    mgr = _mgr(SqliteStore(tmp_path / "s.db"))
    out = mgr.prepare([{"role": "system", "content": "sys"}, {"role": "user", "content": "one"}], session_id=SESSION)
    turn = [*out, {"role": "assistant", "content": "a"}, {"role": "user", "content": "two"}]
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with mgr._session(SESSION).lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    try:
        with pytest.raises(CompactionDue, match="holds the session"):
            mgr.prepare(turn, session_id=SESSION, defer_record=True, may_compact=False)
    finally:
        release.set()
        t.join()
    assert mgr.prepare(turn, session_id=SESSION, defer_record=True, may_compact=False) == turn


def test_the_cheap_turn_releases_the_session_lock_when_it_refuses(tmp_path: Path) -> None:
    mgr = _mgr(SqliteStore(tmp_path / "s.db"))
    first = [{"role": "system", "content": "sys"}, {"role": "user", "content": "one"}]
    mgr.prepare(first, session_id=SESSION)
    turn = [*first, {"role": "assistant", "content": "a"}, {"role": "user", "content": "two"}]
    with pytest.raises(CompactionDue, match="written to the store now"):  # raised inside the held block
        mgr.prepare(turn, session_id=SESSION, may_compact=False)
    free: list[bool] = []

    def take() -> None:  # another thread: an RLock left held by this one would refuse it
        lock = mgr._session(SESSION).lock
        free.append(lock.acquire(blocking=False))
        if free[-1]:
            lock.release()

    t = threading.Thread(target=take)
    t.start()
    t.join()
    assert free == [True]


def test_the_cheap_turn_refuses_a_write_now_and_a_reset(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    mgr = _mgr(store)
    first = [{"role": "system", "content": "sys"}, {"role": "user", "content": "one"}]
    with pytest.raises(CompactionDue, match="written to the store now"):  # a first turn without defer_record
        mgr.prepare(first, session_id=SESSION, may_compact=False)
    out = mgr.prepare(first, session_id=SESSION)
    turn = [*out, {"role": "assistant", "content": "a"}, {"role": "user", "content": "two"}]
    with pytest.raises(CompactionDue, match="written to the store now"):  # without defer_record
        mgr.prepare(turn, session_id=SESSION, may_compact=False)
    assert mgr.prepare(turn, session_id=SESSION, defer_record=True, may_compact=False) == turn
    # no store: nothing is written, the turn is cheap
    bare = _mgr(None)
    bare.prepare(first, session_id=SESSION)
    assert bare.prepare(turn, session_id=SESSION, may_compact=False) == turn


def test_the_cheap_turn_refuses_an_edit_of_the_compacted_part(tmp_path: Path, trajectories: list[dict[str, Any]]) -> None:
    msgs = _session(trajectories)
    store = SqliteStore(tmp_path / "s.db")
    mgr = _mgr(store, 16_000)
    start = 3
    mgr.prepare(msgs[:start], session_id=SESSION)
    for end in _turn_ends(msgs, start):  # the raw history resent every turn, until a compaction
        mgr.prepare(msgs[:end], session_id=SESSION)
        start = end
        if mgr.status(SESSION)["compactions"]:
            break
    edited = [msgs[0], {**msgs[1], "content": "an edited first request"}, *msgs[2:start]]
    before = _state(mgr, store)
    with pytest.raises(CompactionDue, match="where it was compacted"):
        mgr.prepare(edited, session_id=SESSION, defer_record=True, may_compact=False)
    assert _state(mgr, store) == before
    assert mgr.prepare(edited, session_id=SESSION)[1]["content"] == "an edited first request"


def _refs(messages: list[Message]) -> list[str]:
    """The ``ref=`` ids the compacted context's markers name."""
    import re

    return [r for m in messages for r in re.findall(r"ref=([0-9a-f]{16})", str(m.get("content") or ""))]


class _Spy(SqliteStore):
    """Counts the store's node writes and which of them came with a compaction's record."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.alone: list[str] = []
        self.with_compaction: list[str] = []

    def add_nodes(self, session_id: str, nodes: Any, *, messages: Any = ()) -> list[bool]:
        self.alone += [n.id for n in nodes]
        return super().add_nodes(session_id, nodes, messages=messages)

    def record_compaction(self, session_id: str, report: Any, before: Any, after: Any, *, nodes: Any = (), node_messages: Any = ()) -> str:
        self.with_compaction += [n.id for n in nodes]
        return super().record_compaction(session_id, report, before, after, nodes=nodes, node_messages=node_messages)


@pytest.mark.parametrize("defer", [False, True])
def test_a_compactions_nodes_are_written_with_its_record(tmp_path: Path, trajectories: list[dict[str, Any]], defer: bool) -> None:
    """The default engine stages the nodes its markers name; the host stores them in the
    compaction's own transaction (left pending with it when the turn defers its writes), and
    ``ctx_expand`` gives each back verbatim."""
    msgs = _session(trajectories)
    store = _Spy(tmp_path / "spy.db")
    mgr = _mgr(store, 16_000)
    start, working = 3, mgr.prepare(msgs[:3], session_id=SESSION, defer_record=defer)
    refs: list[str] = []
    for end in _turn_ends(msgs, start):
        working = mgr.prepare([*working, *msgs[start:end]], session_id=SESSION, defer_record=defer)
        start = end
        refs = _refs(working)
        if refs:
            break
    assert refs, "the session never compacted"
    assert store.alone == []  # no write of its own from inside the engine
    if defer:  # pending with the compaction's record until something reads the session
        assert store.with_compaction == []
    answer = mgr.handle_tool_call("ctx_expand", {"ref": refs[0]}, session_id=SESSION)
    assert set(refs) <= set(store.with_compaction)
    texts = [str(m["content"]) for _, m in store.node_messages(refs[0]) if isinstance(m.get("content"), str) and m["content"]]
    assert texts and all(t.split("\n", 1)[0][:60] in answer for t in texts)
    assert mgr.status(SESSION)["store_errors"] == 0
