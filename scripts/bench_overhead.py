#!/usr/bin/env python
"""Per-call overhead of the turn loop without compaction (issue 9.3), and two callers' compactions.

    python scripts/bench_overhead.py                  # overhead: p50/p95 of prepare + request
    python scripts/bench_overhead.py --runs 7 --calls 100
    python scripts/bench_overhead.py --only callers   # compactions: full-history vs prepared-list caller

**overhead** — one long session is built by chaining the recorded trajectories in
the data folder (README, "Benchmark data") (the swe-agent runs); the first ``--start`` messages (300) go through
``prepare`` once, then each timed call appends the next recorded turn (the assistant message
and what followed it) and runs ``prepare`` + ``request`` (the documented per-turn loop; the
usage of each response goes to ``update_from_response`` outside the timing). The window is
large enough that nothing compacts: what is measured is the manager's own overhead. Six
configurations: a caller keeping the prepared list (``prepared``), resending its full raw
history (``full``), or resending it decoded from JSON each turn as a proxy does (``json``; the
decoding is not timed), each with no store and with a SQLite store in a temporary directory;
and two with the store write deferred (``prepare(defer_record=True)``: the caller runs
``flush_records`` while the provider answers), whose write is timed apart
and reported beside them. A last row, ``store append``, times the store's share alone: the same
turns appended straight to a SQLite store (``append_messages(..., after=last id)``, the write
each ``+store`` call makes), without the manager. Each is run ``--runs`` times; the figures are the medians over runs
of each run's p50 and p95 (milliseconds per call). The default engine cuts a due batch of old
outputs now and then whatever the window: those calls measure a compaction and are left out.

**callers** — the same turns at a 32K window with the default engine and an LLM summarizer (a
stub server on 127.0.0.1 answering with a template summary): a caller that resends its whole
raw history every turn vs one that keeps the list ``prepare`` returned; the compactions and
summarizer calls each triggers.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ctxengine.bench.compose import compose  # noqa: E402
from ctxengine.bench.data import find_data_dir, missing_data_message  # noqa: E402
from ctxengine.bench.replay import percentile  # noqa: E402
from ctxengine.config import Config  # noqa: E402
from ctxengine.io import read_sessions  # noqa: E402
from ctxengine.manager import ContextManager  # noqa: E402
from ctxengine.messages import Message  # noqa: E402
from ctxengine.store import SqliteStore  # noqa: E402


def long_session(min_messages: int) -> list[Message]:
    """Recorded runs chained into one session of at least ``min_messages`` messages."""
    data = find_data_dir(ROOT)  # $CTXENGINE_DATA, data/ (scripts/fetch_data), ../shared/data
    if data is None:
        sys.exit(missing_data_message(ROOT))
    runs = []
    for f in sorted(data.glob("*.jsonl")):
        runs += read_sessions(f)
    runs.sort(key=lambda s: -len(s.messages))
    chosen, total = [], 0
    for s in runs * 4:
        chosen.append(s)
        total += len(s.messages)
        if total >= min_messages:
            break
    msgs = compose(chosen).messages
    if len(msgs) < min_messages:
        sys.exit(f"only {len(msgs)} messages in the trajectories")
    return msgs


def turns(msgs: list[Message], start: int) -> Iterator[int]:
    """Ends of each recorded turn after ``start``: the index after each assistant message and what followed it."""
    i = start
    while i < len(msgs):
        j = i + 1
        while j < len(msgs) and msgs[j].get("role") != "assistant":
            j += 1
        yield j
        i = j


def _manager(config: Config, *, window: int, store: Any) -> ContextManager:
    return ContextManager(config, model="claude-sonnet-4.5", provider="anthropic", store=store, context_length=window)


def _first_cut(msgs: list[Message], start: int) -> int:
    """The first index at or after ``start`` where a turn begins (an assistant message)."""
    i = start
    while i < len(msgs) and msgs[i].get("role") != "assistant":
        i += 1
    return i


def overhead_run(
    msgs: list[Message], *, start: int, calls: int, caller: str, with_store: bool, window: int, defer: bool = False, flushes: list[float] | None = None
) -> list[float]:
    """Milliseconds of prepare + request for each of ``calls`` turns after ``start`` messages.
    ``defer``: ``prepare(defer_record=True)``, and the store write (``flush_records``, what a
    caller runs while the provider answers) is timed apart into ``flushes``."""
    config = Config()
    with tempfile.TemporaryDirectory(prefix="ctxengine-overhead-") as tmp:
        store = SqliteStore(Path(tmp) / "s.db") if with_store else None
        mgr = _manager(config, window=window, store=store)
        cut = _first_cut(msgs, start)
        working = mgr.prepare(msgs[:cut], session_id="s")
        out: list[float] = []
        ends = turns(msgs, cut)
        # the default engine cuts a due batch of old outputs now and then whatever the window:
        # those calls measure a compaction, not the overhead, and are left out of the figures
        compactions = mgr.status("s")["compactions"]
        for _ in range(calls):
            end = next(ends, None)
            if end is None:
                break
            if caller == "json":  # a proxy: every dict decoded again each turn (decoding not timed)
                given = json.loads(json.dumps(msgs[:end]))
            else:
                given = msgs[:end] if caller == "full" else [*working, *msgs[cut:end]]
            t0 = time.perf_counter()
            working = mgr.prepare(given, session_id="s", defer_record=defer)
            mgr.request(working, session_id="s")
            elapsed = (time.perf_counter() - t0) * 1000.0
            t1 = time.perf_counter()
            mgr.flush_records("s")
            flushed = (time.perf_counter() - t1) * 1000.0
            now = mgr.status("s")["compactions"]
            if now == compactions:
                out.append(elapsed)
                if flushes is not None:
                    flushes.append(flushed)
            compactions = now
            mgr.update_from_response({"prompt_tokens": 1000 + 10 * end, "completion_tokens": 50}, session_id="s")
            cut = end
        if len(out) < calls // 2:
            sys.exit("most calls compacted during the overhead run: raise --window")
        mgr.close()
        if store is not None:
            store.close()
    return out


def store_run(msgs: list[Message], *, start: int, calls: int) -> list[float]:
    """Milliseconds of ``append_messages`` for each of ``calls`` turns after ``start`` messages
    recorded in a fresh SQLite store: the synchronous write of a ``+store`` call, alone."""
    with tempfile.TemporaryDirectory(prefix="ctxengine-overhead-") as tmp:
        store = SqliteStore(Path(tmp) / "s.db")
        cut = _first_cut(msgs, start)
        last = store.record_messages("s", msgs[:cut])[-1]
        out: list[float] = []
        for end in itertools.islice(turns(msgs, cut), calls):
            t0 = time.perf_counter()
            last = store.append_messages("s", msgs[cut:end], after=last)[-1]
            out.append((time.perf_counter() - t0) * 1000.0)
            cut = end
        store.close()
    return out


def bench_overhead(args: argparse.Namespace) -> dict[str, Any]:
    msgs = long_session(args.start + 4 * args.calls)
    result: dict[str, Any] = {"start_messages": args.start, "calls": args.calls, "runs": args.runs}
    configs = [(caller, store, False) for caller in ("prepared", "full", "json") for store in (False, True)]
    configs += [("prepared", True, True), ("json", True, True)]
    for caller, with_store, defer in configs:
        p50s, p95s, f50s = [], [], []
        for _ in range(args.runs):
            flushes: list[float] = []
            times = overhead_run(msgs, start=args.start, calls=args.calls, caller=caller, with_store=with_store, window=args.window, defer=defer, flushes=flushes)
            p50s.append(percentile(times, 50))
            p95s.append(percentile(times, 95))
            f50s.append(percentile(flushes, 50))
        key = f"{caller}{'+store' if with_store else ''}{' deferred' if defer else ''}"
        result[key] = {"p50_ms": round(statistics.median(p50s), 3), "p95_ms": round(statistics.median(p95s), 3)}
        line = f"{key:24s} p50 {result[key]['p50_ms']:.3f} ms  p95 {result[key]['p95_ms']:.3f} ms"
        if defer:
            result[key]["flush_p50_ms"] = round(statistics.median(f50s), 3)
            line += f"  (+ the write apart: p50 {result[key]['flush_p50_ms']:.3f} ms)"
        print(f"{line}  (medians of {args.runs} runs × {args.calls} calls)", flush=True)
    p50s, p95s = [], []
    for _ in range(args.runs):
        times = store_run(msgs, start=args.start, calls=args.calls)
        p50s.append(percentile(times, 50))
        p95s.append(percentile(times, 95))
    result["store append"] = {"p50_ms": round(statistics.median(p50s), 3), "p95_ms": round(statistics.median(p95s), 3)}
    print(f"{'store append':24s} p50 {result['store append']['p50_ms']:.3f} ms  p95 {result['store append']['p95_ms']:.3f} ms  (medians of {args.runs} runs × {args.calls} calls)", flush=True)
    return result


SUMMARY = """## Goal
Continue the task
## Constraints & Preferences
- (none)
## Progress
### Done
- earlier steps
### In Progress
- the current step
### Blocked
- (none)
## Key Decisions
- (none)
## Relevant Files
- (none)
## Next Steps
- keep going
## Critical Context
- (none)
"""


def _summarizer_config(base_url: str) -> Config:
    """The default engine with an LLM summarizer at ``base_url`` (a stub on 127.0.0.1)."""
    os.environ.setdefault("CTXENGINE_BENCH_STUB_KEY", "sk-stub")
    return Config.from_dict(
        {"auxiliary": {"compression": {"provider": "openai", "model": "stub", "base_url": base_url, "api_key_env": "CTXENGINE_BENCH_STUB_KEY", "max_retries": 0}}}
    )


def callers_run(msgs: list[Message], *, caller: str, window: int, turns_n: int, config: Config | None = None) -> dict[str, int]:
    mgr = _manager(config or Config(), window=window, store=None)
    cut = _first_cut(msgs, 1)
    working = mgr.prepare(msgs[:cut], session_id="c")
    ends = turns(msgs, cut)
    n = 0
    for end in ends:
        if n >= turns_n:
            break
        given = msgs[:end] if caller == "full" else [*working, *msgs[cut:end]]
        working = mgr.prepare(given, session_id="c")
        mgr.request(working, session_id="c")
        cut = end
        n += 1
    st = mgr.status("c")
    mgr.close()
    return {"turns": n, "compactions": int(st["compactions"]), "messages": cut}


def bench_callers(args: argparse.Namespace) -> dict[str, Any]:
    msgs = long_session(600)
    from ctxengine.testing.stub_server import StubReply, StubServer

    out: dict[str, Any] = {}
    for caller in ("prepared", "full"):
        with StubServer(default=StubReply.ok(SUMMARY)) as server:  # an LLM summarizer on 127.0.0.1
            r = callers_run(msgs, caller=caller, window=args.callers_window, turns_n=args.turns, config=_summarizer_config(server.openai_base_url))
            r["summarizer_calls"] = server.calls
        out[caller] = r
        print(
            f"{caller:9s} caller: {r['compactions']} compaction(s), {r['summarizer_calls']} summarizer call(s) in {r['turns']} turns ({args.callers_window:,}-token window)",
            flush=True,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["overhead", "callers"], default=None)
    ap.add_argument("--start", type=int, default=300, help="messages in the session before the timed calls")
    ap.add_argument("--calls", type=int, default=60, help="timed calls per run")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--window", type=int, default=10_000_000, help="window of the overhead runs (nothing compacts)")
    ap.add_argument("--callers-window", type=int, default=32_000)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    result: dict[str, Any] = {}
    if args.only in (None, "overhead"):
        result["overhead"] = bench_overhead(args)
    if args.only in (None, "callers"):
        result["callers"] = bench_callers(args)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
