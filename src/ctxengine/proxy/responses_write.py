"""Canonical messages -> Responses items (see :mod:`ctxengine.proxy.responses` for the mapping):
the templates a message's items left under :data:`~ctxengine.proxy.responses_items.META_KEY`
filled with its canonical fields, so an untouched message comes back byte for byte.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from ctxengine.messages import Message, content_text
from ctxengine.proxy.responses_items import (
    _CALLS,
    _MODEL,
    _OUTPUTS,
    META_KEY,
    _call_item,
    _code,
    _default_items,
    _dumps,
    _output_value,
    _parts,
)


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
    if role == "tool":
        return _tool_items(entries, msg.get("content"))
    if role != "assistant":
        return _input_items(entries, msg.get("content"))
    return _assistant_items(msg, entries, kinds)


def _tool_items(entries: list[Any], content: Any) -> list[Any]:
    """A tool message's items: its output slots rebuilt from ``content``, the rest as recorded."""
    out: list[Any] = []
    for entry in entries:
        slot, template = entry[0], entry[1]
        if slot in ("o", "j"):
            out.append(_rebuilt_output(template, content, slot == "j"))
        else:
            out.append(template)
    return out


def _input_items(entries: list[Any], content: Any) -> list[Any]:
    """A user (or system) message's items: its content slot holds ``content``."""
    out: list[Any] = []
    for entry in entries:
        slot, template = entry[0], entry[1]
        out.append({**template, "content": _as_shaped(content, entry, False)} if slot == "c" else template)
    return out


def _assistant_items(msg: Message, entries: list[Any], kinds: dict[str, str]) -> list[Any]:
    """An assistant turn's items: the recorded ones the engine kept, then what it added."""
    content = msg.get("content")
    calls = {str(c.get("id")): c for c in msg.get("tool_calls") or [] if isinstance(c, Mapping)}
    c_slots = [e for e in entries if e[0] == "c"]
    out, used = _kept_items(entries, _text_shares(content, c_slots), calls, kinds)
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


def _text_shares(content: Any, c_slots: list[Any]) -> list[Any]:
    """The turn's text cut into one share per recorded text item (``None``: a removed text)."""
    sizes = [e[2] for e in c_slots]
    shares = [content] if len(c_slots) == 1 else _split(content, sizes) if c_slots else None
    if c_slots and shares is None:  # the engine changed the text's shape: all of it in the first
        shares = [content] + [None] * (len(c_slots) - 1)
    return shares or []


def _kept_items(entries: list[Any], shares: list[Any], calls: Mapping[str, Any], kinds: dict[str, str]) -> tuple[list[Any], set[str]]:
    """The recorded items of a turn the engine kept, and the ids of the calls among them."""
    texts = iter(shares)
    out: list[Any] = []
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
    return out, used


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
    """``body`` with ``messages`` as its ``instructions`` and ``input`` (see :mod:`ctxengine.proxy.responses`)."""
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
