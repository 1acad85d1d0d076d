"""``ctxengine proxy --workers N``: N processes on one port sharing sessions through the store."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import pytest
from click.testing import CliRunner

import ctxengine
from ctxengine.cli.main import cli
from ctxengine.store import SqliteStore
from ctxengine.testing.stub_server import StubServer
from test_proxy_cli import _free_port
from test_proxy_shared_store import conversation, cuts


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def test_two_workers_serve_one_port_and_keep_each_session_whole(tmp_path: Path) -> None:
    port = _free_port()
    db = tmp_path / "s.db"
    msgs = conversation(10, 3_000)
    with StubServer() as stub:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"store:\n  path: {db}\nproxy:\n  openai_base_url: {stub.openai_base_url}\n  workers: 2\n", encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": str(Path(ctxengine.__file__).resolve().parents[1])}
        proc = subprocess.Popen([sys.executable, "-m", "ctxengine", "proxy", "--config", str(cfg), "--port", str(port), "--model-window", "*=16000"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    assert proc.poll() is None and time.monotonic() < deadline, "the proxy did not start"
                    time.sleep(0.1)
            assert len(_children(proc.pid)) == 2
            for end in cuts(msgs):  # a connection of its own each turn: any worker may take it
                r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "gpt-4o", "messages": msgs[:end]}, headers={"x-ctxengine-session": "w1"}, timeout=60)
                assert r.status_code == 200, r.text
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0 or proc.returncode == -15, err.decode(errors="replace")
    with SqliteStore(str(db)) as store:
        assert store.originals("w1") == msgs
    assert b"2 workers" in err


def test_workers_without_a_shared_store_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_fork() -> int:
        raise AssertionError("forked although the workers cannot share sessions")

    monkeypatch.setattr(os, "fork", no_fork)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("store:\n  enabled: false\n", encoding="utf-8")
    out = CliRunner().invoke(cli, ["proxy", "--config", str(cfg), "--workers", "2", "--port", str(_free_port())])
    root = logging.getLogger("ctxengine")  # the command set up its own handler: undo it for later tests
    root.handlers[:] = []
    root.propagate = True
    assert out.exit_code != 0
    assert "proxy.workers is 2" in out.output and "store.path" in out.output
