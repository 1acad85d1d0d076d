#!/usr/bin/env python
"""One session growing to 2,000 messages / 1M tokens: per-call time along the way, and memory (issue 9.4).

    python scripts/bench_scale.py                    # 2,000 messages, SQLite store, both callers
    python scripts/bench_scale.py --messages 4000 --no-store
    python scripts/bench_scale.py --tracemalloc      # also Python heap (slower: a separate pass)

The recorded trajectories in the data folder (README, "Benchmark data") are chained (tool-call ids kept unique) until the
session holds ``--messages`` messages and at least ``--tokens`` tokens. The session then grows
turn by turn (each recorded assistant message and what followed it) through ``prepare`` +
``request`` with a window larger than the session, so nothing compacts and the per-turn path is
all that is measured (the default engine still cuts a due batch of old outputs now and then: those
calls are left out and counted). Three callers: one keeping the prepared list (``prepared``), one resending
its whole raw history each turn (``full``: a new list of the same dicts), and one resending it
as a proxy does (``json``: every dict decoded again each turn, so the seen part is compared by
value; the decoding itself is not timed).

Reported per caller: the median milliseconds per call in each band of ``--band`` messages (the
curve: flat means no cost grows with the history), the ratio of the last band to the first,
the process's peak RSS, and with ``--tracemalloc`` the Python heap the manager holds at the end.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_overhead import _first_cut, turns  # noqa: E402

from ctxengine.bench.compose import compose  # noqa: E402
from ctxengine.bench.data import find_data_dir, missing_data_message  # noqa: E402
from ctxengine.config import Config  # noqa: E402
from ctxengine.io import read_sessions  # noqa: E402
from ctxengine.manager import ContextManager  # noqa: E402
from ctxengine.messages import Message  # noqa: E402
from ctxengine.store import SqliteStore  # noqa: E402
from ctxengine.tokens import estimate_message_tokens  # noqa: E402


def big_session(n_messages: int, min_tokens: int) -> list[Message]:
    data = find_data_dir(ROOT)  # $CTXENGINE_DATA, data/ (scripts/fetch_data), ../shared/data
    if data is None:
        sys.exit(missing_data_message(ROOT))
    runs = []
    for f in sorted(data.glob("*.jsonl")):
        runs += [s for s in read_sessions(f) if len(s.messages) > 4]
    chosen = []
    total_msgs = total_tokens = 0
    while total_msgs < n_messages or total_tokens < min_tokens:
        for s in runs:
            chosen.append(s)
            total_msgs += len(s.messages)
            total_tokens += sum(estimate_message_tokens(m) for m in s.messages)
            if total_msgs >= n_messages and total_tokens >= min_tokens:
                break
    msgs = compose(chosen).messages
    # end on a turn boundary at or after n_messages
    end = n_messages
    while end < len(msgs) and msgs[end].get("role") != "assistant":
        end += 1
    return msgs[:end]


def run(msgs: list[Message], *, caller: str, with_store: bool, band: int, window: int, heap: bool) -> dict[str, Any]:
    gc.collect()
    with tempfile.TemporaryDirectory(prefix="ctxengine-scale-") as tmp:
        store = SqliteStore(Path(tmp) / "s.db") if with_store else None
        if heap:
            tracemalloc.start()
        mgr = ContextManager(Config(), model="claude-sonnet-4.5", provider="anthropic", store=store, context_length=window)
        cut = _first_cut(msgs, 1)
        working = mgr.prepare(msgs[:cut], session_id="big")
        points: list[tuple[int, float]] = []
        # the default engine cuts a due batch of old outputs now and then whatever the window:
        # those calls measure a compaction, not the per-turn path, and are left out (counted)
        compactions = mgr.status("big")["compactions"]
        skipped = 0
        for end in turns(msgs, cut):
            if caller == "json":  # new dicts every turn, as a proxy decodes them (decoded before the clock starts)
                given = json.loads(json.dumps(msgs[:end]))
            else:
                given = msgs[:end] if caller == "full" else [*working, *msgs[cut:end]]
            t0 = time.perf_counter()
            working = mgr.prepare(given, session_id="big")
            mgr.request(working, session_id="big")
            elapsed = (time.perf_counter() - t0) * 1000.0
            now = mgr.status("big")["compactions"]
            if now == compactions:
                points.append((end, elapsed))
            else:
                skipped += 1
            compactions = now
            mgr.update_from_response({"prompt_tokens": 1000 + end, "completion_tokens": 50}, session_id="big")
            cut = end
        heap_mb = None
        if heap:
            gc.collect()
            heap_mb = tracemalloc.get_traced_memory()[0] / 2**20
            tracemalloc.stop()
        if skipped > len(points):
            sys.exit("most calls compacted: raise --window")
        mgr.close()
        if store is not None:
            store.close()
    bands: dict[int, list[float]] = {}
    for n, ms in points:
        bands.setdefault((n - 1) // band, []).append(ms)
    curve = [{"messages": f"{k * band + 1}-{(k + 1) * band}", "calls": len(v), "p50_ms": round(statistics.median(v), 3)} for k, v in sorted(bands.items())]
    first = curve[0]["p50_ms"] if curve else 0.0
    last = curve[-1]["p50_ms"] if curve else 0.0
    return {"curve": curve, "last_vs_first": round(last / first, 2) if first else None, "heap_mb": None if heap_mb is None else round(heap_mb, 1), "compaction_calls_left_out": skipped}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--band", type=int, default=250)
    ap.add_argument("--window", type=int, default=20_000_000)
    ap.add_argument("--no-store", action="store_true")
    ap.add_argument("--tracemalloc", action="store_true", help="also measure the Python heap held at the end (a separate, slower pass)")
    ap.add_argument("--callers", nargs="+", choices=["prepared", "full", "json"], default=["prepared", "full", "json"])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    msgs = big_session(args.messages, args.tokens)
    tokens = sum(estimate_message_tokens(m) for m in msgs)
    print(f"session: {len(msgs):,} messages, {tokens:,} tokens (estimate); store: {'none' if args.no_store else 'SQLite'}", flush=True)
    out: dict[str, Any] = {"messages": len(msgs), "tokens": tokens, "store": not args.no_store}
    for caller in args.callers:
        r = run(msgs, caller=caller, with_store=not args.no_store, band=args.band, window=args.window, heap=False)
        if args.tracemalloc:
            r["heap_mb"] = run(msgs, caller=caller, with_store=not args.no_store, band=args.band, window=args.window, heap=True)["heap_mb"]
        out[caller] = r
        curve = "  ".join(f"{c['messages']}: {c['p50_ms']:.3f}" for c in r["curve"])
        heap = f", heap held {r['heap_mb']} MB" if r["heap_mb"] is not None else ""
        print(f"{caller:9s} p50 ms per call by session size: {curve}  (last/first {r['last_vs_first']}×{heap}; {r['compaction_calls_left_out']} compaction calls left out)", flush=True)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(f"peak RSS of the process: {out['peak_rss_mb']} MB (trajectories loaded included)", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
