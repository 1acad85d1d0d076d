"""The Responses API through the proxy, driven the way Codex and the Agents SDK drive it (the
official SDK, ``store: false``, the whole history resent as items each turn, reasoning items
with ``encrypted_content`` sent back), against the strict scripted upstream, which rejects an
invalid request, an altered reasoning item or one over the window as the provider does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest
from tests.test_proxy import metric

from ctxengine.config import Config
from ctxengine.proxy import SESSION_HEADER, ProxyServer
from ctxengine.proxy.responses import COMPACTION_PREFIX
from ctxengine.testing.strict_upstream import StrictUpstream, Task

READ = {"type": "function", "name": "read_file", "description": "Read a file.", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
WINDOW = 16_000


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[StrictUpstream]:
    task = Task(tmp_path / "ws", steps=10, file_tokens=3000)
    task.write()
    with StrictUpstream(task, window=WINDOW, log_path=tmp_path / "upstream.jsonl") as up:
        yield up


def _proxy(up: StrictUpstream, tmp_path: Path) -> ProxyServer:
    cfg = Config().with_overrides(
        proxy={"openai_base_url": up.openai_base_url, "anthropic_base_url": up.anthropic_base_url},
        store={"path": str(tmp_path / "sessions.db")},
        models={"bench-model": {"context_length": WINDOW}},
    )
    return ProxyServer(cfg)


def _run(client: openai.OpenAI, up: StrictUpstream, stream: bool) -> tuple[int, list[Any]]:
    """The agent loop: returns the input items' size the client sent in all, and its history."""
    items: list[Any] = [{"role": "developer", "content": "You are a coding agent."}, {"role": "user", "content": up.task.prompt}]
    sent = 0
    for _ in range(up.task.steps + 3):
        body = {"model": "bench-model", "input": items, "tools": [READ], "store": False, "include": ["reasoning.encrypted_content"]}
        sent += len(json.dumps(items))
        if stream:
            final = None
            for event in client.responses.create(**body, stream=True):  # type: ignore[call-overload]
                if event.type == "response.completed":
                    final = event.response
            assert final is not None
            output = [o.model_dump(exclude_none=True) for o in final.output]
        else:
            output = [o.model_dump(exclude_none=True) for o in client.responses.create(**body).output]  # type: ignore[call-overload]
        items += output
        calls = [o for o in output if o["type"] == "function_call"]
        if not calls:
            break
        for call in calls:
            path = json.loads(call["arguments"])["path"]
            items.append({"type": "function_call_output", "call_id": call["call_id"], "output": Path(path).read_text()})
    return sent, items


@pytest.mark.parametrize("stream", [False, True])
def test_a_responses_agent_finishes_in_a_small_window_with_valid_requests(upstream: StrictUpstream, tmp_path: Path, stream: bool) -> None:
    with _proxy(upstream, tmp_path) as p:
        client = openai.OpenAI(base_url=p.openai_base_url, api_key="sk-test", max_retries=0, default_headers={SESSION_HEADER: f"codex-{stream}"})
        sent, items = _run(client, upstream, stream)
        # every stream reached its terminal event (an incomplete one gets an error event)
        assert metric(p, "ctxengine_proxy_requests_total", api="responses", outcome="upstream_error") == 0
        assert metric(p, "ctxengine_proxy_requests_total", api="responses", outcome="ok") >= upstream.task.steps
    stats = upstream.stats
    assert stats["finished"] and not stats["rejected"] and stats["over_window"] == 0
    assert stats["max_tokens_seen"] <= WINDOW
    assert stats["steps_seen"] == set(range(1, upstream.task.steps + 1))
    # the proxy sent far less than the client's history: ~30K tokens of files in a 16K window
    assert sum(len(json.dumps(i)) for i in items) > 2 * WINDOW * 4
    saved = 1 - stats["input_tokens"] * 4 / sent  # the upstream's exact count against the client's bytes / 4
    print(f"input saved: {saved:.0%}")
    assert saved >= 0.5


def test_remote_compaction_is_answered_by_the_proxy_and_expanded_later(upstream: StrictUpstream, tmp_path: Path) -> None:
    with _proxy(upstream, tmp_path) as p:
        client = openai.OpenAI(base_url=p.openai_base_url, api_key="sk-test", max_retries=0, default_headers={SESSION_HEADER: "codex-compact"})
        upstream.task.steps = 3
        _, items = _run(client, upstream, False)
        before = upstream.stats["requests"]
        r = httpx.post(p.openai_base_url + "/responses/compact", json={"model": "bench-model", "input": items, "instructions": ""}, headers={SESSION_HEADER: "codex-compact", "authorization": "Bearer sk-test"})
        assert r.status_code == 200, r.text
        reply = r.json()
        assert reply["object"] == "response.compaction" and upstream.stats["requests"] == before  # answered here
        (item,) = reply["output"]
        assert item["type"] == "compaction" and item["encrypted_content"].startswith(COMPACTION_PREFIX)
        # the client replaces its history with the output; the next request is expanded, valid
        history = [{"role": "developer", "content": "You are a coding agent."}, item, {"role": "user", "content": "what were the codes?"}]
        out = client.responses.create(model="bench-model", input=history, tools=[READ], store=False)  # type: ignore[arg-type]
        assert out.output and not upstream.stats["rejected"]
        last = [json.loads(line) for line in (tmp_path / "upstream.jsonl").read_text().splitlines()][-1]
        assert COMPACTION_PREFIX not in json.dumps(last)  # the upstream never sees our token


def test_a_request_with_its_history_on_the_server_passes_through(upstream: StrictUpstream, tmp_path: Path) -> None:
    with _proxy(upstream, tmp_path) as p:
        body = {"model": "bench-model", "input": [{"role": "user", "content": "hello"}], "previous_response_id": "resp_123"}
        r = httpx.post(p.openai_base_url + "/responses", json=body, headers={"authorization": "Bearer sk-test"})
        assert r.status_code in (200, 400)
        last = [json.loads(line) for line in (tmp_path / "upstream.jsonl").read_text().splitlines()][-1]
        assert json.dumps(last).count("resp_123") >= 1
