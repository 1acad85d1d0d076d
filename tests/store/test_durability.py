"""Migrations from every schema, SIGKILL in the middle of writes, and many processes at once."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ctxengine.errors import StoreError
from ctxengine.store import SqliteStore
from ctxengine.store.base import SqlStore, blob_hash, canonical_json, message_id
from ctxengine.store.migrations import MIGRATIONS, latest_version

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_migration_list_is_append_only() -> None:
    # released migrations are never renamed, removed or reordered: stores in the field
    # recorded their numbers. Append new ones at the end and extend this list.
    assert [m.name for m in MIGRATIONS] == ["core_tables", "full_text_search", "summary_nodes", "append_journal", "recall_identifiers", "request_log"]
    assert all(m.why for m in MIGRATIONS)
    assert latest_version() == 6


def _write_v1_session(store: SqlStore, session_id: str, texts: list[str]) -> None:
    """Write a session with plain SQL on the core tables (present in every schema version)."""
    with store._write() as cur:
        now = time.time()
        store._x(cur, "INSERT INTO sessions (id, tip_pk, created_at, updated_at, meta) VALUES (?, NULL, ?, ?, '{}')", (session_id, now, now))
        spk = store._session_pk(cur, session_id)
        parent: str | None = None
        parent_pk = None
        for pos, text in enumerate(texts):
            msg = {"role": "user", "content": text}
            canon = canonical_json(msg)
            b = blob_hash(canon)
            mid = message_id(parent, b)
            store._x(cur, "INSERT INTO blobs (hash, role, body, text, tokens) VALUES (?, 'user', ?, ?, 5)", (b, canon, text))
            bpk = store._one(cur, "SELECT pk FROM blobs WHERE hash = ?", (b,))
            assert bpk is not None
            store._x(cur, "INSERT INTO messages (id, parent_pk, blob_pk, position, created_at) VALUES (?, ?, ?, ?, ?)", (mid, parent_pk, bpk[0], pos, now))
            row = store._one(cur, "SELECT pk FROM messages WHERE id = ?", (mid,))
            assert row is not None
            parent, parent_pk = mid, row[0]
            store._x(cur, "INSERT INTO session_messages (session_pk, message_pk) VALUES (?, ?)", (spk, parent_pk))
        store._x(cur, "UPDATE sessions SET tip_pk = ? WHERE pk = ?", (parent_pk, spk))
        store._x(cur, "INSERT INTO events (session_pk, kind, tip_pk, compaction_pk, created_at) VALUES (?, 'messages', ?, NULL, ?)", (spk, parent_pk, now))


@pytest.mark.parametrize("start", range(1, len(MIGRATIONS)))
def test_upgrade_from_each_schema(store_factory: Any, start: int) -> None:
    old = store_factory(target_version=start)
    assert old.schema_version() == start
    texts = ["the quick brown fox", "jumps over src/lazy/dog.py", "数据库 error: connection refused"]
    _write_v1_session(old, "legacy", texts)
    old.close()

    new = store_factory()
    assert new.schema_version() == latest_version()
    assert [m["content"] for m in new.history("legacy")] == texts
    # rows written before the full-text index existed are indexed by the migration
    assert [h.snippet for h in new.search("lazy") if h.kind == "message"] == ["jumps over src/lazy/dog.py"]
    assert new.search("数据库", session_id="legacy")
    ids = new.append_messages("legacy", [{"role": "assistant", "content": "done"}])
    assert new.add_node("legacy", "n-legacy", depth=0, text="[ctxengine:lcm node=n-legacy] old", children=[("message", ids[0])])
    assert new.node_messages("n-legacy") == [(ids[0], {"role": "assistant", "content": "done"})]


def test_refuses_a_newer_schema(store_factory: Any) -> None:
    s = store_factory()
    with s._write() as cur:
        s._x(cur, "INSERT INTO schema_version (version, name, applied_at) VALUES (?, 'from_the_future', 0)", (latest_version() + 1,))
    s.close()
    with pytest.raises(StoreError, match="newer than this ctxengine"):
        store_factory()


_CHILD = """
import sys
from ctxengine.store import SqliteStore
store = SqliteStore(sys.argv[1])
tag = sys.argv[2]
i = 0
while True:
    batch = [{"role": "user", "content": f"{tag}-m{i}-{j} " + "x" * 2000} for j in range(20)]
    store.append_messages("s", batch)
    print(i, flush=True)
    i += 1
"""


def test_sigkill_mid_write_loses_nothing_committed(tmp_path: Path) -> None:
    path = tmp_path / "kill.db"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    expected: list[str] = []
    for tag in ("r0", "r1", "r2"):
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), tag], stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        committed = -1
        for line in proc.stdout:
            committed = int(line)
            if committed >= 30:
                break
        proc.send_signal(signal.SIGKILL)  # while it is writing the next batch
        proc.wait()
        store = SqliteStore(path)
        assert store.integrity_check() == ["ok"]
        contents = [m["content"].split(" ")[0] for m in store.history("s")]
        assert len(contents) == len(set(contents))
        # every batch the child reported committed is there, then possibly more batches it
        # committed before the kill (their lines were still in the pipe), never half of one
        reported = [f"{tag}-m{i}-{j}" for i in range(committed + 1) for j in range(20)]
        assert contents[: len(expected) + len(reported)] == expected + reported
        extra = contents[len(expected) + len(reported) :]
        whole = len(extra) // 20
        assert extra == [f"{tag}-m{i}-{j}" for i in range(committed + 1, committed + 1 + whole) for j in range(20)]
        expected = contents
        assert store.search(f"{tag}-m3-7", session_id="s")
        store.close()


def _append_worker(backend: str, location: str, worker: int, count: int, start: Any) -> None:
    if backend == "sqlite":
        store: Any = SqliteStore(location)
    else:
        from ctxengine.store.postgres import PostgresStore

        store = PostgresStore(location)
    start.wait()
    for i in range(count):
        store.append_messages("shared", [{"role": "user", "content": f"w{worker} #{i}"}])
    store.close()


CONCURRENT_PROCESSES = 8
# the full 8 x 1,000 on SQLite (about 4 s); PostgreSQL commits cost more round trips, so the
# default run does 8 x 250 there and scripts/bench_store.py measures the full figure
CONCURRENT_APPENDS = {"sqlite": 1000, "postgres": int(os.environ.get("CTXENGINE_TEST_PG_APPENDS", "250"))}


def test_many_processes_append_to_one_session(store_factory: Any, backend: str) -> None:
    store = store_factory()  # creates the schema before the workers start
    location = store_factory.location
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    n = CONCURRENT_APPENDS[backend]
    procs = [ctx.Process(target=_append_worker, args=(backend, location, w, n, start)) for w in range(CONCURRENT_PROCESSES)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    contents = [m["content"] for m in store.history("shared")]
    assert len(contents) == CONCURRENT_PROCESSES * n
    assert len(set(contents)) == len(contents)  # nothing duplicated
    for w in range(CONCURRENT_PROCESSES):  # nothing lost, each writer's order kept
        assert [c for c in contents if c.startswith(f"w{w} ")] == [f"w{w} #{i}" for i in range(n)]
    assert json.loads(json.dumps(store.get_session("shared").length)) == len(contents)


def test_bulk_import_indexes_at_the_end_and_after_a_crash(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "bulk.db")
    with store.bulk():
        store.record_many([(f"s{i}", [{"role": "user", "content": f"bulk message number{i}"}]) for i in range(50)])
        with store._read() as cur:  # not indexed yet (a search would still find them by a scan)
            assert cur.execute("SELECT COUNT(*) FROM blobs_fts_docsize").fetchone()[0] == 0
        store.record_messages("meanwhile", [{"role": "user", "content": "indexed at once"}])
    assert [h.snippet for h in store.search("number7")] == ["bulk message number7"]
    assert len(store.search("bulk message", limit=100)) == 50
    # a bulk block that never ended (the process died): the next open indexes the rows
    store._local.defer_fts = True
    store.record_messages("lost", [{"role": "user", "content": "written unindexed"}])
    store.close()
    again = SqliteStore(tmp_path / "bulk.db")
    with again._read() as cur:
        assert cur.execute("SELECT COUNT(*) FROM blobs_fts_docsize").fetchone()[0] == 52
    assert [h.snippet for h in again.search("unindexed")] == ["written unindexed"]
    assert again.integrity_check() == ["ok"]


@pytest.mark.parametrize("path", [":memory:", "file"])
def test_a_failed_write_is_rolled_back_and_database_errors_are_store_errors(tmp_path: Path, path: str) -> None:
    store = SqliteStore(":memory:" if path == ":memory:" else tmp_path / "tx.db")
    ids = store.record_messages("s", [{"role": "user", "content": "kept"}])
    with pytest.raises(StoreError, match="session store"), store._write() as cur:
        cur.execute("UPDATE sessions SET tip_pk = NULL")
        cur.execute("INSERT INTO no_such_table VALUES (1)")
    with pytest.raises(KeyError), store._write() as cur:
        cur.execute("UPDATE sessions SET tip_pk = NULL")
        raise KeyError("not a database error")
    assert store.history_ids("s") == ids  # neither write left anything behind
    # and the store takes the next write (the lock of a ":memory:" store was released)
    more = store.append_messages("s", [{"role": "assistant", "content": "next"}], after=ids[-1])
    assert store.history_ids("s") == [*ids, *more]
    store.close()
