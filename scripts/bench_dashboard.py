"""How fast the dashboard's pages render over a large store (issue figure: the overview and a
session page in at most 300 ms, server time plus load in the browser, with 1,000 sessions and
100,000 messages).

Builds (or reuses) a SQLite store of SESSIONS sessions of MESSAGES messages each, with a request
log row per turn and a compaction in every tenth session, serves the dashboard on 127.0.0.1,
and times each page: its first load (the request log added up from scratch), the server's
time once that is kept (median of REPEAT requests over HTTP, the log unchanged) and, when Chromium
is installed, the page's load in the browser: request, HTML, stylesheet and script, up to its
load event (server time included), timed by a page that loads it in an iframe. Bounded: a few hundred requests on loopback.

    PYTHONPATH=src python scripts/bench_dashboard.py [--sessions 1000] [--messages 100] [--store PATH]
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import uvicorn

from ctxengine.store import RequestRecord, SqliteStore
from ctxengine.ui.app import Dashboard
from ctxengine.ui.data import audit

REPEAT = 7


def _turn(s: int, i: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"session {s} step {i}: look at src/app/module_{i % 17}.py and fix the failing test"},
        {"role": "assistant", "content": f"Reading src/app/module_{i % 17}.py. " + "The function parses the config and returns a mapping. " * 6},
    ]


def build(path: Path, sessions: int, messages: int) -> None:
    store = SqliteStore(str(path))
    t0 = time.perf_counter()
    histories = []
    for s in range(sessions):
        msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
        for i in range((messages - 1) // 2):
            msgs += _turn(s, i)
        histories.append((f"bench-{s:04d}", msgs[:messages]))
    for start in range(0, len(histories), 100):
        store.record_many(histories[start : start + 100])
    now = time.time()
    for s, (sid, msgs) in enumerate(histories):
        turns = len(msgs) // 2
        for t in range(turns):
            received = 300 + 120 * t
            store.record_request(RequestRecord(
                sid, "anthropic" if s % 3 else "openai", "claude-sonnet-4-5" if s % 3 else "gpt-4o", created_at=now - 86_400 + s * 60 + t,
                client=("claude-cli", "aider", "codex")[s % 3], tokens_in=received, tokens_out=min(received, 3000), prompt_tokens=min(received, 3000),
                cache_read_tokens=int(min(received, 3000) * 0.8), cache_write_tokens=100, completion_tokens=50, compactions=1 if received > 3000 and t % 10 == 0 else 0,
            ))
        if s % 10 == 0:
            after = [msgs[0], {"role": "user", "content": "[ctxengine:digest: summary of the first turns] src/app/module_1.py"}, *msgs[21:]]
            store.record_compaction(sid, {"engine": "bench", "tokens_before": 9000, "tokens_after": 6000, "replaced": list(range(1, 21))}, msgs, after)
    store.close()
    print(f"built {sessions:,} sessions / {sessions * messages:,} messages in {time.perf_counter() - t0:.1f} s: {path}")


_HARNESS = """<!doctype html><html><body><iframe id=f style="width:1280px;height:900px"></iframe><script>
var t0 = performance.now(), f = document.getElementById("f");
f.onload = function () { document.body.setAttribute("data-ms", (performance.now() - t0).toFixed(1)); };
f.src = decodeURIComponent(location.hash.slice(1));
</script></body></html>"""


def _serve(store: SqliteStore) -> tuple[uvicorn.Server, str]:
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Mount, Route

    async def harness(request: Any) -> HTMLResponse:
        return HTMLResponse(_HARNESS)

    app = Starlette(routes=[Route("/harness", harness), Mount("/", app=Dashboard(store).app)])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return server, f"http://127.0.0.1:{port}"


def _browser(base: str, path: str) -> float | None:
    """The page's load in Chromium (request, HTML, stylesheet, script, layout, up to its load
    event), timed by the page around it (an iframe), in ms; the best of three."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        return None
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--dump-dom"]
    best = None
    for _ in range(3):
        out = subprocess.run([*cmd, f"{base}/harness#{path}"], capture_output=True, text=True, timeout=60, check=True).stdout
        found = re.search(r'data-ms="([0-9.]+)"', out)
        if found:
            ms = float(found.group(1))
            best = ms if best is None else min(best, ms)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--messages", type=int, default=100)
    ap.add_argument("--store", type=Path, help="reuse (or build) the store here")
    ap.add_argument("--no-browser", action="store_true")
    args = ap.parse_args()
    path = args.store or Path(tempfile.mkdtemp()) / "dashboard.db"
    if not path.exists():
        build(path, args.sessions, args.messages)
    store = SqliteStore(str(path))
    sid = "bench-0000"
    cid = store.compactions(sid)[0].id
    removed = audit(store, cid)["removed"]
    print(f"audit of {cid[:12]}: {len(removed)} of {len(store.get_compaction(cid).replaced)} replaced messages listed")
    server, base = _serve(store)
    pages = {"overview": "/ui/", "sessions": "/ui/sessions", "session": f"/ui/sessions/{sid}", "audit": f"/ui/sessions/{sid}/compactions/{cid}"}
    print(f"{'page':<10} {'first load ms':>13} {'server ms (median)':>18} {'in the browser ms':>17} {'KB':>6}")
    with httpx.Client(timeout=30) as client:
        for name, path_ in pages.items():
            t0 = time.perf_counter()
            client.get(base + path_).raise_for_status()
            cold_ms = (time.perf_counter() - t0) * 1000
            times = []
            size = 0
            for _ in range(REPEAT):
                t0 = time.perf_counter()
                r = client.get(base + path_)
                times.append(time.perf_counter() - t0)
                r.raise_for_status()
                size = len(r.content)
            server_ms = statistics.median(times) * 1000
            load = None if args.no_browser else _browser(base, path_)
            load_ms = "-" if load is None else f"{load:.0f}"
            print(f"{name:<10} {cold_ms:>13.0f} {server_ms:>18.1f} {load_ms:>17} {size / 1024:>6.0f}")
    server.should_exit = True
    store.close()


if __name__ == "__main__":
    main()
