"""The provider's own compaction, passed through: what the engines never touch.

A client may ask the provider to compact (Anthropic ``context_management`` edits such as
``compact_20260112``; the Responses API's ``context_management`` compaction). The provider
then answers with a compaction block (Anthropic: ``{"type": "compaction", "content": …}`` at
the head of an assistant turn) or item (Responses: ``{"type": "compaction",
"encrypted_content": …}``) that the client sends back in every later history; the provider
drops what came before it and continues from its summary. The request field is one of the
keys the proxy never touches; the blocks and items must come back byte for byte.

:func:`split` cuts a request's canonical messages at the last such compaction: everything up
to it (and the tool results answering the calls of the turn that holds it) goes upstream as
the client sent it, and the manager gets the system prompt and what follows. What the provider
counts of the frozen part, the compaction turn onwards (it drops what precedes it), is counted
in the window as a fixed part of the request, beside the tool definitions. :func:`join` puts the
frozen part back before the manager's result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ctxengine.messages import Message
from ctxengine.proxy.responses_compaction import _is_ours

__all__ = ["FROZEN_TOOL", "NEEDLE", "holds_provider_compaction", "join", "split"]

NEEDLE = b'"compaction"'
"""Bytes every body holding a compaction block or item holds (a body without them is not scanned)."""

FROZEN_TOOL = "ctxengine_provider_compacted_history"
"""The name under which the frozen part's size is counted with the tool definitions (never sent)."""


def _is_compaction(value: Any) -> bool:
    # ours (the proxy's answer to /responses/compact) are expanded, not passed through
    return isinstance(value, Mapping) and value.get("type") == "compaction" and not _is_ours(value)


def holds_provider_compaction(m: Mapping[str, Any]) -> bool:
    """Whether canonical message ``m`` carries a provider's compaction block (a content part)
    or item (kept verbatim by the Responses adapter)."""
    content = m.get("content")
    if isinstance(content, list) and any(_is_compaction(p) for p in content):
        return True
    meta = m.get("responses")
    if isinstance(meta, Mapping):
        for entry in [*(meta.get("opaque") or []), *(meta.get("items") or [])]:
            item = entry[1] if isinstance(entry, list | tuple) and len(entry) == 2 else entry
            if _is_compaction(item):
                return True
    return False


def split(messages: Sequence[Message], tools: list[Any] | None) -> tuple[list[Message], list[Message], list[Any] | None]:
    """``(frozen, live, tools)``: ``frozen`` the messages up to the last provider compaction
    (empty without one), ``live`` what the manager gets (the leading system message and what
    follows the frozen part), ``tools`` the tool list to count the window with (the frozen
    part's counted size added as a definition of its own)."""
    last = next((i for i in range(len(messages) - 1, -1, -1) if holds_provider_compaction(messages[i])), -1)
    if last < 0:
        return [], list(messages), tools
    end = last + 1
    calls = {str(c.get("id")) for c in messages[last].get("tool_calls") or [] if isinstance(c, Mapping)}
    while end < len(messages) and messages[end].get("role") == "tool" and str(messages[end].get("tool_call_id")) in calls:
        end += 1
    head = [messages[0]] if messages and messages[0].get("role") in ("system", "developer") else []
    counted = orjson.dumps(list(messages[last:end])).decode()
    sized = {"type": "function", "function": {"name": FROZEN_TOOL, "description": counted, "parameters": {"type": "object", "properties": {}}}}
    return list(messages[:end]), [*head, *messages[end:]], [*(tools or []), sized]


def join(frozen: list[Message], out: list[Message]) -> list[Message]:
    """The outgoing context: the frozen part as the client sent it, then the manager's result
    (``out``) after its system message, which stands in for the frozen one (an engine may have
    added to it)."""
    if not frozen:
        return out
    if frozen[0].get("role") in ("system", "developer") and out and out[0].get("role") in ("system", "developer"):
        return [out[0], *frozen[1:], *out[1:]]
    return [*frozen, *out]
