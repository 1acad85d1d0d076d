"""What a bench run measured: one session through one engine (:class:`SessionRun`), an engine's
runs summed (:class:`EngineTotals`) and the whole run (:class:`BenchResult`), with the
dictionaries ``ctxengine bench --json`` writes.

``latencies_ms`` are the compacting turns: the wall time of ``prepare`` and ``request`` on the
calls that compacted, as an agent waits for them (Hermes' compressor, which runs in a worker of
its own, gives the time of its ``compress`` call); ``engine_ms`` the engine's own ``compress``
time on the same calls.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxengine.bench.probe import PROBE_KINDS, TOP
from ctxengine.bench.replay import percentile
from ctxengine.bench.uses import InView
from ctxengine.cost import CostReport
from ctxengine.facts import CALL_KIND, FACT_KINDS

__all__ = ["BenchResult", "EngineTotals", "SessionRun", "max_consecutive"]


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
    """Wall time of each compacting turn (``prepare`` + ``request``), ms."""
    engine_ms: list[float] = field(default_factory=list)
    """The engine's own ``compress`` time on the same calls, ms (0 where it gave none)."""
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
    search_plain: dict[str, list[int]] = field(default_factory=dict)
    """``[removed, recalled]`` by kind with the bare query (a file name alone; :mod:`ctxengine.bench.probe`)."""
    search_ms: list[float] = field(default_factory=list)
    """Time of each probe search (ms)."""
    search_answer_tokens: list[int] = field(default_factory=list)
    """o200k tokens of the largest probe answers (the ten largest by characters)."""
    in_view: InView = field(default_factory=InView)
    """The identifiers each call used that it learned earlier, and how many were verbatim in
    the request sent for it (:mod:`ctxengine.bench.uses`)."""
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
            "engine_p50_ms": round(percentile(self.engine_ms, 50), 3),
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
            "search_plain": self.search_plain,
            "search_p50_ms": round(percentile(self.search_ms, 50), 3),
            "search_answer_max_tokens": max(self.search_answer_tokens, default=0),
            "in_view": {**self.in_view.to_dict(), "missed": self.in_view.missed},
            "anthropic": self.anthropic.to_dict(per_call=per_call) if self.anthropic else None,
            "openai": self.openai.to_dict(per_call=per_call) if self.openai else None,
        }
        if per_call:
            d["request_tokens"] = self.request_tokens
        return d


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
    def engine_ms(self) -> list[float]:
        return [x for r in self.runs for x in r.engine_ms]

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

    def plain_recall(self) -> tuple[float, int]:
        """The same share with the bare query (a file name alone, an exception class, a user
        message's first line), and how many removed facts were asked that way."""
        n = sum(v[0] for r in self.runs for v in r.search_plain.values())
        found = sum(v[1] for r in self.runs for v in r.search_plain.values())
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

    def in_view(self) -> InView:
        """The runs' uses summed (:mod:`ctxengine.bench.uses`)."""
        total = InView()
        for r in self.runs:
            total.add(r.in_view)
        return total

    @property
    def min_session_in_view(self) -> float:
        return min((r.in_view.share() for r in self.runs), default=1.0)

    @property
    def min_session_retention(self) -> float:
        return min((r.retention for r in self.runs), default=1.0)

    def to_dict(self, baseline: EngineTotals | None = None, hermes: EngineTotals | None = None) -> dict[str, Any]:
        """``baseline`` (``none``) gives the cost ratios; ``hermes``, when it ran, the speed ratio."""
        total, kept = self.facts()
        lat = self.latencies_ms
        view = self.in_view().to_dict()
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
            "engine_p50_ms": round(percentile(self.engine_ms, 50), 3),
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
            "search_recall_distinctive": round(self.distinct_recall()[0], 4),
            "search_recall_bare": round(self.plain_recall()[0], 4),
            "removed_facts": self.search()[0],
            "search_p50_ms": round(percentile([x for r in self.runs for x in r.search_ms], 50), 3),
            "search_answer_max_tokens": max((x for r in self.runs for x in r.search_answer_tokens), default=0),
            "in_view": view["in_view"],
            "in_view_over_10_back": view["in_view_over_10_back"],
            "in_view_by_distance": view["by_distance"],
            "in_view_uses": view["uses"],
            "min_session_in_view": round(self.min_session_in_view, 4),
            "sessions_compacted": sum(1 for r in self.runs if r.compactions),
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


