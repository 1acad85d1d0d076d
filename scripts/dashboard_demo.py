"""A demo store for the dashboard: a few agents' sessions driven through a real ``ctxengine
proxy`` in front of the stub upstream (127.0.0.1 only; no provider, no key), then served.

    PYTHONPATH=src python scripts/dashboard_demo.py /tmp/demo          # builds /tmp/demo/sessions.db
    PYTHONPATH=src python -m ctxengine ui --store /tmp/demo/sessions.db  # http://127.0.0.1:8788/ui/

The stub reports prompt-cache usage as a provider would (most of each prompt read from the cache,
the new part written). The requests ran within seconds; ``--spread HOURS`` spreads their times
over the last hours afterwards (default 6), each compaction with the request it ran in, so the
chart over time has a shape: the demo's only edit of what the proxy recorded.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import anthropic
import openai

from ctxengine.config import Config
from ctxengine.proxy import SESSION_HEADER, ProxyServer
from ctxengine.testing.stub_server import RecordedRequest, StubReply, StubServer

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
ANTHROPIC_TOOLS = [{"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]


def _reply(req: RecordedRequest) -> StubReply:
    tokens = len(json.dumps(req.body)) // 4
    if "/messages" in req.path:
        read = int(tokens * 0.85)
        return StubReply(text="Done; next file.", usage={"input_tokens": 120, "cache_read_input_tokens": read, "cache_creation_input_tokens": max(0, tokens - read - 120)})
    return StubReply(text="Done; next file.", usage={"prompt_tokens": tokens, "prompt_tokens_details": {"cached_tokens": int(tokens * 0.7)}})  # type: ignore[dict-item]


def _output(turn: int, session: str) -> str:
    return f"$ pytest tests/test_mod{turn}.py\n" + f"src/app/mod{turn}.py:{10 + turn}: assertion failed in {session}\n" + "collected 12 items ... ok\n" * 40


def _openai_session(p: ProxyServer, session: str, agent: str, model: str, turns: int) -> None:
    c = openai.OpenAI(base_url=p.openai_base_url, api_key="sk-demo", max_retries=0, default_headers={SESSION_HEADER: session, "user-agent": f"{agent}/1.0"})
    msgs: list[Any] = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": f"{session}: make the test suite pass"}]
    for t in range(turns):
        call = {"id": f"c{t}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/app/mod{t}.py"})}}
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": f"c{t}", "content": _output(t, session)}]
        r = c.chat.completions.create(model=model, messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
        msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "go on"}]


def _anthropic_session(p: ProxyServer, session: str, turns: int) -> None:
    c = anthropic.Anthropic(base_url=p.anthropic_base_url, api_key="sk-ant-demo", max_retries=0, default_headers={SESSION_HEADER: session, "user-agent": "claude-cli/2.1"})
    msgs: list[Any] = [{"role": "user", "content": f"{session}: make the test suite pass"}]
    for t in range(turns):
        msgs.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"t{t}", "name": "read_file", "input": {"path": f"src/app/mod{t}.py"}}]})
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{t}", "content": _output(t, session)}]})
        r = c.messages.create(model="claude-sonnet-4-5", max_tokens=256, system="You are a coding agent.", messages=msgs, tools=ANTHROPIC_TOOLS)  # type: ignore[arg-type]
        msgs.append({"role": "assistant", "content": [b.model_dump() for b in r.content]})
        msgs.append({"role": "user", "content": "go on"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--spread", type=float, default=6.0, help="hours to spread the requests' times over (0: leave them)")
    args = ap.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    db = args.folder / "sessions.db"
    with StubServer() as stub:
        stub.responder = _reply
        cfg = Config().with_overrides(
            proxy={"openai_base_url": stub.openai_base_url, "anthropic_base_url": stub.anthropic_base_url},
            store={"path": str(db)}, model={"context_length": 12_000}, models={"claude-sonnet-4-5": {"context_length": 12_000}, "gpt-4o": {"context_length": 12_000}},
        )
        with ProxyServer(cfg) as p:
            for n, turns in enumerate((30, 18, 26)):
                _anthropic_session(p, f"claude-{n + 1}", turns)
            for n, turns in enumerate((24, 14)):
                _openai_session(p, f"aider-{n + 1}", "aider", "gpt-4o", turns)
            _openai_session(p, "local-1", "llm", "my-local-model", 12)
            time.sleep(1.0)
    if args.spread > 0:
        with sqlite3.connect(db) as con:
            # each compaction moves with the request it ran in (the first one logged after it)
            ran_in = con.execute(
                "SELECT c.pk, (SELECT MIN(r.pk) FROM requests r WHERE r.session_pk = c.session_pk AND r.created_at >= c.created_at) FROM compactions c"
            ).fetchall()
            rows = con.execute("SELECT pk FROM requests ORDER BY pk").fetchall()
            now, span = time.time(), args.spread * 3600
            for i, (pk,) in enumerate(rows):
                con.execute("UPDATE requests SET created_at = ? WHERE pk = ?", (now - span + span * i / max(1, len(rows) - 1), pk))
            for cpk, rpk in ran_in:
                if rpk is not None:
                    con.execute("UPDATE compactions SET created_at = (SELECT created_at - 0.5 FROM requests WHERE pk = ?) WHERE pk = ?", (rpk, cpk))
    print(db)


if __name__ == "__main__":
    main()
