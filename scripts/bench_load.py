#!/usr/bin/env python
"""The proxy as a team's gateway: many sessions at once, several processes, hours of traffic.

    python scripts/bench_load.py load  --c 1,8,64 [--pace 0.5] [--workers 2] [--turns 20]
    python scripts/bench_load.py two   [--c 8] [--backend sqlite|postgres|both]
    python scripts/bench_load.py soak  [--c 64] [--minutes 3] [--faults 0.05]

Not part of CI; everything on 127.0.0.1, bounded in time. C concurrent sessions each replay a
real SWE-agent trajectory (the benchmark data, ``ctxengine.bench.data``), resending the whole
history every turn as agents do: half the sessions stream, a quarter use the Anthropic API, the
proxy's window is 32K tokens so compactions happen. The upstream (``load_parts.py upstream``)
answers at once.

**load** — in one run, the same requests (same sessions, same turns) go straight to the
upstream, through the do-nothing asyncio forwarder (``load_parts.py forwarder``) and through
``ctxengine proxy``: req/s, latency added to the straight request of the same turn
(p50/p95/p99/max), time to first byte, errors, CPU per request (the process's CPU time, its
workers' included, over its requests), the queueing delay of sessions that never compact (their
requests' added latency through the proxy minus through the forwarder: what other sessions'
work costs them) and ``/healthz`` latency under load (polled every 100 ms). ``--pace S``: S
seconds between a session's turns.

**two** — two proxy processes on one store (SQLite file, PostgreSQL database from a throwaway
cluster), turns alternating between them, against one process on a store of its own: the
bodies the upstream received must be identical turn by turn; each session's stored originals
must be exactly what its client sent (no lost turn) and its stored history must never jump
back to an earlier version (checked over the session's events).

**soak** — C sessions back to back for N minutes (a new session once one ends), optional
upstream faults on a share of requests (500, 429 with ``retry-after``, a reset mid-stream, a
stall past the proxy's timeout; a client retries its turn as an agent would); the proxy's RSS
is sampled every 5 s, and afterwards every session's stored originals are checked against what
its client last sent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_proxy import free_port, rss_kib  # noqa: E402
from load_parts import read_head  # noqa: E402

from ctxengine.anthropic_adapter import openai_to_anthropic  # noqa: E402
from ctxengine.bench.data import find_data_dir, missing_data_message  # noqa: E402
from ctxengine.bench.replay import percentile  # noqa: E402
from ctxengine.io import Session, read_sessions  # noqa: E402

Msg = dict[str, Any]
WINDOW = 32_000
PARTS = str(ROOT / "scripts" / "load_parts.py")


# -- the sessions ------------------------------------------------------------------------------
def trajectories() -> list[Session]:
    data = find_data_dir(ROOT)
    if data is None:
        sys.exit(missing_data_message(ROOT))
    files = [f for f in sorted(data.glob("*.jsonl")) if "swe" in f.name] or sorted(data.glob("*.jsonl"))
    return [s for f in files for s in read_sessions(f)]


@dataclass
class Agent:
    """One client session: its trajectory's turns (each a history ending before an assistant
    message), its API and whether it streams."""

    sid: str
    msgs: list[Msg]
    cuts: list[int]
    api: str
    stream: bool

    def request(self, k: int) -> tuple[str, bytes, list[Msg]]:
        history = self.msgs[: self.cuts[k]]
        if self.api == "openai":
            body: Msg = {"model": "gpt-4o", "messages": history}
            path = "/v1/chat/completions"
        else:
            system, msgs = openai_to_anthropic(history)
            body = {"model": "claude-sonnet-4.5", "max_tokens": 1024, "system": system, "messages": msgs}
            path = "/v1/messages"
        if self.stream:
            body["stream"] = True
        return path, orjson.dumps(body), history


def agents(runs: list[Session], c: int, turns: int, tag: str, offset: int = 0) -> list[Agent]:
    out = []
    for i in range(c):
        s = runs[(i + offset) % len(runs)]
        msgs = [dict(m) for m in s.messages]
        cuts = [j for j, m in enumerate(msgs) if m.get("role") == "assistant" and j > 0][:turns]
        out.append(Agent(f"{tag}-{i + offset}", msgs, cuts, "anthropic" if i % 4 == 0 else "openai", i % 2 == 1))
    return out


# -- a raw HTTP/1.1 client ---------------------------------------------------------------------
@dataclass
class Result:
    status: int
    took: float
    ttfb: float
    saved: int
    error: str = ""


class Conn:
    def __init__(self, port: int) -> None:
        self.port = port
        self.rw: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def send(self, path: str, body: bytes, headers: dict[str, str], timeout: float = 30.0) -> Result:
        t0 = time.perf_counter()
        try:
            return await asyncio.wait_for(self._send(path, body, headers, t0), timeout)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            self.close()
            return Result(0, time.perf_counter() - t0, 0.0, 0, type(exc).__name__)

    async def _send(self, path: str, body: bytes, headers: dict[str, str], t0: float) -> Result:
        if self.rw is None:
            self.rw = await asyncio.open_connection("127.0.0.1", self.port, limit=2**26)
        r, w = self.rw
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        w.write(f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body)
        await w.drain()
        head, fields = await read_head(r)
        status = int(head.split(b" ", 2)[1])
        ttfb = 0.0
        if b"content-length" in fields:
            await r.readexactly(int(fields[b"content-length"]))
            ttfb = time.perf_counter() - t0
        else:
            while True:
                size = await r.readuntil(b"\r\n")
                n = int(size.split(b";")[0], 16)
                await r.readexactly(n + 2)
                ttfb = ttfb or time.perf_counter() - t0
                if n == 0:
                    break
        if fields.get(b"connection", b"").lower() == b"close":
            self.close()
        return Result(status, time.perf_counter() - t0, ttfb, int(fields.get(b"x-ctxengine-tokens-saved", b"0") or 0))

    def close(self) -> None:
        if self.rw is not None:
            self.rw[1].close()
            self.rw = None


async def get_latency(port: int, path: str) -> float:
    t0 = time.perf_counter()
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n".encode())
    await w.drain()
    await r.read()
    w.close()
    return time.perf_counter() - t0


# -- processes ---------------------------------------------------------------------------------
PROXY_SRC = ROOT / "src"
"""The tree the proxy under test runs from (``--src``: another checkout's ``src``, for a before/after)."""


def env(src: Path | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src or ROOT / "src")}


def spawn(args: list[str], ready: bool = True) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env())
    if ready:
        assert p.stdout is not None
        p.stdout.readline()
    return p


def start_upstream(log: Path | None = None, faults: float = 0.0) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    args = [PARTS, "upstream", str(port), "--faults", str(faults)] + (["--log", str(log)] if log else [])
    return spawn(args), port


def proxy_yaml(tmp: Path, up: int, store: str, extra: str = "") -> Path:
    cfg = tmp / f"proxy-{free_port()}.yaml"
    cfg.write_text(
        f"{store}\n"
        f"proxy:\n  openai_base_url: http://127.0.0.1:{up}/v1\n  anthropic_base_url: http://127.0.0.1:{up}\n  timeout: 2\n{extra}",
        encoding="utf-8",
    )
    return cfg


def start_proxy(cfg: Path, workers: int = 1, extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """``ctxengine proxy`` on a free port (its log beside its config); raises when it does not come up."""
    port = free_port()
    args = ["-m", "ctxengine", "proxy", "--config", str(cfg), "--port", str(port), "--log-format", "text", "--model-window", f"*={WINDOW}"]
    if workers > 1:
        args += ["--workers", str(workers)]
    log = open(cfg.with_suffix(f".{port}.log"), "wb")  # noqa: SIM115
    p = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=log, env=env(PROXY_SRC) | (extra_env or {}))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"the proxy exited with {p.returncode} ({' '.join(args)})")
        try:
            asyncio.run(get_latency(port, "/healthz"))
            return p, port
        except OSError:
            time.sleep(0.1)
    p.kill()
    raise RuntimeError("the proxy did not come up")


def stop(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its live children (a proxy's workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(d.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def tree_rss_mb(pid: int) -> float:
    kib = rss_kib(pid)
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    kib += rss_kib(int(d.name))
            except OSError:
                continue
    return kib / 1024


# -- one phase: every agent's turns against one target -----------------------------------------
@dataclass
class Phase:
    results: dict[tuple[int, int], Result] = field(default_factory=dict)
    wall: float = 0.0
    cpu: float = 0.0
    health: list[float] = field(default_factory=list)
    sent: dict[str, list[Msg]] = field(default_factory=dict)


def headers_of(a: Agent, k: int) -> dict[str, str]:
    h = {"x-ctxengine-session": a.sid, "x-bench-turn": f"{a.sid.split('-', 1)[1]}/{k}"}
    if a.api == "anthropic":
        h |= {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    else:
        h["authorization"] = "Bearer k"
    return h


async def run_agent(i: int, a: Agent, ports: list[int], phase: Phase, pace: float, retries: int = 0) -> None:
    conns = [Conn(p) for p in ports]
    try:
        for k in range(len(a.cuts)):
            path, body, history = a.request(k)
            conn = conns[k % len(conns)]  # several ports: turns alternate between them
            for attempt in range(retries + 1):
                res = await conn.send(path, body, headers_of(a, k))
                if res.status == 200 or attempt == retries:
                    break
                await asyncio.sleep(0.05)
            phase.results[(i, k)] = res
            phase.sent[a.sid] = history
            if pace:
                await asyncio.sleep(pace)
    finally:
        for c in conns:
            c.close()


async def poll_health(port: int, out: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            out.append(await get_latency(port, "/healthz"))
        except OSError:
            out.append(float("inf"))
        await asyncio.sleep(0.1)


async def run_phase(group: list[Agent], ports: list[int], pace: float, pid: int | None = None, health: int | None = None) -> Phase:
    phase = Phase()
    cpu0 = tree_cpu(pid) if pid else 0.0
    done = asyncio.Event()
    poller = asyncio.create_task(poll_health(health, phase.health, done)) if health else None
    t0 = time.perf_counter()
    await asyncio.gather(*(run_agent(i, a, ports, phase, pace) for i, a in enumerate(group)))
    phase.wall = time.perf_counter() - t0
    done.set()
    if poller is not None:
        await poller
    phase.cpu = tree_cpu(pid) - cpu0 if pid else 0.0
    return phase


def ms(xs: list[float], q: float) -> float:
    return round(percentile(xs, q) * 1000, 2) if xs else 0.0


def summary(p: Phase, direct: Phase | None, fwd: Phase | None = None) -> dict[str, Any]:
    ok = {k: r for k, r in p.results.items() if r.status == 200}
    out: dict[str, Any] = {"requests": len(p.results), "errors": len(p.results) - len(ok), "req_s": round(len(p.results) / p.wall, 1)}
    out |= {"latency_p50_ms": ms([r.took for r in ok.values()], 50), "ttfb_p50_ms": ms([r.ttfb for r in ok.values()], 50)}
    if p.cpu:
        out["cpu_ms_per_request"] = round(p.cpu / max(1, len(p.results)) * 1000, 2)
    if direct is not None:
        added = [r.took - direct.results[k].took for k, r in ok.items() if k in direct.results]
        out |= {f"added_{q}_ms": ms(added, n) for q, n in (("p50", 50), ("p95", 95), ("p99", 99), ("max", 100))}
        ttfb = [r.ttfb - direct.results[k].ttfb for k, r in ok.items() if k in direct.results]
        out["ttfb_added_p50_ms"] = ms(ttfb, 50)
    if fwd is not None:
        compacting = {i for (i, _), r in p.results.items() if r.saved > 0}
        hol = [r.took - fwd.results[k].took for k, r in ok.items() if k[0] not in compacting and k in fwd.results]
        out |= {"never_compacting_sessions": len({i for i, _ in p.results} - compacting), "hol_p50_ms": ms(hol, 50), "hol_p99_ms": ms(hol, 99), "hol_max_ms": ms(hol, 100)}
    if p.health:
        out |= {"healthz_p50_ms": ms(p.health, 50), "healthz_p99_ms": ms(p.health, 99), "healthz_n": len(p.health)}
    return out


def bench_load(c: int, pace: float, turns: int, workers: int, tmp: Path, extra: str = "") -> dict[str, Any]:
    runs = trajectories()
    up, up_port = start_upstream()
    fwd_port = free_port()
    fwd = spawn([PARTS, "forwarder", str(fwd_port), str(up_port)])
    procs = [up, fwd]
    try:
        proxy, port = start_proxy(proxy_yaml(tmp, up_port, f"store:\n  path: {tmp / f'load-{c}.db'}", extra), workers)
        procs.append(proxy)
        out: dict[str, Any] = {"c": c, "pace_s": pace, "workers": workers, "proxy_settings": extra.split(), "load_before": os.getloadavg()[0]}
        direct = asyncio.run(run_phase(agents(runs, c, turns, "d"), [up_port], pace))
        forwarded = asyncio.run(run_phase(agents(runs, c, turns, "f"), [fwd_port], pace, fwd.pid))
        asyncio.run(run_phase(agents(runs, 4, 2, "warm"), [port], 0.0))  # imports, first sessions: not measured
        proxied = asyncio.run(run_phase(agents(runs, c, turns, "p"), [port], pace, proxy.pid, health=port))
        out["direct"] = summary(direct, None)
        out["forwarder"] = summary(forwarded, direct)
        out["proxy"] = summary(proxied, direct, forwarded)
        out["load_after"] = os.getloadavg()[0]
        return out
    finally:
        stop(*reversed(procs))


# -- two processes on one store ----------------------------------------------------------------
def _texts(msgs: list[Msg]) -> list[str]:
    out = []
    for m in msgs:
        c = m.get("content")
        out.append("".join(str(p.get("text", "")) for p in c if isinstance(p, dict)) if isinstance(c, list) else str(c or ""))
    return out


def store_checks(store: Any, sent: dict[str, list[Msg]]) -> dict[str, int]:
    """Sessions whose stored originals are not what the client last sent (``lost``), and stored
    tip moves back to an earlier version of the same chain (``backward``)."""
    lost = backward = 0
    for sid, history in sent.items():
        try:
            have = [t for t in _texts(store.originals(sid)) if t]
        except Exception:
            lost += 1
            continue
        want = [t for t in _texts(history) if t]
        lost += have[: len(want)] != want or len(have) != len(want)
        prev: list[str] = []
        for ev in store.events(sid):
            ids = store.history_ids(sid, at=f"event:{ev.number}")
            if len(ids) < len(prev) and prev[: len(ids)] == ids:
                backward += 1
            prev = ids
    return {"sessions": len(sent), "lost": lost, "backward": backward}


def bodies(log: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        key, sha = line.split()
        out[key] = sha  # a retried turn: its last body
    return out


def bench_two(c: int, turns: int, backend: str, tmp: Path) -> dict[str, Any]:
    runs = trajectories()
    pg = extra = None
    if backend == "postgres":
        from proxy_faults import PgCluster

        pg = PgCluster()
    try:
        out: dict[str, Any] = {"backend": backend, "c": c}
        phases: dict[str, tuple[Phase, dict[str, str], Any]] = {}
        for mode, nproc in (("one", 1), ("two", 2)):
            log = tmp / f"bodies-{backend}-{mode}.log"
            up, up_port = start_upstream(log)
            if pg is not None:
                extra = {"CTXENGINE_STORE_DSN": pg.new_database()}
                store_yaml = "store:\n  backend: postgres"
            else:
                store_yaml = f"store:\n  path: {tmp / f'two-{mode}.db'}"
            cfg = proxy_yaml(tmp, up_port, store_yaml)
            procs: list[tuple[subprocess.Popen[bytes], int]] = []
            try:
                procs += [start_proxy(cfg, 1, extra) for _ in range(nproc)]
                phase = asyncio.run(run_phase(agents(runs, c, turns, "s"), [p for _, p in procs], 0.0))
            finally:
                stop(*(p for p, _ in procs), up)
            from ctxengine.config import StoreConfig
            from ctxengine.store import open_store

            cfg_store = StoreConfig(backend="postgres") if pg is not None else StoreConfig(path=str(tmp / f"two-{mode}.db"))
            with open_store(cfg_store, environ=extra or {}) as store:
                checks = store_checks(store, phase.sent)
            phases[mode] = (phase, bodies(log), checks)
            out[mode] = {"errors": sum(r.status != 200 for r in phase.results.values()), "requests": len(phase.results), **checks}
        one, two = phases["one"][1], phases["two"][1]
        differ = [k for k in one if two.get(k) != one[k]]
        out["divergent_turns"] = len(differ)
        out["divergent_sessions"] = len({k.split("/")[0] for k in differ})
        return out
    finally:
        if pg is not None:
            pg.stop()


# -- soak: sessions back to back ---------------------------------------------------------------
async def soak_loop(runs: list[Session], c: int, turns: int, port: int, minutes: float, pid: int, phase: Phase, rss: list[tuple[float, float]]) -> int:
    deadline = time.monotonic() + minutes * 60
    started = 0

    async def worker(w: int) -> None:
        nonlocal started
        rng = random.Random(w)
        while time.monotonic() < deadline:
            started += 1
            n = started
            a = agents(runs, 1, rng.randint(4, turns), "k", offset=rng.randrange(len(runs)))[0]
            a.sid, a.api, a.stream = f"k-{n}", rng.choice(["openai", "openai", "openai", "anthropic"]), rng.random() < 0.5
            await run_agent(n, a, [port], phase, 0.0, retries=5)

    async def sampler() -> None:
        t0 = time.monotonic()
        while time.monotonic() < deadline:
            rss.append((time.monotonic() - t0, tree_rss_mb(pid)))
            await asyncio.sleep(5)

    await asyncio.gather(sampler(), *(worker(w) for w in range(c)))
    return started


def bench_soak(c: int, minutes: float, faults: float, turns: int, idle: float, tmp: Path) -> dict[str, Any]:
    runs = trajectories()
    up, up_port = start_upstream(faults=faults)
    db = tmp / "soak.db"
    phase, rss, proxy = Phase(), [], None
    try:
        proxy, port = start_proxy(proxy_yaml(tmp, up_port, f"store:\n  path: {db}", f"  session_idle_seconds: {idle}\n"))
        sessions = asyncio.run(soak_loop(runs, c, turns, port, minutes, proxy.pid, phase, rss))
    finally:
        stop(*([proxy] if proxy is not None else []), up)
    first = [m for t, m in rss if t < 60] or [rss[0][1]]
    last = [m for t, m in rss if t >= rss[-1][0] - 60]
    out: dict[str, Any] = {"c": c, "minutes": minutes, "faults": faults, "idle_seconds": idle, "sessions": sessions}
    out |= {"requests": len(phase.results), "failed_after_retries": sum(r.status != 200 for r in phase.results.values())}
    out |= {"rss_first_minute_mb": round(statistics.mean(first), 1), "rss_last_minute_mb": round(statistics.mean(last), 1)}
    out["rss_growth_pct"] = round((out["rss_last_minute_mb"] / out["rss_first_minute_mb"] - 1) * 100, 1)
    out["rss_samples_mb"] = [round(m) for _, m in rss]
    from ctxengine.store.sqlite import SqliteStore

    ok_sent = {sid: h for sid, h in phase.sent.items()}
    with SqliteStore(str(db)) as store:
        out["store"] = store_checks(store, ok_sent)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["load", "two", "soak"])
    ap.add_argument("--c", default=None, help="concurrent sessions (load: a list, 1,8,64)")
    ap.add_argument("--pace", type=float, default=0.0, help="seconds between a session's turns (load)")
    ap.add_argument("--turns", type=int, default=20, help="turns per session at most")
    ap.add_argument("--workers", type=int, default=1, help="the proxy's --workers (load)")
    ap.add_argument("--backend", default="both", choices=["sqlite", "postgres", "both"])
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--faults", type=float, default=0.0, help="share of upstream requests answered with a fault (soak)")
    ap.add_argument("--idle", type=float, default=10.0, help="proxy.session_idle_seconds (soak)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a proxy: setting for the proxy under test (load), e.g. inline_compaction_tokens=0")
    ap.add_argument("--src", type=Path, help="run the proxy from this src/ folder (another checkout: a before/after)")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    if a.src is not None:
        global PROXY_SRC
        PROXY_SRC = a.src.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="ctxengine-load-"))
    results: list[dict[str, Any]] = []
    try:
        if a.mode == "load":
            for c in [int(x) for x in (a.c or "1,8,64").split(",")]:
                extra = "".join(f"  {k}: {v}\n" for k, _, v in (x.partition("=") for x in a.set))
                results.append(bench_load(c, a.pace, a.turns, a.workers, tmp, extra))
                print(json.dumps(results[-1]), flush=True)
        elif a.mode == "two":
            for b in (["sqlite", "postgres"] if a.backend == "both" else [a.backend]):
                results.append(bench_two(int(a.c or 8), a.turns, b, tmp))
                print(json.dumps(results[-1]), flush=True)
        else:
            results.append(bench_soak(int(a.c or 64), a.minutes, a.faults, a.turns, a.idle, tmp))
            print(json.dumps(results[-1]), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
