#!/usr/bin/env python
"""Benchmark of the ``rules`` engine on the real trajectories (issue 2 figures).

Replays every trajectory of the data folder (``--data``, else as ``ctxengine bench`` finds it) through ``RulesEngine`` at a 32,000-token window
with :func:`ctxengine.bench.replay.replay_session` and prints, per trajectory and overall:
invalid requests, requests over the window, facts retention in the last request (by kind),
token reduction per compaction (median) and compaction latency (p50/p95).

Usage::

    python scripts/bench_rules.py [--context-length 32000] [--data DIR] [--repeat 3]
                                  [--set protect_last_n_turns=2 ...] [--json OUT]

Latency is the best of ``--repeat`` replays per compaction (the machine is shared; the best
run is the least disturbed one). Everything else is deterministic.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from ctxengine.bench.data import find_data_dir, missing_data_message
from ctxengine.bench.replay import ReplayResult, percentile, replay_session
from ctxengine.engines.rules import RulesEngine, RulesSettings
from ctxengine.facts import FACT_KINDS
from ctxengine.messages import Message
from ctxengine.tokens import estimate_messages_tokens

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = find_data_dir(ROOT)  # $CTXENGINE_DATA, data/ (scripts/fetch_data), ../shared/data


class _FloorProbe(RulesEngine):
    """The rules engine, also recording for each compaction that changed something the largest
    reduction any engine keeping the same anchors could reach: everything removed except the
    system prompt, the user messages and the protected tail."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.attainable: list[float] = []

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        out = super().compress(messages, current_tokens, focus_topic)
        if out != messages:
            tail = self.protected_tail_start(messages)
            keep = [m for m in messages[:tail] if m.get("role") in ("system", "developer", "user")] + list(messages[tail:])
            before = estimate_messages_tokens(messages)
            self.attainable.append(1.0 - estimate_messages_tokens(keep) / before if before else 0.0)
        return out


def load(data: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in sorted(data.glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append(json.loads(line))
    return out


def parse_set(items: list[str]) -> dict[str, Any]:
    fields = set(RulesSettings.model_fields)  # a pydantic model
    out: dict[str, Any] = {}
    for item in items:
        key, _, raw = item.partition("=")
        if key not in fields:
            sys.exit(f"unknown setting {key!r}; known: {', '.join(fields)}")
        out[key] = json.loads(raw) if raw not in ("true", "false") else raw == "true"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context-length", type=int, default=32_000)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--set", dest="sets", action="append", default=[], help="override a RulesSettings field")
    ap.add_argument("--json", type=Path, help="write per-trajectory results here")
    args = ap.parse_args()
    settings = RulesSettings(**parse_set(args.sets))
    if args.data is None:
        sys.exit(missing_data_message(ROOT))
    trajectories = load(args.data)
    if not trajectories:
        print(f"no trajectories in {args.data}", file=sys.stderr)
        return 2

    results: list[ReplayResult] = []
    floors: list[float] = []
    for t in trajectories:
        best: ReplayResult | None = None
        for rep in range(max(1, args.repeat)):
            engine = _FloorProbe(context_length=args.context_length, settings=settings)
            res = replay_session(t["messages"], engine, session_id=t["id"])
            if rep == 0:
                floors += engine.attainable
            if best is None:
                best = res
            else:  # same decisions every run; keep the fastest time per compaction
                best.latencies_ms = [min(a, b) for a, b in zip(best.latencies_ms, res.latencies_ms, strict=True)]
        assert best is not None
        results.append(best)

    head = f"{'trajectory':58} {'calls':>5} {'comp':>4} {'peak':>6} {'inval':>5} {'over':>4} {'red.med':>7} {'p50ms':>6} {'p95ms':>6} {'retain':>7}"
    print(head)
    print("-" * len(head))
    for r in results:
        s = r.summary()
        red = f"{s['reduction_median']:.1%}" if r.reductions else "-"
        print(
            f"{r.session_id[-58:]:58} {r.calls:5d} {r.compactions:4d} {r.peak_tokens:6d} {r.invalid_requests:5d} "
            f"{r.over_window:4d} {red:>7} {s['latency_p50_ms']:6.2f} {s['latency_p95_ms']:6.2f} {r.retention:7.2%}"
        )

    lat = [x for r in results for x in r.latencies_ms]
    reds = [x for r in results for x in r.reductions]
    total = {k: sum(r.facts_total.get(k, 0) for r in results) for k in FACT_KINDS}
    kept = {k: sum(r.facts_kept.get(k, 0) for r in results) for k in FACT_KINDS}
    print()
    print(f"engine rules, context {args.context_length:,}, settings {settings}")
    print(f"trajectories {len(results)}, requests {sum(r.calls for r in results)}, compactions {len(lat)}")
    print(f"invalid requests {sum(r.invalid_requests for r in results)}; over the window {sum(r.over_window for r in results)}")
    if reds:
        print(f"token reduction per compaction: median {statistics.median(reds):.1%} (min {min(reds):.1%}, max {max(reds):.1%})")
    if floors:
        print(
            f"  upper bound at those compactions (everything but system prompt, user messages and the protected "
            f"tail removed): median {statistics.median(floors):.1%}"
        )
    if lat:
        print(f"compaction latency: p50 {percentile(lat, 50):.2f} ms, p95 {percentile(lat, 95):.2f} ms, max {max(lat):.2f} ms")
    all_t = sum(total.values())
    all_k = sum(kept.values())
    print(f"facts retained in the last request: {all_k}/{all_t} = {all_k / all_t:.4%}" if all_t else "no facts")
    for k in FACT_KINDS:
        if total[k]:
            print(f"  {k:7} {kept[k]:6d}/{total[k]:<6d} {kept[k] / total[k]:.4%}")
    short = [r for r in results if r.retention < 1.0]
    for r in short:
        miss = {k: r.facts_total[k] - r.facts_kept[k] for k in FACT_KINDS if r.facts_total[k] != r.facts_kept[k]}
        print(f"  short: {r.session_id}: missing {miss}")
    for r in results:
        for d in r.invalid_details:
            print(f"  invalid: {r.session_id}: {d}")
    if args.json:
        args.json.write_text(json.dumps([r.summary() for r in results], indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
