"""Anthropic's Messages API through the official ``anthropic`` SDK.

System messages become the ``system`` parameter; the rest are sent as user/assistant turns.
The SDK is imported on first use. Each call is one attempt (the SDK's own retries are off
unless ``max_retries`` says otherwise): the summarizer retries under its deadline.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from ctxengine.clients.base import error_message, looks_like_context_error, retry_after_seconds
from ctxengine.clients.credentials import http_client_for, split_credentials
from ctxengine.errors import SummarizerAuthError, SummarizerContextError, SummarizerError
from ctxengine.messages import Message, content_text
from ctxengine.redact import redact, redact_url, register_secret

__all__ = ["AnthropicClient"]


class AnthropicClient:
    """:class:`~ctxengine.clients.base.ChatClient` for Anthropic (or a compatible ``base_url``)."""

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 0,
        key_hint: str = "ANTHROPIC_API_KEY",
    ) -> None:
        # credentials in the URL go to headers before any SDK sees it (see clients.credentials)
        self.base_url, self._url_credentials = split_credentials(base_url)
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self._api_key = api_key
        register_secret(api_key)
        self._key_hint = key_hint
        self._sdk: Any = None

    def _client(self) -> Any:
        if self._sdk is None:
            if not self._api_key:
                raise SummarizerAuthError(f"no API key for Anthropic: set {self._key_hint}")
            try:
                import anthropic
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise SummarizerError("the LLM summarizer needs the 'llm' extra: pip install 'ctxengine[llm]'") from exc
            self._sdk = anthropic.Anthropic(
                api_key=self._api_key,
                base_url=self.base_url,
                timeout=self.timeout,
                max_retries=self.max_retries,
                http_client=http_client_for(anthropic, self._url_credentials),
            )
        return self._sdk

    def close(self) -> None:
        """Close the SDK client and its connections; the next call opens a new one."""
        sdk, self._sdk = self._sdk, None
        if sdk is not None:
            with contextlib.suppress(Exception):  # best effort: the connection may already be gone
                sdk.close()

    def complete(self, messages: Sequence[Message], *, model: str, max_tokens: int, timeout: float) -> str:
        client = self._client()
        import anthropic

        system = "\n\n".join(content_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer"))
        turns = [
            {"role": "assistant" if m.get("role") == "assistant" else "user", "content": content_text(m.get("content"))}
            for m in messages
            if m.get("role") not in ("system", "developer")
        ]
        where = redact_url(self.base_url) or "api.anthropic.com"
        kwargs: dict[str, Any] = {"model": model, "max_tokens": int(max_tokens), "messages": turns, "timeout": timeout}
        if system:
            kwargs["system"] = system
        # SDK exceptions are not chained (their bodies may echo the key): see openai_compat
        try:
            resp = client.messages.create(**kwargs)
        except (anthropic.AuthenticationError, anthropic.PermissionDeniedError) as exc:
            raise SummarizerAuthError(f"{where} rejected the credentials ({exc.status_code}): {error_message(exc)}") from None
        except anthropic.APITimeoutError:
            raise SummarizerError(f"{where} timed out after {timeout:g}s") from None
        except anthropic.APIConnectionError as exc:
            raise SummarizerError(f"cannot reach {where}: {redact(str(exc))}") from None
        except anthropic.APIStatusError as exc:
            text = error_message(exc)
            if exc.status_code in (400, 413) and looks_like_context_error(text):
                raise SummarizerContextError(f"{where}: the prompt does not fit model {model!r}: {text}") from None
            retryable = exc.status_code in (408, 409, 425, 429) or exc.status_code >= 500
            raise SummarizerError(f"{where} answered {exc.status_code}: {text}", retryable=retryable, retry_after=retry_after_seconds(exc)) from None
        except anthropic.AnthropicError as exc:
            raise SummarizerError(f"{where}: {type(exc).__name__}: {error_message(exc)}") from None
        except (ValueError, TypeError, AttributeError) as exc:  # a body the SDK could not decode
            raise SummarizerError(f"{where}: malformed reply ({type(exc).__name__}: {redact(str(exc))[:200]})") from None
        text = "".join(str(getattr(b, "text", "") or "") for b in (getattr(resp, "content", None) or []) if getattr(b, "type", None) == "text")
        if getattr(resp, "stop_reason", None) == "max_tokens":
            raise SummarizerError(f"{where}: the reply was truncated at max_tokens={max_tokens}")
        return text
