"""The chat-client seam: one method between a summarizer and an LLM endpoint.

Implementations translate their SDK's exceptions once into the ctxengine tree:
:class:`~ctxengine.errors.SummarizerAuthError` (credentials rejected or missing: never
retried), :class:`~ctxengine.errors.SummarizerContextError` (the prompt does not fit the
model's window) and :class:`~ctxengine.errors.SummarizerError` (everything else, after the
SDK's own retries with backoff on 429/5xx/timeouts). A reply cut at ``max_tokens`` raises
:class:`~ctxengine.errors.SummarizerError` too: a truncated summary is a failed summary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ctxengine.messages import Message

__all__ = ["CONTEXT_ERROR_HINTS", "ChatClient", "error_message", "looks_like_context_error"]

CONTEXT_ERROR_HINTS = (
    "context length",
    "context_length",
    "maximum context",
    "context window",
    "prompt is too long",
    "too many tokens",
    "too long",
    "reduce the length",
    "exceeds the maximum",
)
"""Phrases providers use when a prompt does not fit (OpenAI, Anthropic, vLLM, llama.cpp…)."""


def looks_like_context_error(message: str) -> bool:
    """True when an error text says the prompt exceeded the model's window."""
    low = message.lower()
    return any(h in low for h in CONTEXT_ERROR_HINTS)


@runtime_checkable
class ChatClient(Protocol):
    """Sends a chat request and returns the reply text ("" when the model returned none)."""

    def complete(self, messages: Sequence[Message], *, model: str, max_tokens: int, timeout: float) -> str: ...


def error_message(exc: Any) -> str:
    """The provider's own error text from an SDK exception (both SDKs keep the decoded JSON
    body as ``exc.body``: ``{"error": {"message": ...}}``), else the exception's message."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
    return str(getattr(exc, "message", exc))
