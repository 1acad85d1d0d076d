#!/usr/bin/env python
"""How the ``rules`` engine's compaction time grows with the session (issue 13.4).

Builds sessions of 5,000, 10,000 and 20,000 messages by chaining the trajectories of the
data folder (README, "Benchmark data"; one system prompt, every task after it), compacts each once at a 128K window
and prints the median time of ``--repeat`` compactions, the time per 1,000 messages, and the
ratio of each step to the previous one (about 2 for linear growth when the size doubles, about
4 for quadratic).

Usage::

    python scripts/bench_rules_scale.py [--sizes 5000,10000,20000] [--repeat 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from ctxengine.bench.data import find_data_dir, missing_data_message
from ctxengine.engines.rules import RulesEngine
from ctxengine.io import read_sessions
from ctxengine.messages import Message

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = find_data_dir(ROOT)  # $CTXENGINE_DATA, data/ (scripts/fetch_data), ../shared/data


def build(n: int, data: Path) -> list[Message]:
    """A valid session of exactly ``n`` messages (cut at a group boundary, then padded with
    user turns) chained from every trajectory in ``data``."""
    pool: list[Message] = []
    for f in sorted(data.glob("*.jsonl")):
        for s in read_sessions(f):
            pool.extend(m for m in s.messages if m.get("role") not in ("system", "developer"))
    out: list[Message] = [{"role": "system", "content": "You are a coding agent."}]
    k = 0
    while len(out) < n:
        m = pool[k % len(pool)]
        if k % len(pool) == 0 and k:
            out.append({"role": "user", "content": f"Next round {k // len(pool)}."})
        out.append(m)
        k += 1
    while (out[n - 1].get("role") == "assistant" and out[n - 1].get("tool_calls")) or out[min(n, len(out) - 1)].get("role") == "tool":
        n -= 1
    out = out[:n]
    while len(out) < n:
        out.append({"role": "user", "content": "continue"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="5000,10000,20000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--context-length", type=int, default=128_000)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.data is None:
        raise SystemExit(missing_data_message(ROOT))
    rows = []
    prev = None
    print(f"{'messages':>9} {'median s':>9} {'ms/1K msgs':>11} {'x prev':>7}")
    for n in (int(x) for x in args.sizes.split(",")):
        msgs = build(n, args.data)
        times = []
        for _ in range(args.repeat):
            eng = RulesEngine(context_length=args.context_length)
            t0 = time.perf_counter()
            eng.compress(msgs)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        ratio = med / prev if prev else None
        prev = med
        rows.append({"messages": len(msgs), "median_s": round(med, 4), "ms_per_1k": round(1000 * med / (len(msgs) / 1000), 2), "ratio_to_previous": ratio and round(ratio, 2)})
        print(f"{len(msgs):>9} {med:>9.3f} {1000 * med / (len(msgs) / 1000):>11.1f} {f'{ratio:.2f}' if ratio else '-':>7}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
