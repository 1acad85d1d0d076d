"""The session store: one interface, SQL shared by the SQLite and PostgreSQL backends.

Data model (DESIGN §3.7)::

    blob      one message's canonical JSON, stored once (key: its content hash)
    message   a blob at a position: id = hash(parent id + blob hash), parent-linked, immutable
    session   a name and a tip (a message id); the history is the chain from the root to the tip
    event     every tip move: a turn recorded, a compaction, a restore (never an edit)
    compaction  engine, config, report, tokens before/after, the replaced message ids, and the
              tips of the history before and of the list the engine returned
    node      a summary node of the lossless engine: depth, text, ordered children pointing at
              messages or lower nodes (a DAG down to the originals)

Because ids are content addresses chained through parents, a client that re-sends its whole
history each turn adds only its new messages, and two sessions that share a prefix share rows.

*Points* name a state of a session for :meth:`SessionStore.history` and ``restore``:
``latest``; ``event:N`` (the session's N-th event, 1-based); ``before:<compaction id>`` and
``after:<compaction id>``; ``message:<message id>`` (the chain ending at that message).

Every public method translates database errors into :class:`StoreError` once, and unknown
session, message, compaction or node ids into :class:`NotFoundError`.

The code is split by concern; :class:`SqlStore` is their composition (one focused mixin per
concern over :class:`~ctxengine.store.sql.SqlCore`, the backend hooks and statement helpers)::

    ids.py           canonical JSON, content hashes, chained ids, a message prepared for writing
    values.py        the records reads return (SessionInfo, Event, CompactionInfo, NodeInfo, SearchHit)
    interface.py     SessionStore, the interface every backend offers
    sql.py           SqlCore: backend hooks, statement helpers, session keys, the chain of a tip
    chains.py        ChainWriter: blobs and messages stored once, tip moves, chains written last
    writes.py        Writes: record, append, compaction, restore, nodes (hooks for deferred appends)
    reads.py         Reads: histories, points, sessions, events, compactions, messages, nodes
    search.py        Search: substring and regex search with snippets
    recall_index.py  RecallIndex: recall's texts, identifier index and indexed candidates
    transfer.py      Transfer: export and import of a session document
    journal.py       AppendJournal: SQLite's append journal (the hooks of writes.py)
    sqlite_index.py  SqliteIndexes: SQLite's full-text indexes and recall's lookups through them
    requests.py      RequestLog: the proxy's per-request log (tokens, billed usage, outcome)
"""

from __future__ import annotations

from typing import Any

from ctxengine.store.export_doc import EXPORT_FORMAT
from ctxengine.store.ids import blob_hash, canonical_json, message_id
from ctxengine.store.interface import SessionStore
from ctxengine.store.migrations import apply_migrations, current_version
from ctxengine.store.recall_index import RecallIndex
from ctxengine.store.requests import RequestLog
from ctxengine.store.search import SNIPPET_CONTEXT, Search, snippet
from ctxengine.store.transfer import Transfer
from ctxengine.store.values import (
    CompactionInfo,
    Event,
    NodeInfo,
    RequestRecord,
    SearchHit,
    SearchMode,
    SessionInfo,
    UsageRow,
)
from ctxengine.store.writes import Writes

__all__ = [
    "EXPORT_FORMAT",
    "SNIPPET_CONTEXT",
    "CompactionInfo",
    "Event",
    "NodeInfo",
    "RequestRecord",
    "SearchHit",
    "SearchMode",
    "SessionInfo",
    "SessionStore",
    "SqlStore",
    "UsageRow",
    "blob_hash",
    "canonical_json",
    "message_id",
    "snippet",
]

class SqlStore(Writes, Transfer, Search, RecallIndex, RequestLog):
    """The store over a DB-API database; subclasses provide connections and full-text search
    (the hooks of :class:`~ctxengine.store.sql.SqlCore`).

    SQL here uses ``?`` placeholders and only syntax both SQLite (≥ 3.35) and PostgreSQL accept.
    """

    def schema_version(self) -> int:
        with self._read() as cur:
            return current_version(cur, self.backend, ensure_table=False)

    def _migrate(self, cur: Any, target: int | None) -> list[str]:
        return apply_migrations(cur, self.backend, target=target)
