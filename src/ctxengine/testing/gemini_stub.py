"""The Gemini API side of :class:`~ctxengine.testing.stub_server.StubServer`.

``POST /v1beta/models/{model}:generateContent`` (and ``/v1/…``) gets a ``GenerateContentResponse``,
``:streamGenerateContent?alt=sse`` the same split into server-sent events (every event a whole
response, the last one with ``finishReason`` and ``usageMetadata``), ``:countTokens`` a
``{"totalTokens": …}``; errors are Google's ``{"error": {"code", "message", "status"}}``. A reply's
``tool_calls`` become ``functionCall`` parts (with a ``thoughtSignature`` on the first, as Gemini 3
models send). :func:`problem` says what the real API would reject in a request's turns.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctxengine.testing.stub_server import RecordedRequest, StubReply

__all__ = ["body", "contents_text", "error_body", "events", "problem"]

_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


def contents_text(request_body: Mapping[str, Any]) -> str:
    """Every text of a Gemini request (system instruction, contents, function calls and responses)."""
    out = []
    system = request_body.get("systemInstruction")
    contents = list(request_body.get("contents") or [])
    if isinstance(system, Mapping):
        contents.insert(0, system)
    for c in contents:
        for p in c.get("parts") or [] if isinstance(c, Mapping) else []:
            if isinstance(p, Mapping):
                out.append(p["text"] if isinstance(p.get("text"), str) else json.dumps({k: v for k, v in p.items() if k != "thoughtSignature"}))
    return "\n".join(out)


def _usage(reply: StubReply, request: RecordedRequest) -> dict[str, Any]:
    prompt = max(1, len(contents_text(request.body)) // 4)
    out_tokens = len(reply.text or "") // 4 + 10 * len(reply.tool_calls)
    usage: dict[str, Any] = {"promptTokenCount": prompt, "candidatesTokenCount": out_tokens, "totalTokenCount": prompt + out_tokens}
    usage.update(reply.usage)
    return usage


def _parts(reply: StubReply) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"text": reply.text}] if reply.text else []
    for i, call in enumerate(reply.tool_calls):
        part: dict[str, Any] = {"functionCall": {"name": call["name"], "args": call.get("arguments") or {}}}
        if i == 0:
            part["thoughtSignature"] = "c2lnbmF0dXJl"
        parts.append(part)
    return parts


def _finish(reply: StubReply) -> str:
    return "MAX_TOKENS" if reply.finish_reason == "length" else "STOP"


def body(reply: StubReply, request: RecordedRequest, model: str) -> dict[str, Any]:
    """The whole response to a ``generateContent`` request."""
    candidate = {"content": {"role": "model", "parts": _parts(reply)}, "finishReason": _finish(reply), "index": 0}
    return {"candidates": [candidate], "usageMetadata": _usage(reply, request), "modelVersion": model, "responseId": "stub"}


def events(reply: StubReply, request: RecordedRequest, model: str) -> list[bytes]:
    """The events answering a ``streamGenerateContent`` request: the text in pieces, the calls
    whole, the last event with the finish reason and the usage."""
    parts = _parts(reply)
    text = reply.text or ""
    size = max(1, -(-len(text) // max(1, reply.chunks))) if text else 1
    pieces: list[list[dict[str, Any]]] = [[{"text": text[i : i + size]}] for i in range(0, len(text), size)]
    pieces += [[p] for p in parts if "functionCall" in p]
    pieces = pieces or [[{"text": ""}]]
    out = []
    for k, piece in enumerate(pieces):
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": piece}, "index": 0}
        data: dict[str, Any] = {"candidates": [candidate], "modelVersion": model}
        if k == len(pieces) - 1:
            candidate["finishReason"] = _finish(reply)
            data["usageMetadata"] = _usage(reply, request)
        out.append(b"data: " + json.dumps(data).encode() + b"\r\n\r\n")
    return out


def error_body(reply: StubReply) -> dict[str, Any]:
    return {"error": {"code": reply.status, "message": reply.error, "status": _STATUS.get(reply.status, "INTERNAL")}}


def count(request: RecordedRequest) -> dict[str, Any]:
    inner = request.body.get("generateContentRequest")
    source = inner if isinstance(inner, Mapping) else request.body
    return {"totalTokens": max(1, len(contents_text(source)) // 4)}


def problem(request_body: Mapping[str, Any]) -> str | None:
    """What the Gemini API would reject in a request's turns, or None: a function call turn not
    right after a user turn (or a function response turn), not answered by the next turn with
    as many function responses of the same names, or a function response with no call."""
    contents = request_body.get("contents")
    if not isinstance(contents, list) or not contents:
        return "contents must be a non-empty list"
    previous: Mapping[str, Any] = {}
    for i, c in enumerate(contents):
        parts = c.get("parts") or []
        calls = [p["functionCall"].get("name") for p in parts if "functionCall" in p]
        answers = [p["functionResponse"].get("name") for p in parts if "functionResponse" in p]
        asked = [p["functionCall"].get("name") for p in previous.get("parts") or [] if "functionCall" in p]
        if calls and (c.get("role") != "model" or previous.get("role", "user") != "user"):
            return f"contents[{i}]: a function call turn must come right after a user turn or a function response turn"
        if asked and sorted(answers) != sorted(asked):
            return f"contents[{i}]: the function responses {answers} do not answer the calls {asked} of the turn before"
        if answers and not asked:
            return f"contents[{i}]: function responses with no function call turn before them"
        previous = c
    return None
