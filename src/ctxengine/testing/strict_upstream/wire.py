"""Wire pieces the three APIs share: an SSE event, a text split into stream deltas, and the
providers' two 400 body shapes."""

from __future__ import annotations

import json
import uuid
from typing import Any


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + json.dumps(data) + "\n\n").encode()


def split(text: str, n: int = 3) -> list[str]:
    """``text`` in about ``n`` pieces (one empty piece for an empty text)."""
    if not text:
        return [""]
    size = max(1, len(text) // n + 1)
    return [text[i : i + size] for i in range(0, len(text), size)]


def openai_error(message: str, param: str, code: str | None) -> dict[str, Any]:
    """OpenAI's 400 body (chat completions and Responses)."""
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": code,
        }
    }


def anthropic_error(message: str) -> dict[str, Any]:
    """Anthropic's 400 body."""
    return {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
        "request_id": f"req_{uuid.uuid4().hex[:24]}",
    }
