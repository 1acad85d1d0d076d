"""Server-sent events: split a byte stream into events, and follow a chat stream.

The proxy relays upstream bytes as they arrive. Beside the relay it feeds the same bytes to an
:class:`EventSplitter` and each complete event to a tracker, which reads the usage from the
stream's final events and rebuilds the assistant turn (text, thinking, tool calls) so that the
proxy can answer the engine's own tools and continue the conversation.

When the engine's tools were added to the request, the relay goes event by event instead, and
asks the tracker what the client may see (:meth:`StreamTracker.visible`): events about the
engine's tool calls are held back, tool-call and content-block indices are renumbered so the
client sees a gap-free sequence, and a stream that ends with calls to the engine's tools only
does not show its end (the proxy answers them and relays the next round's stream instead).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AnthropicStream", "Event", "EventSplitter", "OpenAIStream", "ResponsesStream", "StreamEnd", "StreamTracker", "failure_event"]


@dataclass(slots=True)
class Event:
    """One SSE event: its exact bytes (terminator included) and its parsed ``data`` JSON."""

    raw: bytes
    data: Any = None
    done: bool = False  # OpenAI's ``data: [DONE]``


class StreamEnd:
    """Whether a relayed stream reached its proper end, from its last bytes only (the plain
    relay parses no event but those with usage): OpenAI's ``data: [DONE]``, Anthropic's
    ``message_stop``, or an ``error`` event (the upstream's own way of ending a failed stream).
    A Responses stream ends with its terminal event (``response.completed``, ``.incomplete``,
    ``.failed``) or an ``error``, which carries the whole response (the request's tools echoed
    too: often far more than the tail kept), so for it the relayed bytes are searched for one
    as they pass.

    A stream without one was cut: its client must be told (:func:`failure_event`), not left
    with half an answer that looks whole."""

    __slots__ = ("_anthropic", "_done", "_responses", "_tail")

    _KEEP = 4096  # the last event of any stream fits (a final usage chunk is a few hundred bytes)
    _TERMINAL = (b'"response.completed"', b'"response.incomplete"', b'"response.failed"', b"event: error")

    def __init__(self, anthropic: bool, responses: bool = False) -> None:
        self._anthropic = anthropic
        self._responses = responses
        self._done = False
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        tail = self._tail + chunk
        if self._responses and not self._done:
            # a marker split across two chunks is found in the kept tail plus the new bytes
            window = tail[-(len(chunk) + 32) :]
            self._done = any(t in window for t in self._TERMINAL)
        self._tail = tail[-self._KEEP :] if len(tail) > self._KEEP else tail

    @property
    def complete(self) -> bool:
        if self._responses:
            return self._done
        events = [e for e in self._tail.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]
        if not events:
            return False
        last = events[-1]
        if self._anthropic:
            return b"message_stop" in last or b"event: error" in last or b'"type": "error"' in last or b'"type":"error"' in last
        data = last.split(b"data:", 1)[-1].strip()
        return data == b"[DONE]" or data.startswith(b'{"error"') or b'"error":' in data[:20]


def failure_event(anthropic: bool, message: str) -> bytes:
    """An error event in the API's own shape, to end a stream the upstream failed to finish
    (the response head, 200, is already out: this is how an SDK learns of the failure)."""
    if anthropic:
        payload = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"
    payload = {"error": {"message": message, "type": "server_error", "param": None, "code": "upstream_stream_failed"}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


class EventSplitter:
    """Feed bytes, get complete events. Lines may end in ``\\n`` or ``\\r\\n``.

    ``only``: events whose bytes lack it are skipped unparsed (the plain relay needs only the
    events that carry usage, and parsing every chunk would cost CPU for nothing).
    """

    def __init__(self, only: bytes | None = None) -> None:
        self._buf = b""
        self._only = only

    def feed(self, chunk: bytes) -> Iterator[Event]:
        self._buf += chunk
        while True:
            cut = _boundary(self._buf)
            if cut < 0:
                return
            raw, self._buf = self._buf[:cut], self._buf[cut:]
            if self._only is None or self._only in raw:
                yield _parse(raw)

    def flush(self) -> Iterator[Event]:
        if self._buf.strip():
            raw, self._buf = self._buf, b""
            if self._only is None or self._only in raw:
                yield _parse(raw)


def _boundary(buf: bytes) -> int:
    """End (exclusive) of the first complete event in ``buf``, or -1."""
    best = -1
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        i = buf.find(sep)
        if i >= 0 and (best < 0 or i + len(sep) < best):
            best = i + len(sep)
    return best


def _parse(raw: bytes) -> Event:
    data_lines = []
    for line in raw.splitlines():
        if line.startswith(b"data:"):
            data_lines.append(line[5:].lstrip(b" "))
    if not data_lines:
        return Event(raw)
    payload = b"\n".join(data_lines)
    if payload.strip() == b"[DONE]":
        return Event(raw, None, True)
    try:
        return Event(raw, json.loads(payload))
    except ValueError:
        return Event(raw)


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n\n").encode("utf-8")


@dataclass
class StreamTracker:
    """Follows one streamed response (see the module docstring).

    ``engine_tools``: names of the engine's tools the proxy added (empty: plain relay).
    ``first_round``: False for the follow-up rounds, whose opening event the client must not
    see again (Anthropic's ``message_start``).
    """

    engine_tools: frozenset[str] = frozenset()
    first_round: bool = True
    usage: dict[str, Any] = field(default_factory=dict)
    finished: bool = False

    def feed(self, event: Event) -> None:
        raise NotImplementedError

    def visible(self, event: Event) -> bytes | None:
        """Bytes of ``event`` the client may see (``None``: hold it back). Call after :meth:`feed`."""
        raise NotImplementedError

    def engine_calls_only(self) -> bool:
        """The turn ended calling the engine's tools and nothing of the client's."""
        raise NotImplementedError

    def calls(self) -> list[tuple[str, str, dict[str, Any]]]:
        """``(id, name, arguments)`` of every tool call of the turn."""
        raise NotImplementedError

    def assistant_message(self) -> dict[str, Any]:
        """The turn as a message of the API, to send back with the tools' results."""
        raise NotImplementedError


def _args(raw: str) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {"input": raw}
    return value if isinstance(value, dict) else {"input": value}


@dataclass
class OpenAIStream(StreamTracker):
    """Chat-completions chunks: ``choices[0].delta`` pieces, ``finish_reason``, ``usage``."""

    text: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    client_index: dict[int, int] = field(default_factory=dict)
    finish_reason: str | None = None

    def feed(self, event: Event) -> None:
        data = event.data
        if event.done:
            self.finished = True
            return
        if not isinstance(data, dict):
            return
        if isinstance(data.get("usage"), dict):
            self.usage = data["usage"]
        for choice in data.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.text.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                idx = int(tc.get("index", 0))
                slot = self.tool_calls.setdefault(idx, {"id": "", "name": "", "arguments": ""})
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["name"] = fn["name"]
                    if fn["name"] not in self.engine_tools:
                        self.client_index[idx] = len(self.client_index)
                if isinstance(fn.get("arguments"), str):
                    slot["arguments"] += fn["arguments"]
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def _is_engine(self, idx: int) -> bool:
        return self.tool_calls.get(idx, {}).get("name") in self.engine_tools

    def engine_calls_only(self) -> bool:
        return bool(self.tool_calls) and all(self._is_engine(i) for i in self.tool_calls)

    def visible(self, event: Event) -> bytes | None:
        if not self.engine_tools:
            return event.raw
        if event.done:
            return None if self.engine_calls_only() else event.raw
        data = event.data
        if not isinstance(data, dict):
            return event.raw
        choices = data.get("choices") or []
        if not choices:  # the usage chunk: shown once the turn is the client's
            return None if self.engine_calls_only() else event.raw
        changed = False
        out_choices = []
        for choice in choices:
            delta = choice.get("delta") or {}
            tcs = delta.get("tool_calls")
            if choice.get("finish_reason") and self.engine_calls_only():
                return None
            if tcs:
                kept = []
                for tc in tcs:
                    idx = int(tc.get("index", 0))
                    if self._is_engine(idx):
                        continue
                    new = self.client_index.get(idx, idx)
                    kept.append(tc if new == idx else {**tc, "index": new})
                if kept != tcs:
                    changed = True
                    delta = {k: v for k, v in delta.items() if k != "tool_calls"}
                    if kept:
                        delta["tool_calls"] = kept
                    if not delta and not choice.get("finish_reason"):
                        continue
                    choice = {**choice, "delta": delta}
            out_choices.append(choice)
        if not changed:
            return event.raw
        if not out_choices:
            return None
        return _sse({**data, "choices": out_choices})

    def calls(self) -> list[tuple[str, str, dict[str, Any]]]:
        return [(c["id"], c["name"], _args(c["arguments"])) for _, c in sorted(self.tool_calls.items())]

    def assistant_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) or None}
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for _, c in sorted(self.tool_calls.items())
            ]
        return msg


@dataclass
class AnthropicStream(StreamTracker):
    """Messages events: ``message_start`` … ``content_block_*`` … ``message_delta``, ``message_stop``.

    ``index_offset``: content blocks the client already saw in earlier rounds (the follow-up
    round's blocks continue the numbering).
    """

    index_offset: int = 0
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    partial: dict[int, list[str]] = field(default_factory=dict)
    client_index: dict[int, int] = field(default_factory=dict)
    stop_reason: str | None = None

    def feed(self, event: Event) -> None:
        data = event.data
        if not isinstance(data, dict):
            return
        kind = data.get("type")
        if kind == "message_start":
            msg = data.get("message") or {}
            if isinstance(msg.get("usage"), dict):
                self.usage = dict(msg["usage"])
        elif kind == "content_block_start":
            idx = int(data.get("index", 0))
            block = dict(data.get("content_block") or {})
            self.blocks[idx] = block
            if not (block.get("type") == "tool_use" and block.get("name") in self.engine_tools):
                self.client_index[idx] = self.index_offset + len(self.client_index)
        elif kind == "content_block_delta":
            idx = int(data.get("index", 0))
            block = self.blocks.setdefault(idx, {"type": "text", "text": ""})
            delta = data.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text", ""))
            elif dtype == "input_json_delta":
                self.partial.setdefault(idx, []).append(str(delta.get("partial_json", "")))
            elif dtype == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
            elif dtype == "signature_delta":
                block["signature"] = block.get("signature", "") + str(delta.get("signature", ""))
            elif dtype == "citations_delta":
                block.setdefault("citations", []).append(delta.get("citation"))
        elif kind == "message_delta":
            delta = data.get("delta") or {}
            if delta.get("stop_reason"):
                self.stop_reason = delta["stop_reason"]
            if isinstance(data.get("usage"), dict):
                self.usage.update({k: v for k, v in data["usage"].items() if v is not None})
        elif kind == "message_stop":
            self.finished = True

    def _is_engine(self, idx: int) -> bool:
        block = self.blocks.get(idx, {})
        return block.get("type") == "tool_use" and block.get("name") in self.engine_tools

    def engine_calls_only(self) -> bool:
        uses = [i for i, b in self.blocks.items() if b.get("type") == "tool_use"]
        return bool(uses) and all(self._is_engine(i) for i in uses)

    @property
    def client_blocks(self) -> int:
        """Content blocks the client has seen so far (this round and the earlier ones)."""
        return self.index_offset + len(self.client_index)

    def visible(self, event: Event) -> bytes | None:
        if not self.engine_tools and self.first_round:
            return event.raw
        data = event.data
        if not isinstance(data, dict):
            return event.raw
        kind = data.get("type")
        if kind == "message_start":
            return event.raw if self.first_round else None
        if kind in ("message_delta", "message_stop"):
            return None if self.engine_calls_only() else event.raw
        if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            idx = int(data.get("index", 0))
            if self._is_engine(idx):
                return None
            new = self.client_index.get(idx, idx)
            if new == idx:
                return event.raw
            return _sse({**data, "index": new}, str(kind))
        return event.raw

    def calls(self) -> list[tuple[str, str, dict[str, Any]]]:
        out = []
        for idx, block in sorted(self.blocks.items()):
            if block.get("type") == "tool_use":
                raw = "".join(self.partial.get(idx, []))
                args = _args(raw) if raw else dict(block.get("input") or {})
                out.append((str(block.get("id", "")), str(block.get("name", "")), args))
        return out

    def assistant_message(self) -> dict[str, Any]:
        content = []
        for idx, block in sorted(self.blocks.items()):
            b = dict(block)
            if b.get("type") == "tool_use":
                raw = "".join(self.partial.get(idx, []))
                b["input"] = _args(raw) if raw else dict(b.get("input") or {})
            content.append(b)
        return {"role": "assistant", "content": content}


_RESPONSE_END = frozenset({"response.completed", "response.incomplete", "response.failed"})
_RESPONSE_START = frozenset({"response.created", "response.in_progress", "response.queued"})
# output item types the client has to answer (a turn that ends with one is the client's)
_CLIENT_CALLS = frozenset(
    {"function_call", "custom_tool_call", "local_shell_call", "shell_call", "apply_patch_call", "computer_call", "mcp_approval_request"}
)


@dataclass
class ResponsesStream(StreamTracker):
    """Responses API events (``response.created`` … ``response.output_item.added`` …
    ``response.output_item.done`` … ``response.completed``), each with a ``sequence_number``.

    With engine tools, every event of an item that calls one (by ``output_index``, or
    ``item_id``) is held back, and the ``output_index`` of the other items is renumbered so the
    client sees a gap-free list across rounds. A follow-up round (:meth:`next_round`) shows no
    ``response.created``/``in_progress`` again, continues the ``sequence_number`` past the
    last one shown, and its final event lists every item the client saw in all rounds.

    A reasoning item is held back until the next item starts: the API rejects a reasoning item
    sent back "without its required following item", so one followed by a call to the engine's
    tools is hidden with it; otherwise its events are shown then, before the next item's.

    ``output_offset``: items the client saw in earlier rounds; ``sequence_offset``: added to
    this round's sequence numbers; ``earlier_output``: the items of the earlier rounds the
    client saw (the final event's ``response.output`` starts with them).
    """

    output_offset: int = 0
    sequence_offset: int = 0
    earlier_output: list[dict[str, Any]] = field(default_factory=list)
    items: dict[int, dict[str, Any]] = field(default_factory=dict)
    arguments: dict[int, list[str]] = field(default_factory=dict)
    client_index: dict[int, int] = field(default_factory=dict)
    engine_items: set[str] = field(default_factory=set)
    response: dict[str, Any] = field(default_factory=dict)
    status: str | None = None
    last_sequence: int = -1  # the highest sequence number of this round (offset applied)
    pending: int | None = None  # output index of a reasoning item whose events are held
    held: list[tuple[Event, dict[str, Any]]] = field(default_factory=list)
    release: bool = False  # the held events go out before the current one
    hidden: set[int] = field(default_factory=set)  # reasoning items hidden with the call after them

    def feed(self, event: Event) -> None:
        data = event.data
        if not isinstance(data, dict):
            return
        kind = data.get("type")
        seq = data.get("sequence_number")
        if isinstance(seq, int):
            self.last_sequence = max(self.last_sequence, seq + self.sequence_offset)
        if kind in _RESPONSE_START or kind in _RESPONSE_END:
            resp = data.get("response")
            if isinstance(resp, dict):
                self.response = resp
                if isinstance(resp.get("usage"), dict):
                    self.usage = dict(resp["usage"])
                self.status = resp.get("status") if isinstance(resp.get("status"), str) else self.status
            if kind in _RESPONSE_END:
                self.finished = True
                if self.pending is not None:
                    self._decide(hide=self.engine_calls_only())
            return
        if kind == "error":
            self.status = "failed"
            self.finished = True
            return
        idx = data.get("output_index")
        if not isinstance(idx, int):
            return
        if kind == "response.output_item.added":
            item = data.get("item")
            item = dict(item) if isinstance(item, dict) else {}
            self.items[idx] = item
            if self.pending is not None and self.pending != idx:
                self._decide(hide=self._names_engine(item))
            if self._names_engine(item):
                if isinstance(item.get("id"), str):
                    self.engine_items.add(item["id"])
            elif self.engine_tools and item.get("type") == "reasoning":
                self.pending = idx
            elif idx not in self.client_index:
                self.client_index[idx] = self.output_offset + len(self.client_index)
        elif kind == "response.output_item.done":
            item = data.get("item")
            if isinstance(item, dict):
                self.items[idx] = dict(item)
        elif kind == "response.function_call_arguments.delta":
            self.arguments.setdefault(idx, []).append(str(data.get("delta", "")))
        elif kind == "response.function_call_arguments.done" and isinstance(data.get("arguments"), str):
            self.arguments[idx] = [data["arguments"]]

    def _decide(self, hide: bool) -> None:
        """The held reasoning item goes with the engine's call after it, or is shown now."""
        assert self.pending is not None
        if hide:
            self.hidden.add(self.pending)
            self.held.clear()
        else:
            self.client_index[self.pending] = self.output_offset + len(self.client_index)
            self.release = True
        self.pending = None

    def _names_engine(self, item: dict[str, Any]) -> bool:
        return item.get("type") == "function_call" and item.get("name") in self.engine_tools

    def _is_engine(self, idx: int) -> bool:
        return self._names_engine(self.items.get(idx, {}))

    def engine_calls_only(self) -> bool:
        calls = [i for i, item in self.items.items() if item.get("type") in _CLIENT_CALLS]
        return bool(calls) and all(self._is_engine(i) for i in calls)

    def _item(self, idx: int) -> dict[str, Any]:
        item = dict(self.items.get(idx, {}))
        if item.get("type") == "function_call" and not item.get("arguments") and idx in self.arguments:
            item["arguments"] = "".join(self.arguments[idx])
        return item

    def visible_output(self) -> list[dict[str, Any]]:
        """The items the client has seen, this round's and the earlier ones', in its order."""
        return [*self.earlier_output, *(self._item(i) for i in sorted(self.client_index))]

    def visible(self, event: Event) -> bytes | None:
        if not self.engine_tools and self.first_round:
            return event.raw
        data = event.data
        if isinstance(data, dict) and self.pending is not None and data.get("output_index") == self.pending:
            self.held.append((event, data))
            return None
        if self.release:
            self.release = False
            held, self.held = self.held, []
            before = b"".join(self._shown(e, d) or b"" for e, d in held)
            now = self._shown(event, data)
            return before + (now or b"")
        return self._shown(event, data)

    def _shown(self, event: Event, data: Any) -> bytes | None:
        if not isinstance(data, dict):
            return event.raw
        kind = data.get("type")
        if kind in _RESPONSE_START:
            return event.raw if self.first_round else None
        if kind in _RESPONSE_END:
            if self.engine_tools and self.engine_calls_only():
                return None
            out = data
            resp = data.get("response")
            if isinstance(resp, dict) and (self.earlier_output or self.hidden or any(self._is_engine(i) for i in self.items)):
                out = {**data, "response": {**resp, "output": self._final_output(resp)}}
            return self._renumbered(out, event, kind)
        idx = data.get("output_index")
        if isinstance(idx, int) and (idx in self.hidden or self._is_engine(idx)):
            return None
        if data.get("item_id") in self.engine_items:
            return None
        out = data
        if isinstance(idx, int):
            new = self.client_index.get(idx, idx)
            if new != idx:
                out = {**data, "output_index": new}
        return self._renumbered(out, event, kind)

    def _final_output(self, resp: dict[str, Any]) -> list[Any]:
        gone = {self.items[i].get("id") for i in self.hidden if self.items.get(i, {}).get("id")}
        mine = [
            i
            for i in resp.get("output") or []
            if not (isinstance(i, dict) and ((i.get("type") == "function_call" and i.get("name") in self.engine_tools) or (gone and i.get("id") in gone)))
        ]
        return [*self.earlier_output, *mine]

    def _renumbered(self, data: dict[str, Any], event: Event, kind: Any) -> bytes:
        seq = data.get("sequence_number")
        if self.sequence_offset and isinstance(seq, int):
            data = {**data, "sequence_number": seq + self.sequence_offset}
        if data is event.data:
            return event.raw
        return _sse(data, str(kind) if kind else None)

    def calls(self) -> list[tuple[str, str, dict[str, Any]]]:
        out = []
        for idx in sorted(self.items):
            item = self._item(idx)
            if item.get("type") == "function_call":
                out.append((str(item.get("call_id", "")), str(item.get("name", "")), _args(str(item.get("arguments") or ""))))
            elif item.get("type") in _CLIENT_CALLS:
                out.append((str(item.get("call_id") or item.get("id", "")), str(item.get("name") or item.get("type")), {}))
        return out

    def assistant_message(self) -> dict[str, Any]:
        """``{"role": "assistant", "output": [items]}``: what ``RESPONSES.followup`` takes."""
        return {"role": "assistant", "output": [self._item(i) for i in sorted(self.items)]}

    def next_round(self) -> ResponsesStream:
        """The tracker of the follow-up round that answers this round's engine calls."""
        return ResponsesStream(
            engine_tools=self.engine_tools,
            first_round=False,
            output_offset=self.output_offset + len(self.client_index),
            sequence_offset=self.last_sequence + 1,
            earlier_output=self.visible_output(),
        )

    def closing(self) -> bytes:
        """A ``response.completed`` event ending the stream when the last round still called
        only the engine's tools (the proxy stops answering them)."""
        resp = {**self.response, "status": "completed", "output": self.visible_output()}
        if self.usage:
            resp["usage"] = self.usage
        data = {"type": "response.completed", "response": resp, "sequence_number": self.last_sequence + 1}
        return _sse(data, "response.completed")

    def failure(self, status: int, content: bytes) -> bytes:
        """An upstream error met in a follow-up round, as the stream's ``error`` event."""
        try:
            payload = json.loads(content)
        except ValueError:
            payload = None
        err = payload.get("error") if isinstance(payload, dict) else None
        err = err if isinstance(err, dict) else {}
        message = err.get("message") or content.decode("utf-8", "replace")[:500] or f"upstream status {status}"
        data = {
            "type": "error",
            "code": err.get("code") or err.get("type") or ("server_error" if status >= 500 else "invalid_request_error"),
            "message": message,
            "param": err.get("param"),
            "sequence_number": self.last_sequence + 1,
        }
        return _sse(data, "error")
