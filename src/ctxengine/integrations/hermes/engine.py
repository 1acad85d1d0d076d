"""The engine Hermes Agent loads: :class:`HermesAdapter` on Hermes' own ABC.

Importing this module needs Hermes Agent (``agent.context_engine``): it runs inside Hermes'
environment. Hermes' plugin manager accepts an engine only if it is an instance of its
``ContextEngine``, so the class derives from it; every method comes from the adapter.
"""

from __future__ import annotations

from typing import Any

from agent.context_engine import ContextEngine as HermesContextEngine

from ctxengine.integrations.hermes.adapter import HermesAdapter, HermesSettings

__all__ = ["CtxEngineContextEngine", "load_settings"]


def load_settings() -> HermesSettings:
    """Settings from the ``ctxengine:`` section of Hermes' config.yaml (defaults when absent)."""
    from ctxengine.integrations.hermes.adapter import settings_from_hermes_config

    try:
        from hermes_cli.config import load_config as load_hermes_config
    except ImportError:  # an older Hermes layout: ctxengine's own config alone
        return settings_from_hermes_config(None)
    hermes_config: Any = load_hermes_config()
    return settings_from_hermes_config(hermes_config if isinstance(hermes_config, dict) else None)


class CtxEngineContextEngine(HermesAdapter, HermesContextEngine):  # type: ignore[misc]
    """ctxengine as Hermes' context engine (``context.engine: ctxengine``)."""

    def __init__(self, settings: HermesSettings | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("settings_loader", load_settings)
        HermesAdapter.__init__(self, settings, **kwargs)
