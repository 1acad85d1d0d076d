"""Hermes Agent's pip-plugin entry point (group ``hermes_agent.plugins``, name ``ctxengine``).

Hermes' plugin manager imports this module and calls :func:`register` when the plugin is
enabled (``hermes plugins enable ctxengine``). Registering makes the engine *selectable*; it
serves only when Hermes' config says ``context.engine: ctxengine`` (never automatically).
Settings are read when the engine is first used, so registering costs nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(ctx: Any) -> None:
    """Hand Hermes a ctxengine-backed context engine."""
    from ctxengine.integrations.hermes.engine import CtxEngineContextEngine

    ctx.register_context_engine(CtxEngineContextEngine())
