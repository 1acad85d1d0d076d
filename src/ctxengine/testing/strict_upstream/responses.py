"""OpenAI Responses: ``POST /v1/responses``. Each reply carries a reasoning item this server
signs and remembers, so a later request that alters or drops it is rejected."""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from .task import Reply
from .validate import Rejection, reasoning_summary, validate_responses
from .wire import openai_error, split, sse

if TYPE_CHECKING:
    from .server import StrictUpstream


class ResponsesApi:
    name = "responses"

    def validate(self, up: StrictUpstream, body: dict[str, Any]) -> Rejection | None:
        return validate_responses(body.get("input") or [], up._reasoning, up._call_reasoning)

    def error(self, up: StrictUpstream, reason: str, message: str, tokens: int) -> dict[str, Any]:
        if reason == "over_window":
            message = "Your input exceeds the context window of this model. Please adjust your input and try again."
            return openai_error(message, "input", "context_length_exceeded")
        return openai_error(message, "input", None)

    def build(
        self, up: StrictUpstream, reply: Reply, model: str, tokens: int, body: dict[str, Any]
    ) -> dict[str, Any]:
        rid = f"resp_strict{uuid.uuid4().hex[:16]}"
        return {
            "id": rid,
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": model,
            "output": _output(up, reply),
            "usage": {
                "input_tokens": tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 20,
                "output_tokens_details": {"reasoning_tokens": 10},
                "total_tokens": tokens + 20,
            },
            "parallel_tool_calls": False,
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "metadata": {},
            "temperature": 1.0,
            "top_p": 1.0,
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "store": body.get("store", True),
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "output_text": reply.text or "",
        }

    def events(self, payload: dict[str, Any], body: dict[str, Any]) -> list[bytes]:
        out = _Events()
        start = {**payload, "status": "in_progress", "output": [], "usage": None}
        out.add("response.created", {"response": start})
        out.add("response.in_progress", {"response": start})
        for idx, it in enumerate(payload["output"]):
            if it["type"] == "reasoning":
                _reasoning_events(out, idx, it)
            elif it["type"] == "message":
                _message_events(out, idx, it)
            elif it["type"] == "function_call":
                _call_events(out, idx, it)
            else:
                out.add(
                    "response.output_item.added",
                    {"output_index": idx, "item": {**it, "status": "in_progress"}},
                )
            out.add("response.output_item.done", {"output_index": idx, "item": it})
        out.add("response.completed", {"response": payload})
        return out.events


def _output(up: StrictUpstream, reply: Reply) -> list[dict[str, Any]]:
    """The output items: a signed reasoning item, then the text and/or the tool call."""
    reasoning_id = f"rs_strict{uuid.uuid4().hex[:16]}"
    summary = reasoning_summary(reasoning_id)
    enc = up.sign(reasoning_id + summary)
    up._reasoning[reasoning_id] = enc
    items: list[dict[str, Any]] = [
        {
            "id": reasoning_id,
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": summary}],
            "encrypted_content": enc,
        }
    ]
    if reply.text:
        items.append(
            {
                "id": f"msg_strict{uuid.uuid4().hex[:16]}",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        )
    if reply.tool:
        fid = f"fc_strict{uuid.uuid4().hex[:16]}"
        up._call_reasoning[fid] = reasoning_id
        call_id = f"call_strict{uuid.uuid4().hex[:16]}"
        item: dict[str, Any] = {"id": fid, "type": "", "status": "completed", "call_id": call_id}
        if reply.tool_kind == "local_shell":
            item["type"] = "local_shell_call"
            item["action"] = {"type": "exec", "command": reply.args["command"], "env": {}}
        else:
            item["type"] = "function_call"
            item["name"] = reply.tool
            item["arguments"] = json.dumps(reply.args)
        items.append(item)
    return items


class _Events:
    """Responses' SSE events, numbered in order."""

    def __init__(self) -> None:
        self.events: list[bytes] = []

    def add(self, kind: str, data: dict[str, Any]) -> None:
        self.events.append(sse({"type": kind, "sequence_number": len(self.events), **data}, kind))


def _reasoning_events(out: _Events, idx: int, it: dict[str, Any]) -> None:
    summary = it["summary"][0]["text"]
    at = {"item_id": it["id"], "output_index": idx, "summary_index": 0}
    out.add("response.output_item.added", {"output_index": idx, "item": {**it, "summary": []}})
    out.add(
        "response.reasoning_summary_part.added",
        {**at, "part": {"type": "summary_text", "text": ""}},
    )
    out.add("response.reasoning_summary_text.delta", {**at, "delta": summary})
    out.add("response.reasoning_summary_text.done", {**at, "text": summary})
    out.add(
        "response.reasoning_summary_part.done",
        {**at, "part": {"type": "summary_text", "text": summary}},
    )


def _message_events(out: _Events, idx: int, it: dict[str, Any]) -> None:
    text = it["content"][0]["text"]
    at = {"item_id": it["id"], "output_index": idx, "content_index": 0}
    out.add(
        "response.output_item.added",
        {"output_index": idx, "item": {**it, "status": "in_progress", "content": []}},
    )
    out.add(
        "response.content_part.added",
        {**at, "part": {"type": "output_text", "text": "", "annotations": []}},
    )
    for piece in split(text):
        out.add("response.output_text.delta", {**at, "delta": piece, "logprobs": []})
    out.add("response.output_text.done", {**at, "text": text, "logprobs": []})
    out.add(
        "response.content_part.done",
        {**at, "part": {"type": "output_text", "text": text, "annotations": []}},
    )


def _call_events(out: _Events, idx: int, it: dict[str, Any]) -> None:
    at = {"item_id": it["id"], "output_index": idx}
    out.add(
        "response.output_item.added",
        {"output_index": idx, "item": {**it, "status": "in_progress", "arguments": ""}},
    )
    for piece in split(it["arguments"]):
        out.add("response.function_call_arguments.delta", {**at, "delta": piece})
    out.add("response.function_call_arguments.done", {**at, "arguments": it["arguments"]})
