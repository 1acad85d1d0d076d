"""The vocabulary of the Responses adapter's item mapping (see :mod:`ctxengine.proxy.responses`):
which item types are calls, outputs and model-side items, the checks of an input item, which
part an item plays, and a canonical message's default items (written from its canonical
fields only). Reading (:mod:`~ctxengine.proxy.responses_read`) and writing
(:mod:`~ctxengine.proxy.responses_write`) both build on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from ctxengine.errors import InputError
from ctxengine.proxy.responses_compaction import _is_ours, decode_compaction

META_KEY = "responses"
"""The private key of a canonical message that holds what its items need to be written back."""

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
