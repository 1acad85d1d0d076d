#!/usr/bin/env python
"""Benchmark the session store and the lcm engine (issue 5 figures).

    python scripts/bench_store.py                       # everything, 1,000,000-message store
    python scripts/bench_store.py --messages 200000     # a smaller store
    python scripts/bench_store.py --only retrieval      # one part: retrieval | ingest | grep | kill | concurrency

Parts:

* **retrieval** — every trajectory of the data folder (README, "Benchmark data") replayed through ``lcm`` (windows of 32K and
  16K tokens); after the last turn, each preservation fact (user messages, file paths, URLs, tool
  names, error lines) no longer in the context must come back verbatim from ``lcm_grep``.
* **ingest** — a synthetic store built from the trajectories (each message made unique with a
  run tag, text capped at ``--cap`` characters) written with ``record_many`` in batches of
  ``--batch`` messages; messages/s per batch (median) and overall.
* **grep** — ``lcm_grep`` through the engine's tool handler on that store: facts sampled from the
  trajectories, scoped to their session and to all sessions; p50/p95 in ms.
* **kill** — a child appending batches is SIGKILLed mid-write, ``--kill-rounds`` times: every
  batch it reported committed must be there, never half a batch, ``PRAGMA integrity_check`` ok.
* **concurrency** — 8 processes × 1,000 appends to one session, SQLite and PostgreSQL (a
  throwaway cluster from /usr/lib/postgresql/15/bin, as in the tests): nothing lost or doubled.

The built database stays out of the repository (default /tmp/ctxengine-bench/store.db) and is
reused by later runs with the same size (``--rebuild`` to start over).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ctxengine.bench.data import find_data_dir, missing_data_message  # noqa: E402
from ctxengine.bench.replay import percentile, replay_session  # noqa: E402
from ctxengine.engines.lcm import LcmEngine  # noqa: E402
from ctxengine.facts import FACT_KINDS, extract_facts  # noqa: E402
from ctxengine.store import SqliteStore  # noqa: E402

DATA = find_data_dir(ROOT)  # $CTXENGINE_DATA, data/ (scripts/fetch_data), ../shared/data
PG_BIN = Path(os.environ.get("CTXENGINE_PG_BIN", "/usr/lib/postgresql/15/bin"))


def trajectories() -> list[dict[str, Any]]:
    if DATA is None:
        sys.exit(missing_data_message(ROOT))
    out = []
    for f in sorted(DATA.glob("*.jsonl")):
        out += [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not out:
        sys.exit(f"no trajectories in {DATA}")
    return out


# -- retrieval ---------------------------------------------------------------------------------
def bench_retrieval(trajs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for window in (32_000, 16_000):
        kept = dict.fromkeys(FACT_KINDS, 0)
        total = dict.fromkeys(FACT_KINDS, 0)
        from_store = 0
        compactions = invalid = over = 0
        for tr in trajs:
            eng = LcmEngine(store=SqliteStore(":memory:"), context_length=window)
            hits = 0

            def retrievable(fact: str, eng: LcmEngine = eng) -> bool:
                nonlocal hits
                res = json.loads(eng.handle_tool_call("lcm_grep", {"query": fact, "limit": 5}))
                found = any(fact in r["snippet"] for r in res.get("results", []))
                hits += found
                return found

            r = replay_session(tr["messages"], eng, session_id=tr["id"], retrievable=retrievable)
            from_store += hits
            compactions += r.compactions
            invalid += r.invalid_requests
            over += r.over_window
            for k in FACT_KINDS:
                kept[k] += r.facts_kept.get(k, 0)
                total[k] += r.facts_total.get(k, 0)
        out[str(window)] = {
            "compactions": compactions,
            "invalid_requests": invalid,
            "over_window_requests": over,
            "facts_retrieved_from_store": from_store,
            "facts": {k: f"{kept[k]}/{total[k]}" for k in FACT_KINDS},
            "retention": round(sum(kept.values()) / max(1, sum(total.values())), 4),
        }
    return out


# -- synthetic store ---------------------------------------------------------------------------
def synthetic_session(trajs: list[dict[str, Any]], run: int, cap: int) -> list[dict[str, Any]]:
    """Run ``run``: a trajectory's messages with text capped at ``cap`` chars and a run tag."""
    msgs = []
    for m in trajs[run % len(trajs)]["messages"]:
        m = dict(m)
        c = m.get("content")
        if isinstance(c, str):
            m["content"] = f"{c[:cap]} [run {run}]"
        elif c is None:
            m["content"] = f"[run {run}]"
        msgs.append(m)
    return msgs


def synthetic_sessions(trajs: list[dict[str, Any]], cap: int) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Endless synthetic sessions ``syn-0000000``, ``syn-0000001``…"""
    run = 0
    while True:
        yield f"syn-{run:07d}", synthetic_session(trajs, run, cap)
        run += 1


def bench_ingest(trajs: list[dict[str, Any]], db: Path, n_messages: int, batch: int, cap: int, rebuild: bool) -> dict[str, Any]:
    marker = db.with_suffix(".json")
    if db.exists() and marker.exists() and not rebuild:
        info = json.loads(marker.read_text())
        if info.get("messages") == n_messages:
            info["reused"] = True
            return dict(info)
    for p in db.parent.glob(db.name + "*"):
        p.unlink()
    db.parent.mkdir(parents=True, exist_ok=True)
    store = SqliteStore(db)
    gen = synthetic_sessions(trajs, cap)
    rates: list[float] = []
    written = 0
    t_all = time.perf_counter()
    cpu_all = time.process_time()
    pending: list[tuple[str, list[dict[str, Any]]]] = []
    size = 0
    store_seconds = 0.0  # time inside the store (the synthetic data generation is not counted)
    bulk = store.bulk()  # full-text index built in one pass at the end (timed below)
    bulk.__enter__()
    while written < n_messages:
        sid, msgs = next(gen)
        msgs = msgs[: n_messages - written - size]
        pending.append((sid, msgs))
        size += len(msgs)
        if size >= batch or written + size >= n_messages:
            t0 = time.perf_counter()
            store.record_many(pending)
            took = time.perf_counter() - t0
            store_seconds += took
            rates.append(size / took)
            written += size
            pending, size = [], 0
            if len(rates) % 100 == 0:
                print(f"  ingest: {written:,} messages, {statistics.median(rates[-100:]):,.0f}/s", file=sys.stderr)
    t_fts = time.perf_counter()
    bulk.__exit__(None, None, None)
    fts_seconds = time.perf_counter() - t_fts
    elapsed = time.perf_counter() - t_all
    cpu = time.process_time() - cpu_all
    store.close()
    info = {
        "messages": written,
        "batch": batch,
        "text_cap_chars": cap,
        "batches": len(rates),
        "median_batch_messages_per_s_before_fts": round(statistics.median(rates)),
        "fts_pass_seconds": round(fts_seconds, 1),
        "store_messages_per_s_with_fts": round(written / (store_seconds + fts_seconds)),
        "overall_messages_per_s_wall": round(written / elapsed),
        "overall_messages_per_cpu_s": round(written / cpu),
        "seconds": round(elapsed, 1),
        "db_bytes": sum(p.stat().st_size for p in db.parent.glob(db.name + "*")),
    }
    marker.write_text(json.dumps(info))
    return info


def bench_grep(trajs: list[dict[str, Any]], db: Path, queries: int, cap: int, seed: int = 7) -> dict[str, Any]:
    """Facts of random stored sessions (as stored: capped text) looked up with lcm_grep."""
    rng = random.Random(seed)
    store = SqliteStore(db)
    total = store.list_sessions(limit=1)
    n_sessions = int(total[0].id.split("-")[1]) if total else 0  # the last one may be partial
    samples: list[tuple[str, str, str]] = []
    while len(samples) < queries:
        run = rng.randrange(n_sessions)
        facts = extract_facts(synthetic_session(trajs, run, cap))
        kinds = [k for k in ("paths", "errors", "tools", "urls", "users") if getattr(facts, k)]
        kind = rng.choice(kinds)
        fact = rng.choice(getattr(facts, kind))
        if kind in ("users", "errors"):
            fact = fact.strip().splitlines()[0][:80] if fact.strip() else fact
        if len(fact) < 4:
            continue
        samples.append((f"syn-{run:07d}", kind, fact))
    out: dict[str, Any] = {"queries": len(samples), "store_messages": None}
    for scope in ("session", "all"):
        times: list[float] = []
        found = 0
        for sid, _kind, fact in samples:
            eng = LcmEngine(store=store, context_length=128_000, session_id=sid)
            t0 = time.perf_counter()
            res = json.loads(eng.handle_tool_call("lcm_grep", {"query": fact, "scope": scope, "limit": 10}))
            times.append((time.perf_counter() - t0) * 1000.0)
            found += any(fact in r["snippet"] for r in res.get("results", []))
        out[scope] = {"p50_ms": round(percentile(times, 50), 2), "p95_ms": round(percentile(times, 95), 2), "max_ms": round(max(times), 2), "found": f"{found}/{len(samples)}"}
        slow = sorted(zip(times, samples, strict=True), reverse=True)[:3]
        out[scope]["slowest"] = [{"ms": round(t, 1), "kind": k, "query": q[:80]} for t, (_, k, q) in slow]
    with store._read() as cur:
        out["store_messages"] = int(cur.execute("SELECT COUNT(*) FROM messages").fetchone()[0])
    store.close()
    return out


# -- SIGKILL ---------------------------------------------------------------------------------------
_CHILD = """
import sys
sys.path.insert(0, sys.argv[3])
from ctxengine.store import SqliteStore
store = SqliteStore(sys.argv[1])
tag = sys.argv[2]
i = 0
while True:
    store.append_messages("s", [{"role": "user", "content": f"{tag}-m{i}-{j} " + "x" * 2000} for j in range(20)])
    print(i, flush=True)
    i += 1
"""


def bench_kill(rounds: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="ctxengine-kill-"))
    path = tmp / "kill.db"
    rng = random.Random(3)
    ok = 0
    lost = 0
    extra = 0
    expected: list[str] = []
    for r in range(rounds):
        tag = f"r{r}"
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), tag, str(ROOT / "src")], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        stop_after = rng.randrange(3, 40)
        committed = -1
        for line in proc.stdout:
            committed = int(line)
            if committed >= stop_after:
                break
        time.sleep(rng.random() * 0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        store = SqliteStore(path)
        healthy = store.integrity_check() == ["ok"]
        contents = [m["content"].split(" ")[0] for m in store.history("s")]
        reported = [f"{tag}-m{i}-{j}" for i in range(committed + 1) for j in range(20)]
        prefix_ok = contents[: len(expected) + len(reported)] == expected + reported
        rest = contents[len(expected) + len(reported) :]
        # batches committed after the last line read (still in the pipe) count too: whole ones
        more = len(rest) // 20
        whole = rest == [f"{tag}-m{i}-{j}" for i in range(committed + 1, committed + 1 + more) for j in range(20)]
        lost += 0 if prefix_ok else 1
        extra += len(rest) // 20
        ok += healthy and prefix_ok and whole
        expected = contents
        store.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return {"rounds": rounds, "rounds_ok": ok, "rounds_losing_committed": lost, "batches_committed_but_unreported": extra}


# -- concurrency -------------------------------------------------------------------------------------
def _worker(backend: str, location: str, w: int, n: int, start: Any) -> None:
    sys.path.insert(0, str(ROOT / "src"))
    if backend == "sqlite":
        store: Any = SqliteStore(location)
    else:
        from ctxengine.store.postgres import PostgresStore

        store = PostgresStore(location)
    start.wait()
    for i in range(n):
        store.append_messages("shared", [{"role": "user", "content": f"w{w} #{i}"}])
    store.close()


def _concurrent(backend: str, location: str, procs: int, appends: int) -> dict[str, Any]:
    if backend == "sqlite":
        store: Any = SqliteStore(location)
    else:
        from ctxengine.store.postgres import PostgresStore

        store = PostgresStore(location)
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    ps = [ctx.Process(target=_worker, args=(backend, location, w, appends, start)) for w in range(procs)]
    for p in ps:
        p.start()
    time.sleep(1.0)
    t0 = time.perf_counter()
    start.set()
    for p in ps:
        p.join()
    elapsed = time.perf_counter() - t0
    contents = [m["content"] for m in store.history("shared")]
    ordered = all([c for c in contents if c.startswith(f"w{w} ")] == [f"w{w} #{i}" for i in range(appends)] for w in range(procs))
    store.close()
    return {
        "processes": procs,
        "appends_each": appends,
        "stored": len(contents),
        "duplicates": len(contents) - len(set(contents)),
        "lost": procs * appends - len(set(contents)),
        "per_writer_order_kept": ordered,
        "seconds": round(elapsed, 2),
        "appends_per_s": round(procs * appends / elapsed),
    }


def _pg_cluster() -> tuple[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="ctxengine-pgbench-"))
    owner = "postgres" if os.geteuid() == 0 else None
    wrap = (lambda c: ["runuser", "-u", owner, "--", *c]) if owner else (lambda c: c)
    sock = root / "sock"
    sock.mkdir()
    if owner:
        shutil.chown(root, owner)
        shutil.chown(sock, owner)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = root / "data"
    subprocess.run(wrap([str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync"]), check=True, capture_output=True, cwd=root)
    opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c max_connections=100"
    subprocess.run(wrap([str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(root / "log"), "-w", "start"]), check=True, capture_output=True, cwd=root)

    def stop() -> None:
        subprocess.run(wrap([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]), capture_output=True, cwd=root)
        shutil.rmtree(root, ignore_errors=True)

    return f"host=127.0.0.1 port={port} user=postgres dbname=postgres", stop


def bench_concurrency(appends: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="ctxengine-conc-"))
    out = {"sqlite": _concurrent("sqlite", str(tmp / "c.db"), 8, appends)}
    shutil.rmtree(tmp, ignore_errors=True)
    if (PG_BIN / "pg_ctl").is_file():
        dsn, stop = _pg_cluster()
        try:
            out["postgres"] = _concurrent("postgres", dsn, 8, appends)
        finally:
            stop()
    else:
        out["postgres"] = {"error": f"no PostgreSQL binaries in {PG_BIN}"}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["retrieval", "ingest", "grep", "kill", "concurrency"], action="append")
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=5000, help="messages per record_many call")
    ap.add_argument("--cap", type=int, default=600, help="characters of text kept per synthetic message")
    ap.add_argument("--db", type=Path, default=Path("/tmp/ctxengine-bench/store.db"))
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--kill-rounds", type=int, default=20)
    ap.add_argument("--appends", type=int, default=1000)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    parts = args.only or ["retrieval", "ingest", "grep", "kill", "concurrency"]
    trajs = trajectories()
    results: dict[str, Any] = {"load_average": os.getloadavg(), "cpus": os.cpu_count()}
    if "retrieval" in parts:
        results["retrieval"] = bench_retrieval(trajs)
        print(json.dumps({"retrieval": results["retrieval"]}, indent=2), flush=True)
    if "ingest" in parts or "grep" in parts:
        results["ingest"] = bench_ingest(trajs, args.db, args.messages, args.batch, args.cap, args.rebuild)
        print(json.dumps({"ingest": results["ingest"]}, indent=2), flush=True)
    if "grep" in parts:
        results["grep"] = bench_grep(trajs, args.db, args.queries, args.cap)
        print(json.dumps({"grep": results["grep"]}, indent=2), flush=True)
    if "kill" in parts:
        results["kill"] = bench_kill(args.kill_rounds)
        print(json.dumps({"kill": results["kill"]}, indent=2), flush=True)
    if "concurrency" in parts:
        results["concurrency"] = bench_concurrency(args.appends)
        print(json.dumps({"concurrency": results["concurrency"]}, indent=2), flush=True)
    results["load_average_end"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
