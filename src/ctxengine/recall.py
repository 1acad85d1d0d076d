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

An answer can be bounded (``handle(..., max_tokens=N)``: the room left in the window, which a
proxy answering several calls in one reply shares among them): ``ctx_expand`` returns fewer
messages or the first one cut (``next_offset`` / ``next_text_offset`` say where the rest
starts), ``ctx_grep`` and ``ctx_describe`` fewer results; a ``note`` says what was left out and
how to get it. :func:`fit_answer` bounds any other tool's answer the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
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
    "fit_answer",
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
                    "text_offset": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "Character where the first message's text starts (a cut answer's next_text_offset).",
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

    def handle(
        self,
        name: str,
        args: Mapping[str, Any] | str | None,
        *,
        max_tokens: int | None = None,
        count: Callable[[str], int] | None = None,
    ) -> str:
        """Answer one tool call; the result is a JSON string (``{"error": …}`` on bad input).

        ``max_tokens`` bounds the answer (counted with ``count``, default this recall's counter):
        fewer messages or results, the first message cut, and a ``note`` saying what was left
        out and how to get it (see the module docstring)."""
        answer = self._handle(name, args, max_tokens)
        if max_tokens is None:
            return answer
        measure = count or self.counter.count
        bound = max(1, int(max_tokens))
        for _ in range(4):  # each answer is sized on the estimate: shrink until it measures under
            size = measure(answer)
            if size <= bound:
                return answer
            bound_next = max(1, bound - (size - int(max_tokens)) - 8)
            if bound_next >= bound:
                break
            bound = bound_next
            answer = self._handle(name, args, bound)
        return fit_answer(answer, int(max_tokens), measure, tool=name)

    def _handle(self, name: str, args: Mapping[str, Any] | str | None, max_tokens: int | None) -> str:
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
                return _dump(_fit_list(self.grep(**_pick(args, ("query", "mode", "scope", "limit"))), "results", max_tokens, self.counter.count, name))
            if generic == EXPAND_TOOL:
                ref = args.get("id", args.get("node_id", args.get("ref")))
                picked = _pick(args, ("max_tokens", "offset", "text_offset"))
                if max_tokens is not None:
                    asked = int(picked.get("max_tokens", EXPAND_DEFAULT_TOKENS))
                    picked["max_tokens"] = min(asked, max(1, int(max_tokens) - _ENVELOPE_TOKENS))
                    picked["hard"] = True
                return _dump(self.expand(ref, **picked))
            if generic == DESCRIBE_TOOL:
                return _dump(_fit_list(self.describe(args.get("id", args.get("node_id"))), "children", max_tokens, self.counter.count, name))
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
        self, ref: Any, max_tokens: int = EXPAND_DEFAULT_TOKENS, offset: int = 0, text_offset: int = 0, *, hard: bool = False
    ) -> dict[str, Any]:
        """``ctx_expand``: the originals behind a node or message id, from ``offset`` within
        ``max_tokens``. At least one message is returned; one larger than four budgets (with
        ``hard``, larger than the budget: the window's room) has its text cut, ``truncated``
        says so and ``next_text_offset`` is where the rest starts (``text_offset`` starts the
        first message's text there). Page through a node with ``offset``."""
        if not isinstance(ref, str) or not ref:
            raise InputError(
                "id must be a non-empty string (a summary node id, a message id, or a cut marker's ref)"
            )
        pairs = self._originals(ref)
        start = max(0, int(offset))
        skip = max(0, int(text_offset))
        budget = max(1 if hard else 100, int(max_tokens))
        out: list[dict[str, Any]] = []
        used = 0
        i = start
        truncated = False
        next_text: int | None = None
        while i < len(pairs):
            mid, m = pairs[i]
            if not out and skip:
                m = {**m, "content": message_text(m)[skip:]}
            t = self.counter.count_messages([m])
            if out and used + t > budget:
                break
            if not out and t > (budget if hard else budget * 4):
                text = message_text(m)
                keep = max(1, len(text) * budget // max(t, 1)) if hard else budget * 4
                m = {**m, "content": text[:keep]}
                truncated = True
                next_text = skip + keep
                out.append({"id": mid, "message": m})
                break
            out.append({"id": mid, "message": m})
            used += t
            i += 1
        result: dict[str, Any] = {
            "id": ref,
            "total": len(pairs),
            "offset": start,
            "next_offset": i if next_text is not None or i < len(pairs) else None,
            "truncated": truncated,
            "messages": out,
        }
        if next_text is not None:
            result["next_text_offset"] = next_text
            result["note"] = (
                f"message {i} was cut at character {next_text:,} to fit the room left in the context window; "
                f"call ctx_expand with id={ref!r}, offset={i}, text_offset={next_text} for the rest"
            )
        elif hard and i < len(pairs):
            result["note"] = (
                f"{len(pairs) - i} more message(s) not shown to fit the room left in the context window; "
                f"call ctx_expand with id={ref!r}, offset={i} for the rest"
            )
        return result

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


_ENVELOPE_TOKENS = 90
"""Tokens of an answer besides its messages or results (keys, ids, a note)."""


def _fit_list(data: dict[str, Any], key: str, max_tokens: int | None, count: Callable[[str], int], tool: str) -> dict[str, Any]:
    """``data`` with its ``key`` list shortened from the end until the answer fits
    ``max_tokens`` (unchanged without a bound), and a note saying what was left out."""
    items = data.get(key)
    if max_tokens is None or not isinstance(items, list) or count(_dump(data)) <= max_tokens:
        return data
    budget = max(0, int(max_tokens) - _ENVELOPE_TOKENS - count(_dump({**data, key: []})))
    kept: list[Any] = []
    used = 0
    for item in items:
        t = count(_dump(item)) + 1
        if used + t > budget:
            break
        kept.append(item)
        used += t
    left = len(items) - len(kept)
    how = "narrow the query or ask with a smaller limit" if tool.endswith("grep") else "describe the children one by one"
    return {**data, key: kept, "omitted": left, "note": f"{left} of {len(items)} {key} not shown to fit the room left in the context window; {how}"}


def fit_answer(answer: str, max_tokens: int, count: Callable[[str], int], *, tool: str = "the tool") -> str:
    """``answer`` when it is at most ``max_tokens`` (by ``count``), else a JSON object holding
    its head (``text``), ``truncated``, and a ``note`` saying what was cut and how to get the
    rest (for an answer no tool could shorten itself)."""
    size = count(answer)
    if size <= max_tokens:
        return answer
    room = max(0, max_tokens - _ENVELOPE_TOKENS)
    keep = len(answer) * room // max(size, 1)
    for _ in range(6):
        out = json.dumps(
            {
                "truncated": True,
                "text": answer[:keep],
                "note": (
                    f"{tool}'s answer ({size:,} tokens) was cut to its first {keep:,} of {len(answer):,} characters to fit "
                    "the room left in the context window; ask for less (a narrower query, an offset) for the rest"
                ),
            },
            ensure_ascii=False,
        )
        if count(out) <= max_tokens or keep == 0:
            return out
        keep = keep * 3 // 4
    return out


def _pick(args: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {k: args[k] for k in names if k in args and args[k] is not None}


def _dump(data: Mapping[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, default=str)
