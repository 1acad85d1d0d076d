"""OpenAI chat completions: ``POST /v1/chat/completions``."""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from .task import Reply
from .validate import Rejection, validate_chat
from .wire import openai_error, split, sse

if TYPE_CHECKING:
    from .server import StrictUpstream


class ChatApi:
    name = "chat"

    def validate(self, up: StrictUpstream, body: dict[str, Any]) -> Rejection | None:
        return validate_chat(body.get("messages") or [])

    def error(self, up: StrictUpstream, reason: str, message: str, tokens: int) -> dict[str, Any]:
        if reason == "over_window":
            message = (
                f"This model's maximum context length is {up.window} tokens. However, your messages resulted in {tokens} tokens. "
                "Please reduce the length of the messages."
            )
            return openai_error(message, "messages", "context_length_exceeded")
        return openai_error(message, "messages", None)

    def build(
        self, up: StrictUpstream, reply: Reply, model: str, tokens: int, body: dict[str, Any]
    ) -> dict[str, Any]:
        cid = f"chatcmpl-{uuid.uuid4().hex[:20]}"
        msg: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.tool:
            call = {
                "id": f"call_strict{uuid.uuid4().hex[:16]}",
                "type": "function",
                "function": {"name": reply.tool, "arguments": json.dumps(reply.args)},
            }
            msg["tool_calls"] = [call]
        return {
            "id": cid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": msg,
                    "finish_reason": "tool_calls" if reply.tool else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": tokens,
                "completion_tokens": 20,
                "total_tokens": tokens + 20,
            },
        }

    def events(self, payload: dict[str, Any], body: dict[str, Any]) -> list[bytes]:
        base = {
            "id": payload["id"],
            "object": "chat.completion.chunk",
            "created": payload["created"],
            "model": payload["model"],
        }
        choice = payload["choices"][0]
        text, calls = choice["message"]["content"], choice["message"].get("tool_calls")

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

        events = [chunk({"role": "assistant", "content": "" if not calls else None})]
        if text:
            events.extend(chunk({"content": piece}) for piece in split(text))
        if calls:
            call = calls[0]
            start = {
                "index": 0,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            events.append(chunk({"tool_calls": [start]}))
            for piece in split(call["function"]["arguments"]):
                events.append(
                    chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                )
        events.append(chunk({}, choice["finish_reason"]))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(sse({**base, "choices": [], "usage": payload["usage"]}))
        events.append(b"data: [DONE]\n\n")
        return events
