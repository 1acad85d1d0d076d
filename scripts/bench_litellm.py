#!/usr/bin/env python
"""ctxengine inside LiteLLM against ``ctxengine proxy``, same run, same strict upstream.

    python scripts/litellm_env.py                   # once: the LiteLLM venv (~2 min)
    python scripts/bench_litellm.py                 # --steps 20 --window 20000 --pairs 30
    python scripts/bench_litellm.py --json out.json

Runs under a python with LiteLLM (re-executes itself under the venv's when this one has none).
Everything listens on 127.0.0.1; every loop is bounded.

**Task** — the strict upstream's tool task (``--steps`` files of ~3K tokens, read one per turn
with the client's ``read_file`` tool) at a ``--window`` window, driven by the OpenAI SDK
(1) through the LiteLLM proxy (a process, its config naming ``ctxengine_hook``, the window in
the deployment's ``model_info``) and (2) through ``ctxengine proxy`` (a process,
``--model-window '*=WINDOW'``, recall tools on as by default). Columns: ``done``, ``reqs``
(requests upstream), ``bad`` (rejected by the upstream: invalid or over the window), ``over``
(over the window), ``peak`` (largest request upstream, o200k), ``upstream`` (input tokens the
upstream received), ``sent`` (what the client sent: its whole history each turn), ``saved``
(1 - upstream / sent).

**Append-only turn** — ``--pairs`` fresh sessions, each opened with a 3-file history (one call)
and then sent one more tool turn (the timed call: nothing to compact). ``own`` is each one's
own work before the upstream call, the same field for both (the plan's ``added``: the hook's
time inside ``async_pre_call_deployment_hook``; the proxy's ``ctxengine_proxy_added_latency``,
which also counts reading and parsing the body). ``e2e`` is end to end, paired: the LiteLLM SDK
(``litellm.acompletion``, in this process) with the hook minus with a callback that does
nothing, on the same body;
the proxy minus the upstream called directly, on the same body. Medians (p90) in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ctxengine.bench.litellm_env import (  # noqa: E402
    Deployment,
    LiteLLMEnvUnavailable,
    LiteLLMProxy,
    litellm_config,
    litellm_python,
)
from ctxengine.testing.strict_upstream import StrictUpstream, Task  # noqa: E402
from ctxengine.testing.strict_upstream.drivers import READ_TOOL, openai_task  # noqa: E402

KEY = "sk-bench"
MODEL = "agent-model"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CtxProxy:
    """``python -m ctxengine proxy`` on 127.0.0.1 in front of ``upstream``."""

    def __init__(self, upstream: str, window: int, config: Path, log: Path) -> None:
        self.port = _free_port()
        self.cmd = [sys.executable, "-m", "ctxengine", "proxy", "--port", str(self.port), "--openai-base-url", upstream, "--model-window", f"*={window}", "--config", str(config)]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> CtxProxy:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.base_url + "/healthz", timeout=2):
                    return self
            except OSError:
                time.sleep(0.2)
        self.__exit__()
        raise RuntimeError("ctxengine proxy did not start: " + self.log.read_text()[-2000:])

    def added(self) -> tuple[float, float]:
        """The added-latency histogram's (sum, count) for chat completions."""
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        vals = {line.split("{")[0]: float(line.split()[-1]) for line in text.splitlines() if line.startswith("ctxengine_proxy_added_latency_seconds_") and 'api="openai"' in line and "bucket" not in line}
        return vals.get("ctxengine_proxy_added_latency_seconds_sum", 0.0), vals.get("ctxengine_proxy_added_latency_seconds_count", 0.0)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)


def _row(stats: dict[str, Any], sent: list[int]) -> dict[str, Any]:
    total = sum(sent)
    return {
        "done": bool(stats["finished"]),
        "reqs": stats["requests"],
        "bad": sum(stats["rejected"].values()),
        "over": stats["over_window"],
        "peak": stats["max_tokens_seen"],
        "upstream": stats["input_tokens"],
        "sent": total,
        "saved": round(1 - stats["input_tokens"] / total, 3) if total else 0.0,
    }


def run_task(work: Path, args: argparse.Namespace, python: Path) -> dict[str, Any]:
    task = Task(work / "ws", steps=args.steps)
    task.write()
    out: dict[str, Any] = {}
    with StrictUpstream(task, window=args.window) as up:
        (work / "hook.yaml").write_text(f"store:\n  path: {work / 'hook.db'}\n")
        config = work / "litellm.yaml"
        config.write_text(litellm_config([Deployment(MODEL, "openai/agent-model", up.openai_base_url, args.window)], master_key=KEY))
        with LiteLLMProxy(python, config, work / "litellm.log", {"CTXENGINE_CONFIG": str(work / "hook.yaml")}) as proxy:
            up.reset()
            sent = openai_task(proxy.base_url + "/v1", KEY, MODEL, task)
            out["litellm+hook"] = _row(up.stats, sent)
        (work / "proxy.yaml").write_text(f"store:\n  path: {work / 'proxy.db'}\n")
        with CtxProxy(up.openai_base_url, args.window, work / "proxy.yaml", work / "proxy.log") as cp:
            up.reset()
            sent = openai_task(cp.base_url + "/v1", KEY, MODEL, task)
            out["ctxengine proxy"] = _row(up.stats, sent)
    return out


def _history(task: Task, i: int, files: int) -> list[dict[str, Any]]:
    """A session's history after ``files`` reads (its first message made unique by ``i``)."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": f"{task.prompt} (run {i})"}]
    for n in range(1, files + 1):
        cid = f"call_{i}_{n}"
        call = {"id": cid, "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": str(task.path(n))})}}
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": cid, "content": task.path(n).read_text()}]
    return msgs


class Overhead:
    """The append-only turn's timings (see the module docstring), one fresh session per pair."""

    def __init__(self, work: Path, window: int, up: StrictUpstream, proxy: CtxProxy, client: Any) -> None:
        from litellm.integrations.custom_logger import CustomLogger

        from ctxengine.config import Config
        from ctxengine.integrations.litellm import CtxEngineHook
        from ctxengine.store.sqlite import SqliteStore

        self.up, self.proxy, self.client = up, proxy, client
        self.seen: dict[str, tuple[float, str, int]] = {}  # call id -> the plan's added, planned, compactions
        seen = self.seen

        class Timed(CtxEngineHook):
            def _hold(self, call_id: str, plan: Any) -> None:
                seen[call_id] = (plan.added or 0.0, plan.planned, plan.compactions)
                super()._hold(call_id, plan)

        self.hook = Timed(Config.from_dict({"models": {"openai/agent-model": {"context_length": window}}}), store=SqliteStore(work / "overhead.db"))
        self.plain = CustomLogger()  # the baseline: a callback that does nothing, so LiteLLM's own work is the same
        self.own_hook: list[float] = []
        self.e2e_hook: list[float] = []
        self.own_proxy: list[float] = []
        self.e2e_proxy: list[float] = []
        self.inline = 0

    async def sdk(self, messages: list[dict[str, Any]], with_hook: bool, call_id: str) -> float:
        import litellm

        litellm.callbacks = [self.hook if with_hook else self.plain]
        t = time.perf_counter()
        await litellm.acompletion(model="openai/agent-model", api_base=self.up.openai_base_url, api_key="sk-upstream", messages=messages, tools=[READ_TOOL], litellm_call_id=call_id)
        return time.perf_counter() - t

    async def post(self, base: str, messages: list[dict[str, Any]]) -> float:
        t = time.perf_counter()
        r = await self.client.post(base + "/chat/completions", json={"model": MODEL, "messages": messages, "tools": [READ_TOOL]}, headers={"authorization": "Bearer x"})
        r.raise_for_status()
        return time.perf_counter() - t

    async def pair(self, task: Task, i: int, *, keep: bool) -> None:
        """Session ``i``: opened with 3 files, then the timed turn with a 4th, four ways, each
        after a pause (the previous call's after-response work is done), in alternating order."""
        opening, turn = _history(task, i, 3), _history(task, i, 4)
        await self.sdk(opening, True, f"o{i}")
        await self.post(self.proxy.base_url + "/v1", opening)
        timed: dict[str, float] = {}
        own_proxy = None
        for name in ["hook", "plain", "proxy", "direct"] if i % 2 else ["plain", "hook", "direct", "proxy"]:
            await asyncio.sleep(0.1)
            if name == "proxy":
                before = self.proxy.added()
                timed[name] = await self.post(self.proxy.base_url + "/v1", turn)
                await asyncio.sleep(0.1)  # the proxy observes its added latency once the response is out
                after = self.proxy.added()
                own_proxy = after[0] - before[0] if after[1] - before[1] == 1 else None
            elif name == "direct":
                timed[name] = await self.post(self.up.openai_base_url, turn)
            else:
                timed[name] = await self.sdk(turn, name == "hook", f"{name}{i}")
        plan = self.seen.get(f"hook{i}")
        if not keep or plan is None:
            return
        added, planned, compactions = plan
        self.inline += planned == "inline" and compactions == 0
        self.own_hook.append(added)
        self.e2e_hook.append(timed["hook"] - timed["plain"])
        if own_proxy is not None:
            self.own_proxy.append(own_proxy)
        self.e2e_proxy.append(timed["proxy"] - timed["direct"])

    def figures(self) -> dict[str, Any]:
        def ms(xs: list[float]) -> dict[str, float]:
            xs = sorted(xs)
            return {"p50": round(1000 * statistics.median(xs), 3), "p90": round(1000 * xs[int(0.9 * (len(xs) - 1))], 3), "n": len(xs)} if xs else {}

        return {"hook_own": ms(self.own_hook), "proxy_own": ms(self.own_proxy), "hook_e2e": ms(self.e2e_hook), "proxy_e2e": ms(self.e2e_proxy), "hook_turns_inline": self.inline}


async def _overhead(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    task = Task(work / "ws2", steps=6)
    task.write()
    with StrictUpstream(task, window=args.window) as up:
        (work / "proxy2.yaml").write_text(f"store:\n  path: {work / 'proxy2.db'}\n")
        with CtxProxy(up.openai_base_url, args.window, work / "proxy2.yaml", work / "proxy2.log") as cp:
            async with httpx.AsyncClient(timeout=60) as client:
                bench = Overhead(work, args.window, up, cp, client)
                for i in range(args.pairs + 2):  # the first two warm up
                    await bench.pair(task, i, keep=i >= 2)
        bench.hook.close()
    return bench.figures()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--window", type=int, default=20_000)
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    try:
        python = litellm_python(ROOT / ".cache" / "litellm-venv", ROOT)
    except LiteLLMEnvUnavailable as exc:
        print(exc, file=sys.stderr)
        return 1
    if python != Path(sys.executable):  # LiteLLM is in its own venv: run there
        return subprocess.call([str(python), __file__, *sys.argv[1:]])
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        result = {"task": run_task(work, args, python), "append_only_turn": asyncio.run(_overhead(work, args))}
    print(f"task: {args.steps} steps at a {args.window:,}-token window (OpenAI SDK)")
    print(f"{'path':<16} {'done':>5} {'reqs':>5} {'bad':>4} {'over':>5} {'peak':>7} {'upstream':>9} {'sent':>9} {'saved':>6}")
    for name, r in result["task"].items():
        print(f"{name:<16} {r['done']!s:>5} {r['reqs']:>5} {r['bad']:>4} {r['over']:>5} {r['peak']:>7} {r['upstream']:>9} {r['sent']:>9} {r['saved']:>6.1%}")
    t = result["append_only_turn"]
    print(f"append-only turn, ms p50 (p90): own work: hook {t['hook_own'].get('p50')} ({t['hook_own'].get('p90')}), proxy {t['proxy_own'].get('p50')} ({t['proxy_own'].get('p90')}); "
          f"end to end: hook {t['hook_e2e'].get('p50')} ({t['hook_e2e'].get('p90')}), proxy {t['proxy_e2e'].get('p50')} ({t['proxy_e2e'].get('p90')}); "
          f"hook turns planned inline: {t['hook_turns_inline']}/{t['hook_own'].get('n')}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
