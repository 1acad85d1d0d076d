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

import base64
import binascii
import bisect
import contextlib
import functools
import hashlib
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from ctxengine.engine import normalize_usage
from ctxengine.errors import InputError
from ctxengine.messages import Message, content_text
from ctxengine.proxy.apis import Api, Marking, ToolCall, _loads_args
from ctxengine.proxy.incoming import Converted
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

META_KEY = "responses"
"""The private key of a canonical message that holds what its items need to be written back."""

COMPACTION_PREFIX = "ctxengine:v1:"
_PREFIX_BYTES = COMPACTION_PREFIX.encode()
"""How the ``encrypted_content`` of a ctxengine compaction item starts."""

_MAX_EXPANDED = 256 * 1024 * 1024  # bytes a compaction token may expand to

# call item type -> (fixed tool name or None for the item's own "name", field holding the
# arguments, whether that field is a JSON value rather than a string)
_CALLS: dict[str, tuple[str | None, str, bool]] = {
    "function_call": (None, "arguments", False),
    "custom_tool_call": (None, "input", False),
    "local_shell_call": ("local_shell", "action", True),
    "shell_call": ("shell", "action", True),
    "apply_patch_call": ("apply_patch", "operation", True),
    "computer_call": ("computer", "action", True),
    "tool_search_call": ("tool_search", "arguments", True),
}
# the output item type answering each call type
_ANSWER: dict[str, str] = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "local_shell_call": "local_shell_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "computer_call": "computer_call_output",
    "tool_search_call": "tool_search_output",
}
# output item type -> (field holding the output, whether it is a JSON value shown as its JSON)
_OUTPUTS: dict[str, tuple[str, bool]] = {
    "function_call_output": ("output", False),
    "custom_tool_call_output": ("output", False),
    "local_shell_call_output": ("output", False),
    "apply_patch_call_output": ("output", False),
    "shell_call_output": ("output", True),
    "computer_call_output": ("output", True),
    "tool_search_output": ("tools", True),
}
# model-side items that no client output answers
_SERVER_ITEMS = frozenset({"reasoning", "mcp_list_tools", "mcp_approval_request"})
_INPUT_ROLES = frozenset({"user", "system", "developer"})


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


# -- the compaction token ---------------------------------------------------------------------


def encode_compaction(messages: Sequence[Message]) -> str:
    """The ``encrypted_content`` of a ctxengine compaction item standing for ``messages``."""
    raw = orjson.dumps(list(messages))
    return COMPACTION_PREFIX + base64.urlsafe_b64encode(zlib.compress(raw, 6)).decode("ascii")


@functools.lru_cache(maxsize=32)
def _expanded(token: str) -> bytes:
    try:
        packed = base64.urlsafe_b64decode(token[len(COMPACTION_PREFIX) :].encode("ascii"))
    except (binascii.Error, ValueError, UnicodeEncodeError) as exc:
        raise InputError(f"not base64 ({exc})") from None
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(packed, _MAX_EXPANDED)
    except zlib.error as exc:
        raise InputError(f"not compressed data ({exc})") from None
    if inflate.unconsumed_tail:
        raise InputError(f"expands to more than {_MAX_EXPANDED} bytes")
    if not inflate.eof:
        raise InputError("truncated")
    return raw


def decode_compaction(token: str) -> list[Message]:
    """The messages a ctxengine compaction token stands for; :class:`InputError` if it is not one
    or is damaged."""
    if not isinstance(token, str) or not token.startswith(COMPACTION_PREFIX):
        raise InputError("not a ctxengine compaction token")
    raw = _expanded(token)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"not JSON ({exc})") from None
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise InputError("not a list of messages")
    return value


def _is_ours(item: Mapping[str, Any]) -> bool:
    content = item.get("encrypted_content")
    return item.get("type") == "compaction" and isinstance(content, str) and content.startswith(COMPACTION_PREFIX)


# -- checking items ---------------------------------------------------------------------------


def _item_problem(item: Any) -> str | None:
    """What is wrong with one input item (the caller adds its index), or None."""
    if not isinstance(item, dict):
        return f"must be an object, not {type(item).__name__}"
    kind = item.get("type")
    if kind is not None and not isinstance(kind, str):
        return f"'type' must be a string, not {type(kind).__name__}"
    if kind is None or kind == "message":
        role = item.get("role")
        if not isinstance(role, str) or (role not in _INPUT_ROLES and role != "assistant"):
            return f"a message item needs a 'role' of user, assistant, system or developer, not {role!r}"
        content = item.get("content")
        if not isinstance(content, str | list):
            return f"a message item's 'content' must be a string or a list of parts, not {type(content).__name__}"
        if isinstance(content, list):
            for n, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    return f"content part {n} must be an object with a string 'type'"
        return None
    if kind in _CALLS:
        fixed, field, is_json = _CALLS[kind]
        cid = item.get("call_id")
        if cid is not None and not isinstance(cid, str):
            return f"a {kind} item's 'call_id' must be a string"
        if fixed is None and not isinstance(item.get("name"), str):
            return f"a {kind} item needs a string 'name'"
        if not is_json and field in item and not isinstance(item[field], str):
            return f"a {kind} item's {field!r} must be a string, not {type(item[field]).__name__}"
        if kind in ("function_call", "custom_tool_call") and not isinstance(cid, str):
            return f"a {kind} item needs a string 'call_id'"
        return None
    if kind in _OUTPUTS:
        field, is_json = _OUTPUTS[kind]
        cid = item.get("call_id")
        if cid is not None and not isinstance(cid, str):
            return f"a {kind} item's 'call_id' must be a string"
        if kind in ("function_call_output", "custom_tool_call_output"):
            if not isinstance(cid, str):
                return f"a {kind} item needs a string 'call_id'"
            if not isinstance(item.get(field), str | list):
                return f"a {kind} item's 'output' must be a string or a list of parts"
        return None
    if _is_ours(item):
        try:
            decode_compaction(item["encrypted_content"])
        except InputError as exc:
            return f"its ctxengine compaction token is damaged: {exc}"
    return None


def _checked(body: Mapping[str, Any]) -> list[Any]:
    """``body``'s input items, raising :class:`InputError` naming the first bad one."""
    items = body.get("input")
    if isinstance(items, str):
        return [items]
    if not isinstance(items, list):
        raise InputError(f"'input' must be a string or a list of items, not {type(items).__name__}")
    for i, item in enumerate(items):
        problem = _item_problem(item)
        if problem:
            raise InputError(f"input[{i}]: {problem}")
    return items


# -- items -> messages ------------------------------------------------------------------------


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


def _pairable(item: Mapping[str, Any]) -> bool:
    return item.get("type") in _CALLS and isinstance(item.get("call_id"), str) and bool(item["call_id"])


_MESSAGE, _MODEL, _ANSWER_ITEM, _OPAQUE, _OURS = "u", "m", "a", "o", "c"


def _code(item: Any) -> str:
    """Which part an item plays: a message item (not the model's), model-side, an output
    answering a call, one of our compaction items, or opaque (everything else)."""
    kind = item.get("type")
    if kind is None or kind == "message":
        return _MODEL if item.get("role") == "assistant" else _MESSAGE
    if kind in _CALLS or kind in _SERVER_ITEMS:
        return _MODEL
    if kind in _OUTPUTS:
        return _ANSWER_ITEM if isinstance(item.get("call_id"), str) else _OPAQUE
    if _is_ours(item):
        return _OURS
    return _MODEL if isinstance(kind, str) and kind.endswith("_call") else _OPAQUE


def _answer(item: Mapping[str, Any]) -> bool:
    return item.get("type") in _OUTPUTS and isinstance(item.get("call_id"), str)


class _Builder:
    """Turns a list of items into canonical messages (see the module docstring)."""

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


# -- messages -> items ------------------------------------------------------------------------


def _parts(content: Any, assistant: bool) -> Any:
    """Chat-completions parts an engine may have written (``text``, ``image_url``) in
    Responses form; every other value as it is (the same object when nothing changes)."""
    if not isinstance(content, list):
        return content
    out: list[Any] = []
    changed = False
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            out.append({"type": "output_text" if assistant else "input_text", "text": part.get("text", "")})
            changed = True
        elif isinstance(part, dict) and part.get("type") == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            new: dict[str, Any] = {"type": "input_image", "image_url": url}
            if isinstance(image, Mapping) and image.get("detail"):
                new["detail"] = image["detail"]
            out.append(new)
            changed = True
        else:
            out.append(part)
    return out if changed else content


def _call_item(call: Any) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, Mapping) else None
    fn = fn if isinstance(fn, Mapping) else {}
    args = fn.get("arguments")
    return {
        "type": "function_call",
        "name": str(fn.get("name", "")),
        "arguments": args if isinstance(args, str) else _dumps(args if args is not None else {}),
        "call_id": str(call.get("id", "")) if isinstance(call, Mapping) else "",
    }


def _output_value(content: Any) -> Any:
    if content is None:
        return ""
    return _parts(content, False)


def _default_items(msg: Mapping[str, Any], kinds: Mapping[str, str]) -> list[dict[str, Any]]:
    """A message's items written from its canonical fields only."""
    role = msg.get("role")
    content = msg.get("content")
    if role == "assistant":
        items: list[dict[str, Any]] = []
        if content is not None and content != "" and content != []:
            items.append({"type": "message", "role": "assistant", "content": _parts(content, True)})
        items.extend(_call_item(c) for c in msg.get("tool_calls") or [])
        return items
    if role == "tool":
        cid = str(msg.get("tool_call_id", ""))
        kind = _ANSWER.get(kinds.get(cid, "function_call"), "function_call_output")
        field, is_json = _OUTPUTS[kind]
        value = _output_value(content)
        if is_json and isinstance(value, str):
            try:
                value = orjson.loads(value)
            except orjson.JSONDecodeError:
                kind, field = "function_call_output", "output"
        return [{"type": kind, "call_id": cid, field: value}]
    if role not in _INPUT_ROLES:
        role = "user"
    return [{"role": role, "content": "" if content is None else _parts(content, False)}]


def _rebuilt_call(template: Mapping[str, Any], call: Any) -> dict[str, Any]:
    fixed, field, is_json = _CALLS[template["type"]]
    fn = call.get("function") if isinstance(call, Mapping) else None
    fn = fn if isinstance(fn, Mapping) else {}
    args = fn.get("arguments")
    out = dict(template)
    if fixed is None and isinstance(fn.get("name"), str):
        out["name"] = fn["name"]
    if is_json:
        text = args if isinstance(args, str) else _dumps(args)
        if text != _dumps(template.get(field)):
            with contextlib.suppress(orjson.JSONDecodeError):  # not JSON: the original stays
                out[field] = orjson.loads(text)
    else:
        out[field] = args if isinstance(args, str) else _dumps(args if args is not None else {})
    return out


def _rebuilt_output(template: Mapping[str, Any], content: Any, is_json: bool) -> dict[str, Any]:
    field = _OUTPUTS[template["type"]][0]
    out = dict(template)
    if content is None and (field not in template or is_json):
        return out
    if not is_json:
        out[field] = _output_value(content)
        return out
    text = content if isinstance(content, str) else _dumps(content)
    if text != _dumps(template.get(field)):
        with contextlib.suppress(orjson.JSONDecodeError):  # a cut JSON output: the original stays
            out[field] = orjson.loads(text)
    return out


def _split(content: Any, sizes: Sequence[int]) -> list[Any] | None:
    """``content`` split back over message items that contributed ``sizes`` parts (-1: a
    string), or None when the engine changed its shape."""
    expected = sum(1 if s < 0 else s for s in sizes)
    if not isinstance(content, list) or len(content) != expected:
        return None
    out: list[Any] = []
    at = 0
    for s in sizes:
        if s < 0:
            part = content[at]
            text = part.get("text") if isinstance(part, Mapping) else None
            out.append(text if isinstance(text, str) and part.get("type") in ("output_text", "text") else [part])
            at += 1
        else:
            out.append(content[at : at + s])
            at += s
    return out


def _items_of(msg: Message, kinds: dict[str, str]) -> list[Any]:
    """A canonical message as Responses items (records the kinds of its calls in ``kinds``)."""
    meta = msg.get(META_KEY)
    if isinstance(meta, Mapping) and isinstance(meta.get("opaque"), list):
        return list(meta["opaque"])
    entries = meta.get("items") if isinstance(meta, Mapping) else None
    if not isinstance(entries, list):
        for call in msg.get("tool_calls") or []:
            if isinstance(call, Mapping):
                kinds[str(call.get("id", ""))] = "function_call"
        return _default_items(msg, kinds)
    role = msg.get("role")
    content = msg.get("content")
    if role == "tool":
        out: list[Any] = []
        for entry in entries:
            slot, template = entry[0], entry[1]
            if slot in ("o", "j"):
                out.append(_rebuilt_output(template, content, slot == "j"))
            else:
                out.append(template)
        return out
    if role != "assistant":
        out = []
        for entry in entries:
            slot, template = entry[0], entry[1]
            out.append({**template, "content": _as_shaped(content, entry, False)} if slot == "c" else template)
        return out
    calls = {str(c.get("id")): c for c in msg.get("tool_calls") or [] if isinstance(c, Mapping)}
    c_slots = [e for e in entries if e[0] == "c"]
    sizes = [e[2] for e in c_slots]
    shares = [content] if len(c_slots) == 1 else _split(content, sizes) if c_slots else None
    if c_slots and shares is None:  # the engine changed the text's shape: all of it in the first
        shares = [content] + [None] * (len(c_slots) - 1)
    texts = iter(shares or [])
    out = []
    used: set[str] = set()
    # per reasoning item: its place in ``out``, and how many of the text and call items after
    # it (up to the next one) were kept and removed. A reasoning item whose items the engine
    # all removed goes too: the API rejects one "without its required following item".
    reasoning: list[list[int]] = []
    for entry in entries:
        slot, template = entry[0], entry[1]
        if slot == "c":
            share = next(texts)
            if share is not None:  # None: the engine removed this item's text
                out.append({**template, "content": _as_shaped(share, entry, True)})
            if reasoning:
                reasoning[-1][1 if share is not None else 2] += 1
        elif slot == "t":
            cid = str(template.get("call_id"))
            kept = cid in calls and cid not in used
            if kept:
                out.append(_rebuilt_call(template, calls[cid]))
                used.add(cid)
                kinds[cid] = template["type"]
            if reasoning:
                reasoning[-1][1 if kept else 2] += 1
        else:
            if template.get("type") == "reasoning":
                reasoning.append([len(out), 0, 0])
            out.append(template)
    orphans = {at for at, kept, removed in reasoning if removed and not kept}
    if orphans:
        out = [item for at, item in enumerate(out) if at not in orphans]
    # text or calls the engine added go after the turn's last model-side item (before the items
    # riding after it), the text before the first call
    if not c_slots and content not in (None, "", []):
        text = {"type": "message", "role": "assistant", "content": _parts(content, True)}
        first_call = next((at for at, item in enumerate(out) if item.get("type") in _CALLS and str(item.get("call_id")) in used), -1)
        out.insert(first_call if first_call >= 0 else _after_model_side(out), text)
    added = [c for cid, c in calls.items() if cid not in used]
    if added:
        at = _after_model_side(out)
        out[at:at] = [_call_item(c) for c in added]
        for c in added:
            kinds[str(c.get("id"))] = "function_call"
    return out


def _size(content: Any) -> int:
    """How a message item's content was shaped: -1 a string, else its number of parts."""
    return len(content) if isinstance(content, list) else -1


def _as_shaped(content: Any, entry: Sequence[Any], assistant: bool) -> Any:
    """``content`` for a message item whose content was a list (``entry[2] >= 0``): an engine's
    string becomes one text part (an item with an ``id`` or ``status`` takes no string)."""
    if content is None:
        content = ""
    if isinstance(content, str) and entry[2] >= 0:
        if assistant:
            return [{"type": "output_text", "text": content, "annotations": []}]
        return [{"type": "input_text", "text": content}]
    return _parts(content, assistant)


def _after_model_side(items: Sequence[Any]) -> int:
    for at in range(len(items) - 1, -1, -1):
        if isinstance(items[at], dict) and _code(items[at]) == _MODEL:
            return at + 1
    return 0


def _write(body: Mapping[str, Any], messages: Sequence[Message], items_of: Callable[[Message, dict[str, str]], list[Any]]) -> dict[str, Any]:
    """``body`` with ``messages`` as its ``instructions`` and ``input`` (see the module docstring)."""
    out = dict(body)
    items: list[Any] = []
    kinds: dict[str, str] = {}
    string: str | None = None
    for m in messages:
        meta = m.get(META_KEY)
        if isinstance(meta, Mapping) and meta.get("instructions"):
            content = m.get("content")
            out["instructions"] = content if isinstance(content, str) else content_text(content)
            continue
        if isinstance(meta, Mapping) and meta.get("string") and isinstance(m.get("content"), str):
            string = m["content"]
            items.append({"role": "user", "content": string})
            continue
        items.extend(items_of(m, kinds))
    out["input"] = string if string is not None and len(items) == 1 else items
    return out


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
