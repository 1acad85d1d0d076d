"""No secret in the store, logs, status or errors: a summarizer server that echoes the key, a
``base_url`` with credentials, and the opt-in content redaction, end to end through the manager."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from ctxengine import ContextManager
from ctxengine.config import Config
from ctxengine.redact import (
    MARK,
    RedactingFilter,
    clear_secrets,
    redact,
    redact_messages,
    redact_url,
)
from ctxengine.store import SqliteStore
from ctxengine.testing.stub_server import StubReply, StubServer

KEY = "sk-live-ABCDEFGHIJKLMNOPQRSTUVWX0123"


@pytest.fixture(autouse=True)
def _forget() -> Any:
    clear_secrets()
    yield
    clear_secrets()


def long_chat(n: int = 40) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for i in range(n):
        msgs.append({"role": "user", "content": f"step {i}: please look at src/mod{i}.py " + "word " * 60})
        msgs.append({"role": "assistant", "content": f"done with step {i} " + "detail " * 60})
    return msgs


def test_an_echoing_server_and_a_credentialed_url_leak_nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("CTXENGINE_API_KEY", KEY)
    with StubServer(default=StubReply(status=500, text=None, error="upstream failed", echo_auth=True)) as server:
        base = f"http://admin:s3cretpass@127.0.0.1:{server.port}/v1"
        cfg = Config.from_dict(
            {
                "context": {"engine": "compressor"},
                "auxiliary": {"compression": {"provider": "custom", "model": "stub", "base_url": base, "context_length": 32_000, "deadline": 10}},
                "store": {"path": str(tmp_path / "s.db")},
            }
        )
        ctx = ContextManager.from_config(cfg, model="gpt-4o", context_length=4_000)
        caplog.set_level(logging.DEBUG)
        for handler in logging.getLogger().handlers:
            handler.addFilter(RedactingFilter())
        ctx.prepare(long_chat())
        status = json.dumps(ctx.status(), default=str)
        assert server.calls >= 1  # the summarizer was asked and failed
    with SqliteStore(tmp_path / "s.db") as store:
        rows = json.dumps([c.report for c in store.compactions("default")] + [c.config for c in store.compactions("default")], default=str)
        export = json.dumps(store.export_session("default"), default=str)
    for where, text in (("status", status), ("log", caplog.text), ("compactions", rows), ("export", export)):
        for secret in (KEY, "s3cretpass"):
            assert secret not in text, (where, secret)
    assert "failed" in status  # the failure itself is still reported


def test_content_redaction_is_opt_in_and_reaches_the_store(tmp_path: Path) -> None:
    msgs = [{"role": "user", "content": "my AWS key is AKIAABCDEFGHIJKLMNOP, token ghp_" + "z" * 36}, {"role": "assistant", "content": "noted"}]
    for on in (False, True):
        cfg = Config.from_dict({"store": {"path": str(tmp_path / f"s{on}.db")}, "redaction": {"content": on}})
        assert cfg.store.redact_content is on and cfg.auxiliary.compression.redact_content is on
        ctx = ContextManager.from_config(cfg, model="gpt-4o")
        out = ctx.prepare(msgs)
        assert out[0]["content"] == msgs[0]["content"]  # what is sent is the caller's text
        with SqliteStore(tmp_path / f"s{on}.db") as store:
            stored = json.dumps(store.history("default"))
        assert ("AKIAABCDEFGHIJKLMNOP" in stored) is (not on)
        assert ("ghp_" in stored) is (not on)


@pytest.mark.parametrize(
    ("text", "gone"),
    [
        ("Authorization: Bearer abcdefghijklmnop123", "abcdefghijklmnop123"),
        ('{"x-api-key": "k-1234567890abcdef"}', "k-1234567890abcdef"),
        ("see https://u:p4ssw0rd@host/x", "p4ssw0rd"),
        ("GET /v1?key=AIzaSyA1234567890abcdefghijklmnopqrstu&x=1", "AIzaSyA1234567890"),
        ("sk-ant-api03-" + "a" * 40, "a" * 40),
        ("sk-or-v1-" + "b" * 40, "b" * 40),
        ("AKIAABCDEFGHIJKLMNOP", "AKIAABCDEFGHIJKLMNOP"),
        ("xoxb-123456789012-abcdefghij", "abcdefghij"),
        ("github_pat_" + "c" * 50, "c" * 50),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abcdefghijklmnop", "eyJzdWIi"),
    ],
)
def test_key_shapes_and_credentials_are_redacted(text: str, gone: str) -> None:
    out = redact(text)
    assert gone not in out and MARK in out


def test_ordinary_text_is_left_alone() -> None:
    text = "Fixed src/auth/login.py; see https://docs.example.com/auth?page=2 and task sk-8 (skip)."
    assert redact(text) == text
    assert redact_url("http://localhost:8000/v1") == "http://localhost:8000/v1"


def test_redact_messages_copies_and_keeps_structure() -> None:
    msgs = [{"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function", "function": {"name": "sh", "arguments": '{"cmd": "export KEY=sk-proj-aaaaaaaaaaaaaaaaaaaaaaaa"}'}}]}]
    out = redact_messages(msgs)
    assert "sk-proj" not in out[0]["tool_calls"][0]["function"]["arguments"]
    assert "sk-proj" in msgs[0]["tool_calls"][0]["function"]["arguments"]  # input untouched
    assert out[0]["tool_calls"][0]["id"] == "a"


def test_the_log_filter_redacts_messages_and_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    from ctxengine.redact import register_secret

    register_secret(KEY)
    logger = logging.getLogger("ctxengine.test.redact")
    handler = logging.StreamHandler()
    filt = RedactingFilter()
    record = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, "failed with %s", (KEY,), None)
    assert filt.filter(record)
    assert KEY not in record.getMessage()
    try:
        raise RuntimeError(f"boom {KEY}")
    except RuntimeError:
        import sys

        record = logger.makeRecord(logger.name, logging.ERROR, __file__, 1, "x", (), sys.exc_info())
    filt.filter(record)
    assert KEY not in handler.format(record)


def test_a_custom_summarizers_error_text_is_redacted_in_status_and_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from ctxengine.redact import register_secret

    register_secret(KEY)

    class Leaky:
        name = "leaky"

        def summarize(self, span: Any, **kw: Any) -> str:
            raise RuntimeError(f"upstream said: invalid key {KEY} for http://me:pw123456@h/v1")

    cfg = Config.from_dict({"store": {"path": str(tmp_path / "s.db")}, "compression": {"mode": "summary"}})
    ctx = ContextManager.from_config(cfg, model="gpt-4o", context_length=4_000)
    ctx._session(None).engine.summarizer = Leaky()  # type: ignore[attr-defined]
    caplog.set_level(logging.WARNING)  # no filter installed: the text is redacted at the source
    ctx.prepare(long_chat())
    status = json.dumps(ctx.status(), default=str)
    assert "RuntimeError" in status  # the failure is still reported
    for text in (status, caplog.text):
        assert KEY not in text and "pw123456" not in text


# -- credentials in base_url never reach a client library (issue 24, item 3) ------------------------


class _Everything(logging.Handler):
    """A library user's handler: every record of every logger, no RedactingFilter."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_credentials_in_base_url_reach_the_server_and_no_log_line(api: str) -> None:
    import base64

    from ctxengine.clients.anthropic_client import AnthropicClient
    from ctxengine.clients.openai_compat import OpenAICompatClient
    from ctxengine.summarize.base import render_sections

    template = render_sections({"Goal": ["- g"], "Progress/Done": ["- d"]})
    root = logging.getLogger()
    handler, level = _Everything(), root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        with StubServer(default=StubReply.ok(template)) as server:
            creds = f"admin:p%40ss-w0rd-SECRET@127.0.0.1:{server.port}"
            if api == "openai":
                client: Any = OpenAICompatClient(base_url=f"http://{creds}/v1?api-version=2&api_key=QK-secret-123", api_key=KEY)
            else:
                client = AnthropicClient(base_url=f"http://{creds}?api-version=2&api_key=QK-secret-123", api_key=KEY)
            assert "SECRET" not in str(client.base_url) and "?" not in str(client.base_url)
            text = client.complete([{"role": "user", "content": "hi"}], model="m", max_tokens=100, timeout=5)
            assert text.strip() == template.strip()
            (req,) = server.requests
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    # the server got them as the HTTP library would have sent them: basic auth and the query
    assert req.headers["authorization"] == "Basic " + base64.b64encode(b"admin:p@ss-w0rd-SECRET").decode()
    assert req.query == "api-version=2&api_key=QK-secret-123"
    assert req.path.endswith(("/chat/completions", "/messages"))
    logs = "\n".join(handler.lines)
    assert any("HTTP Request" in line for line in handler.lines)  # the SDK did log its request
    for secret in ("p%40ss-w0rd-SECRET", "p@ss-w0rd-SECRET", "QK-secret-123", "cEBzcy13MHJkLVNFQ1JFVA"):
        assert secret not in logs


def test_split_credentials_keeps_the_url_and_names_the_origin() -> None:
    from ctxengine.clients.credentials import split_credentials

    assert split_credentials("http://localhost:8000/v1") == ("http://localhost:8000/v1", None)
    assert split_credentials(None) == (None, None)
    bare, creds = split_credentials("https://u:pw@[::1]:9000/api/v1?key=abcdefgh")
    assert bare == "https://[::1]:9000/api/v1"
    assert creds is not None and (creds.scheme, creds.host, creds.port, creds.query) == ("https", "::1", 9000, (("key", "abcdefgh"),))
    assert redact("echoed abcdefgh and pw-free") == f"echoed {MARK} and pw-free"  # the key value is a registered secret


def test_a_redirect_to_another_origin_carries_no_credentials() -> None:
    from ctxengine.clients.credentials import UrlCredentials, _Injecting

    seen: list[tuple[str, str | None]] = []

    class Inner:
        def handle_request(self, request: Any) -> str:
            seen.append((str(request.url), request.headers.get("authorization")))
            return "response"

    import openai

    creds = UrlCredentials("http", "127.0.0.1", 8000, "Basic abc", (("key", "k1"),))
    t = _Injecting(Inner(), creds)
    client = openai.DefaultHttpxClient()
    for url in ("http://127.0.0.1:8000/v1/x", "http://evil.example:8000/v1/x", "http://127.0.0.1:8001/v1/x"):
        request = client.build_request("POST", url)
        assert t.handle_request(request) == "response"
        assert str(request.url) == url and "authorization" not in request.headers  # taken off again
    assert seen == [("http://127.0.0.1:8000/v1/x?key=k1", "Basic abc"), ("http://evil.example:8000/v1/x", None), ("http://127.0.0.1:8001/v1/x", None)]
    client.close()
