"""Responses items -> canonical messages (see :mod:`ctxengine.proxy.responses` for the mapping):
:class:`_Builder` turns a list of items into messages segment by segment, so a session's
history (:class:`~ctxengine.proxy.responses.ResponsesHistory`) converts only what is new.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ctxengine.messages import Message
from ctxengine.proxy.responses_compaction import decode_compaction
from ctxengine.proxy.responses_items import (
    _ANSWER_ITEM,
    _CALLS,
    _MESSAGE,
    _MODEL,
    _OPAQUE,
    _OURS,
    _OUTPUTS,
    META_KEY,
    _answer,
    _code,
    _default_items,
    _dumps,
    _pairable,
)


def _template(item: Mapping[str, Any], blank: Sequence[str]) -> dict[str, Any]:
    return {k: (None if k in blank else v) for k, v in item.items()}


def _call_parts(item: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A call item's canonical tool call and its template."""
    kind = item["type"]
    fixed, field, is_json = _CALLS[kind]
    if is_json:
        args = _dumps(item.get(field))
        template = dict(item)
    else:
        args = item.get(field, "")
        template = _template(item, (field,) if fixed is not None else (field, "name"))
    name = fixed if fixed is not None else item["name"]
    return {"id": item["call_id"], "type": "function", "function": {"name": name, "arguments": args}}, template


def _output_parts(item: Mapping[str, Any]) -> tuple[Any, dict[str, Any], bool]:
    """An output item's canonical content, its template, and whether its output is JSON."""
    field, is_json = _OUTPUTS[item["type"]]
    if field not in item:
        return None, dict(item), is_json
    if is_json:
        return _dumps(item[field]), dict(item), True
    return item[field], _template(item, (field,)), False


class _Builder:
    """Turns a list of items into canonical messages (see :mod:`ctxengine.proxy.responses`)."""

    def __init__(self, out: list[Message] | None = None, segments: list[tuple[int, int, str]] | None = None) -> None:
        self.out: list[Message] = out if out is not None else []
        # per segment (a message item, a turn with its outputs, a run of opaque items, one of
        # our compaction items): where its items end, where its messages end, and which kind of
        # items would have continued it (_continues). A segment's messages depend on its items
        # only, and where it ends on the item after it.
        self.segments: list[tuple[int, int, str]] = segments if segments is not None else []

    def run(self, items: Sequence[Any], start: int = 0) -> list[Message]:
        n = len(items)
        codes = [_code(item) for item in items[start:]]
        codes[:0] = [""] * start
        i = start
        while i < n:
            code = codes[i]
            if code == _MODEL:
                j = i
                while j < n and codes[j] in (_MODEL, _OPAQUE):
                    j += 1
                k = j
                while k < n and codes[k] in (_ANSWER_ITEM, _OPAQUE):
                    k += 1
                self._turn(items[i:j], items[j:k])
                i, follow = k, ("answers" if k > j else "turn")
            elif code == _MESSAGE:
                self._message(items[i])
                i, follow = i + 1, ""
            elif code == _OURS:
                self.out.extend(decode_compaction(items[i]["encrypted_content"]))
                i, follow = i + 1, ""
            else:  # outputs without their call, items with no chat counterpart: one opaque message
                j = i + 1
                while j < n and codes[j] in (_OPAQUE, _ANSWER_ITEM):
                    j += 1
                self.out.append({"role": "user", "content": None, META_KEY: {"opaque": list(items[i:j])}})
                i, follow = j, "opaque"
            self.segments.append((i, len(self.out), follow))
        return self.out

    def _message(self, item: dict[str, Any]) -> None:
        msg: Message = {"role": item["role"], "content": item["content"]}
        self._finish(msg, [["c", _template(item, ("content",)), _size(item["content"])]], [item])

    def _turn(self, turn: Sequence[dict[str, Any]], answers: Sequence[dict[str, Any]]) -> None:
        # which calls the outputs answer: the first output for each call id of the turn
        call_ids: set[str] = set()
        for item in turn:
            if _pairable(item) and item["call_id"] not in call_ids:
                call_ids.add(item["call_id"])
        answered: dict[str, int] = {}
        for pos, item in enumerate(answers):
            cid = item.get("call_id") if _answer(item) else None
            if isinstance(cid, str) and cid in call_ids and cid not in answered:
                answered[cid] = pos
        entries: list[list[Any]] = []
        calls: list[dict[str, Any]] = []
        texts: list[tuple[int, Any]] = []  # (entry index, content) of the assistant message items
        kinds: dict[str, str] = {}
        for item in turn:
            kind = item.get("type")
            if _pairable(item) and item["call_id"] in answered and item["call_id"] not in kinds:
                call, template = _call_parts(item)
                calls.append(call)
                kinds[item["call_id"]] = str(kind)
                entries.append(["t", template])
            elif (kind is None or kind == "message") and item.get("role") == "assistant":
                texts.append((len(entries), item["content"]))
                entries.append(["c", _template(item, ("content",)), _size(item["content"])])
            else:
                entries.append(["v", item])
        if len(texts) == 1:
            content: Any = texts[0][1]
        elif texts:
            content = []
            for _, value in texts:
                if isinstance(value, str):
                    content.append({"type": "output_text", "text": value})
                else:
                    content.extend(value)
        else:
            content = None
        msg: Message = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = calls
        self._finish(msg, entries, list(turn))
        for pos, item in enumerate(answers):
            cid = item.get("call_id")
            if isinstance(cid, str) and answered.get(cid) == pos:
                out, template, is_json = _output_parts(item)
                tool: Message = {"role": "tool", "tool_call_id": cid, "content": out}
                # a JSON output keeps its original, which a cut that is no longer JSON leaves in place
                self._finish(tool, [["j" if is_json else "o", template]], [item], kinds[cid], keep=is_json)
            else:  # rides on the message before it
                last = self.out[-1]
                meta = last.get(META_KEY)
                entries_now = list(meta["items"]) if isinstance(meta, dict) and "items" in meta else _entries_for(last, kinds)
                self.out[-1] = {**last, META_KEY: {"items": [*entries_now, ["v", item]]}}

    def _finish(self, msg: Message, entries: list[list[Any]], items: list[Any], call_kind: str | None = None, *, keep: bool = False) -> None:
        """Append ``msg``, with its entries under the private key unless its default form is
        exact (``keep``: always)."""
        kinds = {msg["tool_call_id"]: call_kind} if call_kind is not None else {}
        if keep or not _same_items(_default_items(msg, kinds), items):
            msg[META_KEY] = {"items": entries}
        self.out.append(msg)


def _continues(follow: str, item: Any) -> bool:
    """Whether ``item`` would have continued a segment that ``follow`` describes (_Builder)."""
    if not isinstance(item, dict):
        return False
    code = _code(item)
    if follow == "turn":
        return code in (_MODEL, _OPAQUE, _ANSWER_ITEM)
    if follow in ("answers", "opaque"):
        return code in (_ANSWER_ITEM, _OPAQUE)
    return False


def _entries_for(msg: Message, kinds: Mapping[str, str]) -> list[list[Any]]:
    """Entries that rebuild a message's default items exactly (a message that had none)."""
    out: list[list[Any]] = []
    for item in _default_items(msg, kinds):
        kind = item.get("type")
        if kind == "message" or kind is None:
            out.append(["c", _template(item, ("content",)), _size(item["content"])])
        elif kind in _CALLS:
            out.append(["t", _call_parts(item)[1]])
        elif kind in _OUTPUTS:
            _, template, is_json = _output_parts(item)
            out.append(["j" if is_json else "o", template])
        else:
            out.append(["v", item])
    return out


def _same(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and a == b)


def _same_items(made: Sequence[dict[str, Any]], items: Sequence[Any]) -> bool:
    """Whether ``made`` serialises exactly as ``items`` (key order included)."""
    if len(made) != len(items):
        return False
    for m, it in zip(made, items, strict=True):
        if not isinstance(it, dict) or list(m) != list(it):
            return False
        if not all(_same(v, it[k]) for k, v in m.items()):
            return False
    return True


def _size(content: Any) -> int:
    """How a message item's content was shaped: -1 a string, else its number of parts."""
    return len(content) if isinstance(content, list) else -1
