"""What recall (:class:`ctxengine.recall.Recall`, ``ctx_grep``) reads from the store: the
whole texts holding a query, the identifier index of removed text (paths, URLs, error lines,
commands; schema migration 5) and candidates found through the indexes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ctxengine.store.sql import SqlCore, chunks

__all__ = ["RecallIndex"]


class RecallIndex(SqlCore):
    """``search_texts``, ``unindexed_texts``, ``add_identifiers`` and ``recall_candidates``."""

    _join_in_order: ClassVar[str] = "JOIN"
    """The join that makes the backend read a few candidate blobs first, then their messages
    by the blob index (SQLite: ``CROSS JOIN``; its planner would otherwise walk every message of
    the session once per candidate)."""

    def _message_ids_of_blobs(self, cur: Any, spk: int, blob_pks: list[int]) -> dict[int, list[str]]:
        """The ids of the session's messages holding each blob (in message order), by blob key."""
        ids: dict[int, list[str]] = {}
        for chunk in chunks(blob_pks):
            marks = ",".join("?" * len(chunk))
            for bpk, mid in self._all(
                cur,
                "SELECT m.blob_pk, m.id FROM messages m JOIN session_messages sm ON sm.message_pk = m.pk AND sm.session_pk = ?"
                f" WHERE m.blob_pk IN ({marks}) ORDER BY m.pk",
                [spk, *chunk],
            ):
                ids.setdefault(int(bpk), []).append(str(mid))
        return ids

    def search_texts(self, queries: Sequence[str], *, session_id: str, limit: int = 200, nodes: bool = True) -> list[tuple[str, str, list[str], str]]:
        """The whole texts of the session's messages (newest first) and summary nodes holding
        any of ``queries`` (case-insensitive substrings), at most ``limit`` of each:
        ``(kind, role, ids, text)`` where ``ids`` are the session's message ids carrying that
        text (or the node id). What :class:`ctxengine.recall.Recall` ranks lines from."""
        qs = [q for q in queries if isinstance(q, str) and q]
        if not qs:
            return []
        with self._read() as cur:
            spk = self._session_pk(cur, session_id)
            cond = " OR ".join(f"{self._instr}(lower(b.text), lower(?)) > 0" for _ in qs)
            rows = self._all(
                cur,
                "SELECT b.pk, b.role, b.text FROM session_messages sm JOIN messages m ON m.pk = sm.message_pk"
                f" JOIN blobs b ON b.pk = m.blob_pk WHERE sm.session_pk = ? AND ({cond})"
                " GROUP BY b.pk, b.role, b.text ORDER BY MAX(m.position) DESC, b.pk DESC LIMIT ?",
                [spk, *qs, int(limit)],
            )
            ids = self._message_ids_of_blobs(cur, spk, [int(r[0]) for r in rows])
            out = [("message", str(role), ids.get(int(pk), []), str(text)) for pk, role, text in rows]
            if nodes:
                ncond = cond.replace("b.text", "text")
                for nid, text in self._all(cur, f"SELECT id, text FROM nodes WHERE session_pk = ? AND ({ncond}) ORDER BY pk DESC LIMIT ?", [spk, *qs, int(limit)]):
                    out.append(("node", "summary", [str(nid)], str(text)))
        return out

    def unindexed_texts(self, session_id: str, *, limit: int = 500) -> list[tuple[int, str, str]]:
        """``(blob key, role, text)`` of the session's messages whose identifiers recall has not
        indexed yet (:meth:`add_identifiers`), oldest first, at most ``limit``."""
        with self._read() as cur:
            spk = self._session_pk(cur, session_id)
            return [
                (int(pk), str(role), str(text))
                for pk, role, text in self._all(
                    cur,
                    "SELECT DISTINCT b.pk, b.role, b.text FROM session_messages sm JOIN messages m ON m.pk = sm.message_pk"
                    " JOIN blobs b ON b.pk = m.blob_pk WHERE sm.session_pk = ? AND NOT EXISTS"
                    " (SELECT 1 FROM recall_indexed ri WHERE ri.session_pk = sm.session_pk AND ri.blob_pk = b.pk)"
                    " ORDER BY b.pk LIMIT ?",
                    (spk, int(limit)),
                )
            ]

    def add_identifiers(self, session_id: str, blob_keys: Sequence[int], rows: Sequence[tuple[int, str, str]]) -> None:
        """Record the identifiers ``(blob key, kind, identifier)`` of the messages ``blob_keys``
        of a session (kinds: ``path``, ``url``, ``error``, ``command``) and mark them indexed.
        A message indexed already (by another process meanwhile) is skipped."""
        with self._write() as cur:
            spk = self._session_pk(cur, session_id)
            done: set[int] = set()
            for chunk in chunks(list(dict.fromkeys(blob_keys))):
                marks = ",".join("?" * len(chunk))
                done.update(int(r[0]) for r in self._all(cur, f"SELECT blob_pk FROM recall_indexed WHERE session_pk = ? AND blob_pk IN ({marks})", [spk, *chunk]))
            fresh = [k for k in dict.fromkeys(blob_keys) if k not in done]
            if not fresh:
                return
            keep = set(fresh)
            new_rows = [(spk, int(b), str(k), str(i)) for b, k, i in rows if b in keep]
            self._xm(cur, "INSERT INTO recall_indexed (session_pk, blob_pk) VALUES (?, ?)", [(spk, b) for b in fresh])
            if new_rows:
                self._xm(cur, "INSERT INTO recall_idents (session_pk, blob_pk, kind, ident) VALUES (?, ?, ?, ?)", new_rows)
                self._index_identifiers(cur, spk, [b for b in fresh])

    def _index_identifiers(self, cur: Any, session_pk: int, blob_keys: Sequence[int]) -> None:
        """Backend hook: index the identifiers just added (SQLite: its trigram index)."""

    def _identifier_blobs(self, cur: Any, session_pk: int, query: str, limit: int) -> list[int] | None:
        """Blob keys (newest first) whose identifiers hold ``query`` (case-insensitive)."""
        return [
            int(r[0])
            for r in self._all(
                cur,
                f"SELECT blob_pk FROM recall_idents WHERE session_pk = ? AND {self._instr}(lower(ident), lower(?)) > 0"
                " GROUP BY blob_pk ORDER BY blob_pk DESC LIMIT ?",
                (session_pk, query, int(limit)),
            )
        ]

    def _word_blobs(self, cur: Any, session_pk: int, query: str, limit: int) -> list[int] | None:
        """Blob keys of the session whose text holds ``query``'s words (the full-text index), or
        ``None`` when the index cannot tell (the caller scans)."""
        return None

    def recall_candidates(self, queries: Sequence[str], *, session_id: str, limit: int = 200) -> list[tuple[str, str, list[str], str]] | None:
        """Like :meth:`search_texts`, from the indexes: the messages whose identifiers hold a
        query (:meth:`add_identifiers`) or whose words match it (full-text), newest first;
        ``None`` when the indexes cannot answer (a query of fewer than three characters, no
        word, or nothing found): the caller scans with :meth:`search_texts`."""
        qs = [q for q in queries if isinstance(q, str) and q]
        if not qs or min(len(q) for q in qs) < 3:
            return None
        with self._read() as cur:
            spk = self._session_pk(cur, session_id)
            keys = self._indexed_blobs(cur, spk, qs, limit)
            if not keys:
                return None
            rows = self._holding(cur, spk, sorted(keys), qs)
            rows.sort(key=lambda r: (-r[3], -r[0]))
            rows = rows[:limit]
            ids = self._message_ids_of_blobs(cur, spk, [r[0] for r in rows])
            out = [("message", r[1], ids.get(r[0], []), r[2]) for r in rows]
            ncond = " OR ".join(f"{self._instr}(lower(text), lower(?)) > 0" for _ in qs)
            for nid, text in self._all(cur, f"SELECT id, text FROM nodes WHERE session_pk = ? AND ({ncond}) ORDER BY pk DESC LIMIT ?", [spk, *qs, int(limit)]):
                out.append(("node", "summary", [str(nid)], str(text)))
        return out

    def _indexed_blobs(self, cur: Any, session_pk: int, queries: Sequence[str], limit: int) -> set[int] | None:
        """Keys of the session's blobs whose identifiers hold a query or whose words match it
        (at most ``limit`` of each, newest first); ``None`` when an index cannot tell."""
        keys: set[int] = set()
        for q in queries:
            found = self._identifier_blobs(cur, session_pk, q, limit)
            words = self._word_blobs(cur, session_pk, q, limit)
            if found is None or words is None:
                return None
            keys.update(found)
            keys.update(words)
        return keys

    def _holding(self, cur: Any, session_pk: int, blob_keys: Sequence[int], queries: Sequence[str]) -> list[tuple[int, str, str, int]]:
        """``(blob key, role, text, last position in the session)`` of the blobs ``blob_keys``
        whose text holds a query (case-insensitive, as the backend's ``lower`` folds)."""
        cond = " OR ".join(f"{self._instr}(lower(b.text), lower(?)) > 0" for _ in queries)
        rows: list[tuple[int, str, str, int]] = []
        for chunk in chunks(blob_keys):
            marks = ",".join("?" * len(chunk))
            rows += [
                (int(pk), str(role), str(text), int(pos))
                for pk, role, text, pos in self._all(
                    cur,
                    f"SELECT b.pk, b.role, b.text, MAX(m.position) FROM blobs b {self._join_in_order} messages m ON m.blob_pk = b.pk"
                    f" {self._join_in_order} session_messages sm ON sm.message_pk = m.pk AND sm.session_pk = ?"
                    f" WHERE b.pk IN ({marks}) AND ({cond}) GROUP BY b.pk, b.role, b.text",
                    [session_pk, *chunk, *queries],
                )
            ]
        return rows
