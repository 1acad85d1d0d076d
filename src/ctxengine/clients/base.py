"""The chat-client seam: one method between a summarizer and an LLM endpoint.

Implementations translate their SDK's exceptions once into the ctxengine tree:
:class:`~ctxengine.errors.SummarizerAuthError` (credentials rejected or missing: never
retried), :class:`~ctxengine.errors.SummarizerContextError` (the prompt does not fit the
model's window) and :class:`~ctxengine.errors.SummarizerError` (everything else, after the
SDK's own retries with backoff on 429/5xx/timeouts). A reply cut at ``max_tokens`` raises
:class:`~ctxengine.errors.SummarizerError` too: a truncated summary is a failed summary.

Each ``complete`` is *one* attempt: the built-in clients disable the SDKs' own retries
(``max_retries=0`` by default) because :class:`~ctxengine.summarize.llm.LlmSummarizer` retries
itself under one deadline, honouring ``Retry-After`` only as far as the deadline allows
(``retry_after`` on the error). Error texts pass through :func:`ctxengine.redact.redact`: a
provider that echoes the key, a ``base_url`` with ``user:password@`` or ``?key=`` never reaches
an error message, a log line or the store.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ctxengine.messages import Message
from ctxengine.redact import redact

__all__ = ["CONTEXT_ERROR_HINTS", "ERROR_TEXT_CHARS", "ChatClient", "error_message", "looks_like_context_error", "retry_after_seconds"]

ERROR_TEXT_CHARS = 400
"""Most characters of a provider's error text kept in an error message (an HTML error page
or a stack dump from a proxy would otherwise fill logs and the store)."""

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
    text: str | None = None
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            text = str(err["message"])
    if text is None:
        text = str(getattr(exc, "message", exc))
    text = redact(text)
    if len(text) > ERROR_TEXT_CHARS:
        text = text[:ERROR_TEXT_CHARS] + f"… ({len(text):,} characters)"
    return text


def retry_after_seconds(exc: Any) -> float | None:
    """The wait a server asked for in an SDK error's response headers (``retry-after-ms``,
    ``retry-after`` as seconds or an HTTP date), ``None`` when it named none."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000.0)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(str(value))
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None
