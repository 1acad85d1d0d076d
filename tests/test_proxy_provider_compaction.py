"""A client that lets the provider compact (Anthropic ``context_management`` edits, the
Responses API's compaction) keeps working through the proxy: the request field goes upstream
unchanged, the provider's compaction block or item comes back byte-exact in every later
request, never folded or cut, and what follows it is compacted to the window."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson

from ctxengine.config import Config
from ctxengine.proxy import ProxyServer
from ctxengine.proxy.provider_compaction import holds_provider_compaction, split
from ctxengine.testing.strict_upstream.tokens import count_request_tokens
from ctxengine.testing.stub_server import StubServer

KEY = "sk-test-provider-compaction"
WINDOW = 16_000
MODEL = "bench-model"
SUMMARY = "Summary of the work so far: files 0-5 read; the bug is in parse() at line 40; next: read files 6-9."
ENCRYPTED = "gAAAAB" + "Zm9vYmFyYmF6" * 200  # an OpenAI compaction item's opaque content


def _output(i: int) -> str:
    return "\n".join(f"line {j} of file {i}: value = compute({i}, {j})  # details" for j in range(260))


def _proxy(stub: StubServer, tmp_path: Path) -> ProxyServer:
    cfg = Config().with_overrides(
        proxy={"openai_base_url": stub.openai_base_url, "anthropic_base_url": stub.anthropic_base_url},
        store={"path": str(tmp_path / "sessions.db")},
        models={MODEL: {"context_length": WINDOW}},
    )
    return ProxyServer(cfg)


def _anthropic_history() -> tuple[list[Any], int]:
    msgs: list[Any] = [{"role": "user", "content": "Find the bug in the parser."}]

    def turn(i: int, head: list[Any]) -> None:
        msgs.append({"role": "assistant", "content": [*head, {"type": "tool_use", "id": f"toolu_{i}", "name": "read_file", "input": {"path": f"f{i}.py"}}]})
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": _output(i)}]})

    for i in range(6):
        turn(i, [])
    at = len(msgs)
    turn(6, [{"type": "compaction", "content": SUMMARY}, {"type": "text", "text": "Continuing from the summary."}])
    for i in range(7, 11):
        turn(i, [])
    msgs.append({"role": "user", "content": "What is the fix?"})
    return msgs, at


def test_an_anthropic_compaction_block_goes_upstream_byte_exact_and_the_rest_is_compacted(tmp_path: Path) -> None:
    messages, at = _anthropic_history()
    edits = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 150000}}, {"type": "clear_tool_uses_20250919"}]}
    body = {"model": MODEL, "max_tokens": 512, "system": "You are a coding agent.", "messages": messages, "context_management": edits}
    raw = orjson.dumps(body)
    with StubServer() as stub, _proxy(stub, tmp_path) as p:
        headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "anthropic-beta": "compact-2026-01-12", "content-type": "application/json"}
        r = httpx.post(p.anthropic_base_url + "/v1/messages", content=raw, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        (sent,) = stub.requests
    out = sent.body
    assert out["context_management"] == edits and sent.headers["anthropic-beta"] == "compact-2026-01-12"
    # the compaction turn and everything before it as the client sent it, bytes included
    assert out["messages"][: at + 2] == messages[: at + 2]
    assert orjson.dumps(messages[at]) in sent.raw
    # what follows was compacted: the part the provider counts fits the window
    assert len(out["messages"]) <= len(messages) and len(sent.raw) < len(raw)
    counted = {"system": out["system"], "messages": out["messages"][at:]}
    assert count_request_tokens(counted) <= WINDOW < count_request_tokens({"system": body["system"], "messages": messages[at:]})
    assert out["messages"][-1] == messages[-1]


def test_a_responses_compaction_item_goes_upstream_byte_exact(tmp_path: Path) -> None:
    items: list[Any] = [{"role": "developer", "content": "You are a coding agent."}, {"role": "user", "content": "Find the bug."}]

    def turn(i: int) -> None:
        items.append({"type": "function_call", "call_id": f"call_{i}", "name": "read_file", "arguments": json.dumps({"path": f"f{i}.py"})})
        items.append({"type": "function_call_output", "call_id": f"call_{i}", "output": _output(i)})

    for i in range(6):
        turn(i)
    compaction = {"type": "compaction", "id": "cmp_0123", "encrypted_content": ENCRYPTED}
    items.append(compaction)
    for i in range(6, 10):
        turn(i)
    items.append({"role": "user", "content": "What is the fix?"})
    cm = [{"type": "compaction", "compact_threshold": 200000}]
    body = {"model": MODEL, "input": items, "store": False, "context_management": cm}
    with StubServer() as stub, _proxy(stub, tmp_path) as p:
        r = httpx.post(p.openai_base_url + "/responses", content=orjson.dumps(body), headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"}, timeout=30)
        assert r.status_code == 200, r.text
        (sent,) = stub.requests
    out = sent.body
    assert out["context_management"] == cm
    k = out["input"].index(compaction)
    assert out["input"][: k + 1] == items[: k + 1] and orjson.dumps(compaction) in sent.raw
    assert count_request_tokens({"input": out["input"][k:]}) <= WINDOW < count_request_tokens({"input": items[13:]})


def test_the_split_freezes_the_compaction_turn_with_its_tool_results() -> None:
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": [{"type": "compaction", "content": SUMMARY}], "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "r"},
        {"role": "user", "content": "next"},
    ]
    frozen, live, tools = split(msgs, None)
    assert frozen == msgs[:4] and live == [msgs[0], msgs[4]]
    assert tools is not None and SUMMARY in tools[0]["function"]["description"]
    assert split(msgs[:2], None) == ([], msgs[:2], None)
    # ours (the proxy's own /responses/compact answer) is expanded, never frozen
    assert not holds_provider_compaction({"role": "user", "content": None, "responses": {"opaque": [{"type": "compaction", "encrypted_content": "ctxengine:v1:abc"}]}})
