#!/usr/bin/env python
"""Profile the proxy's own work on one request (no sockets): a ~100K-token history resent each
turn plus one new message, parsed, planned (the manager's ``prepare``, breakpoints) and
serialised as the proxy does before its upstream call (on the event loop when the turn only
appends, else as in its worker thread). The work after the response (the usage to the manager
and the turn's store write) is timed apart.

    python scripts/profile_proxy.py --api openai --turns 40          # mean ms per request
    python scripts/profile_proxy.py --api anthropic --profile 25     # + cProfile, top 25
    python scripts/profile_proxy.py --live --turns 40                # over sockets, per stage

``--live`` runs the real thing instead: the stub upstream and ``ctxengine proxy`` as separate
processes, the same bodies sent straight to the stub and through the proxy back to back, and
the proxy's own per-stage timings read from its ``/metrics`` (``ctxengine_proxy_stage_seconds``:
body read, parse, planning on the event loop or waiting for a worker thread, planning there and
returning to the event loop, the upstream exchange, the after-response write) with the garbage collector's pauses (``ctxengine_proxy_gc_pause_seconds``).
What the stages do not cover (uvicorn and Starlette before the app sees the request, the
HTTP client preparing the upstream request, relaying the response) is the rest of the added latency.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "src"))

from bench_proxy import api_request, history_of, start_proxy, start_stub, stop  # noqa: E402

from ctxengine.anthropic_adapter import openai_to_anthropic  # noqa: E402
from ctxengine.config import Config  # noqa: E402
from ctxengine.manager import ContextManager  # noqa: E402
from ctxengine.proxy.apis import ANTHROPIC, OPENAI  # noqa: E402
from ctxengine.proxy.app import Proxy  # noqa: E402


def _histograms(text: str, name: str) -> dict[tuple[str, ...], tuple[float, float]]:
    """``{labels: (count, sum)}`` of one histogram in a Prometheus text page."""
    out: dict[tuple[str, ...], list[float]] = {}
    for line in text.splitlines():
        for suffix, slot in (("_count", 0), ("_sum", 1)):
            if line.startswith(name + suffix + "{"):
                labels = tuple(part.split("=")[1].strip('"') for part in line[line.index("{") + 1 : line.index("}")].split(","))
                out.setdefault(labels, [0.0, 0.0])[slot] = float(line.split()[-1])
    return {k: (v[0], v[1]) for k, v in out.items()}


def live(turns: int, tokens: int) -> None:
    import httpx2 as httpx

    base = history_of(tokens)
    with tempfile.TemporaryDirectory() as d:
        stub, stub_port = start_stub()
        proxy, port = start_proxy(Path(d), stub_port, "model:\n  context_length: 2000000\ncompression:\n  enabled: false\n")
        try:
            for api in ("openai", "anthropic"):
                direct, proxied = [], []
                history = list(base)
                with httpx.Client(timeout=60) as client:
                    for k in range(turns + 3):
                        history = [*history, {"role": "user", "content": f"turn {k}: next step please"}]
                        path, body = api_request(api, history)
                        content = json.dumps(body).encode()
                        headers = {"content-type": "application/json", "authorization": "Bearer sk-profile", "x-ctxengine-session": f"live-{api}"}
                        times = {}
                        for which, p in (("direct", stub_port), ("proxy", port)) if k % 2 == 0 else (("proxy", port), ("direct", stub_port)):
                            t0 = time.perf_counter()
                            client.post(f"http://127.0.0.1:{p}{path}", content=content, headers=headers).raise_for_status()
                            times[which] = (time.perf_counter() - t0) * 1000
                        history.append({"role": "assistant", "content": "ok"})
                        if k >= 3:
                            direct.append(times["direct"])
                            proxied.append(times["proxy"])
                added = sorted(p - q for p, q in zip(proxied, direct, strict=True))
                print(f"{api}: {len(content)} bytes; direct p50 {sorted(direct)[len(direct) // 2]:.2f} ms, through the proxy {sorted(proxied)[len(proxied) // 2]:.2f} ms, added p50 {added[len(added) // 2]:.2f} ms, max {added[-1]:.2f} ms")
            text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        finally:
            stop(proxy, stub)
    stages = _histograms(text, "ctxengine_proxy_stage_seconds")
    own = _histograms(text, "ctxengine_proxy_added_latency_seconds")
    for api in ("openai", "anthropic"):
        parts = [f"{stage} {1000 * total / count:.3f}" for (a, stage), (count, total) in stages.items() if a == api and count]
        count, total = own.get((api,), (0.0, 0.0))
        print(f"{api} stage means (ms, warm-up included): " + ", ".join(parts) + (f"; before the upstream call {1000 * total / count:.3f}" if count else ""))
    for (generation,), (count, total) in sorted(_histograms(text, "ctxengine_proxy_gc_pause_seconds").items()):
        print(f"gc generation {generation}: {int(count)} pauses, {1000 * total:.1f} ms in all")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--api", choices=["openai", "anthropic"], default="openai")
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--profile", type=int, default=0, help="print the top N functions by cumulative time")
    ap.add_argument("--live", action="store_true", help="over sockets, through the proxy command, per stage (see above)")
    args = ap.parse_args()
    if args.live:
        live(args.turns, args.tokens)
        return
    base = history_of(args.tokens)
    api = OPENAI if args.api == "openai" else ANTHROPIC
    model = "gpt-4o" if api is OPENAI else "claude-sonnet-4.5"
    with tempfile.TemporaryDirectory() as d:
        cfg = Config().with_overrides(store={"path": str(Path(d) / "s.db")}, model={"context_length": 2_000_000}, compression={"enabled": False})
        proxy = Proxy(cfg)
        history = list(base)
        bodies = []
        for k in range(args.turns + 3):
            history = [*history, {"role": "user", "content": f"turn {k}: next step please"}]
            if api is OPENAI:
                body = {"model": model, "messages": history}
            else:
                system, msgs = openai_to_anthropic(history)
                body = {"model": model, "max_tokens": 1024, "system": system, "messages": msgs}
            bodies.append(json.dumps(body).encode())
            history.append({"role": "assistant", "content": "ok"})

        after: list[float] = []

        def one(raw: bytes) -> ContextManager:
            body = proxy._body_cache(api, "profile").parse(raw)  # as the proxy does for a named session
            assert not api.problem(body)
            quick = proxy._plan_inline(api, "profile", body, raw)  # else why it needs a worker
            plan = quick if not isinstance(quick, str) else proxy._plan(api, "profile", body, raw)
            assert plan.content and plan.manager is not None
            return plan.manager

        def settle(mgr: ContextManager) -> None:
            """What the proxy does once the response is out (off the response path)."""
            t0 = time.perf_counter()
            mgr.update_from_response({"prompt_tokens": 100_000, "completion_tokens": 5}, session_id="profile")
            mgr.flush_records("profile")
            after.append((time.perf_counter() - t0) * 1000)

        for raw in bodies[:3]:
            settle(one(raw))
        prof = cProfile.Profile() if args.profile else None
        times = []
        for raw in bodies[3:]:
            t0 = time.perf_counter()
            if prof:
                prof.enable()
            mgr = one(raw)
            if prof:
                prof.disable()
            times.append((time.perf_counter() - t0) * 1000)
            settle(mgr)
        times.sort()
        print(f"{args.api}: {len(bodies[-1])} bytes, mean {sum(times) / len(times):.2f} ms, p50 {times[len(times) // 2]:.2f} ms, min {times[0]:.2f} ms, max {times[-1]:.2f} ms")
        after.sort()
        print(f"after the response (usage, store write): p50 {after[len(after) // 2]:.2f} ms")
        if prof:
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(args.profile)
            print(s.getvalue())
        print({k: v for k, v in proxy.manager(api, model).status("profile").items() if k in ("compactions", "last_compaction", "hygiene_fired", "last_tokens")})
        proxy.close()


if __name__ == "__main__":
    main()
