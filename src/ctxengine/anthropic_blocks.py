"""The block vocabulary of the Anthropic ⇄ OpenAI adapter (see :mod:`ctxengine.anthropic_adapter`):
the payload types and keys, the block kinds a message's order is written in, and the per-block
conversions (content blocks ⇄ parts, ``tool_use`` ⇄ tool call, ``tool_result`` ⇄ tool message)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ctxengine.errors import InputError
from ctxengine.messages import Message

__all__ = [
    "ASSISTANT_RANK",
    "KIND_CONTENT",
    "KIND_THINKING",
    "KIND_TOOL_RESULT",
    "KIND_TOOL_USE",
    "META_KEY",
    "RESERVED_OPENAI_KEYS",
    "THINKING_KEY",
    "THINKING_TYPES",
    "USER_RANK",
    "AnthropicMessage",
    "AnthropicSystem",
    "block_to_part",
    "blocks_to_parts",
    "call_to_tool_use",
    "check_block",
    "clone_json",
    "parts_to_blocks",
    "result_to_tool",
    "tool_to_result",
    "tool_use_to_call",
]

AnthropicMessage = dict[str, Any]
"""One Anthropic Messages API message: ``{"role": "user"|"assistant", "content": ...}``."""

AnthropicSystem = str | list[dict[str, Any]] | None
"""The ``system`` parameter: a string, a list of text blocks, or absent (``None``)."""

META_KEY = "anthropic"
"""Key of the OpenAI-side dict holding what OpenAI cannot express (block order, grouping)."""

THINKING_KEY = "thinking_blocks"
"""Key of the OpenAI assistant message holding its thinking / redacted_thinking blocks."""

_ATOMS = frozenset({str, int, float, bool, type(None)})


def clone_json(value: Any) -> Any:
    """A deep copy of JSON data (what :func:`copy.deepcopy` gives for it, without its memo and
    dispatch: several times faster on the small parts and blocks copied here); anything that
    is not a dict, list or JSON atom goes to :func:`copy.deepcopy`."""
    kind = type(value)
    if kind is dict:
        return {k: clone_json(v) for k, v in value.items()}
    if kind is list:
        return [clone_json(v) for v in value]
    if kind in _ATOMS:
        return value
    return copy.deepcopy(value)


THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})
_DATA_URL_RE = re.compile(r"data:([^;,]*);base64,(.*)", re.DOTALL)

# block kinds used in META_KEY["order"]
KIND_THINKING = "thinking"
KIND_CONTENT = "content"
KIND_TOOL_USE = "tool_use"
KIND_TOOL_RESULT = "tool_result"
ASSISTANT_RANK = {KIND_THINKING: 0, KIND_CONTENT: 1, KIND_TOOL_USE: 2}
USER_RANK = {KIND_TOOL_RESULT: 0, KIND_CONTENT: 1}

# OpenAI message keys the adapter itself writes: an Anthropic message may not carry them
RESERVED_OPENAI_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id", THINKING_KEY, META_KEY})


# ---------------------------------------------------------------------------------------------
# blocks ⇄ parts


def check_block(block: Any, where: str) -> dict[str, Any]:
    if not isinstance(block, dict):
        raise InputError(f"{where}: a content block is a {type(block).__name__}, not an object")
    if not isinstance(block.get("type"), str):
        raise InputError(f"{where}: a content block has no string 'type'")
    return block


def _image_block_to_part(block: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``image_url`` part for an image block, or None when it cannot be written as a URL
    that maps back to the same block."""
    source = block.get("source")
    if "image_url" in block or not isinstance(source, dict):
        return None
    kind = source.get("type")
    if kind == "base64" and set(source) == {"type", "media_type", "data"}:
        media_type, data = source["media_type"], source["data"]
        if not isinstance(media_type, str) or not isinstance(data, str) or ";" in media_type or "," in media_type:
            return None
        url = f"data:{media_type};base64,{data}"
    elif kind == "url" and set(source) == {"type", "url"}:
        url = source["url"]
        if not isinstance(url, str) or url.startswith("data:"):
            return None
    else:
        return None
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url}}
    for key, value in block.items():
        if key not in ("type", "source"):
            part[key] = clone_json(value)
    return part


def block_to_part(block: Any, where: str) -> dict[str, Any]:
    block = check_block(block, where)
    btype = block["type"]
    if btype == "image_url":
        raise InputError(f"{where}: 'image_url' is an OpenAI part type, not an Anthropic block type (use an 'image' block)")
    if btype == "image":
        part = _image_block_to_part(block)
        if part is not None:
            return part
    return {k: clone_json(v) for k, v in block.items()}


def _part_to_block(part: Any, where: str) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise InputError(f"{where}: a content part is a {type(part).__name__}, not an object")
    if part.get("type") != "image_url":
        return {k: clone_json(v) for k, v in part.items()}
    image = part.get("image_url")
    if isinstance(image, str):
        url: Any = image
    elif isinstance(image, dict):
        unknown = set(image) - {"url", "detail"}
        if unknown:
            raise InputError(f"{where}: image_url has keys with no Anthropic counterpart: {sorted(unknown)}")
        url = image.get("url")
    else:
        url = None
    if not isinstance(url, str):
        raise InputError(f"{where}: an image_url part has no string 'url'")
    m = _DATA_URL_RE.fullmatch(url)
    source: dict[str, Any]
    if m:
        source = {"type": "base64", "media_type": m.group(1), "data": m.group(2)}
    else:
        source = {"type": "url", "url": url}
    block: dict[str, Any] = {"type": "image", "source": source}
    for key, value in part.items():
        if key in ("type", "image_url"):
            continue
        if key == "source":
            raise InputError(f"{where}: an image_url part has a 'source' key, which would clash with the Anthropic image source")
        block[key] = clone_json(value)
    return block


def blocks_to_parts(blocks: Sequence[Any], where: str) -> list[dict[str, Any]]:
    return [block_to_part(b, f"{where}, block {j}") for j, b in enumerate(blocks)]


def parts_to_blocks(parts: Sequence[Any], where: str) -> list[dict[str, Any]]:
    return [_part_to_block(p, f"{where}, part {j}") for j, p in enumerate(parts)]


# ---------------------------------------------------------------------------------------------
# tool_use ⇄ tool call, tool_result ⇄ tool message


def tool_use_to_call(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    cid, name = block.get("id"), block.get("name")
    if not isinstance(cid, str) or not cid:
        raise InputError(f"{where}: tool_use block without a string 'id'")
    if not isinstance(name, str):
        raise InputError(f"{where}: tool_use block {cid!r} without a string 'name'")
    if "input" not in block:
        raise InputError(f"{where}: tool_use block {cid!r} has no 'input'")
    if "function" in block:
        raise InputError(f"{where}: tool_use block {cid!r} has a 'function' key, which would clash with the OpenAI tool call")
    try:
        arguments = json.dumps(block["input"], ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: input of tool_use block {cid!r} is not JSON: {exc}") from exc
    call: dict[str, Any] = {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}
    for key, value in block.items():
        if key not in ("type", "id", "name", "input"):
            call[key] = clone_json(value)
    return call


def call_to_tool_use(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise InputError(f"{where}: a tool call is a {type(call).__name__}, not an object")
    cid = call.get("id")
    if not isinstance(cid, str) or not cid:
        raise InputError(f"{where}: a tool call has no string 'id'")
    ctype = call.get("type", "function")
    if ctype != "function":
        raise InputError(f"{where}: tool call {cid!r} has type {ctype!r}; only 'function' calls map to tool_use")
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise InputError(f"{where}: tool call {cid!r} has no function name")
    unknown = set(fn) - {"name", "arguments"}
    if unknown:
        raise InputError(f"{where}: function of tool call {cid!r} has keys with no Anthropic counterpart: {sorted(unknown)}")
    args = fn.get("arguments")
    tool_input: Any
    if args is None or (isinstance(args, str) and not args.strip()):
        tool_input = {}
    elif isinstance(args, str):
        try:
            tool_input = json.loads(args)
        except ValueError as exc:
            raise InputError(f"{where}: arguments of tool call {cid!r} are not JSON, and tool_use input must be: {exc}") from exc
    elif isinstance(args, dict):
        tool_input = clone_json(args)
    else:
        raise InputError(f"{where}: arguments of tool call {cid!r} are a {type(args).__name__}")
    block: dict[str, Any] = {"type": "tool_use", "id": cid, "name": fn["name"], "input": tool_input}
    for key, value in call.items():
        if key in ("id", "type", "function"):
            continue
        if key in block:
            raise InputError(f"{where}: tool call {cid!r} has a {key!r} key, which would clash with the tool_use block")
        block[key] = clone_json(value)
    return block


def result_to_tool(block: Mapping[str, Any], where: str) -> Message:
    cid = block.get("tool_use_id")
    if not isinstance(cid, str) or not cid:
        raise InputError(f"{where}: tool_result block without a string 'tool_use_id'")
    msg: Message = {"role": "tool", "tool_call_id": cid}
    if "content" in block:
        content = block["content"]
        if isinstance(content, str):
            msg["content"] = content
        elif isinstance(content, list):
            msg["content"] = blocks_to_parts(content, f"{where}, tool_result {cid!r}")
        else:
            raise InputError(f"{where}: content of tool_result {cid!r} is a {type(content).__name__}; expected a string or a list of blocks")
    else:
        msg["content"] = None
    for key, value in block.items():
        if key in ("type", "tool_use_id", "content"):
            continue
        if key in RESERVED_OPENAI_KEYS:
            raise InputError(f"{where}: tool_result {cid!r} has a {key!r} key, which would clash with the OpenAI tool message")
        msg[key] = clone_json(value)
    return msg


def tool_to_result(msg: Mapping[str, Any], where: str) -> dict[str, Any]:
    cid = msg.get("tool_call_id")
    if not isinstance(cid, str) or not cid:
        raise InputError(f"{where}: tool message without a string 'tool_call_id'")
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": cid}
    content = msg.get("content")
    if isinstance(content, str):
        block["content"] = content
    elif isinstance(content, list):
        block["content"] = parts_to_blocks(content, where)
    elif content is not None:
        raise InputError(f"{where}: tool message content is a {type(content).__name__}")
    for key, value in msg.items():
        if key in ("role", "tool_call_id", "content", META_KEY):
            continue
        if key in ("type", "tool_use_id"):
            raise InputError(f"{where}: tool message has a {key!r} key, which would clash with the tool_result block")
        block[key] = clone_json(value)
    return block
