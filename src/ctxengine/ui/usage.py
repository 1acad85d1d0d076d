"""The request log added up, kept between page loads (:class:`UsageReader`): the log only grows,
so a reader remembers each grouping's sums with the log position they cover and, on the next
load, adds up only the rows logged since (SQLite, whose rows appear in position order), or
reuses them while nothing was logged (any backend). Work per load follows what is new, not the
size of the log."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ctxengine.store import SessionStore, UsageRow

__all__ = ["UsageReader", "merge"]


def merge(a: UsageRow | None, b: UsageRow) -> UsageRow:
    """``a`` and ``b`` (rows of one group) added up."""
    if a is None:
        return b
    if not b.requests:
        return a
    if not a.requests:
        return b
    return UsageRow(
        key=a.key,
        requests=a.requests + b.requests,
        tokens_in=a.tokens_in + b.tokens_in,
        tokens_out=a.tokens_out + b.tokens_out,
        prompt_tokens=a.prompt_tokens + b.prompt_tokens,
        completion_tokens=a.completion_tokens + b.completion_tokens,
        cache_read_tokens=a.cache_read_tokens + b.cache_read_tokens,
        cache_write_tokens=a.cache_write_tokens + b.cache_write_tokens,
        compactions=a.compactions + b.compactions,
        fail_opens=a.fail_opens + b.fail_opens,
        errors=a.errors + b.errors,
        shadow=a.shadow + b.shadow,
        last_at=max(a.last_at, b.last_at),
        first_at=min(a.first_at, b.first_at),
    )


class UsageReader:
    """``usage`` of a store, each whole-log grouping kept and extended (see the module docstring);
    a query with ``since`` or ``session_id`` goes to the store as asked. Thread-safe."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._kept: dict[tuple[tuple[str, ...], float | None], tuple[int, dict[tuple[tuple[str, object], ...], UsageRow]]] = {}

    def usage(self, by: Sequence[str] = (), *, since: float | None = None, bucket: float | None = None, session_id: str | None = None) -> list[UsageRow]:
        if since is not None or session_id is not None:
            return self.store.usage(by, since=since, bucket=bucket, session_id=session_id)
        key = (tuple(by), bucket if "bucket" in by else None)
        position = self.store.request_log_position()
        with self._lock:
            kept = self._kept.get(key)
        if kept is not None and kept[0] == position:
            return list(kept[1].values())
        grow = kept is not None and kept[0] < position and self.store.backend == "sqlite"
        start = kept[0] if grow and kept is not None else 0
        groups = dict(kept[1]) if grow and kept is not None else {}
        for row in self.store.usage(by, bucket=bucket, after=start, upto=position):
            k = tuple(sorted(row.key.items()))
            groups[k] = merge(groups.get(k), row)
        with self._lock:
            self._kept[key] = (position, groups)
        return list(groups.values())
