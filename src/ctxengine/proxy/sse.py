"""Server-sent events: split a byte stream into events, write one, and the tracker interface a
streamed response is followed with (see :mod:`ctxengine.proxy.streams`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Event",
    "EventSplitter",
    "StreamEnd",
    "StreamTracker",
    "call_arguments",
    "failure_event",
    "sse_bytes",
]



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


def sse_bytes(data: Any, event: str | None = None) -> bytes:
    """One server-sent event carrying ``data`` as compact JSON (with an ``event:`` line when named)."""
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


def call_arguments(raw: str) -> dict[str, Any]:
    """A tool call's streamed arguments as a dict (text that is not a JSON object goes under ``input``)."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {"input": raw}
    return value if isinstance(value, dict) else {"input": value}
