"""The two chat APIs the proxy speaks, behind one small interface.

Each :class:`Api` knows how to read a request body's conversation as ctxengine messages (the
OpenAI chat form, DESIGN §3.1; Anthropic goes through the lossless
:mod:`ctxengine.anthropic_adapter`), write a working context back into a copy of the body
(every other key untouched), add the engine's tool schemas in its own tool format, find the
model's calls to those tools in a response, build the follow-up request that answers them, and
shape an error the client's SDK understands.

Bodies are never mutated: every ``with_*`` returns a shallow copy with the changed keys.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ctxengine.anthropic_adapter import anthropic_to_openai, openai_to_anthropic
from ctxengine.caching import apply_breakpoints
from ctxengine.messages import Message
from ctxengine.proxy.incoming import Converted
from ctxengine.proxy.state import ProxySession
from ctxengine.proxy.streams import (
    AnthropicStream,
    OpenAIStream,
    StreamEnd,
    StreamTracker,
    failure_event,
)

__all__ = ["ANTHROPIC", "OPENAI", "Api", "Marking", "ToolCall", "anthropic_body", "has_cache_control"]

log = logging.getLogger("ctxengine.proxy")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call the model made: provider id, tool name, parsed arguments."""

    id: str
    name: str
    arguments: dict[str, Any]


def has_cache_control(value: Any) -> bool:
    """Whether ``value`` (a body, a message list, a block …) carries a ``cache_control`` key
    anywhere: the client placed its own breakpoints, so the proxy places none."""
    if isinstance(value, Mapping):
        if "cache_control" in value:
            return True
        return any(has_cache_control(v) for v in value.values() if isinstance(v, (Mapping, list)))
    if isinstance(value, list):
        return any(has_cache_control(v) for v in value if isinstance(v, (Mapping, list)))
    return False


def _loads_args(raw: Any) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, str) and raw.strip():
        try:
            value = json.loads(raw)
        except ValueError:
            return {"input": raw}
        return value if isinstance(value, dict) else {"input": value}
    return {}


@dataclass(frozen=True, slots=True)
class Marking:
    """Where the proxy places cache breakpoints in an outgoing context, and how."""

    indices: Sequence[int]
    cache_ttl: str = "5m"
    native_anthropic: bool = False

    def apply(self, context: Sequence[Message]) -> list[Message]:
        """``context`` with markers at :attr:`indices` (only the marked messages copied)."""
        if not self.indices:
            return list(context)
        return apply_breakpoints(context, self.indices, cache_ttl=self.cache_ttl, native_anthropic=self.native_anthropic, share_unmarked=True)


class Api:
    """What differs between the chat APIs (see the module docstring): one adapter per API.

    Adding an API is adding one subclass: how its body reads as canonical messages and is
    written back, its tool format, its calls and follow-up requests, its usage, errors and
    streamed events, and where its upstream is."""

    name: str = ""
    upstream: str = "openai"
    """Which configured upstream serves it: ``"openai"`` (``proxy.openai_base_url``),
    ``"anthropic"`` (``proxy.anthropic_base_url``) or ``"gemini"`` (``proxy.gemini_base_url``)."""
    unreachable_kind: str = "server_error"
    """The error type of a 502 for an unreachable upstream."""
    usage_marker: bytes = b'"usage"'
    """Bytes only a streamed event carrying usage holds (the plain relay parses only those)."""

    def routed(self, body: Any, path: str, query: bytes = b"") -> Any:
        """The parsed ``body`` with what the request's ``path`` and ``query`` say about it
        (Gemini: the model and the method), as the proxy reads it; written bodies go without it."""
        return body

    def passthrough_reason(self, body: Mapping[str, Any]) -> str | None:
        """Why a well-formed request must go upstream unchanged (the conversation is kept on
        the provider's side, so there is no history to compact), or None."""
        return None

    def system(self, body: Mapping[str, Any]) -> Any:
        """The system prompt kept outside the messages (Anthropic's ``system``), or None."""
        return None

    def as_history(self, messages: list[Message]) -> tuple[Any, Sequence[Any]]:
        """Canonical ``messages`` (a session's record) as this API's ``(system, history)``, the
        form :meth:`system` and :meth:`history` read from a body."""
        return None, messages

    def expands(self, raw: bytes) -> bool:
        """Whether the body (``raw``) holds something :meth:`read` expands (the body must be
        written again even when the context equals what was read)."""
        return False

    def history(self, body: Mapping[str, Any]) -> Sequence[Any]:
        """The request's history as sent, in the API's own form (what tells sessions apart)."""
        return body["messages"]  # type: ignore[no-any-return]

    def read(self, body: Mapping[str, Any], session: ProxySession) -> tuple[list[Message], Converted | None]:
        """The request's conversation as canonical messages (a new list), and, for an API
        converted incrementally (its state kept on ``session``), where each message came from
        (:meth:`write`)."""
        return list(body["messages"]), None

    def write(
        self, body: Mapping[str, Any], session: ProxySession, conv: Converted | None, context: list[Message], changed: bool, marking: Marking
    ) -> tuple[Mapping[str, Any], list[int] | None]:
        """``body`` with ``context`` as its conversation and cache markers placed by
        ``marking`` (``body`` itself when neither changes it), and the indices of the body's
        messages rewritten when only those were (None: unknown, all may have changed)."""
        if changed or marking.indices:
            return self.with_messages(body, marking.apply(context)), None
        return body, None

    def tracker(self, engine_tools: frozenset[str], first_round: bool = True, previous: StreamTracker | None = None) -> StreamTracker:
        """A tracker of this API's streamed response (``previous``: last round's)."""
        raise NotImplementedError

    def closing(self, tracker: StreamTracker) -> bytes:
        """The end of a stream whose last round still called only the engine's tools."""
        raise NotImplementedError

    def stream_end(self) -> StreamEnd:
        """What tells whether a relayed stream of this API reached its proper end."""
        return StreamEnd(self.upstream == "anthropic")

    def stream_failure(self, message: str, tracker: StreamTracker | None = None) -> bytes:
        """The event ending a stream the upstream failed to finish (stalled, cut before its
        last event): the response head (200) is out, so this is how the client learns of it."""
        return failure_event(self.upstream == "anthropic", message)

    def stream_error(self, status: int, content: bytes, tracker: StreamTracker | None = None) -> bytes:
        """An upstream error met in a follow-up round, as an event of the stream under way."""
        try:
            payload = json.loads(content)
        except ValueError:
            payload = self.error(status, content.decode("utf-8", "replace")[:500])
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    def problem(self, body: Any) -> str | None:
        """What makes ``body`` unusable (not an object, no ``messages`` list, no ``model``), or None."""
        if not isinstance(body, dict):
            return f"the request body must be a JSON object, not {type(body).__name__}"
        if not isinstance(body.get("model"), str) or not body["model"]:
            return "'model' is required and must be a string"
        if not isinstance(body.get("messages"), list):
            return "'messages' is required and must be a list"
        return None

    def messages(self, body: Mapping[str, Any]) -> list[Message]:
        raise NotImplementedError

    def with_messages(self, body: Mapping[str, Any], messages: Sequence[Message]) -> dict[str, Any]:
        raise NotImplementedError

    def tool_names(self, body: Mapping[str, Any]) -> set[str]:
        raise NotImplementedError

    def tool_schema(self, openai_tool: Mapping[str, Any]) -> dict[str, Any]:
        """An engine tool (OpenAI ``tools`` format) in this API's format."""
        raise NotImplementedError

    def with_tools(self, body: Mapping[str, Any], openai_tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        out = dict(body)
        out["tools"] = [*list(body.get("tools") or []), *(self.tool_schema(t) for t in openai_tools)]
        return out

    def calls(self, response: Mapping[str, Any]) -> list[ToolCall]:
        raise NotImplementedError

    def assistant_message(self, response: Mapping[str, Any]) -> dict[str, Any]:
        """The response as a message of this API, ready to go back into ``messages``."""
        raise NotImplementedError

    def followup(self, body: Mapping[str, Any], assistant: Mapping[str, Any], results: Sequence[tuple[ToolCall, str]]) -> dict[str, Any]:
        """``body`` plus the assistant turn and the results of its calls to the engine's tools."""
        raise NotImplementedError

    def without_calls(self, response: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
        """``response`` with its calls to ``names`` removed (what the client may see)."""
        raise NotImplementedError

    def usage(self, response: Mapping[str, Any]) -> dict[str, Any] | None:
        u = response.get("usage")
        return dict(u) if isinstance(u, Mapping) else None

    def error(self, status: int, message: str, kind: str | None = None) -> dict[str, Any]:
        raise NotImplementedError


class _OpenAI(Api):
    name = "openai"
    _TYPES: ClassVar[dict[int, str]] = {400: "invalid_request_error", 401: "invalid_api_key", 404: "not_found", 413: "invalid_request_error", 500: "server_error", 502: "server_error"}

    def messages(self, body: Mapping[str, Any]) -> list[Message]:
        return list(body["messages"])

    def tracker(self, engine_tools: frozenset[str], first_round: bool = True, previous: StreamTracker | None = None) -> StreamTracker:
        return OpenAIStream(engine_tools=engine_tools, first_round=first_round)

    def closing(self, tracker: StreamTracker) -> bytes:
        chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\ndata: [DONE]\n\n"

    def with_messages(self, body: Mapping[str, Any], messages: Sequence[Message]) -> dict[str, Any]:
        out = dict(body)
        out["messages"] = list(messages)
        return out

    def tool_names(self, body: Mapping[str, Any]) -> set[str]:
        names: set[str] = set()
        for t in body.get("tools") or []:
            fn = t.get("function") if isinstance(t, Mapping) else None
            if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
                names.add(fn["name"])
        return names

    def tool_schema(self, openai_tool: Mapping[str, Any]) -> dict[str, Any]:
        return dict(openai_tool)

    def _message(self, response: Mapping[str, Any]) -> Mapping[str, Any]:
        choices = response.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
            msg = choices[0].get("message")
            if isinstance(msg, Mapping):
                return msg
        return {}

    def calls(self, response: Mapping[str, Any]) -> list[ToolCall]:
        out = []
        for call in self._message(response).get("tool_calls") or []:
            fn = call.get("function") or {}
            out.append(ToolCall(str(call.get("id", "")), str(fn.get("name", "")), _loads_args(fn.get("arguments"))))
        return out

    def assistant_message(self, response: Mapping[str, Any]) -> dict[str, Any]:
        msg = self._message(response)
        out: dict[str, Any] = {"role": "assistant", "content": msg.get("content")}
        if msg.get("tool_calls"):
            out["tool_calls"] = [dict(c) for c in msg["tool_calls"]]
        for key in ("reasoning_content", "reasoning"):
            if msg.get(key):
                out[key] = msg[key]
        return out

    def followup(self, body: Mapping[str, Any], assistant: Mapping[str, Any], results: Sequence[tuple[ToolCall, str]]) -> dict[str, Any]:
        messages = [*body["messages"], dict(assistant)]
        messages += [{"role": "tool", "tool_call_id": call.id, "content": result} for call, result in results]
        return self.with_messages(body, messages)

    def without_calls(self, response: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
        out = dict(response)
        choices = []
        for choice in response.get("choices") or []:
            choice = dict(choice)
            msg = dict(choice.get("message") or {})
            kept = [c for c in msg.get("tool_calls") or [] if (c.get("function") or {}).get("name") not in names]
            if msg.get("tool_calls") is not None:
                if kept:
                    msg["tool_calls"] = kept
                else:
                    msg.pop("tool_calls")
                    if choice.get("finish_reason") == "tool_calls":
                        choice["finish_reason"] = "stop"
            choice["message"] = msg
            choices.append(choice)
        out["choices"] = choices
        return out

    def error(self, status: int, message: str, kind: str | None = None) -> dict[str, Any]:
        etype = kind or self._TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        return {"error": {"message": message, "type": etype, "param": None, "code": etype}}


class _Anthropic(Api):
    name = "anthropic"
    upstream = "anthropic"
    unreachable_kind = "api_error"
    _TYPES: ClassVar[dict[int, str]] = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 413: "request_too_large", 500: "api_error", 502: "api_error"}

    def messages(self, body: Mapping[str, Any]) -> list[Message]:
        return anthropic_to_openai(body.get("system"), body["messages"])

    def system(self, body: Mapping[str, Any]) -> Any:
        return body.get("system")

    def as_history(self, messages: list[Message]) -> tuple[Any, Sequence[Any]]:
        return openai_to_anthropic(messages)

    def read(self, body: Mapping[str, Any], session: ProxySession) -> tuple[list[Message], Converted | None]:
        conv = session.incoming.from_anthropic(body.get("system"), body["messages"])
        return conv.messages, conv

    def write(
        self, body: Mapping[str, Any], session: ProxySession, conv: Converted | None, context: list[Message], changed: bool, marking: Marking
    ) -> tuple[Mapping[str, Any], list[int] | None]:
        """Only what changed is converted: markers alone are written into the messages that
        own them (:meth:`IncomingHistory.with_markers`); a context that differs from the
        history (every turn after a compaction) is converted from its first change on."""
        incoming = session.incoming
        if conv is None:
            return super().write(body, session, conv, context, changed, marking)
        if marking.indices and not changed:
            try:
                return incoming.with_markers(body, conv, context, marking.indices, cache_ttl=marking.cache_ttl, native_anthropic=marking.native_anthropic)
            except (ValueError, KeyError, IndexError) as exc:
                log.debug("marker write-back fell back to a full conversion: %s", exc)
                return self.with_messages(body, marking.apply(context)), None
        if not changed:
            return body, None
        system, messages = incoming.outgoing_anthropic(context, marking.indices, cache_ttl=marking.cache_ttl, native_anthropic=marking.native_anthropic)
        return anthropic_body(body, system, messages), None

    def tracker(self, engine_tools: frozenset[str], first_round: bool = True, previous: StreamTracker | None = None) -> StreamTracker:
        offset = previous.client_blocks if isinstance(previous, AnthropicStream) else 0
        return AnthropicStream(engine_tools=engine_tools, first_round=first_round, index_offset=offset)

    def closing(self, tracker: StreamTracker) -> bytes:
        delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 0}}
        return (
            b"event: message_delta\ndata: "
            + json.dumps(delta, separators=(",", ":")).encode()
            + b'\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n'
        )

    def stream_error(self, status: int, content: bytes, tracker: StreamTracker | None = None) -> bytes:
        try:
            payload = json.loads(content)
        except ValueError:
            payload = self.error(status, content.decode("utf-8", "replace")[:500])
        return b"event: error\ndata: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    def with_messages(self, body: Mapping[str, Any], messages: Sequence[Message]) -> dict[str, Any]:
        return anthropic_body(body, *openai_to_anthropic(messages))

    def tool_names(self, body: Mapping[str, Any]) -> set[str]:
        return {t["name"] for t in body.get("tools") or [] if isinstance(t, Mapping) and isinstance(t.get("name"), str)}

    def tool_schema(self, openai_tool: Mapping[str, Any]) -> dict[str, Any]:
        fn = openai_tool.get("function") or openai_tool
        out = {"name": fn["name"], "input_schema": fn.get("parameters") or {"type": "object", "properties": {}}}
        if fn.get("description"):
            out["description"] = fn["description"]
        return out

    def calls(self, response: Mapping[str, Any]) -> list[ToolCall]:
        return [
            ToolCall(str(b.get("id", "")), str(b.get("name", "")), _loads_args(b.get("input")))
            for b in response.get("content") or []
            if isinstance(b, Mapping) and b.get("type") == "tool_use"
        ]

    def assistant_message(self, response: Mapping[str, Any]) -> dict[str, Any]:
        return {"role": "assistant", "content": [dict(b) for b in response.get("content") or []]}

    def followup(self, body: Mapping[str, Any], assistant: Mapping[str, Any], results: Sequence[tuple[ToolCall, str]]) -> dict[str, Any]:
        blocks = [{"type": "tool_result", "tool_use_id": call.id, "content": result} for call, result in results]
        out = dict(body)
        out["messages"] = [*body["messages"], dict(assistant), {"role": "user", "content": blocks}]
        return out

    def without_calls(self, response: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
        out = dict(response)
        content = [b for b in response.get("content") or [] if not (isinstance(b, Mapping) and b.get("type") == "tool_use" and b.get("name") in names)]
        out["content"] = content
        if out.get("stop_reason") == "tool_use" and not any(isinstance(b, Mapping) and b.get("type") == "tool_use" for b in content):
            out["stop_reason"] = "end_turn"
        return out

    def error(self, status: int, message: str, kind: str | None = None) -> dict[str, Any]:
        etype = kind or self._TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
        return {"type": "error", "error": {"type": etype, "message": message}}


def anthropic_body(body: Mapping[str, Any], system: Any, messages: list[Any]) -> dict[str, Any]:
    """An Anthropic ``body`` with the history ``(system, messages)`` (:func:`openai_to_anthropic`'s result)."""
    out = dict(body)
    out["messages"] = messages
    if system is None:
        out.pop("system", None)
    else:
        out["system"] = system
    return out


OPENAI: Api = _OpenAI()
ANTHROPIC: Api = _Anthropic()
