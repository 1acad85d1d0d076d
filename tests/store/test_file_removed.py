"""A SQLite store whose file is removed (or replaced) while open: it notices, opens the file
anew, and the sessions are recorded in full from their next write; nothing the client resends
is lost (issue 24, item 5: the proxy's store going away mid-session)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ctxengine import ContextManager
from ctxengine.config import Config
from ctxengine.store import SqliteStore
from ctxengine.store import sqlite as sqlite_mod


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{path}{suffix}").exists():
            os.remove(f"{path}{suffix}")


@pytest.mark.parametrize("deferred", [True, False])
def test_a_removed_store_file_is_recreated_and_the_session_recorded_in_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deferred: bool) -> None:
    monkeypatch.setattr(sqlite_mod, "FILE_CHECK_SECONDS", 0.0)  # check on every connection use
    path = tmp_path / "s.db"
    ctx = ContextManager.from_config(Config.from_dict({"store": {"path": str(path)}, "model": {"context_length": 1_000_000}}), model="gpt-4o")
    msgs: list[dict[str, Any]] = []
    for n in range(6):
        msgs.append({"role": "user", "content": f"user turn {n}"})
        ctx.prepare(list(msgs), session_id="s", defer_record=deferred)
        if deferred:
            ctx.flush_records("s")
        msgs.append({"role": "assistant", "content": f"answer {n}"})
        if n == 2:
            _remove(path)
            assert not path.exists()
    assert path.exists()  # opened anew
    assert ctx.store is not None and ctx.store.generation == 1  # type: ignore[attr-defined]
    ctx.close()
    with SqliteStore(path) as store:
        assert store.history("s") == msgs[:-1]  # every message once, none lost


def test_a_store_file_replaced_by_another_is_noticed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_mod, "FILE_CHECK_SECONDS", 0.0)
    path, other = tmp_path / "s.db", tmp_path / "other.db"
    store = SqliteStore(path)
    store.record_messages("a", [{"role": "user", "content": "one"}])
    with SqliteStore(other) as o:
        o.record_messages("b", [{"role": "user", "content": "two"}])
    _remove(path)
    os.rename(other, path)
    assert [s.id for s in store.list_sessions()] == ["b"]  # reads the file now at the path
    assert store.generation == 1
    store.close()


def test_the_file_is_checked_at_most_so_often(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    store.record_messages("a", [{"role": "user", "content": "one"}])
    _remove(tmp_path / "s.db")
    store.list_sessions()  # within FILE_CHECK_SECONDS of opening: not checked yet
    assert store.generation == 0 and sqlite_mod.FILE_CHECK_SECONDS > 0
    store.close()
