"""A session new in the proxy process (its first request, the first after a restart) is opened
in a worker thread (the store read, the engine's start, its tool definitions counted) and its
turn is then planned on the event loop when it only appends; a session's first turn writes to
the store after the response. Driven like Claude Code (its session id in a header, streamed
Anthropic requests, tools) through a real proxy against the strict scripted upstream, which
rejects an invalid request or one over the window as the provider does."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from ctxengine.anthropic_adapter import anthropic_to_openai
from ctxengine.config import Config
from ctxengine.manager import CompactionDue, ContextManager
from ctxengine.proxy import ProxyServer
from ctxengine.store import SqliteStore
from ctxengine.testing.strict_upstream import StrictUpstream, Task

READ = {"name": "read_file", "description": "Read a file and return its whole content.", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
SYSTEM = [{"type": "text", "text": "You are a careful coding agent."}]
SESSION = "0b6f4a52-8d1e-4c43-9a54-3f0e8c1d2a77"
WINDOW = 128_000


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[StrictUpstream]:
    task = Task(tmp_path / "ws", steps=6, file_tokens=2000)
    task.write()
    with StrictUpstream(task, window=WINDOW, log_path=tmp_path / "upstream.jsonl") as up:
        yield up


def _proxy(up: StrictUpstream, tmp_path: Path) -> ProxyServer:
    cfg = Config().with_overrides(
        proxy={"openai_base_url": up.openai_base_url, "anthropic_base_url": up.anthropic_base_url},
        store={"path": str(tmp_path / "sessions.db")},
        models={"bench-model": {"context_length": WINDOW}},
        # summaries: no compaction in this short task, so every turn's planning shows the opening
        # alone (digests fold small batches of outputs early, in a worker thread)
        compressor={"mode": "summary"},
    )
    return ProxyServer(cfg)


def _turn(p: ProxyServer, msgs: list[Any]) -> list[Any]:
    """One streamed turn as Claude Code sends it (its session id in a header); the tool calls
    the model made, their results appended to ``msgs``."""
    c = anthropic.Anthropic(base_url=p.anthropic_base_url, api_key="sk-test", max_retries=0, default_headers={"x-claude-code-session-id": SESSION})
    with c.messages.stream(model="bench-model", max_tokens=256, system=SYSTEM, messages=msgs, tools=[READ]) as s:  # type: ignore[arg-type]
        final = s.get_final_message()
    content = [b.model_dump(exclude_none=True) for b in final.content]
    msgs.append({"role": "assistant", "content": content})
    calls = [b for b in content if b["type"] == "tool_use"]
    if calls:
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": b["id"], "content": Path(b["input"]["path"]).read_text()} for b in calls]})
    return calls


def _lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [dict(getattr(r, "fields", {})) for r in caplog.records if r.getMessage() == "request"]


def test_the_first_request_and_the_first_after_a_restart_are_planned_inline(upstream: StrictUpstream, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    msgs: list[Any] = [{"role": "user", "content": upstream.task.prompt}]
    with caplog.at_level(logging.INFO, logger="ctxengine.proxy"):
        with _proxy(upstream, tmp_path) as p:
            for _ in range(3):
                assert _turn(p, msgs)
        before = _lines(caplog)
        caplog.clear()
        with _proxy(upstream, tmp_path) as p:  # the restart: the same store, nothing in memory
            while _turn(p, msgs):
                pass
        after = _lines(caplog)
    stats = upstream.stats
    assert stats["finished"] and not stats["rejected"] and stats["over_window"] == 0
    # every turn on the event loop; a first one in this process after its session was opened
    assert [r["planned"] for r in before + after] == ["inline"] * (len(before) + len(after))
    assert [bool(r.get("opened")) for r in before] == [True, False, False]
    assert bool(after[0].get("opened")) and not any(r.get("opened") for r in after[1:])
    sid = before[0]["session"]
    assert {r["session"] for r in before + after} == {sid}  # the session kept across the restart
    # resumed, not rebuilt: nothing compacted, no larger than before plus the turn's new messages
    assert after[0]["compactions"] == 0 and after[0]["tokens_out"] <= before[-1]["tokens_out"] + 2 * upstream.task.file_tokens + 200
    # the store holds the messages as sent, each once, the last turn's included (written after it)
    with SqliteStore(tmp_path / "sessions.db") as store:
        sent = anthropic_to_openai(SYSTEM, msgs[:-1])
        assert store.get_session(sid).stored == len(sent)
        assert [m.get("role") for m in store.originals(sid)] == [m.get("role") for m in sent]


def test_a_first_turn_is_quick_and_written_after_the_response(tmp_path: Path) -> None:
    """``prepare(may_compact=False)`` takes a session's first turn once its tool list is counted
    (:meth:`ContextManager.count_tools`); its write waits for :meth:`flush_records`."""
    store = SqliteStore(tmp_path / "s.db")
    mgr = ContextManager(Config(), model="gpt-4o", context_length=128_000, store=store)
    tools = [{"type": "function", "function": {"name": "read_file", "description": "Read a file. " * 200, "parameters": {"type": "object", "properties": {}}}}]
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one"}]
    with pytest.raises(CompactionDue, match="tool list not counted"):
        mgr.prepare(msgs, tools, session_id="q", defer_record=True, may_compact=False)
    assert mgr.count_tools(tools, session_id="q") > 1000
    assert mgr.prepare(msgs, tools, session_id="q", defer_record=True, may_compact=False) == msgs
    assert store.list_sessions() == []  # nothing written yet
    mgr.flush_records("q")
    assert [m["content"] for m in store.originals("q")] == ["be brief", "one"]
    msgs += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "two"}]
    assert mgr.prepare(msgs, tools, session_id="q", defer_record=True, may_compact=False) == msgs
    mgr.flush_records("q")
    assert [m["content"] for m in store.originals("q")] == ["be brief", "one", "ok", "two"]
    assert store.get_session("q").stored == 4  # each message once
    # without a deferred write, a first turn still goes to the caller that may write now
    with pytest.raises(CompactionDue, match="written to the store now"):
        mgr.prepare(msgs[:2], None, session_id="other", may_compact=False)
    store.close()
