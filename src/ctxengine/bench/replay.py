"""Replay a recorded agent session through an engine, as a live agent loop would.

Before every assistant message of the recording, the working context (everything the agent
would send) goes through a :class:`~ctxengine.ContextManager` serving this engine — the one
agent loop of :mod:`ctxengine.loop`: hygiene, the engine's trigger and ``compress`` (timed),
then the window cap. The resulting request is checked
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

from ctxengine.config import Config
from ctxengine.cost import DEFAULT_SECONDS_PER_CALL
from ctxengine.engine import ContextEngine
from ctxengine.facts import FACT_KINDS, extract_facts, retention
from ctxengine.loop import replay
from ctxengine.manager import ContextManager
from ctxengine.messages import Message, validate
from ctxengine.tokens import EstimateCounter, TokenCounter, estimate_message_tokens

__all__ = ["ReplayResult", "SimClock", "percentile", "replay_session", "seen_messages"]

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
    store: Any = None,
) -> ReplayResult:
    """Replay ``messages`` through ``engine`` (see the module docstring).

    The loop is the one every caller uses (:func:`ctxengine.loop.replay` driving a
    :class:`~ctxengine.ContextManager` with this engine): the same trigger, hygiene and window
    cap as a live agent. ``counter`` measures the requests (default: the estimate);
    ``on_request(call_index, request, tokens)`` sees every request (for cost models);
    ``retrievable(fact)`` may say a fact missing from the context can still be recovered
    verbatim; ``store`` is the session store the manager records originals in and recall reads
    (default: a fresh in-memory SQLite store), so facts cut away count when recall returns them.
    """
    counter = counter or EstimateCounter()
    result = ReplayResult(session_id, engine.name, engine.context_length)
    own_store = store is None
    if own_store:
        from ctxengine.store.sqlite import SqliteStore

        store = SqliteStore(":memory:")
    mgr = ContextManager(
        Config(),
        model="replay",
        context_length=engine.context_length,
        engine_factory=lambda: engine,
        strict=False,
        store=store,
    )

    turns = _Turns(mgr, engine, counter, result, session_id, on_request)
    try:
        last_request, working = replay(messages, turns.prepare, turns.after)
        seen = seen_messages(messages)
        check = retrievable or (lambda text: mgr_retrievable(mgr, session_id, text))
        result.facts_total, result.facts_kept, missing = retention(extract_facts(seen), last_request, check)
        mgr.end_session(session_id, working)
    finally:
        if own_store:
            store.close()
    for k in FACT_KINDS:
        if getattr(missing, k):
            result.facts_missing[k] = getattr(missing, k)[:20]
    return result


class _Turns:
    """The two hooks :func:`replay_session` gives the replay loop: ``prepare`` runs the manager
    and times what compacts, ``after`` measures and checks every request sent."""

    def __init__(self, mgr: ContextManager, engine: ContextEngine, counter: TokenCounter, result: ReplayResult, session_id: str, on_request: RequestHook | None) -> None:
        self.mgr = mgr
        self.engine = engine
        self.counter = counter
        self.result = result
        self.session_id = session_id
        self.on_request = on_request

    def prepare(self, working: list[Message]) -> list[Message]:
        mgr, result, session_id = self.mgr, self.result, self.session_id
        before = mgr.status(session_id)["compactions"]
        tokens_in = self.counter.count_messages(working)
        t0 = time.perf_counter()
        out = mgr.prepare(working, session_id=session_id)
        elapsed = (time.perf_counter() - t0) * 1000.0
        if mgr.status(session_id)["compactions"] != before:
            after = self.counter.count_messages(out)
            result.compactions += 1
            report = self.engine.last_report
            result.latencies_ms.append(report.elapsed_ms if report is not None and report.elapsed_ms > 0 else elapsed)
            result.reductions.append(1.0 - after / tokens_in if tokens_in else 0.0)
            result.compaction_calls.append(result.calls)
        return out

    def after(self, call: int, request: list[Message], appended: list[Message]) -> None:
        result = self.result
        tokens = self.counter.count_messages(request)
        problems = [v for v in validate(request) if v.severity == "error"]
        if problems:
            result.invalid_requests += 1
            if len(result.invalid_details) < 20:
                result.invalid_details.append(f"call {result.calls}: {problems[0]}")
        if tokens > self.engine.context_length:
            result.over_window += 1
        result.request_tokens.append(tokens)
        if self.on_request is not None:
            self.on_request(result.calls, request, tokens)
        result.calls += 1
        completion = estimate_message_tokens(appended[0]) if appended else 0
        self.mgr.update_from_response({"prompt_tokens": tokens, "completion_tokens": completion, "total_tokens": tokens + completion}, session_id=self.session_id)


def mgr_retrievable(mgr: Any, session_id: str, text: str) -> bool:
    """A fact is retrievable when the session's recall (or its engine) gives it back verbatim."""
    return bool(mgr.retrievable(text, session_id=session_id))


def seen_messages(messages: Sequence[Message]) -> list[Message]:
    """What the agent had seen before its last request: everything before the last assistant
    message."""
    msgs = list(messages)
    last = max((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), default=len(msgs))
    return msgs[:last]


class SimClock:
    """A replay's clock: :data:`DEFAULT_SECONDS_PER_CALL` per call, ``pause`` more once a
    message of ``starts`` (a later task's first message) has been appended."""

    def __init__(self, pause: float, starts: set[int]) -> None:
        self.t = 0.0
        self.pause = float(pause)
        self.starts = starts
        self.paused = 0

    def now(self) -> float:
        return self.t

    def advance(self, appended: Sequence[Message]) -> None:
        self.t += DEFAULT_SECONDS_PER_CALL
        if self.pause > 0 and any(id(m) in self.starts for m in appended):
            self.t += self.pause
            self.paused += 1
