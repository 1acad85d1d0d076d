"""Any OpenAI-compatible chat-completions endpoint through the official ``openai`` SDK.

Covers OpenAI, OpenRouter, vLLM, Ollama, llama.cpp server, LM Studio and any ``base_url``.
The SDK is imported on first use, so importing this module costs nothing. Each call is one
attempt (the SDK's own retries are off unless ``max_retries`` says otherwise): the summarizer
retries under its deadline, reading ``retry_after`` from the error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from ctxengine.clients.base import error_message, looks_like_context_error, retry_after_seconds
from ctxengine.clients.credentials import http_client_for, split_credentials
from ctxengine.errors import SummarizerAuthError, SummarizerContextError, SummarizerError
from ctxengine.messages import Message
from ctxengine.redact import redact, redact_url, register_secret

__all__ = ["OpenAICompatClient"]


class OpenAICompatClient:
    """:class:`~ctxengine.clients.base.ChatClient` for OpenAI-compatible servers.

    ``api_key=None`` with ``require_key=True`` makes every call fail with
    :class:`SummarizerAuthError` naming ``key_hint`` (the variable to set); local servers that
    need no key use ``require_key=False``.
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 0,
        require_key: bool = True,
        key_hint: str = "OPENAI_API_KEY",
        default_headers: dict[str, str] | None = None,
    ) -> None:
        # credentials in the URL go to headers before any SDK sees it (see clients.credentials)
        self.base_url, self._url_credentials = split_credentials(base_url)
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self._api_key = api_key
        register_secret(api_key)
        self._require_key = require_key
        self._key_hint = key_hint
        self._headers = dict(default_headers or {})
        self._sdk: Any = None

    def _client(self) -> Any:
        if self._sdk is None:
            if self._api_key is None and self._require_key:
                raise SummarizerAuthError(f"no API key for {redact_url(self.base_url) or 'api.openai.com'}: set {self._key_hint}")
            try:
                import openai
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise SummarizerError("the LLM summarizer needs the 'llm' extra: pip install 'ctxengine[llm]'") from exc
            self._sdk = openai.OpenAI(
                api_key=self._api_key or "no-key-needed",
                base_url=self.base_url,
                timeout=self.timeout,
                max_retries=self.max_retries,
                http_client=http_client_for(openai, self._url_credentials),
                default_headers=self._headers or None,
            )
        return self._sdk

    def close(self) -> None:
        """Close the SDK client and its connections (an abandoned call's socket included); the
        next call opens a new one."""
        sdk, self._sdk = self._sdk, None
        if sdk is not None:
            with contextlib.suppress(Exception):  # best effort: the connection may already be gone
                sdk.close()

    def complete(self, messages: Sequence[Message], *, model: str, max_tokens: int, timeout: float) -> str:
        client = self._client()
        import openai

        where = redact_url(self.base_url) or "api.openai.com"
        try:
            resp = client.chat.completions.create(
                model=model,
                messages=list(messages),
                max_tokens=int(max_tokens),
                timeout=timeout,
            )
        # the SDK exception (its body may echo the key) is not chained: only the redacted text
        # travels on, so no traceback or log line can print it
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise SummarizerAuthError(f"{where} rejected the credentials ({exc.status_code}): {error_message(exc)}") from None
        except openai.APITimeoutError:
            raise SummarizerError(f"{where} timed out after {timeout:g}s") from None
        except openai.APIConnectionError as exc:
            raise SummarizerError(f"cannot reach {where}: {redact(str(exc))}") from None
        except openai.APIStatusError as exc:
            text = error_message(exc)
            if exc.status_code in (400, 413, 422) and looks_like_context_error(text):
                raise SummarizerContextError(f"{where}: the prompt does not fit model {model!r}: {text}") from None
            retryable = exc.status_code in (408, 409, 425, 429) or exc.status_code >= 500
            raise SummarizerError(f"{where} answered {exc.status_code}: {text}", retryable=retryable, retry_after=retry_after_seconds(exc)) from None
        except openai.OpenAIError as exc:
            raise SummarizerError(f"{where}: {type(exc).__name__}: {error_message(exc)}") from None
        except (ValueError, TypeError, AttributeError) as exc:  # a body the SDK could not decode
            raise SummarizerError(f"{where}: malformed reply ({type(exc).__name__}: {redact(str(exc))[:200]})") from None
        choices = getattr(resp, "choices", None) or []
        if not choices:
            return ""
        choice = choices[0]
        text = getattr(getattr(choice, "message", None), "content", None) or ""
        if getattr(choice, "finish_reason", None) == "length":
            raise SummarizerError(f"{where}: the reply was truncated at max_tokens={max_tokens}")
        return str(text)
