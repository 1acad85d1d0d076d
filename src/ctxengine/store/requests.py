"""The request log: one row per proxied request (tokens received and sent, the usage the
provider billed, compactions, outcome), written by the proxy once the response is out, read by
the dashboard and ``ctxengine stats`` (:class:`RequestLog`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ctxengine.errors import InputError
from ctxengine.store.sql import SqlCore
from ctxengine.store.values import RequestRecord, UsageRow

__all__ = ["GROUPS", "RequestLog"]

_COLUMNS = (
    "created_at, api, model, client, outcome, status, tokens_in, tokens_out, prompt_tokens,"
    " completion_tokens, cache_read_tokens, cache_write_tokens, compactions, shadow"
)
GROUPS = {"model": "r.model", "client": "r.client", "api": "r.api", "session": "s.id", "outcome": "r.outcome"}
"""What :meth:`RequestLog.usage` groups by (besides ``bucket``: a time bucket)."""

_SUMS = (
    "COUNT(*), SUM(r.tokens_in), SUM(r.tokens_out), SUM(r.prompt_tokens), SUM(r.completion_tokens),"
    " SUM(r.cache_read_tokens), SUM(r.cache_write_tokens), SUM(r.compactions),"
    " SUM(CASE WHEN r.outcome = 'fail_open' THEN 1 ELSE 0 END),"
    " SUM(CASE WHEN r.outcome NOT IN ('ok', 'fail_open') THEN 1 ELSE 0 END),"
    " SUM(r.shadow), MAX(r.created_at), MIN(r.created_at)"
)


def _n(value: Any) -> int:
    return int(value or 0)


def _record(session_id: str, row: Sequence[Any]) -> RequestRecord:
    at, api, model, client, outcome, status, t_in, t_out, prompt, completion, read, write, comps, shadow = row
    return RequestRecord(
        session_id=session_id, api=str(api), model=str(model), created_at=float(at), client=str(client), outcome=str(outcome),
        status=int(status), tokens_in=int(t_in), tokens_out=int(t_out), prompt_tokens=int(prompt), completion_tokens=int(completion),
        cache_read_tokens=int(read), cache_write_tokens=int(write), compactions=int(comps), shadow=bool(shadow),
    )


def _usage_row(key: dict[str, Any], sums: Sequence[Any]) -> UsageRow:
    n, t_in, t_out, prompt, completion, read, write, comps, fail_opens, errors, shadow, last, first = sums
    return UsageRow(
        key=key, requests=_n(n), tokens_in=_n(t_in), tokens_out=_n(t_out), prompt_tokens=_n(prompt), completion_tokens=_n(completion),
        cache_read_tokens=_n(read), cache_write_tokens=_n(write), compactions=_n(comps), fail_opens=_n(fail_opens), errors=_n(errors),
        shadow=_n(shadow), last_at=float(last or 0.0), first_at=float(first or 0.0),
    )


class RequestLog(SqlCore):
    """``record_request``, ``requests`` (a session's, in order) and ``usage`` (added up by group)."""

    def record_request(self, record: RequestRecord) -> None:
        """Add one request to the log (the session is created when new)."""
        if not isinstance(record, RequestRecord):
            raise InputError(f"record_request takes a RequestRecord, not a {type(record).__name__}")
        r = record
        with self._write() as cur:
            spk = self._ensure_session(cur, r.session_id)
            self._x(
                cur,
                f"INSERT INTO requests (session_pk, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    spk, r.created_at or time.time(), r.api, r.model or "", r.client or "", r.outcome, int(r.status),
                    int(r.tokens_in), int(r.tokens_out), int(r.prompt_tokens), int(r.completion_tokens),
                    int(r.cache_read_tokens), int(r.cache_write_tokens), int(r.compactions), 1 if r.shadow else 0,
                ),
            )

    def requests(self, session_id: str, *, limit: int = 5000) -> list[RequestRecord]:
        """The session's last ``limit`` requests, oldest first."""
        with self._read() as cur:
            spk = self._session_pk(cur, session_id)
            rows = self._all(cur, f"SELECT {_COLUMNS} FROM requests WHERE session_pk = ? ORDER BY created_at DESC, pk DESC LIMIT ?", (spk, int(limit)))
        return [_record(session_id, row) for row in reversed(rows)]

    def request_log_position(self) -> int:
        """The position of the log's newest row (0: empty); positions only grow. On SQLite, whose
        writers take turns, rows become visible in the order of their positions, so the rows
        after a position read once are exactly what was logged since."""
        with self._read() as cur:
            row = self._one(cur, "SELECT MAX(pk) FROM requests")
        return int(row[0]) if row and row[0] is not None else 0

    def usage(
        self,
        by: Sequence[str] = (),
        *,
        since: float | None = None,
        bucket: float | None = None,
        session_id: str | None = None,
        after: int = 0,
        upto: int | None = None,
    ) -> list[UsageRow]:
        """The log added up per group of ``by`` (names of :data:`GROUPS`, and ``bucket``: the
        start of each ``bucket``-second interval), over requests since ``since`` (a time), of
        ``session_id`` if given, and at positions in (``after``, ``upto``] (see
        :meth:`request_log_position`); one row with ``key={}`` when ``by`` is empty."""
        keys: list[tuple[str, str]] = []
        for name in by:
            if name == "bucket":
                if not bucket or bucket <= 0:
                    raise InputError("grouping by bucket needs bucket= seconds > 0")
                keys.append((name, f"CAST(r.created_at / {float(bucket)!r} AS INTEGER)"))
            elif name in GROUPS:
                keys.append((name, GROUPS[name]))
            else:
                raise InputError(f"cannot group requests by {name!r}; one of {sorted([*GROUPS, 'bucket'])}")
        where: list[str] = ["1 = 1"]
        params: list[Any] = []
        if since is not None:
            where.append("r.created_at >= ?")
            params.append(float(since))
        if session_id is not None:
            where.append("s.id = ?")
            params.append(session_id)
        if after:
            where.append("r.pk > ?")
            params.append(int(after))
        if upto is not None:
            where.append("r.pk <= ?")
            params.append(int(upto))
        select = ", ".join([*(expr for _, expr in keys), _SUMS])
        group = f" GROUP BY {', '.join(str(i + 1) for i in range(len(keys)))}" if keys else ""
        join = " JOIN sessions s ON s.pk = r.session_pk" if session_id is not None or "session" in by else ""
        sql = f"SELECT {select} FROM requests r{join} WHERE {' AND '.join(where)}{group}"
        with self._read() as cur:
            rows = self._all(cur, sql, params)
        out = []
        for row in rows:
            values, sums = row[: len(keys)], row[len(keys) :]
            if not keys and not sums[0]:
                return [UsageRow(key={})]
            key = {name: (int(v) * float(bucket or 0) if name == "bucket" else str(v)) for (name, _), v in zip(keys, values, strict=True)}
            out.append(_usage_row(key, sums))
        return out
