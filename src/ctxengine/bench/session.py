"""One recorded session replayed through one engine (:func:`run_session`).

A :class:`~ctxengine.ContextManager` (its engine built fresh per session, a fresh SQLite store
in a file, as a user gets by default, recording the originals) runs the one agent loop of
:func:`ctxengine.loop.replay`: before every recorded assistant message the working context goes
through ``prepare`` (hygiene, the engine's trigger and compaction, the window cap) and the
request's cache breakpoints come from the configured placement; the request is counted with the
o200k tokenizer, checked (valid chat format, inside the window), billed by the Anthropic and
OpenAI cache models of :mod:`ctxengine.cost`, and its o200k size reported back through
``update_from_response`` as a provider would; then the recorded assistant message and what
followed it are appended to the *compacted* context, as an agent carries its history forward.
Compactions on consecutive turns are counted (``max_consecutive_compactions``).

A turn that compacts is timed whole, as the agent waits for it: ``prepare`` plus ``request``
(the messages with their cache markers). Hermes' compressor runs in a worker process of its
own; its turns are given the time of its ``compress`` call there.

At the end, the preservation-guarantee facts of everything the agent saw are looked up in the
last request; a fact missing there counts as kept when recall gives it back verbatim (the
session store's ``ctx_grep``, or the engine's own means: :meth:`ContextManager.retrievable`).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ctxengine.bench.baselines import HermesBaseline
from ctxengine.bench.probe import probe_recall
from ctxengine.bench.replay import SimClock, seen_messages
from ctxengine.bench.results import SessionRun, max_consecutive
from ctxengine.bench.uses import CallUses, session_uses
from ctxengine.caching import CachePace
from ctxengine.config import Config
from ctxengine.cost import AnthropicCache, CostReport, OpenAICache, PrefixHasher
from ctxengine.engine import ContextEngine
from ctxengine.facts import (
    CALL_KIND,
    FACT_KINDS,
    Facts,
    call_facts,
    call_retention,
    context_text,
    extract_facts,
    missing_facts,
    retention,
)
from ctxengine.io import Session
from ctxengine.loop import replay
from ctxengine.manager import ContextManager, default_store
from ctxengine.messages import Message, validate
from ctxengine.models import ModelProfile
from ctxengine.recall import GREP_TOOL
from ctxengine.registry import EngineRegistry

__all__ = ["Placement", "RegisteredEngine", "run_session", "session_facts"]

Placement = Literal["system_and_3", "planner"]


@dataclass(frozen=True)
class RegisteredEngine:
    """A registered engine as the bench runs it: :func:`run_session` has the manager build it
    per session, as a user's manager does (with the session's services: its store, the
    history's token counts, whether recall reaches the model, where its nodes wait for the
    compaction's record). Called, it builds one outside a manager with ``services`` alone."""

    name: str
    config: Config
    context_length: int
    registry: EngineRegistry
    services: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self) -> ContextEngine:
        return self.registry.create(self.name, self.config, context_length=self.context_length, **self.services)


def session_facts(session: Session) -> Facts:
    """The preservation-guarantee facts of everything the agent saw before its last turn."""
    msgs = session.messages
    last = max((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), default=len(msgs))
    return extract_facts(msgs[:last])


class _Turns:
    """The two halves of each replayed call: ``prepare`` (timed) and ``after`` (the request
    counted, checked, billed and reported back as usage)."""

    def __init__(self, mgr: ContextManager, sid: str, run: SessionRun, clock: SimClock, anthropic_model: ModelProfile, openai_model: ModelProfile, uses: list[CallUses]) -> None:
        self.mgr, self.sid, self.run, self.clock = mgr, sid, run, clock
        self.uses = uses
        self.engine = mgr.engine(sid)
        self.exact = mgr.window_counter  # o200k, memoised per text: the window check counts exactly
        self.ttl_setting = mgr.config.cache_ttl
        self.pace = CachePace()
        hasher = PrefixHasher()
        self.anth = AnthropicCache(
            input_price=anthropic_model.input,
            min_cache_tokens=anthropic_model.min_cache_tokens,
            ttl="1h" if self.ttl_setting == "1h" else "5m",
            hasher=hasher,
        )
        self.oai = OpenAICache(input_price=openai_model.input, cached_discount=openai_model.openai_cached_discount, hasher=hasher)
        run.anthropic = CostReport("anthropic", anthropic_model.name)
        run.openai = CostReport("openai", openai_model.name)
        self.hermes = isinstance(self.engine, HermesBaseline)
        self.prepare_ms: float | None = None  # set on a call that compacted, until its request is timed
        self.previous: tuple[list[Message], list[int]] | None = None  # the last request and its tokens

    def prepare(self, working: list[Message]) -> list[Message]:
        before = self.mgr.counters(self.sid)["compactions"]
        t0 = time.perf_counter()
        out = self.mgr.prepare(working, session_id=self.sid)
        elapsed = (time.perf_counter() - t0) * 1000.0
        self.prepare_ms = None
        if self.mgr.counters(self.sid)["compactions"] != before:
            self.run.compaction_calls.append(self.run.calls)
            report = self.engine.last_report
            self.run.engine_ms.append(report.elapsed_ms if report is not None else 0.0)
            if self.hermes:  # its compress call, timed in its own worker
                self.run.latencies_ms.append(report.elapsed_ms if report is not None and report.elapsed_ms > 0 else elapsed)
            else:
                self.prepare_ms = elapsed
        return out

    def _breakpoints(self, working: list[Message], toks: list[int]) -> list[int]:
        """The request's breakpoints; on a compacting call the agent's ``request`` is timed
        first, and the session's latest request put back, so what the bench plans and bills is
        what it would have been without the timing."""
        if self.prepare_ms is not None:
            t0 = time.perf_counter()
            self.mgr.request(working, session_id=self.sid)
            self.run.latencies_ms.append(self.prepare_ms + (time.perf_counter() - t0) * 1000.0)
            self.prepare_ms = None
            if self.previous is not None:
                self.mgr.breakpoints(self.previous[0], session_id=self.sid, tokens=self.previous[1])
        bps = self.mgr.breakpoints(working, session_id=self.sid, tokens=toks)
        self.previous = (working, toks)
        return bps

    def after(self, call: int, working: list[Message], appended: list[Message]) -> None:
        run = self.run
        toks = self.exact.exact_messages(working)
        tokens = sum(toks)
        errors = [v for v in validate(working) if v.severity == "error"]
        if errors:
            run.invalid_requests += 1
            if len(run.invalid_details) < 20:
                run.invalid_details.append(f"call {run.calls}: {errors[0]}")
        if tokens > run.context_length:
            run.over_window += 1
        if call < len(self.uses):
            run.in_view.check(call, self.uses[call], working)
        bps = self._breakpoints(working, toks)
        ttl: Literal["5m", "1h"] = "1h" if self.pace.ttl(self.ttl_setting) == "1h" else "5m"
        billed = self.anth.call(working, bps, tokens=toks, now=self.clock.t, ttl=ttl)
        self.pace.observe(self.clock.t, ttl)
        self.pace.wrote(billed.write_tokens, tokens)
        assert run.anthropic is not None and run.openai is not None
        run.anthropic.calls.append(billed)
        run.openai.calls.append(self.oai.call(working, tokens=toks, now=self.clock.t))
        run.request_tokens.append(tokens)
        run.calls += 1
        completion = self.exact.exact_message(appended[0]) if appended else 0
        # the usage a provider would report (o200k), cache fields included (engines may learn from them)
        usage = {
            "prompt_tokens": tokens,
            "completion_tokens": completion,
            "total_tokens": tokens + completion,
            "cache_read_input_tokens": billed.read_tokens,
            "cache_creation_input_tokens": billed.write_tokens,
        }
        self.mgr.update_from_response(usage, session_id=self.sid)
        self.clock.advance(appended)


def _measure_facts(mgr: ContextManager, sid: str, run: SessionRun, session: Session, facts: Facts, last_request: list[Message]) -> None:
    """Facts kept in (or retrievable from) the last request, and recall as an agent uses it:
    one realistic search per removed fact."""

    def recall(text: str) -> bool:
        return mgr.retrievable(text, session_id=sid)

    run.facts_total, run.facts_kept, missing = retention(facts, last_request, recall)
    for k in FACT_KINDS:
        if getattr(missing, k):
            run.facts_missing[k] = getattr(missing, k)[:10]
    seen_calls = call_facts(seen_messages(session.messages))
    total, kept, lost = call_retention(seen_calls, last_request, recall)
    run.facts_total[CALL_KIND], run.facts_kept[CALL_KIND] = total, kept
    if lost:
        run.facts_missing[CALL_KIND] = lost[:10]
    removed = missing_facts(facts, context_text(last_request)).by_kind()
    removed[CALL_KIND] = call_retention(seen_calls, last_request)[2]
    answers: list[str] = []

    def grep_kept(query: str) -> str:
        answer = mgr.handle_tool_call(GREP_TOOL, {"query": query}, session_id=sid)
        answers.append(answer)
        return answer

    stats: dict[str, list[float]] = {}
    run.removed_total, run.search_recalled, run.search_misses = probe_recall(grep_kept, removed, stats, run.search_distinct, run.search_plain)
    run.search_ms = stats.get("ms", [])
    largest = sorted(answers, key=len, reverse=True)[:10]
    run.search_answer_tokens = [mgr.window_counter.exact_message({"role": "tool", "content": a}) for a in largest]


def run_session(
    session: Session,
    engine_name: str,
    factory: Callable[[], ContextEngine],
    *,
    config: Config,
    context_length: int,
    anthropic_model: ModelProfile,
    openai_model: ModelProfile,
    placement: Placement = "system_and_3",
    session_id: str | None = None,
    facts: Facts | None = None,
    store: Any = None,
    pause: float = 0.0,
    uses: list[CallUses] | None = None,
) -> SessionRun:
    """Replay one session through one engine (see the module docstring). ``session_id`` is the
    id the engine sees (defaults to the session's own); ``facts`` are the session's facts when
    already known (:func:`session_facts`), so several engines do not extract them again, and
    ``uses`` its calls' uses (:func:`~ctxengine.bench.uses.session_uses`) likewise;
    ``store`` is the session store the manager records originals in and recall reads (default:
    a fresh SQLite store for this session, in a temporary file). Time is simulated: a call every
    :data:`~ctxengine.cost.DEFAULT_SECONDS_PER_CALL` seconds, and ``pause`` seconds more before
    each later task of a composed session (a person paced it); caches expire by that clock and
    the engine sees it (``cache_ttl: auto`` follows it too)."""
    t_start = time.perf_counter()
    cfg = config.with_overrides(prompt_caching={"enabled": True, "strategy": placement})
    with tempfile.TemporaryDirectory(prefix="ctxengine-bench-session-") as tmp:
        own_store = store is None
        if own_store:
            store = default_store(cfg.with_overrides(store={"enabled": True, "backend": "sqlite", "path": str(Path(tmp) / "session.db")}))
        try:
            run = _replay(session, engine_name, factory, cfg, context_length, anthropic_model, openai_model, session_id, facts, store, pause, uses)
        finally:
            close = getattr(store, "close", None)
            if own_store and callable(close):
                close()
    run.elapsed_s = time.perf_counter() - t_start
    return run


def _replay(
    session: Session,
    engine_name: str,
    factory: Callable[[], ContextEngine],
    cfg: Config,
    context_length: int,
    anthropic_model: ModelProfile,
    openai_model: ModelProfile,
    session_id: str | None,
    facts: Facts | None,
    store: Any,
    pause: float,
    uses: list[CallUses] | None = None,
) -> SessionRun:
    # a registered engine is built by the manager, with the session's services (the store it
    # records in, the history's token counts), as a user gets it; a baseline by its factory
    registered = factory if isinstance(factory, RegisteredEngine) else None
    mgr = ContextManager(
        cfg.with_overrides(context={"engine": registered.name}) if registered is not None else cfg,
        model=anthropic_model.name,
        provider="anthropic",
        store=store,
        registry=registered.registry if registered is not None else None,
        context_length=context_length,
        engine_factory=None if registered is not None else factory,
        strict=False,
        cap_window=engine_name != "none",  # the baseline shows what no compaction at all would send
    )
    sid = session_id or session.id
    engine = mgr.engine(sid)
    run = SessionRun(session.id, engine_name, context_length)
    starts = {id(session.messages[i]) for i in session.meta.get("task_starts", ()) if 0 <= i < len(session.messages)}
    clock = SimClock(pause, starts)
    if hasattr(engine, "clock"):
        engine.clock = clock.now
    turns = _Turns(mgr, sid, run, clock, anthropic_model, openai_model, uses if uses is not None else session_uses(session.messages))
    last_request, working = replay(session.messages, turns.prepare, turns.after)
    status = mgr.status(sid)
    run.hygiene_fired = int(status["hygiene_fired"])
    run.window_cuts = int(status["window_cuts"])
    run.max_consecutive_compactions = max_consecutive(run.compaction_calls)
    _measure_facts(mgr, sid, run, session, facts if facts is not None else session_facts(session), last_request)
    mgr.end_session(sid, working)
    return run
