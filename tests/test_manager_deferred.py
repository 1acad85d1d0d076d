"""``prepare(defer_record=True)``: a turn that appends to the session leaves its store write for
``flush_records``; the result and the store's record end up as without deferral, and nothing
reads or writes the session's record before the write ran."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctxengine.config import Config
from ctxengine.manager import ContextManager
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
    assert s_mgr.status(SESSION)["compactions"] >= 2
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
    first = mgr.prepare(msgs[:3], session_id=SESSION, defer_record=True)  # a first turn records now
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
    assert store.history(SESSION)[-2]["content"] == big  # ... and its original is in the store already
    assert mgr.retrievable("FATAL: disk quota exceeded in /var/lib/app/data.db", session_id=SESSION)


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
