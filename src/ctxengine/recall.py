"""Recall: the agent gets back, verbatim, whatever compaction removed from its context.

One implementation for every engine (DESIGN §3.9). The session store already records every
original message each turn; :class:`Recall` reads them back for one session:

* ``ctx_grep`` — search the session's originals and summary nodes (case-insensitive substring,
  or a regular expression with ``mode="regex"``); snippets are verbatim;
* ``ctx_expand`` — the originals behind an id: a summary node's messages in order, or one
  stored message (the ``ref=`` of a ``[ctxengine:cut …]`` marker), within a token budget;
* ``ctx_describe`` — a node's metadata, parents and children with previews.

The manager offers these tools (:meth:`Recall.tool_schemas`) only once a session's context has
lost text and a store is enabled — tool definitions cost tokens on every request — and answers
the model's calls itself (:meth:`Recall.handle`). Engines that name their tools otherwise get
aliases: ``Recall(store, sid, aliases=LCM_ALIASES)`` answers ``lcm_grep``, ``lcm_describe`` and
``lcm_expand`` with the same code. :meth:`Recall.retrievable` is the preservation check of
DESIGN §3.3 #8: a fact missing from the context still counts when ``ctx_grep`` returns it
verbatim.

Every answer is a JSON string; a bad argument or an unknown id comes back as ``{"error": …}``
for the model to read, never as an exception out of the agent loop.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ctxengine.errors import CtxEngineError, InputError, NotFoundError
from ctxengine.messages import Message, message_text
from ctxengine.storage import RecallStore
from ctxengine.tokens import EstimateCounter, TokenCounter

__all__ = [
    "DESCRIBE_TOOL",
    "EXPAND_DEFAULT_TOKENS",
    "EXPAND_TOOL",
    "GREP_DEFAULT_LIMIT",
    "GREP_TOOL",
    "LCM_ALIASES",
    "Recall",
]

GREP_TOOL = "ctx_grep"
EXPAND_TOOL = "ctx_expand"
DESCRIBE_TOOL = "ctx_describe"

LCM_ALIASES: dict[str, str] = {
    "lcm_grep": GREP_TOOL,
    "lcm_describe": DESCRIBE_TOOL,
    "lcm_expand": EXPAND_TOOL,
}
"""The lossless engine's historical tool names, answered by the generic tools."""

GREP_DEFAULT_LIMIT = 20
"""Results of one ``ctx_grep`` answer unless the model asks for more (at most 100)."""

EXPAND_DEFAULT_TOKENS = 8000
"""Default budget of one ``ctx_expand`` answer: enough for a few tool outputs, small enough
that reading them back does not itself overflow the window."""

_PREVIEW_CHARS = 160


def _preview(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= _PREVIEW_CHARS else one[: _PREVIEW_CHARS - 1] + "…"


def _schemas() -> dict[str, dict[str, Any]]:
    return {
        GREP_TOOL: {
            "description": (
                "Search the full original conversation, including everything cut or summarized away from "
                "the context. Returns matching lines verbatim with message and summary ids (for ctx_expand)."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {
                        "type": "string",
                        "description": "Text to find (case-insensitive), or a regular expression with mode=regex.",
                    },
                    "mode": {
                        "type": "string",
                        "enum": ["text", "regex"],
                        "description": "text (default) or regex.",
                    },
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 100,
                        "description": f"Most results to return (default {GREP_DEFAULT_LIMIT}).",
                    },
                },
                "required": ["query"],
            },
        },
        EXPAND_TOOL: {
            "description": (
                "Return the original messages behind an id, verbatim and in order, within a token budget "
                "(page with offset): a summary node id, or the ref= of a [ctxengine:cut ...] marker."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "id": {
                        "type": "string",
                        "description": "A summary node id, a message id, or a cut marker's ref.",
                    },
                    "max_tokens": {
                        "type": "integer",
                        "minimum": 100,
                        "description": f"Token budget of the answer (default {EXPAND_DEFAULT_TOKENS}).",
                    },
                    "offset": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "Index of the first message to return (default 0).",
                    },
                },
                "required": ["id"],
            },
        },
        DESCRIBE_TOOL: {
            "description": "Show a summary node: depth, size, parents and children (messages or lower summaries) with previews.",
            "parameters": {
                "type": "object",
                "properties": {"id": {"type": "string", "description": "A summary node id."}},
                "required": ["id"],
            },
        },
    }


class Recall:
    """Store-backed recall tools for one session (see the module docstring).

    ``tools`` chooses which generic tools are offered (default ``ctx_grep`` and ``ctx_expand``;
    ``ctx_describe`` is answered whenever asked). ``aliases`` maps extra tool names onto the
    generic ones; an aliased tool is offered under its alias only, so the model sees one name
    per tool. ``scope="all"`` lets ``ctx_grep`` search every stored session.
    """

    def __init__(
        self,
        store: RecallStore,
        session_id: str,
        *,
        counter: TokenCounter | None = None,
        aliases: Mapping[str, str] | None = None,
        tools: tuple[str, ...] = (GREP_TOOL, EXPAND_TOOL),
    ) -> None:
        if store is None:
            raise InputError("Recall needs a store (the session store that records the originals)")
        self.store = store
        self.session_id = str(session_id)
        self.counter: TokenCounter = counter or EstimateCounter()
        self.aliases: dict[str, str] = dict(aliases or {})
        for alias, target in self.aliases.items():
            if target not in (GREP_TOOL, EXPAND_TOOL, DESCRIBE_TOOL):
                raise InputError(
                    f"recall alias {alias!r} points at {target!r}, not one of {GREP_TOOL}, {EXPAND_TOOL}, {DESCRIBE_TOOL}"
                )
        self.tools = tuple(tools)

    def with_session(self, session_id: str) -> Recall:
        """The same tools over another session of the same store."""
        return Recall(
            self.store, session_id, counter=self.counter, aliases=self.aliases, tools=self.tools
        )

    # -- the tool surface ----------------------------------------------------------------------
    def names(self) -> set[str]:
        """Every tool name :meth:`handle` answers (generic names and aliases)."""
        return {GREP_TOOL, EXPAND_TOOL, DESCRIBE_TOOL, *self.aliases}

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tool definitions to offer (``{"name", "description", "parameters"}``), aliased
        tools under their alias names."""
        schemas = _schemas()
        out: list[dict[str, Any]] = []
        aliased = {target: alias for alias, target in self.aliases.items()}
        offered = list(self.tools)
        for target in aliased:
            if target not in offered:
                offered.append(target)
        for generic in offered:
            name = aliased.get(generic, generic)
            out.append({"name": name, **schemas[generic]})
        return out

    def handle(self, name: str, args: Mapping[str, Any] | str | None) -> str:
        """Answer one tool call; the result is a JSON string (``{"error": …}`` on bad input)."""
        generic = self.aliases.get(name, name)
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                return json.dumps({"error": f"{name}: arguments are not JSON"})
        if args is None:
            args = {}
        if not isinstance(args, Mapping):
            return json.dumps({"error": f"{name}: arguments must be an object"})
        try:
            if generic == GREP_TOOL:
                return _dump(self.grep(**_pick(args, ("query", "mode", "scope", "limit"))))
            if generic == EXPAND_TOOL:
                ref = args.get("id", args.get("node_id", args.get("ref")))
                return _dump(self.expand(ref, **_pick(args, ("max_tokens", "offset"))))
            if generic == DESCRIBE_TOOL:
                return _dump(self.describe(args.get("id", args.get("node_id"))))
        except (TypeError, ValueError) as exc:
            return json.dumps({"error": f"{name}: bad arguments: {exc}"})
        except CtxEngineError as exc:
            return json.dumps({"error": f"{name}: {exc}"})
        return json.dumps({"error": f"Unknown tool: {name}"})

    # -- the tools -------------------------------------------------------------------------------
    def grep(
        self,
        query: Any,
        mode: str = "text",
        scope: str = "session",
        limit: int = GREP_DEFAULT_LIMIT,
    ) -> dict[str, Any]:
        """``ctx_grep``: matching originals and summaries, snippets verbatim."""
        if not isinstance(query, str) or not query:
            raise InputError("query must be a non-empty string")
        if mode not in ("text", "regex"):
            raise InputError(f"mode must be 'text' or 'regex', not {mode!r}")
        if scope not in ("session", "all"):
            raise InputError(f"scope must be 'session' or 'all', not {scope!r}")
        n = max(1, min(100, int(limit)))
        hits = self.store.search(
            query, session_id=self.session_id if scope == "session" else None, mode=mode, limit=n
        )
        results = [h.to_dict() if hasattr(h, "to_dict") else dict(h) for h in hits]
        for r in results:
            ids = r.get("message_ids")
            if isinstance(ids, list) and len(ids) > 3:
                r["message_ids"] = ids[:3]
        return {"query": query, "scope": scope, "count": len(results), "results": results}

    def expand(
        self, ref: Any, max_tokens: int = EXPAND_DEFAULT_TOKENS, offset: int = 0
    ) -> dict[str, Any]:
        """``ctx_expand``: the originals behind a node or message id, from ``offset`` within
        ``max_tokens``. At least one message is returned; one larger than four budgets has its
        text cut and ``truncated`` says so (page through a node with ``offset``)."""
        if not isinstance(ref, str) or not ref:
            raise InputError(
                "id must be a non-empty string (a summary node id, a message id, or a cut marker's ref)"
            )
        pairs = self._originals(ref)
        start = max(0, int(offset))
        budget = max(100, int(max_tokens))
        out: list[dict[str, Any]] = []
        used = 0
        i = start
        truncated = False
        while i < len(pairs):
            mid, m = pairs[i]
            t = self.counter.count_messages([m])
            if out and used + t > budget:
                break
            if not out and t > budget * 4:
                m = {**m, "content": message_text(m)[: budget * 4]}
                truncated = True
            out.append({"id": mid, "message": m})
            used += t
            i += 1
        return {
            "id": ref,
            "total": len(pairs),
            "offset": start,
            "next_offset": i if i < len(pairs) else None,
            "truncated": truncated,
            "messages": out,
        }

    def describe(self, ref: Any) -> dict[str, Any]:
        """``ctx_describe``: a node's metadata, parents and children with previews."""
        if not isinstance(ref, str) or not ref:
            raise InputError("id must be a non-empty string (a summary node id)")
        node = self.store.get_node(ref)
        msg_ids = [cid for kind, cid in node.children if kind == "message"]
        previews = (
            dict(zip(msg_ids, self.store.get_messages(msg_ids), strict=True)) if msg_ids else {}
        )
        children: list[dict[str, Any]] = []
        for kind, cid in node.children:
            if kind == "message":
                m = previews[cid]
                children.append(
                    {
                        "kind": "message",
                        "id": cid,
                        "role": m.get("role"),
                        "preview": _preview(message_text(m)),
                    }
                )
            else:
                child = self.store.get_node(cid)
                body = child.text.split("\n", 1)[1] if "\n" in child.text else child.text
                children.append(
                    {"kind": "node", "id": cid, "depth": child.depth, "preview": _preview(body)}
                )
        return {
            "id": node.id,
            "session_id": getattr(node, "session_id", self.session_id),
            "depth": node.depth,
            "tokens": getattr(node, "tokens", None),
            "meta": getattr(node, "meta", {}),
            "parents": list(getattr(node, "parents", [])),
            "children": children,
        }

    def retrievable(self, text: str) -> bool:
        """True when ``ctx_grep`` over this session returns ``text`` verbatim."""
        if not text:
            return False
        try:
            hits = self.store.search(text, session_id=self.session_id, limit=5)
        except CtxEngineError:
            return False
        return any(text in str(getattr(h, "snippet", "")) for h in hits)

    def _originals(self, ref: str) -> list[tuple[str, Message]]:
        try:
            return list(self.store.node_messages(ref))
        except NotFoundError:
            pass
        messages = self.store.get_messages([ref])  # NotFoundError names the id
        return [(ref, messages[0])]


def _pick(args: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {k: args[k] for k in names if k in args and args[k] is not None}


def _dump(data: Mapping[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, default=str)
