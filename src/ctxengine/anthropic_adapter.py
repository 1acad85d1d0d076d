"""A lossless adapter between Anthropic Messages payloads and OpenAI chat messages.

ctxengine works on OpenAI chat-completions messages (DESIGN §3.1). Claude users and the proxy
speak the Anthropic Messages format. :func:`anthropic_to_openai` and
:func:`openai_to_anthropic` translate between the two so that a round trip is exact:

* Anthropic → OpenAI → Anthropic gives back an identical ``(system, messages)`` payload;
* OpenAI messages made by :func:`anthropic_to_openai` → Anthropic → OpenAI are identical too.

How each Anthropic construct is carried (OpenAI side in brackets):

* ``system`` string or list of text blocks → a leading ``system`` message whose content is the
  same string or list (text blocks are already valid OpenAI text parts).
* text blocks → identical ``{"type": "text", ...}`` parts (``cache_control``, ``citations`` and
  any other key stay on the part).
* image blocks with a ``base64`` or ``url`` source → ``image_url`` parts (base64 becomes a
  ``data:<media type>;base64,...`` URL); every other key of the block stays on the part.
  Images whose source cannot be written as a URL (e.g. a Files-API ``file`` source) and every
  block type OpenAI has no name for (``document``, ``search_result``, server tool blocks …)
  are kept verbatim as parts.
* ``tool_use`` blocks → ``tool_calls`` (``input`` serialized as JSON ``arguments``; other keys
  such as ``cache_control`` on the tool call itself).
* each ``tool_result`` block → its own ``tool`` message (content string, list of parts, or
  ``None`` when the block had no content; ``is_error``, ``cache_control`` and other keys as
  keys of the tool message). Other blocks of the same user message (text, images) follow as one
  ``user`` message.
* ``thinking`` and ``redacted_thinking`` blocks → the ``thinking_blocks`` list of the
  assistant message, verbatim with their signatures (engines must not edit them: a changed
  thinking block fails Anthropic's signature check).

What OpenAI cannot express lives in one extra key, ``"anthropic"`` (:data:`META_KEY`), that
every part of ctxengine preserves like any unknown key:

* ``order``: the original block order of a message when it differs from the default
  (assistant: thinking, content, tool calls; user: tool results, then content);
* ``joins_previous``: this user message is the text/images of the Anthropic user message whose
  tool results are the ``tool`` messages right before it;
* ``new_message``: this ``tool`` message starts a new Anthropic user message although the
  message before it is a ``tool`` message too (tool results split over two user messages);
* ``message_keys``: unknown top-level keys of an Anthropic user message that was split into
  several OpenAI messages (unknown keys of other messages stay on the message itself).

When an engine rewrites a message so that its ``order`` no longer matches (e.g. it replaced a
content list by a string), the default order is used. Keys with no counterpart on the other
side are carried over unchanged, so nothing is lost; a provider may reject such keys.

The reverse direction also accepts plain OpenAI conversations (not made by this adapter):
consecutive tool messages become one user message of ``tool_result`` blocks, an assistant
string content next to tool calls becomes a text block, a message-level ``cache_control``
(as the seed's ``apply_anthropic_cache_control`` writes it) moves onto the message's last
block, and an image part's ``detail`` is dropped (Anthropic has no such setting). Round trips
of such conversations are not exact (e.g. ``'{"a":1}'`` comes back as ``'{"a": 1}'``).

Neither function mutates its arguments; results share no mutable objects with them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxengine.anthropic_blocks import (
    ASSISTANT_RANK,
    KIND_CONTENT,
    KIND_THINKING,
    KIND_TOOL_RESULT,
    KIND_TOOL_USE,
    META_KEY,
    RESERVED_OPENAI_KEYS,
    THINKING_KEY,
    THINKING_TYPES,
    USER_RANK,
    AnthropicMessage,
    AnthropicSystem,
    block_to_part,
    blocks_to_parts,
    call_to_tool_use,
    check_block,
    clone_json,
    parts_to_blocks,
    result_to_tool,
    tool_to_result,
    tool_use_to_call,
)
from ctxengine.errors import InputError
from ctxengine.messages import Message

__all__ = [
    "META_KEY",
    "THINKING_KEY",
    "AnthropicMessage",
    "AnthropicSystem",
    "ConversionMemo",
    "anthropic_message_to_openai",
    "anthropic_to_openai",
    "openai_to_anthropic",
]

_clone = clone_json  # the name this module has always had for it


# ---------------------------------------------------------------------------------------------
# Anthropic → OpenAI


def _message_extras(m: Mapping[str, Any], where: str) -> dict[str, Any]:
    extras = {k: clone_json(v) for k, v in m.items() if k not in ("role", "content")}
    if "cache_control" in extras:
        raise InputError(f"{where}: 'cache_control' belongs on a content block in the Anthropic format, not on the message")
    clash = sorted(set(extras) & RESERVED_OPENAI_KEYS)
    if clash:
        raise InputError(f"{where}: message has keys the OpenAI form uses for itself: {clash}")
    return extras


def _default_order(kinds: list[str], rank: Mapping[str, int]) -> bool:
    return kinds == sorted(kinds, key=lambda k: rank[k])


def _convert_system(system: Any) -> Message | None:
    if system is None:
        return None
    if isinstance(system, str):
        return {"role": "system", "content": system}
    if isinstance(system, list):
        return {"role": "system", "content": blocks_to_parts(system, "system")}
    raise InputError(f"system is a {type(system).__name__}; expected a string, a list of text blocks, or None")


def anthropic_to_openai(system: AnthropicSystem, messages: Sequence[AnthropicMessage]) -> list[Message]:
    """Translate an Anthropic Messages payload into OpenAI chat messages.

    ``system`` is the request's ``system`` parameter (string, list of text blocks, or ``None``
    when absent); ``messages`` its ``messages`` list. Returns a new list (a leading ``system``
    message when ``system`` is not ``None``), sharing nothing with the arguments. Raises
    :class:`InputError` naming the message and block for anything malformed.
    """
    if not isinstance(messages, list | tuple):
        raise InputError(f"messages is a {type(messages).__name__}; expected a list")
    out: list[Message] = []
    sys_msg = _convert_system(system)
    if sys_msg is not None:
        out.append(sys_msg)
    for i, m in enumerate(messages):
        out.extend(anthropic_message_to_openai(m, index=i, previous=out[-1] if out else None))
    return out


def anthropic_message_to_openai(message: AnthropicMessage, *, index: int = 0, previous: Message | None = None) -> list[Message]:
    """One Anthropic message in OpenAI form: one message, or several for a user message that
    carries tool results (one ``tool`` message each, then the user's own content).

    What :func:`anthropic_to_openai` does for each message of a list, for a caller converting a
    history message by message: ``previous`` is the last OpenAI message converted before it
    (``None`` for the first), ``index`` its position, named in errors.
    """
    where = f"message {index}"
    if not isinstance(message, dict):
        raise InputError(f"{where}: a {type(message).__name__}, not an object")
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise InputError(f"{where}: role {role!r}; Anthropic messages are 'user' or 'assistant'")
    if "content" not in message:
        raise InputError(f"{where}: no 'content'")
    content = message["content"]
    extras = _message_extras(message, where)
    if isinstance(content, str):
        return [{"role": role, "content": content, **extras}]
    if not isinstance(content, list):
        raise InputError(f"{where}: content is a {type(content).__name__}; expected a string or a list of blocks")
    if role == "assistant":
        return [_assistant_to_openai(content, extras, where)]
    return _user_to_openai(content, extras, where, previous=previous)


def _assistant_to_openai(content: list[Any], extras: dict[str, Any], where: str) -> Message:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    thinking: list[dict[str, Any]] = []
    kinds: list[str] = []
    for j, raw in enumerate(content):
        bwhere = f"{where}, block {j}"
        block = check_block(raw, bwhere)
        btype = block["type"]
        if btype in THINKING_TYPES:
            thinking.append(clone_json(block))
            kinds.append(KIND_THINKING)
        elif btype == "tool_use":
            calls.append(tool_use_to_call(block, bwhere))
            kinds.append(KIND_TOOL_USE)
        elif btype == "tool_result":
            raise InputError(f"{bwhere}: tool_result block in an assistant message (tool results go in user messages)")
        else:
            parts.append(block_to_part(block, bwhere))
            kinds.append(KIND_CONTENT)
    msg: Message = {"role": "assistant", "content": parts or None}
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg[THINKING_KEY] = thinking
    msg.update(extras)
    if not _default_order(kinds, ASSISTANT_RANK):
        msg[META_KEY] = {"order": kinds}
    return msg


def _user_to_openai(content: list[Any], extras: dict[str, Any], where: str, previous: Message | None) -> list[Message]:
    parts: list[dict[str, Any]] = []
    results: list[Message] = []
    kinds: list[str] = []
    for j, raw in enumerate(content):
        bwhere = f"{where}, block {j}"
        block = check_block(raw, bwhere)
        btype = block["type"]
        if btype == "tool_result":
            results.append(result_to_tool(block, bwhere))
            kinds.append(KIND_TOOL_RESULT)
        elif btype == "tool_use":
            raise InputError(f"{bwhere}: tool_use block in a user message (tool calls come from the assistant)")
        else:
            parts.append(block_to_part(block, bwhere))
            kinds.append(KIND_CONTENT)
    if not results:
        return [{"role": "user", "content": parts, **extras}]
    first_meta: dict[str, Any] = {}
    if previous is not None and previous.get("role") == "tool":
        first_meta["new_message"] = True
    if extras:
        first_meta["message_keys"] = extras
    if first_meta:
        results[0][META_KEY] = first_meta
    if not parts:
        return results
    user_meta: dict[str, Any] = {"joins_previous": True}
    if not _default_order(kinds, USER_RANK):
        user_meta["order"] = kinds
    return [*results, {"role": "user", "content": parts, META_KEY: user_meta}]


# ---------------------------------------------------------------------------------------------
# OpenAI → Anthropic


def _meta(m: Mapping[str, Any], where: str) -> dict[str, Any]:
    meta = m.get(META_KEY)
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise InputError(f"{where}: {META_KEY!r} is a {type(meta).__name__}; expected an object written by anthropic_to_openai")
    return meta


def _interleave(order: Any, lists: Mapping[str, list[dict[str, Any]]], default: Sequence[str]) -> list[dict[str, Any]]:
    """Blocks in ``order`` when it names exactly as many blocks of each kind as there are;
    otherwise in the default kind order (an engine changed the message)."""
    if isinstance(order, list) and all(isinstance(k, str) and k in lists for k in order):
        counts = {k: order.count(k) for k in lists}
        if all(counts[k] == len(v) for k, v in lists.items()):
            cursors = dict.fromkeys(lists, 0)
            out = []
            for k in order:
                out.append(lists[k][cursors[k]])
                cursors[k] += 1
            return out
    return [b for k in default for b in lists[k]]


def _place_cache_control(content: Any, cache_control: Any) -> Any:
    """Put a message-level ``cache_control`` onto the last block (the seed writes it on the
    message for empty or tool content; Anthropic wants it on a block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content, "cache_control": clone_json(cache_control)}]
    if isinstance(content, list) and content:
        last = content[-1]
        if "cache_control" not in last:
            content[-1] = {**last, "cache_control": clone_json(cache_control)}
        return content
    return None


def _outgoing_extras(m: Mapping[str, Any], skip: frozenset[str]) -> dict[str, Any]:
    return {k: clone_json(v) for k, v in m.items() if k not in skip}


_USER_SKIP = frozenset({"role", "content", META_KEY})
_ASSISTANT_SKIP = frozenset({"role", "content", "tool_calls", THINKING_KEY, META_KEY})


def _finish_message(role: str, content: Any, extras: dict[str, Any]) -> AnthropicMessage:
    if "cache_control" in extras:
        placed = _place_cache_control(content, extras["cache_control"])
        if placed is not None:
            content = placed
            del extras["cache_control"]
    return {"role": role, "content": content, **extras}


@dataclass(slots=True)
class _Group:
    """An Anthropic user message being assembled from consecutive tool messages."""

    results: list[dict[str, Any]] = field(default_factory=list)
    parts: list[dict[str, Any]] = field(default_factory=list)
    order: Any = None
    extras: dict[str, Any] = field(default_factory=dict)

    def message(self) -> AnthropicMessage:
        blocks = _interleave(self.order, {KIND_TOOL_RESULT: self.results, KIND_CONTENT: self.parts}, (KIND_TOOL_RESULT, KIND_CONTENT))
        return _finish_message("user", blocks, self.extras)


def _content_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list):
        return parts_to_blocks(content, where)
    raise InputError(f"{where}: content is a {type(content).__name__}; expected a string, a list of parts or null")


ConversionMemo = dict[int, tuple[Message, Any]]
"""What :func:`openai_to_anthropic` converted before, by message object (see its ``memo``)."""


def openai_to_anthropic(
    messages: Sequence[Message], *, memo: ConversionMemo | None = None, starts: list[int] | None = None
) -> tuple[AnthropicSystem, list[AnthropicMessage]]:
    """Translate OpenAI chat messages into an Anthropic ``(system, messages)`` payload.

    A leading ``system`` (or ``developer``) message becomes ``system`` (``None`` when there is
    none); a system message anywhere else has no Anthropic equivalent and raises
    :class:`InputError`, as does any malformed message, naming its index. Inverse of
    :func:`anthropic_to_openai` (see the module docstring for what is kept where).

    ``memo``: a dict the caller keeps from call to call (say, per conversation, whose history
    is converted again every turn): a message object converted before gives the same result
    objects as last time instead of being converted again. Messages must then not be edited in
    place (ctxengine never does), and the results are shared between calls: read-only. The
    caller bounds it (e.g. by dropping what its latest history no longer holds).

    ``starts``: a list that receives, for each Anthropic message returned, the index in
    ``messages`` of its first OpenAI message (several consecutive tool messages, and the user
    content that joins them, make one Anthropic message). Where a message starts depends only
    on the messages up to it, so a caller converting a history that grew can keep the messages
    that ended before the first change and convert from the start of the next one.
    """

    if not isinstance(messages, list | tuple):
        raise InputError(f"messages is a {type(messages).__name__}; expected a list")
    system: AnthropicSystem = None
    start = 0
    if messages and isinstance(messages[0], dict) and messages[0].get("role") in ("system", "developer"):
        system = _system_from_openai(messages[0])
        start = 1
    writer = _Writer(memo, starts)
    for i in range(start, len(messages)):
        writer.add(i, messages[i])
    writer.flush()
    return system, writer.out


class _Writer:
    """The Anthropic messages of :func:`openai_to_anthropic` being written, one OpenAI message
    at a time: consecutive tool messages (and the user content that joins them) gather into one
    user message; ``memo`` and ``starts`` as that function describes them."""

    def __init__(self, memo: ConversionMemo | None, starts: list[int] | None) -> None:
        self.memo = memo
        self.starts = starts
        self.out: list[AnthropicMessage] = []
        self.group: _Group | None = None

    def cached(self, m: Message, convert: Callable[[], Any]) -> Any:
        if self.memo is None:
            return convert()
        hit = self.memo.get(id(m))
        if hit is not None and hit[0] is m:
            return hit[1]
        value = convert()
        self.memo[id(m)] = (m, value)
        return value

    def flush(self) -> None:
        if self.group is not None:
            self.out.append(self.group.message())
            self.group = None

    def started(self, i: int) -> None:
        if self.starts is not None:
            self.starts.append(i)

    def add(self, i: int, m: Any) -> None:
        where = f"message {i}"
        if not isinstance(m, dict):
            raise InputError(f"{where}: a {type(m).__name__}, not an object")
        role = m.get("role")
        meta = _meta(m, where)
        if role == "tool":
            self.add_tool(i, m, meta, where)
        elif role == "user" and self.group is not None and meta.get("joins_previous") is True:
            self.group.parts = _content_blocks(m.get("content"), where)
            self.group.order = meta.get("order")
            self.group.extras.update(_outgoing_extras(m, _USER_SKIP))
            self.flush()
        elif role == "user":
            self.flush()
            self.out.append(self.cached(m, lambda: _user_from_openai(m, where)))
            self.started(i)
        elif role == "assistant":
            self.flush()
            self.out.append(self.cached(m, lambda: _assistant_from_openai(m, meta, where)))
            self.started(i)
        elif role in ("system", "developer"):
            raise InputError(f"{where}: a {role} message after the start has no Anthropic equivalent (Anthropic takes system text only as the 'system' parameter)")
        else:
            raise InputError(f"{where}: role {role!r} has no Anthropic equivalent")

    def add_tool(self, i: int, m: Message, meta: Mapping[str, Any], where: str) -> None:
        if self.group is None or meta.get("new_message") is True:
            self.flush()
            keys = meta.get("message_keys")
            self.group = _Group(extras=clone_json(keys) if isinstance(keys, dict) else {})
            self.started(i)
        self.group.results.append(self.cached(m, lambda: tool_to_result(m, where)))


def _user_from_openai(m: Mapping[str, Any], where: str) -> AnthropicMessage:
    content = m.get("content")
    if isinstance(content, list):
        content = parts_to_blocks(content, where)
    elif content is not None and not isinstance(content, str):
        raise InputError(f"{where}: content is a {type(content).__name__}; expected a string, a list of parts or null")
    return _finish_message("user", content, _outgoing_extras(m, _USER_SKIP))


def _system_from_openai(m: Mapping[str, Any]) -> AnthropicSystem:
    unknown = set(m) - {"role", "content"}
    if unknown:
        raise InputError(f"message 0: the system message has keys the Anthropic 'system' parameter cannot carry: {sorted(unknown)}")
    content = m.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return parts_to_blocks(content, "system")
    raise InputError(f"message 0: system content is a {type(content).__name__}")


def _assistant_from_openai(m: Mapping[str, Any], meta: Mapping[str, Any], where: str) -> AnthropicMessage:
    raw_calls = m.get("tool_calls")
    if raw_calls is not None and not isinstance(raw_calls, list):
        raise InputError(f"{where}: 'tool_calls' is a {type(raw_calls).__name__}, not a list")
    tool_uses = [call_to_tool_use(c, f"{where}, tool call {j}") for j, c in enumerate(raw_calls or [])]
    raw_thinking = m.get(THINKING_KEY)
    if raw_thinking is not None and not isinstance(raw_thinking, list):
        raise InputError(f"{where}: {THINKING_KEY!r} is a {type(raw_thinking).__name__}, not a list")
    thinking = [clone_json(check_block(b, f"{where}, {THINKING_KEY} {j}")) for j, b in enumerate(raw_thinking or [])]
    content = m.get("content")
    extras = _outgoing_extras(m, _ASSISTANT_SKIP)
    if isinstance(content, str) and not tool_uses and not thinking:
        return _finish_message("assistant", content, extras)
    parts = _content_blocks(content, where)
    blocks = _interleave(meta.get("order"), {KIND_THINKING: thinking, KIND_CONTENT: parts, KIND_TOOL_USE: tool_uses}, (KIND_THINKING, KIND_CONTENT, KIND_TOOL_USE))
    return _finish_message("assistant", blocks, extras)
