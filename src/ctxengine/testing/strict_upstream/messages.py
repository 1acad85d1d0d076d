"""Anthropic Messages: ``POST /v1/messages``."""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from .task import Reply
from .validate import Rejection, thinking_enabled, validate_messages
from .wire import anthropic_error, split, sse

if TYPE_CHECKING:
    from .server import StrictUpstream


class MessagesApi:
    name = "messages"

    def validate(self, up: StrictUpstream, body: dict[str, Any]) -> Rejection | None:
        return validate_messages(body, up.sign)

    def error(self, up: StrictUpstream, reason: str, message: str, tokens: int) -> dict[str, Any]:
        if reason == "over_window":
            message = f"prompt is too long: {tokens} tokens > {up.window} maximum"
        return anthropic_error(message)

    def build(
        self, up: StrictUpstream, reply: Reply, model: str, tokens: int, body: dict[str, Any]
    ) -> dict[str, Any]:
        mid = f"msg_strict{uuid.uuid4().hex[:16]}"
        blocks: list[dict[str, Any]] = []
        if thinking_enabled(body):
            thought = f"Step planning {uuid.uuid4().hex[:8]}: read the next file."
            blocks.append({"type": "thinking", "thinking": thought, "signature": up.sign(thought)})
        if reply.text:
            blocks.append({"type": "text", "text": reply.text})
        if reply.tool:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_strict{uuid.uuid4().hex[:16]}",
                    "name": reply.tool,
                    "input": reply.args,
                }
            )
        return {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": "tool_use" if reply.tool else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": tokens,
                "output_tokens": 20,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }

    def events(self, payload: dict[str, Any], body: dict[str, Any]) -> list[bytes]:
        start = {
            **payload,
            "content": [],
            "stop_reason": None,
            "usage": {**payload["usage"], "output_tokens": 1},
        }
        events = [sse({"type": "message_start", "message": start}, "message_start")]
        for i, b in enumerate(payload["content"]):
            events.extend(_block_events(i, b))
            events.append(sse({"type": "content_block_stop", "index": i}, "content_block_stop"))
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": payload["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": 20},
        }
        events.append(sse(delta, "message_delta"))
        events.append(sse({"type": "message_stop"}, "message_stop"))
        return events


def _block_events(i: int, b: dict[str, Any]) -> list[bytes]:
    """content_block_start and the deltas of block ``i`` (without its content_block_stop)."""
    if b["type"] == "thinking":
        first: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            {"type": "thinking_delta", "thinking": b["thinking"]},
            {"type": "signature_delta", "signature": b["signature"]},
        ]
    elif b["type"] == "text":
        first = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": piece} for piece in split(b["text"])]
    else:
        first = {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}
        deltas = [
            {"type": "input_json_delta", "partial_json": piece}
            for piece in split(json.dumps(b["input"]))
        ]
    events = [
        sse(
            {"type": "content_block_start", "index": i, "content_block": first},
            "content_block_start",
        )
    ]
    events.extend(
        sse({"type": "content_block_delta", "index": i, "delta": d}, "content_block_delta")
        for d in deltas
    )
    return events
