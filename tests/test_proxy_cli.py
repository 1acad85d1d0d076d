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
import pytest
from click.testing import CliRunner, Result

from ctxengine.cli.main import cli
from ctxengine.config import Config
from ctxengine.testing.stub_server import StubReply, StubServer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_help_lists_the_flags() -> None:
    out = CliRunner().invoke(cli, ["proxy", "--help"])
    assert out.exit_code == 0
    for flag in ("--host", "--port", "--openai-base-url", "--anthropic-base-url", "--gemini-base-url", "--config", "--auth-token"):
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


def _served_config(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> tuple[Result, Config | None]:
    """Run ``ctxengine proxy ARGS`` with ``serve`` replaced by a recorder: (the result, the config it got)."""
    import ctxengine.proxy as proxy_pkg

    seen: list[Config] = []
    monkeypatch.setattr(proxy_pkg, "serve", lambda config, auth_token=None: seen.append(config))
    out = CliRunner().invoke(cli, ["proxy", *args])
    root = logging.getLogger("ctxengine")  # the command set up its own handler: undo it for later tests
    root.handlers[:] = []
    root.propagate = True
    return out, (seen[0] if seen else None)


def test_the_gemini_base_url_reaches_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    out, config = _served_config(monkeypatch, ["--gemini-base-url", "http://127.0.0.1:9/gemini"])
    assert out.exit_code == 0, out.output
    assert config is not None and config.proxy.gemini_base_url == "http://127.0.0.1:9/gemini"
    assert Config().proxy.gemini_base_url == "https://generativelanguage.googleapis.com"


def test_help_documents_the_window_flags() -> None:
    out = CliRunner().invoke(cli, ["proxy", "--help"])
    assert out.exit_code == 0
    for text in ("--context-length", "--model-window", "MODEL=TOKENS", "model.default_context_length", "models.<name>.context_length"):
        assert text in out.output


def test_window_flags_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxengine.proxy.limits import Window, Windows

    out, config = _served_config(monkeypatch, ["--context-length", "20000", "--model-window", "gpt-4o=16385", "--model-window", "qwen*=32_768"])
    assert out.exit_code == 0, out.output
    assert config is not None
    assert config.model.default_context_length == 20000
    assert config.models["gpt-4o"]["context_length"] == 16385
    windows = Windows(config)
    assert windows.window_for("openai", "gpt-4o") == Window(16385, "config")
    assert windows.window_for("openai", "qwen3-coder") == Window(32768, "config")
    assert windows.window_for("openai", "some-local-model") == Window(20000, "default")


def test_model_window_keeps_the_config_files_other_model_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("models:\n  gpt-4o:\n    input: 2.5\n    context_length: 128000\n")
    out, config = _served_config(monkeypatch, ["--config", str(cfg), "--model-window", "gpt-4o=16385"])
    assert out.exit_code == 0, out.output
    assert config is not None and config.models["gpt-4o"] == {"input": 2.5, "context_length": 16385}


def test_bad_window_values_name_the_flag() -> None:
    for args, flag in (
        (["--context-length", "0"], "--context-length"),
        (["--context-length", "lots"], "--context-length"),
        (["--model-window", "gpt-4o"], "--model-window"),
        (["--model-window", "gpt-4o=big"], "--model-window"),
        (["--model-window", "=1000"], "--model-window"),
        (["--model-window", "gpt-4o=-5"], "--model-window"),
    ):
        out = CliRunner().invoke(cli, ["proxy", *args])
        assert out.exit_code == 2, (args, out.output)
        assert flag in out.output, (args, out.output)
