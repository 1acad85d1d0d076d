#!/usr/bin/env python
"""Benchmark the ``compressor`` engine on the published trajectories.

Two runs, each replaying every trajectory as an agent loop (``ctxengine.bench.replay``):

1. **extractive** (the no-LLM default): fact retention (in context or summary), invalid
   requests, requests over the window, compaction latency p50/p95 (wall clock as the replay
   measures it, and the CPU time of the compacting thread, which a loaded machine does not
   inflate; the 1-minute load average is printed next to them).
2. **failing summarizer**: the LLM summarizer pointed at a local stub server that fails every
   call (HTTP 500). Reports messages lost (user messages missing from the last request), facts
   kept, fallbacks, and compaction loops: the engine is driven the way an agent loop would
   (``while should_compress(): compress()``), and a turn that compresses more than once counts
   as a loop.

Usage::

    python scripts/bench_compressor.py [--context-length 32000] [--data DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from ctxengine.bench.data import find_data_dir, missing_data_message
from ctxengine.bench.replay import ReplayResult, percentile, replay_session
from ctxengine.clients.openai_compat import OpenAICompatClient
from ctxengine.engines.compressor import ContextCompressor
from ctxengine.facts import FACT_KINDS
from ctxengine.io import read_sessions
from ctxengine.messages import Message
from ctxengine.summarize.llm import LlmSummarizer
from ctxengine.testing.stub_server import StubReply, StubServer

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = find_data_dir(ROOT)  # $CTXENGINE_DATA, data/ (scripts/fetch_data), ../shared/data


class LoopProbe(ContextCompressor):
    """Drives ``compress`` like ``while should_compress(): compress()`` (capped at 5) and
    records how many compressions each turn needed."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.per_turn: list[int] = []
        self.fallbacks = 0

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        out = super().compress(messages, current_tokens, focus_topic)
        n = 1
        self.fallbacks += self.last_report is not None and self.last_report.fallback is not None
        while n < 5 and self.should_compress():
            out = super().compress(out, None, focus_topic)
            self.fallbacks += self.last_report is not None and self.last_report.fallback is not None
            n += 1
        self.per_turn.append(n)
        return out


class CpuTimed(ContextCompressor):
    """Records the CPU time of each compress call that changed the list: on a shared machine
    the wall-clock latency the replay reports also measures the other processes."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.cpu_ms: list[float] = []

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        t0 = time.thread_time()
        out = super().compress(messages, current_tokens, focus_topic)
        if out != messages:
            self.cpu_ms.append((time.thread_time() - t0) * 1000.0)
        return out


def load(data: Path) -> list[tuple[str, list[Message]]]:
    out = []
    for f in sorted(data.glob("*.jsonl")):
        for s in read_sessions(f):
            out.append((s.id, s.messages))
    return out


def aggregate(results: list[ReplayResult]) -> dict[str, Any]:
    lat = [x for r in results for x in r.latencies_ms]
    total = {k: sum(r.facts_total.get(k, 0) for r in results) for k in FACT_KINDS}
    kept = {k: sum(r.facts_kept.get(k, 0) for r in results) for k in FACT_KINDS}
    return {
        "sessions": len(results),
        "calls": sum(r.calls for r in results),
        "compactions": sum(r.compactions for r in results),
        "latency_p50_ms": round(percentile(lat, 50), 2),
        "latency_p95_ms": round(percentile(lat, 95), 2),
        "latency_max_ms": round(max(lat, default=0.0), 2),
        "invalid_requests": sum(r.invalid_requests for r in results),
        "over_window": sum(r.over_window for r in results),
        "peak_tokens": max((r.peak_tokens for r in results), default=0),
        "facts_total": total,
        "facts_kept": kept,
        "retention": round(sum(kept.values()) / max(1, sum(total.values())), 4),
        "sessions_below_100pct": [
            {"session": r.session_id, "retention": round(r.retention, 4), "missing": {k: r.facts_total[k] - r.facts_kept[k] for k in FACT_KINDS if r.facts_total[k] != r.facts_kept[k]}}
            for r in results
            if r.retention < 1.0
        ],
        "reduction_median": round(statistics.median([x for r in results for x in r.reductions]), 4) if any(r.reductions for r in results) else 0.0,
    }


def run_extractive(sessions: list[tuple[str, list[Message]]], context_length: int) -> dict[str, Any]:
    results = []
    cpu: list[float] = []
    for sid, msgs in sessions:
        engine = CpuTimed(context_length=context_length)
        results.append(replay_session(msgs, engine, session_id=sid))
        cpu += engine.cpu_ms
    agg = aggregate(results)
    agg["cpu_p50_ms"] = round(percentile(cpu, 50), 2)
    agg["cpu_p95_ms"] = round(percentile(cpu, 95), 2)
    agg["load_average_1m"] = round(os.getloadavg()[0], 2)
    return agg


def run_failing(sessions: list[tuple[str, list[Message]]], context_length: int) -> dict[str, Any]:
    results = []
    per_turn: list[int] = []
    fallbacks = 0
    with StubServer(default=StubReply.fail(500, "upstream exploded")) as server:
        for sid, msgs in sessions:
            client = OpenAICompatClient(base_url=server.openai_base_url, api_key="stub", max_retries=0, timeout=5.0)
            engine = LoopProbe(context_length=context_length, summarizer=LlmSummarizer(client, "stub-model", context_length=128_000))
            results.append(replay_session(msgs, engine, session_id=sid))
            per_turn += engine.per_turn
            fallbacks += engine.fallbacks
        calls = server.calls
    agg = aggregate(results)
    agg["stub_calls"] = calls
    agg["fallbacks"] = fallbacks
    agg["turns_compressing"] = len(per_turn)
    agg["compaction_loops"] = sum(1 for n in per_turn if n > 1)
    agg["max_compressions_in_one_turn"] = max(per_turn, default=0)
    agg["user_messages_lost"] = agg["facts_total"]["users"] - agg["facts_kept"]["users"]
    return agg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--context-length", type=int, default=32_000)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    p.add_argument("--skip-failing", action="store_true", help="only the extractive run")
    args = p.parse_args(argv)
    if args.data is None:
        sys.exit(missing_data_message(ROOT))
    sessions = load(args.data)
    if not sessions:
        print(f"no trajectories in {args.data}", file=sys.stderr)
        return 1
    figures: dict[str, Any] = {"context_length": args.context_length, "extractive": run_extractive(sessions, args.context_length)}
    if not args.skip_failing:
        figures["failing_summarizer"] = run_failing(sessions, args.context_length)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
