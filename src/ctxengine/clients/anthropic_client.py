"""Anthropic's Messages API through the official ``anthropic`` SDK.

System messages become the ``system`` parameter; the rest are sent as user/assistant turns.
The SDK is imported on first use. Retries with backoff on 408/409/429/5xx (529 overloaded
included), timeouts and connection errors are the SDK's own (``max_retries``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctxengine.clients.base import error_message, looks_like_context_error
from ctxengine.errors import SummarizerAuthError, SummarizerContextError, SummarizerError
from ctxengine.messages import Message, content_text

__all__ = ["AnthropicClient"]


class AnthropicClient:
    """:class:`~ctxengine.clients.base.ChatClient` for Anthropic (or a compatible ``base_url``)."""

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        key_hint: str = "ANTHROPIC_API_KEY",
    ) -> None:
        self.base_url = base_url
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self._api_key = api_key
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
            )
        return self._sdk

    def complete(self, messages: Sequence[Message], *, model: str, max_tokens: int, timeout: float) -> str:
        client = self._client()
        import anthropic

        system = "\n\n".join(content_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer"))
        turns = [
            {"role": "assistant" if m.get("role") == "assistant" else "user", "content": content_text(m.get("content"))}
            for m in messages
            if m.get("role") not in ("system", "developer")
        ]
        where = self.base_url or "api.anthropic.com"
        kwargs: dict[str, Any] = {"model": model, "max_tokens": int(max_tokens), "messages": turns, "timeout": timeout}
        if system:
            kwargs["system"] = system
        try:
            resp = client.messages.create(**kwargs)
        except (anthropic.AuthenticationError, anthropic.PermissionDeniedError) as exc:
            raise SummarizerAuthError(f"{where} rejected the credentials ({exc.status_code}): {error_message(exc)}") from exc
        except anthropic.APITimeoutError as exc:
            raise SummarizerError(f"{where} timed out after {timeout:g}s ({self.max_retries} retries)") from exc
        except anthropic.APIConnectionError as exc:
            raise SummarizerError(f"cannot reach {where}: {exc}") from exc
        except anthropic.APIStatusError as exc:
            text = error_message(exc)
            if exc.status_code in (400, 413) and looks_like_context_error(text):
                raise SummarizerContextError(f"{where}: the prompt does not fit model {model!r}: {text}") from exc
            raise SummarizerError(f"{where} answered {exc.status_code}: {text}") from exc
        except anthropic.AnthropicError as exc:
            raise SummarizerError(f"{where}: {type(exc).__name__}: {exc}") from exc
        text = "".join(getattr(b, "text", "") for b in (resp.content or []) if getattr(b, "type", None) == "text")
        if resp.stop_reason == "max_tokens":
            raise SummarizerError(f"{where}: the reply was truncated at max_tokens={max_tokens}")
        return text
