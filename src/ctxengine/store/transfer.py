"""A session as one JSON document, out and back in (:meth:`SessionStore.export_session`,
``import_session``; the format is checked by :mod:`ctxengine.store.export_doc`)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from ctxengine.errors import InputError, StoreError
from ctxengine.redact import redact_obj
from ctxengine.store.chains import ChainWriter
from ctxengine.store.export_doc import EXPORT_FORMAT, validate_export
from ctxengine.store.ids import Prepared, compaction_id, prepare
from ctxengine.store.reads import Reads
from ctxengine.textsafe import dumps

__all__ = ["Transfer"]


class Transfer(Reads, ChainWriter):
    """``export_session`` and ``import_session``."""

    def export_session(self, session_id: str) -> dict[str, Any]:
        with self._read() as cur:
            spk = self._session_pk(cur, session_id)
            info = self._session_rows(cur, "WHERE s.pk = ?", (spk,))[0]
            rows = self._all(
                cur,
                "SELECT m.id, p.id, b.body FROM session_messages sm JOIN messages m ON m.pk = sm.message_pk"
                " JOIN blobs b ON b.pk = m.blob_pk LEFT JOIN messages p ON p.pk = m.parent_pk"
                " WHERE sm.session_pk = ? ORDER BY m.position, m.pk",
                (spk,),
            )
            node_ids = [str(r[0]) for r in self._all(cur, "SELECT id FROM nodes WHERE session_pk = ? ORDER BY pk", (spk,))]
            nodes = [self._get_node(cur, n) for n in node_ids]
        events = self.events(session_id)
        comps = self.compactions(session_id)
        return {
            "format": EXPORT_FORMAT,
            "session": {"id": info.id, "created_at": info.created_at, "updated_at": info.updated_at, "meta": info.meta, "tip": info.tip},
            "messages": [{"id": str(mid), "parent": None if par is None else str(par), "message": json.loads(body)} for mid, par, body in rows],
            "events": [{"kind": e.kind, "tip": e.tip, "compaction": e.compaction, "created_at": e.created_at} for e in events],
            "compactions": [
                {
                    "id": c.id, "created_at": c.created_at, "engine": c.engine, "config": c.config, "report": c.report,
                    "tokens_before": c.tokens_before, "tokens_after": c.tokens_after,
                    "before_tip": c.before_tip, "after_tip": c.after_tip, "replaced": c.replaced,
                }
                for c in comps
            ],
            "nodes": [
                {"id": n.id, "depth": n.depth, "text": n.text, "meta": n.meta, "created_at": n.created_at, "children": [list(c) for c in n.children]}
                for n in nodes
            ],
        }

    def import_session(self, document: Mapping[str, Any], *, session_id: str | None = None) -> str:
        valid = validate_export(document)  # every record checked before anything is written
        sess, events, comps, nodes = valid.session, valid.events, valid.compactions, valid.nodes
        target = session_id or str(sess["id"])
        links: list[tuple[str | None, Prepared]] = []
        for i, entry in enumerate(valid.messages):
            parent = entry["parent"]
            prep = prepare([entry["message"]], parent)[0]
            if prep.id != entry["id"]:
                raise InputError(f"damaged session export: record messages[{i}] (id {entry['id']!r}) is corrupt: its id does not match its content and parent")
            links.append((parent, prep))
        with self._write() as cur:
            if self._one(cur, "SELECT pk FROM sessions WHERE id = ?", (target,)) is not None:
                raise StoreError(f"session {target!r} already exists; import it under another id")
            spk = self._ensure_session(cur, target, sess.get("meta") or {})
            self._x(cur, "UPDATE sessions SET created_at = ? WHERE pk = ?", (float(sess.get("created_at") or time.time()), spk))
            pks = self._store_links(cur, links)
            self._add_members(cur, spk, list(pks.values()))
            comp_pks: dict[str, int] = {}
            for c in comps:
                cid = c["id"] if target == sess["id"] else compaction_id(target, c["before_tip"], c["after_tip"], c["engine"])
                self._x(
                    cur,
                    "INSERT INTO compactions (id, session_pk, created_at, engine, config, report, tokens_before, tokens_after,"
                    " before_tip_pk, after_tip_pk, replaced) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        cid, spk, float(c["created_at"]), c["engine"], dumps(redact_obj(c["config"])),
                        dumps(redact_obj(c["report"])), int(c["tokens_before"]), int(c["tokens_after"]),
                        pks.get(c["before_tip"]) if c["before_tip"] else None, pks.get(c["after_tip"]) if c["after_tip"] else None,
                        json.dumps(c["replaced"]),
                    ),
                )
                row = self._one(cur, "SELECT pk FROM compactions WHERE id = ?", (cid,))
                assert row is not None
                comp_pks[c["id"]] = int(row[0])
            for e in events:
                self._x(
                    cur,
                    "INSERT INTO events (session_pk, kind, tip_pk, compaction_pk, created_at) VALUES (?, ?, ?, ?, ?)",
                    (spk, e["kind"], pks.get(e["tip"]) if e["tip"] else None, comp_pks.get(e["compaction"]) if e["compaction"] else None, float(e["created_at"])),
                )
            tip = sess.get("tip")
            self._x(
                cur,
                "UPDATE sessions SET tip_pk = ?, updated_at = ? WHERE pk = ?",
                (pks.get(tip) if tip else None, float(sess.get("updated_at") or time.time()), spk),
            )
        for n in nodes:
            self.add_node(target, n["id"], depth=int(n["depth"]), text=n["text"], children=[(k, i) for k, i in n["children"]], meta=n.get("meta"))
        return target
