"""Store fixtures: every store test runs against SQLite and a real throwaway PostgreSQL.

The PostgreSQL cluster comes from the Debian server binaries (``/usr/lib/postgresql/15/bin``).
They refuse to run as root, so when the tests run as root the cluster lives in a temporary
directory owned by the ``postgres`` system user and the binaries run through ``runuser``. It
listens on a free loopback port (socket directory inside the temp dir), with fsync off (a test
cluster), and is stopped when the session ends. Missing binaries fail the tests loudly: CI must
run the PostgreSQL half of the suite, never skip it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ctxengine.store import SessionStore, SqliteStore

PG_BIN = Path(os.environ.get("CTXENGINE_PG_BIN", "/usr/lib/postgresql/15/bin"))


@dataclass(frozen=True)
class PgCluster:
    host: str
    port: int
    user: str

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.host} port={self.port} user={self.user} dbname={dbname}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_owner(cmd: list[str], owner: str | None) -> list[str]:
    return ["runuser", "-u", owner, "--", *cmd] if owner else cmd


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    missing = [b for b in ("initdb", "pg_ctl", "postgres") if not (PG_BIN / b).is_file()]
    if missing:
        pytest.fail(f"PostgreSQL server binaries missing in {PG_BIN} ({', '.join(missing)}): install postgresql-15 or set CTXENGINE_PG_BIN")
    owner: str | None = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("running as root needs a 'postgres' system user to own the throwaway cluster")
        owner = "postgres"
    root = Path(tempfile.mkdtemp(prefix="ctxengine-pg-"))
    data, sock, log = root / "data", root / "sock", root / "server.log"
    sock.mkdir()
    if owner:
        shutil.chown(root, owner)
        shutil.chown(sock, owner)
    port = _free_port()
    env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
    subprocess.run(
        _as_owner([str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"], owner),
        check=True, capture_output=True, env=env, cwd=root,
    )
    opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=100"
    start = subprocess.run(
        _as_owner([str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(log), "-w", "-t", "60", "start"], owner),
        capture_output=True, env=env, cwd=root, text=True,
    )
    if start.returncode != 0:
        text = log.read_text(errors="replace") if log.exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"could not start the throwaway PostgreSQL: {start.stderr}\n{text}")
    try:
        yield PgCluster("127.0.0.1", port, "postgres")
    finally:
        subprocess.run(_as_owner([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], owner), capture_output=True, env=env, cwd=root)
        shutil.rmtree(root, ignore_errors=True)


_DB_COUNTER = iter(range(1, 1_000_000))


@pytest.fixture
def pg_dsn(pg_cluster: PgCluster) -> str:
    """A fresh, empty database for one test."""
    import psycopg

    name = f"t{os.getpid()}_{next(_DB_COUNTER)}"
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return pg_cluster.dsn(name)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_factory(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    """``factory(**kwargs)`` opens a store of the current backend on this test's database."""
    opened: list[SessionStore] = []
    if backend == "postgres":
        dsn = request.getfixturevalue("pg_dsn")

        def make(**kwargs: object) -> SessionStore:
            from ctxengine.store.postgres import PostgresStore

            s = PostgresStore(dsn, **kwargs)  # type: ignore[arg-type]
            opened.append(s)
            return s
    else:
        path = tmp_path / "sessions.db"

        def make(**kwargs: object) -> SessionStore:
            s = SqliteStore(path, **kwargs)  # type: ignore[arg-type]
            opened.append(s)
            return s

    make.location = dsn if backend == "postgres" else str(path)  # type: ignore[attr-defined]
    yield make
    for s in opened:
        s.close()


@pytest.fixture
def store(store_factory: object) -> SessionStore:
    return store_factory()  # type: ignore[operator,no-any-return]
