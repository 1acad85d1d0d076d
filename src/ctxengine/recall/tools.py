"""The recall tools over one session of a store: :class:`Recall` (``ctx_grep``,
``ctx_expand``, ``ctx_describe``; see :mod:`ctxengine.recall`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ctxengine.errors import CtxEngineError, InputError, NotFoundError
from ctxengine.messages import Message, message_text
from ctxengine.recall.answer import ENVELOPE_TOKENS, answer_page, dump, fit_answer, fit_list, pick
from ctxengine.recall.rank import Source, identifiers, message_parts, rank_lines, split_text
from ctxengine.recall.spec import (
    DESCRIBE_TOOL,
    EXPAND_DEFAULT_TOKENS,
    EXPAND_TOOL,
    GREP_CANDIDATES,
    GREP_DEFAULT_LIMIT,
    GREP_TOOL,
    INDEX_BATCH,
    PREVIEW_CHARS,
    schemas,
)
from ctxengine.storage import RecallStore
from ctxengine.tokens import EstimateCounter, TokenCounter

__all__ = ["Recall"]


def _preview(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= PREVIEW_CHARS else one[: PREVIEW_CHARS - 1] + "…"


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
        defs = schemas()
        out: list[dict[str, Any]] = []
        aliased = {target: alias for alias, target in self.aliases.items()}
        offered = list(self.tools)
        for target in aliased:
            if target not in offered:
                offered.append(target)
        for generic in offered:
            name = aliased.get(generic, generic)
            out.append({"name": name, **defs[generic]})
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
                return dump(fit_list(self.grep(**pick(args, ("query", "mode", "scope", "limit", "offset"))), "results", max_tokens, self.counter.count, name))
            if generic == EXPAND_TOOL:
                ref = args.get("id", args.get("node_id", args.get("ref")))
                picked = pick(args, ("max_tokens", "offset", "text_offset"))
                if max_tokens is not None:
                    asked = int(picked.get("max_tokens", EXPAND_DEFAULT_TOKENS))
                    picked["max_tokens"] = min(asked, max(1, int(max_tokens) - ENVELOPE_TOKENS))
                    picked["hard"] = True
                return dump(self.expand(ref, **picked))
            if generic == DESCRIBE_TOOL:
                return dump(fit_list(self.describe(args.get("id", args.get("node_id"))), "children", max_tokens, self.counter.count, name))
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
            sources = [Source(kind, role, ids, [], *split_text(role, text)) for kind, role, ids, text in rows]
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
        return answer_page(query, scope, ranked, skip, n)

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
            batch = unindexed(self.session_id, limit=INDEX_BATCH)
            if not batch:
                break
            rows = [(key, kind, ident) for key, role, text in batch for kind, ident in identifiers(role, text)]
            add(self.session_id, [key for key, _, _ in batch], rows)
            done += len(batch)
            if len(batch) < INDEX_BATCH:
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

    def _sources(self, hits: Sequence[Any]) -> list[Source]:
        """The full texts behind search hits, newest first, as lines to rank."""
        msg_hits = [h for h in hits if getattr(h, "kind", "message") == "message"]
        out: list[Source] = []
        if msg_hits:
            bodies = self.store.get_messages([str(h.id) for h in msg_hits])
            for h, m in zip(msg_hits, bodies, strict=True):
                ids = [str(i) for i in (getattr(h, "message_ids", None) or [h.id])]
                out.append(Source("message", str(h.role), ids, list(getattr(h, "session_ids", []) or []), *message_parts(m)))
        for h in hits:
            if getattr(h, "kind", "") == "node":
                try:
                    text = str(self.store.get_node(str(h.id)).text)
                except NotFoundError:
                    text = str(h.snippet)
                out.append(Source("node", "summary", [str(h.id)], list(getattr(h, "session_ids", []) or []), text, []))
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

    def originals(self, ref: str) -> list[Message]:
        """The original messages a marker's ``ref`` stands for (a node's, or one message's),
        verbatim, in order (what ``ctx_expand`` returns); NotFoundError for an unknown ref."""
        return [m for _, m in self._originals(ref)]

    def _originals(self, ref: str) -> list[tuple[str, Message]]:
        try:
            return list(self.store.node_messages(ref))
        except NotFoundError:
            pass
        messages = self.store.get_messages([ref])  # NotFoundError names the id
        return [(ref, messages[0])]
