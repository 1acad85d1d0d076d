"""Opening stores: the config, the default location, the DSN from the environment, bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxengine.config import Config
from ctxengine.errors import ConfigError, StoreError
from ctxengine.store import SqliteStore, default_path, open_store


def test_default_store_is_sqlite_in_the_user_data_dir(_hermetic_home: Path) -> None:
    store = open_store(None)
    assert isinstance(store, SqliteStore)
    assert Path(store.path) == default_path()
    assert default_path() == _hermetic_home / ".local" / "share" / "ctxengine" / "sessions.db"
    assert default_path().is_file()  # created on first use
    store.close()


def test_config_path_and_wal(tmp_path: Path) -> None:
    cfg = Config.from_dict({"store": {"path": str(tmp_path / "deep" / "dir" / "s.db")}})
    store = open_store(cfg.store)
    assert isinstance(store, SqliteStore)
    store.record_messages("s", [{"role": "user", "content": "hi"}])
    with store._read() as cur:
        assert cur.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert cur.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000
    store.close()


def test_postgres_needs_the_dsn_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = Config.from_dict({"store": {"backend": "postgres", "dsn_env": "MY_STORE_DSN"}})
    with pytest.raises(ConfigError, match="MY_STORE_DSN"):
        open_store(cfg.store)


@pytest.mark.postgres
def test_postgres_dsn_from_the_environment(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxengine.store.postgres import PostgresStore

    monkeypatch.setenv("CTXENGINE_STORE_DSN", pg_dsn)
    store = open_store(Config.from_dict({"store": {"backend": "postgres"}}).store)
    assert isinstance(store, PostgresStore)
    store.record_messages("s", [{"role": "user", "content": "hi"}])
    assert store.history("s") == [{"role": "user", "content": "hi"}]
    store.close()


def test_postgres_connection_errors_are_store_errors() -> None:
    from ctxengine.store.postgres import PostgresStore

    with pytest.raises(StoreError, match="cannot connect"):
        PostgresStore("host=127.0.0.1 port=1 user=nobody dbname=none connect_timeout=2")


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    bad = tmp_path / "not.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match=r"not\.db"):
        SqliteStore(bad)


def test_a_directory_where_the_file_should_be(tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        SqliteStore(tmp_path)


def test_memory_store_is_private_and_shared_by_threads() -> None:
    import threading

    a, b = SqliteStore(":memory:"), SqliteStore(":memory:")
    a.record_messages("s", [{"role": "user", "content": "only in a"}])
    with pytest.raises(StoreError):
        b.history("s")
    seen: list[int] = []
    t = threading.Thread(target=lambda: seen.append(len(a.history("s"))))
    t.start()
    t.join()
    assert seen == [1]
