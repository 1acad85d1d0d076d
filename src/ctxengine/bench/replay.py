"""Replay a recorded agent session through an engine, as a live agent loop would.

Before every assistant message of the recording, the working context (everything the agent
would send) goes through the engine: ``should_compress`` is asked with the context's token
count and, when it says so, ``compress`` runs (timed). The resulting request is checked
(valid chat format, inside the window) and measured; then the recorded assistant message and
what followed it (tool results, the next user message) are appended to the *compacted* working
context, exactly as an agent carries its history forward.

After the last turn, the preservation-guarantee facts of everything the agent had seen are
looked up in the last request sent.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxengine.engine import ContextEngine
from ctxengine.facts import FACT_KINDS, extract_facts, retention
from ctxengine.messages import Message, validate
from ctxengine.tokens import EstimateCounter, TokenCounter, estimate_message_tokens

__all__ = ["ReplayResult", "percentile", "replay_session"]

RequestHook = Callable[[int, list[Message], int], None]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass(slots=True)
class ReplayResult:
    """Measurements of one session replayed through one engine."""

    session_id: str
    engine: str
    context_length: int
    calls: int = 0
    compactions: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    reductions: list[float] = field(default_factory=list)
    request_tokens: list[int] = field(default_factory=list)
    compaction_calls: list[int] = field(default_factory=list)
    invalid_requests: int = 0
    over_window: int = 0
    invalid_details: list[str] = field(default_factory=list)
    facts_total: dict[str, int] = field(default_factory=dict)
    facts_kept: dict[str, int] = field(default_factory=dict)
    facts_missing: dict[str, list[str]] = field(default_factory=dict)

    @property
    def peak_tokens(self) -> int:
        return max(self.request_tokens, default=0)

    @property
    def retention(self) -> float:
        total = sum(self.facts_total.values())
        return 1.0 if total == 0 else sum(self.facts_kept.values()) / total

    def summary(self) -> dict[str, Any]:
        return {
            "session": self.session_id,
            "engine": self.engine,
            "calls": self.calls,
            "compactions": self.compactions,
            "latency_p50_ms": round(percentile(self.latencies_ms, 50), 3),
            "latency_p95_ms": round(percentile(self.latencies_ms, 95), 3),
            "reduction_median": round(statistics.median(self.reductions), 4) if self.reductions else 0.0,
            "peak_tokens": self.peak_tokens,
            "invalid_requests": self.invalid_requests,
            "over_window": self.over_window,
            "retention": round(self.retention, 4),
            "facts_total": dict(self.facts_total),
            "facts_kept": dict(self.facts_kept),
        }


def replay_session(
    messages: Sequence[Message],
    engine: ContextEngine,
    *,
    session_id: str = "session",
    counter: TokenCounter | None = None,
    on_request: RequestHook | None = None,
    retrievable: Callable[[str], bool] | None = None,
) -> ReplayResult:
    """Replay ``messages`` through ``engine`` (see the module docstring).

    ``on_request(call_index, request, tokens)`` sees every request (for cost models);
    ``retrievable(fact)`` may say a fact missing from the context can still be recovered
    verbatim (engines with a store).
    """
    counter = counter or EstimateCounter()
    result = ReplayResult(session_id, engine.name, engine.context_length)
    msgs = list(messages)
    first = next((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), len(msgs))
    working: list[Message] = list(msgs[:first])
    seen = first
    last_request: list[Message] = working
    engine.on_session_start(session_id)
    i = first
    while i < len(msgs):
        # the request before assistant message i
        tokens = counter.count_messages(working)
        if engine.should_compress(tokens):
            t0 = time.perf_counter()
            compacted = engine.compress(working, current_tokens=tokens)
            elapsed = (time.perf_counter() - t0) * 1000.0
            after = counter.count_messages(compacted)
            if compacted != working:
                result.compactions += 1
                result.latencies_ms.append(elapsed)
                result.reductions.append(1.0 - after / tokens if tokens else 0.0)
                result.compaction_calls.append(result.calls)
            working = compacted
            tokens = after
        problems = [v for v in validate(working) if v.severity == "error"]
        if problems:
            result.invalid_requests += 1
            if len(result.invalid_details) < 20:
                result.invalid_details.append(f"call {result.calls}: {problems[0]}")
        if tokens > engine.context_length:
            result.over_window += 1
        result.request_tokens.append(tokens)
        if on_request is not None:
            on_request(result.calls, working, tokens)
        last_request = working
        seen = i
        result.calls += 1
        # the assistant answers; what follows until the next assistant message is appended
        j = i + 1
        while j < len(msgs) and msgs[j].get("role") != "assistant":
            j += 1
        new = msgs[i:j]
        engine.update_from_response({"prompt_tokens": tokens, "completion_tokens": estimate_message_tokens(msgs[i]), "total_tokens": tokens + estimate_message_tokens(msgs[i])})
        working = [*working, *new]
        i = j
    engine.on_session_end(session_id, working)
    result.facts_total, result.facts_kept, missing = retention(extract_facts(msgs[:seen]), last_request, retrievable)
    for k in FACT_KINDS:
        if getattr(missing, k):
            result.facts_missing[k] = getattr(missing, k)[:20]
    return result
