"""``ctxengine proxy`` as a command: flags, the loopback rule, a real subprocess serving SDK calls."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import httpx2 as httpx
from click.testing import CliRunner

from ctxengine.cli.main import cli
from ctxengine.testing.stub_server import StubReply, StubServer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_help_lists_the_flags() -> None:
    out = CliRunner().invoke(cli, ["proxy", "--help"])
    assert out.exit_code == 0
    for flag in ("--host", "--port", "--openai-base-url", "--anthropic-base-url", "--config", "--auth-token"):
        assert flag in out.output


def test_binding_beyond_loopback_without_a_token_is_refused(tmp_path: Path) -> None:
    out = CliRunner().invoke(cli, ["proxy", "--host", "0.0.0.0", "--port", "1"])
    assert out.exit_code == 2
    assert "requires a proxy token" in out.output
    # refused before the command set up its logging: the package's records still reach the root
    assert logging.getLogger("ctxengine").propagate


def test_the_command_serves_sdk_requests(tmp_path: Path) -> None:
    port = _free_port()
    with StubServer([StubReply.ok("from the stub")]) as stub:
        env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "ctxengine", "proxy", "--port", str(port), "--anthropic-base-url", stub.anthropic_base_url, "--openai-base-url", stub.openai_base_url],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    assert proc.poll() is None and time.monotonic() < deadline, "the proxy did not start"
                    time.sleep(0.1)
            client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="sk-cli", max_retries=0)
            msg = client.messages.create(model="claude-opus-4-5", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
            assert msg.content[0].text == "from the stub"  # type: ignore[union-attr]
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=10)
        assert (tmp_path / "ctxengine" / "sessions.db").exists()  # the default SQLite store
        assert b'"msg": "request"' in err and b"sk-cli" not in err  # JSON log lines, no key
