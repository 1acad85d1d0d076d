"""Writing chains of messages: blobs and messages stored once (content-addressed,
parent-linked), tip moves and their events, and the chains this store object wrote last, by
session, so that a session recorded again in full hashes and looks up only what is new.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ctxengine.errors import StoreError
from ctxengine.messages import Message
from ctxengine.redact import redact_messages
from ctxengine.store.ids import Prepared, forget, prepare, same_prefix
from ctxengine.store.sql import Chain, SqlCore, chunks

__all__ = ["ChainWriter"]

_CHAINS_MAX = 1_024
"""Sessions whose last written history a store object remembers (see ``_known_chain``)."""

_Link = tuple["str | None", Prepared]

Stamp = float | Mapping[str, float] | None
"""When rows are created: one time for all, a time per message id (an append journal's rows
folded together keep each append's own), or ``None`` for the clock."""


def _stamper(now: Stamp) -> Callable[[str], float]:
    """The creation time of the row of each message id under ``now``."""
    if isinstance(now, Mapping):
        clock = time.time()
        return lambda mid: now.get(mid, clock)
    t = time.time() if now is None else now
    return lambda mid: t
"""A message to store and its parent's id."""


class ChainWriter(SqlCore):
    """Stores chains of messages and moves session tips (the write primitives)."""

    # -- writing chains -----------------------------------------------------------------------------
    def _store_links(
        self,
        cur: Any,
        links: Sequence[_Link],
        *,
        chain: bool = False,
        stored_parent: tuple[str, int, int] | None = None,
        now: Stamp = None,
    ) -> dict[str, int]:
        """Store messages given with their parent ids (parents first); return id → pk for all.

        ``chain``: the links form one chain (each parent is the link before, the first one's is
        stored or ``None``). Ids form a hash chain and a message is only ever stored after its
        parent, so when the first one is not stored, none is: a new conversation or a new turn
        skips the lookup of the others. ``stored_parent``: ``(id, pk, position)`` of a stored
        parent the caller already read. ``now``: the rows' creation time (default: the clock),
        or each row's by message id (:data:`Stamp`).
        """
        keys: tuple[int, int] | None = None
        added: dict[str, int] = {}
        have_blobs: dict[str, int] | None = None
        chain_is_new = False
        if chain and links:
            keys = self._next_pks(cur)
            if keys is not None:
                # blobs first: no stored message carries a blob that was not stored, so when the
                # first message's blob is new the whole chain is new (not even one lookup)
                chain_blobs = {p.blob: p for _, p in links}
                added, have_blobs = self._insert_blobs(cur, keys[0], list(chain_blobs.values()))
                chain_is_new = links[0][1].blob in added
                parent = links[0][0]
                if chain_is_new and (parent is None or (stored_parent is not None and parent == stored_parent[0])):
                    # the common turn: every message new, after a known parent (or from the root)
                    self._index_blobs(cur, [(pk, chain_blobs[h].text) for h, pk in added.items()])
                    return self._insert_chain(cur, links, keys[1], have_blobs, stored_parent if parent is not None else None, now)
            else:
                chain_is_new = self._one(cur, "SELECT pk FROM messages WHERE id = ?", (links[0][1].id,)) is None
        known = {} if chain_is_new else self._ids_to_pks(cur, "messages", [p.id for _, p in links])
        new: dict[str, _Link] = {}
        for parent, p in links:
            if p.id not in known:
                new.setdefault(p.id, (parent, p))
        if not new:
            return known
        blobs = {p.blob: p for _, p in new.values()}
        if have_blobs is None:
            keys, added, have_blobs = self._store_blobs(cur, blobs)
        if added:
            self._index_blobs(cur, [(pk, blobs[h].text) for h, pk in added.items()])
        positions = self._positions(cur, new, known, stored_parent)
        return self._insert_messages(cur, new, known, have_blobs, positions, keys[1] if keys is not None else None, now)

    def _store_blobs(self, cur: Any, blobs: Mapping[str, Prepared]) -> tuple[tuple[int, int] | None, dict[str, int], dict[str, int]]:
        """Store the blobs not stored yet; return the keys handed out (:meth:`_next_pks`), the
        hash → pk of the blobs added and of all of ``blobs``."""
        keys = self._next_pks(cur)
        if keys is not None:
            added, have = self._insert_blobs(cur, keys[0], list(blobs.values()))
            return keys, added, have
        have = self._ids_to_pks(cur, "blobs", list(blobs), column="hash")
        fresh = [p for h, p in blobs.items() if h not in have]
        self._xm(
            cur,
            "INSERT INTO blobs (hash, role, body, text, tokens) VALUES (?, ?, ?, ?, ?) ON CONFLICT (hash) DO NOTHING",
            [(p.blob, p.role, p.canonical, p.text, p.tokens) for p in fresh],
        )
        added = self._ids_to_pks(cur, "blobs", [p.blob for p in fresh], column="hash") if fresh else {}
        have.update(added)
        return None, added, have

    def _positions(self, cur: Any, new: Mapping[str, _Link], known: dict[str, int], stored_parent: tuple[str, int, int] | None) -> dict[str | None, int]:
        """The position of each new message: its parent's + 1 (parents outside the batch are
        looked up, and their keys added to ``known``)."""
        positions: dict[str | None, int] = {None: -1}
        if stored_parent is not None:
            positions[stored_parent[0]] = stored_parent[2]
            known[stored_parent[0]] = stored_parent[1]
        outside = [par for par, _ in new.values() if par is not None and par not in new and par not in positions]
        for chunk in chunks(list(dict.fromkeys(outside))):
            marks = ",".join("?" * len(chunk))
            for mid, pos, ppk in self._all(cur, f"SELECT id, position, pk FROM messages WHERE id IN ({marks})", chunk):
                positions[str(mid)] = int(pos)
                known[str(mid)] = int(ppk)
        for parent, p in new.values():
            if parent not in positions:
                raise StoreError(f"message {p.id} names parent {parent}, which is not in the store")
            positions[p.id] = positions[parent] + 1
        return positions

    def _insert_messages(
        self,
        cur: Any,
        new: Mapping[str, _Link],
        known: dict[str, int],
        blob_pks: Mapping[str, int],
        positions: Mapping[str | None, int],
        first: int | None,
        now: Stamp,
    ) -> dict[str, int]:
        """Insert the ``new`` messages (under keys from ``first`` on, or keys the database
        assigns when ``None``); return ``known`` with their keys added."""
        at = _stamper(now)
        if first is not None:
            for i, mid in enumerate(new):
                known[mid] = first + i
            self._xm(
                cur,
                "INSERT INTO messages (pk, id, parent_pk, blob_pk, position, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                [(known[p.id], p.id, known[parent] if parent is not None else None, blob_pks[p.blob], positions[p.id], at(p.id)) for parent, p in new.values()],
            )
            return known
        self._xm(
            cur,
            "INSERT INTO messages (id, parent_pk, blob_pk, position, created_at) "
            "VALUES (?, (SELECT pk FROM messages WHERE id = ?), ?, ?, ?) ON CONFLICT (id) DO NOTHING",
            [(p.id, parent, blob_pks[p.blob], positions[p.id], at(p.id)) for parent, p in new.values()],
        )
        known.update(self._ids_to_pks(cur, "messages", list(new)))
        return known

    def _insert_chain(
        self, cur: Any, links: Sequence[_Link], first: int, blob_pks: Mapping[str, int], parent: tuple[str, int, int] | None, now: Stamp = None
    ) -> dict[str, int]:
        """Insert a chain of new messages under keys from ``first`` on, after ``parent``
        (``(id, pk, position)``, ``None``: from the root); return id → pk, the parent's too."""
        pk, position = (parent[1], parent[2]) if parent is not None else (None, -1)
        out = {parent[0]: parent[1]} if parent is not None else {}
        at = _stamper(now)
        rows = []
        for i, (_, p) in enumerate(links, start=1):
            rows.append((first, p.id, pk, blob_pks[p.blob], position + i, at(p.id)))
            out[p.id] = pk = first
            first += 1
        cur.executemany(self._sql("INSERT INTO messages (pk, id, parent_pk, blob_pk, position, created_at) VALUES (?, ?, ?, ?, ?, ?)"), rows)
        return out

    def _insert_blobs(self, cur: Any, first: int, fresh: Sequence[Prepared]) -> tuple[dict[str, int], dict[str, int]]:
        """Insert blobs under keys from ``first`` on (handed out under the write lock, see
        :meth:`_next_pks`); return the hash → pk of those added and of all of ``fresh``. A blob
        already stored (the same content in another message) conflicts on its hash and is
        skipped: only then are keys read back."""
        added = {p.blob: first + i for i, p in enumerate(fresh)}
        cur.executemany(
            self._sql("INSERT INTO blobs (pk, hash, role, body, text, tokens) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (hash) DO NOTHING"),
            [(added[p.blob], p.blob, p.role, p.canonical, p.text, p.tokens) for p in fresh],
        )
        if cur.rowcount == len(fresh):
            return added, dict(added)
        have = self._ids_to_pks(cur, "blobs", list(added), column="hash")
        return {h: pk for h, pk in have.items() if added[h] == pk}, have

    def _prepare_chain(self, messages: Sequence[Message], parent_id: str | None, *, remember: bool = True) -> list[Prepared]:
        # opt-in (redaction.content): key shapes and registered secrets never reach the store
        # redacted copies are new objects each time: nothing to remember
        if self.redact_content:
            return prepare(redact_messages(messages), parent_id)
        return prepare(messages, parent_id, self._prepared if remember else None)

    def _store_chain(
        self,
        cur: Any,
        messages: Sequence[Message],
        parent_id: str | None = None,
        *,
        stored_parent: tuple[str, int, int] | None = None,
        prepared: list[Prepared] | None = None,
        now: Stamp = None,
    ) -> list[tuple[int, str]]:
        """Store ``messages`` chained after ``parent_id``; ``prepared``: their :func:`~ctxengine.store.ids.prepare`
        from that parent, done before the transaction."""
        if prepared is None:
            prepared = self._prepare_chain(messages, parent_id)
        links: list[_Link] = []
        parent = parent_id
        for p in prepared:
            links.append((parent, p))
            parent = p.id
        pks = self._store_links(cur, links, chain=True, stored_parent=stored_parent, now=now)
        return [(pks[p.id], p.id) for p in prepared]

    def _add_members(self, cur: Any, session_pk: int, message_pks: Sequence[int]) -> None:
        self._xm(
            cur,
            "INSERT INTO session_messages (session_pk, message_pk) VALUES (?, ?) ON CONFLICT (session_pk, message_pk) DO NOTHING",
            [(session_pk, pk) for pk in message_pks],
        )

    def _move_tip(
        self, cur: Any, session_pk: int, chain: Sequence[tuple[int, str]], kind: str, compaction_pk: int | None = None, *, force_event: bool = False, now: float | None = None
    ) -> None:
        row = self._one(cur, "SELECT tip_pk FROM sessions WHERE pk = ?", (session_pk,))
        old_tip = row[0] if row else None
        start = 0
        if old_tip is not None:  # from the end: the old tip is usually just before this turn's messages
            for i in range(len(chain) - 1, -1, -1):
                if chain[i][0] == old_tip:
                    start = i + 1
                    break
        self._add_members(cur, session_pk, [pk for pk, _ in chain[start:]])
        new_tip = chain[-1][0] if chain else None
        if now is None:
            now = time.time()
        if new_tip != old_tip or force_event:
            self._x(cur, "UPDATE sessions SET tip_pk = ?, updated_at = ? WHERE pk = ?", (new_tip, now, session_pk))
            self._x(
                cur,
                "INSERT INTO events (session_pk, kind, tip_pk, compaction_pk, created_at) VALUES (?, ?, ?, ?, ?)",
                (session_pk, kind, new_tip, compaction_pk, now),
            )

    # -- the chains last written, by session ----------------------------------------------------------
    def _known_chain(self, cur: Any, session_id: str, messages: Sequence[Message]) -> list[tuple[int, str]]:
        """``(pk, id)`` of the longest prefix of ``messages`` this store object wrote (or read)
        last for ``session_id`` as a history from the root, matched by identity or, past the
        identical part, as copies of the same JSON (:func:`~ctxengine.store.ids.same_prefix`:
        an engine records the deep copy of the context it was given): the same messages
        chained from the root have the same ids, and stored rows are never edited or deleted,
        so their keys need no lookup. A session recorded again in full (after a compaction, a
        cap, by an engine) then hashes and looks up only its new messages.

        Call it inside a write transaction (which has folded the append journal): the keys of
        messages appended through the journal are looked up then, once (the memo keeps them)."""
        hit = self._chains.get(session_id)
        if hit is None or not messages:
            return []
        objs, chain = hit
        k = same_prefix(messages, objs)
        if k and any(pk is None for pk, _ in chain):
            pks = self._ids_to_pks(cur, "messages", [mid for pk, mid in chain if pk is None])
            missing = [mid for pk, mid in chain if pk is None and mid not in pks]
            if missing:  # cannot happen while rows are never deleted: never guess a key
                raise StoreError(f"session {session_id!r}: message {missing[0]} was appended but is not in the store")
            chain = [(pk if pk is not None else pks[mid], mid) for pk, mid in chain]
            with self._chains_lock:
                if self._chains.get(session_id) is hit:
                    self._chains[session_id] = (objs, chain)
        return [(pk, mid) for pk, mid in chain[:k] if pk is not None]

    def forget_session(self, session_id: str, messages: Sequence[Message] = ()) -> None:
        """Forget what this object remembers of ``session_id`` in memory (the chain it wrote
        last, the serialisations of its messages and of ``messages``): the session ended in its
        caller's memory, and the store's memos follow the live sessions. Its record stays; a
        session recorded again is recognised from the store."""
        with self._chains_lock:
            hit = self._chains.pop(session_id, None)
            forget([*(hit[0] if hit is not None else ()), *messages], self._prepared)

    def _remember_chain(self, session_id: str, messages: list[Message], chain: Chain) -> None:
        """Remember a committed history of ``session_id`` (see :meth:`_known_chain`)."""
        if self.redact_content or len(messages) != len(chain):
            return
        with self._chains_lock:
            self._chains.pop(session_id, None)
            self._chains[session_id] = (messages, chain)
            while len(self._chains) > _CHAINS_MAX:
                del self._chains[next(iter(self._chains))]

    def _extend_chain(self, session_id: str, hit: tuple[list[Message], Chain], n: int, msgs: Sequence[Message], links: Chain) -> None:
        """Remember the first ``n`` messages of ``hit`` (the session's chain this object wrote
        last) followed by ``msgs``: in place while ``hit`` is still the session's memory of n
        messages (a turn then copies nothing of its history), else as new lists."""
        if self.redact_content:
            return
        with self._chains_lock:
            if self._chains.get(session_id) is hit and len(hit[1]) == n:
                hit[0].extend(msgs)
                hit[1].extend(links)
                self._chains[session_id] = self._chains.pop(session_id)  # the most recent last
                return
        self._remember_chain(session_id, [*hit[0][:n], *msgs], [*hit[1][:n], *links])

    def _chain_from_root(self, cur: Any, session_id: str, messages: list[Message], known: list[tuple[int, str]] | None = None) -> list[tuple[int, str]]:
        """:meth:`_store_chain` of a whole history, skipping the prefix already known
        (``known``: its :meth:`_known_chain`, when the caller has it)."""
        if known is None:
            known = self._known_chain(cur, session_id, messages)
        if not known:
            return self._store_chain(cur, messages)
        k = len(known)
        if k == len(messages):
            return list(known)
        pk, mid = known[-1]
        # a message's position in a chain from the root is its index
        return [*known, *self._store_chain(cur, messages[k:], mid, stored_parent=(mid, pk, k - 1))]

