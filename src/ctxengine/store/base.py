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
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import orjson

from ctxengine.errors import InputError, NotFoundError, StoreError
from ctxengine.messages import (
    PLAIN_NO_FLOAT,
    Message,
    identical_prefix,
    json_problem,
    message_text,
    plain_json_kind,
)
from ctxengine.redact import redact_messages, redact_obj
from ctxengine.safe_regex import compile_pattern
from ctxengine.store.export_doc import EXPORT_FORMAT, validate_export
from ctxengine.store.migrations import Backend, apply_migrations, current_version
from ctxengine.textsafe import clean, dumps, escape_surrogates
from ctxengine.tokens import MESSAGE_OVERHEAD_TOKENS, estimate_message_tokens

__all__ = [
    "EXPORT_FORMAT",
    "CompactionInfo",
    "Event",
    "NodeInfo",
    "SearchHit",
    "SessionInfo",
    "SessionStore",
    "SqlStore",
    "blob_hash",
    "canonical_json",
    "message_id",
]

log = logging.getLogger(__name__)

_ID_CHARS = 32  # 128 bits of SHA-256: collision-free for any store, half the index size
_IN_CHUNK = 500  # ids per IN (...) list; far below both backends' parameter limits
SNIPPET_CONTEXT = 300
"""Characters of context kept on each side of a search match (the match itself is never cut)."""


def canonical_json(message: Mapping[str, Any]) -> str:
    """The canonical JSON of a message: sorted keys, no spaces, UTF-8 kept as is (lone
    surrogates escaped, see :mod:`ctxengine.textsafe`: stored and restored exactly).

    A message that is not plain JSON (NaN, Infinity, bytes, sets, non-string keys: the rule of
    :func:`ctxengine.messages.json_problem`, the same as ``validate``'s) is an :class:`InputError`.
    """
    kind = plain_json_kind(message)
    if not kind:
        problem = json_problem(message)
        if problem is not None:
            raise InputError(f"message is not JSON data: {problem}")
    elif kind == PLAIN_NO_FLOAT:
        # orjson writes the same bytes for these (sorted keys, compact, UTF-8 as is, the same
        # string escapes: property-tested), 13 times faster; floats (orjson spells exponents
        # differently), integers beyond 64 bits and lone surrogates (orjson refuses both) take
        # the standard encoder: ids are content hashes and must never change
        try:
            return orjson.dumps(message, option=orjson.OPT_SORT_KEYS).decode()
        except TypeError:
            pass
    try:
        return escape_surrogates(_CANONICAL.encode(message))
    except (TypeError, ValueError) as exc:
        raise InputError(f"message is not JSON-serialisable: {exc}") from exc


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False, check_circular=False)
"""The reference encoder of :func:`canonical_json`, built once (``json.dumps`` with these options builds one per call)."""


def blob_hash(canonical: str) -> str:
    """Content hash of a canonical JSON text."""
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:_ID_CHARS]


def message_id(parent_id: str | None, blob: str) -> str:
    """Id of a message: the hash of its parent's id and its blob hash (a hash chain)."""
    return hashlib.sha256(f"{parent_id or ''}:{blob}".encode()).hexdigest()[:_ID_CHARS]


def _compaction_id(session_id: str, before_tip: str | None, after_tip: str | None, engine: str) -> str:
    key = json.dumps([session_id, before_tip, after_tip, engine])
    return "c" + hashlib.sha256(key.encode()).hexdigest()[: _ID_CHARS - 1]


# -- records --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session: its tip, the length of its current history, stored messages, compactions."""

    id: str
    tip: str | None
    length: int
    stored: int
    compactions: int
    created_at: float
    updated_at: float
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Event:
    """One tip move. ``number`` is its 1-based rank in the session (the ``event:N`` point)."""

    number: int
    kind: Literal["messages", "append", "compaction", "restore", "import"] | str
    tip: str | None
    length: int
    compaction: str | None
    created_at: float


@dataclass(frozen=True, slots=True)
class CompactionInfo:
    """A compaction event: what ran, what it cost and saved, what it replaced."""

    id: str
    session_id: str
    created_at: float
    engine: str
    config: dict[str, Any]
    report: dict[str, Any]
    tokens_before: int
    tokens_after: int
    before_tip: str | None
    after_tip: str | None
    replaced: list[str]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A summary node: its text, depth, children (``("message"|"node", id)``) and parents."""

    id: str
    session_id: str
    depth: int
    text: str
    tokens: int
    created_at: float
    meta: dict[str, Any]
    children: list[tuple[str, str]]
    parents: list[str]


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One search result.

    ``kind`` is ``message`` or ``node``; ``id`` the message (or node) id; ``snippet`` the lines
    around the match, verbatim, with the match whole; ``message_ids`` every message of the scope
    carrying this exact content; ``node_ids`` the summary nodes that cover them.
    """

    kind: Literal["message", "node"]
    id: str
    role: str
    snippet: str
    session_ids: list[str] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)
    node_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "id": self.id,
            "role": self.role,
            "snippet": self.snippet,
            "session_ids": list(self.session_ids),
            "message_ids": list(self.message_ids),
            "node_ids": list(self.node_ids),
        }


SearchMode = Literal["text", "regex"]


# -- the interface ----------------------------------------------------------------------------
class SessionStore(ABC):
    """What every backend offers. Implements :class:`ctxengine.storage.SessionRecorder`.

    Thread-safe: one store object may be shared by every thread of a process, and several
    processes may open the same database.
    """

    backend: ClassVar[str]

    # writes
    @abstractmethod
    def record_messages(self, session_id: str, messages: Sequence[Message], *, meta: Mapping[str, Any] | None = None) -> list[str]:
        """Make ``messages`` the session's history (its tip moves to the last); return their ids.

        Messages already stored are not stored again; the session is created on first use.
        """

    @abstractmethod
    def record_many(self, histories: Iterable[tuple[str, Sequence[Message]]]) -> dict[str, list[str]]:
        """Record the histories of many sessions at once (one transaction); ids by session."""

    @abstractmethod
    def append_messages(self, session_id: str, messages: Sequence[Message], *, after: str | None = None) -> list[str]:
        """Append ``messages`` after the session's current tip, atomically; return their ids.

        ``after`` (a message id, e.g. the last id a previous call returned) chains them after
        that message instead, without reading the tip: the per-turn path of a caller that knows
        what it recorded last, which then hashes and writes only the new messages.
        """

    @abstractmethod
    def record_compaction(self, session_id: str, report: Mapping[str, Any], before: Sequence[Message], after: Sequence[Message]) -> str:
        """Store a compaction event (the session's tip moves to ``after``); return its id.

        ``report`` is a :meth:`CompactionReport.to_dict` (``engine``, ``tokens_before``,
        ``tokens_after``, ``replaced`` indices into ``before``) plus an optional ``config``.
        """

    @abstractmethod
    def restore(self, session_id: str, at: str) -> list[Message]:
        """Move the session's tip back to the point ``at`` (a new event) and return that history."""

    @abstractmethod
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
        """Store a summary node (children: ``("message", id)`` or ``("node", id)``, in order).

        Returns False when a node with this id already exists (it is left unchanged).
        """

    @abstractmethod
    def import_session(self, document: Mapping[str, Any], *, session_id: str | None = None) -> str:
        """Load an :meth:`export_session` document (under ``session_id`` if given); return the id."""

    # reads
    @abstractmethod
    def get_session(self, session_id: str) -> SessionInfo: ...

    @abstractmethod
    def list_sessions(self, *, limit: int = 100, offset: int = 0) -> list[SessionInfo]:
        """Sessions, most recently updated first."""

    @abstractmethod
    def history(self, session_id: str, at: str = "latest") -> list[Message]:
        """The session's message list at the point ``at`` (read only)."""

    @abstractmethod
    def history_ids(self, session_id: str, at: str = "latest") -> list[str]:
        """The message ids of :meth:`history`."""

    @abstractmethod
    def originals(self, session_id: str) -> list[Message]:
        """The full uncompacted history: every compaction undone, later messages kept."""

    @abstractmethod
    def events(self, session_id: str) -> list[Event]: ...

    @abstractmethod
    def compactions(self, session_id: str) -> list[CompactionInfo]: ...

    @abstractmethod
    def get_compaction(self, compaction_id: str) -> CompactionInfo: ...

    @abstractmethod
    def get_messages(self, ids: Sequence[str]) -> list[Message]:
        """The messages with these ids, in the given order."""

    @abstractmethod
    def search(self, query: str, *, session_id: str | None = None, mode: SearchMode = "text", limit: int = 20, nodes: bool = True) -> list[SearchHit]:
        """Find messages (and summary nodes) whose text contains ``query``.

        ``mode="text"``: case-insensitive substring (full-text index first, a scan where the
        index cannot match, e.g. short CJK words); ``"regex"``: a regular expression run by a
        linear-time engine (RE2 syntax: no backreferences or lookarounds; see
        :mod:`ctxengine.safe_regex`), so no pattern can hang a search.
        ``session_id=None`` searches every session, newest first.
        """

    @abstractmethod
    def get_node(self, node_id: str) -> NodeInfo: ...

    @abstractmethod
    def node_messages(self, node_id: str) -> list[tuple[str, Message]]:
        """The original messages under a node, in order, verbatim: ``(message id, message)``."""

    @abstractmethod
    def export_session(self, session_id: str) -> dict[str, Any]:
        """Everything about a session as one JSON-ready document (see :meth:`import_session`)."""

    @abstractmethod
    def schema_version(self) -> int: ...

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- shared SQL implementation ------------------------------------------------------------------
@dataclass(slots=True)
class _Prepared:
    canonical: str
    blob: str
    id: str
    role: str
    text: str
    tokens: int


_MEMO_SIZE = 16_384
_CHAINS_MAX = 1_024
"""Sessions whose last written history a store object remembers (see ``_known_chain``)."""
_Chain = list["tuple[int | None, str]"]
"""``(pk, id)`` of each message of a history; ``pk`` is ``None`` for a message appended to the
append journal and not folded into the tables yet (its key is looked up when needed)."""
_FOLD_EVERY = 64
"""Appends the journal holds at most: the append that reaches this many folds them all."""
_Memo = dict[int, "tuple[Message, _Prepared]"]
"""Prepared messages by message object (see :func:`_prepare`)."""


def _prepare(messages: Sequence[Message], parent_id: str | None, memo: _Memo | None = None) -> list[_Prepared]:
    """Canonical JSON, hashes and search text of each message, chained from ``parent_id``.

    ``memo`` (per store) keeps the serialisation and hashes of each message object it has seen
    (messages passed to ctxengine are never edited in place, and the memo holds each object, so
    its ``id`` is not reused): a session recorded again in full (after a compaction) hashes only
    its chain ids, not every message's JSON again."""
    out = []
    for i, m in enumerate(messages):
        hit = memo.get(id(m)) if memo is not None else None
        if hit is not None and hit[0] is m:
            base = hit[1]
            mid = message_id(parent_id, base.blob)
            out.append(_Prepared(base.canonical, base.blob, mid, base.role, base.text, base.tokens))
            parent_id = mid
            continue
        if not isinstance(m, dict):
            raise InputError(f"message {i} is a {type(m).__name__}, not a dict")
        canon = canonical_json(m)
        b = blob_hash(canon)
        mid = message_id(parent_id, b)
        text = _search_text(m)
        # a size for listings (characters / 4 + the per-message overhead): the exact estimate
        # costs as much as hashing the message, and ingest speed matters more here
        p = _Prepared(canon, b, mid, str(m.get("role", "")), text, (len(text) + 3) // 4 + MESSAGE_OVERHEAD_TOKENS)
        out.append(p)
        if memo is not None:
            if len(memo) >= _MEMO_SIZE:
                memo.clear()
            memo[id(m)] = (m, p)
        parent_id = mid
    return out


def _search_text(m: Mapping[str, Any]) -> str:
    text = message_text(m)
    reasoning = m.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        text = f"{text}\n{reasoning}" if text else reasoning
    return clean(text)  # derived text: lone surrogates become U+FFFD (the body keeps them)


def _chunks(seq: Sequence[Any], n: int = _IN_CHUNK) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


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


class SqlStore(SessionStore):
    """The store over a DB-API database; subclasses provide connections and full-text search.

    SQL here uses ``?`` placeholders and only syntax both SQLite (≥ 3.35) and PostgreSQL accept.
    """

    backend: ClassVar[Backend]
    _instr: ClassVar[str] = "instr"

    redact_content: bool = False
    """Store messages with key shapes and registered secrets redacted (``redaction.content``)."""

    _journal: bool = False
    """Appends after the message this object wrote last go to the append journal (SQLite)."""

    def __init__(self) -> None:
        self._closed = False
        self._local = threading.local()
        self._session_pks: dict[str, int] = {}  # committed sessions' keys (the append path skips the lookup)
        self._prepared: _Memo = {}  # each message object serialised and hashed once (see _prepare)
        self._chains: dict[str, tuple[list[Message], _Chain]] = {}  # see _known_chain
        self._chains_lock = threading.Lock()
        self._journaled = False  # this object appended to the journal since it last folded it

    # -- backend hooks --------------------------------------------------------------------------
    @abstractmethod
    def _write(self) -> AbstractContextManager[Any]:
        """A cursor inside a write transaction that holds the database's write lock."""

    @abstractmethod
    def _read(self) -> AbstractContextManager[Any]:
        """A cursor inside a read transaction (one consistent snapshot)."""

    @abstractmethod
    def _sql(self, sql: str) -> str:
        """``sql`` with the backend's placeholder style."""

    @abstractmethod
    def _fts_candidates(self, cur: Any, table: Literal["blobs", "nodes"], needle: str, limit: int) -> list[tuple[Any, ...]] | None:
        """Rows ``(pk, role, text)`` (newest first) whose text contains ``needle`` (case-insensitive),
        found through the full-text index; ``None`` when the index cannot express the query."""

    def _index_blobs(self, cur: Any, rows: Sequence[tuple[int, str]]) -> None:
        """Add new blob texts to the full-text index (SQLite; PostgreSQL indexes by itself)."""

    def _index_node(self, cur: Any, pk: int, text: str) -> None:
        """Add a node text to the full-text index (SQLite; PostgreSQL indexes by itself)."""

    def _next_pks(self, cur: Any) -> tuple[int, int] | None:
        """The first free primary keys of ``blobs`` and ``messages`` when the backend can hand
        out keys itself inside a write transaction (SQLite, whose write lock is exclusive);
        ``None`` to let the database assign them (PostgreSQL, where writers run concurrently)."""
        return None

    def _lock_session(self, cur: Any, session_pk: int) -> None:
        """Serialise writers of one session (PostgreSQL row lock; SQLite's write lock is global)."""

    # -- small helpers ----------------------------------------------------------------------------
    def _x(self, cur: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        cur.execute(self._sql(sql), tuple(params))
        return cur

    def _xm(self, cur: Any, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            cur.executemany(self._sql(sql), rows)

    def _one(self, cur: Any, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        row = self._x(cur, sql, params).fetchone()
        return tuple(row) if row is not None else None

    def _all(self, cur: Any, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._x(cur, sql, params).fetchall()]

    def _ids_to_pks(self, cur: Any, table: str, ids: Sequence[str], column: str = "id") -> dict[str, int]:
        out: dict[str, int] = {}
        for chunk in _chunks(list(dict.fromkeys(ids))):
            marks = ",".join("?" * len(chunk))
            for key, pk in self._all(cur, f"SELECT {column}, pk FROM {table} WHERE {column} IN ({marks})", chunk):
                out[str(key)] = int(pk)
        return out

    def _session_pk(self, cur: Any, session_id: str) -> int:
        row = self._one(cur, "SELECT pk FROM sessions WHERE id = ?", (session_id,))
        if row is None:
            raise NotFoundError(f"no session {session_id!r} in the store")
        return int(row[0])

    def _ensure_session(self, cur: Any, session_id: str, meta: Mapping[str, Any] | None = None) -> int:
        if not isinstance(session_id, str) or not session_id:
            raise InputError("a session id must be a non-empty string")
        now = time.time()
        self._x(
            cur,
            "INSERT INTO sessions (id, tip_pk, created_at, updated_at, meta) VALUES (?, NULL, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
            (session_id, now, now, dumps(dict(meta or {}))),
        )
        pk = self._session_pk(cur, session_id)
        if meta:
            self._x(cur, "UPDATE sessions SET meta = ? WHERE pk = ?", (dumps(dict(meta)), pk))
        return pk

    # -- writing chains -----------------------------------------------------------------------------
    def _store_links(
        self,
        cur: Any,
        links: Sequence[tuple[str | None, _Prepared]],
        *,
        chain: bool = False,
        stored_parent: tuple[str, int, int] | None = None,
        now: float | None = None,
    ) -> dict[str, int]:
        """Store messages given with their parent ids (parents first); return id → pk for all.

        ``chain``: the links form one chain (each parent is the link before, the first one's is
        stored or ``None``). Ids form a hash chain and a message is only ever stored after its
        parent, so when the first one is not stored, none is: a new conversation or a new turn
        skips the lookup of the others. ``stored_parent``: ``(id, pk, position)`` of a stored
        parent the caller already read. ``now``: the rows' creation time (default: the clock).
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
        ids = [p.id for _, p in links]
        known = {} if chain_is_new else self._ids_to_pks(cur, "messages", ids)
        new: dict[str, tuple[str | None, _Prepared]] = {}
        for parent, p in links:
            if p.id not in known:
                new.setdefault(p.id, (parent, p))
        if not new:
            return known
        blobs = {p.blob: p for _, p in new.values()}
        if have_blobs is None:
            keys = self._next_pks(cur)
            if keys is not None:
                added, have_blobs = self._insert_blobs(cur, keys[0], list(blobs.values()))
            else:
                have_blobs = self._ids_to_pks(cur, "blobs", list(blobs), column="hash")
                fresh = [p for h, p in blobs.items() if h not in have_blobs]
                self._xm(
                    cur,
                    "INSERT INTO blobs (hash, role, body, text, tokens) VALUES (?, ?, ?, ?, ?) ON CONFLICT (hash) DO NOTHING",
                    [(p.blob, p.role, p.canonical, p.text, p.tokens) for p in fresh],
                )
                added = self._ids_to_pks(cur, "blobs", [p.blob for p in fresh], column="hash") if fresh else {}
                have_blobs.update(added)
        if added:
            self._index_blobs(cur, [(pk, blobs[h].text) for h, pk in added.items()])
        # positions: a parent's position + 1 (parents outside the batch are looked up)
        positions: dict[str | None, int] = {None: -1}
        if stored_parent is not None:
            positions[stored_parent[0]] = stored_parent[2]
            known[stored_parent[0]] = stored_parent[1]
        outside = [par for par, _ in new.values() if par is not None and par not in new and par not in positions]
        for chunk in _chunks(list(dict.fromkeys(outside))):
            marks = ",".join("?" * len(chunk))
            for mid, pos, ppk in self._all(cur, f"SELECT id, position, pk FROM messages WHERE id IN ({marks})", chunk):
                positions[str(mid)] = int(pos)
                known[str(mid)] = int(ppk)
        for parent, p in new.values():
            if parent not in positions:
                raise StoreError(f"message {p.id} names parent {parent}, which is not in the store")
            positions[p.id] = positions[parent] + 1
        if now is None:
            now = time.time()
        if keys is not None:
            first = keys[1]
            for i, mid in enumerate(new):
                known[mid] = first + i
            self._xm(
                cur,
                "INSERT INTO messages (pk, id, parent_pk, blob_pk, position, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                [(known[p.id], p.id, known[parent] if parent is not None else None, have_blobs[p.blob], positions[p.id], now) for parent, p in new.values()],
            )
            return known
        self._xm(
            cur,
            "INSERT INTO messages (id, parent_pk, blob_pk, position, created_at) "
            "VALUES (?, (SELECT pk FROM messages WHERE id = ?), ?, ?, ?) ON CONFLICT (id) DO NOTHING",
            [(p.id, parent, have_blobs[p.blob], positions[p.id], now) for parent, p in new.values()],
        )
        known.update(self._ids_to_pks(cur, "messages", list(new)))
        return known

    def _insert_chain(
        self, cur: Any, links: Sequence[tuple[str | None, _Prepared]], first: int, blob_pks: Mapping[str, int], parent: tuple[str, int, int] | None, now: float | None = None
    ) -> dict[str, int]:
        """Insert a chain of new messages under keys from ``first`` on, after ``parent``
        (``(id, pk, position)``, ``None``: from the root); return id → pk, the parent's too."""
        pk, position = (parent[1], parent[2]) if parent is not None else (None, -1)
        out = {parent[0]: parent[1]} if parent is not None else {}
        if now is None:
            now = time.time()
        rows = []
        for i, (_, p) in enumerate(links, start=1):
            rows.append((first, p.id, pk, blob_pks[p.blob], position + i, now))
            out[p.id] = pk = first
            first += 1
        cur.executemany(self._sql("INSERT INTO messages (pk, id, parent_pk, blob_pk, position, created_at) VALUES (?, ?, ?, ?, ?, ?)"), rows)
        return out

    def _insert_blobs(self, cur: Any, first: int, fresh: Sequence[_Prepared]) -> tuple[dict[str, int], dict[str, int]]:
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

    def _prepare_chain(self, messages: Sequence[Message], parent_id: str | None) -> list[_Prepared]:
        # opt-in (redaction.content): key shapes and registered secrets never reach the store
        # redacted copies are new objects each time: nothing to remember
        if self.redact_content:
            return _prepare(redact_messages(messages), parent_id)
        return _prepare(messages, parent_id, self._prepared)

    def _store_chain(
        self,
        cur: Any,
        messages: Sequence[Message],
        parent_id: str | None = None,
        *,
        stored_parent: tuple[str, int, int] | None = None,
        prepared: list[_Prepared] | None = None,
        now: float | None = None,
    ) -> list[tuple[int, str]]:
        """Store ``messages`` chained after ``parent_id``; ``prepared``: their :func:`_prepare`
        from that parent, done before the transaction."""
        if prepared is None:
            prepared = self._prepare_chain(messages, parent_id)
        links: list[tuple[str | None, _Prepared]] = []
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
        last for ``session_id`` as a history from the root, matched by identity: the same
        message objects chained from the root have the same ids, and stored rows are never
        edited or deleted, so their keys need no lookup. A session recorded again in full
        (after a compaction, a cap) then hashes and looks up only its new messages.

        Call it inside a write transaction (which has folded the append journal): the keys of
        messages appended through the journal are looked up then, once (the memo keeps them)."""
        hit = self._chains.get(session_id)
        if hit is None or not messages:
            return []
        objs, chain = hit
        k = identical_prefix(messages, objs)
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

    def _remember_chain(self, session_id: str, messages: list[Message], chain: _Chain) -> None:
        """Remember a committed history of ``session_id`` (see :meth:`_known_chain`)."""
        if self.redact_content or len(messages) != len(chain):
            return
        with self._chains_lock:
            self._chains.pop(session_id, None)
            self._chains[session_id] = (messages, chain)
            while len(self._chains) > _CHAINS_MAX:
                del self._chains[next(iter(self._chains))]

    def _extend_chain(self, session_id: str, hit: tuple[list[Message], _Chain], n: int, msgs: Sequence[Message], links: _Chain) -> None:
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

    def _chain_from_root(self, cur: Any, session_id: str, messages: list[Message]) -> list[tuple[int, str]]:
        """:meth:`_store_chain` of a whole history, skipping the prefix already known."""
        known = self._known_chain(cur, session_id, messages)
        if not known:
            return self._store_chain(cur, messages)
        k = len(known)
        if k == len(messages):
            return list(known)
        pk, mid = known[-1]
        # a message's position in a chain from the root is its index
        return [*known, *self._store_chain(cur, messages[k:], mid, stored_parent=(mid, pk, k - 1))]

    # -- the append journal (SQLite) ----------------------------------------------------------------
    # A turn that only adds messages after the message this store object wrote last for the
    # session (an append; or a whole history that extends the last one it wrote, the turn after
    # a compaction) is one row of ``append_journal``: its new messages' ids, hashes and
    # canonical JSON, computed once. The rows are folded into the tables, in the order they were
    # committed, by the next transaction that reads or writes anything else (whichever
    # process runs it), by the append that fills the journal to _FOLD_EVERY rows, and when a
    # store is closed or opened. Every read therefore sees every committed append; what
    # changes is when the rows are written: an append costs one small row instead of seven
    # statements over four tables and their indexes.
    _JOURNAL_INSERT = "INSERT INTO append_journal (session_pk, kind, after_id, meta, body, created_at) VALUES (?, ?, ?, ?, ?, ?)"

    def _journal_insert(self, row: Sequence[Any]) -> int:
        """Insert one journal row in a transaction of its own, without folding the journal
        first; return its key (the backend's hook)."""
        with self._write() as cur:
            self._x(cur, self._JOURNAL_INSERT, row)
            return int(cur.lastrowid or 0)

    def _journal_append(
        self, session_id: str, session_pk: int, hit: tuple[list[Message], _Chain], n: int, msgs: list[Message], prepared: list[_Prepared], kind: str = "append"
    ) -> list[str]:
        """Journal ``msgs`` (``prepared`` after the n-th message of ``hit``, the session's chain
        this object wrote last); ``kind``: the event the fold records, as the direct write would."""
        after = hit[1][n - 1][1]
        meta = orjson.dumps([[p.id, p.blob, p.role, p.tokens] for p in prepared]).decode()
        body = "\n".join(p.canonical for p in prepared)  # canonical JSON has no raw line break
        key = self._journal_insert((session_pk, kind, after, meta, body, time.time()))
        self._journaled = True
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
        for jpk, spk, kind, after, meta, body, created in rows:
            items = json.loads(meta)
            bodies = str(body).split("\n")
            if len(bodies) != len(items):
                raise StoreError(f"append journal row {jpk} is damaged: {len(items)} ids for {len(bodies)} messages")
            prepared = [
                _Prepared(canonical, str(blob), str(mid), str(role), _search_text(json.loads(canonical)), int(tokens))
                for (mid, blob, role, tokens), canonical in zip(items, bodies, strict=True)
            ]
            at = placed.get(after)
            if at is None:
                row = self._one(cur, "SELECT pk, position FROM messages WHERE id = ?", (after,))
                if row is None:
                    raise StoreError(f"append journal row {jpk} follows message {after}, which is not in the store")
                at = (int(row[0]), int(row[1]))
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
        self._x(cur, "DELETE FROM append_journal WHERE pk <= ?", (rows[-1][0],))
        self._journaled = False
        return len(rows)

    # -- SessionRecorder and writes -------------------------------------------------------------------
    def record_messages(self, session_id: str, messages: Sequence[Message], *, meta: Mapping[str, Any] | None = None) -> list[str]:
        msgs = list(messages)
        known_pk = self._session_pks.get(session_id) if meta is None else None
        hit = self._chains.get(session_id)
        k = len(hit[1]) if hit is not None else 0
        if self._journal and known_pk is not None and hit is not None and k and len(msgs) > k and identical_prefix(msgs, hit[0][:k]) == k:
            # the history this object wrote last, and more (the turn after a compaction): the journal
            new = self._prepare_chain(msgs[k:], hit[1][k - 1][1])
            return [mid for _, mid in hit[1][:k]] + self._journal_append(session_id, known_pk, hit, k, msgs[k:], new, kind="messages")
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
        hit = self._chains.get(session_id)
        n = len(hit[1]) if hit is not None else 0
        if self._journal and early and known_pk is not None and hit is not None and n and hit[1][n - 1][1] == after:
            # after the message this store object wrote last for the session: the journal
            return self._journal_append(session_id, known_pk, hit, n, msgs, early)
        with self._write() as cur:
            spk = known_pk if known_pk is not None else self._ensure_session(cur, session_id)
            self._lock_session(cur, spk)
            hit = self._chains.get(session_id)
            row: tuple[Any, ...] | None
            if after is not None and hit is not None and hit[1] and hit[1][-1][1] == after:
                # the message this store object wrote last for the session (rows are immutable)
                last_pk = hit[1][-1][0]
                if last_pk is None:  # appended through the journal (folded on entry)
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

    def record_compaction(self, session_id: str, report: Mapping[str, Any], before: Sequence[Message], after: Sequence[Message]) -> str:
        engine = str(report.get("engine", "unknown"))
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
            cid = _compaction_id(session_id, before_tip, after_tip, engine)
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
        if not children:
            raise InputError(f"node {node_id}: a summary node needs at least one child")
        text = clean(text)  # a node is generated text: lone surrogates become U+FFFD (textsafe)
        with self._write() as cur:
            if self._one(cur, "SELECT pk FROM nodes WHERE id = ?", (node_id,)) is not None:
                return False
            spk = self._ensure_session(cur, session_id)
            msg_pks = self._ids_to_pks(cur, "messages", [cid for kind, cid in children if kind == "message"])
            node_pks = self._ids_to_pks(cur, "nodes", [cid for kind, cid in children if kind == "node"])
            rows: list[tuple[int, int | None, int | None]] = []
            for pos, (kind, cid) in enumerate(children):
                if kind == "message":
                    if cid not in msg_pks:
                        raise NotFoundError(f"node {node_id}: child message {cid} is not in the store")
                    rows.append((pos, msg_pks[cid], None))
                elif kind == "node":
                    if cid not in node_pks:
                        raise NotFoundError(f"node {node_id}: child node {cid} is not in the store")
                    rows.append((pos, None, node_pks[cid]))
                else:
                    raise InputError(f"node {node_id}: child kind must be 'message' or 'node', not {kind!r}")
            tokens = estimate_message_tokens({"role": "user", "content": text})
            self._x(
                cur,
                "INSERT INTO nodes (id, session_pk, depth, text, tokens, meta, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (node_id, spk, int(depth), text, tokens, dumps(dict(meta or {}), default=str), time.time()),
            )
            row = self._one(cur, "SELECT pk FROM nodes WHERE id = ?", (node_id,))
            assert row is not None
            npk = int(row[0])
            self._xm(cur, "INSERT INTO node_children (node_pk, position, message_pk, child_node_pk) VALUES (?, ?, ?, ?)", [(npk, *r) for r in rows])
            self._index_node(cur, npk, text)
        return True

    # -- reading ------------------------------------------------------------------------------------------
    def _chain(self, cur: Any, tip_pk: int | None) -> list[tuple[int, str, str]]:
        """``(pk, id, body)`` from the root to ``tip_pk``."""
        if tip_pk is None:
            return []
        rows = self._all(
            cur,
            "WITH RECURSIVE chain(pk, parent_pk) AS ("
            " SELECT pk, parent_pk FROM messages WHERE pk = ?"
            " UNION ALL SELECT m.pk, m.parent_pk FROM messages m JOIN chain c ON m.pk = c.parent_pk)"
            " SELECT m.pk, m.id, b.body FROM chain c JOIN messages m ON m.pk = c.pk JOIN blobs b ON b.pk = m.blob_pk"
            " ORDER BY m.position",
            (tip_pk,),
        )
        return [(int(pk), str(mid), str(body)) for pk, mid, body in rows]

    def _resolve(self, cur: Any, session_pk: int, at: str | None) -> int | None:
        """The tip message pk of the point ``at`` in a session."""
        at = (at or "latest").strip()
        if at == "latest":
            row = self._one(cur, "SELECT tip_pk FROM sessions WHERE pk = ?", (session_pk,))
            return None if row is None or row[0] is None else int(row[0])
        kind, _, ref = at.partition(":")
        if kind == "event" and ref.isdigit() and int(ref) >= 1:
            row = self._one(cur, "SELECT tip_pk FROM events WHERE session_pk = ? ORDER BY seq LIMIT 1 OFFSET ?", (session_pk, int(ref) - 1))
            if row is None:
                raise NotFoundError(f"the session has no event {ref}")
            return None if row[0] is None else int(row[0])
        if kind in ("before", "after") and ref:
            column = "before_tip_pk" if kind == "before" else "after_tip_pk"
            row = self._one(cur, f"SELECT {column} FROM compactions WHERE id = ? AND session_pk = ?", (ref, session_pk))
            if row is None:
                raise NotFoundError(f"no compaction {ref!r} in this session")
            return None if row[0] is None else int(row[0])
        if kind == "message" and ref:
            row = self._one(
                cur,
                "SELECT m.pk FROM messages m JOIN session_messages sm ON sm.message_pk = m.pk AND sm.session_pk = ? WHERE m.id = ?",
                (session_pk, ref),
            )
            if row is None:
                raise NotFoundError(f"no message {ref!r} in this session")
            return int(row[0])
        raise InputError(f"unknown point {at!r}; use latest, event:N, before:<compaction id>, after:<compaction id> or message:<id>")

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
                return [body for _, _, body in chain]

            bodies = expand(tip, frozenset())
        return [json.loads(b) for b in bodies]

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
            for chunk in _chunks(list(dict.fromkeys(ids))):
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
            for chunk in _chunks(list(dict.fromkeys(ids))):
                marks = ",".join("?" * len(chunk))
                for mid, body in self._all(cur, f"SELECT m.id, b.body FROM messages m JOIN blobs b ON b.pk = m.blob_pk WHERE m.id IN ({marks})", chunk):
                    bodies[str(mid)] = str(body)
        return [(i, json.loads(bodies[i])) for i in ids]

    def _covering_nodes(self, cur: Any, message_pks: Sequence[int]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for chunk in _chunks(list(dict.fromkeys(message_pks))):
            marks = ",".join("?" * len(chunk))
            for mpk, nid in self._all(cur, f"SELECT nc.message_pk, n.id FROM node_children nc JOIN nodes n ON n.pk = nc.node_pk WHERE nc.message_pk IN ({marks}) ORDER BY n.pk", chunk):
                out.setdefault(int(mpk), []).append(str(nid))
        return out

    # -- search -------------------------------------------------------------------------------------------
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
        for chunk in _chunks(blob_pks):
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
        for chunk in _chunks(all_mpks):
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

    # -- recall (ctx_grep's candidates) -------------------------------------------------------------
    def _message_ids_of_blobs(self, cur: Any, spk: int, blob_pks: list[int]) -> dict[int, list[str]]:
        """The ids of the session's messages holding each blob (in message order), by blob key."""
        ids: dict[int, list[str]] = {}
        for chunk in _chunks(blob_pks):
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
            for chunk in _chunks(list(dict.fromkeys(blob_keys))):
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
            keys: set[int] = set()
            for q in qs:
                found = self._identifier_blobs(cur, spk, q, limit)
                words = self._word_blobs(cur, spk, q, limit)
                if found is None or words is None:
                    return None
                keys.update(found)
                keys.update(words)
            if not keys:
                return None
            cond = " OR ".join(f"{self._instr}(lower(b.text), lower(?)) > 0" for _ in qs)
            rows: list[tuple[Any, ...]] = []
            for chunk in _chunks(sorted(keys)):
                marks = ",".join("?" * len(chunk))
                rows += self._all(
                    cur,
                    "SELECT b.pk, b.role, b.text, MAX(m.position) FROM blobs b JOIN messages m ON m.blob_pk = b.pk"
                    " JOIN session_messages sm ON sm.message_pk = m.pk AND sm.session_pk = ?"
                    f" WHERE b.pk IN ({marks}) AND ({cond}) GROUP BY b.pk, b.role, b.text",
                    [spk, *chunk, *qs],
                )
            rows.sort(key=lambda r: (-int(r[3]), -int(r[0])))
            rows = rows[:limit]
            ids = self._message_ids_of_blobs(cur, spk, [int(r[0]) for r in rows])
            out = [("message", str(r[1]), ids.get(int(r[0]), []), str(r[2])) for r in rows]
            ncond = cond.replace("b.text", "text")
            for nid, text in self._all(cur, f"SELECT id, text FROM nodes WHERE session_pk = ? AND ({ncond}) ORDER BY pk DESC LIMIT ?", [spk, *qs, int(limit)]):
                out.append(("node", "summary", [str(nid)], str(text)))
        return out

    # -- export / import -----------------------------------------------------------------------------
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
        links: list[tuple[str | None, _Prepared]] = []
        for i, entry in enumerate(valid.messages):
            parent = entry["parent"]
            prep = _prepare([entry["message"]], parent)[0]
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
                cid = c["id"] if target == sess["id"] else _compaction_id(target, c["before_tip"], c["after_tip"], c["engine"])
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

    def schema_version(self) -> int:
        with self._read() as cur:
            return current_version(cur, self.backend, ensure_table=False)

    def _migrate(self, cur: Any, target: int | None) -> list[str]:
        return apply_migrations(cur, self.backend, target=target)
