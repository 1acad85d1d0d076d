"""The SQLite store's append journal: a turn that only adds messages after the message the same
store object wrote last is one journal row, folded into the tables before anything reads them.
Whatever the order of writes and reads, a store with the journal and one without give the same
answers; a killed process loses no committed append; other store objects and processes see
every append."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxengine.errors import StoreError
from ctxengine.store import SqliteStore
from ctxengine.store.journal import _FOLD_EVERY

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _journal_rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM append_journal").fetchone()[0])


def _message_rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0])


def _turn(i: int) -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": f"output {i} needle{i}"},
    ]


def test_an_append_after_the_last_written_message_is_one_journal_row_read_back_at_once(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SqliteStore(path)
    ids = store.record_messages("s", [{"role": "user", "content": "go"}])
    before = _message_rows(path)
    new = store.append_messages("s", _turn(1), after=ids[-1])
    # journaled: the tables are untouched until something reads them
    assert _journal_rows(path) == 1 and _message_rows(path) == before
    assert store.history_ids("s") == [*ids, *new]
    assert _journal_rows(path) == 0 and _message_rows(path) == before + 2
    assert [e.kind for e in store.events("s")] == ["messages", "append"]
    assert [h.snippet for h in store.search("needle1")] == ["output 1 needle1"]
    store.close()


def test_the_journal_folds_itself_when_full(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SqliteStore(path)
    last = store.record_messages("s", [{"role": "user", "content": "go"}])[-1]
    for i in range(_FOLD_EVERY - 1):
        last = store.append_messages("s", _turn(i), after=last)[-1]
    assert _journal_rows(path) == _FOLD_EVERY - 1
    store.append_messages("s", _turn(_FOLD_EVERY), after=last)
    assert _journal_rows(path) == 0
    assert _message_rows(path) == 1 + 2 * _FOLD_EVERY
    store.close()


def test_another_store_object_sees_journaled_appends(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    writer, reader = SqliteStore(path), SqliteStore(path)
    ids = writer.record_messages("s", [{"role": "user", "content": "go"}])
    new = writer.append_messages("s", _turn(7), after=ids[-1])
    assert _journal_rows(path) == 1
    assert reader.history_ids("s") == [*ids, *new]
    assert reader.get_session("s").length == 3
    # the writer's next append still chains on its last message (now folded by the reader)
    more = writer.append_messages("s", _turn(8), after=new[-1])
    assert reader.history_ids("s") == [*ids, *new, *more]
    # a write by another object folds first, then applies: the order of commits is kept
    other = reader.append_messages("s", [{"role": "user", "content": "from the reader"}])
    more2 = writer.append_messages("s", _turn(9), after=more[-1])
    assert writer.history_ids("s") == [*ids, *new, *more, *more2]  # appended after its own last message
    assert reader.history("s", f"message:{other[0]}")[-1]["content"] == "from the reader"
    assert [e.kind for e in reader.events("s")] == ["messages", "append", "append", "append", "append"]
    writer.close()
    reader.close()


def test_the_turn_after_a_compaction_records_its_whole_history_through_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store, plain = SqliteStore(path), SqliteStore(tmp_path / "plain.db", journal=False)
    history = [{"role": "user", "content": "go"}, *_turn(1), *_turn(2)]
    compacted = [{"role": "user", "content": "go"}, {"role": "user", "content": "[summary] ran twice"}]
    turn = [*compacted, *_turn(3)]
    for s in (store, plain):
        s.record_messages("s", history)
        s.record_compaction("s", {"engine": "t", "replaced": [1, 2, 3, 4]}, history, compacted)
    assert _journal_rows(path) == 0
    ids = store.record_messages("s", turn)
    assert _journal_rows(path) == 1  # only the new messages, journaled
    assert ids == plain.record_messages("s", turn)
    assert store.history("s") == plain.history("s") == turn
    assert [(e.kind, e.tip, e.length) for e in store.events("s")] == [(e.kind, e.tip, e.length) for e in plain.events("s")]
    assert store.originals("s") == plain.originals("s")
    store.close()
    plain.close()


def test_an_append_keeps_the_time_it_was_made_not_the_time_it_was_folded(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    ids = store.record_messages("s", [{"role": "user", "content": "go"}])
    t0 = time.time()
    store.append_messages("s", _turn(1), after=ids[-1])
    t1 = time.time()
    time.sleep(0.05)
    event = store.events("s")[-1]
    assert t0 <= event.created_at <= t1
    assert t0 <= store.get_session("s").updated_at <= t1
    store.close()


def test_appends_folded_together_keep_each_appends_event_and_time(tmp_path: Path) -> None:
    """A session's appends that continue each other are folded as one chain; each keeps its own
    event, tip and time, and the record is the one a store without the journal writes."""
    store, plain = SqliteStore(tmp_path / "s.db"), SqliteStore(tmp_path / "plain.db", journal=False)
    first = [{"role": "user", "content": "go"}]
    ids, plain_ids = store.record_messages("s", first), plain.record_messages("s", first)
    other = store.record_messages("o", first)  # another session's append in between splits nothing of s
    spans = []
    for i in range(1, 5):
        t0 = time.time()
        ids += store.append_messages("s", _turn(i), after=ids[-1])
        plain_ids += plain.append_messages("s", _turn(i), after=plain_ids[-1])
        if i == 2:
            store.append_messages("o", _turn(9), after=other[-1])
        spans.append((t0, time.time()))
        time.sleep(0.01)
    assert _journal_rows(tmp_path / "s.db") == 5
    assert store.history_ids("s") == plain.history_ids("s") == ids  # folds
    events = store.events("s")
    assert [(e.kind, e.tip, e.length) for e in events] == [(e.kind, e.tip, e.length) for e in plain.events("s")]
    for e, (t0, t1) in zip(events[1:], spans, strict=True):
        assert t0 <= e.created_at <= t1
    assert spans[-1][0] <= store.get_session("s").updated_at <= spans[-1][1]
    assert store.history("o") == [*first, *_turn(9)]
    assert store.integrity_check() == ["ok"]
    store.close()
    plain.close()


def test_closing_folds_the_journal_and_opening_folds_what_a_killed_process_left(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SqliteStore(path)
    last = store.record_messages("s", [{"role": "user", "content": "go"}])[-1]
    store.append_messages("s", _turn(1), after=last)
    store.close()
    assert _journal_rows(path) == 0
    # a journal row left behind (as by a process killed after its append committed)
    store = SqliteStore(path)
    ids = store.record_messages("s", store.history("s"))  # nothing new: only this object's memory of the chain
    store.append_messages("s", _turn(2), after=ids[-1])
    store._closed = True  # dropped without closing, as a killed process would be
    assert _journal_rows(path) == 1
    again = SqliteStore(path)
    assert _journal_rows(path) == 0
    assert [m.get("tool_call_id") for m in again.history("s")] == [None, None, "c1", None, "c2"]
    again.close()


_CHILD = """
import sys
from ctxengine.store import SqliteStore
store = SqliteStore(sys.argv[1])
last = store.record_messages("k", [{"role": "user", "content": "start"}])[-1]
i = 0
while True:
    last = store.append_messages("k", [{"role": "assistant", "content": f"turn {i} " + "x" * 3000}], after=last)[-1]
    print(i, flush=True)
    i += 1
"""


def test_sigkill_between_journaled_appends_loses_nothing_committed(tmp_path: Path) -> None:
    path = tmp_path / "kill.db"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    committed = -1
    for line in proc.stdout:
        committed = int(line)
        if committed >= _FOLD_EVERY + 10:  # across a fold
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = SqliteStore(path)
    assert store.integrity_check() == ["ok"]
    turns = [m["content"].split(" ")[1] for m in store.history("k")[1:]]
    # every append reported is there, in order, then possibly more it committed before the kill
    assert turns[: committed + 1] == [str(i) for i in range(committed + 1)]
    assert turns == [str(i) for i in range(len(turns))]
    store.close()


def test_a_damaged_journal_row_stops_writes_with_a_clear_error_and_reads_go_on(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SqliteStore(path)
    ids = store.record_messages("s", [{"role": "user", "content": "go"}])
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO append_journal (session_pk, kind, after_id, meta, body, created_at) VALUES (1, 'append', ?, ?, ?, 0)",
            (ids[-1], '[["a", "b", "user", 1], ["c", "d", "user", 1]]', '{"role":"user","content":"x"}'),
        )
    assert store.history_ids("s") == ids  # read without folding what cannot be folded
    with pytest.raises(StoreError, match="append journal row 1 is damaged"):
        store.record_messages("t", [{"role": "user", "content": "other"}])
    assert _journal_rows(path) == 1  # kept, never dropped
    store.close()


# -- the same answers with and without the journal, whatever the order of operations ------------------
_TEXTS = st.sampled_from(["ls", "ok", "error: boom", "src/app.py", "done", "retry"])
_OP = st.one_of(
    st.tuples(st.just("append"), st.sampled_from("ab"), st.lists(_TEXTS, min_size=1, max_size=3)),
    st.tuples(st.just("append_at"), st.sampled_from("ab"), st.integers(0, 20), st.lists(_TEXTS, min_size=1, max_size=2)),
    st.tuples(st.just("extend"), st.sampled_from("ab"), st.lists(_TEXTS, min_size=1, max_size=3)),
    st.tuples(st.just("record_new"), st.sampled_from("ab"), st.lists(_TEXTS, min_size=1, max_size=3)),
    st.tuples(st.just("compact"), st.sampled_from("ab")),
    st.tuples(st.just("restore"), st.sampled_from("ab"), st.integers(1, 6)),
    st.tuples(st.just("read"), st.sampled_from("ab")),
)


def _observe(store: SqliteStore, sid: str) -> Any:
    try:
        info = store.get_session(sid)
    except Exception as exc:  # a session not written yet
        return type(exc).__name__
    events = [(e.number, e.kind, e.tip, e.length, e.compaction) for e in store.events(sid)]
    return (
        store.history_ids(sid),
        store.history(sid),
        events,
        [store.history_ids(sid, at=f"event:{n}") for n in range(1, len(events) + 1)],
        [(c.id, c.tokens_before, c.tokens_after, c.replaced) for c in store.compactions(sid)],
        sorted(json.dumps(m, sort_keys=True) for m in store.originals(sid)),
        (info.tip, info.length, info.stored, info.compactions),
        sorted((h.id, h.snippet, tuple(h.message_ids)) for h in store.search("error", session_id=sid)),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(st.integers(0, 1), _OP), min_size=1, max_size=25))
def test_the_journal_changes_nothing_a_reader_can_see(ops: list[tuple[int, tuple[Any, ...]]]) -> None:
    # two store objects on each file (two processes, say), each op by one of them
    with tempfile.TemporaryDirectory() as tmp:
        pairs = [(SqliteStore(Path(tmp) / "j.db"), SqliteStore(Path(tmp) / "p.db", journal=False)) for _ in range(2)]
        journaled, plain = pairs[0]
        wrote: dict[tuple[int, str], tuple[list[dict[str, Any]], list[str]]] = {}  # what each object last wrote, by session
        counter = [0]

        def fresh(texts: list[str]) -> list[dict[str, Any]]:
            out = []
            for t in texts:
                counter[0] += 1
                out.append({"role": "user" if counter[0] % 2 else "assistant", "content": t})
            return out

        def same(method: str, *args: Any, **kwargs: Any) -> Any:
            results = []
            for s in pairs[who]:
                try:
                    results.append(("ok", getattr(s, method)(*args, **kwargs)))
                except Exception as exc:
                    results.append(("error", type(exc).__name__, str(exc)))
            assert results[0] == results[1]
            return results[0]

        for who, op in ops:
            kind, sid = op[0], op[1]
            key = (who, sid)
            have = wrote.get(key)
            if kind == "append" and have:
                msgs = fresh(op[2])
                r = same("append_messages", sid, msgs, after=have[1][-1])
                wrote[key] = ([*have[0], *msgs], [*have[1], *r[1]])
            elif kind == "append_at" and have:
                msgs = fresh(op[3])
                at = min(op[2], len(have[1]) - 1)
                r = same("append_messages", sid, msgs, after=have[1][at])
                wrote[key] = ([*have[0][: at + 1], *msgs], [*have[1][: at + 1], *r[1]])
            elif kind == "extend" and have:
                objs = [*have[0], *fresh(op[2])]
                wrote[key] = (objs, same("record_messages", sid, objs)[1])
            elif kind in ("record_new", "extend", "append", "append_at"):
                objs = fresh(op[-1])
                wrote[key] = (objs, same("record_messages", sid, objs)[1])
            elif kind == "compact" and have:
                after = [have[0][0], *fresh(["[summary]"]), *have[0][-1:]]
                same("record_compaction", sid, {"engine": "t", "tokens_before": 10, "tokens_after": 5}, have[0], after)
                wrote[key] = (after, same("history_ids", sid)[1])
            elif kind == "restore" and have:
                same("restore", sid, f"event:{op[2]}")
            elif kind == "read":
                assert _observe(pairs[who][0], sid) == _observe(pairs[who][1], sid)
        for sid in "ab":
            assert _observe(journaled, sid) == _observe(plain, sid)
        assert journaled.integrity_check() == plain.integrity_check() == ["ok"]
        for pair in pairs:
            for store in pair:
                store.close()


def test_threads_appending_to_one_session_through_one_store_object_keep_every_branch(tmp_path: Path) -> None:
    import threading

    store = SqliteStore(tmp_path / "s.db")
    root = store.record_messages("s", [{"role": "user", "content": "go"}])[-1]
    results: dict[int, list[str]] = {}
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            last = root
            chain = []
            for i in range(30):
                new = store.append_messages("s", [{"role": "assistant", "content": f"t{t} m{i}"}], after=last)
                chain += new
                last = new[-1]
            results[t] = chain
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    # each thread's chain is a branch of its own, whole and in order
    for t, chain in results.items():
        history = store.history("s", f"message:{chain[-1]}")
        assert [m["content"] for m in history] == ["go", *(f"t{t} m{i}" for i in range(30))]
        assert store.history_ids("s", f"message:{chain[-1]}") == [root, *chain]
    assert store.integrity_check() == ["ok"]
    store.close()


def test_an_append_that_cannot_fold_the_full_journal_is_still_recorded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s.db"
    store = SqliteStore(path)
    last = store.record_messages("s", [{"role": "user", "content": "go"}])[-1]
    with sqlite3.connect(path) as conn:  # a row the fold cannot apply, first in line
        conn.execute("INSERT INTO append_journal (pk, session_pk, kind, after_id, meta, body, created_at) VALUES (1, 1, 'append', 'nowhere', '[]', '', 0)")
    ids = [last]
    for i in range(_FOLD_EVERY):
        ids += store.append_messages("s", _turn(i), after=ids[-1])
    assert "folding the append journal failed" in caplog.text
    assert _journal_rows(path) == _FOLD_EVERY + 1  # nothing dropped
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM append_journal WHERE pk = 1")
    assert store.history_ids("s") == ids
    store.close()
