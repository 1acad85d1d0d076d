"""The Gemini API (``POST /v1beta/models/{model}:generateContent``, ``:streamGenerateContent``,
``:countTokens``; ``/v1/models/…`` too) as an :class:`~ctxengine.proxy.apis.Api`.

A Gemini request names its model and method in its path, not its body; :meth:`GeminiApi.routed`
puts them into the parsed body under two keys of the proxy's own (``model``, ``stream``), and
every body written for the upstream goes without them: the client's untouched bytes, or a body
written by :meth:`GeminiApi.write`. The conversation (``systemInstruction`` + ``contents``) is
read and written losslessly by :mod:`ctxengine.proxy.gemini_convert`; the tool definitions
(``tools[].functionDeclarations``) are counted in the window like any API's; the engine's recall
tools are added as function declarations and answered by the proxy. A streamed response
(``?alt=sse``: every event a whole ``GenerateContentResponse``) is followed by
:class:`GeminiStream`. Usage is ``usageMetadata``; errors are Google's
``{"error": {"code", "message", "status"}}``.

The key: ``x-goog-api-key`` goes upstream as sent; a ``?key=`` in the query is moved into that
header as the request comes in (:func:`key_into_scope`), so no URL the proxy builds, sends or
could log holds it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

from ctxengine.messages import Message
from ctxengine.proxy import gemini_convert
from ctxengine.proxy.apis import Api, Marking, ToolCall, _loads_args
from ctxengine.proxy.incoming import Converted
from ctxengine.proxy.sse import Event, StreamEnd, StreamTracker
from ctxengine.proxy.state import ProxySession

__all__ = ["GEMINI", "METHODS", "GeminiApi", "GeminiStream", "count_body", "key_into_scope", "key_to_header", "split_target"]

METHODS = ("generateContent", "streamGenerateContent", "countTokens")
_ROUTE = "ctxengine:route"  # marks a body whose model and stream keys the proxy put there
_STATUS: dict[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    426: "FAILED_PRECONDITION",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def split_target(target: str) -> tuple[str, str] | None:
    """``("gemini-2.5-flash", "streamGenerateContent")`` of a path's last segment
    ``gemini-2.5-flash:streamGenerateContent``; None when it names no method."""
    model, sep, method = target.rpartition(":")
    return (model, method) if sep and model and method else None


def key_to_header(query: str, headers: dict[str, str]) -> str:
    """``query`` without its ``key=`` parameter, which goes into ``headers`` as
    ``x-goog-api-key`` (unless the client sent that header too: its header wins)."""
    if "key=" not in query:
        return query
    pairs = parse_qsl(query, keep_blank_values=True)
    keys = [v for k, v in pairs if k == "key"]
    if keys and not any(k.lower() == "x-goog-api-key" for k in headers):
        headers["x-goog-api-key"] = keys[0]
    return urlencode([(k, v) for k, v in pairs if k != "key"])


def key_into_scope(scope: MutableMapping[str, Any]) -> None:
    """Move a request's ``?key=`` into its ``x-goog-api-key`` header, in the ASGI ``scope``
    itself, before anything reads the request: from then on the key is a header like any
    client's (forwarded, digested into a derived session id, never in a URL)."""
    query = scope.get("query_string", b"").decode("latin-1")
    found: dict[str, str] = {}
    rest = key_to_header(query, found)
    if rest == query:
        return
    scope["query_string"] = rest.encode("latin-1")
    headers = list(scope.get("headers") or [])
    if found and not any(k.lower() == b"x-goog-api-key" for k, _ in headers):
        headers.append((b"x-goog-api-key", found["x-goog-api-key"].encode("latin-1")))
    scope["headers"] = headers


def _without_route(body: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(body)
    if out.pop(_ROUTE, None) is not None:
        out.pop("model", None)
        out.pop("stream", None)
    return out


def _parts(response: Mapping[str, Any]) -> list[Any]:
    candidates = response.get("candidates")
    if isinstance(candidates, list) and candidates and isinstance(candidates[0], Mapping):
        content = candidates[0].get("content")
        if isinstance(content, Mapping) and isinstance(content.get("parts"), list):
            return list(content["parts"])
    return []


def _calls(parts: Sequence[Any], round_tag: str) -> list[ToolCall]:
    out = []
    for j, part in enumerate(parts):
        fc = part.get("functionCall") if isinstance(part, Mapping) else None
        if isinstance(fc, Mapping):
            cid = fc.get("id") if isinstance(fc.get("id"), str) and fc.get("id") else f"gemini_{round_tag}_{j}"
            out.append(ToolCall(str(cid), str(fc.get("name", "")), _loads_args(fc.get("args"))))
    return out


class GeminiApi(Api):
    """The Gemini API's adapter (:data:`GEMINI`; see the module docstring)."""

    name = "gemini"
    upstream = "gemini"
    unreachable_kind = "UNAVAILABLE"
    usage_marker = b'"usageMetadata"'

    def routed(self, body: Any, path: str, query: bytes = b"") -> Any:
        """``body`` with the model and the streaming its ``path`` names (another body as is). A
        stream without ``alt=sse`` is one JSON array: relayed whole, unchanged (the value of
        the proxy's key says so)."""
        if not isinstance(body, dict):
            return body
        target = split_target(path.rsplit("/", 1)[-1])
        if target is None:
            return body
        streamed = target[1] == "streamGenerateContent"
        sse = b"alt=sse" in query
        return {**body, "model": target[0], "stream": streamed and sse, _ROUTE: "json-array" if streamed and not sse else True}

    def problem(self, body: Any) -> str | None:
        if not isinstance(body, dict):
            return f"the request body must be a JSON object, not {type(body).__name__}"
        if not isinstance(body.get("model"), str) or not body["model"]:
            return "the path must name a model and a method: /v1beta/models/{model}:generateContent"
        if not isinstance(body.get("contents"), list):
            return "'contents' is required and must be a list"
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            return f"'tools' must be a list, not {type(tools).__name__}"
        return gemini_convert.problem(body)

    def passthrough_reason(self, body: Mapping[str, Any]) -> str | None:
        """A request naming a ``cachedContent`` keeps part of its history on the server (what
        the proxy would count and compact is not all there is), and a stream without
        ``alt=sse`` is one JSON array (no events to follow): either goes upstream unchanged."""
        if body.get(_ROUTE) == "json-array":
            return "streamGenerateContent without alt=sse: a JSON array, relayed whole"
        return "cachedContent: part of the history is stored on the server" if body.get("cachedContent") or body.get("cached_content") else None

    def system(self, body: Mapping[str, Any]) -> Any:
        system = body.get("systemInstruction", body.get("system_instruction"))
        if isinstance(system, Mapping):
            return gemini_convert._content_text(system.get("parts")) or None
        return system if isinstance(system, str) and system else None

    def as_history(self, messages: list[Message]) -> tuple[Any, Sequence[Any]]:
        body = gemini_convert.write({}, messages)
        return self.system(body), body["contents"]

    def history(self, body: Mapping[str, Any]) -> Sequence[Any]:
        return body["contents"]  # type: ignore[no-any-return]

    def read(self, body: Mapping[str, Any], session: ProxySession) -> tuple[list[Message], Converted | None]:
        """The session's :class:`~ctxengine.proxy.gemini_convert.History` converts only the
        contents new since last turn."""
        if not isinstance(session.converter, gemini_convert.History):
            session.converter = gemini_convert.History()
        return session.converter.read(body), None

    def write(
        self, body: Mapping[str, Any], session: ProxySession, conv: Converted | None, context: list[Message], changed: bool, marking: Marking
    ) -> tuple[Mapping[str, Any], list[int] | None]:
        """The body with ``context`` (Gemini caches prefixes by itself: no breakpoints)."""
        if not changed:
            return body, None
        memo = session.converter.written if isinstance(session.converter, gemini_convert.History) else None
        return gemini_convert.write(_without_route(body), context, memo), None

    def messages(self, body: Mapping[str, Any]) -> list[Message]:
        return gemini_convert.read(body)

    def with_messages(self, body: Mapping[str, Any], messages: Sequence[Message]) -> dict[str, Any]:
        return gemini_convert.write(_without_route(body), messages)

    def tool_names(self, body: Mapping[str, Any]) -> set[str]:
        names: set[str] = set()
        for tool in body.get("tools") or []:
            decls = tool.get("functionDeclarations", tool.get("function_declarations")) if isinstance(tool, Mapping) else None
            for d in decls or []:
                if isinstance(d, Mapping) and isinstance(d.get("name"), str):
                    names.add(d["name"])
        return names

    def tool_schema(self, openai_tool: Mapping[str, Any]) -> dict[str, Any]:
        fn = openai_tool.get("function") or openai_tool
        out: dict[str, Any] = {"name": fn["name"]}
        if fn.get("description"):
            out["description"] = fn["description"]
        out["parametersJsonSchema"] = fn.get("parameters") or {"type": "object", "properties": {}}
        return out

    def with_tools(self, body: Mapping[str, Any], openai_tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The engine's tools as function declarations: added to the client's tool that declares
        functions (the API takes one such tool), else as a tool of their own."""
        out = _without_route(body)
        tools = list(out.get("tools") or [])
        decls = [self.tool_schema(t) for t in openai_tools]
        for i, tool in enumerate(tools):
            if isinstance(tool, Mapping):
                key = "function_declarations" if "function_declarations" in tool else "functionDeclarations"
                if isinstance(tool.get(key), list):
                    tools[i] = {**tool, key: [*tool[key], *decls]}
                    break
        else:
            tools.append({"functionDeclarations": decls})
        out["tools"] = tools
        return out

    def calls(self, response: Mapping[str, Any]) -> list[ToolCall]:
        return _calls(_parts(response), "r")

    def assistant_message(self, response: Mapping[str, Any]) -> dict[str, Any]:
        return {"role": "model", "parts": _parts(response)}

    def followup(self, body: Mapping[str, Any], assistant: Mapping[str, Any], results: Sequence[tuple[ToolCall, str]]) -> dict[str, Any]:
        answers = []
        for call, result in results:
            fr: dict[str, Any] = {"name": call.name, "response": {"output": result}}
            if not call.id.startswith("gemini_"):
                fr["id"] = call.id
            answers.append({"functionResponse": fr})
        out = _without_route(body)
        out["contents"] = [*body["contents"], dict(assistant), {"role": "user", "parts": answers}]
        return out

    def without_calls(self, response: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
        out = dict(response)
        candidates = []
        for cand in response.get("candidates") or []:
            if isinstance(cand, Mapping) and isinstance(cand.get("content"), Mapping):
                parts = [p for p in cand["content"].get("parts") or [] if not (isinstance(p, Mapping) and (p.get("functionCall") or {}).get("name") in names)]
                cand = {**cand, "content": {**cand["content"], "parts": parts or [{"text": ""}]}}
            candidates.append(cand)
        if "candidates" in response:
            out["candidates"] = candidates
        return out

    def usage(self, response: Mapping[str, Any]) -> dict[str, Any] | None:
        """``usageMetadata`` (``promptTokenCount``, ``cachedContentTokenCount``,
        ``candidatesTokenCount`` …): :func:`ctxengine.engine.normalize_usage` reads it."""
        u = response.get("usageMetadata")
        return dict(u) if isinstance(u, Mapping) else None

    def error(self, status: int, message: str, kind: str | None = None) -> dict[str, Any]:
        status_name = kind if kind and kind.isupper() else _STATUS.get(status, "INVALID_ARGUMENT" if status < 500 else "INTERNAL")
        return {"error": {"code": status, "message": message, "status": status_name}}

    def tracker(self, engine_tools: frozenset[str], first_round: bool = True, previous: StreamTracker | None = None) -> StreamTracker:
        rounds = previous.rounds + 1 if isinstance(previous, GeminiStream) else 0
        return GeminiStream(engine_tools=engine_tools, first_round=first_round, rounds=rounds)

    def closing(self, tracker: StreamTracker) -> bytes:
        last = {"candidates": [{"content": {"role": "model", "parts": [{"text": ""}]}, "finishReason": "STOP", "index": 0}]}
        if tracker.usage:
            last["usageMetadata"] = tracker.usage  # type: ignore[assignment]
        return _event(last)

    def stream_end(self) -> StreamEnd:
        return GeminiStreamEnd(False)

    def stream_failure(self, message: str, tracker: StreamTracker | None = None) -> bytes:
        return _event(self.error(502, message))

    def stream_error(self, status: int, content: bytes, tracker: StreamTracker | None = None) -> bytes:
        try:
            payload = json.loads(content)
        except ValueError:
            payload = self.error(status, content.decode("utf-8", "replace")[:500])
        return _event(payload)


def _event(data: Any) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\r\n\r\n"


class GeminiStreamEnd(StreamEnd):
    """A Gemini stream's proper end: its last event carries a ``finishReason`` (or is an error)."""

    @property
    def complete(self) -> bool:
        events = [e for e in self._tail.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]
        return bool(events) and (b'"finishReason"' in events[-1] or b'"error"' in events[-1][:40])


@dataclass
class GeminiStream(StreamTracker):
    """A ``streamGenerateContent`` stream (``?alt=sse``): each event a response whose
    ``candidates[0].content.parts`` continue the turn (a function call arrives whole), the last
    one with a ``finishReason``; ``usageMetadata`` as it stands so far."""

    rounds: int = 0
    parts: list[Any] = field(default_factory=list)

    def feed(self, event: Event) -> None:
        data = event.data
        if not isinstance(data, dict):
            return
        if isinstance(data.get("usageMetadata"), dict):
            self.usage = data["usageMetadata"]
        self.parts += _parts(data)
        for cand in data.get("candidates") or []:
            if isinstance(cand, Mapping) and cand.get("finishReason"):
                self.finished = True

    def calls(self) -> list[tuple[str, str, dict[str, Any]]]:
        return [(c.id, c.name, c.arguments) for c in _calls(self.parts, f"s{self.rounds}")]

    def engine_calls_only(self) -> bool:
        names = [name for _, name, _ in self.calls()]
        return bool(names) and all(n in self.engine_tools for n in names)

    def visible(self, event: Event) -> bytes | None:
        """The event without the engine's calls; the last event of a round that called only
        the engine's tools is held back (the proxy answers them and relays the next round)."""
        data = event.data
        if not self.engine_tools or not isinstance(data, dict):
            return event.raw
        final = any(isinstance(c, Mapping) and c.get("finishReason") for c in data.get("candidates") or [])
        if final and self.engine_calls_only():
            return None
        ours = [p for p in _parts(data) if isinstance(p, Mapping) and (p.get("functionCall") or {}).get("name") in self.engine_tools]
        if not ours:
            return event.raw
        out = GEMINI.without_calls(data, set(self.engine_tools))
        if not final and all(p == {"text": ""} for p in _parts(out)) and "usageMetadata" not in data:
            return None
        return _event(out)

    def assistant_message(self) -> dict[str, Any]:
        return {"role": "model", "parts": list(self.parts)}


def count_body(body: Mapping[str, Any], sent: Mapping[str, Any], n: int, last: Any) -> dict[str, Any] | None:
    """A ``countTokens`` ``body`` with the working context last sent (``sent``, the session's
    last outgoing body, whose client history had ``n`` contents ending in ``last``) in place of
    the contents it shares with that request; None when it does not continue it. Either form:
    ``contents`` or ``generateContentRequest``."""
    inner = body.get("generateContentRequest")
    req = inner if isinstance(inner, Mapping) else body
    contents = req.get("contents")
    if not isinstance(contents, list) or n == 0 or len(contents) < n or contents[n - 1] != last:
        return None
    counted = {**req, "contents": [*sent.get("contents", []), *contents[n:]]}
    if isinstance(inner, Mapping):
        return {**body, "generateContentRequest": counted}
    return counted


GEMINI: GeminiApi = GeminiApi()
