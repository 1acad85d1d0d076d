"""The benchmark loop: recorded sessions through engines, with caching and cost simulated.

For each session and engine a :class:`~ctxengine.ContextManager` (its engine built fresh per
session, a fresh in-memory SQLite store recording the originals) runs the one agent loop of
:func:`ctxengine.loop.replay`: before every recorded assistant message the working context
goes through ``prepare`` (hygiene, the engine's trigger and compaction, the window cap) and
the request's cache breakpoints come from the configured placement; the request is counted
with the o200k tokenizer, checked (valid chat format, inside the window), billed by the
Anthropic and OpenAI cache models of :mod:`ctxengine.cost`, and its o200k size reported back
through ``update_from_response`` as a provider would; then the recorded assistant message and
what followed it are appended to the *compacted* context, as an agent carries its history
forward. Compactions on consecutive turns are counted (``max_consecutive_compactions``).

At the end, the preservation-guarantee facts of everything the agent saw are looked up in the
last request; a fact missing there counts as kept when recall gives it back verbatim (the
session store's ``ctx_grep``, or the engine's own means: :meth:`ContextManager.retrievable`).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ctxengine.bench.baselines import HermesBaseline, MaskingBaseline, NoCompaction
from ctxengine.bench.probe import PROBE_KINDS, TOP, probe_recall
from ctxengine.bench.replay import SimClock, percentile, seen_messages
from ctxengine.caching import CachePace, default_placement
from ctxengine.config import Config
from ctxengine.cost import AnthropicCache, CostReport, OpenAICache, PrefixHasher
from ctxengine.engine import ContextEngine
from ctxengine.errors import ConfigError
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
from ctxengine.messages import Message, tool_name, validate
from ctxengine.models import ModelProfile, UnknownModelWarning, resolve_model
from ctxengine.recall import GREP_TOOL
from ctxengine.registry import EngineRegistry

__all__ = [
    "BASELINES",
    "DEFAULT",
    "BenchResult",
    "EngineTotals",
    "SessionRun",
    "engine_retrievable",
    "make_engine_factory",
    "run_bench",
    "run_session",
    "session_facts",
]

DEFAULT = "default"
"""The pseudo engine name of what a new user gets: the configured engine (``compressor`` unless
the config says otherwise) with the manager's default cache placement, whatever ``placement``
the other engines of the run use."""

BASELINES: dict[str, Callable[[int], ContextEngine]] = {
    "none": lambda n: NoCompaction(context_length=n),
    "mask10": lambda n: MaskingBaseline(context_length=n, keep=10),
    # optional (never in the default set): Hermes Agent's own compressor, from its PyPI package
    "hermes": lambda n: HermesBaseline(context_length=n),
}

Placement = Literal["system_and_3", "planner"]


def make_engine_factory(
    name: str,
    config: Config,
    context_length: int,
    registry: EngineRegistry | None = None,
    **services: Any,
) -> Callable[[], ContextEngine]:
    """A factory building a fresh engine ``name`` (a baseline, or any registered engine);
    ``services`` (``store=``) go to engines that accept them."""
    if name in BASELINES:
        base = BASELINES[name]
        return lambda: base(context_length)
    reg = registry or EngineRegistry(plugin_dirs=config.plugins.dirs, entry_points=config.plugins.entry_points)
    reg.create(name, config, context_length=context_length, **services)  # fail early on unknown names
    return lambda: reg.create(name, config, context_length=context_length, **services)


def engine_retrievable(engine: ContextEngine) -> Callable[[str], bool] | None:
    """How to ask ``engine`` alone whether a fact is retrievable verbatim, or ``None``.

    An engine that overrides :meth:`ContextEngine.retrievable` answers itself; otherwise an
    ``lcm_grep`` or ``ctx_grep`` tool of the engine is called with the fact as query and the
    fact must appear in its answer. (The bench asks the manager, whose store-backed recall
    answers for every engine: :meth:`ctxengine.ContextManager.retrievable`.)
    """
    if type(engine).retrievable is not ContextEngine.retrievable:
        return lambda text: bool(engine.retrievable(text))
    names = {tool_name(s) for s in engine.get_tool_schemas()}
    for tool in ("lcm_grep", "ctx_grep"):
        if tool in names:

            def grep(text: str, tool: str = tool) -> bool:
                try:
                    answer = engine.handle_tool_call(tool, {"query": text})
                except Exception:
                    return False
                if text in answer:
                    return True
                try:
                    decoded = json.dumps(json.loads(answer), ensure_ascii=False)
                except ValueError:
                    return False
                return text in decoded or json.dumps(text, ensure_ascii=False)[1:-1] in decoded

            return grep
    return None


def max_consecutive(calls: Sequence[int]) -> int:
    """The longest run of consecutive call indices in ``calls`` (compactions on consecutive
    turns)."""
    best = run = 0
    prev: int | None = None
    for c in sorted(calls):
        run = run + 1 if prev is not None and c == prev + 1 else 1
        best = max(best, run)
        prev = c
    return best


@dataclass(slots=True)
class SessionRun:
    """One session replayed through one engine."""

    session_id: str
    engine: str
    context_length: int
    calls: int = 0
    request_tokens: list[int] = field(default_factory=list)
    compaction_calls: list[int] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    invalid_requests: int = 0
    invalid_details: list[str] = field(default_factory=list)
    over_window: int = 0
    hygiene_fired: int = 0
    window_cuts: int = 0
    max_consecutive_compactions: int = 0
    facts_total: dict[str, int] = field(default_factory=dict)
    facts_kept: dict[str, int] = field(default_factory=dict)
    facts_missing: dict[str, list[str]] = field(default_factory=dict)
    removed_total: dict[str, int] = field(default_factory=dict)
    """Facts not verbatim in the last request, by kind: what the search probe asks for."""
    search_recalled: dict[str, int] = field(default_factory=dict)
    """Removed facts one realistic ``ctx_grep`` returned in its first TOP results
    (:mod:`ctxengine.bench.probe`)."""
    search_misses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    search_distinct: dict[str, list[int]] = field(default_factory=dict)
    """``[removed, recalled]`` by kind over the facts whose realistic query is distinctive
    (shared by at most TOP removed facts of the kind; :mod:`ctxengine.bench.probe`)."""
    search_ms: list[float] = field(default_factory=list)
    """Time of each probe search (ms)."""
    search_answer_tokens: list[int] = field(default_factory=list)
    """o200k tokens of the largest probe answers (the ten largest by characters)."""
    anthropic: CostReport | None = None
    openai: CostReport | None = None
    elapsed_s: float = 0.0

    @property
    def peak_tokens(self) -> int:
        return max(self.request_tokens, default=0)

    @property
    def compactions(self) -> int:
        return len(self.compaction_calls)

    @property
    def retention(self) -> float:
        total = sum(self.facts_total.values())
        return 1.0 if total == 0 else sum(self.facts_kept.values()) / total

    @property
    def search_recall(self) -> float:
        total = sum(self.removed_total.values())
        return 1.0 if total == 0 else sum(self.search_recalled.values()) / total

    def to_dict(self, *, per_call: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {
            "session": self.session_id,
            "engine": self.engine,
            "calls": self.calls,
            "peak_tokens": self.peak_tokens,
            "compactions": self.compactions,
            "compaction_calls": self.compaction_calls,
            "latency_p50_ms": round(percentile(self.latencies_ms, 50), 3),
            "latency_p95_ms": round(percentile(self.latencies_ms, 95), 3),
            "invalid_requests": self.invalid_requests,
            "invalid_details": self.invalid_details,
            "over_window": self.over_window,
            "hygiene_fired": self.hygiene_fired,
            "window_cuts": self.window_cuts,
            "max_consecutive_compactions": self.max_consecutive_compactions,
            "retention": round(self.retention, 4),
            "facts_total": self.facts_total,
            "facts_kept": self.facts_kept,
            "facts_missing": self.facts_missing,
            "search_recall": round(self.search_recall, 4),
            "removed_total": self.removed_total,
            "search_recalled": self.search_recalled,
            "search_misses": self.search_misses,
            "search_distinct": self.search_distinct,
            "search_p50_ms": round(percentile(self.search_ms, 50), 3),
            "search_answer_max_tokens": max(self.search_answer_tokens, default=0),
            "anthropic": self.anthropic.to_dict(per_call=per_call) if self.anthropic else None,
            "openai": self.openai.to_dict(per_call=per_call) if self.openai else None,
        }
        if per_call:
            d["request_tokens"] = self.request_tokens
        return d


def session_facts(session: Session) -> Facts:
    """The preservation-guarantee facts of everything the agent saw before its last turn."""
    msgs = session.messages
    last = max((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), default=len(msgs))
    return extract_facts(msgs[:last])


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
) -> SessionRun:
    """Replay one session through one engine (see the module docstring). ``session_id`` is the
    id the engine sees (defaults to the session's own); ``facts`` are the session's facts when
    already known (:func:`session_facts`), so several engines do not extract them again;
    ``store`` is the session store the manager records originals in and recall reads (default:
    a fresh in-memory SQLite store for this session). Time is simulated: a call every
    :data:`~ctxengine.cost.DEFAULT_SECONDS_PER_CALL` seconds, and ``pause`` seconds more before
    each later task of a composed session (a person paced it); caches expire by that clock and
    the engine sees it (``cache_ttl: auto`` follows it too)."""
    t_start = time.perf_counter()
    cfg = config.with_overrides(prompt_caching={"enabled": True, "strategy": placement})
    own_store = store is None
    if own_store:
        store = default_store(cfg.with_overrides(store={"enabled": True, "backend": "sqlite", "path": ":memory:"}))
    mgr = ContextManager(
        cfg,
        model=anthropic_model.name,
        provider="anthropic",
        store=store,
        context_length=context_length,
        engine_factory=factory,
        strict=False,
        cap_window=engine_name != "none",  # the baseline shows what no compaction at all would send
    )
    sid = session_id or session.id
    engine = mgr.engine(sid)
    run = SessionRun(session.id, engine_name, context_length)
    hasher = PrefixHasher()
    ttl_setting = cfg.cache_ttl
    pace = CachePace()
    clock = SimClock(pause, {id(session.messages[i]) for i in session.meta.get("task_starts", ()) if 0 <= i < len(session.messages)})
    if hasattr(engine, "clock"):
        engine.clock = clock.now
    anth = AnthropicCache(
        input_price=anthropic_model.input,
        min_cache_tokens=anthropic_model.min_cache_tokens,
        ttl="1h" if ttl_setting == "1h" else "5m",
        hasher=hasher,
    )
    oai = OpenAICache(input_price=openai_model.input, cached_discount=openai_model.openai_cached_discount, hasher=hasher)
    run.anthropic = CostReport("anthropic", anthropic_model.name)
    run.openai = CostReport("openai", openai_model.name)
    exact = mgr.window_counter  # o200k, memoised per text: the window check counts exactly

    def prepare(working: list[Message]) -> list[Message]:
        before = mgr.status(sid)["compactions"]
        t0 = time.perf_counter()
        out = mgr.prepare(working, session_id=sid)
        elapsed = (time.perf_counter() - t0) * 1000.0
        if mgr.status(sid)["compactions"] != before:
            run.compaction_calls.append(run.calls)
            report = engine.last_report
            run.latencies_ms.append(report.elapsed_ms if report is not None and report.elapsed_ms > 0 else elapsed)
        return out

    def after(call: int, working: list[Message], appended: list[Message]) -> None:
        toks = exact.exact_messages(working)
        tokens = sum(toks)
        errors = [v for v in validate(working) if v.severity == "error"]
        if errors:
            run.invalid_requests += 1
            if len(run.invalid_details) < 20:
                run.invalid_details.append(f"call {run.calls}: {errors[0]}")
        if tokens > context_length:
            run.over_window += 1
        bps = mgr.breakpoints(working, session_id=sid, tokens=toks)
        ttl: Literal["5m", "1h"] = "1h" if pace.ttl(ttl_setting) == "1h" else "5m"
        billed = anth.call(working, bps, tokens=toks, now=clock.t, ttl=ttl)
        pace.observe(clock.t, ttl)
        pace.wrote(billed.write_tokens, tokens)
        assert run.anthropic is not None and run.openai is not None
        run.anthropic.calls.append(billed)
        run.openai.calls.append(oai.call(working, tokens=toks, now=clock.t))
        run.request_tokens.append(tokens)
        run.calls += 1
        completion = exact.exact_message(appended[0]) if appended else 0
        # the usage a provider would report (o200k), cache fields included (engines may learn from them)
        usage = {
            "prompt_tokens": tokens,
            "completion_tokens": completion,
            "total_tokens": tokens + completion,
            "cache_read_input_tokens": billed.read_tokens,
            "cache_creation_input_tokens": billed.write_tokens,
        }
        mgr.update_from_response(usage, session_id=sid)
        clock.advance(appended)

    try:
        last_request, working = replay(session.messages, prepare, after)
        status = mgr.status(sid)
        run.hygiene_fired = int(status["hygiene_fired"])
        run.window_cuts = int(status["window_cuts"])
        run.max_consecutive_compactions = max_consecutive(run.compaction_calls)
        if facts is None:
            facts = session_facts(session)
        def recall(text: str) -> bool:
            return mgr.retrievable(text, session_id=sid)

        run.facts_total, run.facts_kept, missing = retention(facts, last_request, recall)
        for k in FACT_KINDS:
            if getattr(missing, k):
                run.facts_missing[k] = getattr(missing, k)[:10]
        total, kept, lost = call_retention(call_facts(seen_messages(session.messages)), last_request, recall)
        run.facts_total[CALL_KIND], run.facts_kept[CALL_KIND] = total, kept
        if lost:
            run.facts_missing[CALL_KIND] = lost[:10]
        # recall as an agent uses it: one realistic search per removed fact
        removed = missing_facts(facts, context_text(last_request)).by_kind()
        removed[CALL_KIND] = call_retention(call_facts(seen_messages(session.messages)), last_request)[2]

        def grep(query: str) -> str:
            return mgr.handle_tool_call(GREP_TOOL, {"query": query}, session_id=sid)

        answers: list[str] = []

        def grep_kept(query: str) -> str:
            answer = grep(query)
            answers.append(answer)
            return answer

        stats: dict[str, list[float]] = {}
        run.removed_total, run.search_recalled, run.search_misses = probe_recall(grep_kept, removed, stats, run.search_distinct)
        run.search_ms = stats.get("ms", [])
        largest = sorted(answers, key=len, reverse=True)[:10]
        run.search_answer_tokens = [exact.exact_message({"role": "tool", "content": a}) for a in largest]
        mgr.end_session(sid, working)
    finally:
        if own_store:
            close = getattr(store, "close", None)
            if callable(close):
                close()
    run.elapsed_s = time.perf_counter() - t_start
    return run


@dataclass(slots=True)
class EngineTotals:
    """One engine's runs over every session, summed."""

    engine: str
    runs: list[SessionRun] = field(default_factory=list)

    def _sum(self, provider: str, attr: str) -> float:
        total = 0.0
        for r in self.runs:
            rep = getattr(r, provider)
            if rep is not None:
                total += getattr(rep, attr)
        return total

    @property
    def anthropic_cost(self) -> float:
        return self._sum("anthropic", "total")

    @property
    def anthropic_no_cache(self) -> float:
        return self._sum("anthropic", "total_no_cache")

    @property
    def openai_cost(self) -> float:
        return self._sum("openai", "total")

    @property
    def openai_no_cache(self) -> float:
        return self._sum("openai", "total_no_cache")

    @property
    def calls(self) -> int:
        return sum(r.calls for r in self.runs)

    @property
    def peak_tokens(self) -> int:
        return max((r.peak_tokens for r in self.runs), default=0)

    @property
    def compactions(self) -> int:
        return sum(r.compactions for r in self.runs)

    @property
    def latencies_ms(self) -> list[float]:
        return [x for r in self.runs for x in r.latencies_ms]

    @property
    def invalid_requests(self) -> int:
        return sum(r.invalid_requests for r in self.runs)

    @property
    def over_window(self) -> int:
        return sum(r.over_window for r in self.runs)

    @property
    def window_cuts(self) -> int:
        return sum(r.window_cuts for r in self.runs)

    @property
    def max_consecutive_compactions(self) -> int:
        return max((r.max_consecutive_compactions for r in self.runs), default=0)

    def facts(self) -> tuple[dict[str, int], dict[str, int]]:
        kinds = (*FACT_KINDS, CALL_KIND)
        total = {k: sum(r.facts_total.get(k, 0) for r in self.runs) for k in kinds}
        kept = {k: sum(r.facts_kept.get(k, 0) for r in self.runs) for k in kinds}
        return total, kept

    def search(self) -> tuple[dict[str, int], dict[str, int]]:
        """Removed facts and those one realistic search recalled, by kind, over every run."""
        total = {k: sum(r.removed_total.get(k, 0) for r in self.runs) for k in PROBE_KINDS}
        found = {k: sum(r.search_recalled.get(k, 0) for r in self.runs) for k in PROBE_KINDS}
        return total, found

    def distinct_recall(self) -> tuple[float, int]:
        """Share of the removed facts with a distinctive query that one search brings back, and
        how many such facts there were (see :mod:`ctxengine.bench.probe`)."""
        n = sum(v[0] for r in self.runs for v in r.search_distinct.values())
        found = sum(v[1] for r in self.runs for v in r.search_distinct.values())
        return (1.0 if n == 0 else found / n), n

    def search_recall(self, kind: str | None = None) -> float:
        """Share of removed facts one realistic ``ctx_grep`` brings back in its first TOP results."""
        total, found = self.search()
        if kind is not None:
            return 1.0 if total[kind] == 0 else found[kind] / total[kind]
        t = sum(total.values())
        return 1.0 if t == 0 else sum(found.values()) / t

    def retention(self, kind: str | None = None) -> float:
        total, kept = self.facts()
        if kind is not None:
            return 1.0 if total[kind] == 0 else kept[kind] / total[kind]
        t = sum(total.values())
        return 1.0 if t == 0 else sum(kept.values()) / t

    @property
    def min_session_retention(self) -> float:
        return min((r.retention for r in self.runs), default=1.0)

    def to_dict(self, baseline: EngineTotals | None = None, hermes: EngineTotals | None = None) -> dict[str, Any]:
        """``baseline`` (``none``) gives the cost ratios; ``hermes``, when it ran, the speed ratio."""
        total, kept = self.facts()
        lat = self.latencies_ms
        d: dict[str, Any] = {
            "engine": self.engine,
            "sessions": len(self.runs),
            "calls": self.calls,
            "anthropic_cost": round(self.anthropic_cost, 6),
            "anthropic_cost_no_cache": round(self.anthropic_no_cache, 6),
            "openai_cost": round(self.openai_cost, 6),
            "openai_cost_no_cache": round(self.openai_no_cache, 6),
            "peak_tokens": self.peak_tokens,
            "compactions": self.compactions,
            "latency_p50_ms": round(percentile(lat, 50), 3),
            "latency_p95_ms": round(percentile(lat, 95), 3),
            "latency_median_ms": round(statistics.median(lat), 3) if lat else 0.0,
            "invalid_requests": self.invalid_requests,
            "over_window": self.over_window,
            "window_cuts": self.window_cuts,
            "max_consecutive_compactions": self.max_consecutive_compactions,
            "retention": round(self.retention(), 4),
            "retention_by_kind": {k: round(self.retention(k), 4) for k in (*FACT_KINDS, CALL_KIND)},
            "min_session_retention": round(self.min_session_retention, 4),
            "facts_total": total,
            "facts_kept": kept,
            "search_recall": round(self.search_recall(), 4),
            "search_recall_by_kind": {k: round(self.search_recall(k), 4) for k in PROBE_KINDS if self.search()[0][k]},
            "search_top": TOP,
            "removed_facts": self.search()[0],
            "search_p50_ms": round(percentile([x for r in self.runs for x in r.search_ms], 50), 3),
            "search_answer_max_tokens": max((x for r in self.runs for x in r.search_answer_tokens), default=0),
        }
        if baseline is not None and baseline.anthropic_cost > 0:
            d["anthropic_vs_none"] = round(self.anthropic_cost / baseline.anthropic_cost, 4)
        if baseline is not None and baseline.openai_cost > 0:
            d["openai_vs_none"] = round(self.openai_cost / baseline.openai_cost, 4)
        if hermes is not None and hermes.latencies_ms and lat:
            d["latency_p50_vs_hermes"] = round(percentile(lat, 50) / max(percentile(hermes.latencies_ms, 50), 1e-9), 4)
        return d


@dataclass(slots=True)
class BenchResult:
    """Everything one ``ctxengine bench`` run measured."""

    context_length: int
    placement: str
    anthropic_model: str
    openai_model: str
    sessions: list[str]
    engines: dict[str, EngineTotals]
    elapsed_s: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    """Display names (``default`` → ``default (compressor, planner)``)."""
    cache_ttl: str = "5m"
    pause: float = 0.0

    def label(self, name: str) -> str:
        return self.labels.get(name, name)

    def to_dict(self, *, per_call: bool = False) -> dict[str, Any]:
        base = self.engines.get("none")
        return {
            "context_length": self.context_length,
            "placement": self.placement,
            "cache_ttl": self.cache_ttl,
            "pause_s": self.pause,
            "labels": dict(self.labels),
            "anthropic_model": self.anthropic_model,
            "openai_model": self.openai_model,
            "sessions": self.sessions,
            "elapsed_s": round(self.elapsed_s, 2),
            "engines": {name: t.to_dict(base, self.engines.get("hermes")) for name, t in self.engines.items()},
            "runs": [r.to_dict(per_call=per_call) for t in self.engines.values() for r in t.runs],
        }


def _profile(name: str, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> ModelProfile:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnknownModelWarning)
        return resolve_model(name, overrides=overrides)


def run_bench(
    sessions: Sequence[Session],
    engines: Sequence[str],
    *,
    config: Config | None = None,
    context_length: int = 128_000,
    anthropic_model: str = "claude-sonnet-4.5",
    openai_model: str = "gpt-4o",
    placement: Placement = "system_and_3",
    registry: EngineRegistry | None = None,
    progress: Callable[[str], None] | None = None,
    pause: float = 0.0,
) -> BenchResult:
    """Replay every session through every engine; the ``none`` baseline is always included so
    costs can be given relative to it. ``pause``: seconds a person pauses between the tasks of
    a composed session (:func:`run_session`)."""
    cfg = config or Config()
    names = list(dict.fromkeys(["none", *engines]))
    amodel = _profile(anthropic_model, cfg.models)
    omodel = _profile(openai_model, cfg.models)
    for given, prof in ((anthropic_model, amodel), (openai_model, omodel)):
        if prof.input <= 0:
            raise ConfigError(f"model {given!r} has no input price in the model table; choose a priced model or add models.{given}.input to the config")
    with tempfile.TemporaryDirectory(prefix="ctxengine-bench-") as tmp:
        # engines that keep originals (lcm) get a throwaway SQLite store of their own
        store = default_store(cfg.with_overrides(store={"enabled": True, "backend": "sqlite", "path": str(Path(tmp) / "bench.db")}))
        services: dict[str, Any] = {"store": store} if store is not None else {}
        try:
            return _run(sessions, names, cfg, context_length, amodel, omodel, placement, registry, services, progress, pause)
        finally:
            close = getattr(store, "close", None)
            if callable(close):
                close()


def _run(
    sessions: Sequence[Session],
    names: list[str],
    cfg: Config,
    context_length: int,
    amodel: ModelProfile,
    omodel: ModelProfile,
    placement: Placement,
    registry: EngineRegistry | None,
    services: dict[str, Any],
    progress: Callable[[str], None] | None,
    pause: float = 0.0,
) -> BenchResult:
    # each name runs as (engine, placement); ``default`` is the manager's defaults
    plan: dict[str, tuple[str, Placement]] = {}
    for n in names:
        plan[n] = (cfg.context.engine, default_placement()) if n == DEFAULT else (n, placement)
    factories = {e: make_engine_factory(e, cfg, context_length, registry, **services) for e in dict.fromkeys(e for e, _ in plan.values())}
    t0 = time.perf_counter()
    facts = [session_facts(s) for s in sessions]
    result = BenchResult(context_length, placement, amodel.name, omodel.name, [s.id for s in sessions], {}, cache_ttl=cfg.cache_ttl, pause=pause)
    result.engines = {n: EngineTotals(n) for n in names}
    # a configuration listed under two names (``default`` and its engine) runs once
    runs_as: dict[str, str] = {}
    first: dict[tuple[str, Placement], str] = {}
    for n in names:
        engine, where = plan[n]
        if n == DEFAULT:
            result.labels[n] = f"{DEFAULT} ({engine}, {where})"
        runs_as[n] = first.setdefault((engine, where), n)
    # session by session, every engine in turn: a machine that gets busier during the run slows
    # every engine alike, so latency ratios (to the hermes baseline, say) stay fair
    for s, f in zip(sessions, facts, strict=True):
        for n in names:
            if runs_as[n] != n:
                continue
            engine, where = plan[n]
            run = run_session(
                s,
                n,
                factories[engine],
                config=cfg,
                context_length=context_length,
                anthropic_model=amodel,
                openai_model=omodel,
                placement=where,
                session_id=f"bench:{n}:{s.id}",
                facts=f,
                pause=pause,
            )
            result.engines[n].runs.append(run)
    for n in names:
        if runs_as[n] != n:
            result.engines[n] = EngineTotals(n, [replace(r, engine=n) for r in result.engines[runs_as[n]].runs])
    if progress is not None:
        for n, totals in result.engines.items():
            progress(f"{n}: {len(sessions)} sessions, {totals.calls} calls")
    result.elapsed_s = time.perf_counter() - t0
    return result
