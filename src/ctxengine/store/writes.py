"""The store's writes: histories recorded and appended, compactions, restores, summary nodes.

A backend may record a turn that only adds messages after the chain this store object wrote
last without writing the tables at once (SQLite's append journal,
:mod:`ctxengine.store.journal`): the hooks :meth:`Writes._quick_history` and
:meth:`Writes._quick_append` answer such a turn, or return ``None`` for the tables to be
written now (the default, and PostgreSQL's way).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ctxengine.errors import InputError, NotFoundError
from ctxengine.messages import Message
from ctxengine.redact import redact_obj
from ctxengine.storage import NodeSpec
from ctxengine.store.chains import ChainWriter
from ctxengine.store.ids import Prepared, canonical_json, compaction_id
from ctxengine.textsafe import clean, dumps
from ctxengine.tokens import estimate_message_tokens

__all__ = ["Writes"]


class Writes(ChainWriter):
    """``record_messages``, ``record_many``, ``append_messages``, ``record_compaction``,
    ``restore``, ``add_node`` and ``add_nodes`` over the chain primitives."""

    # -- backend hooks ----------------------------------------------------------------------------
    def _quick_history(self, session_id: str, session_pk: int, messages: list[Message]) -> list[str] | None:
        """Record ``messages`` (a whole history of a session whose key is known) without a write
        transaction when the backend can (it extends the chain this object wrote last); return
        their ids, or ``None`` to write the tables now."""
        return None

    def _quick_append(self, session_id: str, session_pk: int, messages: list[Message], after: str, prepared: list[Prepared]) -> list[str] | None:
        """Append ``messages`` (``prepared`` after message ``after``) without a write transaction
        when the backend can; return their ids, or ``None`` to write the tables now."""
        return None

    # -- SessionRecorder and writes -------------------------------------------------------------------
    def record_messages(self, session_id: str, messages: Sequence[Message], *, meta: Mapping[str, Any] | None = None) -> list[str]:
        msgs = list(messages)
        known_pk = self._session_pks.get(session_id) if meta is None else None
        if known_pk is not None:
            quick = self._quick_history(session_id, known_pk, msgs)
            if quick is not None:
                return quick
        with self._write() as cur:
            spk = known_pk if known_pk is not None else self._ensure_session(cur, session_id, meta)
            chain = self._chain_from_root(cur, session_id, msgs)
            self._move_tip(cur, spk, chain, "messages")
        self._session_pks[session_id] = spk
        self._remember_chain(session_id, msgs, list(chain))
        return [mid for _, mid in chain]

    def record_many(self, histories: Iterable[tuple[str, Sequence[Message]]]) -> dict[str, list[str]]:
        """:meth:`record_messages` for many sessions in one transaction (bulk imports: one
        commit and one full-text index flush for the whole batch)."""
        out: dict[str, list[str]] = {}
        with self._write() as cur:
            for session_id, messages in histories:
                spk = self._ensure_session(cur, session_id)
                chain = self._store_chain(cur, list(messages))
                self._move_tip(cur, spk, chain, "messages")
                out[session_id] = [mid for _, mid in chain]
        return out

    def append_messages(self, session_id: str, messages: Sequence[Message], *, after: str | None = None) -> list[str]:
        msgs = list(messages)
        known_pk = self._session_pks.get(session_id)
        # the parent is named: serialise and hash before taking the write lock (each message
        # once; other writers wait only for the rows to be written)
        early = self._prepare_chain(msgs, after) if after is not None else None
        if early and known_pk is not None and after is not None:
            quick = self._quick_append(session_id, known_pk, msgs, after, early)
            if quick is not None:
                return quick
        with self._write() as cur:
            spk = known_pk if known_pk is not None else self._ensure_session(cur, session_id)
            self._lock_session(cur, spk)
            hit = self._chains.get(session_id)
            row: tuple[Any, ...] | None
            if after is not None and hit is not None and hit[1] and hit[1][-1][1] == after:
                # the message this store object wrote last for the session (rows are immutable)
                last_pk = hit[1][-1][0]
                if last_pk is None:  # appended without its row (a write writes deferred rows on entry)
                    last_pk = self._known_chain(cur, session_id, hit[0])[-1][0]
                row = (after, last_pk, len(hit[1]) - 1)
            elif after is not None:
                row = self._one(cur, "SELECT id, pk, position FROM messages WHERE id = ?", (after,))
                if row is None:
                    raise NotFoundError(f"cannot append to session {session_id!r} after message {after!r}: no such message in the store")
            else:
                row = self._one(cur, "SELECT m.id, m.pk, m.position FROM sessions s JOIN messages m ON m.pk = s.tip_pk WHERE s.pk = ?", (spk,))
            parent = str(row[0]) if row else None
            link = (str(row[0]), int(row[1]), int(row[2])) if row else None
            chain = self._store_chain(cur, msgs, parent, stored_parent=link, prepared=early)
            full = ([(int(row[1]), parent)] if row and parent else []) + chain
            self._move_tip(cur, spk, full, "append")
        # sessions are never deleted: the key stays valid once the row is committed
        self._session_pks[session_id] = spk
        hit = self._chains.get(session_id)
        if hit is not None and hit[1] and parent is not None and hit[1][-1][1] == parent:
            self._extend_chain(session_id, hit, len(hit[1]), msgs, list(chain))
        return [mid for _, mid in chain]

    def record_compaction(
        self,
        session_id: str,
        report: Mapping[str, Any],
        before: Sequence[Message],
        after: Sequence[Message],
        *,
        nodes: Sequence[NodeSpec] = (),
        node_messages: Sequence[Message] = (),
    ) -> str:
        """Record a compaction (the session's tip moves to ``after``) and, in the same
        transaction, ``nodes`` (an engine's records over its compacted context
        ``node_messages``, which is ``before`` unless the caller's copy differs, e.g. by a
        client's cache markers: then it is stored too)."""
        engine = str(report.get("engine", "unknown"))
        specs = _node_specs(nodes)
        with self._write() as cur:
            spk = self._ensure_session(cur, session_id)
            self._lock_session(cur, spk)
            before_list, after_list = list(before), list(after)
            before_chain = self._chain_from_root(cur, session_id, before_list)
            after_chain = self._chain_from_root(cur, session_id, after_list)
            before_ids = [mid for _, mid in before_chain]
            replaced_idx = report.get("replaced")
            if isinstance(replaced_idx, list) and all(isinstance(i, int) for i in replaced_idx):
                replaced = [before_ids[i] for i in replaced_idx if 0 <= i < len(before_ids)]
            else:
                kept = {canonical_json(m) for m in after}
                replaced = [before_ids[i] for i, m in enumerate(before) if canonical_json(m) not in kept]
            before_tip = before_ids[-1] if before_ids else None
            after_tip = after_chain[-1][1] if after_chain else None
            cid = compaction_id(session_id, before_tip, after_tip, engine)
            config = report.get("config") or {}
            self._x(
                cur,
                "INSERT INTO compactions (id, session_pk, created_at, engine, config, report, tokens_before, tokens_after, "
                "before_tip_pk, after_tip_pk, replaced) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                (
                    cid,
                    spk,
                    time.time(),
                    engine,
                    # redacted: a report's notes carry summarizer errors (never a secret in the store)
                    dumps(redact_obj(config), default=str),
                    dumps(redact_obj(dict(report)), default=str),
                    int(report.get("tokens_before") or 0),
                    int(report.get("tokens_after") or 0),
                    before_chain[-1][0] if before_chain else None,
                    after_chain[-1][0] if after_chain else None,
                    json.dumps(replaced),
                ),
            )
            cpk = self._one(cur, "SELECT pk FROM compactions WHERE id = ?", (cid,))
            self._add_members(cur, spk, [pk for pk, _ in before_chain])
            if specs:
                self._write_nodes(cur, session_id, spk, specs, set(before_ids), node_messages)
            self._move_tip(cur, spk, after_chain, "compaction", int(cpk[0]) if cpk else None, force_event=True)
        self._session_pks[session_id] = spk
        self._remember_chain(session_id, after_list, list(after_chain))
        return cid

    def restore(self, session_id: str, at: str) -> list[Message]:
        with self._write() as cur:
            spk = self._session_pk(cur, session_id)
            tip = self._resolve(cur, spk, at)
            chain = self._chain(cur, tip)
            self._move_tip(cur, spk, [(pk, mid) for pk, mid, _ in chain], "restore", force_event=True)
        return [json.loads(body) for _, _, body in chain]

    def add_node(
        self,
        session_id: str,
        node_id: str,
        *,
        depth: int,
        text: str,
        children: Sequence[tuple[str, str]],
        meta: Mapping[str, Any] | None = None,
    ) -> bool:
        return self.add_nodes(session_id, [NodeSpec(node_id, depth, text, list(children), dict(meta or {}))])[0]

    def message_ids(self, messages: Sequence[Message]) -> list[str]:
        """The ids ``messages`` (a history from the root) have or will have here: content
        addresses, computed without writing. The messages are not remembered by object (an
        engine asks for the deep copy it compacts, which nothing holds afterwards; a long
        message is still recognised by its text, :func:`~ctxengine.store.ids.prepare`)."""
        return [p.id for p in self._prepare_chain(list(messages), None, remember=False)]

    def add_nodes(self, session_id: str, nodes: Sequence[NodeSpec], *, messages: Sequence[Message] = ()) -> list[bool]:
        """Store ``nodes`` (each left unchanged when it exists; True for each one written) in one
        transaction, after ``messages``: a history from the root that their message children
        belong to, stored first when missing (content-addressed) and made the session's without
        moving its tip. An engine recording the context it compacts and the nodes over it then
        commits once, not once per node."""
        specs = _node_specs(nodes)
        msgs = list(messages)
        remember = False
        with self._write() as cur:
            spk = self._ensure_session(cur, session_id)
            if msgs:
                chain = self._known_chain(cur, session_id, msgs)
                if len(chain) < len(msgs):  # not the history this object wrote last
                    chain, remember = self._chain_from_root(cur, session_id, msgs, chain), True
                self._add_members(cur, spk, [pk for pk, _ in chain])
            written = [self._add_node(cur, spk, n) for n in specs]
        if remember:
            self._session_pks[session_id] = spk
            self._remember_chain(session_id, msgs, list(chain))
        return written

    def _write_nodes(self, cur: Any, session_id: str, spk: int, specs: Sequence[NodeSpec], stored: set[str], over: Sequence[Message]) -> None:
        """A compaction's nodes, inside its transaction: their message children are ``stored``
        (the context compacted) unless the engine's copy ``over`` differs (a client's cache
        marker, say), which is then stored too."""
        if over and any(mid not in stored for n in specs for kind, mid in n.children if kind == "message"):
            self._add_members(cur, spk, [pk for pk, _ in self._chain_from_root(cur, session_id, list(over))])
        for n in specs:
            self._add_node(cur, spk, n)

    def _add_node(self, cur: Any, spk: int, n: NodeSpec) -> bool:
        if self._one(cur, "SELECT pk FROM nodes WHERE id = ?", (n.id,)) is not None:
            return False
        msg_pks = self._ids_to_pks(cur, "messages", [cid for kind, cid in n.children if kind == "message"])
        node_pks = self._ids_to_pks(cur, "nodes", [cid for kind, cid in n.children if kind == "node"])
        rows: list[tuple[int, int | None, int | None]] = []
        for pos, (kind, cid) in enumerate(n.children):
            if kind == "message":
                if cid not in msg_pks:
                    raise NotFoundError(f"node {n.id}: child message {cid} is not in the store")
                rows.append((pos, msg_pks[cid], None))
            elif kind == "node":
                if cid not in node_pks:
                    raise NotFoundError(f"node {n.id}: child node {cid} is not in the store")
                rows.append((pos, None, node_pks[cid]))
            else:
                raise InputError(f"node {n.id}: child kind must be 'message' or 'node', not {kind!r}")
        tokens = estimate_message_tokens({"role": "user", "content": n.text})
        self._x(
            cur,
            "INSERT INTO nodes (id, session_pk, depth, text, tokens, meta, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (n.id, spk, int(n.depth), n.text, tokens, dumps(dict(n.meta), default=str), time.time()),
        )
        row = self._one(cur, "SELECT pk FROM nodes WHERE id = ?", (n.id,))
        assert row is not None
        npk = int(row[0])
        self._xm(cur, "INSERT INTO node_children (node_pk, position, message_pk, child_node_pk) VALUES (?, ?, ?, ?)", [(npk, *r) for r in rows])
        self._index_node(cur, npk, n.text)
        return True


def _node_specs(nodes: Sequence[NodeSpec]) -> list[NodeSpec]:
    """``nodes`` checked, their texts cleaned (a node is generated text: lone surrogates become
    U+FFFD, :mod:`ctxengine.textsafe`)."""
    specs = [NodeSpec(n.id, n.depth, clean(n.text), list(n.children), dict(n.meta)) for n in nodes]
    for n in specs:
        if not n.children:
            raise InputError(f"node {n.id}: a summary node needs at least one child")
    return specs
