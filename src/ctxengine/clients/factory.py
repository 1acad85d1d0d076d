"""Build a chat client from ``auxiliary.compression`` (seed 003's ``provider``/``model``/``base_url``).

Providers:

================  =====================================================================
``auto``          ``base_url`` set → ``custom``; a bare ``claude-*`` model → ``anthropic``;
                  a ``vendor/model`` name → ``openrouter``; otherwise ``openai``
``openai``        api.openai.com (``OPENAI_API_KEY``)
``openrouter``    https://openrouter.ai/api/v1 (``OPENROUTER_API_KEY``)
``anthropic``     the Anthropic Messages API (``ANTHROPIC_API_KEY``)
``custom``        any OpenAI-compatible ``base_url`` (key optional)
``ollama``        http://localhost:11434/v1 unless ``base_url`` says otherwise (no key)
``vllm``          http://localhost:8000/v1 unless ``base_url`` says otherwise (no key)
``llamacpp``      http://localhost:8080/v1 unless ``base_url`` says otherwise (no key)
``lmstudio``      http://localhost:1234/v1 unless ``base_url`` says otherwise (no key)
================  =====================================================================

Keys come from the environment only (:func:`ctxengine.config.api_key_from_env`).
"""

from __future__ import annotations

from collections.abc import Mapping

from ctxengine.clients.anthropic_client import AnthropicClient
from ctxengine.clients.base import ChatClient
from ctxengine.clients.openai_compat import OpenAICompatClient
from ctxengine.config import SummarizerConfig, api_key_from_env
from ctxengine.errors import ConfigError

__all__ = ["PROVIDERS", "build_client", "resolve_provider"]

OPENROUTER_URL = "https://openrouter.ai/api/v1"
_LOCAL = {
    "ollama": "http://localhost:11434/v1",
    "vllm": "http://localhost:8000/v1",
    "llamacpp": "http://localhost:8080/v1",
    "lmstudio": "http://localhost:1234/v1",
}
PROVIDERS = ("auto", "openai", "openrouter", "anthropic", "custom", *_LOCAL)


def resolve_provider(config: SummarizerConfig) -> str:
    """The concrete provider for ``config`` (``auto`` resolved, see the module table)."""
    provider = config.provider.lower()
    if provider not in PROVIDERS:
        raise ConfigError(f"auxiliary.compression.provider: unknown provider {config.provider!r}; known: {', '.join(PROVIDERS)}")
    if provider != "auto":
        return provider
    model = (config.model or "").lower()
    if config.base_url:
        return "custom"
    if model.startswith("claude"):
        return "anthropic"
    if "/" in model:
        return "openrouter"
    return "openai"


def build_client(config: SummarizerConfig, *, environ: Mapping[str, str] | None = None) -> ChatClient:
    """A :class:`ChatClient` for ``config``. A missing key is not an error here: the first call
    raises :class:`~ctxengine.errors.SummarizerAuthError` naming the variable to set, so the
    engine can keep the conversation unchanged and say why."""
    provider = resolve_provider(config)
    probe = config.model_copy(update={"provider": provider})
    key = api_key_from_env(probe, environ)
    hint = config.api_key_env or {
        "openai": "OPENAI_API_KEY",
        "openrouter": "OPENROUTER_API_KEY",
        "anthropic": "ANTHROPIC_API_KEY",
    }.get(provider, "CTXENGINE_API_KEY")
    if provider == "anthropic":
        return AnthropicClient(api_key=key, base_url=config.base_url, timeout=config.timeout, key_hint=hint)
    if provider == "custom" and not config.base_url:
        raise ConfigError("auxiliary.compression.provider 'custom' needs auxiliary.compression.base_url")
    if provider in ("openai", "openrouter"):
        base = config.base_url or (OPENROUTER_URL if provider == "openrouter" else None)
        return OpenAICompatClient(base_url=base, api_key=key, timeout=config.timeout, require_key=True, key_hint=hint)
    base = config.base_url or _LOCAL.get(provider)
    return OpenAICompatClient(base_url=base, api_key=key, timeout=config.timeout, require_key=False, key_hint=hint)
