"""ctx_grep speed and answer size on one long session.

Chains the trajectories of JSONL files (in order) into one session of ``--messages`` messages, records it
in an SQLite store, and runs one realistic query (:func:`ctxengine.bench.probe.realistic_query`)
per fact of the session (at most ``--queries``, spread evenly); prints p50/p95 search time and
the largest answer in characters and o200k tokens.

    PYTHONPATH=src python scripts/recall_latency.py ../shared/data/swe_agent_java_multi_swe_bench.jsonl \\
        ../shared/data/tau_bench_airline_gpt4o.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ctxengine.bench.probe import realistic_query
from ctxengine.facts import call_facts, extract_facts
from ctxengine.recall import GREP_TOOL, Recall
from ctxengine.store.sqlite import SqliteStore
from ctxengine.tokens import exact


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=400)
    a = ap.parse_args()
    msgs: list[dict[str, Any]] = []
    for f in a.files:
        for line in Path(f).read_text().splitlines():
            for m in json.loads(line)["messages"]:
                if m.get("role") == "system" and msgs:
                    continue
                msgs.append(m)
            if len(msgs) >= a.messages:
                break
    msgs = msgs[: a.messages]
    facts = extract_facts(msgs).by_kind()
    facts["calls"] = call_facts(msgs)
    queries = [q for k, fs in facts.items() if k not in ("users", "tools") for f in fs if (q := realistic_query(k, f))]
    step = max(1, len(queries) // a.queries)
    queries = queries[::step][: a.queries]
    with tempfile.TemporaryDirectory() as d:
        store = SqliteStore(str(Path(d) / "s.db"))
        store.record_messages("long", msgs)
        recall = Recall(store, "long")
        times: list[float] = []
        largest = ""
        for q in queries:
            t0 = time.perf_counter()
            answer = recall.handle(GREP_TOOL, {"query": q})
            times.append((time.perf_counter() - t0) * 1000.0)
            if len(answer) > len(largest):
                largest = answer
        store.close()
    tokens = exact(largest)
    times.sort()
    print(
        f"{len(msgs)} messages, {len(queries)} queries: p50 {statistics.median(times):.1f} ms, "
        f"p95 {times[int(len(times) * 0.95) - 1]:.1f} ms; largest answer {len(largest):,} chars, {tokens:,} o200k tokens"
    )


if __name__ == "__main__":
    main()
