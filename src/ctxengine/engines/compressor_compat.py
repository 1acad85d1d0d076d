"""Hermes Agent's ``ContextCompressor`` keywords, translated for :class:`ctxengine.ContextCompressor`.

Importable without Hermes: nothing here imports it. Hermes' meaning of its keywords:

* the window is ``context_length``, else ``config_context_length``, else the model table's
  window for ``model`` (:func:`window_for`);
* ``max_tokens`` (a positive int) is the reply's reservation (:func:`reply_reserve`);
* ``summary_target_ratio`` is clamped to [0.10, 0.80] (:func:`target_ratio_for`);
* ``summary_model_override`` with ``base_url``/``api_key``/``provider`` selects the LLM that
  writes summaries (:func:`hermes_summarizer`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from ctxengine.errors import ConfigError
from ctxengine.models import DEFAULT_CONTEXT_LENGTH
from ctxengine.summarize.base import Summarizer

__all__ = ["SERVICES", "check_keywords", "hermes_summarizer", "reply_reserve", "target_ratio_for", "window_for"]

SERVICES = frozenset({"store", "session_id", "model_name", "config", "services"})
"""Host services a constructor accepts (and does not use) besides its own keywords."""


def check_keywords(services: Iterable[str]) -> None:
    """Raise TypeError naming the keywords that are neither settings nor host services."""
    unknown = sorted(set(services) - SERVICES)
    if unknown:
        raise TypeError(f"ContextCompressor got unexpected keyword argument(s): {', '.join(unknown)}")


def reply_reserve(max_tokens: Any) -> int | None:
    """Hermes' ``max_tokens`` as the reply's reservation: a positive int, else None."""
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0:
        return max_tokens
    return None


def window_for(model: str | None, context_length: int | None, config_context_length: int | None) -> int:
    """The window in tokens (see the module docstring); ConfigError when not positive."""
    if context_length is None:
        if config_context_length is not None:
            context_length = int(config_context_length)
        elif model:
            from ctxengine.models import resolve_model

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                context_length = resolve_model(model).context_length
        else:
            context_length = DEFAULT_CONTEXT_LENGTH
    if int(context_length) <= 0:
        raise ConfigError(f"context_length must be a positive number of tokens, not {context_length}")
    return int(context_length)


def target_ratio_for(target_ratio: float | None, summary_target_ratio: float | None) -> float:
    """``target_ratio``, else Hermes' ``summary_target_ratio`` clamped to [0.10, 0.80], else 0.20."""
    if target_ratio is None:
        target_ratio = max(0.10, min(float(summary_target_ratio), 0.80)) if summary_target_ratio is not None else 0.20
    return float(target_ratio)


def hermes_summarizer(model: str, base_url: str, api_key: str, provider: str) -> Summarizer:
    """The LLM summarizer Hermes' keywords name (``summary_model_override`` and its endpoint)."""
    from ctxengine.clients.factory import build_client
    from ctxengine.config import SummarizerConfig
    from ctxengine.summarize.llm import LlmSummarizer

    env = {"CTXENGINE_SUMMARY_API_KEY": api_key} if api_key else {}
    cfg = SummarizerConfig(
        provider=provider or "auto",
        model=model,
        base_url=base_url or None,
        api_key_env="CTXENGINE_SUMMARY_API_KEY" if api_key else None,
    )
    return LlmSummarizer(build_client(cfg, environ=env or None), model)
