"""The counting stage: the counters a manager's decisions, its engines and its window cap use,
each session's count anchored on the provider's prompt tokens, and the usage an engine sees."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ctxengine.engine import Usage, normalize_usage
from ctxengine.history import SessionHistory
from ctxengine.kernel.state import SessionState
from ctxengine.tokens import AnchoredCounter, EstimateCounter, MessageTokens, TokenCounter
from ctxengine.window import ToolTokens, WindowCounter

__all__ = ["Counting", "without_tools"]


def without_tools(usage: Any, u: Usage, tools: int) -> Any:
    """The usage the engine sees: its messages' share, without the ``tools`` tokens of tool
    definitions the provider counted too (the engine works against the window less them:
    :meth:`ctxengine.kernel.engines.EngineHost.fit`). Tool definitions open the prompt, so they
    come out of the cached part first, then of the part written to the cache, then of the rest."""
    if tools <= 0:
        return usage
    read = min(u.cache_read_tokens, tools)
    write = min(u.cache_write_tokens, tools - read)
    prompt = max(0, u.prompt_tokens - tools)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": u.completion_tokens,
        "total_tokens": prompt + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cache_read_tokens - read, "cache_write_tokens": u.cache_write_tokens - write},
    }


class Counting:
    """``counter``: the configured counter (engines count with it, each message once per
    session: :meth:`for_engine`); ``window``: o200k, exact, memoised per text (the window cap's
    own counter, not per message: see :mod:`ctxengine.window.counting`); ``session``: what
    decisions count new messages with (the window counter when the configured one is the
    estimate: the estimate is 16 % low on a /sys listing); ``tools``: the tool definitions'
    counts, memoised per distinct list."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.window = WindowCounter()
        self.session: TokenCounter = self.window if isinstance(counter, EstimateCounter) else counter
        self.tools = ToolTokens(self.session.count, self.window.exact_text)

    def for_engine(self, history: SessionHistory | None) -> MessageTokens | None:
        """The per-message counts a session's engine reads (``Services.tokens``): the session's
        own, kept by its history with the configured counter (the estimates the trigger, the
        planner and the engine share when that is the estimate); ``None`` without a session."""
        return history.tokens.for_counter(self.counter) if history is not None else None

    def anchored(self, history: SessionHistory) -> AnchoredCounter:
        """The session's token count for decisions (anchored on the provider's prompt tokens)."""
        wc = self.window
        if self.session is not wc:
            # the configured counter counts for decisions: each message once, in the session's
            # counts the engine reads too
            return AnchoredCounter(self.session, per_message=history.tokens.for_counter(self.session).message)
        if type(self.counter) is not EstimateCounter:
            return AnchoredCounter(self.session)

        # the window counter's count of a message without long texts is its estimate, which
        # the session's history memoises (the engine's trigger and the planner count with it)
        estimates = history.tokens.estimates

        def one(m: Mapping[str, Any]) -> int:
            return wc.count_message(m, estimates.message)

        return AnchoredCounter(wc, per_message=one)

    @staticmethod
    def take_usage(s: SessionState, usage: Any) -> None:
        """A response's usage (under the session's lock): the engine sees its messages' share,
        and the session's count is anchored on the real prompt tokens."""
        u = normalize_usage(usage)
        s.engine.update_from_response(without_tools(usage, u, s.tool_tokens))
        if u.prompt_tokens > 0 and s.last_sent:
            # the provider counted the tool definitions too: the anchor is the messages'
            s.counter.anchor(s.last_sent, max(0, u.prompt_tokens - s.tool_tokens))
        s.cache_read_tokens += u.cache_read_tokens
        s.cache_write_tokens += u.cache_write_tokens
        s.prompt_tokens_total += u.prompt_tokens
        s.pace.wrote(u.cache_write_tokens, u.prompt_tokens)
