"""Chat clients over real HTTP against the stub server: both SDKs, retries, errors, factory."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from ctxengine.clients.anthropic_client import AnthropicClient
from ctxengine.clients.base import ChatClient, looks_like_context_error
from ctxengine.clients.factory import build_client, resolve_provider
from ctxengine.clients.openai_compat import OpenAICompatClient
from ctxengine.config import SummarizerConfig
from ctxengine.errors import (
    ConfigError,
    SummarizerAuthError,
    SummarizerContextError,
    SummarizerError,
)
from ctxengine.testing.stub_server import StubReply, StubServer

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "summarize this"}]


def openai_client(server: StubServer, retries: int = 2, timeout: float = 5.0) -> OpenAICompatClient:
    return OpenAICompatClient(base_url=server.openai_base_url, api_key="sk-test", max_retries=retries, timeout=timeout)


def anthropic_client(server: StubServer, retries: int = 2, timeout: float = 5.0) -> AnthropicClient:
    return AnthropicClient(base_url=server.anthropic_base_url, api_key="ak-test", max_retries=retries, timeout=timeout)


CLIENTS = {"openai": openai_client, "anthropic": anthropic_client}


@pytest.fixture(params=sorted(CLIENTS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_success_and_request_shape(kind: str) -> None:
    with StubServer([StubReply.ok("hello")]) as server:
        client = CLIENTS[kind](server)
        assert isinstance(client, ChatClient)
        assert client.complete(MSGS, model="m1", max_tokens=123, timeout=5) == "hello"
        req = server.requests[0]
        assert req.api == kind
        assert req.body["model"] == "m1" and req.body["max_tokens"] == 123
        if kind == "anthropic":
            assert req.body["system"] == "be brief"
            assert req.body["messages"] == [{"role": "user", "content": "summarize this"}]
            # the SDK sends the key as x-api-key or as a bearer token, depending on its version
            assert "ak-test" in req.headers.get("x-api-key", "") + req.headers.get("authorization", "")
        else:
            assert req.body["messages"] == MSGS
            assert req.headers["authorization"] == "Bearer sk-test"


def test_429_then_success_is_retried_by_the_sdk(kind: str) -> None:
    with StubServer([StubReply.rate_limited(), StubReply.ok("after retry")]) as server:
        assert CLIENTS[kind](server).complete(MSGS, model="m", max_tokens=10, timeout=5) == "after retry"
        assert server.calls == 2


def test_5xx_exhausts_retries_then_raises(kind: str) -> None:
    with StubServer(default=StubReply.fail(503, "overloaded")) as server:
        with pytest.raises(SummarizerError, match="503") as info:
            CLIENTS[kind](server, retries=2).complete(MSGS, model="m", max_tokens=10, timeout=5)
        assert not isinstance(info.value, SummarizerAuthError)
        assert server.calls == 3  # first try + two retries


def test_401_is_an_auth_error_and_not_retried(kind: str) -> None:
    with StubServer(default=StubReply.unauthorized()) as server:
        with pytest.raises(SummarizerAuthError, match="401"):
            CLIENTS[kind](server, retries=3).complete(MSGS, model="m", max_tokens=10, timeout=5)
        assert server.calls == 1


def test_timeout_raises_summarizer_error(kind: str) -> None:
    with StubServer([StubReply.slow("late", 1.5)]) as server:
        t0 = time.monotonic()
        with pytest.raises(SummarizerError, match="timed out"):
            CLIENTS[kind](server, retries=0, timeout=0.3).complete(MSGS, model="m", max_tokens=10, timeout=0.3)
        assert time.monotonic() - t0 < 1.4


def test_delay_within_the_timeout_succeeds(kind: str) -> None:
    with StubServer([StubReply.slow("slow but fine", 0.2)]) as server:
        assert CLIENTS[kind](server).complete(MSGS, model="m", max_tokens=10, timeout=5) == "slow but fine"


def test_empty_content_returns_empty_text(kind: str) -> None:
    with StubServer([StubReply.empty()]) as server:
        assert CLIENTS[kind](server).complete(MSGS, model="m", max_tokens=10, timeout=5) == ""


def test_truncated_reply_is_an_error(kind: str) -> None:
    with StubServer([StubReply.truncated("## Goal\ncut off")]) as server, pytest.raises(SummarizerError, match="truncated"):
        CLIENTS[kind](server).complete(MSGS, model="m", max_tokens=10, timeout=5)


def test_context_error_is_translated(kind: str) -> None:
    with StubServer([StubReply.context_too_long()]) as server, pytest.raises(SummarizerContextError):
        CLIENTS[kind](server).complete(MSGS, model="m", max_tokens=10, timeout=5)


def test_connection_refused_is_a_summarizer_error() -> None:
    server = StubServer().start()
    url = server.openai_base_url
    server.stop()
    client = OpenAICompatClient(base_url=url, api_key="k", max_retries=0, timeout=2)
    with pytest.raises(SummarizerError, match="cannot reach"):
        client.complete(MSGS, model="m", max_tokens=10, timeout=2)


def test_missing_key_fails_without_a_request() -> None:
    with StubServer() as server:
        with pytest.raises(SummarizerAuthError, match="OPENAI_API_KEY"):
            OpenAICompatClient(base_url=server.openai_base_url, api_key=None).complete(MSGS, model="m", max_tokens=1, timeout=1)
        with pytest.raises(SummarizerAuthError, match="ANTHROPIC_API_KEY"):
            AnthropicClient(base_url=server.anthropic_base_url, api_key=None).complete(MSGS, model="m", max_tokens=1, timeout=1)
        assert server.calls == 0


def test_context_error_phrases() -> None:
    assert looks_like_context_error("This model's maximum context length is 8192 tokens")
    assert looks_like_context_error("prompt is too long: 210000 tokens > 200000 maximum")
    assert not looks_like_context_error("invalid model name")


# -- factory -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "model", "base_url", "expected"),
    [
        ("auto", "gpt-4o-mini", None, "openai"),
        ("auto", "claude-haiku-4-5", None, "anthropic"),
        ("auto", "google/gemini-2.5-flash", None, "openrouter"),
        ("auto", "qwen2.5:7b", "http://localhost:11434/v1", "custom"),
        ("ollama", "qwen2.5:7b", None, "ollama"),
        ("Anthropic", "claude-x", None, "anthropic"),
    ],
)
def test_resolve_provider(provider: str, model: str, base_url: str | None, expected: str) -> None:
    assert resolve_provider(SummarizerConfig(provider=provider, model=model, base_url=base_url)) == expected


def test_unknown_provider_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="openrouter"):
        build_client(SummarizerConfig(provider="nope", model="m"))


def test_custom_needs_a_base_url() -> None:
    with pytest.raises(ConfigError, match="base_url"):
        build_client(SummarizerConfig(provider="custom", model="m"))


def test_factory_reads_keys_from_the_environment_and_talks_to_the_endpoint() -> None:
    with StubServer([StubReply.ok("via openai sdk"), StubReply.ok("via anthropic sdk")]) as server:
        oc = build_client(SummarizerConfig(provider="openai", model="m", base_url=server.openai_base_url, max_retries=0), environ={"OPENAI_API_KEY": "sk-env"})
        assert oc.complete(MSGS, model="m", max_tokens=5, timeout=5) == "via openai sdk"
        ac = build_client(
            SummarizerConfig(provider="anthropic", model="claude-x", base_url=server.anthropic_base_url, api_key_env="MY_KEY"),
            environ={"MY_KEY": "ak-env"},
        )
        assert ac.complete(MSGS, model="claude-x", max_tokens=5, timeout=5) == "via anthropic sdk"
        assert server.requests[0].headers["authorization"] == "Bearer sk-env"
        assert "ak-env" in server.requests[1].headers.get("x-api-key", "") + server.requests[1].headers.get("authorization", "")


def test_local_provider_needs_no_key() -> None:
    with StubServer([StubReply.ok("local")]) as server:
        client = build_client(SummarizerConfig(provider="vllm", model="m", base_url=server.openai_base_url), environ={})
        assert client.complete(MSGS, model="m", max_tokens=5, timeout=5) == "local"


def test_importing_ctxengine_does_not_import_the_sdks() -> None:
    code = (
        "import sys, ctxengine, ctxengine.engines.compressor, ctxengine.clients.factory, ctxengine.summarize.llm;"
        "bad = [m for m in ('openai', 'anthropic') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
