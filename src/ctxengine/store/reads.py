"""The store's reads: histories at a point, the originals behind compactions, sessions,
events, compactions, messages by id, and summary nodes with the originals under them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ctxengine.errors import NotFoundError
from ctxengine.messages import Message
from ctxengine.store.sql import SqlCore, chunks
from ctxengine.store.values import CompactionInfo, Event, NodeInfo, SessionInfo

__all__ = ["Reads"]


class Reads(SqlCore):
    """Every read of a session's rows but search (read transactions only)."""

    def history(self, session_id: str, at: str = "latest") -> list[Message]:
        with self._read() as cur:
            spk = self._session_pk(cur, session_id)
            chain = self._chain(cur, self._resolve(cur, spk, at))
        return [json.loads(body) for _, _, body in chain]

    def history_ids(self, session_id: str, at: str = "latest") -> list[str]:
        with self._read() as cur:
            spk = self._session_pk(cur, session_id)
            chain = self._chain(cur, self._resolve(cur, spk, at))
        return [mid for _, mid, _ in chain]

    def originals(self, session_id: str) -> list[Message]:
        with self._read() as cur:
            spk = self._session_pk(cur, session_id)
            rows = self._all(cur, "SELECT pk, before_tip_pk, after_tip_pk FROM compactions WHERE session_pk = ? ORDER BY pk", (spk,))
            by_after: dict[int, int | None] = {}
            for _pk, before_tip, after_tip in rows:
                if after_tip is not None:
                    by_after[int(after_tip)] = None if before_tip is None else int(before_tip)
            tip = self._resolve(cur, spk, "latest")

            def expand(tip_pk: int | None, seen: frozenset[int]) -> list[str]:
                chain = self._chain(cur, tip_pk)
                for i in range(len(chain) - 1, -1, -1):
                    pk = chain[i][0]
                    if pk in by_after and pk not in seen:
                        return expand(by_after[pk], seen | {pk}) + [body for _, _, body in chain[i + 1 :]]
                # no compaction's result on the way: the chain may branch off one inside the
                # messages it kept verbatim (a turn edited right after a compaction)
                for after_tip, before_tip in reversed(by_after.items()):
                    if after_tip in seen:
                        continue
                    tail = self._kept_verbatim(cur, after_tip, before_tip)
                    for i in range(len(chain) - 1, -1, -1):
                        if chain[i][0] in tail:
                            return expand(tail[chain[i][0]], seen | {after_tip}) + [body for _, _, body in chain[i + 1 :]]
                return [body for _, _, body in chain]

            bodies = expand(tip, frozenset())
        return [json.loads(b) for b in bodies]

    def _kept_verbatim(self, cur: Any, after_tip: int, before_tip: int | None) -> dict[int, int]:
        """Where a chain may leave a compaction's result and still have originals: each message it
        kept verbatim at the end of its result (the common tail of the histories after and before
        it, compared by body) and the message just before them (the end of what it compacted),
        by pk in the result, mapped to the pk of the same point in the history before."""
        after, before = self._chain(cur, after_tip), self._chain(cur, before_tip)
        out: dict[int, int] = {}
        t = 0
        for (apk, _, abody), (bpk, _, bbody) in zip(reversed(after), reversed(before), strict=False):
            if abody != bbody:
                break
            out[apk] = bpk
            t += 1
        if t < len(after) and t < len(before):
            out[after[-1 - t][0]] = before[-1 - t][0]
        return out

    def get_session(self, session_id: str) -> SessionInfo:
        with self._read() as cur:
            rows = self._session_rows(cur, "WHERE s.id = ?", (session_id,))
        if not rows:
            raise NotFoundError(f"no session {session_id!r} in the store")
        return rows[0]

    def list_sessions(self, *, limit: int = 100, offset: int = 0) -> list[SessionInfo]:
        with self._read() as cur:
            return self._session_rows(cur, "ORDER BY s.updated_at DESC, s.pk DESC LIMIT ? OFFSET ?", (int(limit), int(offset)))

    def _session_rows(self, cur: Any, tail: str, params: Sequence[Any]) -> list[SessionInfo]:
        rows = self._all(
            cur,
            "SELECT s.id, m.id, m.position, s.created_at, s.updated_at, s.meta,"
            " (SELECT COUNT(*) FROM session_messages sm WHERE sm.session_pk = s.pk),"
            " (SELECT COUNT(*) FROM compactions c WHERE c.session_pk = s.pk)"
            f" FROM sessions s LEFT JOIN messages m ON m.pk = s.tip_pk {tail}",
            params,
        )
        return [
            SessionInfo(
                id=str(sid),
                tip=None if tip is None else str(tip),
                length=0 if pos is None else int(pos) + 1,
                stored=int(stored),
                compactions=int(ncomp),
                created_at=float(created),
                updated_at=float(updated),
                meta=json.loads(meta) if meta else {},
            )
            for sid, tip, pos, created, updated, meta, stored, ncomp in rows
        ]

    def events(self, session_id: str) -> list[Event]:
        with self._read() as cur:
            spk = self._session_pk(cur, session_id)
            rows = self._all(
                cur,
                "SELECT e.kind, m.id, m.position, c.id, e.created_at FROM events e"
                " LEFT JOIN messages m ON m.pk = e.tip_pk LEFT JOIN compactions c ON c.pk = e.compaction_pk"
                " WHERE e.session_pk = ? ORDER BY e.seq",
                (spk,),
            )
        return [
            Event(n, str(kind), None if tip is None else str(tip), 0 if pos is None else int(pos) + 1, None if cid is None else str(cid), float(at))
            for n, (kind, tip, pos, cid, at) in enumerate(rows, start=1)
        ]

    _COMPACTION_SQL = (
        "SELECT c.id, s.id, c.created_at, c.engine, c.config, c.report, c.tokens_before, c.tokens_after, bm.id, am.id, c.replaced"
        " FROM compactions c JOIN sessions s ON s.pk = c.session_pk"
        " LEFT JOIN messages bm ON bm.pk = c.before_tip_pk LEFT JOIN messages am ON am.pk = c.after_tip_pk"
    )

    @staticmethod
    def _compaction(row: tuple[Any, ...]) -> CompactionInfo:
        cid, sid, at, engine, config, report, tb, ta, before, after, replaced = row
        return CompactionInfo(
            str(cid), str(sid), float(at), str(engine), json.loads(config), json.loads(report), int(tb), int(ta),
            None if before is None else str(before), None if after is None else str(after), json.loads(replaced),
        )

    def compactions(self, session_id: str) -> list[CompactionInfo]:
        with self._read() as cur:
            spk = self._session_pk(cur, session_id)
            rows = self._all(cur, self._COMPACTION_SQL + " WHERE c.session_pk = ? ORDER BY c.pk", (spk,))
        return [self._compaction(r) for r in rows]

    def get_compaction(self, compaction_id: str) -> CompactionInfo:
        with self._read() as cur:
            row = self._one(cur, self._COMPACTION_SQL + " WHERE c.id = ?", (compaction_id,))
        if row is None:
            raise NotFoundError(f"no compaction {compaction_id!r} in the store")
        return self._compaction(row)

    def get_messages(self, ids: Sequence[str]) -> list[Message]:
        found: dict[str, str] = {}
        with self._read() as cur:
            for chunk in chunks(list(dict.fromkeys(ids))):
                marks = ",".join("?" * len(chunk))
                for mid, body in self._all(cur, f"SELECT m.id, b.body FROM messages m JOIN blobs b ON b.pk = m.blob_pk WHERE m.id IN ({marks})", chunk):
                    found[str(mid)] = str(body)
        missing = [i for i in ids if i not in found]
        if missing:
            raise NotFoundError(f"no message {missing[0]!r} in the store" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        return [json.loads(found[i]) for i in ids]

    # -- nodes ------------------------------------------------------------------------------------------
    def get_node(self, node_id: str) -> NodeInfo:
        with self._read() as cur:
            return self._get_node(cur, node_id)

    def _get_node(self, cur: Any, node_id: str) -> NodeInfo:
        row = self._one(
            cur,
            "SELECT n.pk, s.id, n.depth, n.text, n.tokens, n.created_at, n.meta FROM nodes n JOIN sessions s ON s.pk = n.session_pk WHERE n.id = ?",
            (node_id,),
        )
        if row is None:
            raise NotFoundError(f"no summary node {node_id!r} in the store")
        npk, sid, depth, text, tokens, created, meta = row
        kids = self._all(
            cur,
            "SELECT m.id, n.id FROM node_children nc LEFT JOIN messages m ON m.pk = nc.message_pk"
            " LEFT JOIN nodes n ON n.pk = nc.child_node_pk WHERE nc.node_pk = ? ORDER BY nc.position",
            (npk,),
        )
        children = [("message", str(m)) if m is not None else ("node", str(n)) for m, n in kids]
        parents = [str(r[0]) for r in self._all(cur, "SELECT n.id FROM node_children nc JOIN nodes n ON n.pk = nc.node_pk WHERE nc.child_node_pk = ? ORDER BY n.pk", (npk,))]
        return NodeInfo(node_id, str(sid), int(depth), str(text), int(tokens), float(created), json.loads(meta), children, parents)

    def node_messages(self, node_id: str) -> list[tuple[str, Message]]:
        with self._read() as cur:
            ids: list[str] = []

            def walk(nid: str, seen: frozenset[str]) -> None:  # depth-first, children in order
                info = self._get_node(cur, nid)
                for kind, cid in info.children:
                    if kind == "message":
                        ids.append(cid)
                    elif cid not in seen:
                        walk(cid, seen | {cid})

            walk(node_id, frozenset({node_id}))
            bodies: dict[str, str] = {}
            for chunk in chunks(list(dict.fromkeys(ids))):
                marks = ",".join("?" * len(chunk))
                for mid, body in self._all(cur, f"SELECT m.id, b.body FROM messages m JOIN blobs b ON b.pk = m.blob_pk WHERE m.id IN ({marks})", chunk):
                    bodies[str(mid)] = str(body)
        return [(i, json.loads(bodies[i])) for i in ids]
