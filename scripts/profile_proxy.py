#!/usr/bin/env python
"""Profile the proxy's own work on one request (no sockets): a ~100K-token history resent each
turn plus one new message, parsed, planned (the manager's ``prepare``, breakpoints) and
serialised as the proxy does before its upstream call.

    python scripts/profile_proxy.py --api openai --turns 40          # mean ms per request
    python scripts/profile_proxy.py --api anthropic --profile 25     # + cProfile, top 25
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

from bench_proxy import history_of  # noqa: E402

from ctxengine.anthropic_adapter import openai_to_anthropic  # noqa: E402
from ctxengine.config import Config  # noqa: E402
from ctxengine.proxy.apis import ANTHROPIC, OPENAI  # noqa: E402
from ctxengine.proxy.app import Proxy  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--api", choices=["openai", "anthropic"], default="openai")
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--profile", type=int, default=0, help="print the top N functions by cumulative time")
    args = ap.parse_args()
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

        def one(raw: bytes) -> None:
            body = proxy._body_cache(api, "profile").parse(raw)  # as the proxy does for a named session
            assert not api.problem(body)
            plan = proxy._plan(api, "profile", body, raw)
            assert plan.content and plan.manager is not None
            # what the proxy does with the response's usage (off the response path)
            plan.manager.update_from_response({"prompt_tokens": 100_000, "completion_tokens": 5}, session_id="profile")

        for raw in bodies[:3]:
            one(raw)
        prof = cProfile.Profile() if args.profile else None
        times = []
        for raw in bodies[3:]:
            t0 = time.perf_counter()
            if prof:
                prof.enable()
            one(raw)
            if prof:
                prof.disable()
            times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        print(f"{args.api}: {len(bodies[-1])} bytes, mean {sum(times) / len(times):.2f} ms, p50 {times[len(times) // 2]:.2f} ms, min {times[0]:.2f} ms, max {times[-1]:.2f} ms")
        if prof:
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(args.profile)
            print(s.getvalue())
        print({k: v for k, v in proxy.manager(api, model).status("profile").items() if k in ("compactions", "last_compaction", "hygiene_fired", "last_tokens")})
        proxy.close()


if __name__ == "__main__":
    main()
