"""Building an engine for one session: its validated settings and the session's services.

``from_config(settings, services)`` is the contract (:class:`~ctxengine.engine.ContextEngine`):
each engine declares one pydantic settings model (its ``Settings``, the config section named
after the engine) and reads nothing else. The registry adapts engines of other shapes once,
where they are registered (:func:`ctxengine.registry.adapt`). :func:`session_counter` (the
session's per-message token counts, else its counter) and :func:`configured_summarizer` read the
two services an engine takes from the whole config.
:func:`settings_and_services` serves engines written for an older page of the docs, whose
``from_config(*args, **kwargs)`` accepted both ``(settings, services)`` and
``(config, context_length, **services)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from ctxengine.engine import Services
from ctxengine.errors import ConfigError
from ctxengine.summarize.base import Summarizer
from ctxengine.tokens import TokenCounter, get_counter

if TYPE_CHECKING:
    from ctxengine.config import Config

__all__ = ["checked", "configured_summarizer", "session_counter", "settings_and_services", "with_overrides"]

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


def checked(model: type[S], settings: S | Mapping[str, Any] | None, services: Services | None) -> tuple[S, Services]:
    """The arguments of ``from_config(settings, services)``, checked: ``settings`` an instance
    of the engine's ``model`` (a mapping of its fields is validated; ``None``: the defaults),
    ``services`` a :class:`Services` (``None``: the defaults). Anything else — a whole config,
    a window — is a ``TypeError`` saying how to build the engine instead."""
    if services is None:
        services = Services()
    elif not isinstance(services, Services):
        raise TypeError(f"from_config(settings, services): services must be a Services, not {type(services).__name__}")
    if settings is None:
        return model(), services
    if isinstance(settings, model):
        return settings, services
    if isinstance(settings, Mapping):
        try:
            return model.model_validate(dict(settings)), services
        except ValueError as exc:
            raise ConfigError(f"{model.__name__}: {exc}") from exc
    raise TypeError(
        f"from_config(settings, services): settings must be a {model.__name__}, not {type(settings).__name__}; "
        "to build an engine from a whole config use ctxengine.create_engine(config, name=...) or EngineRegistry.create"
    )


def session_counter(services: Services) -> TokenCounter | None:
    """What an engine counts with: the session's per-message counts ``services.tokens`` (a
    :class:`~ctxengine.tokens.MessageTokens` over the configured counter, shared with the
    kernel), else ``services.counter``, else the counter ``context.token_counter`` of
    ``services.config`` names, else ``None`` (the engine's default, the fast estimate). An
    engine reads each message's count from :meth:`MessageTokens.of(counter)
    <ctxengine.tokens.MessageTokens.of>`: the session's, or a private one built over the counter."""
    if services.tokens is not None:
        return services.tokens
    if services.counter is not None:
        return services.counter
    cfg = services.config
    return get_counter(cfg.context.token_counter) if cfg is not None and hasattr(cfg, "context") else None


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
