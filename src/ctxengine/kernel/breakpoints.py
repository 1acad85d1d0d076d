"""Prompt-cache breakpoints: where a request gets its ``cache_control`` markers under the
configured placement (the planner, or the system prompt and the last three messages)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ctxengine.caching import (
    CachePace,
    CachingStatus,
    Placement,
    apply_breakpoints,
    plan_breakpoints,
    system_and_3_breakpoints,
)
from ctxengine.kernel.state import ModelWindow, SessionState
from ctxengine.messages import Message

__all__ = ["CachePlan"]


class CachePlan:
    """``caching``: whether and how this model and provider cache; ``placement``: where."""

    def __init__(self, caching: CachingStatus, placement: Placement, window: ModelWindow) -> None:
        self.caching = caching
        self.placement = placement
        self.window = window

    def breakpoints(self, s: SessionState, messages: Sequence[Message], tokens: Sequence[int] | None = None) -> list[int]:
        """The indices that get a marker; remembers ``messages`` as the session's latest request."""
        with s.lock:
            previous = s.last_request
            s.last_request = list(messages)
            s.last_sent = s.last_request
            planner = self.caching.enabled and self.placement == "planner"
            known = s.history.planner_inputs(messages) if planner and tokens is None else None
            toks = list(tokens) if tokens is not None else s.history.message_tokens(messages) if planner and known is None else []
        if not self.caching.enabled:
            return []
        if planner:
            return plan_breakpoints(
                messages,
                min_cache_tokens=self.window.profile.min_cache_tokens,
                tokens=toks if known is None else None,
                prefix_tokens=known[0] if known is not None else None,
                stable=known[1] if known is not None else None,
                turns=known[2] if known is not None else None,
                native_anthropic=self.caching.native_anthropic,
                previous=previous,
            )
        return system_and_3_breakpoints(messages)

    def mark(self, messages: Sequence[Message], indices: list[int], pace: CachePace | None = None) -> list[Message]:
        """``messages`` with ``cache_control`` at ``indices`` (the marked ones copies); with
        ``cache_ttl: auto`` the TTL is the session's ``pace``'s choice (and the request is
        observed by it)."""
        if not self.caching.enabled:
            return list(messages)
        ttl = self.ttl(pace)
        return apply_breakpoints(messages, indices, cache_ttl=ttl, native_anthropic=self.caching.native_anthropic, share_unmarked=True)

    def ttl(self, pace: CachePace | None) -> str:
        """The TTL of one request's markers: the configured one, or with ``cache_ttl: auto``
        the session's ``pace``'s choice (the request is then observed by it: call once per
        request sent)."""
        ttl = self.caching.cache_ttl
        if pace is not None:
            ttl = pace.ttl("auto" if self.caching.auto_ttl else ttl)
            pace.observe(time.monotonic(), ttl)
        return ttl
