"""The strict scripted upstream of scripts/bench_clients.py: it plays the task with the client's
own tools and rejects, in each provider's 400 shape, what that provider rejects."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ctxengine.testing.strict_upstream import StrictUpstream, Task

READ = {
    "type": "function",
    "function": {
        "name": "read_file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def upstream(tmp_path: Path) -> Any:
    task = Task(tmp_path / "ws", steps=3, file_tokens=300)
    task.write()
    with StrictUpstream(task, window=4000, log_path=tmp_path / "log.jsonl") as up:
        yield up


def test_chat_task_runs_on_the_clients_tool_and_finishes(upstream: StrictUpstream) -> None:
    url = upstream.openai_base_url + "/chat/completions"
    messages: list[dict[str, Any]] = [{"role": "user", "content": upstream.task.prompt}]
    for i in range(1, 4):
        status, body = _post(url, {"model": "m", "messages": messages, "tools": [READ]})
        assert status == 200
        call = body["choices"][0]["message"]["tool_calls"][0]
        assert json.loads(call["function"]["arguments"]) == {"path": str(upstream.task.path(i))}
        messages += [
            body["choices"][0]["message"],
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": upstream.task.path(i).read_text(),
            },
        ]
    status, body = _post(url, {"model": "m", "messages": messages, "tools": [READ]})
    assert body["choices"][0]["message"]["content"].startswith("TASK DONE")
    assert upstream.stats["finished"] and upstream.stats["rejected"] == {}
    assert len((upstream.log_path or Path()).read_text().splitlines()) == 4


def test_rejections_in_the_providers_shapes(upstream: StrictUpstream) -> None:
    chat = upstream.openai_base_url + "/chat/completions"
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "read_file", "arguments": "{}"},
    }
    status, body = _post(
        chat,
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "user", "content": "y"},
            ],
        },
    )
    assert status == 400 and "did not have response messages: call_1" in body["error"]["message"]
    status, body = _post(
        chat,
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "tool", "tool_call_id": "call_9", "content": "r"},
            ],
        },
    )
    assert (
        status == 400 and "must be a response to a preceeding message" in body["error"]["message"]
    )
    status, body = _post(
        chat, {"model": "m", "messages": [{"role": "user", "content": "word " * 5000}]}
    )
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["message"].startswith(
        "This model's maximum context length is 4000 tokens."
    )

    msgs = upstream.anthropic_base_url + "/v1/messages"
    status, body = _post(
        msgs,
        {
            "model": "claude",
            "max_tokens": 10,
            "messages": [{"role": "user", "content": "word " * 5000}],
        },
    )
    assert (
        status == 400
        and body["type"] == "error"
        and "prompt is too long: " in body["error"]["message"]
        and "> 4000 maximum" in body["error"]["message"]
    )
    thinking = {"type": "thinking", "thinking": "plan", "signature": upstream.sign("plan")}
    history = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [thinking, {"type": "text", "text": "ok"}]},
        {"role": "user", "content": "y"},
    ]
    assert _post(msgs, {"model": "claude", "max_tokens": 10, "messages": history})[0] == 200
    history[1]["content"][0] = {**thinking, "thinking": "plan!"}
    status, body = _post(msgs, {"model": "claude", "max_tokens": 10, "messages": history})
    assert status == 400 and "Invalid `signature`" in body["error"]["message"]

    resp = upstream.openai_base_url + "/responses"
    status, body = _post(
        resp,
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "x"},
                {"type": "function_call_output", "call_id": "c1", "output": "r"},
            ],
        },
    )
    assert (
        status == 400
        and "No tool call found for function call output with call_id c1"
        in body["error"]["message"]
    )
    assert upstream.stats["rejected"] == {
        "call_without_result": 1,
        "result_without_call": 2,
        "over_window": 2,
        "bad_thinking_signature": 1,
    }


def test_responses_reasoning_must_come_back_unaltered(upstream: StrictUpstream) -> None:
    url = upstream.openai_base_url + "/responses"
    tool = {
        "type": "function",
        "name": "read_file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    items: list[dict[str, Any]] = [{"role": "user", "content": upstream.task.prompt}]
    status, body = _post(url, {"model": "m", "input": items, "tools": [tool]})
    reasoning, call = body["output"]
    assert reasoning["type"] == "reasoning" and call["type"] == "function_call"
    out = {
        "type": "function_call_output",
        "call_id": call["call_id"],
        "output": upstream.task.path(1).read_text(),
    }
    assert (
        _post(url, {"model": "m", "input": [*items, reasoning, call, out], "tools": [tool]})[0]
        == 200
    )
    altered = {**reasoning, "encrypted_content": reasoning["encrypted_content"][:-2] + "AA"}
    status, body = _post(
        url, {"model": "m", "input": [*items, altered, call, out], "tools": [tool]}
    )
    assert status == 400 and "could not be verified" in body["error"]["message"]
    status, body = _post(url, {"model": "m", "input": [*items, call, out], "tools": [tool]})
    assert status == 400 and "without its required 'reasoning' item" in body["error"]["message"]


def test_a_record_that_mentions_the_recall_tool_is_not_a_recall_call(upstream: StrictUpstream) -> None:
    """The last step's request asks ``ctx_grep`` once it is offered, even when a cut marker in
    the conversation names the tool; after a real call it finishes."""
    url = upstream.openai_base_url + "/chat/completions"
    grep = {"type": "function", "function": {"name": "ctx_grep", "parameters": {"type": "object"}}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": upstream.task.prompt}]
    for i in range(1, 4):
        _status, body = _post(url, {"model": "m", "messages": messages, "tools": [READ, grep]})
        call = body["choices"][0]["message"]["tool_calls"][0]
        text = upstream.task.path(i).read_text()
        if i == 1:  # the proxy cut it: its marker points to the recall tool
            text = text[:40] + "\n[... cut; ctx_grep finds the rest ...]"
        messages += [body["choices"][0]["message"], {"role": "tool", "tool_call_id": call["id"], "content": text}]
    _status, body = _post(url, {"model": "m", "messages": messages, "tools": [READ, grep]})
    call = body["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "ctx_grep"
    assert upstream.stats["recall_calls"] == 1
    messages += [body["choices"][0]["message"], {"role": "tool", "tool_call_id": call["id"], "content": "nothing"}]
    _status, body = _post(url, {"model": "m", "messages": messages, "tools": [READ, grep]})
    assert body["choices"][0]["message"]["content"].startswith("TASK DONE")
