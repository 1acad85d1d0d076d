"""SQLite's full-text indexes and recall's lookups over them.

* The words of every message (FTS5 ``blobs_fts``), indexed lazily: a write only stores a
  message, and the next search that needs the index (or opening the store) indexes what was
  written since, in one pass.
* Summary nodes (``nodes_fts``), indexed when added.
* Recall's identifiers (paths, URLs, error and command lines; FTS5 ``trigram``): any substring
  of three characters or more is an index lookup.

:func:`fts5_query` turns a substring into an FTS5 query whose matches include every text that
contains it; the exact substring check runs on the candidates. The texts of recall's candidate
messages are kept in memory by key (stored rows never change), so a search reads only their
keys and positions from the database.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from contextlib import suppress
from typing import Any, ClassVar, Literal

from ctxengine.errors import StoreError
from ctxengine.store.migrations import current_version
from ctxengine.store.recall_index import RecallIndex
from ctxengine.store.search import Search
from ctxengine.store.sql import chunks
from ctxengine.store.values import SearchHit, SearchMode

__all__ = ["SqliteIndexes", "fts5_query"]

_FTS_TOKEN = re.compile(r"\w+")

_WINDOW = 6


def _rarity(word: str) -> int:
    """A guess at how rare a word is, without reading the index: long words, numbers and
    identifiers (digits, inner capitals) are rare; "the", "in", "for" are everywhere."""
    score = len(word)
    if any(c.isdigit() for c in word):
        score += 6
    if any(c.isupper() for c in word[1:]):
        score += 4
    return score


_IDENT_ROWS = 5_000
"""Identifier rows (newest first) one recall lookup reads at most: a query that names thousands
(``java``) still answers from the newest messages, in bounded time."""


def fts5_query(needle: str) -> str | None:
    """An FTS5 query whose matches include every text containing ``needle`` as a substring.

    The query is a phrase of at most six adjacent words of the needle, the window with the
    rarest-looking words (:func:`_rarity`): one rare word makes the phrase selective, so few
    candidates reach the exact substring check, and a short phrase keeps the index lookups few.
    The first word of the needle may be the tail of a longer word in the text, so it is used
    only when nothing else is left; the last may be the head of one, so it matches as a prefix.
    ``None`` when the needle has no word: the caller scans instead.
    """
    words = _FTS_TOKEN.findall(needle)
    if not words:
        return None
    first_cut = needle[0].isalnum() or needle[0] == "_"
    start = 1 if first_cut and len(words) > 1 else 0
    inner = words[start:]
    size = min(_WINDOW, len(inner))
    best = max(range(len(inner) - size + 1), key=lambda i: (sum(_rarity(w) for w in inner[i : i + size]), -i))
    window = inner[best : best + size]
    prefix = " *" if best + size == len(inner) else ""
    return '"' + " ".join(window) + '"' + prefix


class SqliteIndexes(Search, RecallIndex):
    """The full-text indexes of the SQLite backend and the lookups recall makes through them."""

    _join_in_order: ClassVar[str] = "CROSS JOIN"  # SQLite joins tables in the order written

    def __init__(self) -> None:
        super().__init__()
        self._texts: dict[int, tuple[str, str, str]] = {}  # blob key -> role, text, text folded
        self._texts_chars = 0

    def _forget_texts(self) -> None:
        """Drop the texts kept in memory (the store's file was replaced: keys name other rows)."""
        self._texts = {}
        self._texts_chars = 0

    def _index_missing(self, cur: Any) -> None:
        """Index blobs written after the last indexed one (pks grow, so they are a suffix)."""
        if current_version(cur, "sqlite", ensure_table=False) < 2:
            return
        last = cur.execute("SELECT COALESCE(MAX(id), 0) FROM blobs_fts_docsize").fetchone()[0]
        top = cur.execute("SELECT COALESCE(MAX(pk), 0) FROM blobs").fetchone()[0]
        if top > last:
            cur.execute("INSERT INTO blobs_fts (rowid, text) SELECT pk, text FROM blobs WHERE pk > ?", (last,))

    def _index_blobs(self, cur: Any, rows: Sequence[tuple[int, str]]) -> None:
        """Messages are indexed lazily: a write only stores them (indexing a turn's text cost
        more than the rest of recording it), and the rows written since the last search are
        indexed, in one pass, by the next search that needs the index (:meth:`search`), by
        :meth:`integrity_check` and when the store is opened. Unindexed rows are always the
        newest (primary keys grow and every catch-up indexes up to the newest row)."""

    def _index_lag(self, cur: Any) -> bool:
        """Whether messages were written since the full-text index last caught up."""
        last = cur.execute("SELECT COALESCE(MAX(id), 0) FROM blobs_fts_docsize").fetchone()[0]
        top = cur.execute("SELECT COALESCE(MAX(pk), 0) FROM blobs").fetchone()[0]
        return bool(top > last)

    def catch_up_index(self) -> None:
        """Index the messages written since the last catch-up (a no-op when there are none)."""
        with self._read() as cur:
            if current_version(cur, "sqlite", ensure_table=False) < 2 or not self._index_lag(cur):
                return
        with self._write() as cur:
            self._index_missing(cur)

    def search(self, query: str, *, session_id: str | None = None, mode: SearchMode = "text", limit: int = 20, nodes: bool = True) -> list[SearchHit]:
        if session_id is None and mode == "text":
            with suppress(StoreError):  # read-only or busy: the search scans where the index is behind
                self.catch_up_index()
        return super().search(query, session_id=session_id, mode=mode, limit=limit, nodes=nodes)

    def _index_node(self, cur: Any, pk: int, text: str) -> None:
        cur.execute("INSERT INTO nodes_fts (rowid, text) VALUES (?, ?)", (pk, text))

    def _fts_candidates(self, cur: Any, table: Literal["blobs", "nodes"], needle: str, limit: int) -> list[tuple[Any, ...]] | None:
        query = fts5_query(needle)
        if query is None or (table == "blobs" and self._index_lag(cur)):
            return None  # no word to look up, or rows the index does not hold yet: scan
        role = "b.role" if table == "blobs" else "'summary'"
        sql = (
            f"SELECT b.pk, {role}, b.text FROM {table}_fts f JOIN {table} b ON b.pk = f.rowid"
            f" WHERE {table}_fts MATCH ? AND instr(lower(b.text), lower(?)) > 0 ORDER BY f.rowid DESC LIMIT ?"
        )
        try:
            cur.execute(sql, (query, needle, limit))
        except sqlite3.OperationalError:
            return None  # a term FTS5 cannot parse: the caller scans instead
        return [tuple(r) for r in cur.fetchall()]

    # -- recall's identifier index ------------------------------------------------------------------
    def _index_identifiers(self, cur: Any, session_pk: int, blob_keys: Sequence[int]) -> None:
        for chunk in [blob_keys[i : i + 500] for i in range(0, len(blob_keys), 500)]:
            marks = ",".join("?" * len(chunk))
            cur.execute(
                f"INSERT INTO recall_idents_fts (rowid, ident) SELECT pk, ident FROM recall_idents WHERE session_pk = ? AND blob_pk IN ({marks})",
                (session_pk, *chunk),
            )

    def _identifier_blobs(self, cur: Any, session_pk: int, query: str, limit: int) -> list[int] | None:
        if len(query) < 3:
            return None
        phrase = '"' + query.replace('"', '""') + '"'
        try:
            cur.execute(
                # the trigram lookup first, then each row it found by key (CROSS JOIN keeps that
                # order: the planner would otherwise walk every identifier row of the session
                # and test it against the lookup's list, or run MATCH per row)
                "SELECT r.blob_pk FROM (SELECT rowid AS id FROM recall_idents_fts WHERE recall_idents_fts MATCH ?"
                " ORDER BY rowid DESC LIMIT ?) f CROSS JOIN recall_idents r ON r.pk = f.id WHERE r.session_pk = ?"
                " GROUP BY r.blob_pk ORDER BY r.blob_pk DESC LIMIT ?",
                (phrase, _IDENT_ROWS, session_pk, limit),
            )
        except sqlite3.OperationalError:
            return None
        return [int(r[0]) for r in cur.fetchall()]

    def _word_blobs(self, cur: Any, session_pk: int, query: str, limit: int) -> list[int] | None:
        fts = fts5_query(query)
        if fts is None or self._index_lag(cur):
            return None
        try:
            cur.execute(
                # the index's matches newest first, each kept when the session holds it, until
                # ``limit``: no list of every match, no walk over every message of the session
                "SELECT f.rowid FROM blobs_fts f WHERE blobs_fts MATCH ? AND EXISTS (SELECT 1 FROM messages m"
                " CROSS JOIN session_messages sm ON sm.message_pk = m.pk AND sm.session_pk = ? WHERE m.blob_pk = f.rowid)"
                " ORDER BY f.rowid DESC LIMIT ?",
                (fts, session_pk, limit),
            )
        except sqlite3.OperationalError:
            return None
        return [int(r[0]) for r in cur.fetchall()]

    def recall_candidates(self, queries: Sequence[str], *, session_id: str, limit: int = 200) -> list[tuple[str, str, list[str], str]] | None:
        with suppress(StoreError):  # read-only or busy: the words' index may lag, then recall scans
            self.catch_up_index()
        return super().recall_candidates(queries, session_id=session_id, limit=limit)

    # -- recall's candidates: positions from the database, texts from memory -------------------------
    def _holding(self, cur: Any, session_pk: int, blob_keys: Sequence[int], queries: Sequence[str]) -> list[tuple[int, str, str, int]]:
        positions: dict[int, int] = {}
        for chunk in chunks(blob_keys):
            marks = ",".join("?" * len(chunk))
            cur.execute(
                "SELECT m.blob_pk, MAX(m.position) FROM messages m CROSS JOIN session_messages sm ON sm.message_pk = m.pk AND sm.session_pk = ?"
                f" WHERE m.blob_pk IN ({marks}) GROUP BY m.blob_pk",
                (session_pk, *chunk),
            )
            positions.update((int(pk), int(pos)) for pk, pos in cur.fetchall())
        folded = [_fold(q) for q in queries]
        texts = self._blob_texts(cur, list(positions))
        return [(pk, role, text, positions[pk]) for pk, (role, text, low) in texts.items() if any(q in low for q in folded)]

    def _blob_texts(self, cur: Any, blob_keys: Sequence[int]) -> dict[int, tuple[str, str, str]]:
        """``role, text, folded text`` of each blob, from memory when read before (a blob's row
        never changes), else from the database (then kept, up to ``_TEXTS_MAX_CHARS``)."""
        kept = self._texts
        out: dict[int, tuple[str, str, str]] = {}
        missing: list[int] = []
        for pk in blob_keys:
            hit = kept.get(pk)
            if hit is None:
                missing.append(pk)
            else:
                out[pk] = hit
        for chunk in chunks(missing):
            cur.execute(f"SELECT pk, role, text FROM blobs WHERE pk IN ({','.join('?' * len(chunk))})", tuple(chunk))
            for pk, role, text in cur.fetchall():
                entry = (str(role), str(text), _fold(str(text)))
                out[int(pk)] = entry
                if self._texts_chars + len(entry[1]) > _TEXTS_MAX_CHARS:
                    self._forget_texts()
                    kept = self._texts
                kept[int(pk)] = entry
                self._texts_chars += len(entry[1])
        return out


_TEXTS_MAX_CHARS = 16_000_000
"""Characters of message text one store object keeps in memory for recall at most (then it
starts over): a long session's candidates are read from the database once."""

_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def _fold(text: str) -> str:
    """``text`` lowercased as SQLite's ``lower()`` does: ASCII letters only."""
    return text.lower() if text.isascii() else text.translate(_ASCII_LOWER)
