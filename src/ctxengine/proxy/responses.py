"""The OpenAI Responses API (``POST /v1/responses``) as an :class:`~ctxengine.proxy.apis.Api`.

A Responses request carries its conversation as ``instructions`` plus a list of *items*
(``input``). :data:`RESPONSES` reads them as ctxengine's canonical chat messages (DESIGN §3.1)
and writes a working context back as items, losslessly:

* ``instructions`` → a leading ``system`` message (written back to ``instructions``);
* a user, system or developer message item → a message of that role, its content as it came
  (a string, or Responses parts: ``input_text``, ``input_image``, ``input_file`` …; the text
  functions of ctxengine read parts through their ``text`` key);
* one *assistant turn* — the run of model-side items (``reasoning``, assistant messages,
  ``function_call``, ``custom_tool_call``, ``local_shell_call``, ``web_search_call`` …) between
  two other items — → one ``assistant`` message: its ``content`` is the text of its message
  items, its ``tool_calls`` the calls answered by the outputs that follow (id = ``call_id``;
  ``arguments`` the call's arguments, a freeform tool's ``input``, or the JSON of a shell
  call's ``action``);
* each output item (``function_call_output``, ``custom_tool_call_output`` …) answering one of
  those calls → a ``tool`` message (``tool_call_id`` = ``call_id``, ``content`` its output: a
  string, a list of parts, or the JSON of an object output);
* items with no chat counterpart (``item_reference``, a ``compaction`` item that is not ours,
  unknown types, an output whose call is not in the request) ride along verbatim on the
  message before them inside a turn, or become an *opaque* ``user`` message (content
  ``None``) between turns, so no engine can reorder or drop them on their own;
* a ctxengine ``compaction`` item (:func:`compact_reply`) → the messages it stands for.

What the canonical fields do not say lives under one private key, ``"responses"``
(:data:`META_KEY`): the items of the message with the fields the canonical form carries
blanked out (content, names, arguments, outputs), and the verbatim items riding along. Writing
back fills the canonical fields into those templates, so an untouched message comes back
byte for byte and a changed one (a cut output, elided arguments) changes only where the
engine changed it. Messages an engine created (summaries, records) are written from their
canonical fields. Messages whose default form is already exact carry no private key. A
``reasoning`` item whose following items an engine removed is left out too: the API rejects
one sent back "without its required following item".

:class:`ResponsesHistory` does the same per session, turn after turn, converting only the items
a resent history adds.

:func:`compact_input` and :func:`compact_reply` answer ``POST /v1/responses/compact`` (Codex's
remote compaction) statelessly: the reply's compaction item carries the compacted messages
themselves (``ctxengine:v1:`` + base64 of compressed JSON), expanded again by
:meth:`RESPONSES.messages <Api.messages>` on every later request.

Nothing here mutates its arguments.
"""

from __future__ import annotations

import bisect
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from ctxengine.engine import normalize_usage
from ctxengine.errors import InputError
from ctxengine.messages import Message
from ctxengine.proxy.apis import Api, Marking, ToolCall, _loads_args
from ctxengine.proxy.incoming import Converted
from ctxengine.proxy.responses_compaction import (
    _PREFIX_BYTES,
    COMPACTION_PREFIX,
    decode_compaction,
    encode_compaction,
)
from ctxengine.proxy.responses_items import _CALLS, META_KEY, _checked, _item_problem
from ctxengine.proxy.responses_read import _Builder, _continues
from ctxengine.proxy.responses_write import _items_of, _write
from ctxengine.proxy.state import ProxySession
from ctxengine.proxy.streams import ResponsesStream, StreamEnd, StreamTracker

__all__ = [
    "COMPACTION_PREFIX",
    "META_KEY",
    "RESPONSES",
    "ResponsesApi",
    "ResponsesHistory",
    "compact_input",
    "compact_reply",
    "decode_compaction",
    "encode_compaction",
    "session_hint",
]

# -- the Api ----------------------------------------------------------------------------------


class ResponsesApi(Api):
    """The Responses API's adapter (:data:`RESPONSES`); beyond :class:`Api` it says which
    requests must pass through unchanged (:meth:`passthrough_reason`)."""

    name = "responses"
    _TYPES: ClassVar[dict[int, str]] = {400: "invalid_request_error", 401: "invalid_api_key", 404: "not_found", 413: "invalid_request_error", 500: "server_error", 502: "server_error"}

    def passthrough_reason(self, body: Mapping[str, Any]) -> str | None:
        """Why this request cannot be compacted and must go upstream unchanged, or None."""
        if body.get("previous_response_id"):
            return "previous_response_id: the history is stored on the server"
        if body.get("conversation"):
            return "conversation: the history is stored on the server"
        if body.get("background") is True:
            return "background: the response is polled by id"
        if body.get("input") is None:
            return "no input"
        return None

    def system(self, body: Mapping[str, Any]) -> Any:
        instructions = body.get("instructions")
        return instructions if isinstance(instructions, str) and instructions else None

    def as_history(self, messages: list[Message]) -> tuple[Any, Sequence[Any]]:
        body = self.with_messages({"input": []}, messages)
        return self.system(body), body["input"]

    def expands(self, raw: bytes) -> bool:
        return _PREFIX_BYTES in raw  # a compaction item of ours: the upstream gets what it stands for

    def history(self, body: Mapping[str, Any]) -> Sequence[Any]:
        source = body.get("input")
        if isinstance(source, list):
            return source
        return [{"role": "user", "content": source}] if isinstance(source, str) else []

    def read(self, body: Mapping[str, Any], session: ProxySession) -> tuple[list[Message], Converted | None]:
        """The session's :class:`ResponsesHistory` converts only the items new since last turn."""
        if not isinstance(session.converter, ResponsesHistory):
            session.converter = ResponsesHistory()
        return session.converter.messages(body), None

    def write(
        self, body: Mapping[str, Any], session: ProxySession, conv: Converted | None, context: list[Message], changed: bool, marking: Marking
    ) -> tuple[Mapping[str, Any], list[int] | None]:
        """The items of ``context`` (breakpoints are not this API's: OpenAI caches prefixes by itself)."""
        if not changed:
            return body, None
        history = session.converter if isinstance(session.converter, ResponsesHistory) else ResponsesHistory()
        return history.with_messages(body, context), None

    def tracker(self, engine_tools: frozenset[str], first_round: bool = True, previous: StreamTracker | None = None) -> StreamTracker:
        if isinstance(previous, ResponsesStream):
            return previous.next_round()
        return ResponsesStream(engine_tools=engine_tools, first_round=first_round)

    def closing(self, tracker: StreamTracker) -> bytes:
        return tracker.closing() if isinstance(tracker, ResponsesStream) else b""

    def stream_end(self) -> StreamEnd:
        return StreamEnd(False, responses=True)

    def stream_failure(self, message: str, tracker: StreamTracker | None = None) -> bytes:
        body = orjson.dumps({"error": {"message": message, "type": "server_error", "param": None, "code": "upstream_stream_failed"}})
        return self.stream_error(502, body, tracker)

    def stream_error(self, status: int, content: bytes, tracker: StreamTracker | None = None) -> bytes:
        if isinstance(tracker, ResponsesStream):
            return tracker.failure(status, content)
        return super().stream_error(status, content, tracker)

    def problem(self, body: Any) -> str | None:
        """What makes ``body`` unusable, or None. A body :meth:`passthrough_reason` forwards
        needs only a model."""
        if not isinstance(body, dict):
            return f"the request body must be a JSON object, not {type(body).__name__}"
        if not isinstance(body.get("model"), str) or not body["model"]:
            return "'model' is required and must be a string"
        if self.passthrough_reason(body) is not None:
            return None
        if not isinstance(body.get("input"), str | list):
            return f"'input' must be a string or a list of items, not {type(body.get('input')).__name__}"
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            return f"'instructions' must be a string, not {type(instructions).__name__}"
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            return f"'tools' must be a list, not {type(tools).__name__}"
        try:
            _checked(body)
        except InputError as exc:
            return str(exc)
        return None

    def messages(self, body: Mapping[str, Any]) -> list[Message]:
        """``instructions`` and ``input`` as canonical messages; :class:`InputError` names the
        first malformed item. (:class:`ResponsesHistory` does the same turn after turn,
        converting only what is new.)"""
        return ResponsesHistory().messages(body)

    def with_messages(self, body: Mapping[str, Any], messages: Sequence[Message]) -> dict[str, Any]:
        return _write(body, messages, _items_of)

    def tool_names(self, body: Mapping[str, Any]) -> set[str]:
        names: set[str] = set()
        for t in body.get("tools") or []:
            if isinstance(t, Mapping):
                name = t.get("name")
                fn = t.get("function")
                if isinstance(name, str):
                    names.add(name)
                elif isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
                    names.add(fn["name"])
        return names

    def tool_schema(self, openai_tool: Mapping[str, Any]) -> dict[str, Any]:
        fn = openai_tool.get("function") or openai_tool
        out: dict[str, Any] = {"type": "function", "name": fn["name"]}
        if fn.get("description"):
            out["description"] = fn["description"]
        out["parameters"] = fn.get("parameters") or {"type": "object", "properties": {}}
        # Responses function tools are strict unless told otherwise; the engine's schemas are not
        out["strict"] = bool(fn.get("strict", False))
        return out

    def calls(self, response: Mapping[str, Any]) -> list[ToolCall]:
        """Every call in the output the client would have to answer (function calls and the
        other client-executed kinds, named by kind), in order."""
        out = []
        for item in response.get("output") or []:
            if not isinstance(item, Mapping):
                continue
            kind = item.get("type")
            if kind == "function_call":
                out.append(ToolCall(str(item.get("call_id", "")), str(item.get("name", "")), _loads_args(item.get("arguments"))))
            elif kind in _CALLS or kind == "mcp_approval_request":
                fixed, field, _ = _CALLS.get(str(kind), (None, "arguments", True))
                name = fixed or str(item.get("name") or kind)
                out.append(ToolCall(str(item.get("call_id") or item.get("id", "")), name, _loads_args(item.get(field))))
        return out

    def assistant_message(self, response: Mapping[str, Any]) -> dict[str, Any]:
        """The response's output items (``{"role": "assistant", "output": [...]}``), for :meth:`followup`."""
        return {"role": "assistant", "output": [dict(i) for i in response.get("output") or [] if isinstance(i, Mapping)]}

    def followup(self, body: Mapping[str, Any], assistant: Mapping[str, Any], results: Sequence[tuple[ToolCall, str]]) -> dict[str, Any]:
        """``body`` with the response's output items and one ``function_call_output`` per result
        appended to ``input``. Without server storage (``store: false``) a reasoning item can
        only be sent back with its ``encrypted_content``; one without it is left out."""
        source = body.get("input")
        items: list[Any] = [{"role": "user", "content": source}] if isinstance(source, str) else list(source or [])
        stored = body.get("store") is not False
        for item in assistant.get("output") or []:
            if not stored and isinstance(item, Mapping) and item.get("type") == "reasoning" and not item.get("encrypted_content"):
                continue
            items.append(dict(item))
        items += [{"type": "function_call_output", "call_id": call.id, "output": result} for call, result in results]
        out = dict(body)
        out["input"] = items
        return out

    def without_calls(self, response: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
        """``response`` without its calls to ``names``, and without a reasoning item all of
        whose following items (up to the next reasoning item) were such calls: the API rejects
        a reasoning item sent back "without its required following item"."""
        items = list(response.get("output") or [])
        gone = [isinstance(i, Mapping) and i.get("type") == "function_call" and i.get("name") in names for i in items]
        kept = []
        for at, item in enumerate(items):
            if gone[at]:
                continue
            if isinstance(item, Mapping) and item.get("type") == "reasoning":
                following = []
                for j in range(at + 1, len(items)):
                    if isinstance(items[j], Mapping) and items[j].get("type") == "reasoning":
                        break
                    following.append(gone[j])
                if following and all(following):
                    continue
            kept.append(item)
        out = dict(response)
        out["output"] = kept
        return out

    def usage(self, response: Mapping[str, Any]) -> dict[str, Any] | None:
        """``usage`` as the API reports it (``input_tokens``, ``output_tokens``,
        ``input_tokens_details.cached_tokens``): :func:`ctxengine.engine.normalize_usage` reads it."""
        u = response.get("usage")
        return dict(u) if isinstance(u, Mapping) else None

    def error(self, status: int, message: str, kind: str | None = None) -> dict[str, Any]:
        etype = kind or self._TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        return {"error": {"message": message, "type": etype, "param": None, "code": etype}}


RESPONSES: ResponsesApi = ResponsesApi()


# -- remote compaction ------------------------------------------------------------------------


def compact_input(body: Mapping[str, Any]) -> list[Message]:
    """The conversation a ``POST /v1/responses/compact`` body asks to compact (``instructions``
    + ``input``, as :meth:`RESPONSES.messages <Api.messages>` reads a request).
    :class:`InputError` names what is wrong with a bad body, or says that its history is on
    the server (``previous_response_id``, ``conversation``): such a body is forwarded."""
    problem = RESPONSES.problem(dict(body)) if isinstance(body, Mapping) else "the request body must be a JSON object"
    if problem:
        raise InputError(problem)
    reason = RESPONSES.passthrough_reason(body)
    if reason is not None:
        raise InputError(f"cannot compact this request here ({reason}); forward it")
    return RESPONSES.messages(body)


def _instructions(m: Mapping[str, Any]) -> bool:
    """The message :meth:`RESPONSES.messages <Api.messages>` made of ``instructions`` (an engine
    may have added to it)."""
    meta = m.get(META_KEY)
    return isinstance(meta, Mapping) and bool(meta.get("instructions"))


def compact_reply(body: Mapping[str, Any], compacted: Sequence[Message], usage: Mapping[str, Any] | None = None, *, created_at: int | None = None) -> dict[str, Any]:
    """The ``response.compaction`` object answering ``body``: its ``output`` is one ctxengine
    compaction item standing for ``compacted`` (the engine's result for :func:`compact_input`),
    without the instructions (even with an engine's note added) and the system/developer items
    the client sends afresh.

    ``usage``: the compaction's token counts in either provider's shape (zeros when None).
    ``created_at``: the Unix time to report (default: now).
    """
    resent = {orjson.dumps(m) for m in compact_input(body) if m.get("role") in ("system", "developer")}
    kept = [m for m in compacted if not _instructions(m) and (m.get("role") not in ("system", "developer") or orjson.dumps(m) not in resent)]
    token = encode_compaction(kept)
    digest = hashlib.sha256(token.encode("ascii")).hexdigest()[:32]
    u = normalize_usage(dict(usage) if usage else {})
    return {
        "id": f"resp_ctx{digest}",
        "object": "response.compaction",
        "created_at": int(time.time()) if created_at is None else created_at,
        "output": [{"type": "compaction", "id": f"cmp_ctx{digest}", "encrypted_content": token}],
        "usage": {
            "input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cache_read_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.total_tokens,
        },
    }


def session_hint(body: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """What names a Responses client's session: the body's ``prompt_cache_key`` (Codex sends its
    conversation id), else a ``session_id``/``session-id``/``thread-id``/``conversation_id``
    header; None without any."""
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and key:
        return key
    lowered = {k.lower(): v for k, v in headers.items()}
    for name in ("session_id", "session-id", "thread-id", "conversation_id"):
        value = lowered.get(name)
        if value:
            return value
    return None


@dataclass
class ResponsesHistory:
    """One session's last request, converted: a client resends its whole history every turn,
    so :meth:`messages` converts only the items after the part seen last turn (compared by
    identity first, in C), and :meth:`with_messages` writes back only the messages it has not
    written before. Results equal :data:`RESPONSES`' own, which uses a fresh one."""

    items: list[Any] = field(default_factory=list)
    body: list[Message] = field(default_factory=list)  # the messages of ``items``
    segments: list[tuple[int, int, str]] = field(default_factory=list)  # see _Builder
    system: tuple[Any, Message | None] = (None, None)  # the instructions and their message
    # what with_messages wrote last, by the message's id (the message kept, so its id stays its
    # own): the items, the call kind a tool message without the private key was written with
    # (None: any), and the call kinds an assistant message recorded
    written: dict[int, tuple[Message, list[Any], str | None, dict[str, str]]] = field(default_factory=dict)

    def messages(self, body: Mapping[str, Any]) -> list[Message]:
        source = body.get("input")
        out: list[Message] = []
        instructions = body.get("instructions")
        if isinstance(instructions, str):
            if self.system[1] is None or self.system[0] != instructions:
                self.system = (instructions, {"role": "system", "content": instructions, META_KEY: {"instructions": True}})
            assert self.system[1] is not None
            out.append(self.system[1])
        if isinstance(source, str):
            out.append({"role": "user", "content": source, META_KEY: {"string": True}})
            return out
        if not isinstance(source, list):
            raise InputError(f"'input' must be a string or a list of items, not {type(source).__name__}")
        prev = self.items
        n = len(prev)
        if not (n <= len(source) and prev == source[:n]):
            n = 0
            for a, b in zip(source, prev, strict=False):
                if a is not b and a != b:
                    break
                n += 1
        # the segments that ended before the shared part does are converted as they were, and
        # the one that ended with it unless the next item would have continued it
        ends = [seg[0] for seg in self.segments]
        keep = bisect.bisect_left(ends, n)
        if keep < len(self.segments) and ends[keep] == n and (n == len(source) or not _continues(self.segments[keep][2], source[n])):
            keep += 1
        segments = self.segments[:keep]
        start, msg_end = segments[-1][:2] if segments else (0, 0)
        for i in range(start, len(source)):
            problem = _item_problem(source[i])
            if problem:
                raise InputError(f"input[{i}]: {problem}")
        builder = _Builder(self.body[:msg_end], segments)
        builder.run(source, start)
        self.items, self.body, self.segments = list(source), builder.out, builder.segments
        return out + builder.out

    def with_messages(self, body: Mapping[str, Any], messages: Sequence[Message]) -> dict[str, Any]:
        """:meth:`RESPONSES.with_messages <Api.with_messages>`, reusing the items of every
        message written last time."""
        memo = self.written
        fresh: dict[int, tuple[Message, list[Any], str | None, dict[str, str]]] = {}

        def items_of(m: Message, kinds: dict[str, str]) -> list[Any]:
            hit = memo.get(id(m))
            read = kinds.get(str(m.get("tool_call_id"))) if m.get("role") == "tool" and META_KEY not in m else None
            if hit is not None and hit[0] is m and hit[2] == read:
                kinds.update(hit[3])
                fresh[id(m)] = hit
                return hit[1]
            items = _items_of(m, kinds)
            ids = (str(c.get("id", "")) for c in m.get("tool_calls") or [] if isinstance(c, Mapping))
            recorded = {cid: kinds[cid] for cid in ids if cid in kinds}
            fresh[id(m)] = (m, items, read, recorded)
            return items

        out = _write(body, messages, items_of)
        self.written = fresh
        return out
