"""Search over stored messages and summary nodes (:meth:`SessionStore.search`): a
case-insensitive substring (the exact spelling first) or a linear-time regular expression;
hits carry the lines around the match, the match whole, and every message, session and node
that holds the text."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from ctxengine.errors import InputError
from ctxengine.safe_regex import compile_pattern
from ctxengine.store.sql import SqlCore, chunks
from ctxengine.store.values import SearchHit, SearchMode

__all__ = ["SNIPPET_CONTEXT", "Search", "snippet"]

SNIPPET_CONTEXT = 300
"""Characters of context kept on each side of a search match (the match itself is never cut)."""


def snippet(text: str, start: int, end: int, context: int = SNIPPET_CONTEXT) -> str:
    """The lines around ``text[start:end]``, at most ``context`` characters on each side.

    The match is returned whole and verbatim; an elided side is marked with ``…``.
    """
    ls = text.rfind("\n", 0, start) + 1
    le = text.find("\n", end)
    le = len(text) if le < 0 else le
    head = "" if start - ls <= context else "…"
    tail = "" if le - end <= context else "…"
    a = ls if not head else start - context
    b = le if not tail else end + context
    return f"{head}{text[a:b]}{tail}"


_Finder = Callable[[str], "tuple[int, int] | None"]
"""Finds the span of a search match in a text."""


class Search(SqlCore):
    """:meth:`search` and its scans."""

    def search(self, query: str, *, session_id: str | None = None, mode: SearchMode = "text", limit: int = 20, nodes: bool = True) -> list[SearchHit]:
        if not isinstance(query, str) or not query:
            raise InputError("the search query must be a non-empty string")
        if mode not in ("text", "regex"):
            raise InputError(f"search mode must be 'text' or 'regex', not {mode!r}")
        limit = max(1, int(limit))
        if mode == "regex":
            # linear-time engine: a model-supplied pattern cannot hang the search
            pattern: _Finder = compile_pattern(query)
        else:
            folded = re.compile(re.escape(query), re.IGNORECASE)

            def find_text(text: str) -> tuple[int, int] | None:
                at = text.find(query)  # the exact spelling first, so a verbatim fact shows verbatim
                if at >= 0:
                    return at, at + len(query)
                m = folded.search(text)
                return None if m is None else m.span()

            pattern = find_text
        with self._read() as cur:
            spk = self._session_pk(cur, session_id) if session_id is not None else None
            hits = self._search_messages(cur, spk, query, pattern, mode, limit)
            if nodes:
                hits += self._search_nodes(cur, spk, query, pattern, mode, limit)
        return hits

    def _match(self, pattern: _Finder, text: str) -> str | None:
        span = pattern(text)
        return None if span is None else snippet(text, *span)

    def _scan(self, cur: Any, sql: str, params: Sequence[Any], pattern: _Finder, limit: int) -> list[tuple[int, str, str, str]]:
        """Rows ``(pk, role, text)`` of ``sql`` (newest first) whose text matches, batch by batch."""
        out: list[tuple[int, str, str, str]] = []
        cursor = self._x(cur, sql, params)
        while len(out) < limit:
            batch = cursor.fetchmany(500)
            if not batch:
                break
            for pk, role, text in batch:
                snip = self._match(pattern, str(text))
                if snip is not None:
                    out.append((int(pk), str(role), str(text), snip))
                    if len(out) >= limit:
                        break
        return out

    def _search_messages(self, cur: Any, spk: int | None, query: str, pattern: _Finder, mode: SearchMode, limit: int) -> list[SearchHit]:
        rows: list[tuple[int, str, str, str]]
        if spk is not None:
            # one session: a direct scan of its messages is exact and bounded by the session size
            base = (
                "SELECT b.pk, b.role, b.text FROM session_messages sm JOIN messages m ON m.pk = sm.message_pk"
                " JOIN blobs b ON b.pk = m.blob_pk WHERE sm.session_pk = ?"
            )
            params: list[Any] = [spk]
            if mode == "text":
                base += f" AND {self._instr}(lower(b.text), lower(?)) > 0"
                params.append(query)
            sql = base + " GROUP BY b.pk ORDER BY MAX(m.position) DESC, b.pk DESC"
            rows = self._scan(cur, sql, params, pattern, limit)
        else:
            found = self._fts_candidates(cur, "blobs", query, limit) if mode == "text" else None
            if found:
                rows = []
                for pk, role, text in found:
                    snip = self._match(pattern, str(text))
                    if snip is not None:
                        rows.append((int(pk), str(role), str(text), snip))
            else:
                where = f" WHERE {self._instr}(lower(text), lower(?)) > 0" if mode == "text" else ""
                rows = self._scan(cur, f"SELECT pk, role, text FROM blobs{where} ORDER BY pk DESC", [query] if mode == "text" else [], pattern, limit)
        if not rows:
            return []
        # map blobs to the messages (and sessions, nodes) that carry them
        blob_pks = [r[0] for r in rows]
        msgs: dict[int, list[tuple[int, str]]] = {}
        for chunk in chunks(blob_pks):
            marks = ",".join("?" * len(chunk))
            sql = f"SELECT m.blob_pk, m.pk, m.id FROM messages m WHERE m.blob_pk IN ({marks})"
            params2: list[Any] = list(chunk)
            if spk is not None:
                sql = f"SELECT m.blob_pk, m.pk, m.id FROM messages m JOIN session_messages sm ON sm.message_pk = m.pk AND sm.session_pk = ? WHERE m.blob_pk IN ({marks})"
                params2 = [spk, *chunk]
            for bpk, mpk, mid in self._all(cur, sql + " ORDER BY m.pk", params2):
                msgs.setdefault(int(bpk), []).append((int(mpk), str(mid)))
        all_mpks = [mpk for lst in msgs.values() for mpk, _ in lst]
        covering = self._covering_nodes(cur, all_mpks)
        sessions: dict[int, list[str]] = {}
        for chunk in chunks(all_mpks):
            marks = ",".join("?" * len(chunk))
            for mpk, sid in self._all(cur, f"SELECT sm.message_pk, s.id FROM session_messages sm JOIN sessions s ON s.pk = sm.session_pk WHERE sm.message_pk IN ({marks})", chunk):
                sessions.setdefault(int(mpk), []).append(str(sid))
        hits = []
        for bpk, role, _text, snip in rows:
            carriers = msgs.get(bpk, [])
            if not carriers:
                continue
            node_ids = list(dict.fromkeys(n for mpk, _ in carriers for n in covering.get(mpk, [])))
            sids = list(dict.fromkeys(s for mpk, _ in carriers for s in sessions.get(mpk, [])))
            hits.append(SearchHit("message", carriers[0][1], role, snip, sids, [mid for _, mid in carriers], node_ids))
        return hits

    def _search_nodes(self, cur: Any, spk: int | None, query: str, pattern: _Finder, mode: SearchMode, limit: int) -> list[SearchHit]:
        sel = "SELECT n.pk, s.id, n.id, n.text FROM nodes n JOIN sessions s ON s.pk = n.session_pk"
        rows: list[tuple[Any, ...]]
        if spk is None and mode == "text":
            found = self._fts_candidates(cur, "nodes", query, limit)
            if found:
                pks = [int(r[0]) for r in found]
                marks = ",".join("?" * len(pks))
                rows = self._all(cur, f"{sel} WHERE n.pk IN ({marks}) ORDER BY n.pk DESC", pks)
            else:
                rows = self._all(cur, f"{sel} WHERE {self._instr}(lower(n.text), lower(?)) > 0 ORDER BY n.pk DESC", (query,))
        else:
            where = " WHERE n.session_pk = ?" if spk is not None else " WHERE 1 = 1"
            params: list[Any] = [spk] if spk is not None else []
            if mode == "text":
                where += f" AND {self._instr}(lower(n.text), lower(?)) > 0"
                params.append(query)
            rows = self._all(cur, f"{sel}{where} ORDER BY n.pk DESC", params)
        hits = []
        for _pk, sid, nid, text in rows:
            snip = self._match(pattern, str(text))
            if snip is not None:
                hits.append(SearchHit("node", str(nid), "summary", snip, [str(sid)], [], [str(nid)]))
                if len(hits) >= limit:
                    break
        return hits

    def _covering_nodes(self, cur: Any, message_pks: Sequence[int]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for chunk in chunks(list(dict.fromkeys(message_pks))):
            marks = ",".join("?" * len(chunk))
            for mpk, nid in self._all(cur, f"SELECT nc.message_pk, n.id FROM node_children nc JOIN nodes n ON n.pk = nc.node_pk WHERE nc.message_pk IN ({marks}) ORDER BY n.pk", chunk):
                out.setdefault(int(mpk), []).append(str(nid))
        return out
