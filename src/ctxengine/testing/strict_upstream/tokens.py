"""The window count: o200k tokens over system/instructions, messages/input and tool definitions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

_ENC: Any = None


def encoding() -> Any:
    """The o200k encoding, loaded once."""
    global _ENC
    if _ENC is None:
        from ctxengine.tokens import _load_encoding

        _ENC = _load_encoding("o200k_base")
    return _ENC


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            if k in (
                "signature",
                "encrypted_content",
                "cache_control",
                "id",
                "call_id",
                "tool_call_id",
                "tool_use_id",
                "type",
                "role",
                "status",
            ):
                continue
            if k == "data" and value.get("type") == "redacted_thinking":
                continue
            if k in ("source", "image_url") and not isinstance(v, str):
                yield "[image]" * 200  # ~ a small image
                continue
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def count_request_tokens(body: dict[str, Any]) -> int:
    """o200k tokens of a request: system/instructions, messages/input and tool definitions."""
    enc = encoding()
    parts: list[str] = []
    items: list[Any] = []
    for key in ("system", "instructions"):
        if body.get(key):
            parts.extend(_strings(body[key]))
    for key in ("messages", "input"):
        value = body.get(key)
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, list):
            items.extend(value)
    for item in items:
        parts.extend(_strings(item))
    tools = body.get("tools") or []
    n = sum(len(enc.encode(p, disallowed_special=())) for p in parts) + 3 * len(items)
    if tools:  # the list as compact JSON, non-ASCII kept (how ctxengine's window counts them)
        text = json.dumps(tools, ensure_ascii=False, separators=(",", ":"))
        n += len(enc.encode(text, disallowed_special=()))
    return n
