"""Through the proxy: a client that answers a re-read of an unchanged file with "unchanged since
last read" (Claude Code on the messages API, Qwen Code on chat completions), after the proxy
folded that file away: the strict upstream finds the file's content in the very next request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from ctxengine.config import Config
from ctxengine.proxy import ProxyServer
from ctxengine.testing.strict_upstream import StrictUpstream, Task

CLAUDE_STUB = "Wasted call — file unchanged since your last Read. Refer to that earlier tool_result instead."
QWEN_STUB = "[File {path} unchanged since last read in this session — the full content was provided earlier in this conversation. Refer to it instead of re-reading.]"
WINDOW = 12_000
READ_SCHEMA = {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}


def _proxy_config(up: StrictUpstream, tmp_path: Path) -> Config:
    return Config().with_overrides(
        proxy={"openai_base_url": up.openai_base_url, "anthropic_base_url": up.anthropic_base_url},
        store={"path": str(tmp_path / "sessions.db")},
        model={"context_length": WINDOW},
    )


def _read(path: str, seen: set[str], stub: str) -> str:
    if path in seen:
        return stub.format(path=path)
    seen.add(path)
    return Path(path).read_text(encoding="utf-8")


def _claude_code(p: ProxyServer, task: Task) -> None:
    client = anthropic.Anthropic(base_url=p.anthropic_base_url, api_key="sk-ant-test", max_retries=0)
    tools: list[Any] = [{"name": "Read", "description": "Read a file", "input_schema": READ_SCHEMA}]
    msgs: list[Any] = [{"role": "user", "content": task.prompt}]
    seen: set[str] = set()
    for _ in range(task.steps + 6):
        r = client.messages.create(model="claude-sonnet-4-5", max_tokens=512, system="You are Claude Code.", tools=tools, messages=msgs)
        uses = [b for b in r.content if b.type == "tool_use"]
        if not uses:
            return
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id, "content": _read(str(dict(u.input)["file_path"]), seen, CLAUDE_STUB)} for u in uses]})


def _qwen_code(p: ProxyServer, task: Task) -> None:
    client = openai.OpenAI(base_url=p.openai_base_url, api_key="sk-test", max_retries=0)
    tools: list[Any] = [{"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": READ_SCHEMA}}]
    msgs: list[Any] = [{"role": "system", "content": "You are Qwen Code."}, {"role": "user", "content": task.prompt}]
    seen: set[str] = set()
    for _ in range(task.steps + 6):
        r = client.chat.completions.create(model="qwen3-coder", messages=msgs, tools=tools)
        m = r.choices[0].message
        if not m.tool_calls:
            return
        msgs.append(m.model_dump(exclude_none=True))
        for c in m.tool_calls:
            msgs.append({"role": "tool", "tool_call_id": c.id, "content": _read(json.loads(c.function.arguments)["file_path"], seen, QWEN_STUB)})


@pytest.mark.parametrize("client", ["claude-code", "qwen-code"])
def test_a_reread_after_a_compaction_is_in_the_next_request(tmp_path: Path, client: str) -> None:
    task = Task(tmp_path / "ws", steps=8, file_tokens=1500, reread=(6, 2))
    task.write()
    with StrictUpstream(task, window=WINDOW) as up, ProxyServer(_proxy_config(up, tmp_path)) as p:
        (_claude_code if client == "claude-code" else _qwen_code)(p, task)
        stats = up.stats
    assert stats["finished"] and not stats["rejected"]
    reread = stats["reread"]
    assert reread is not None, "the upstream asked for the re-read and saw the next request"
    assert "unchanged since" in reread["answer"], "the client answered with its stub"
    assert reread["in_view"], "the file's content is in the request after the stub"
