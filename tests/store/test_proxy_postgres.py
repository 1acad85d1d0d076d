"""Two ``ctxengine proxy`` processes behind one PostgreSQL store serve the same sessions."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest

from ctxengine.messages import validate
from ctxengine.store.postgres import PostgresStore
from ctxengine.testing.stub_server import StubReply, StubServer

pytestmark = pytest.mark.postgres


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(config: Path, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxengine", "proxy", "--config", str(config), "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
        if proc.poll() is not None:
            break
    proc.kill()
    _, err = proc.communicate()
    raise AssertionError(f"proxy on port {port} did not start: {err.decode(errors='replace')}")


@pytest.fixture
def two_proxies(pg_dsn: str, tmp_path: Path) -> Iterator[tuple[StubServer, list[int]]]:
    with StubServer() as stub:
        stub.responder = lambda req: StubReply.ok("re:" + str(req.body["messages"][-1]["content"]))
        config = tmp_path / "config.yaml"
        config.write_text(
            "store:\n  backend: postgres\n"
            f"proxy:\n  openai_base_url: {stub.openai_base_url}\n  anthropic_base_url: {stub.anthropic_base_url}\n",
            encoding="utf-8",
        )
        env = {**os.environ, "CTXENGINE_STORE_DSN": pg_dsn}
        ports = [_free_port(), _free_port()]
        procs = [_start(config, port, env) for port in ports]
        try:
            yield stub, ports
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()


def test_two_proxy_processes_share_sessions_through_postgres(two_proxies: tuple[StubServer, list[int]], pg_dsn: str) -> None:
    stub, ports = two_proxies
    clients = [openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-pg", max_retries=0) for port in ports]
    histories: dict[str, list[Any]] = {}
    for sid in ("shared-a", "shared-b"):
        msgs: list[Any] = [{"role": "system", "content": f"agent {sid}"}]
        for turn in range(8):
            msgs.append({"role": "user", "content": f"{sid} turn {turn}"})
            client = clients[turn % 2]  # every other turn lands on the other process
            r = client.chat.completions.create(model="gpt-4o", messages=msgs, extra_headers={"x-ctxengine-session": sid})
            assert r.choices[0].message.content == f"re:{sid} turn {turn}"
            msgs.append({"role": "assistant", "content": r.choices[0].message.content})
        histories[sid] = msgs
    assert len(stub.requests) == 16
    for req in stub.requests:
        assert [v for v in validate(req.body["messages"]) if v.severity == "error"] == []
    with PostgresStore(pg_dsn) as store:
        for sid, msgs in histories.items():
            stored = store.history(sid)
            assert stored == msgs[:-1]  # every turn once, in order (the last reply arrives with the next turn)
            assert "sk-pg" not in str(store.export_session(sid))
