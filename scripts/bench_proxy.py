#!/usr/bin/env python
"""What ``ctxengine proxy`` costs and whether it keeps every message straight (issue 10).

    python scripts/bench_proxy.py                 # everything, default sizes
    python scripts/bench_proxy.py --only latency --runs 5 --requests 60
    python scripts/bench_proxy.py --json proxy.json

Everything runs on 127.0.0.1. The stub upstream (``ctxengine.testing.StubServer``) and the proxy
(``python -m ctxengine proxy``) are separate processes, so neither shares an interpreter lock
with the client that measures them.

**latency** — request bodies of about 100K tokens (chained real trajectories from
the data folder (README, "Benchmark data")) with a window large enough that nothing compacts (and compression off: the
default engine may cut old outputs of a 100K-token session in any window). Each timed request
resends the whole history plus one new user message (what an agent sends every turn), once
straight to the stub and once through the proxy, back to back (which goes first alternates).
The added latency of a request is its proxy time minus its direct time (same body, same stub);
per run ``added_p50``/``added_p99`` are percentiles of those differences (``pctl_diff_*``, the
p50/p99 of the proxy path minus those of the direct path, are kept for comparison). Figures
are medians over ``--runs`` runs; the load average before and after is reported with them,
since on a shared machine it moves every figure. Done for the OpenAI API (no cache markers)
and the Anthropic API with a Claude model (the proxy converts the format and places cache
breakpoints). The stub keeps only its last few requests, so its own garbage collections do
not grow through the run.

**ttfb** — time to the first streamed byte, stub direct vs through the proxy (a streamed reply
of 6 events 20 ms apart, a ~10K-token history), both APIs, paired as above: ``added_p50`` is
the figure of the issue's target, median over runs.

**sessions** — ``--sessions`` concurrent sessions × ``--turns`` turns through one proxy
process (the stub in this process, recording every upstream request): every upstream request
must be valid and hold exactly its own session's history (no message lost, duplicated or
from another session). The proxy's resident memory before and after, divided by the number of
sessions, gives the memory one idle session keeps (resident: it includes the worker threads
and their SQLite connections the concurrent requests opened); the Python heap one idle session
keeps is measured apart with tracemalloc (same sessions, planned in-process).

**replay** — a long session (5 trajectories chained) replayed turn by turn through the proxy
(Anthropic API, in-process, the stub answering with the recorded assistant turns), and the same
session through ``ctxengine bench``'s runner with the same engine and window. The cost of the
requests the stub received and the facts kept (verbatim in the last request or returned by the
session's recall, tool calls included, as the bench counts them) must match the bench's.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import httpx2 as httpx  # noqa: E402

from ctxengine.anthropic_adapter import anthropic_to_openai, openai_to_anthropic  # noqa: E402
from ctxengine.bench.compose import compose  # noqa: E402
from ctxengine.bench.data import find_data_dir, missing_data_message  # noqa: E402
from ctxengine.bench.replay import percentile  # noqa: E402
from ctxengine.config import Config  # noqa: E402
from ctxengine.io import Session, read_sessions  # noqa: E402
from ctxengine.messages import Message, validate  # noqa: E402
from ctxengine.tokens import estimate_message_tokens  # noqa: E402

SESSION = "x-ctxengine-session"


# -- helpers ---------------------------------------------------------------------------------
def sessions() -> list[Session]:
    data = find_data_dir(ROOT)  # $CTXENGINE_DATA, data/ (scripts/fetch_data), ../shared/data
    if data is None:
        sys.exit(missing_data_message(ROOT))
    out: list[Session] = []
    for f in sorted(data.glob("*.jsonl")):
        out += read_sessions(f)
    return out


def history_of(tokens: int) -> list[Message]:
    """Chained recorded trajectories cut before an assistant turn near ``tokens`` estimated tokens."""
    # runs without a giant single output, so the history reaches the size in many turns
    runs = [s for s in sorted(sessions(), key=lambda s: -len(s.messages)) if max(estimate_message_tokens(m) for m in s.messages) < 20_000]
    msgs = compose(runs * 3, "history").messages
    total = 0
    cut = 0
    for i, m in enumerate(msgs):
        if m.get("role") == "assistant":
            cut = i
        total += estimate_message_tokens(m)
        if total > tokens:
            break
    return list(msgs[:cut])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{url}: the process exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    sys.exit(f"{url} did not come up")


def start_stub(reply: str = "StubReply.ok('ok')") -> tuple[subprocess.Popen[bytes], int]:
    code = textwrap.dedent(
        f"""
        import collections, sys, time
        from ctxengine.testing.stub_server import StubServer, StubReply
        s = StubServer(default={reply})
        # only the last requests kept: a stub holding every 400 KB body it parsed would spend
        # ever longer in its own garbage collections, on whichever path met them
        s.requests = collections.deque(maxlen=4)
        s.start()
        print(s.port, flush=True)
        while True:
            time.sleep(3600)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, port


SHADOW = False  # --shadow: every proxy of the run in shadow mode (proxy.shadow)


def start_proxy(tmp: Path, stub_port: int, extra_yaml: str = "", src: Path | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """``ctxengine proxy`` in a process of its own, from ``src`` (default: this tree's ``src``)."""
    port = free_port()
    cfg = tmp / f"proxy-{port}.yaml"
    cfg.write_text(
        f"store:\n  path: {tmp / f'sessions-{port}.db'}\n"
        f"proxy:\n  openai_base_url: http://127.0.0.1:{stub_port}/v1\n  anthropic_base_url: http://127.0.0.1:{stub_port}\n"
        + ("  shadow: true\n" if SHADOW else "") + extra_yaml,
        encoding="utf-8",
    )
    env = {**os.environ, "PYTHONPATH": str(src or ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxengine", "proxy", "--config", str(cfg), "--port", str(port), "--log-format", "text"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )
    wait_up(f"http://127.0.0.1:{port}/healthz", proc)
    return proc, port


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def stop(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def med(values: list[float]) -> float:
    return round(statistics.median(values), 3) if values else 0.0


# -- latency -----------------------------------------------------------------------------------
def api_request(api: str, history: list[Message], *, stream: bool = False) -> tuple[str, dict[str, Any]]:
    """The path and body an agent sends for ``history`` on ``api`` (Anthropic: a Claude model,
    so the proxy converts the format and places cache breakpoints)."""
    if api == "openai":
        body: dict[str, Any] = {"model": "gpt-4o", "messages": history}
        path = "/v1/chat/completions"
    else:
        system, msgs = openai_to_anthropic(history)
        body = {"model": "claude-sonnet-4.5", "max_tokens": 1024, "system": system, "messages": msgs}
        path = "/v1/messages"
    if stream:
        body["stream"] = True
    return path, body


def added(direct: list[float], proxied: list[float]) -> dict[str, float]:
    """One run's figures. ``added_p50``/``added_p99`` are percentiles of the added latency of each
    request (proxy minus direct, same body, sent back to back): what the issue's targets mean.
    ``pctl_diff_*`` (p50 of the proxy path minus p50 of the direct path, same for p99) is kept
    for comparison with earlier reports; its p99 mixes two unrelated tails."""
    diffs = [p - d for d, p in zip(direct, proxied, strict=True)]
    return {
        "direct_p50": percentile(direct, 50),
        "direct_p99": percentile(direct, 99),
        "proxy_p50": percentile(proxied, 50),
        "proxy_p99": percentile(proxied, 99),
        "added_p50": percentile(diffs, 50),
        "added_p99": percentile(diffs, 99),
        "added_max": max(diffs),
        "pctl_diff_p50": percentile(proxied, 50) - percentile(direct, 50),
        "pctl_diff_p99": percentile(proxied, 99) - percentile(direct, 99),
    }


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def rotation(targets: dict[str, int], k: int) -> list[tuple[str, int]]:
    """The targets of turn ``k`` in the order they are sent: every order in turn, so each
    target goes first, last and right after each other one equally often (a fixed rotation
    of three favoured one of two identical proxies by 0.1-0.25 ms)."""
    orders = list(itertools.permutations(targets.items()))
    return list(orders[k % len(orders)])


def collect(
    per: dict[str, list[float]], base_runs: dict[str, list[float]], direct: list[float], proxied: list[float], based: list[float] | None
) -> None:
    """Add one run's added-latency figures (proxy minus direct, and the baseline proxy's when
    ``based`` is given) to the per-run lists."""
    for key, val in added(direct, proxied).items():
        per.setdefault(key, []).append(val)
    if based is not None:
        for key, val in added(direct, based).items():
            base_runs.setdefault(key, []).append(val)


def with_baseline(out: dict[str, Any], base_runs: dict[str, list[float]]) -> dict[str, Any]:
    if base_runs:
        out["baseline"] = {k: med(v) for k, v in base_runs.items()}
    return out


def bench_latency(runs: int, requests: int, tokens: int, baseline: Path | None = None, upstream_delay: float = 0.0) -> dict[str, Any]:
    base = history_of(tokens)
    size = sum(estimate_message_tokens(m) for m in base)
    out: dict[str, Any] = {"history_tokens": size, "history_messages": len(base), "load_before": load()}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        stub, stub_port = start_stub(f"StubReply.ok('ok', delay={upstream_delay / 1000.0!r})")
        out["upstream_delay_ms"] = upstream_delay
        extra = "model:\n  context_length: 2000000\ncompression:\n  enabled: false\n"
        proxy, port = start_proxy(tmp, stub_port, extra)
        procs = [proxy, stub]
        targets = {"direct": stub_port, "proxy": port}
        if baseline is not None:
            base_proc, targets["baseline"] = start_proxy(tmp, stub_port, extra, src=baseline)
            procs.append(base_proc)
        try:
            for api in ("openai", "anthropic"):
                per_run: dict[str, list[float]] = {"body_bytes": []}
                base_runs: dict[str, list[float]] = {}
                for run in range(runs):
                    direct, proxied, based = [], [], []
                    history = list(base)
                    with httpx.Client(timeout=60) as client:
                        for k in range(requests + 3):
                            history = [*history, {"role": "user", "content": f"run {run} turn {k}: next step please"}]
                            path, body = api_request(api, history)
                            content = json.dumps(body).encode()
                            headers = {"content-type": "application/json", "authorization": "Bearer sk-bench", SESSION: f"lat-{api}-{run}"}
                            times = {}
                            for which, target in rotation(targets, k):
                                url = f"http://127.0.0.1:{target}{path}"
                                t0 = time.perf_counter()
                                r = client.post(url, content=content, headers=headers)
                                times[which] = (time.perf_counter() - t0) * 1000
                                if r.status_code != 200:
                                    sys.exit(f"{url}: {r.status_code} {r.text[:300]}")
                            history.append({"role": "assistant", "content": "ok"})
                            if k >= 3:  # warm-up turns not counted
                                direct.append(times["direct"])
                                proxied.append(times["proxy"])
                                based.append(times.get("baseline", 0.0))
                    per_run["body_bytes"].append(len(content))
                    collect(per_run, base_runs, direct, proxied, based if baseline is not None else None)
                out[api] = with_baseline({k: med(v) for k, v in per_run.items()} | {"runs": runs, "requests_per_run": requests}, base_runs)
                out[api]["added_p50_per_run"] = [round(v, 2) for v in per_run["added_p50"]]
                out[api]["added_p99_per_run"] = [round(v, 2) for v in per_run["added_p99"]]
                # the proxy's own work before the upstream call (its added-latency histogram)
                metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
                vals = {line.split("{")[0]: float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("ctxengine_proxy_added_latency_seconds_") and f'api="{api}"' in line and "bucket" not in line}
                count = vals.get("ctxengine_proxy_added_latency_seconds_count", 0.0)
                out[api]["proxy_own_work_mean_ms"] = round(1000 * vals.get("ctxengine_proxy_added_latency_seconds_sum", 0.0) / count, 3) if count else 0.0
        finally:
            stop(*procs)
    out["load_after"] = load()
    return out


# -- time to first byte ------------------------------------------------------------------------------
def bench_ttfb(runs: int, requests: int, baseline: Path | None = None) -> dict[str, Any]:
    """Time to the first streamed byte, direct and through the proxy, for both APIs (the same
    back-to-back, alternating pairing as the latency figures)."""
    out: dict[str, Any] = {"load_before": load()}
    with tempfile.TemporaryDirectory() as d:
        stub, stub_port = start_stub("StubReply(text='one two three four five six', chunks=6, chunk_delay=0.02)")
        proxy, port = start_proxy(Path(d), stub_port)
        procs = [proxy, stub]
        targets = {"direct": stub_port, "proxy": port}
        if baseline is not None:
            base_proc, targets["baseline"] = start_proxy(Path(d), stub_port, src=baseline)
            procs.append(base_proc)
        try:
            history = history_of(10_000)
            out["history_tokens"] = sum(estimate_message_tokens(m) for m in history)
            for api in ("openai", "anthropic"):
                per: dict[str, list[float]] = {}
                base_runs: dict[str, list[float]] = {}
                for run in range(runs):
                    direct, proxied, based = [], [], []
                    with httpx.Client(timeout=60) as client:
                        msgs = list(history)
                        for k in range(requests + 3):
                            msgs = [*msgs, {"role": "user", "content": f"ttfb {run} {k}"}]
                            path, body = api_request(api, msgs, stream=True)
                            content = json.dumps(body).encode()
                            headers = {"content-type": "application/json", "authorization": "Bearer sk-bench", SESSION: f"ttfb-{api}-{run}"}
                            times = {}
                            for which, target in rotation(targets, k):
                                url = f"http://127.0.0.1:{target}{path}"
                                t0 = time.perf_counter()
                                with client.stream("POST", url, content=content, headers=headers) as r:
                                    first = None
                                    for _chunk in r.iter_raw():
                                        if first is None:
                                            first = (time.perf_counter() - t0) * 1000
                                times[which] = first or 0.0
                            msgs.append({"role": "assistant", "content": "one two three four five six"})
                            if k >= 3:
                                direct.append(times["direct"])
                                proxied.append(times["proxy"])
                                based.append(times.get("baseline", 0.0))
                    collect(per, base_runs, direct, proxied, based if baseline is not None else None)
                out[api] = with_baseline({k: med(v) for k, v in per.items()} | {"runs": runs, "requests_per_run": requests}, base_runs)
        finally:
            stop(*procs)
    out["load_after"] = load()
    return out


# -- concurrent sessions ------------------------------------------------------------------------------
def bench_sessions(n_sessions: int, turns: int) -> dict[str, Any]:
    from ctxengine.testing.stub_server import RecordedRequest, StubReply, StubServer

    def responder(req: RecordedRequest) -> StubReply:
        return StubReply.ok("re:" + str(req.body["messages"][-1]["content"]))

    with tempfile.TemporaryDirectory() as d, StubServer(responder=responder) as stub:
        proxy, port = start_proxy(Path(d), stub.port)
        try:
            time.sleep(0.5)
            rss_before = rss_kib(proxy.pid)
            histories: dict[str, list[Message]] = {}
            errors: list[str] = []

            def run(i: int) -> None:
                sid = f"conc-{i}"
                msgs: list[Message] = [{"role": "system", "content": f"You are agent {i}."}]
                with httpx.Client(timeout=120) as client:
                    for t in range(turns):
                        msgs.append({"role": "user", "content": f"{sid} turn {t}: " + "context " * 50})
                        r = client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "gpt-4o", "messages": msgs}, headers={SESSION: sid})
                        if r.status_code != 200:
                            errors.append(f"{sid} turn {t}: HTTP {r.status_code}")
                            return
                        reply = r.json()["choices"][0]["message"]["content"]
                        if reply != "re:" + str(msgs[-1]["content"]):
                            errors.append(f"{sid} turn {t}: crossed reply")
                        msgs.append({"role": "assistant", "content": reply})
                histories[sid] = msgs

            t0 = time.perf_counter()
            threads = [threading.Thread(target=run, args=(i,)) for i in range(n_sessions)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - t0
            time.sleep(0.5)
            rss_after = rss_kib(proxy.pid)
            invalid = lost_dup_crossed = 0
            seen: dict[str, int] = {}
            for req in stub.requests:
                msgs = req.body["messages"]
                if any(v.severity == "error" for v in validate(msgs)):
                    invalid += 1
                sid = str(msgs[0]["content"]).split()[-1].rstrip(".")
                sid = f"conc-{sid}"
                expected = histories.get(sid, [])[: len(msgs)]
                if msgs != expected:
                    lost_dup_crossed += 1
                seen[sid] = seen.get(sid, 0) + 1
            missing_turns = sum(turns - seen.get(f"conc-{i}", 0) for i in range(n_sessions))
            return {
                "sessions": n_sessions,
                "turns": turns,
                "upstream_requests": len(stub.requests),
                "client_errors": len(errors),
                "lost_duplicated_or_crossed_requests": lost_dup_crossed,
                "missing_turns": missing_turns,
                "invalid_upstream_requests": invalid,
                "elapsed_s": round(elapsed, 2),
                "rss_before_mib": round(rss_before / 1024, 1),
                "rss_after_mib": round(rss_after / 1024, 1),
                "memory_per_idle_session_kib": round((rss_after - rss_before) / n_sessions, 1),
                "python_heap_per_idle_session_kib": heap_per_session(n_sessions, turns),
            }
        finally:
            stop(proxy)


def heap_per_session(n_sessions: int, turns: int) -> float:
    """Python heap (tracemalloc) one idle session keeps in a proxy: the same sessions as
    :func:`bench_sessions`, planned in-process, without threads or connections."""
    import tracemalloc

    import orjson

    from ctxengine.proxy.apis import OPENAI
    from ctxengine.proxy.app import Proxy

    with tempfile.TemporaryDirectory() as d:
        proxy = Proxy(Config().with_overrides(store={"path": str(Path(d) / "mem.db")}))

        def run(i: int) -> None:
            msgs: list[Message] = [{"role": "system", "content": f"You are agent {i}."}]
            for t in range(turns):
                msgs.append({"role": "user", "content": f"conc-{i} turn {t}: " + "context " * 50})
                raw = orjson.dumps({"model": "gpt-4o", "messages": msgs})
                proxy._plan(OPENAI, f"mem-{i}", orjson.loads(raw), raw)
                msgs.append({"role": "assistant", "content": "re:" + str(msgs[-1]["content"])})

        run(-1)  # imports, caches and connections made once
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n_sessions):
            run(i)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        proxy.close()
    return round((after - before) / n_sessions / 1024, 1)


# -- replay equivalence --------------------------------------------------------------------------------
def bench_replay(engine: str, context_length: int, compose_n: int) -> dict[str, Any]:
    from ctxengine.bench.replay import seen_messages
    from ctxengine.bench.runner import (
        _profile,
        make_engine_factory,
        run_session,
        session_facts,
    )
    from ctxengine.cost import AnthropicCache, CostReport, PrefixHasher, marked_breakpoints
    from ctxengine.facts import call_facts, call_retention, retention
    from ctxengine.manager import default_store
    from ctxengine.proxy import ProxyServer
    from ctxengine.proxy.apis import ANTHROPIC
    from ctxengine.testing.stub_server import RecordedRequest, StubReply, StubServer
    from ctxengine.window import WindowCounter

    runs = [s for s in sessions() if "swe" in s.id or "msb" in s.id][:compose_n]
    session = compose(runs, f"composed({len(runs)})")
    msgs = session.messages
    model = "claude-sonnet-4.5"
    profile = _profile(model)
    config = Config().with_overrides(context={"engine": engine}, model={"context_length": context_length}, prompt_caching={"enabled": True})

    # 1. the bench's own replay (an engine that keeps originals, lcm, gets a throwaway store of
    # its own, as in ``ctxengine bench``)
    with tempfile.TemporaryDirectory() as d:
        store = default_store(config.with_overrides(store={"enabled": True, "backend": "sqlite", "path": str(Path(d) / "bench.db")}))
        try:
            factory = make_engine_factory(engine, config, context_length, store=store)
            placement = config.prompt_caching.strategy if config.prompt_caching.strategy != "auto" else "planner"
            bench = run_session(session, engine, factory, config=config, context_length=context_length, anthropic_model=profile, openai_model=_profile("gpt-4o"), placement=placement)
        finally:
            if store is not None:
                store.close()

    # 2. the same session through the proxy: the client resends its raw history every turn
    def strip(m: dict[str, Any]) -> dict[str, Any]:
        m = {k: v for k, v in m.items() if k != "cache_control"}
        c = m.get("content")
        if isinstance(c, list):
            parts = [{k: v for k, v in p.items() if k != "cache_control"} if isinstance(p, dict) else p for p in c]
            m["content"] = parts[0]["text"] if len(parts) == 1 and isinstance(parts[0], dict) and parts[0].get("type") == "text" and set(parts[0]) == {"type", "text"} else parts
        return m

    exact = WindowCounter()
    hasher = PrefixHasher()
    anth = AnthropicCache(input_price=profile.input, min_cache_tokens=profile.min_cache_tokens, ttl=config.cache_ttl, hasher=hasher)
    report = CostReport("anthropic", model)
    requests: list[list[Message]] = []

    def responder(req: RecordedRequest) -> StubReply:
        sent = anthropic_to_openai(req.body.get("system"), req.body["messages"])
        bps = marked_breakpoints(sent)
        plain = [strip(m) for m in sent]
        toks = exact.exact_messages(plain)  # o200k, as the bench counts its own requests
        billed = anth.call(plain, bps, tokens=toks)
        report.calls.append(billed)
        requests.append(plain)
        return StubReply(text="ok", usage={"input_tokens": sum(toks) - billed.read_tokens - billed.write_tokens, "cache_read_input_tokens": billed.read_tokens, "cache_creation_input_tokens": billed.write_tokens})

    with tempfile.TemporaryDirectory() as d, StubServer(responder=responder) as stub:
        cfg = config.with_overrides(proxy={"openai_base_url": stub.openai_base_url, "anthropic_base_url": stub.anthropic_base_url}, store={"path": str(Path(d) / "s.db")})
        with ProxyServer(cfg) as p, httpx.Client(timeout=300) as client:
            first = next(i for i, m in enumerate(msgs) if m.get("role") == "assistant")
            i = first
            while i < len(msgs):
                system, amsgs = openai_to_anthropic(msgs[:i])
                body: dict[str, Any] = {"model": model, "max_tokens": 4096, "messages": amsgs}
                if system is not None:
                    body["system"] = system
                r = client.post(p.url + "/v1/messages", json=body, headers={SESSION: "replay", "x-api-key": "sk-bench"})
                if r.status_code != 200:
                    sys.exit(f"replay turn {i}: {r.status_code} {r.text[:300]}")
                j = i + 1
                while j < len(msgs) and msgs[j].get("role") != "assistant":
                    j += 1
                i = j
            mgr = p.proxy.manager(ANTHROPIC, model)
            proxy_compactions = int(mgr.status("replay")["compactions"])
            # measured as the bench measures its own run: verbatim in the last request or
            # returned by the session's recall (the manager's, which holds the originals), and
            # the tool calls' facts counted beside the others
            def recall(text: str) -> bool:
                return mgr.retrievable(text, session_id="replay")

            _, kept, _ = retention(session_facts(session), requests[-1], recall)
            _, calls_kept, _ = call_retention(call_facts(seen_messages(msgs)), requests[-1], recall)
    proxy_cost = sum(c.cost for c in report.calls)
    bench_cost = sum(c.cost for c in bench.anthropic.calls) if bench.anthropic else 0.0
    proxy_kept = sum(kept.values()) + calls_kept
    bench_kept = sum(bench.facts_kept.values())
    invalid = sum(1 for r in requests if any(v.severity == "error" for v in validate(r)))
    return {
        "session": session.id,
        "messages": len(msgs),
        "engine": engine,
        "context_length": context_length,
        "calls": {"bench": bench.calls, "proxy": len(requests)},
        "compactions": {"bench": bench.compactions, "proxy": proxy_compactions},
        "cost_usd": {"bench": round(bench_cost, 4), "proxy": round(proxy_cost, 4), "diff_pct": round(100 * (proxy_cost - bench_cost) / bench_cost, 3) if bench_cost else 0.0},
        "facts_kept": {"bench": bench_kept, "proxy": proxy_kept, "total": sum(bench.facts_total.values()), "diff_pct": round(100 * (proxy_kept - bench_kept) / bench_kept, 3) if bench_kept else 0.0},
        "peak_tokens": {"bench": bench.peak_tokens, "proxy": max(sum(exact.exact_messages(r)) for r in requests)},
        "invalid_requests": {"bench": bench.invalid_requests, "proxy": invalid},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["latency", "ttfb", "sessions", "replay"], action="append")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--requests", type=int, default=40, help="timed requests per run (latency, ttfb)")
    ap.add_argument("--tokens", type=int, default=100_000, help="history size for the latency figures")
    ap.add_argument(
        "--upstream-delay", type=float, default=0.0, help="ms the stub waits before answering in the latency runs (a provider's own time: what the proxy can overlap)"
    )
    ap.add_argument("--sessions", type=int, default=50)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--engine", default="compressor", help="engine of the replay comparison")
    ap.add_argument("--context-length", type=int, default=128_000)
    ap.add_argument("--compose", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--baseline-src",
        type=Path,
        default=None,
        help="the src directory of another version (e.g. a checkout of main): latency and ttfb then run a second proxy from it, "
        "interleaved with this one against the same stub, and report its figures under 'baseline'",
    )
    ap.add_argument("--shadow", action="store_true", help="run the proxies in shadow mode (requests forwarded unchanged, planned after the response)")
    args = ap.parse_args()
    global SHADOW
    SHADOW = args.shadow
    parts = args.only or ["latency", "ttfb", "sessions", "replay"]
    results: dict[str, Any] = {}
    for part in parts:
        gc.collect()
        t0 = time.perf_counter()
        if part == "latency":
            results[part] = bench_latency(args.runs, args.requests, args.tokens, args.baseline_src, args.upstream_delay)
        elif part == "ttfb":
            results[part] = bench_ttfb(args.runs, args.requests, args.baseline_src)
        elif part == "sessions":
            results[part] = bench_sessions(args.sessions, args.turns)
        else:
            results[part] = bench_replay(args.engine, args.context_length, args.compose)
        print(f"== {part} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        print(json.dumps({part: results[part]}, indent=2), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
