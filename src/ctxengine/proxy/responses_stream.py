"""The tracker of a Responses API stream (see :mod:`ctxengine.proxy.streams`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ctxengine.proxy.sse import Event, StreamTracker, call_arguments, sse_bytes

__all__ = ["ResponsesStream"]


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
        return sse_bytes(data, str(kind) if kind else None)

    def calls(self) -> list[tuple[str, str, dict[str, Any]]]:
        out = []
        for idx in sorted(self.items):
            item = self._item(idx)
            if item.get("type") == "function_call":
                out.append((str(item.get("call_id", "")), str(item.get("name", "")), call_arguments(str(item.get("arguments") or ""))))
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
        return sse_bytes(data, "response.completed")

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
        return sse_bytes(data, "error")
