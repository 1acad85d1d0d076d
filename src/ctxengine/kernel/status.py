"""What a session reports: its counters, the context pressure warning (seed 000, off by
default) and :meth:`ctxengine.manager.ContextManager.status` (redacted)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ctxengine.caching import CachingStatus, Placement
from ctxengine.kernel.state import ModelWindow, SessionState
from ctxengine.redact import redact_obj

__all__ = ["PRESSURE_RATIO", "counters", "report", "update_pressure"]

log = logging.getLogger("ctxengine.manager")  # the kernel logs under the manager's name

PRESSURE_RATIO = 0.85
"""Context pressure warnings (seed 000, off by default) at 85 % of the compaction threshold."""


def update_pressure(s: SessionState, tokens: int) -> None:
    """The session's pressure warning after a turn of ``tokens`` (when warnings are on)."""
    threshold = s.engine.threshold_tokens
    if threshold <= 0:
        return
    if tokens >= PRESSURE_RATIO * threshold:
        pct = round(100 * tokens / threshold)
        s.pressure_warning = f"Context is {pct}% to compaction threshold ({tokens:,}/{threshold:,} tokens)"
        log.warning(s.pressure_warning)
    else:
        s.pressure_warning = None


def counters(s: SessionState) -> dict[str, int]:
    return {"turns": s.turns, "compactions": s.compactions, "last_tokens": s.last_tokens}


def report(
    s: SessionState,
    window: ModelWindow,
    *,
    caching: CachingStatus,
    placement: Placement,
    store: object | None,
    limit: int,
    hygiene_threshold: int,
    recall_offered: Callable[[], bool],
) -> dict[str, Any]:
    """The engine's status plus the kernel's view of the session (under its lock)."""
    st = dict(s.engine.get_status())
    st.update(
        {
            "session": s.id,
            "model": window.model,
            "context_length": window.context_length,
            "turns": s.turns,
            "compactions": s.compactions,
            "last_tokens": s.last_tokens,
            "hygiene_threshold": hygiene_threshold,
            "hygiene_fired": s.hygiene_fired,
            "caching": caching.line,
            "placement": placement if caching.enabled else None,
            "cache_read_tokens": s.cache_read_tokens,
            "cache_write_tokens": s.cache_write_tokens,
            "store": type(store).__name__ if store is not None else None,
            "store_errors": s.store_errors,
            "engine_errors": s.engine_errors,
            "window_limit": limit,
            "window_source": window.source,
            "tool_tokens": s.tool_window,
            "window_cuts": s.window_cuts,
            "max_consecutive_compactions": s.streak.longest,
            "recall_offered": recall_offered(),
        }
    )
    if s.pressure_warning:
        st["pressure_warning"] = s.pressure_warning
    if s.last_compaction is not None:
        st["last_compaction"] = s.last_compaction
    if s.fallback_reason is not None:
        st["fallback_reason"] = s.fallback_reason
    clean: dict[str, Any] = redact_obj(st)  # no secret in status(): a plugin's or custom summarizer's text too
    return clean
