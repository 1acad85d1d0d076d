"""A session's request body, parsed incrementally.

A client resends its whole history every turn, so the bytes of each request body start with
the bytes of the last one up to the end of its last message. :class:`BodyCache` remembers, per
session, the last body's bytes and where each element of its ``messages`` array ends; the next
body is checked against them with one memory comparison, the messages it shares are the same
objects as last turn (so everything downstream recognises them by identity instead of
comparing 100K tokens of text), and only the new messages and the small rest of the body are
decoded. The keys after the array (``tools`` in most bodies: 12K tokens of schemas for some
agents) are the same objects as last turn too when their bytes are (the manager then finds the
tool list's token count by identity, and nothing is decoded). Anything unexpected (a non-ASCII body, where byte and character offsets differ; a
second ``messages`` key; a history edited before its end) falls back to a full parse.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["BodyCache"]

_DECODER = json.JSONDecoder()
_WS = " \t\n\r"


def _skip(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    return i


@dataclass
class BodyCache:
    """The last body of one session (see the module docstring)."""

    raw: bytes = b""
    start: int = -1  # offset of the messages array's '['; -1: nothing usable remembered
    ends: list[int] = field(default_factory=list)  # offset just past each message
    messages: list[Any] = field(default_factory=list)
    state: tuple[bytes, int, list[int], list[Any]] | None = None  # the four above, read at once
    before: dict[str, tuple[int, int]] = field(default_factory=dict)  # spans of the keys before the messages
    head: dict[str, Any] = field(default_factory=dict)  # and their values (last body's objects)
    after_raw: bytes = b""  # the bytes of the keys after the messages array (from the first key to the end)
    after: dict[str, Any] = field(default_factory=dict)  # and their values (last body's objects)
    # (needle, body, n): ``needle`` is not in ``body[:n]`` (:meth:`contains`), read at once
    searched: tuple[bytes, bytes, int] | None = None
    # what :meth:`splice` serialised last, by the value's id (the value kept: its id stays its own)
    dumped: dict[int, tuple[Any, bytes]] = field(default_factory=dict)

    def parse(self, raw: bytes) -> Any:
        """``raw`` decoded (as :func:`orjson.loads` would); raises :class:`orjson.JSONDecodeError`."""
        try:
            # no ``raw.isascii()`` first (a pass over the whole body, ~20K instructions at
            # 42 KB): the bytes it shares with the last body are ASCII (only an ASCII body is
            # remembered) and the rest is decoded as ASCII, which fails on any other byte
            body = self._incremental(raw)
        except (ValueError, IndexError):  # UnicodeDecodeError is a ValueError
            body = None
        if body is None:
            self.start = -1
            self.state = None
            body = orjson.loads(raw)
            if raw.isascii() and isinstance(body, dict) and isinstance(body.get("messages"), list):
                try:
                    self._remember(raw, body)
                except (ValueError, IndexError):
                    self.start = -1
                    self.state = None
        return body

    def _incremental(self, raw: bytes) -> dict[str, Any] | None:
        if self.start < 0:
            return None
        ends = self.ends
        k = self._unchanged(raw)
        if k < 0:
            return None
        pos = ends[k - 1] if k else self.start + 1
        text = raw[pos:].decode("ascii")
        new: list[Any] = []
        new_ends: list[int] = []
        i = _skip(text, 0)
        first = k == 0
        while text[i] != "]":
            if not first:
                if text[i] != ",":
                    return None
                i = _skip(text, i + 1)
            first = False
            value, i = _DECODER.raw_decode(text, i)
            new.append(value)
            new_ends.append(pos + i)
            i = _skip(text, i)
        end = pos + i + 1
        if raw.find(b'"messages"', end) >= 0:
            return None  # maybe a second "messages" key: the full parse decides which counts
        # the keys before the array are last body's bytes: last body's values (the same
        # objects); only the keys after it are decoded
        found = self._after_array(raw, end)
        if found is None:
            return None
        after, tail = found
        head = self.head
        if not isinstance(after, dict) or "messages" in after or not head.keys().isdisjoint(after):
            return None  # a key given twice: the full parse decides which value counts
        messages = [*self.messages[:k], *new]
        rest = {**head, "messages": messages, **after}
        searched = self.searched
        if searched is not None and searched[1] is self.raw:  # raw[:pos] is last body's bytes
            self.searched = (searched[0], raw, min(searched[2], pos))
        self.raw = raw
        self.ends = [*ends[:k], *new_ends]
        self.messages = messages
        self.state = (raw, self.start, self.ends, messages)
        if after and after is not self.after:
            self.after_raw, self.after = tail, after
        return rest

    def _unchanged(self, raw: bytes) -> int:
        """How many of last body's messages ``raw`` starts with, byte for byte (-1: not even
        the bytes before the array)."""
        old = memoryview(self.raw)
        ends = self.ends
        k = len(ends)
        if k == 0 or not raw.startswith(old[: ends[-1]]):
            lo, hi = 0, k  # the most messages whose bytes are unchanged
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if raw.startswith(old[: ends[mid - 1]]):
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
            if k == 0 and not raw.startswith(old[: self.start + 1]):
                return -1
        return k

    def _after_array(self, raw: bytes, end: int) -> tuple[Any, bytes] | None:
        """The keys after the messages array (which ends before ``end``) and their bytes (last
        body's value when the bytes are the same); ``None`` when the full parse must decide."""
        j = _skip_bytes(raw, end)
        if raw[j : j + 1] == b",":
            j = _skip_bytes(raw, j + 1)
            if raw[j : j + 1] != b'"':
                return None  # not JSON (e.g. a trailing comma): the full parse says why
            tail = raw[j:]
            return (self.after if tail == self.after_raw else orjson.loads(b"{" + tail)), tail
        if raw[j : j + 1] == b"}" and not raw[j + 1 :].strip(b" \t\n\r"):
            return {}, b""
        return None

    def contains(self, raw: bytes, needle: bytes) -> bool:
        """``needle in raw``, searching only the bytes not searched last turn when ``raw`` is
        the body this cache parsed last: the bytes it shares with the body before were searched
        then (a 42 KB body searched whole costs ~34K instructions a turn)."""
        searched = self.searched  # one read: the event loop may parse the session's next body meanwhile
        clean = searched[2] if searched is not None and searched[0] == needle and searched[1] is raw else 0
        # a match that ends past ``clean`` starts at most len(needle) - 1 bytes before it
        if raw.find(needle, max(0, clean - len(needle) + 1)) >= 0:
            return True
        self.searched = (needle, raw, len(raw))
        return False

    def _remember(self, raw: bytes, body: dict[str, Any]) -> None:
        """Find the top-level messages array of ``raw`` and where each message ends."""
        text = raw.decode("ascii")
        i = _skip(text, 0)
        if text[i] != "{":
            raise ValueError("not an object")
        i = _skip(text, i + 1)
        start = -1
        ends: list[int] = []
        before: dict[str, tuple[int, int]] = {}
        value_start = 0
        while text[i] != "}":
            key, i = _DECODER.raw_decode(text, i)
            i = _skip(text, i)
            if text[i] != ":":
                raise ValueError("expected ':'")
            i = _skip(text, i + 1)
            if start < 0 and key != "messages":
                value_start = i
            if key == "messages":
                if start >= 0 or text[i] != "[":
                    raise ValueError("a second messages key")
                start = i
                i = _skip(text, i + 1)
                while text[i] != "]":
                    if ends:
                        if text[i] != ",":
                            raise ValueError("expected ','")
                        i = _skip(text, i + 1)
                    _, i = _DECODER.raw_decode(text, i)
                    ends.append(i)
                    i = _skip(text, i)
                i += 1
            else:
                _, i = _DECODER.raw_decode(text, i)
                if start < 0:
                    before[key] = (value_start, i)
            i = _skip(text, i)
            if text[i] == ",":
                i = _skip(text, i + 1)
        messages = body["messages"]
        if start < 0 or len(ends) != len(messages):
            raise ValueError("messages not found")
        self.raw, self.start, self.ends, self.messages, self.before = raw, start, ends, messages, before
        # each key's value as its bytes give it (``body`` holds a later one for a key given again after the array)
        self.head = {key: orjson.loads(raw[a:b]) for key, (a, b) in before.items()}
        self.state = (raw, start, ends, messages)

    def splice(self, raw: bytes, body: Mapping[str, Any], new_body: Mapping[str, Any], changed: Sequence[int] | None = None) -> bytes | None:
        """The bytes of ``new_body`` when it is ``body`` (parsed from ``raw`` by this cache) with
        only some messages replaced: ``raw`` with just those messages serialised again, every
        other byte as the client sent it. ``None`` when that does not apply (serialise it all).

        ``changed``: the indices of the replaced messages when the caller knows them (every
        other message of ``new_body`` is then ``body``'s own object), so a long history is not
        compared message by message."""
        state = self.state  # one read: the event loop may parse the session's next body meanwhile
        if state is None:
            return None
        known, start, ends, messages = state
        old, new = body.get("messages"), new_body.get("messages")
        if known is not raw or old is not messages or not isinstance(new, list) or len(new) != len(old):
            return None
        if new_body.keys() != body.keys():
            return None
        edits: list[tuple[int, int, Any]] = []
        spans = self.before  # keys before the array: the same bytes in every body that reuses it
        for key in body:
            if key != "messages" and new_body[key] is not body[key]:
                if key not in spans:
                    return None
                edits.append((*spans[key], new_body[key]))
        pairs = ((i, old[i], new[i]) for i in sorted(changed)) if changed is not None else ((i, a, b) for i, (a, b) in enumerate(zip(old, new, strict=True)))
        for i, a, b in pairs:
            if a is b:
                continue
            j = _skip_bytes(raw, ends[i - 1] if i else start + 1)
            if i:
                if raw[j : j + 1] != b",":
                    return None
                j = _skip_bytes(raw, j + 1)
            edits.append((j, ends[i], b))
        parts: list[bytes | memoryview] = []
        pos = 0
        view = memoryview(raw)
        # a value written last turn too (the marked system prompt, last turn's marked message:
        # the write-back's memo gives the same objects, never edited) is not serialised again
        last, dumped = self.dumped, {}
        for j, end, value in sorted(edits, key=lambda e: e[0]):
            hit = last.get(id(value))
            data = hit[1] if hit is not None and hit[0] is value else orjson.dumps(value)
            dumped[id(value)] = (value, data)
            parts += [view[pos:j], data]  # views: the client's bytes are copied once, by the join
            pos = end
        parts.append(view[pos:])
        self.dumped = dumped
        return b"".join(parts)


def _skip_bytes(raw: bytes, i: int) -> int:
    n = len(raw)
    while i < n and raw[i] in b" \t\n\r":
        i += 1
    return i
