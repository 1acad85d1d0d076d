"""The ``[ctxengine:`` record namespace: one owner of every marker ctxengine writes.

Every message (or message part) an engine writes in place of originals starts with one
header line in this namespace, so the kernel, the recall tools, the contract kit and later
compactions recognise it without knowing which engine wrote it::

    [ctxengine:cut ref=a1b2c3: 896 of 905 lines removed (~30,120 tokens); ctx_expand ref=a1b2c3]
    [ctxengine:record ref=…] / [ctxengine:digest ref=…] / [ctxengine:summary ref=…] …

``kind`` says what the text stands for (:data:`KINDS`); ``ref`` (optional) names what recall
expands back into the originals. A marked text is never compacted again: it is part of the
settled prefix (prompt caches stay warm).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxengine.messages import content_text, tool_call_id, tool_calls

__all__ = [
    "EXPAND_TOOL",
    "GREP_TOOL",
    "KINDS",
    "MARK",
    "NODE_RE",
    "Marker",
    "RecallReach",
    "call_of",
    "header",
    "is_marked",
    "is_marked_text",
    "node_header",
    "parse_header",
    "recall_pointer",
]

MARK = "[ctxengine:"
"""Prefix of every text ctxengine writes in place of originals."""

EXPAND_TOOL = "ctx_expand"
"""The recall tool that returns the originals behind a ``ref`` (offered by the kernel)."""

GREP_TOOL = "ctx_grep"
"""The recall tool that searches the originals (offered by the kernel)."""


@dataclass(slots=True)
class RecallReach:
    """Whether the model can call the recall tools: one per session, shared by the manager
    (``prepare(recall=...)`` sets :attr:`tools`) and the session's engine (it comes in
    :class:`ctxengine.engine.Services` as ``reach``), so every marker either writes says the
    same (:func:`recall_pointer`). ``tools`` is True unless the host said the tools do not
    reach the model (a client that sends no tools, e.g. aider through the proxy).

    ``live``: the text of the user messages the client rewrites in place every turn (aider
    resends the files it edits as one message, with their current contents): the model's working
    set, always in the request, which a summary must not replace (engines that plan a head and a
    tail keep them verbatim: :func:`ctxengine.engines.kit.tail.plan_head_tail`)."""

    tools: bool = True
    live: frozenset[str] = frozenset()

    def is_live(self, message: Mapping[str, Any]) -> bool:
        """Whether ``message`` is one the client rewrites in place (see :attr:`live`)."""
        content = message.get("content")
        return bool(self.live) and isinstance(content, str) and content in self.live


def recall_pointer(reach: RecallReach | bool | None = None, ref: str | None = None) -> str:
    """Where a marker says the removed text is: the one place a marker names a recall tool.

    With the recall tools reachable (``reach`` None, True, or a :class:`RecallReach` whose
    ``tools`` is True): ``ctx_expand ref=<ref>``, or ``retrievable verbatim with ctx_grep``
    without a ref. Otherwise no tool is named: ``kept verbatim in the session store`` (the
    marker and its facts say what was removed: file names, error lines).
    """
    tools = reach if isinstance(reach, bool) else (reach is None or reach.tools)
    if not tools:
        return "kept verbatim in the session store"
    if ref is not None:
        return f"{EXPAND_TOOL} ref={ref}"
    return f"retrievable verbatim with {GREP_TOOL}"

KINDS = ("cut", "record", "tool", "truncated", "digest", "summary", "system", "assistant", "lcm", "masked", "folded")
"""Kinds written today: ``cut`` (one output cut to head and tail), ``record``/``tool``/
``truncated`` (a tool pair collapsed by rules), ``digest`` (turns folded into actions and
facts), ``summary`` (an LLM or extractive summary), ``system`` (a dropped system message),
``assistant`` (superseded assistant messages), ``lcm`` (a lossless summary node), ``masked``
(a baseline's placeholder), ``folded`` (the window cap's one line for the oldest messages)."""

_HEADER_RE = re.compile(r"^\[ctxengine:(?P<kind>[a-z_]+)(?: ref=(?P<ref>[^\s:\]]+))?(?P<rest>[^\n]*)")


@dataclass(frozen=True, slots=True)
class Marker:
    """A parsed header line: its kind, the recall ref (if any) and the rest of the line."""

    kind: str
    ref: str | None
    rest: str


def header(kind: str, detail: str = "", *, ref: str | None = None) -> str:
    """The header line ``[ctxengine:<kind>[ ref=<ref>][: <detail>]]``.

    Raises ValueError for a kind or ref that would not parse back (spaces, colons, brackets).
    """
    if not re.fullmatch(r"[a-z_]+", kind):
        raise ValueError(f"record kind must be lowercase letters or '_', not {kind!r}")
    if ref is not None and (not ref or re.search(r"[\s:\]]", ref)):
        raise ValueError(f"record ref must be non-empty without spaces, ':' or ']', not {ref!r}")
    out = MARK + kind
    if ref is not None:
        out += f" ref={ref}"
    if detail:
        out += f": {detail}"
    return out + "]"


def parse_header(text: str) -> Marker | None:
    """The marker a text starts with, or None when it is not in the namespace."""
    if not text.startswith(MARK):
        return None
    m = _HEADER_RE.match(text)
    if m is None:
        return None
    return Marker(m.group("kind"), m.group("ref"), m.group("rest"))


def is_marked_text(text: str) -> bool:
    """True when ``text`` was written by ctxengine (starts with :data:`MARK`)."""
    return text.startswith(MARK)


def is_marked(message: Mapping[str, Any]) -> bool:
    """True when a message's content was written by ctxengine (a folding engine may write a
    user-role digest, so the role is not consulted)."""
    content = message.get("content")
    if isinstance(content, str):
        return content.startswith(MARK)
    return content_text(content).startswith(MARK)


def call_of(messages: Sequence[Mapping[str, Any]], i: int) -> Mapping[str, Any] | None:
    """The tool call tool result ``messages[i]`` answers: by id within its group, else by
    position (real trajectories reuse ids across groups)."""
    owner = i
    while owner > 0 and messages[owner].get("role") == "tool":
        owner -= 1
    calls = tool_calls(messages[owner])
    cid = messages[i].get("tool_call_id")
    match = next((c for c in calls if tool_call_id(c) == cid), None)
    pos = i - owner - 1
    return match if match is not None else calls[pos] if 0 <= pos < len(calls) else None


NODE_RE = re.compile(r"^\[ctxengine:lcm node=([0-9a-f]+) depth=(\d+)\]")
"""The first line of every lossless summary node: node id and depth."""


def node_header(nid: str, depth: int) -> str:
    """``[ctxengine:lcm node=<id> depth=<n>]``, the head of a lossless summary node."""
    return f"{MARK}lcm node={nid} depth={depth}]"
