"""SQLite's append journal: a turn that only adds messages is one small row, folded into the
tables before anything reads them.

A turn that only adds messages after the message this store object wrote last for the
session (an append; or a whole history that extends the last one it wrote, the turn after a
compaction) is one row of ``append_journal``: its new messages' ids, hashes and canonical
JSON, computed once. The rows are folded into the tables, in the order they were committed,
by the next transaction that reads or writes anything else (whichever process runs it), by the
append that fills the journal to ``_FOLD_EVERY`` rows, and when a store is closed or opened.
Every read therefore sees every committed append; what changes is when the rows are written:
an append costs one small row instead of seven statements over four tables and their indexes.

:class:`AppendJournal` provides the write path's hooks (:meth:`Writes._quick_history`,
:meth:`Writes._quick_append`); the SQLite backend mixes it in and folds the journal at the start
of each transaction. PostgreSQL records appends in place (its writers run concurrently).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import orjson

from ctxengine.errors import StoreError
from ctxengine.messages import Message
from ctxengine.store.ids import Prepared, same_prefix, search_text
from ctxengine.store.sql import Chain
from ctxengine.store.writes import Writes

__all__ = ["AppendJournal"]

log = logging.getLogger(__name__)

_FOLD_EVERY = 64
"""Appends the journal holds at most: the append that reaches this many folds them all."""


class AppendJournal(Writes):
    """The append journal's writes and fold (SQLite)."""

    _journal: bool = False
    """Appends after the message this object wrote last go to the append journal."""

    _journaled: bool = False
    """This object appended to the journal since it last folded it."""

    def __init__(self) -> None:
        super().__init__()
        self._journal_kept: dict[int, tuple[str, str, list[Prepared]]] = {}
        """The rows this object journaled and not folded yet, by key: their meta and body as
        written and their messages prepared (the fold checks both texts before using them)."""

    def _quick_history(self, session_id: str, session_pk: int, messages: list[Message]) -> list[str] | None:
        hit = self._chains.get(session_id)
        k = len(hit[1]) if hit is not None else 0
        if self._journal and hit is not None and k and len(messages) > k and same_prefix(messages, hit[0]) == k:
            # the history this object wrote last, and more (the turn after a compaction)
            new = self._prepare_chain(messages[k:], hit[1][k - 1][1])
            return [mid for _, mid in hit[1][:k]] + self._journal_append(session_id, session_pk, hit, k, messages[k:], new, kind="messages")
        return None

    def _quick_append(self, session_id: str, session_pk: int, messages: list[Message], after: str, prepared: list[Prepared]) -> list[str] | None:
        hit = self._chains.get(session_id)
        n = len(hit[1]) if hit is not None else 0
        if self._journal and hit is not None and n and hit[1][n - 1][1] == after:
            # after the message this store object wrote last for the session
            return self._journal_append(session_id, session_pk, hit, n, messages, prepared)
        return None

    _JOURNAL_INSERT = "INSERT INTO append_journal (session_pk, kind, after_id, meta, body, created_at) VALUES (?, ?, ?, ?, ?, ?)"

    def _journal_insert(self, row: Sequence[Any]) -> int:
        """Insert one journal row in a transaction of its own, without folding the journal
        first; return its key (the backend's hook)."""
        with self._write() as cur:
            self._x(cur, self._JOURNAL_INSERT, row)
            return int(cur.lastrowid or 0)

    def _journal_append(
        self, session_id: str, session_pk: int, hit: tuple[list[Message], Chain], n: int, msgs: list[Message], prepared: list[Prepared], kind: str = "append"
    ) -> list[str]:
        """Journal ``msgs`` (``prepared`` after the n-th message of ``hit``, the session's chain
        this object wrote last); ``kind``: the event the fold records, as the direct write would."""
        after = hit[1][n - 1][1]
        meta = orjson.dumps([[p.id, p.blob, p.role, p.tokens] for p in prepared]).decode()
        body = "\n".join(p.canonical for p in prepared)  # canonical JSON has no raw line break
        key = self._journal_insert((session_pk, kind, after, meta, body, time.time()))
        self._journaled = True
        self._journal_kept[key] = (meta, body, prepared)
        if key >= _FOLD_EVERY:
            try:
                with self._write():
                    pass  # a write folds the journal first
            except StoreError as exc:  # the append is committed; the next transaction folds
                log.warning("session store: folding the append journal failed: %s", exc)
        self._extend_chain(session_id, hit, n, msgs, [(None, p.id) for p in prepared])
        return [p.id for p in prepared]

    def _fold_journal(self, cur: Any) -> int:
        """Write the journal's appends into the tables, in commit order, and empty it (inside
        the caller's write transaction); return how many appends were folded."""
        rows = self._all(cur, "SELECT pk, session_pk, kind, after_id, meta, body, created_at FROM append_journal ORDER BY pk")
        if not rows:
            return 0
        placed: dict[str, tuple[int, int]] = {}  # id -> (pk, position) of what this fold wrote
        kept = self._journal_kept
        run: list[tuple[Any, int, str, list[Prepared], float]] = []  # appends that continue each other
        for jpk, spk, kind, after, meta, body, created in rows:
            mine = kept.pop(int(jpk), None)
            # a row this object wrote, as it wrote it: its messages are prepared already
            prepared = mine[2] if mine is not None and mine[0] == meta and mine[1] == body else _read_row(jpk, meta, body)
            if kind == "append" and prepared:
                if run and (int(spk) != run[0][1] or str(after) != run[-1][3][-1].id):
                    self._fold_appends(cur, run, placed)  # not a continuation of the run
                    run = []
                run.append((jpk, int(spk), str(after), prepared, float(created)))
                continue
            self._fold_appends(cur, run, placed)
            run = []
            at = self._parent_at(cur, placed, jpk, after)
            chain = self._store_chain(cur, [], after, stored_parent=(after, at[0], at[1]), prepared=prepared, now=float(created))
            path: list[tuple[int, str]] = [(at[0], after), *chain]
            if kind != "append":
                # a whole history (record_messages): when the session's tip is not on it, every
                # message of it joins the session, as the direct write does
                tip = self._one(cur, "SELECT tip_pk FROM sessions WHERE pk = ?", (spk,))
                old = tip[0] if tip is not None else None
                if old is None or all(pk != old for pk, _ in path):
                    path = [*((pk, mid) for pk, mid, _ in self._chain(cur, at[0])), *chain]
            self._move_tip(cur, int(spk), path, str(kind), now=float(created))
            for i, (pk, mid) in enumerate(chain, start=1):
                placed[mid] = (pk, at[1] + i)
        self._fold_appends(cur, run, placed)
        self._x(cur, "DELETE FROM append_journal WHERE pk <= ?", (rows[-1][0],))
        self._journaled = False
        for k in [k for k in kept if k <= rows[-1][0]]:
            kept.pop(k, None)
        return len(rows)

    def _fold_appends(self, cur: Any, run: list[tuple[Any, int, str, list[Prepared], float]], placed: dict[str, tuple[int, int]]) -> None:
        """Fold appends of one session that continue each other (each after the last message of
        the one before) as one chain: its blobs, messages and memberships in one statement
        each, an event per append (its own tip and time), the session's tip moved once."""
        if not run:
            return
        spk, after = run[0][1], run[0][2]
        at = self._parent_at(cur, placed, run[0][0], after)
        prepared = [p for r in run for p in r[3]]
        stamps = {p.id: r[4] for r in run for p in r[3]}
        chain = self._store_chain(cur, [], after, stored_parent=(after, at[0], at[1]), prepared=prepared, now=stamps)
        for i, (pk, mid) in enumerate(chain, start=1):
            placed[mid] = (pk, at[1] + i)
        tip = self._one(cur, "SELECT tip_pk FROM sessions WHERE pk = ?", (spk,))
        old = tip[0] if tip is not None else None
        members = chain if old == at[0] else [(at[0], after), *chain]
        self._add_members(cur, spk, [pk for pk, _ in members])
        events: list[tuple[int, str, int, None, float]] = []
        for r in run:  # as each append's own tip move: an event where the tip changed
            new = placed[r[3][-1].id][0]
            if new != old:
                events.append((spk, "append", new, None, r[4]))
                old = new
        if events:
            self._xm(cur, "INSERT INTO events (session_pk, kind, tip_pk, compaction_pk, created_at) VALUES (?, ?, ?, ?, ?)", events)
            self._x(cur, "UPDATE sessions SET tip_pk = ?, updated_at = ? WHERE pk = ?", (events[-1][2], events[-1][4], spk))


    def _parent_at(self, cur: Any, placed: dict[str, tuple[int, int]], jpk: Any, after: str) -> tuple[int, int]:
        """``(pk, position)`` of message ``after``, which journal row ``jpk`` follows: written by
        this fold (``placed``) or read from the tables."""
        at = placed.get(after)
        if at is None:
            row = self._one(cur, "SELECT pk, position FROM messages WHERE id = ?", (after,))
            if row is None:
                raise StoreError(f"append journal row {jpk} follows message {after}, which is not in the store")
            at = (int(row[0]), int(row[1]))
        return at


def _read_row(jpk: Any, meta: Any, body: Any) -> list[Prepared]:
    """The messages of one journal row, prepared for writing from what the row holds."""
    items = json.loads(meta)
    bodies = str(body).split("\n")
    if len(bodies) != len(items):
        raise StoreError(f"append journal row {jpk} is damaged: {len(items)} ids for {len(bodies)} messages")
    return [
        Prepared(canonical, str(blob), str(mid), str(role), search_text(json.loads(canonical)), int(tokens))
        for (mid, blob, role, tokens), canonical in zip(items, bodies, strict=True)
    ]

