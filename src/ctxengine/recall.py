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
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from ctxengine.errors import CtxEngineError, InputError, NotFoundError
from ctxengine.facts import (
    _ERROR_RE,
    _ERROR_WORD_LIST,
    MAX_ERROR_LINE,
    _command_line,
    error_lines,
    paths_in,
    urls_in,
)
from ctxengine.messages import (
    Message,
    content_text,
    message_text,
    tool_call_args,
    tool_call_name,
    tool_calls,
)
from ctxengine.storage import RecallStore
from ctxengine.tokens import EstimateCounter, TokenCounter

__all__ = [
    "DESCRIBE_TOOL",
    "EXPAND_DEFAULT_TOKENS",
    "EXPAND_TOOL",
    "GREP_DEFAULT_LIMIT",
    "GREP_MAX_CHARS",
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

GREP_DEFAULT_LIMIT = 10
"""Results of one ``ctx_grep`` answer unless the model asks for more (at most 50); whatever the
limit, an answer stops at :data:`GREP_MAX_CHARS`."""

GREP_MAX_CHARS = 3_600
"""Bound of one ``ctx_grep`` answer, in characters of its JSON: at most ~1,500 tokens for any
tokenizer that spends at least one token per 2.4 characters (o200k spends one per 2.6 to 3.5 on
JSON-escaped paths and code). Results past the bound are counted in ``more`` and reached with ``offset``."""

GREP_CANDIDATES = 200
"""Matching messages (newest first) and summary nodes one search ranks."""

_LINE_CHARS = 320
"""Lines up to this long are shown whole; a longer one shows its start and the match, each cut
at whitespace, so no path, URL or error message is cut."""

_INDEX_BATCH = 500
"""Messages whose identifiers one indexing step reads and writes."""

_IDENTS_PER_MESSAGE = 2_000
"""Identifiers one message contributes to the index at most (a huge listing stays bounded)."""

_LINES_RANKED = 400
"""Distinct matching lines one search classifies (the newest first); the rest are counted."""

_LINES_SEEN = 2_000
"""Distinct matching lines one search collects at most (then it stops reading older messages)."""

_GROUP_MAX = 40
"""Distinct paths (or URLs) one identifier result lists at most."""

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
                "Search the whole conversation, including text cut or summarized away. Type what you "
                "would look for: a file name, an error class, part of a URL, a command's first words. "
                "Full paths and whole matching lines come first, repeats counted; ids are for ctx_expand."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {
                        "type": "string",
                        "description": "Text to find (case-insensitive), or a regular expression with mode=regex.",
                    },
                    "mode": {"type": "string", "enum": ["text", "regex"]},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                    "offset": {"type": "integer", "minimum": 0, "description": "Skip this many results (see next_offset)."},
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
        self._indexed_mark: tuple[Any, ...] | None = None

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
                return _dump(_fit_list(self.grep(**_pick(args, ("query", "mode", "scope", "limit", "offset"))), "results", max_tokens, self.counter.count, name))
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
        offset: int = 0,
    ) -> dict[str, Any]:
        """``ctx_grep``: what the query names, ranked for an agent (see :func:`rank_lines`).

        The answer holds at most ``limit`` results and :data:`GREP_MAX_CHARS` characters; ``more``
        counts the ranked results after them and ``next_offset`` pages on."""
        if not isinstance(query, str) or not query:
            raise InputError("query must be a non-empty string")
        if mode not in ("text", "regex"):
            raise InputError(f"mode must be 'text' or 'regex', not {mode!r}")
        if scope not in ("session", "all"):
            raise InputError(f"scope must be 'session' or 'all', not {scope!r}")
        n = max(1, min(50, int(limit)))
        skip = max(0, int(offset))
        sid = self.session_id if scope == "session" else None
        queries = [query]
        if mode == "text":
            escaped = json.dumps(query, ensure_ascii=False)[1:-1]
            if escaped != query:
                queries.append(escaped)  # tool-call arguments are stored as JSON
        texts = getattr(self.store, "search_texts", None)
        if sid is not None and mode == "text" and callable(texts):
            rows = self._indexed_candidates(queries)
            if rows is None:
                rows = texts(queries, session_id=sid, limit=GREP_CANDIDATES)
            sources = [_Source(kind, role, ids, [], *_split_text(role, text)) for kind, role, ids, text in rows]
        else:
            hits: dict[tuple[str, str], Any] = {}
            for q in queries:
                for h in self.store.search(q, session_id=sid, mode=mode, limit=GREP_CANDIDATES):
                    hits.setdefault((str(h.kind), str(h.id)), h)
            sources = self._sources(list(hits.values()))
        matches: Callable[[str], tuple[int, int] | None]
        if mode == "regex":
            from ctxengine.safe_regex import compile_pattern

            matches = compile_pattern(query)
        else:
            low = query.lower()

            def matches(line: str) -> tuple[int, int] | None:
                at = line.find(query)
                if at < 0:
                    at = line.lower().find(low)
                return None if at < 0 else (at, at + len(query))

        ranked = rank_lines(query, sources, matches, text_mode=mode == "text")
        return _answer_page(query, scope, ranked, skip, n)

    def index_identifiers(self) -> int:
        """Index the identifiers (paths, URLs, error lines, command lines) of the session's
        messages not indexed yet, in the store (:meth:`SqlStore.add_identifiers`); returns how
        many messages were indexed. ``ctx_grep`` runs it first, so only the messages recorded
        since the last search are read; a store without the index is left alone."""
        unindexed = getattr(self.store, "unindexed_texts", None)
        add = getattr(self.store, "add_identifiers", None)
        if not callable(unindexed) or not callable(add):
            return 0
        # nothing recorded since the last indexing: one row read instead of a session scan
        info = self.store.get_session(self.session_id) if hasattr(self.store, "get_session") else None
        mark = None if info is None else (info.tip, info.stored, info.updated_at)
        if mark is not None and mark == self._indexed_mark:
            return 0
        done = 0
        while True:
            batch = unindexed(self.session_id, limit=_INDEX_BATCH)
            if not batch:
                break
            rows = [(key, kind, ident) for key, role, text in batch for kind, ident in identifiers(role, text)]
            add(self.session_id, [key for key, _, _ in batch], rows)
            done += len(batch)
            if len(batch) < _INDEX_BATCH:
                break
        self._indexed_mark = mark
        return done

    def _indexed_candidates(self, queries: list[str]) -> list[tuple[str, str, list[str], str]] | None:
        find = getattr(self.store, "recall_candidates", None)
        if not callable(find):
            return None
        try:
            self.index_identifiers()
        except CtxEngineError:
            return None  # a read-only or busy store: scan instead
        rows = find(queries, session_id=self.session_id, limit=GREP_CANDIDATES)
        return None if rows is None else list(rows)

    def _sources(self, hits: Sequence[Any]) -> list[_Source]:
        """The full texts behind search hits, newest first, as lines to rank."""
        msg_hits = [h for h in hits if getattr(h, "kind", "message") == "message"]
        out: list[_Source] = []
        if msg_hits:
            bodies = self.store.get_messages([str(h.id) for h in msg_hits])
            for h, m in zip(msg_hits, bodies, strict=True):
                ids = [str(i) for i in (getattr(h, "message_ids", None) or [h.id])]
                out.append(_Source("message", str(h.role), ids, list(getattr(h, "session_ids", []) or []), *_message_parts(m)))
        for h in hits:
            if getattr(h, "kind", "") == "node":
                try:
                    text = str(self.store.get_node(str(h.id)).text)
                except NotFoundError:
                    text = str(h.snippet)
                out.append(_Source("node", "summary", [str(h.id)], list(getattr(h, "session_ids", []) or []), text, []))
        return out

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


# -- ranking ---------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Source:
    """One matching message (or summary node): its text, and its tool calls as lines
    ``(line, is_command)`` decoded from their JSON (see :func:`_message_parts`)."""

    kind: str
    role: str
    ids: list[str]
    sessions: list[str]
    text: str
    calls: list[tuple[str, bool]]


@dataclass(slots=True)
class _Result:
    type: str
    tier: int
    order: int
    text: str
    kind: str
    role: str
    ids: list[str] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    n: int = 0
    items: list[str] = field(default_factory=list)


def _main_arg(args: Any) -> str:
    if isinstance(args, str):
        return args
    if isinstance(args, Mapping):
        for k in ("command", "cmd", "input", "code", "query", "path", "file", "url"):
            v = args.get(k)
            if isinstance(v, str) and v.strip():
                return v
        return next((v for v in args.values() if isinstance(v, str) and v.strip()), "")
    return ""


def _call_lines(name: str, args: Any) -> list[tuple[str, bool]]:
    first = _command_line(args)
    out = [(f"{name}: {first}" if first else name, True)]
    body = _main_arg(args).strip().split("\n")
    out.extend((line, False) for line in body[1:])
    return out


def _message_parts(m: Message) -> tuple[str, list[tuple[str, bool]]]:
    """A message as an agent reads it: its text, and each tool call as ``name: command line``
    (the call fact of :func:`ctxengine.facts.call_facts`) then the rest of its main argument,
    decoded from the JSON the call carries."""
    calls: list[tuple[str, bool]] = []
    for c in tool_calls(m):
        calls += _call_lines(tool_call_name(c), tool_call_args(c))
    return content_text(m.get("content")), calls


_STORED_CALL = re.compile(r"^([\w.:-]+)\((\{.*\})\)$", re.MULTILINE)
"""A tool call in a message's stored search text: ``name(arguments JSON)`` on its own line."""


def _split_text(role: str, text: str) -> tuple[str, list[tuple[str, bool]]]:
    """The stored search text of a message split like :func:`_message_parts`: an assistant's
    ``name({...})`` lines are its tool calls, decoded."""
    if role != "assistant" or "({" not in text:
        return text, []
    calls: list[tuple[str, bool]] = []
    keep: list[str] = []
    last = 0
    for m in _STORED_CALL.finditer(text):
        try:
            args = json.loads(m.group(2))
        except ValueError:
            continue
        keep.append(text[last : m.start()])
        last = m.end()
        calls += _call_lines(m.group(1), args)
    if not calls:
        return text, []
    keep.append(text[last:])
    return "".join(keep).strip("\n"), calls


def identifiers(role: str, text: str) -> list[tuple[str, str]]:
    """The identifiers of a message's stored search text, ``(kind, identifier)``: its paths
    and URLs, its error lines (tool and assistant messages) and its tool calls' command lines
    (``name: command``); at most :data:`_IDENTS_PER_MESSAGE`, unique."""
    out: dict[tuple[str, str], None] = {}
    plain, calls = _split_text(role, text)
    for line, is_cmd in calls:
        if is_cmd:
            out[("command", line.strip())] = None
    out.update(dict.fromkeys(("path", p) for p in paths_in(text)))
    out.update(dict.fromkeys(("url", u) for u in urls_in(text)))
    if role in ("tool", "function", "assistant"):
        out.update(dict.fromkeys(("error", e) for e in error_lines(plain)))
    return list(out)[:_IDENTS_PER_MESSAGE]


def _matched_lines(src: _Source, query: str, find: Callable[[str], tuple[int, int] | None], text_mode: bool) -> list[tuple[str, bool, bool]]:
    """The lines of ``src`` that ``find`` matches: ``(line, is_command, is_first_line)``."""
    out: list[tuple[str, bool, bool]] = []
    text = src.text
    low = query.lower()
    lowered = text.lower() if text_mode else ""
    if text_mode and len(lowered) == len(text):
        # one C-level scan of the whole text; lines are cut around each hit
        at = lowered.find(low)
        while at >= 0:
            start = text.rfind("\n", 0, at) + 1
            end = text.find("\n", at + len(low))
            end = len(text) if end < 0 else end
            out.append((text[start:end], False, start == 0))
            at = lowered.find(low, end)
    else:
        for i, line in enumerate(text.split("\n")):
            if find(line) is not None:
                out.append((line, False, i == 0))
    out.extend((line, cmd, False) for line, cmd in src.calls if find(line) is not None)
    return out


_WORD = re.compile(r"\w")
_CODE_LINE = re.compile(r"^(?:Line )?\d+:|\bthrows\b|^\s*(?:\*|//|#|import |catch\b|}\s*catch\b)|\bnew \w+(?:Error|Exception)\(")
"""A line of source code (a numbered editor line, a signature, a comment, an import): it names an
error class without reporting an error."""
_RAISED = re.compile(r"(?:Error|Exception|Failure)\b(?::|$)|^\s*(?:Caused by|Exception in thread|\[ERROR\]|error:|E\s)|Traceback")
"""A line that reports an error (the class then its message, a cause, a compiler error)."""


def _bounded(line: str, a: int, b: int) -> bool:
    """The match ``line[a:b]`` is a whole word (or starts/ends at a non-word edge)."""
    before = a == 0 or not (_WORD.match(line[a - 1]) and _WORD.match(line[a]))
    after = b >= len(line) or not (_WORD.match(line[b]) and _WORD.match(line[b - 1]))
    return before and after


def rank_lines(
    query: str,
    sources: Sequence[_Source],
    find: Callable[[str], tuple[int, int] | None],
    *,
    text_mode: bool = False,
) -> list[_Result]:
    """The matching lines of ``sources`` (newest first), ranked for an agent.

    1. one result each (``type`` ``paths``, ``urls``, ``errors``) listing, each once, the
       full paths, the URLs and the error lines that hold the query: those naming it exactly
       first (a path or URL ending with it at a segment start, an error line that reports it
       as a whole word), then those ending with it, then the rest; newest first within each
       rank; a source line that merely names an error class comes after the errors reported;
       the group that names the query best comes first;
    2. lines that name the query as an identifier: a command line (``name: command``) that
       starts with it, a user message that starts with it;
    3. other command and summary lines holding it; 4. every other matching line.
    Identical lines from several originals are one result with their count (``n``) and ids.
    """
    low = query.lower()
    # 1. every matching line once (identical lines of many originals are common: listings,
    # repeated views), with where it occurs; classified once below
    seen: dict[tuple[str, bool], tuple[_Result, bool]] = {}
    order = 0
    for src in sources:
        if len(seen) >= _LINES_SEEN:
            break  # older messages would only add unranked lines
        for raw, is_cmd, first in _matched_lines(src, query, find, text_mode):
            line = raw.strip()
            if not line:
                continue
            key = (line, is_cmd)
            hit = seen.get(key)
            if hit is None:
                order += 1
                seen[key] = (_Result("", 0, order, line, src.kind, src.role, list(src.ids[:3]), list(src.sessions), len(src.ids)), first)
            else:
                _merge(hit[0], src)
    paths: dict[str, _Result] = {}
    urls: dict[str, _Result] = {}
    errors: dict[str, _Result] = {}
    lines: dict[str, _Result] = {}
    for (line, is_cmd), (r, first) in islice(seen.items(), _LINES_RANKED):
        idents = False
        low_line = line.lower()
        at = low_line.find(low)
        # paths and URLs only where the match sits in a token with a '/' (or is one)
        ws = max(low_line.rfind(" ", 0, max(at, 0)), low_line.rfind("\t", 0, max(at, 0))) + 1
        we = low_line.find(" ", at + len(low)) if at >= 0 else -1
        token = low_line[ws : we if we >= 0 else len(low_line)] if at >= 0 else low_line
        if "/" in token or "/" in low:
            for u in urls_in(line):
                if low in u.lower():
                    idents = True
                    _add(urls, u, "url", _ident_tier(u.lower().rstrip("/"), low), r)
            for p in paths_in(line):
                if low in p.lower():
                    idents = True
                    _add(paths, p, "path", _ident_tier(p.lower(), low), r)
        if is_cmd:
            _, _, cmd = line.partition(": ")
            tier = 0 if cmd.lower().startswith(low) or line.lower().startswith(low) else 1
            _add(lines, line, "command", tier, r)
            continue
        span = find(line)
        a, b = span if span is not None else (0, 0)
        if r.kind == "node":
            kind, tier = "summary", 2 if idents else 1
        elif any(w in low_line for w in _ERROR_WORD_LIST) and _ERROR_RE.search(line):
            # a raised or reported error before source text that merely names the class
            if not _bounded(line, a, b):
                tier = 2
            elif _CODE_LINE.search(line) is not None:
                tier = 2 if r.role == "tool" else 1
            else:
                tier = 0 if _RAISED.search(line) is not None or r.role == "tool" else 1
            _add(errors, line, "error", tier, r)
            continue
        elif r.role == "user" and first and line.lower().startswith(low):
            kind, tier = "user", 0
        elif idents:
            kind, tier = "line", 2
        else:
            kind, tier = "line", 3 if r.role != "user" else 1
        _add(lines, line, kind, tier, r)
    out: list[_Result] = []
    for group, label in ((paths, "paths"), (urls, "urls"), (errors, "errors")):
        if group:
            items = sorted(group.values(), key=lambda x: (x.tier, x.order))
            head = items[0]
            out.append(
                _Result(label, head.tier, head.order, "", head.kind, head.role, head.ids[:1],
                        list(dict.fromkeys(sid for x in items for sid in x.sessions)),
                        sum(x.n for x in items), [x.text for x in items])
            )
    # the group naming the query best first (paths before URLs before errors on a tie)
    out.sort(key=lambda x: x.tier)
    out.extend(sorted(lines.values(), key=lambda x: (x.tier, x.order)))
    if len(seen) > _LINES_RANKED:
        # older matching lines not ranked: listed last, unclassified, so ``more`` counts them
        out.extend(r for r, _ in islice(seen.values(), _LINES_RANKED, None))
    return out


def _ident_tier(ident: str, low: str) -> int:
    """0: the identifier ends with the query at a segment start (``a/Foo.java`` for
    ``Foo.java``, ``…/issues/12`` for ``12``); 1: ends with it; 2: holds it."""
    if ident.endswith(low):
        at = len(ident) - len(low)
        return 0 if at == 0 or ident[at - 1] in "/=?#&" or low.startswith("/") else 1
    return 2


def _merge(r: _Result, src: _Source) -> None:
    r.n += len(src.ids)
    for i in src.ids:
        if len(r.ids) < 3 and i not in r.ids:
            r.ids.append(i)
    for sid in src.sessions:
        if sid not in r.sessions:
            r.sessions.append(sid)


def _add(table: dict[str, _Result], text: str, kind: str, tier: int, line: _Result) -> None:
    """Count ``line``'s occurrences under ``text`` (a line, or an identifier it holds)."""
    r = table.get(text)
    if r is None:
        table[text] = _Result(kind, tier, line.order, text, line.kind, line.role, list(line.ids), list(line.sessions), line.n)
        return
    r.tier = min(r.tier, tier)
    r.order = min(r.order, line.order)
    r.n += line.n
    for i in line.ids:
        if len(r.ids) < 3 and i not in r.ids:
            r.ids.append(i)
    for sid in line.sessions:
        if sid not in r.sessions:
            r.sessions.append(sid)


def _cut(text: str, at: int, lo: int, hi: int) -> int:
    """A cut near ``at`` (within ``lo..hi``) at whitespace, so no token is split."""
    if at >= len(text):
        return len(text)
    j = text.find(" ", at, hi)
    if j >= 0:
        return j
    k = text.rfind(" ", lo, at)
    return k if k > lo else at


def _show(text: str, query: str) -> str:
    """``text`` whole when short; else its start (an error line's first MAX_ERROR_LINE
    characters at least) and the window around the match, cut at whitespace."""
    if len(text) <= _LINE_CHARS:
        return text
    head_end = _cut(text, MAX_ERROR_LINE, MAX_ERROR_LINE // 2, MAX_ERROR_LINE + 120)
    at = text.lower().find(query.lower())
    if at >= 0 and at + len(query) <= head_end:
        return text[:head_end] + " …"
    if at < 0:
        return text[:head_end] + " …"
    a = text.rfind(" ", max(head_end, at - 100), at)
    a = at if a < 0 else a + 1
    b = _cut(text, at + len(query) + 80, at + len(query), at + len(query) + 200)
    tail = " …" if b < len(text) else ""
    return f"{text[:head_end]} … {text[a:b]}{tail}"


def _render(r: _Result, query: str, scope: str, room: int) -> dict[str, Any]:
    d: dict[str, Any] = {"kind": r.kind, "type": r.type}
    if r.items:
        shown: list[str] = []
        used = 0
        for item in r.items[:_GROUP_MAX]:
            if shown and used + min(len(item), _LINE_CHARS + 200) + 4 > room:
                break
            shown.append(item)
            used += min(len(item), _LINE_CHARS + 200) + 4
        d["snippet"] = "\n".join(shown)
        if r.type == "errors":
            d["snippet"] = "\n".join(_show(x, query) for x in shown)
        if len(r.items) > len(shown):
            d["more_items"] = len(r.items) - len(shown)
    else:
        d["role"] = r.role
        d["snippet"] = _show(r.text, query)
    d["id"] = r.ids[0] if r.ids else ""
    if r.n > 1:
        d["n"] = r.n
        if len(r.ids) > 1:
            d["ids"] = r.ids
    if scope == "all":
        d["session_ids"] = r.sessions[:5]
    return d


def _answer_page(query: str, scope: str, ranked: Sequence[_Result], skip: int, limit: int) -> dict[str, Any]:
    page = ranked[skip:]
    results: list[dict[str, Any]] = []
    head = len(_dump({"query": query, "scope": scope, "count": 0, "results": [], "more": 0, "next_offset": 0,
                      "hint": "NNN more: ctx_grep with offset=NNN, or a longer query"}))
    used = head
    for r in page[:limit]:
        # the leading listing (what the query names best) may take three quarters of the answer
        share = 4 if not results else 2
        room = max(600, (GREP_MAX_CHARS - used) * (share - 1) // share) if r.items else 0
        d = _render(r, query, scope, room)
        size = len(_dump(d)) + 2
        while r.items and used + size > GREP_MAX_CHARS and room > 300:
            room //= 2  # JSON escaping made the listing larger than its room: list fewer
            d = _render(r, query, scope, room)
            size = len(_dump(d)) + 2
        if results and used + size > GREP_MAX_CHARS:
            break
        if not results and used + size > GREP_MAX_CHARS:
            d["snippet"] = d["snippet"][: max(200, GREP_MAX_CHARS - used - 400)] + " …"
            size = len(_dump(d)) + 2
        results.append(d)
        used += size
    more = len(page) - len(results)
    out: dict[str, Any] = {"query": query, "scope": scope, "count": len(results), "results": results}
    if more > 0:
        out["more"] = more
        out["next_offset"] = skip + len(results)
        out["hint"] = f"{more} more: ctx_grep with offset={skip + len(results)}, or a longer query"
    return out

