#!/usr/bin/env python
"""Fault campaign: the promises of the README under bad input, bad servers and bad plugins.

Runs cases by class over the library, the CLI, the summarizer (a local stub server with faults:
500, 429 with Retry-After, timeouts, resets, trickling bodies, malformed bodies, an echoed key,
huge replies), the store, plugins and config, and prints one row per class::

    class  cases  clean  lost  crash  hang  over-window  leak  silent  waste

* **lost** a user message neither in the context nor retrievable from the store; a session the
  store stopped recording; the caller's data changed.
* **crash** a traceback, a foreign exception, exit code 1, the wrong party blamed.
* **hang** a case over its time limit (the summarizer's deadline + 10 %, recall over 1 s, …).
* **over-window** a prepared request larger than the window.
* **leak** a secret in an error, ``status()``, a log line or a store row.
* **silent** invalid input or configuration accepted without a word.
* **duplicate** a message the store recorded more often than the client sent it (the proxy).
* **waste** work the caller should not pay for (a summarizer call on every turn of a resent
  history, a server asked again during a cooldown).

All traffic goes to 127.0.0.1; stores and homes live in a temporary directory. Exit status 0
only when every case is clean. Usage::

    python scripts/fault_campaign.py [--only CLASS ...] [--quick] [--json OUT]

``--quick`` runs fewer sizes (a smoke run); the classes fixed by other parts of the project
(lost users at small windows, giant outputs, the window cap, plugins, resent history) are
included so the whole project can be checked after a merge.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUTCOMES = ("clean", "lost", "duplicate", "crash", "hang", "over-window", "leak", "silent", "waste")
KEY = "sk-live-campaignKEY0123456789abcdef"
WORK = Path(tempfile.mkdtemp(prefix="ctxengine-faults-"))
os.environ["HOME"] = str(WORK / "home")
os.environ["XDG_DATA_HOME"] = str(WORK / "data")
os.environ["XDG_CONFIG_HOME"] = str(WORK / "config")
os.environ.pop("CTXENGINE_CONFIG", None)
os.environ["CTXENGINE_API_KEY"] = KEY

from ctxengine import ContextManager  # noqa: E402
from ctxengine.config import Config  # noqa: E402
from ctxengine.errors import CtxEngineError  # noqa: E402
from ctxengine.messages import content_text, is_summary  # noqa: E402
from ctxengine.summarize.base import render_sections  # noqa: E402
from ctxengine.testing.stub_server import StubReply, StubServer  # noqa: E402
from ctxengine.tokens import ExactCounter  # noqa: E402

Msg = dict[str, Any]


@dataclass
class Result:
    outcome: str
    detail: str = ""


@dataclass
class Case:
    klass: str
    name: str
    run: Callable[[], Result]
    limit: float = 60.0


@dataclass
class Tally:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


MEASURES: dict[str, list[float]] = {"deadline_ratio": [], "recall_seconds": [], "proxy_error_seconds": []}


# -- logging: capture every record so leaks in log lines are found ---------------------------------------
class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []  # unfiltered: a library user's handler has no RedactingFilter

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.lines.append(self.format(record))


LOG = _Capture()
logging.getLogger().addHandler(LOG)
logging.getLogger().setLevel(logging.WARNING)
logging.getLogger("ctxengine").setLevel(logging.INFO)


# -- sessions -------------------------------------------------------------------------------------------
def agent_session(turns: int, *, user_words: int = 30, output_lines: int = 20, giant_first: int = 0, seed: int = 0) -> list[Msg]:
    """A coding-agent session: a user request, a tool call and its result, an answer, per turn."""
    msgs: list[Msg] = [{"role": "system", "content": "You are a careful coding agent. Keep the user's constraints."}]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"request {seed}-{t}: please handle item-{seed}-{t} " + "and keep it tidy " * (user_words // 4)})
        cid = f"c{seed}_{t}"
        msgs.append({"role": "assistant", "content": f"Looking at item {t}.", "tool_calls": [{"id": cid, "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/pkg/mod_{t}.py"})}}]})
        if t == 0 and giant_first:
            body = "\n".join(f"/repo/src/deep/dir_{i % 97}/file_{i}.py" for i in range(giant_first // 30))
        else:
            body = "\n".join(f"line {i} of src/pkg/mod_{t}.py: value = compute({i})" for i in range(output_lines))
        msgs.append({"role": "tool", "tool_call_id": cid, "content": body})
        msgs.append({"role": "assistant", "content": f"Done with item {t}; next."})
    return msgs


def user_texts(msgs: list[Msg]) -> list[str]:
    return [content_text(m.get("content")) for m in msgs if m.get("role") == "user" and not is_summary(m)]


def lost_users(original: list[Msg], out: list[Msg], store: Any, sid: str, ctx: ContextManager | None = None) -> list[str]:
    """User messages neither verbatim in ``out`` nor retrievable: in the store *and* reachable
    by the model through a recall tool the manager offers (when ``ctx`` is given)."""
    sent = "\n".join(content_text(m.get("content")) for m in out)
    missing = [u for u in user_texts(original) if u not in sent]
    if not missing or store is None:
        return missing
    if ctx is not None:
        names = [str((t.get("function") or {}).get("name", "")) for t in ctx.tools([])]
        if not any(("grep" in n or "search" in n or "expand" in n) for n in names):
            return missing  # in the store, but the model has no way to ask for it
    gone = []
    for u in missing:
        try:
            hits = store.search(u[:120], session_id=sid, limit=1)
        except Exception:
            hits = []
        if not hits:
            gone.append(u)
    return gone


def manager(config: dict[str, Any] | None = None, *, window: int, store_path: Path | None = None, model: str = "gpt-4o", sid: str = "default") -> ContextManager:
    data = dict(config or {})
    data.setdefault("store", {"path": str(store_path or (WORK / f"store-{time.monotonic_ns()}.db"))})
    cfg = Config.from_dict(data)
    return ContextManager.from_config(cfg, model=model, context_length=window, session_id=sid)


_EXACT = ExactCounter()


def count_tokens(messages: list[Msg]) -> int:
    """Request size as the provider counts it (o200k), for every over-window check."""
    return _EXACT.count_messages(messages)


def over_window(out: list[Msg], window: int) -> bool:
    return count_tokens(out) > window


TEMPLATE = render_sections({"Goal": ["- keep going"], "Progress/Done": ["- earlier work summarized"]})


# -- class: lost users (every engine, small to large windows) -----------------------------------------------
def cases_lost_users(quick: bool) -> Iterator[Case]:
    windows = [500, 2_000, 8_000] if quick else [500, 1_000, 2_000, 4_000, 8_000, 32_000]
    for engine in ("compressor", "rules", "lcm", "cacheaware"):
        for window in windows:
            turns = max(10, min(120, window // 60))

            def run(engine: str = engine, window: int = window, turns: int = turns) -> Result:
                msgs = agent_session(turns, seed=window)
                path = WORK / f"lost-{engine}-{window}.db"
                ctx = manager({"context": {"engine": engine}}, window=window, store_path=path)
                try:
                    out = ctx.prepare(msgs)
                except CtxEngineError as exc:
                    return Result("crash", f"prepare raised {type(exc).__name__}: {str(exc)[:160]}")
                from ctxengine.store import SqliteStore

                with SqliteStore(path) as store:
                    gone = lost_users(msgs, out, store, "default", ctx)
                if gone:
                    return Result("lost", f"{len(gone)} of {len(user_texts(msgs))} user messages neither in the context nor recallable (first: {gone[0][:40]!r})")
                if over_window(out, window):
                    return Result("over-window", f"{count_tokens(out):,} tokens for a {window:,} window")
                return Result("clean")

            yield Case("lost-users", f"{engine}@{window}", run)
    # a long session at a large window: more user text than any summary's quote budget
    for engine in ("compressor", "rules", "lcm", "cacheaware"):

        def long(engine: str = engine) -> Result:
            window = 128_000
            msgs = agent_session(600 if quick else 1_200, user_words=200, output_lines=5, seed=42)
            path = WORK / f"long-{engine}.db"
            ctx = manager({"context": {"engine": engine}}, window=window, store_path=path)
            out = ctx.prepare(msgs)
            from ctxengine.store import SqliteStore

            with SqliteStore(path) as store:
                gone = lost_users(msgs, out, store, "default", ctx)
            if gone:
                return Result("lost", f"{len(gone)} of {len(user_texts(msgs))} user messages neither in the context nor recallable")
            if over_window(out, window):
                return Result("over-window", f"{count_tokens(out):,} tokens")
            return Result("clean")

        yield Case("lost-users", f"{engine}@128000-long", long, limit=180.0)
    # the agent-loop pattern: prepare each turn with the prepared list kept
    for engine in ("compressor", "rules"):

        def loop(engine: str = engine) -> Result:
            window = 3_000
            path = WORK / f"loop-{engine}.db"
            ctx = manager({"context": {"engine": engine}}, window=window, store_path=path)
            full = agent_session(40, seed=7)
            sent: list[Msg] = list(full[:1])
            for t in range(40):
                sent = ctx.prepare([*sent, *full[1 + 4 * t : 5 + 4 * t]])
                if over_window(sent, window):
                    return Result("over-window", f"turn {t}: {count_tokens(sent):,} tokens")
            from ctxengine.store import SqliteStore

            with SqliteStore(path) as store:
                gone = lost_users(full, sent, store, "default", ctx)
            return Result("lost", f"{len(gone)} user messages neither in the context nor recallable") if gone else Result("clean")

        yield Case("lost-users", f"{engine}-agent-loop", loop)


# -- class: giant outputs (in the protected head too) -----------------------------------------------------------
def cases_giant_outputs(quick: bool) -> Iterator[Case]:
    sizes = [(1_000_000, "head"), (1_000_000, "tail")] + ([] if quick else [(3_000_000, "head")])
    for engine in ("compressor", "rules", "lcm", "cacheaware"):
        for size, where in sizes:
            if True:

                def run(engine: str = engine, size: int = size, where: str = where) -> Result:
                    window = 128_000
                    msgs = agent_session(8, giant_first=size if where == "head" else 0, seed=size)
                    if where == "tail":
                        body = "\n".join(f"/repo/big/f_{i}.txt" for i in range(size // 20))
                        msgs += [
                            {"role": "assistant", "content": "", "tool_calls": [{"id": "gt", "type": "function", "function": {"name": "find", "arguments": "{}"}}]},
                            {"role": "tool", "tool_call_id": "gt", "content": body},
                        ]
                    ctx = manager({"context": {"engine": engine}}, window=window)
                    try:
                        out = ctx.prepare(msgs)
                        for t in range(3):  # later turns must fit too
                            out = ctx.prepare([*out, {"role": "user", "content": f"and then step {t}"}, {"role": "assistant", "content": "ok"}])
                    except CtxEngineError as exc:
                        return Result("crash", f"{type(exc).__name__}: {str(exc)[:160]}")
                    if over_window(out, window):
                        return Result("over-window", f"{count_tokens(out):,} tokens for {window:,}")
                    return Result("clean")

                yield Case("giant-outputs", f"{engine}-{size // 1_000_000}MB-{where}", run, limit=120.0)


# -- class: summarizer faults ----------------------------------------------------------------------------------------
def _summarizer_faults() -> dict[str, Callable[[], StubReply]]:
    huge = render_sections({"Goal": ["- goal"], "Progress/Done": [f"- step {i} " + "x" * 200 for i in range(6_000)]})
    return {
        "500": lambda: StubReply.fail(500, "internal error"),
        "429-retry-after-30": lambda: StubReply(text=None, status=429, error="rate limited", headers={"retry-after": "30"}),
        "timeout": lambda: StubReply(text=TEMPLATE, delay=6.0),
        "reset": lambda: StubReply(reset=True),
        "trickle": lambda: StubReply(text=TEMPLATE, trickle=0.05),
        "malformed": lambda: StubReply(raw_body=b'{"choices": [{"message": '),
        "not-json": lambda: StubReply(raw_body=b"<html>502 Bad Gateway</html>"),
        "empty": lambda: StubReply(text=None),
        "template-less": lambda: StubReply(text="Sure! Here is a summary in prose."),
        "echo-key": lambda: StubReply(status=500, text=None, error="bad upstream", echo_auth=True),
        "echo-key-in-summary": lambda: StubReply(text=TEMPLATE + f"\n(the key you sent was {KEY})"),
        "huge-reply": lambda: StubReply(text=huge),
        "surrogate-reply": lambda: StubReply(text=TEMPLATE + "\nbroken \ud800 text"),
    }


DEADLINE = 3.0


def _leaks(*texts: str) -> list[str]:
    return [t[:60] for t in texts if KEY in t or "campaignpass" in t]


def cases_summarizer(quick: bool) -> Iterator[Case]:
    # warm up what every first case would otherwise pay inside its timing (the exact tokenizer's
    # tables, the SDK's import): the cases measure the summarizer, not a cold process
    count_tokens([{"role": "user", "content": "warm up"}])
    with contextlib.suppress(ImportError):
        import openai  # noqa: F401
    for fault, make in _summarizer_faults().items():

        def run(fault: str = fault, make: Callable[[], StubReply] = make) -> Result:
            with StubServer(default=make()) as server:
                base = f"http://user:campaignpass@127.0.0.1:{server.port}/v1"
                path = WORK / f"sum-{fault}.db"
                cfg = {
                    "context": {"engine": "compressor"},
                    "auxiliary": {"compression": {"provider": "custom", "model": "stub", "base_url": base, "context_length": 64_000, "timeout": 1.0, "deadline": DEADLINE, "max_retries": 3}},
                    "store": {"path": str(path)},
                }
                ctx = manager(cfg, window=4_000, store_path=path)
                msgs = agent_session(30, seed=3)
                LOG.lines.clear()
                spent: list[float] = []
                summ = getattr(ctx._session(None).engine, "summarizer", None)
                if summ is not None and hasattr(summ, "summarize"):
                    inner = summ.summarize

                    def timed(*a: Any, _inner: Any = inner, **kw: Any) -> Any:
                        t = time.monotonic()
                        try:
                            return _inner(*a, **kw)
                        finally:
                            spent.append(time.monotonic() - t)

                    summ.summarize = timed
                t0 = time.monotonic()
                try:
                    out = ctx.prepare(msgs)
                except CtxEngineError as exc:
                    return Result("crash", f"{type(exc).__name__}: {str(exc)[:160]}")
                elapsed = time.monotonic() - t0
                summarizer_time = max(spent, default=0.0)  # one compaction's summarizer time
                MEASURES["deadline_ratio"].append(summarizer_time / DEADLINE)
                status = json.dumps(ctx.status(), default=str)
                from ctxengine.store import SqliteStore

                with SqliteStore(path) as store:
                    rows = json.dumps([c.report for c in store.compactions("default")], default=str)
                    history = json.dumps(store.history("default"), default=str)
                    gone = lost_users(msgs, out, store, "default")
                    out_text = json.dumps(out, default=str)
                leaked = _leaks(status, "\n".join(LOG.lines), rows, history, out_text)
                if leaked:
                    return Result("leak", f"secret in {leaked[0]!r}")
                if summarizer_time > DEADLINE * 1.1 or elapsed > DEADLINE * 1.1 + 2.0:
                    return Result("hang", f"summarizer {summarizer_time:.2f}s, prepare {elapsed:.1f}s with a {DEADLINE:g}s deadline")
                if gone:
                    return Result("lost", f"{len(gone)} user messages gone")
                if over_window(out, 4_000):
                    return Result("over-window", f"{count_tokens(out):,} tokens")
                try:
                    out_text.encode("utf-8")
                    json.dumps(out, ensure_ascii=False).encode("utf-8")
                except UnicodeEncodeError:
                    return Result("crash", "the prepared list cannot be encoded")
                return Result("clean", f"summarizer {summarizer_time:.2f}s, prepare {elapsed:.2f}s")

        yield Case("summarizer", fault, run, limit=DEADLINE * 4 + 20)

    for timeout, rate in ((1.0, 0.5), (2.0, 0.5), (2.0, 0.05)):

        def trickle(timeout: float = timeout, rate: float = rate) -> Result:
            # answers at once, then 1 byte every `rate` s; the 90 s default deadline is far off
            with StubServer(default=StubReply(text=TEMPLATE, trickle=rate)) as server:
                cfg = {"auxiliary": {"compression": {"provider": "custom", "model": "stub", "base_url": server.openai_base_url, "context_length": 64_000, "timeout": timeout, "max_retries": 1}}}
                ctx = manager(cfg, window=4_000)
                t0 = time.monotonic()
                ctx.prepare(agent_session(30, seed=4))
                elapsed = time.monotonic() - t0
            bound = timeout * 2 + 0.5 + 3.0  # two attempts, one backoff, tokenizer loading
            if elapsed > bound:
                return Result("hang", f"prepare {elapsed:.1f}s with timeout {timeout:g}s (bound {bound:.1f}s)")
            if "extractive" not in json.dumps(ctx.status(), default=str):
                return Result("silent", "the extractive summary did not take over")
            return Result("clean", f"prepare {elapsed:.1f}s")

        yield Case("summarizer", f"trickle-{1 / rate:g}Bps-timeout-{timeout:g}-default-deadline", trickle, limit=120.0)

    def cooldown() -> Result:
        with StubServer(default=StubReply.fail(500, "down")) as server:
            cfg = {"auxiliary": {"compression": {"provider": "custom", "model": "stub", "base_url": server.openai_base_url, "context_length": 64_000, "deadline": DEADLINE, "max_retries": 0, "failure_threshold": 2, "cooldown": 600}}}
            ctx = manager(cfg, window=4_000)
            full = agent_session(80, seed=11)
            sent: list[Msg] = list(full[:1])
            compactions = 0
            for t in range(80):
                sent = ctx.prepare([*sent, *full[1 + 4 * t : 5 + 4 * t]])
                compactions = int(ctx.status().get("compactions") or 0)
            calls = server.calls
        if calls > 4:
            return Result("waste", f"{calls} summarizer calls over {compactions} compactions with a failing server (no cooldown)")
        return Result("clean", f"{calls} calls over {compactions} compactions")

    yield Case("summarizer", "cooldown", cooldown, limit=120.0)

    def bounded_loop() -> Result:
        from ctxengine.engines.compressor import ContextCompressor
        from ctxengine.summarize.llm import LlmSummarizer

        huge = render_sections({"Goal": ["- goal"], "Progress/Done": [f"- step {i} " + "y" * 300 for i in range(20_000)]})
        with StubServer(default=StubReply(text=huge)) as server:
            from ctxengine.clients.openai_compat import OpenAICompatClient

            summ = LlmSummarizer(OpenAICompatClient(base_url=server.openai_base_url, api_key=KEY, timeout=5), "stub", context_length=64_000, deadline=DEADLINE)
            try:
                engine = ContextCompressor(context_length=8_000, summarizer=summ)  # type: ignore[call-arg]
            except TypeError:
                return Result("clean", "compressor takes no summarizer argument: skipped")
            msgs = agent_session(60, seed=5)
            for n in range(12):
                if not engine.should_compress(count_tokens(msgs)):
                    return Result("clean", f"settled after {n} compactions")
                msgs = engine.compress(msgs)
            return Result("hang", "while should_compress(): compress() did not settle in 12 rounds")

    yield Case("summarizer", "should-compress-loop", bounded_loop, limit=120.0)

    for window in (500, 2_000):

        def no_store(window: int = window) -> Result:
            # a body cut short, the extractive fallback, no store: long user messages in a small
            # window (the shape that once lost one of 30 user messages to the window cap)
            with StubServer(default=StubReply(raw_body=b'{"choices": [{"message": ')) as server:
                cfg = {
                    "store": {"enabled": False},
                    "auxiliary": {"compression": {"provider": "custom", "model": "stub", "base_url": server.openai_base_url, "context_length": 64_000, "timeout": 1.0, "deadline": DEADLINE, "max_retries": 0}},
                }
                ctx = ContextManager.from_config(Config.from_dict(cfg), model="gpt-4o", context_length=window)
                msgs = agent_session(30, user_words=200, seed=3)
                try:
                    out = ctx.prepare(msgs)
                except CtxEngineError as exc:
                    if "user messages are kept whole" in str(exc):
                        return Result("clean", "a clear error: the window cannot hold the user's words without a store")
                    return Result("crash", f"{type(exc).__name__}: {str(exc)[:160]}")
            sent = "\n".join(content_text(m.get("content")) for m in out)
            gone = [u for u in user_texts(msgs) if u not in sent and not ctx.retrievable(u)]
            if gone:
                return Result("lost", f"{len(gone)} of {len(user_texts(msgs))} user messages neither verbatim nor kept")
            return Result("over-window", f"{count_tokens(out):,} tokens") if over_window(out, window) else Result("clean")

        yield Case("summarizer", f"cut-short-no-store@{window}", no_store, limit=60.0)


# -- class: recall search ----------------------------------------------------------------------------------------------
PATTERNS = ["(a+)+$", "(a|aa)+$", "(.*a){25}", "^(([a-z])+.)+[A-Z]([a-z])+$", "(x+x+)+y", "(\\w+\\s?)+$", "item-3-1[0-9]", "src/pkg/mod_9\\.py", "(?i)REQUEST"]


def cases_recall(quick: bool) -> Iterator[Case]:
    n = 5_000 if quick else 20_000
    state: dict[str, Any] = {}

    def store() -> Any:
        if "store" not in state:
            from ctxengine.store import SqliteStore

            s = SqliteStore(WORK / "recall.db")
            msgs: list[Msg] = []
            for i in range(n):
                role = "user" if i % 2 == 0 else "assistant"
                msgs.append({"role": role, "content": ("a" * 40 + "!") if i % 10 == 0 else f"message {i} about item-3-{i % 50} " + "word " * 20})
            s.record_messages("big", msgs)
            state["store"] = s
        return state["store"]

    for p in PATTERNS:

        def run(p: str = p) -> Result:
            s = store()
            t0 = time.monotonic()
            try:
                s.search(p, session_id="big", mode="regex", limit=20)
                s.search(p, mode="regex", limit=20)
            except CtxEngineError:
                pass  # a pattern the safe engine refuses, named: fine
            elapsed = time.monotonic() - t0
            MEASURES["recall_seconds"].append(elapsed)
            if elapsed > 1.0:
                return Result("hang", f"{elapsed:.1f}s on {n:,} messages")
            return Result("clean", f"{elapsed:.2f}s")

        yield Case("recall", f"regex {p}", run, limit=90.0)
        if p == PATTERNS[0]:
            # the engine's own tool, where one exists
            def tool(p: str = p) -> Result:
                with contextlib.suppress(ImportError):
                    from ctxengine.engines.lcm import LcmEngine

                    engine = LcmEngine(context_length=8_000, store=store())  # type: ignore[call-arg]
                    engine.on_session_start("big")
                    t0 = time.monotonic()
                    engine.handle_tool_call("lcm_grep", json.dumps({"query": p, "mode": "regex"}))
                    elapsed = time.monotonic() - t0
                    return Result("hang", f"lcm_grep {elapsed:.1f}s") if elapsed > 1.0 else Result("clean", f"{elapsed:.2f}s")
                return Result("clean", "no lcm engine")

            yield Case("recall", f"lcm_grep {p}", tool, limit=90.0)


# -- class: bad input to the library ---------------------------------------------------------------------------------------
BAD_MESSAGES: dict[str, list[Msg]] = {
    "orphan-result": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "x", "content": "r"}],
    "duplicate-ids": [{"role": "assistant", "content": "", "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}] * 2}, {"role": "tool", "tool_call_id": "a", "content": "r"}],
    "content-42": [{"role": "user", "content": 42}],
    "missing-role": [{"content": "x"}],
    "bad-role": [{"role": "robot", "content": "x"}],
    "nan": [{"role": "user", "content": "x", "score": float("nan")}],
    "infinity": [{"role": "user", "content": "x", "meta": {"v": float("inf")}}],
    "bytes": [{"role": "user", "content": "x", "raw": b"\x00\x01"}],
    "set": [{"role": "user", "content": "x", "tags": {"a", "b"}}],
    "int-key": [{"role": "user", "content": "x", "meta": {1: "one"}}],
    "not-a-dict": ["just a string"],  # type: ignore[list-item]
    "tool-calls-not-list": [{"role": "assistant", "content": "", "tool_calls": "f()"}],
}


def _deep(n: int) -> Any:
    v: Any = "x"
    for _ in range(n):
        v = [v]
    return v


BAD_MESSAGES["deep"] = [{"role": "user", "content": "x", "meta": _deep(5_000)}]


def cases_bad_input(quick: bool) -> Iterator[Case]:
    from ctxengine.errors import InputError, InvalidMessages

    for engine in ("compressor", "rules", "lcm"):
        for name, msgs in BAD_MESSAGES.items():

            def run(engine: str = engine, msgs: list[Msg] = msgs) -> Result:
                ctx = manager({"context": {"engine": engine}}, window=2_000)
                try:
                    ctx.prepare([{"role": "system", "content": "s"}, *msgs])
                except (InvalidMessages, InputError) as exc:
                    return Result("clean", str(exc)[:80])
                except CtxEngineError as exc:
                    return Result("crash", f"blamed elsewhere: {type(exc).__name__}: {str(exc)[:120]}")
                return Result("silent", "prepare accepted it")

            yield Case("bad-input", f"{engine}:{name}", run)
    for name, usage in {
        "nan": {"prompt_tokens": float("nan")},
        "inf": {"prompt_tokens": float("inf"), "completion_tokens": 1},
        "negative": {"prompt_tokens": -100},
        "negative-cache": {"input_tokens": 5, "cache_read_input_tokens": -1},
    }.items():

        def usage_case(usage: dict[str, Any] = usage) -> Result:
            ctx = manager(None, window=8_000)
            ctx.prepare([{"role": "user", "content": "hi"}])
            try:
                ctx.update_from_response(usage)
            except InputError as exc:
                return Result("clean", str(exc)[:80])
            except CtxEngineError as exc:
                return Result("crash", f"{type(exc).__name__}: {exc}")
            return Result("silent", "accepted")

        yield Case("bad-input", f"usage-{name}", usage_case)


# -- class: the CLI ---------------------------------------------------------------------------------------------------------
def _cli(args: list[str], stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, "-m", "ctxengine", *args], cwd=WORK, env=env, input=stdin, capture_output=True, timeout=120)


def cases_cli(quick: bool) -> Iterator[Case]:
    call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    files: dict[str, bytes] = {
        "orphan": json.dumps([{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "x", "content": "r"}]).encode(),
        "duplicate-ids": json.dumps([{"role": "assistant", "content": "", "tool_calls": [call, call]}, {"role": "tool", "tool_call_id": "a", "content": "r"}]).encode(),
        "content-42": json.dumps([{"role": "user", "content": 42}]).encode(),
        "missing-role": json.dumps([{"content": "x"}]).encode(),
        "nan": b'[{"role": "user", "content": "x", "v": NaN}]',
        "deep": b"[" * 100_000 + b"]" * 100_000,
        "binary": bytes(range(256)) * 20,
        "truncated": b'[{"role": "user", "content": "x"',
        "empty": b"",
        "not-messages": b'{"foo": 1}',
    }
    good_expect_zero: dict[str, bytes] = {
        "bom": b"\xef\xbb\xbf" + json.dumps([{"role": "user", "content": "bom"}]).encode(),
        "u2028-jsonl": (json.dumps({"messages": [{"role": "user", "content": "a\u2028b"}]}, ensure_ascii=False) + "\n" + json.dumps({"messages": [{"role": "user", "content": "c"}]}) + "\n").encode(),
        "lone-surrogate": json.dumps([{"role": "user", "content": "x\ud800y"}]).encode(),
    }
    for engine in ("compressor", "rules", "lcm"):
        for name, data in files.items():

            def bad(name: str = name, data: bytes = data, engine: str = engine) -> Result:
                f = WORK / f"cli-{name}.json"
                f.write_bytes(data)
                proc = _cli(["compact", str(f), "--engine", engine])
                err = proc.stderr.decode("utf-8", "replace")
                if proc.returncode == 0:
                    return Result("silent", "exit 0")
                if proc.returncode != 2 or "Traceback" in err:
                    return Result("crash", f"exit {proc.returncode}: {err.strip().splitlines()[-1][:120] if err.strip() else ''}")
                if "returned an invalid chat" in err:
                    return Result("crash", "blamed on the engine")
                return Result("clean")

            yield Case("cli", f"compact-{engine}:{name}", bad)
    for name, data in good_expect_zero.items():

        def good(name: str = name, data: bytes = data) -> Result:
            f = WORK / f"cli-{name}.json"
            f.write_bytes(data)
            proc = _cli(["compact", str(f), "--engine", "rules"])
            if proc.returncode != 0:
                return Result("crash", f"exit {proc.returncode}: {proc.stderr.decode('utf-8', 'replace').strip()[-160:]}")
            try:
                proc.stdout.decode("utf-8")
            except UnicodeDecodeError:
                return Result("crash", "output is not UTF-8")
            return Result("clean")

        yield Case("cli", f"compact:{name}", good)
    for name in ("binary", "truncated", "deep", "empty", "not-messages"):

        def restore(name: str = name) -> Result:
            f = WORK / f"cli-{name}.json"
            f.write_bytes(files[name])
            proc = _cli(["sessions", "restore", "--from", str(f), "--store", str(WORK / "cli-store.db")])
            err = proc.stderr.decode("utf-8", "replace")
            if proc.returncode == 0:
                return Result("silent", "exit 0")
            if proc.returncode != 2 or "Traceback" in err:
                return Result("crash", f"exit {proc.returncode}")
            return Result("clean")

        yield Case("cli", f"restore-from:{name}", restore)
    yield from _damaged_export_cases()
    for arg in ("0", "-3"):

        def ctx_len(arg: str = arg) -> Result:
            f = WORK / "cli-ok.json"
            f.write_text(json.dumps([{"role": "user", "content": "hi"}]))
            proc = _cli(["compact", str(f), f"--context-length={arg}"])
            return Result("clean") if proc.returncode == 2 and b"Traceback" not in proc.stderr else Result("silent" if proc.returncode == 0 else "crash", f"exit {proc.returncode}")

        yield Case("cli", f"context-length={arg}", ctx_len)


def _damaged_export_cases() -> Iterator[Case]:
    """``sessions restore --from`` an export whose records are cut short: each required field
    of each record kind removed in turn (exit 2 naming the record and the field, nothing
    written to the store)."""
    from ctxengine.store import SqliteStore
    from ctxengine.store.export_doc import COMPACTION, EVENT, MESSAGE, NODE

    src = WORK / "export-src.db"
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 10} for i in range(6)]
    with SqliteStore(src) as store:
        store.record_messages("s", msgs)
        store.record_compaction("s", {"engine": "rules", "tokens_before": 90, "tokens_after": 40, "replaced": [0, 1]}, msgs, msgs[2:])
        store.add_node("s", "n1", depth=0, text="summary", children=[("message", store.history_ids("s", "event:1")[0])])
        doc = store.export_session("s")
    for section, fields in {"messages": MESSAGE, "events": EVENT, "compactions": COMPACTION, "nodes": NODE}.items():
        for fname, (_check, required) in fields.items():
            if not required:
                continue

            def run(section: str = section, fname: str = fname) -> Result:
                damaged = json.loads(json.dumps(doc))
                del damaged[section][-1][fname]
                f = WORK / f"export-{section}-{fname}.json"
                f.write_text(json.dumps(damaged))
                target = WORK / f"export-{section}-{fname}.db"
                proc = _cli(["sessions", "restore", "--from", str(f), "--store", str(target)])
                err = proc.stderr.decode("utf-8", "replace")
                if proc.returncode == 0:
                    return Result("silent", "exit 0")
                if proc.returncode != 2 or "Traceback" in err:
                    return Result("crash", f"exit {proc.returncode}: {err.strip().splitlines()[-1][:120] if err.strip() else ''}")
                if f"{section}[" not in err or repr(fname) not in err:
                    return Result("crash", f"the error does not name the record and the field: {err.strip()[:160]}")
                if target.exists():
                    return Result("lost", "a damaged export wrote to the store")
                return Result("clean")

            yield Case("cli", f"restore-from:damaged-{section}.{fname}", run)


# -- class: text that cannot be encoded --------------------------------------------------------------------------------------
def cases_surrogates(quick: bool) -> Iterator[Case]:
    for engine in ("compressor", "rules", "lcm"):
        for counter in ("estimate", "exact"):

            def run(engine: str = engine, counter: str = counter) -> Result:
                path = WORK / f"sur-{engine}-{counter}.db"
                ctx = manager({"context": {"engine": engine, "token_counter": counter}}, window=3_000, store_path=path)
                msgs = agent_session(30, seed=9)
                msgs[1] = {**msgs[1], "content": msgs[1]["content"] + " \ud800 lone"}
                msgs[-1] = {**msgs[-1], "content": "end \udfff"}
                try:
                    out = ctx.prepare(msgs)
                except UnicodeError as exc:
                    return Result("crash", f"{type(exc).__name__}: {exc}")
                except CtxEngineError as exc:
                    return Result("crash", f"{type(exc).__name__}: {str(exc)[:120]}")
                st = ctx.status()
                if st.get("store_errors"):
                    return Result("lost", f"the store stopped recording ({st.get('store_errors')} errors)")
                from ctxengine.store import SqliteStore

                with SqliteStore(path) as store:
                    if store.get_session("default").length < len(out):
                        return Result("lost", "history not recorded")
                return Result("clean")

            yield Case("surrogates", f"{engine}/{counter}", run)


# -- class: secrets ----------------------------------------------------------------------------------------------------------
def cases_secrets(quick: bool) -> Iterator[Case]:
    def content_redaction() -> Result:
        path = WORK / "redact.db"
        ctx = manager({"redaction": {"content": True}}, window=8_000, store_path=path)
        ctx.prepare([{"role": "user", "content": "deploy with AKIAABCDEFGHIJKLMNOP and ghp_" + "q" * 36}])
        from ctxengine.store import SqliteStore

        with SqliteStore(path) as store:
            stored = json.dumps(store.export_session("default"))
        return Result("leak", "key shape stored") if "AKIAABCDEFGHIJKLMNOP" in stored or "ghp_" in stored else Result("clean")

    yield Case("secrets", "redaction.content", content_redaction)

    def errors() -> Result:
        from ctxengine.clients.openai_compat import OpenAICompatClient
        from ctxengine.errors import SummarizerError

        texts = []
        with StubServer(default=StubReply(status=401, text=None, echo_auth=True)) as server:
            for url in (f"http://u:campaignpass@127.0.0.1:{server.port}/v1", "http://u:campaignpass@127.0.0.1:1/v1"):
                try:
                    OpenAICompatClient(base_url=url, api_key=KEY, timeout=2).complete([{"role": "user", "content": "x"}], model="m", max_tokens=5, timeout=2)
                except SummarizerError as exc:
                    texts.append(str(exc) + "".join(traceback.format_exception(exc)))
        leaked = _leaks(*texts)
        return Result("leak", leaked[0]) if leaked else Result("clean")

    yield Case("secrets", "client-errors-and-tracebacks", errors)

    for api in ("openai", "anthropic"):
        for url_kind in ("userinfo", "query-key", "both"):

            def sdk_logs(api: str = api, url_kind: str = url_kind) -> Result:
                from ctxengine.clients.anthropic_client import AnthropicClient
                from ctxengine.clients.openai_compat import OpenAICompatClient

                root = logging.getLogger()
                level = root.level
                root.setLevel(logging.DEBUG)  # a library user's DEBUG logging, no RedactingFilter
                LOG.lines.clear()
                try:
                    with StubServer(default=StubReply.ok(TEMPLATE)) as server:
                        user = "user:campaignpass@" if url_kind in ("userinfo", "both") else ""
                        query = "?api_key=campaignpass-q" if url_kind in ("query-key", "both") else ""
                        base = f"http://{user}127.0.0.1:{server.port}{'/v1' if api == 'openai' else ''}{query}"
                        client: Any = OpenAICompatClient(base_url=base, api_key=KEY) if api == "openai" else AnthropicClient(base_url=base, api_key=KEY)
                        client.complete([{"role": "user", "content": "x"}], model="m", max_tokens=50, timeout=5)
                finally:
                    root.setLevel(level)
                leaked = _leaks("\n".join(LOG.lines))
                return Result("leak", f"SDK log line: {leaked[0]}") if leaked else Result("clean")

            yield Case("secrets", f"base_url-{url_kind}-{api}-sdk-debug-log", sdk_logs)

    def custom_summarizer() -> Result:
        from ctxengine.redact import register_secret

        register_secret(KEY)  # the configured key (clients register theirs when built)

        class Leaky:
            name = "leaky"

            def summarize(self, span: Any, **kw: Any) -> str:
                raise RuntimeError(f"upstream said: invalid key {KEY}")

        path = WORK / "leaky.db"
        ctx = manager({"context": {"engine": "compressor"}}, window=4_000, store_path=path)
        engine = ctx._session(None).engine
        if not hasattr(engine, "summarizer"):
            return Result("clean", "engine has no summarizer attribute: skipped")
        engine.summarizer = Leaky()
        LOG.lines.clear()
        ctx.prepare(agent_session(30, seed=13))
        from ctxengine.store import SqliteStore

        with SqliteStore(path) as store:
            rows = json.dumps([c.report for c in store.compactions("default")], default=str)
        leaked = _leaks(json.dumps(ctx.status(), default=str), "\n".join(LOG.lines), rows)
        return Result("leak", f"a custom summarizer's error text: {leaked[0]}") if leaked else Result("clean")

    yield Case("secrets", "custom-summarizer-error", custom_summarizer)


# -- class: config -------------------------------------------------------------------------------------------------------------
def cases_config(quick: bool) -> Iterator[Case]:
    from ctxengine.config import load_config
    from ctxengine.errors import ConfigError

    bad = {
        "token_counter": "context:\n  token_counter: exakt\n",
        "encoding": "context:\n  token_counter: 'exact:p50k_base'\n",
        "models-typo": "models:\n  gpt-4o:\n    context_lenght: 1000\n",
        "models-type": "models:\n  gpt-4o:\n    context_length: lots\n",
        "context_length-0": "model:\n  context_length: 0\n",
        "unknown-section": "compresion:\n  threshold: 0.5\n",
        "api-key-in-file": "auxiliary:\n  compression:\n    api_key: sk-abc\n",
        "deadline-0": "auxiliary:\n  compression:\n    deadline: 0\n",
    }
    for name, text in bad.items():

        def run(name: str = name, text: str = text) -> Result:
            f = WORK / f"cfg-{name}.yaml"
            f.write_text(text)
            try:
                load_config(f)
            except ConfigError as exc:
                return Result("clean") if str(f) in str(exc) else Result("crash", f"error does not name the file: {exc}")
            return Result("silent", "loaded")

        yield Case("config", name, run)

    def window_zero() -> Result:
        try:
            ContextManager.from_config(Config(), model="gpt-4o", context_length=0)
        except ConfigError:
            return Result("clean")
        except CtxEngineError as exc:
            return Result("crash", f"{type(exc).__name__}: {exc}")
        return Result("silent", "a window of 0 accepted")

    yield Case("config", "manager-context_length-0", window_zero)

    def exact_reaches_engines() -> Result:
        def fields(obj: Any) -> list[Any]:
            try:
                return list(vars(obj).values())
            except TypeError:  # slots
                return [getattr(obj, n, None) for n in getattr(obj, "__slots__", ())]

        def counts_exact(engine: Any) -> bool:
            seen = fields(engine)
            for v in list(seen):
                if v is not None and not isinstance(v, str | int | float | list | dict):
                    seen += fields(v)  # one level down: services, wrapped counters
            return any(str(getattr(v, "name", "")).startswith("exact") for v in seen if v is not None)

        # lcm is the lossless engine: it needs a store (without one it is a ConfigError by design)
        cfg = Config.from_dict({"context": {"token_counter": "exact"}, "store": {"path": str(WORK / "exact-counter.db")}})
        for engine in ("compressor", "rules", "lcm", "cacheaware"):
            ctx = ContextManager.from_config(cfg.with_overrides(context={"engine": engine}), model="gpt-4o")
            if not counts_exact(ctx._session(None).engine):
                return Result("silent", f"engine {engine} does not count with the configured exact counter")
        return Result("clean")

    yield Case("config", "token_counter-exact-reaches-engines", exact_reaches_engines)


# -- class: the store ------------------------------------------------------------------------------------------------------------
def cases_store(quick: bool) -> Iterator[Case]:
    from ctxengine.errors import StoreError

    for name, path in {"unwritable": "/proc/ctxengine/sessions.db", "a-directory": str(WORK)}.items():

        def run(path: str = path) -> Result:
            try:
                ctx = ContextManager.from_config(Config.from_dict({"store": {"path": path}}), model="gpt-4o")
            except (StoreError, CtxEngineError):
                return Result("clean")
            ctx.prepare([{"role": "user", "content": "hi"}])
            return Result("silent", "the manager started without its store (a warning at most)")

        yield Case("store", name, run)

    junk = WORK / "junk-store.db"
    bad_stores = {
        "a-directory": {"path": str(WORK)},
        "not-a-database": {"path": str(junk)},
        "under-a-file": {"path": str(junk / "sessions.db")},
        "postgres-without-dsn": {"backend": "postgres", "dsn_env": "CTXENGINE_CAMPAIGN_UNSET_DSN"},
    }
    for name, store_cfg in bad_stores.items():
        for engine in ("rules", "compressor", "lcm"):

            def cli_same(store_cfg: dict[str, Any] = store_cfg, engine: str = engine, name: str = name) -> Result:
                import yaml

                junk.write_bytes(b"not a database" * 100)
                try:
                    ContextManager.from_config(Config.from_dict({"store": store_cfg}), model="gpt-4o")
                    library = None
                except CtxEngineError as exc:
                    library = str(exc)
                cfg = WORK / f"store-cfg-{name}.yaml"
                cfg.write_text(yaml.safe_dump({"store": store_cfg}))
                f = WORK / "cli-ok.json"
                f.write_text(json.dumps([{"role": "user", "content": "hi"}]))
                proc = _cli(["compact", str(f), "--config", str(cfg), "--engine", engine])
                err = proc.stderr.decode("utf-8", "replace")
                if library is None:
                    return Result("silent", "the library accepted it")
                if proc.returncode == 0:
                    return Result("silent", f"the CLI exits 0 where the library raises: {library[:100]}")
                if proc.returncode != 2 or library not in err:
                    return Result("crash", f"exit {proc.returncode}, not the library's error: {err.strip()[-120:]}")
                return Result("clean")

            yield Case("store", f"cli-like-library:{name}:{engine}", cli_same)


# -- class: plugins (each in its own process: a plugin may exit or never return) --------------------------------------------------
PLUGIN_SRC = '''
import sys, time
from ctxengine.engine import ContextEngine
{top}

class Faulty(ContextEngine):
    def __init__(self, context_length=128_000, **kwargs):
        super().__init__(context_length=context_length)
        {init}

    @property
    def name(self):
        return "{name}"

    def update_from_response(self, usage):
        self._record_usage(usage)

    def should_compress(self, prompt_tokens=None):
        return True

    def compress(self, messages, current_tokens=None, focus_topic=None):
        {compress}
        return list(messages)
'''

PLUGIN_DRIVER = r'''
import copy, json, sys
from ctxengine import ContextManager
from ctxengine.config import Config
from ctxengine.errors import ConfigError, CtxEngineError
base = {"context": {"engine": sys.argv[1]}, "plugins": {"dirs": [sys.argv[2]]}, "store": {"enabled": False}}
try:  # a host deadline on compress, where the configuration has one
    cfg = Config.from_dict({**base, "context": {**base["context"], "engine_timeout": 5}})
except ConfigError:
    cfg = Config.from_dict(base)
msgs = [{"role": "system", "content": "s"}] + [m for i in range(30) for m in ({"role": "user", "content": f"u{i} " * 40}, {"role": "assistant", "content": f"a{i} " * 40})]
before = copy.deepcopy(msgs)
try:
    ctx = ContextManager.from_config(cfg, model="gpt-4o", context_length=2000)
    out = ctx.prepare(msgs)
    result = {"ok": True}
except CtxEngineError as exc:
    result = {"ok": False, "error": type(exc).__name__, "message": str(exc)[:200]}
result["mutated"] = msgs != before
print(json.dumps(result))
'''


def cases_plugins(quick: bool) -> Iterator[Case]:
    faults = {
        "exit-on-import": ("sys.exit(3)", "pass", "pass"),
        "raise-in-init": ("", "raise RuntimeError('init failed')", "pass"),
        "raise-in-compress": ("", "pass", "raise RuntimeError('compress failed')"),
        "exit-in-compress": ("", "pass", "sys.exit(4)"),
        "mutate-input": ("", "pass", "del messages[1:5]; messages[0]['content'] = 'changed'; return messages"),
        "never-returns": ("", "pass", "time.sleep(3600)"),
    }
    for fault, (top, init, compress) in faults.items():

        def run(fault: str = fault, top: str = top, init: str = init, compress: str = compress) -> Result:
            name = f"faulty_{fault.replace('-', '_')}"
            root = WORK / f"plugins-{name}"
            d = root / "context_engine" / name
            d.mkdir(parents=True, exist_ok=True)
            (d / "plugin.yaml").write_text(f"name: {name}\n")
            (d / "__init__.py").write_text(PLUGIN_SRC.format(top=top, init=init, compress=compress, name=name))
            try:
                proc = subprocess.run([sys.executable, "-c", PLUGIN_DRIVER, name, str(root)], capture_output=True, timeout=30, cwd=WORK)
            except subprocess.TimeoutExpired:
                return Result("hang", "compress never returned and the host waited")
            out = proc.stdout.decode("utf-8", "replace").strip().splitlines()
            if proc.returncode != 0 or not out:
                return Result("crash", f"host exited {proc.returncode}: {proc.stderr.decode('utf-8', 'replace').strip()[-160:]}")
            result = json.loads(out[-1])
            if result.get("mutated"):
                return Result("lost", "the caller's messages were changed")
            if not result["ok"] and name not in result.get("message", ""):
                return Result("crash", f"{result['error']} does not name the plugin: {result.get('message')}")
            return Result("clean")

        yield Case("plugins", fault, run, limit=60.0)


# -- class: resent history (the gateway pattern) ---------------------------------------------------------------------------------------
def cases_resent(quick: bool) -> Iterator[Case]:
    def run() -> Result:
        counts = {}
        for pattern in ("kept", "resent"):
            with StubServer(default=StubReply.ok(TEMPLATE)) as server:
                cfg = {"auxiliary": {"compression": {"provider": "custom", "model": "stub", "base_url": server.openai_base_url, "context_length": 64_000}}}
                ctx = manager(cfg, window=6_000)
                full = agent_session(60, seed=21)
                raw: list[Msg] = list(full[:1])
                sent: list[Msg] = list(full[:1])
                for t in range(20):
                    new = full[1 + 3 * t : 4 + 3 * t]
                    raw += new
                    sent = ctx.prepare(raw if pattern == "resent" else [*sent, *new])
                counts[pattern] = server.calls
        if counts["resent"] > 2 * counts["kept"] + 2:
            return Result("waste", f"{counts['resent']} summarizer calls resending the history vs {counts['kept']} keeping the prepared list")
        return Result("clean", f"{counts}")

    yield Case("resent-history", "20-turns", run, limit=180.0)


# -- the proxy under faults (scripts/proxy_faults.py) -------------------------------------------------------------
_PG: list[Any] = []


def _pg_cluster() -> Any:
    if not _PG:
        from proxy_faults import PgCluster

        _PG.append(PgCluster())
    return _PG[0]


def _proxy_cases(klass: str) -> Iterator[Case]:
    sys.path.insert(0, str(Path(__file__).parent))
    import proxy_faults as pf

    gens = {
        "proxy-upstream": lambda: pf.upstream_cases(WORK, MEASURES),
        "proxy-client": lambda: pf.client_cases(WORK, MEASURES),
        "proxy-restart": lambda: pf.restart_cases(WORK, MEASURES),
        "proxy-store": lambda: pf.store_cases(WORK, MEASURES, _pg_cluster),
    }
    for _k, name, fn in gens[klass]():

        def run(fn: Callable[[], tuple[str, str]] = fn) -> Result:
            outcome, detail = fn()
            return Result(outcome, detail)

        yield Case(klass, name, run, limit=90.0)


def cases_proxy_upstream(quick: bool) -> Iterator[Case]:
    return _proxy_cases("proxy-upstream")


def cases_proxy_client(quick: bool) -> Iterator[Case]:
    return _proxy_cases("proxy-client")


def cases_proxy_restart(quick: bool) -> Iterator[Case]:
    return _proxy_cases("proxy-restart")


def cases_proxy_store(quick: bool) -> Iterator[Case]:
    return _proxy_cases("proxy-store")


CLASSES: dict[str, Callable[[bool], Iterator[Case]]] = {
    "lost-users": cases_lost_users,
    "giant-outputs": cases_giant_outputs,
    "summarizer": cases_summarizer,
    "recall": cases_recall,
    "bad-input": cases_bad_input,
    "cli": cases_cli,
    "surrogates": cases_surrogates,
    "secrets": cases_secrets,
    "config": cases_config,
    "store": cases_store,
    "plugins": cases_plugins,
    "resent-history": cases_resent,
    "proxy-upstream": cases_proxy_upstream,
    "proxy-client": cases_proxy_client,
    "proxy-restart": cases_proxy_restart,
    "proxy-store": cases_proxy_store,
}


def run_case(case: Case) -> Result:
    box: dict[str, Result] = {}

    def work() -> None:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                box["r"] = case.run()
        except BaseException as exc:
            box["r"] = Result("crash", f"{type(exc).__name__}: {str(exc)[:160]}")

    t = threading.Thread(target=work, daemon=True, name=f"case-{case.name}")
    t.start()
    t.join(case.limit)
    if t.is_alive():
        return Result("hang", f"still running after {case.limit:g}s")
    return box["r"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", choices=sorted(CLASSES), help="Run these classes only.")
    ap.add_argument("--quick", action="store_true", help="Fewer sizes (a smoke run).")
    ap.add_argument("--json", type=Path, help="Write every case's outcome here.")
    ap.add_argument("-v", "--verbose", action="store_true", help="Print every case.")
    args = ap.parse_args(argv)
    tallies: dict[str, Tally] = {}
    records = []
    t_all = time.monotonic()
    for klass, gen in CLASSES.items():
        if args.only and klass not in args.only:
            continue
        tally = tallies.setdefault(klass, Tally())
        t0 = time.monotonic()
        for case in gen(args.quick):
            r = run_case(case)
            outcome = r.outcome if r.outcome in OUTCOMES else "crash"
            tally.counts[outcome] += 1
            records.append({"class": klass, "case": case.name, "outcome": outcome, "detail": r.detail})
            if outcome != "clean":
                tally.failures.append(f"{case.name}: {outcome}: {textwrap.shorten(r.detail, 150)}")
            if args.verbose:
                print(f"  {klass:<15} {case.name:<40} {outcome:<11} {textwrap.shorten(r.detail, 80)}", file=sys.stderr, flush=True)
        tally.seconds = time.monotonic() - t0
        print(f"{klass}: {sum(tally.counts.values())} cases in {tally.seconds:.1f}s", file=sys.stderr, flush=True)
    # a case still running past its limit keeps its redirect_stdout (process-wide) in force
    sys.stdout = sys.__stdout__
    header = ["class", "cases", *OUTCOMES, "seconds"]
    rows = [[k, str(sum(t.counts.values())), *(str(t.counts[o]) for o in OUTCOMES), f"{t.seconds:.1f}"] for k, t in tallies.items()]
    total = [sum(int(r[i]) for r in rows) for i in range(1, len(header) - 1)]
    rows.append(["total", *(str(x) for x in total), f"{time.monotonic() - t_all:.1f}"])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    if MEASURES["deadline_ratio"]:
        print(f"summarizer: one compaction's summarizer time / deadline ({DEADLINE:g}s): max {max(MEASURES['deadline_ratio']):.3f} over {len(MEASURES['deadline_ratio'])} faults")
    if MEASURES["proxy_error_seconds"]:
        print(f"proxy: worst time to a clear error {max(MEASURES['proxy_error_seconds']):.2f}s over {len(MEASURES['proxy_error_seconds'])} errors (proxy timeout 2s)")
    if MEASURES["recall_seconds"]:
        print(f"recall: slowest regex search {max(MEASURES['recall_seconds']):.2f}s")
    failures = [(k, f) for k, t in tallies.items() for f in t.failures]
    if failures:
        print("\nfailures:")
        for k, f in failures:
            print(f"  [{k}] {f}")
    if args.json:
        args.json.write_text(json.dumps({"classes": {k: t.counts for k, t in tallies.items()}, "cases": records, "measures": MEASURES}, indent=2))
    sys.stdout.flush()
    for cluster in _PG:
        cluster.stop()
    code = 1 if failures else 0
    os._exit(code)  # hung case threads (if any) must not keep the process alive


if __name__ == "__main__":
    sys.exit(main())
