"""Building an engine for one session: its validated settings and the session's services.

``from_config(settings, services)`` is the contract (:class:`~ctxengine.engine.ContextEngine`);
hosts written against the seed call ``from_config(config, context_length, **services)``.
:func:`settings_and_services` accepts both, so each engine declares one pydantic settings model
(its ``Settings``, the section of :class:`~ctxengine.config.Config` named ``config_section``)
and reads nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from ctxengine.engine import Services
from ctxengine.errors import ConfigError
from ctxengine.summarize.base import Summarizer
from ctxengine.tokens import get_counter

if TYPE_CHECKING:
    from ctxengine.config import Config

__all__ = ["configured_summarizer", "settings_and_services", "with_overrides"]

S = TypeVar("S", bound=BaseModel)


def settings_and_services(
    model: type[S],
    section: str,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> tuple[S, Services]:
    """``(settings, services)`` from either calling convention (see the module docstring).

    ``settings`` may be an instance of ``model``, a mapping of its fields, ``None`` (defaults),
    or a whole config holding ``section``. Raises :class:`ConfigError` naming the bad field.
    """
    kw = dict(kwargs)
    first = kw.pop("settings", kw.pop("config", args[0] if args else None))
    services = kw.pop("services", args[1] if len(args) > 1 and isinstance(args[1], Services) else None)
    config: Any = None
    if first is None or isinstance(first, model):
        settings = first if first is not None else model()
    elif isinstance(first, Mapping):
        try:
            settings = model.model_validate(dict(first))
        except ValueError as exc:
            raise ConfigError(f"{section}: {exc}") from exc
    elif hasattr(first, section):
        config = first
        settings = getattr(first, section)
        if not isinstance(settings, model):
            settings = model.model_validate(settings.model_dump() if isinstance(settings, BaseModel) else settings)
    else:
        raise ConfigError(f"{section}: expected {model.__name__} settings, not {type(first).__name__}")
    if services is None:
        if len(args) > 1 and isinstance(args[1], int):
            kw.setdefault("context_length", args[1])
        fields = set(Services.__slots__)
        services = Services(**{k: v for k, v in kw.items() if k in fields and v is not None})
        if config is not None and services.config is None:
            services.config = config
    cfg = services.config
    if services.counter is None and cfg is not None and hasattr(cfg, "context"):
        # context.token_counter reaches the engine (``exact`` counts with o200k)
        services = dataclasses.replace(services, counter=get_counter(cfg.context.token_counter))
    return settings, services


def with_overrides(model: type[S], settings: S | None, overrides: Mapping[str, Any]) -> S:
    """``settings`` (default: the model's defaults) with keyword overrides, validated like a
    config file: ``RulesEngine(protect_last_n_turns=2)``."""
    s = settings if settings is not None else model()
    if not overrides:
        return s
    try:
        return model.model_validate({**s.model_dump(), **overrides})
    except ValueError as exc:
        raise ConfigError(f"{model.__name__}: {exc}") from exc


def configured_summarizer(config: Config | None, given: Summarizer | None = None) -> Summarizer | None:
    """``given``, else the LLM summarizer ``auxiliary.compression.model`` configures, else
    ``None`` (the engine's deterministic default)."""
    if given is not None or config is None or not config.auxiliary.compression.model:
        return given
    from ctxengine.summarize.llm import LlmSummarizer  # imported only when an LLM is configured

    return LlmSummarizer.from_config(config.auxiliary.compression)
