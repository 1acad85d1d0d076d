"""Outputs an agent points back to: a re-read answered "unchanged since last read" brings the
earlier output back into view.

Coding agents remember what they sent, not what a context manager left of it. Claude Code
answers a repeated ``Read`` of an unchanged file with "Wasted call — file unchanged since your
last Read. Refer to that earlier tool_result instead." (other versions: "File unchanged since
last read. The content from the earlier Read tool_result in this conversation is still
current…"), Qwen Code with "[File … unchanged since last read in this session — the full content
was provided earlier in this conversation…]". When that earlier result has been folded or cut,
the model is told to look at something that is no longer there.

:func:`restore_pointed` finds such a result among a turn's new messages, finds the earlier call
of the same tool on the same file (its ``file_path`` / ``path`` / … argument, else the same
arguments), and, when that call's result is not verbatim in the working context any more, puts
it back verbatim in the pointer's own message, after the client's text (the newest message: no
cached prefix is rewritten). The earlier result comes from the caller's raw history (a client
that resends everything has it) or else from the session store, through the nodes of the
working context's markers. The window cap still applies afterwards (a restored output too
large for the window is cut like any other, its original in the store).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ctxengine.engines.kit.records import parse_header
from ctxengine.messages import Message, content_text, is_summary, tool_call_name, tool_calls

__all__ = ["POINTER_RE", "RESTORED_NOTE", "is_pointer", "restore_pointed"]

POINTER_RE = re.compile(
    r"(?i)unchanged since (?:your |the )?last read"
    r"|refer to (?:that|the) earlier tool[_ ]?result"
    r"|content from the earlier \w+ tool[_ ]?result"
    r"|full content was provided earlier"
)
"""What the clients answer a re-read with (see the module docstring)."""

PATH_KEYS = ("file_path", "absolute_path", "path", "filename", "file", "notebook_path")
"""Argument names that name the file a read is of."""

RESTORED_NOTE = "[ctxengine: the earlier output this refers to is no longer in view; it follows verbatim from the session store]"

Lookup = Callable[[str], Message | None]
"""Gives the original tool result of a tool call id, or None."""


def is_pointer(message: Mapping[str, Any]) -> bool:
    """True for a tool result that points back to an earlier one instead of repeating it."""
    if message.get("role") != "tool":
        return False
    text = content_text(message.get("content"))
    return len(text) < 2000 and POINTER_RE.search(text) is not None


def _key(call: Mapping[str, Any]) -> tuple[str, str]:
    """What makes two calls reads of the same thing: the tool's name and the file it names
    (else its whole arguments)."""
    fn = call.get("function")
    raw = fn.get("arguments") if isinstance(fn, Mapping) else None
    text = raw if isinstance(raw, str) else json.dumps(raw, sort_keys=True)
    try:
        args = json.loads(text) if isinstance(raw, str) else raw
    except ValueError:
        args = None
    if isinstance(args, Mapping):
        for k in PATH_KEYS:
            v = args.get(k)
            if isinstance(v, str) and v:
                return tool_call_name(call), v
    return tool_call_name(call), text


def _calls(messages: Iterable[Message]) -> dict[str, dict[str, Any]]:
    return {str(c.get("id")): c for m in messages if m.get("role") == "assistant" for c in tool_calls(m)}


def _earlier(messages: Sequence[Message], key: tuple[str, str], before_id: str) -> Message | None:
    """The newest result in ``messages`` of a call with ``key`` other than ``before_id``'s,
    that is itself a real output (not a pointer, not a marker)."""
    calls = _calls(messages)
    for m in reversed(messages):
        cid = str(m.get("tool_call_id"))
        if m.get("role") != "tool" or cid == before_id or is_pointer(m) or is_summary(m):
            continue
        call = calls.get(cid)
        if call is not None and _key(call) == key:
            return m
    return None


def _in_view(working: Sequence[Message], text: str) -> bool:
    return any(content_text(m.get("content")) == text for m in working if m.get("role") == "tool")


def _with_original(pointer: Message, original: Message) -> Message:
    text = content_text(original.get("content"))
    content = pointer.get("content")
    addition = f"\n\n{RESTORED_NOTE}\n{text}"
    if isinstance(content, list):
        new_content: Any = [*content, {"type": "text", "text": addition.lstrip("\n")}]
    else:
        new_content = content_text(content) + addition
    return {**pointer, "content": new_content}


def restore_pointed(
    messages: list[Message],
    start: int,
    raw: Sequence[Message],
    node_messages: Callable[[str], Sequence[Message]] | None,
) -> list[Message]:
    """``messages`` with each pointer among ``messages[start:]`` given the earlier output back
    when it is not in view (see the module docstring); the same list when nothing changed.
    ``raw``: the caller's history (searched first); ``node_messages(ref)``: the originals a
    marker's ref stands for (the session store), or None without one."""
    pointers = [i for i in range(start, len(messages)) if is_pointer(messages[i])]
    if not pointers:
        return messages
    calls = _calls(messages)
    out = messages
    for i in pointers:
        cid = str(messages[i].get("tool_call_id"))
        call = calls.get(cid)
        if call is None:
            continue
        key = _key(call)
        found = _earlier(messages[:i], key, cid)
        if found is not None:
            continue  # the earlier output is still in the working context
        original = _earlier(raw, key, cid) or _from_nodes(messages[:i], key, cid, node_messages)
        if original is None or _in_view(messages, content_text(original.get("content"))):
            continue
        if out is messages:
            out = list(messages)
        out[i] = _with_original(messages[i], original)
    return out


def _from_nodes(working: Sequence[Message], key: tuple[str, str], cid: str, node_messages: Callable[[str], Sequence[Message]] | None) -> Message | None:
    """The earlier result among the originals of the working context's markers, newest first."""
    if node_messages is None:
        return None
    for m in reversed(working):
        if not is_summary(m):
            continue
        marker = parse_header(content_text(m.get("content")))
        if marker is None or not marker.ref:
            continue
        try:
            originals = list(node_messages(marker.ref))
        except Exception:  # a node the store lost: nothing to restore from it
            continue
        found = _earlier(originals, key, cid)
        if found is not None:
            return found
    return None
