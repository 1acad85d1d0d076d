"""The strict upstream's task driven by the official SDKs, through whatever serves the API at a
base URL (``ctxengine proxy``, the LiteLLM proxy, the upstream itself): the client resends its
whole history each turn and reads each file the model asks for with its ``read_file`` tool."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .task import Task
from .tokens import count_request_tokens

__all__ = ["READ_TOOL", "READ_TOOL_ANTHROPIC", "anthropic_task", "openai_task"]

READ_TOOL = {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
READ_TOOL_ANTHROPIC = {"name": "read_file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}


def openai_task(base_url: str, api_key: str, model: str, task: Task, *, headers: Mapping[str, str] | None = None) -> list[int]:
    """``task`` through the OpenAI SDK at ``base_url`` (ending in ``/v1``); the o200k tokens of
    each request the client sent (as the strict upstream counts them)."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, default_headers=dict(headers or {}))
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    sent = []
    for _ in range(task.steps + 3):
        sent.append(count_request_tokens({"messages": messages, "tools": [READ_TOOL]}))
        r = client.chat.completions.create(model=model, messages=messages, tools=[READ_TOOL])  # type: ignore[arg-type, list-item]
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            break
        for call in msg.tool_calls:
            path = Path(json.loads(call.function.arguments)["path"])  # type: ignore[union-attr]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": path.read_text()})
    return sent


def anthropic_task(base_url: str, api_key: str, model: str, task: Task) -> list[int]:
    """``task`` through the Anthropic SDK at ``base_url``, streamed; the tokens of each request."""
    import anthropic

    client = anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    sent = []
    for _ in range(task.steps + 3):
        sent.append(count_request_tokens({"messages": messages, "tools": [READ_TOOL_ANTHROPIC]}))
        with client.messages.stream(model=model, max_tokens=1024, messages=messages, tools=[READ_TOOL_ANTHROPIC]) as stream:  # type: ignore[arg-type, list-item]
            final = stream.get_final_message()
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]})
        uses = [b for b in final.content if b.type == "tool_use"]
        if not uses:
            break
        results = [{"type": "tool_result", "tool_use_id": u.id, "content": Path(str(u.input["path"])).read_text()} for u in uses]
        messages.append({"role": "user", "content": results})
    return sent
