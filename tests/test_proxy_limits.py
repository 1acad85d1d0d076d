"""Context-length rejections read from real providers' messages, and the proxy's window rule."""

from __future__ import annotations

import json
import logging

import pytest

from ctxengine.config import Config
from ctxengine.proxy.limits import (
    Window,
    Windows,
    context_limit_from_error,
    is_context_length_error,
)


def _openai(message: str, code: str | None = "context_length_exceeded", type_: str = "invalid_request_error") -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": "messages", "code": code}}).encode()


# (status, body, window) — the messages as the servers send them (quoted in public issues)
REAL = [
    # OpenAI chat completions
    (
        400,
        _openai(
            "This model's maximum context length is 16385 tokens. However, your messages resulted in 17000 tokens. "
            "Please reduce the length of the messages."
        ),
        16385,
    ),
    (
        400,
        _openai(
            "This model's maximum context length is 128000 tokens. However, your messages resulted in 130511 tokens "
            "(129774 in the messages, 737 in the functions). Please reduce the length of the messages or functions."
        ),
        128000,
    ),
    # older OpenAI completions wording (acheong08/ChatGPT#501)
    (
        400,
        _openai(
            "This model's maximum context length is 4097 tokens, however you requested 4116 tokens (1044 in your prompt; "
            "3072 for the completion). Please reduce your prompt; or completion length.",
            code=None,
        ),
        4097,
    ),
    # vLLM (vllm-project/vllm#20409), its OpenAI-compatible error shape
    (
        400,
        json.dumps(
            {
                "object": "error",
                "message": "This model's maximum context length is 16384 tokens. However, you requested 122946 tokens "
                "(112946 in the messages, 10000 in the completion). Please reduce the length of the messages or completion.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        ).encode(),
        16384,
    ),
    # vLLM, max_tokens too large for what is left
    (
        400,
        json.dumps(
            {
                "error": {
                    "message": "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length "
                    "is 4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778). None",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            }
        ).encode(),
        4096,
    ),
    # vLLM V1 engine
    (
        400,
        json.dumps(
            {"object": "error", "message": "The decoder prompt (length 40000) is longer than the maximum model length of 32768. "
             "Make sure that `max_model_len` is no smaller than the number of text tokens.", "type": "BadRequestError", "code": 400}
        ).encode(),
        32768,
    ),
    # Anthropic (stackblitz-labs/bolt.diy#401, anthropics/claude-code#59696)
    (
        400,
        json.dumps(
            {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": "prompt is too long: 208656 tokens > 200000 maximum"},
                "request_id": "req_011CWdepJvA2D819tdYYq4h7",
            }
        ).encode(),
        200000,
    ),
    # llama.cpp server
    (
        400,
        json.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "request (4476 tokens) exceeds the available context size (4096 tokens)",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 4476,
                    "n_ctx": 4096,
                }
            }
        ).encode(),
        4096,
    ),
    # llama.cpp, message reworded but the fields kept
    (
        400,
        json.dumps({"error": {"code": 400, "message": "the request exceeds the context", "type": "exceed_context_size_error", "n_ctx": 8192}}).encode(),
        8192,
    ),
    # other OpenAI-compatible servers
    (400, _openai("Requested token count exceeds the model's maximum context length of 131072 tokens", code=None), 131072),
    (400, b"Prompt too long: 51587 tokens exceeds max context window of 32768 tokens", 32768),
]


@pytest.mark.parametrize(("status", "body", "window"), REAL)
def test_the_window_is_read_from_real_rejections(status: int, body: bytes, window: int) -> None:
    assert context_limit_from_error(status, body) == window
    assert is_context_length_error(status, body)


NOT_CONTEXT = [
    (400, _openai("Invalid value for 'tool_choice': 'auto'", code="invalid_value")),
    (401, _openai("Incorrect API key provided: sk-...1234.", code="invalid_api_key")),
    (429, _openai("Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 29000", code="rate_limit_exceeded")),
    (
        400,
        json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens for claude-sonnet-4-5"}}).encode(),
    ),
    (413, json.dumps({"type": "error", "error": {"type": "request_too_large", "message": "Request exceeds the maximum allowed number of bytes."}}).encode()),
    (500, b"internal error"),
    (200, _openai("This model's maximum context length is 16385 tokens.")),
    (400, b""),
    (400, b"<html>Bad Request</html>"),
]


@pytest.mark.parametrize(("status", "body"), NOT_CONTEXT)
def test_other_responses_are_not_read_as_a_window(status: int, body: bytes) -> None:
    assert context_limit_from_error(status, body) is None
    assert not is_context_length_error(status, body)


def test_rejections_that_name_no_window_are_still_recognised() -> None:
    responses_api = _openai("Your input exceeds the context window of this model. Please adjust your input and try again.")
    ollama = json.dumps({"error": "input length exceeds maximum context length"}).encode()
    for body in (responses_api, ollama):
        assert is_context_length_error(400, body)
        assert context_limit_from_error(400, body) is None


def _config(**sections: object) -> Config:
    return Config.from_dict(dict(sections))


def test_window_rule_config_then_learnt_then_table_then_default_a_smaller_learnt_one_wins(caplog: pytest.LogCaptureFixture) -> None:
    w = Windows(_config(models={"qwen*": {"context_length": 32768}, "qwen2.5-coder-7b": {"context_length": 16384}}))
    assert w.window_for("openai", "qwen2.5-coder-7b") == Window(16384, "config")  # the exact name after the glob
    assert w.window_for("openai", "qwen3-8b") == Window(32768, "config")
    assert w.window_for("openai", "gpt-4o") == Window(128000, "table")
    assert w.learn("openai", "gpt-4o", 16385) == Window(16385, "learnt")
    assert w.window_for("openai", "gpt-4o") == Window(16385, "learnt")
    assert w.window_for("anthropic", "gpt-4o") == Window(128000, "table")  # learnt per API
    with caplog.at_level(logging.WARNING, logger="ctxengine.proxy"):
        assert w.learn("openai", "qwen3-8b", 8192) == Window(8192, "learnt")  # the provider's smaller window, with a warning
    assert "smaller than the configured 32,768" in caplog.text
    assert w.window_for("openai", "qwen3-8b") == Window(8192, "learnt")
    assert w.learn("openai", "qwen2.5-coder-7b", 20000) == Window(16384, "config")  # a larger one changes nothing
    assert w.window_for("openai", "qwen2.5-coder-7b") == Window(16384, "config")


def test_an_unknown_model_is_warned_once_with_how_to_set_it(caplog: pytest.LogCaptureFixture) -> None:
    w = Windows(_config(model={"default_context_length": 20000}))
    with caplog.at_level(logging.WARNING, logger="ctxengine.proxy"):
        assert w.window_for("openai", "my-local-model") == Window(20000, "default")
        assert w.window_for("openai", "my-local-model") == Window(20000, "default")
        assert w.window_for("anthropic", "my-local-model") == Window(20000, "default")
    warnings = [r for r in caplog.records if "my-local-model" in r.getMessage()]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert "assuming 20,000 tokens" in text
    assert "--model-window my-local-model=TOKENS" in text and "--context-length TOKENS" in text
    # once learnt, no default any more
    assert w.learn("openai", "my-local-model", 4096) == Window(4096, "learnt")
    assert w.window_for("openai", "my-local-model") == Window(4096, "learnt")


def test_model_context_length_is_the_window_of_every_model_without_its_own() -> None:
    w = Windows(_config(model={"context_length": 50000}, models={"gpt-4o": {"context_length": 64000}}))
    assert w.window_for("openai", "whatever") == Window(50000, "config")
    assert w.window_for("openai", "gpt-4o") == Window(64000, "config")


def test_learn_rejects_a_bad_window() -> None:
    with pytest.raises(ValueError, match="positive"):
        Windows(Config()).learn("openai", "m", 0)
