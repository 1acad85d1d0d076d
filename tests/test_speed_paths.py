"""The compacting turn's fast paths give the results of the slow ones: JSON copies told from
lookalikes, an engine's untouched copies given back as the caller's messages, a worker thread
reused for calls under a deadline."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from ctxengine.engine import ContextEngine
from ctxengine.loop import run_compress
from ctxengine.messages import Message
from ctxengine.store.ids import canonical_json, same_json, same_prefix
from ctxengine.workers import call_within


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"x": 1}, {"x": 1.0}),
        ({"x": 1}, {"x": True}),
        ({"x": 0.0}, {"x": -0.0}),
        ({"x": [1, 2]}, {"x": [1, 2, 3]}),
        ({"x": "a"}, {"y": "a"}),
        ({"x": None}, {"x": "None"}),
        ({"x": {"y": 1}}, {"x": {"y": 2}}),
    ],
)
def test_lookalikes_whose_json_differs_are_not_the_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert canonical_json(a) != canonical_json(b)
    assert not same_json(a, b) and not same_json(b, a)


def test_copies_are_the_same_json() -> None:
    m = {"role": "assistant", "content": "x" * 5000, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}], "n": 3, "f": 1.5, "b": False}
    copy = {**m, "tool_calls": [{**m["tool_calls"][0], "function": dict(m["tool_calls"][0]["function"])}]}
    decoded = {"role": "assistant", "content": "".join(["x"] * 5000), "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}], "n": 3, "f": 1.5, "b": False}
    assert same_json(m, copy) and same_json(m, decoded)
    assert canonical_json(m) == canonical_json(decoded)
    originals = [m, {"role": "user", "content": "hi"}, {"role": "tool", "content": "a"}]
    assert same_prefix([copy, {"role": "user", "content": "hi"}, {"role": "tool", "content": "b"}], originals) == 2
    assert same_prefix(originals, originals) == 3


def test_an_engine_s_untouched_copies_come_back_as_the_caller_s_messages() -> None:
    msgs: list[Message] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
    ]

    class Keep(ContextEngine):
        @property
        def name(self) -> str:
            return "keep"

        def update_from_response(self, usage: Any) -> None:
            self._record_usage(usage)

        def should_compress(self, prompt_tokens: int | None = None) -> bool:
            return True

        def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
            assert messages[0] is not msgs[0]  # the engine works on a copy
            return [messages[0], {"role": "user", "content": "[summary]"}, messages[1]]

    out = run_compress(Keep(), msgs, deadline=5.0).output
    assert out == [msgs[0], {"role": "user", "content": "[summary]"}, msgs[1]]
    assert out[0] is msgs[0] and out[2] is msgs[1]


def test_calls_under_a_deadline_reuse_an_idle_worker() -> None:
    names: list[str] = []
    threads: list[threading.Thread] = []

    def call() -> None:
        names.append(threading.current_thread().name)
        threads.append(threading.current_thread())

    for _ in range(3):
        assert not call_within(call, 5.0, name="ctxengine-test-call").is_alive()
    assert names == ["ctxengine-test-call"] * 3
    assert threads[0] is threads[1] is threads[2] and threads[0] is not threading.current_thread()


def test_a_call_past_its_deadline_keeps_its_worker_and_the_next_call_gets_another() -> None:
    release = threading.Event()
    seen: list[threading.Thread] = []

    def slow() -> None:
        seen.append(threading.current_thread())
        release.wait(10)

    t0 = time.perf_counter()
    late = call_within(slow, 0.05, name="ctxengine-test-slow")
    assert late.is_alive() and time.perf_counter() - t0 < 5
    quick = call_within(lambda: seen.append(threading.current_thread()), 5.0, name="ctxengine-test-quick")
    assert not quick.is_alive() and seen[1] is not seen[0]
    release.set()
    assert late.wait(5.0) and not late.is_alive()


def test_a_copy_is_prepared_as_its_original_and_a_lookalike_is_not() -> None:
    from ctxengine.store.ids import prepare

    text = "line /src/app/main.py\n" * 40
    m: Message = {"role": "tool", "tool_call_id": "c1", "content": text, "n": 1}
    first = prepare([m], "p0", {})[0]
    copy: Message = dict(m)
    assert prepare([copy], "p0", {})[0] == first  # remembered by its text, for any store
    lookalike: Message = {**m, "n": True}  # same text, other JSON
    other = prepare([lookalike], "p0", {})[0]
    assert other.blob != first.blob and other.canonical == canonical_json(lookalike)


def test_the_journal_fold_writes_what_a_direct_write_writes(tmp_path: Any) -> None:
    from ctxengine.store import SqliteStore
    from ctxengine.store.journal import _read_row

    msgs: list[Message] = [{"role": "user", "content": f"message {k} " + "x" * 300} for k in range(6)]
    store = SqliteStore(tmp_path / "j.db")
    ids = store.record_messages("s", msgs[:2])
    ids += store.append_messages("s", msgs[2:4], after=ids[-1])
    kept = dict(store._journal_kept)
    assert len(kept) == 1
    (meta, body, prepared), = kept.values()
    assert _read_row(0, meta, body) == prepared
    ids += store.append_messages("s", msgs[4:], after=ids[-1])
    assert store.history("s") == msgs  # a read folds the journal
    assert not store._journal_kept
    direct = SqliteStore(tmp_path / "d.db", journal=False)
    assert direct.record_messages("s", msgs) == ids
    store.close()
    direct.close()


def _tool_history(n: int) -> list[Message]:
    msgs: list[Message] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix the build"}]
    for k in range(n):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": f'{{"command": "cat src/mod{k}.py"}}'}}
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": f"c{k}", "content": f"src/mod{k}.py\n" + "line of code\n" * 300}]
    return msgs


def _replay_store(path: Any, *, defer: bool) -> tuple[dict[str, Any], int]:
    """A session replayed turn by turn (a prepared-list caller); the store's record at the end
    and how many compactions were checked pending until ``flush_records``."""
    from ctxengine.config import Config
    from ctxengine.manager import ContextManager
    from ctxengine.store import SqliteStore

    store = SqliteStore(path)
    mgr = ContextManager(Config(), model="gpt-4o", context_length=16_000, store=store)
    msgs = _tool_history(24)
    working = mgr.prepare(msgs[:4], session_id="s", defer_record=defer)
    checked, seen = 0, 4
    for end in range(6, len(msgs) + 1, 2):
        before = mgr.counters("s")["compactions"]
        working = mgr.prepare([*working, *msgs[seen:end]], session_id="s", defer_record=defer)
        seen = end
        if mgr.counters("s")["compactions"] > before and defer:
            assert len(store.compactions("s")) == before  # left for after the response
            mgr.flush_records("s")
            assert len(store.compactions("s")) == before + 1 and store.history("s") == working
            checked += 1
        mgr.flush_records("s")
    record = {"compactions": [c.id for c in store.compactions("s")], "history": store.history("s"), "originals": store.originals("s")}
    assert record["compactions"] and mgr.status("s")["store_errors"] == 0
    store.close()
    return record, checked


def test_a_deferring_caller_s_compaction_is_recorded_after_the_response(tmp_path: Any) -> None:
    sync, _ = _replay_store(tmp_path / "sync.db", defer=False)
    deferred, checked = _replay_store(tmp_path / "deferred.db", defer=True)
    assert checked >= 1
    assert deferred == sync


def test_the_process_wide_memo_by_text_holds_at_most_its_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    """It keeps its strings alive for every store of the process: bounded by characters, and a
    message prepared after it started anew is still prepared exactly."""
    from ctxengine.store import ids

    monkeypatch.setattr(ids, "_BY_TEXT_MAX_CHARS", 10_000)
    monkeypatch.setattr(ids, "_by_text", {})
    monkeypatch.setattr(ids, "_by_text_chars", [0])
    msgs = [{"role": "tool", "tool_call_id": f"c{i}", "content": f"{i} " + "x" * 3_000} for i in range(10)]
    first = ids.prepare(msgs, None)
    assert sum(len(v[0]) for v in ids._by_text.values()) <= 10_000
    assert ids._by_text_chars[0] <= 10_000
    again = ids.prepare([dict(m) for m in msgs], None)  # copies sharing the strings
    assert [(p.id, p.canonical) for p in again] == [(p.id, p.canonical) for p in first]
