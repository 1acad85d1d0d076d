"""Ids and hashing: canonical JSON, content hashes, hash-chained message ids, and a message
prepared for writing (its canonical JSON, hashes, search text and size, computed once).

Ids are content addresses: a message's id is the hash of its parent's id and its blob's hash,
so the same history always gets the same ids, in any backend and any process.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ctxengine.errors import InputError
from ctxengine.messages import (
    PLAIN_NO_FLOAT,
    Message,
    identical_prefix,
    json_problem,
    message_text,
    plain_json_kind,
)
from ctxengine.textsafe import clean, escape_surrogates
from ctxengine.tokens import MESSAGE_OVERHEAD_TOKENS

__all__ = ["Memo", "Prepared", "blob_hash", "canonical_json", "compaction_id", "message_id", "prepare", "same_json", "same_prefix", "search_text"]

_ID_CHARS = 32  # 128 bits of SHA-256: collision-free for any store, half the index size


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


def compaction_id(session_id: str, before_tip: str | None, after_tip: str | None, engine: str) -> str:
    """Id of a compaction event: its session, the tips before and after, and its engine."""
    key = json.dumps([session_id, before_tip, after_tip, engine])
    return "c" + hashlib.sha256(key.encode()).hexdigest()[: _ID_CHARS - 1]


_MISSING = object()


def same_json(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` certainly have the same :func:`canonical_json` (so the same
    blob hash), False when they differ or when that cannot be told cheaply.

    Stricter than ``==``, which calls ``1``, ``1.0`` and ``True`` equal (their JSON differs):
    types must match exactly (dicts with string keys, lists, strings, integers, booleans,
    ``None``; floats by their ``repr``, the JSON they are written as), anything else is not
    the same. Shared objects are not visited again: a copy that shares its strings with the
    original (an engine's deep copy) is told the same in a few microseconds, without
    serialising or hashing anything."""
    stack = [(a, b)]
    pop, push = stack.pop, stack.append
    while stack:
        x, y = pop()
        if x is y:
            continue
        t = type(x)
        if t is not type(y):
            return False
        if t is dict:
            if len(x) != len(y):
                return False
            for k, v in x.items():
                if type(k) is not str:
                    return False
                w = y.get(k, _MISSING)
                if v is not w:
                    if w is _MISSING:
                        return False
                    push((v, w))
        elif t is list:
            if len(x) != len(y):
                return False
            stack.extend((v, w) for v, w in zip(x, y, strict=True) if v is not w)
        elif t is str or t is int or t is bool:
            if x != y:
                return False
        elif t is float:
            if repr(x) != repr(y):
                return False
        else:
            return False
    return True


def same_prefix(messages: Sequence[Any], objs: Sequence[Any]) -> int:
    """How many leading messages of ``messages`` and ``objs`` are the same objects or
    :func:`same_json` copies of them (identity first: one C-level pass for a list that grew
    from the other)."""
    n = min(len(messages), len(objs))
    k = identical_prefix(messages, objs)
    while k < n and same_json(messages[k], objs[k]):
        k += 1
    return k


# -- a message prepared for writing --------------------------------------------------------------
@dataclass(slots=True)
class Prepared:
    """One message ready to write: canonical JSON, blob hash, message id, role, search text, size."""

    canonical: str
    blob: str
    id: str
    role: str
    text: str
    tokens: int

_MEMO_SIZE = 16_384
Memo = dict[int, "tuple[Message, Prepared]"]
"""Prepared messages by message object (see :func:`prepare`)."""

_BY_TEXT_MIN = 256
"""Characters of ``content`` from which a message is also remembered by its text (see
:func:`prepare`): below that, serialising and hashing it costs about as much as a lookup."""

_BY_TEXT_MAX_CHARS = 32_000_000
"""Characters of ``content`` the by-text memo holds at most (then it starts anew): it keeps
its strings alive, and is process-wide."""

_by_text: dict[int, tuple[str, Message, Prepared]] = {}
"""Prepared messages by the ``content`` string they hold, for all stores of the process."""
_by_text_chars = [0]


def _known(m: Message, memo: Memo | None) -> Prepared | None:
    """The serialisation and hashes of ``m`` computed before: of this very object (``memo``),
    or of a message holding the same ``content`` string whose JSON is the same (a copy of
    it: an engine's deep copy shares its strings; :func:`same_json`)."""
    hit = memo.get(id(m)) if memo is not None else None
    if hit is not None and hit[0] is m:
        return hit[1]
    content = m.get("content") if type(m) is dict else None
    if type(content) is str and len(content) >= _BY_TEXT_MIN:
        seen = _by_text.get(id(content))
        if seen is not None and seen[0] is content and same_json(m, seen[1]):
            return seen[2]
    return None


def _remember(m: Message, p: Prepared, memo: Memo | None) -> None:
    if memo is not None:
        if len(memo) >= _MEMO_SIZE:
            memo.clear()
        memo[id(m)] = (m, p)
    content = m.get("content")
    if type(content) is str and len(content) >= _BY_TEXT_MIN:
        if len(_by_text) >= _MEMO_SIZE or _by_text_chars[0] + len(content) > _BY_TEXT_MAX_CHARS:
            _by_text.clear()
            _by_text_chars[0] = 0
        _by_text[id(content)] = (content, m, p)
        _by_text_chars[0] += len(content)


def forget(messages: Sequence[Message], memo: Memo | None) -> None:
    """Drop what :func:`prepare` remembers of ``messages`` (a session that ended): the memo
    keeps each message and its text alive, and must follow the sessions that are live."""
    for m in messages:
        if memo is not None:
            hit = memo.get(id(m))
            if hit is not None and hit[0] is m:
                del memo[id(m)]
        content = m.get("content") if type(m) is dict else None
        if type(content) is str and len(content) >= _BY_TEXT_MIN:
            seen = _by_text.get(id(content))
            if seen is not None and seen[0] is content:
                del _by_text[id(content)]
                _by_text_chars[0] -= len(content)


def prepare(messages: Sequence[Message], parent_id: str | None, memo: Memo | None = None) -> list[Prepared]:
    """Canonical JSON, hashes and search text of each message, chained from ``parent_id``.

    ``memo`` (per store) keeps the serialisation and hashes of each message object it has seen
    (messages passed to ctxengine are never edited in place, and the memo holds each object, so
    its ``id`` is not reused): a session recorded again in full (after a compaction) hashes only
    its chain ids, not every message's JSON again. A message with a long ``content`` string is
    also remembered by that string, for every store of the process: a copy of it (the deep
    copy an engine records, the same history in another store) shares the string and is
    recognised by :func:`same_json` without serialising or hashing it again."""
    out = []
    for i, m in enumerate(messages):
        base = _known(m, memo)
        if base is not None:
            mid = message_id(parent_id, base.blob)
            out.append(Prepared(base.canonical, base.blob, mid, base.role, base.text, base.tokens))
            parent_id = mid
            continue
        if not isinstance(m, dict):
            raise InputError(f"message {i} is a {type(m).__name__}, not a dict")
        canon = canonical_json(m)
        b = blob_hash(canon)
        mid = message_id(parent_id, b)
        text = search_text(m)
        # a size for listings (characters / 4 + the per-message overhead): the exact estimate
        # costs as much as hashing the message, and ingest speed matters more here
        p = Prepared(canon, b, mid, str(m.get("role", "")), text, (len(text) + 3) // 4 + MESSAGE_OVERHEAD_TOKENS)
        out.append(p)
        _remember(m, p, memo)
        parent_id = mid
    return out


def search_text(m: Mapping[str, Any]) -> str:
    """The text a message is searched by: its text and its reasoning, lone surrogates replaced."""
    text = message_text(m)
    reasoning = m.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        text = f"{text}\n{reasoning}" if text else reasoning
    return clean(text)  # derived text: lone surrogates become U+FFFD (the body keeps them)
