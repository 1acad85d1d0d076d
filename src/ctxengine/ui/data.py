"""What the dashboard and ``ctxengine stats`` show, read from a session store: plain dicts, every
string passed through :func:`ctxengine.redact.redact_obj` (no key shape, URL credential or
registered secret leaves here), money at the prices of :mod:`ctxengine.ui.prices`
(``genai-prices``, else the model table; ``None`` for a model neither knows: tokens, never
invented money), each figure with the source of its prices.

Money saved is priced as the tokens a request did not send, at the model's cache-read price:
the lowest price those tokens would have been billed at had they stayed in a warm cache, so the
figure is a lower bound (a cold cache would have billed them at the full input price)."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ctxengine.facts import context_text, extract_facts, missing_facts
from ctxengine.messages import Message, content_text, is_summary, message_text
from ctxengine.recall import Recall
from ctxengine.redact import redact_obj
from ctxengine.store import SessionStore, UsageRow
from ctxengine.store.ids import canonical_json
from ctxengine.tokens import estimate_message_tokens
from ctxengine.ui.prices import OWN_TABLE, pricing
from ctxengine.ui.usage import UsageReader, merge

__all__ = [
    "audit",
    "expand",
    "grep",
    "overview",
    "price",
    "session_detail",
    "sessions_table",
]

_SERIES_POINTS = 48


def _safe(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` with every string redacted (keys shapes, URL credentials, registered secrets)."""
    out: dict[str, Any] = redact_obj(value)
    return out


def price(model: str, row: UsageRow) -> dict[str, Any]:
    """``cost`` (what the provider billed for the prompts and completions of ``row``) and
    ``saved`` (tokens not sent, at the cache-read price), both USD, and their ``source``; both
    ``None`` for a model no price source knows."""
    p = pricing(model)
    if p is None:
        return {"cost": None, "saved": None, "source": None}
    cost = p.cost(row.requests, row.prompt_tokens, row.cache_read_tokens, row.cache_write_tokens, row.completion_tokens)
    return {"cost": cost, "saved": max(0, row.tokens_in - row.tokens_out) * p.read, "source": p.source}


def _figures(row: UsageRow, money: Mapping[str, float | None]) -> dict[str, Any]:
    return {
        **row.key,
        "requests": row.requests,
        "tokens_in": row.tokens_in,
        "tokens_out": row.tokens_out,
        "saved_tokens": max(0, row.tokens_in - row.tokens_out),
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "cache_read_tokens": row.cache_read_tokens,
        "cache_write_tokens": row.cache_write_tokens,
        "cache_read_share": row.cache_read_tokens / row.prompt_tokens if row.prompt_tokens else None,
        "compactions": row.compactions,
        "fail_opens": row.fail_opens,
        "errors": row.errors,
        "shadow": row.shadow,
        "last_at": row.last_at,
        "cost": money.get("cost"),
        "saved": money.get("saved"),
        "price_source": money.get("source"),
    }


def _add(rows: Sequence[dict[str, Any]], key: dict[str, Any]) -> dict[str, Any]:
    """``rows`` added up (money: ``None`` when every row's is unknown, else the known part)."""
    out: dict[str, Any] = dict(key)
    for name in ("requests", "tokens_in", "tokens_out", "saved_tokens", "prompt_tokens", "completion_tokens", "cache_read_tokens",
                 "cache_write_tokens", "compactions", "fail_opens", "errors", "shadow"):
        out[name] = sum(int(r[name]) for r in rows)
    for name in ("cost", "saved"):
        known = [float(r[name]) for r in rows if r[name] is not None]
        out[name] = sum(known) if known else None
    out["unpriced_requests"] = sum(int(r["requests"]) for r in rows if r["cost"] is None)
    out["price_sources"] = sorted({str(r["price_source"]) for r in rows if r.get("price_source")} | {src for r in rows for src in r.get("price_sources", [])})
    out["cache_read_share"] = out["cache_read_tokens"] / out["prompt_tokens"] if out["prompt_tokens"] else None
    out["last_at"] = max((float(r["last_at"]) for r in rows), default=0.0)
    return out


_LADDER = (60.0, 300.0, 900.0, 3600.0, 3 * 3600.0, 6 * 3600.0, 86_400.0, 7 * 86_400.0, 30 * 86_400.0)


def _bucket(span: float) -> float:
    """The series' bucket: the smallest step of a fixed ladder giving at most about 48 points
    (fixed steps, so a reader's kept sums stay valid while the log grows)."""
    return next((b for b in _LADDER if span / b <= _SERIES_POINTS), _LADDER[-1])


def overview(store: SessionStore, *, since: float | None = None, now: float | None = None, reader: UsageReader | None = None) -> dict[str, Any]:
    """Totals, per model, per client and over time (about 48 points from the first request),
    all from one grouping of the log by time bucket, model and client (priced per model and
    client)."""
    u = reader or UsageReader(store)
    end = time.time() if now is None else now
    [whole] = u.usage([], since=since) or [UsageRow(key={})]
    bucket = _bucket(max(end, whole.last_at) - whole.first_at if whole.requests else 0.0)
    rows = u.usage(["bucket", "model", "client"], since=since, bucket=bucket)
    pairs: dict[tuple[str, str], UsageRow] = {}
    for r in rows:
        k = (str(r.key["model"]), str(r.key["client"]))
        pairs[k] = merge(pairs.get(k), UsageRow({"model": k[0], "client": k[1]}, *_sums(r)))
    priced = [_figures(r, price(m, r)) for (m, _), r in pairs.items()]
    by_model = [_add([f for f in priced if f["model"] == m], {"model": m, "priced": pricing(m) is not None}) for m in sorted({m for m, _ in pairs})]
    by_client = [_add([f for f in priced if f["client"] == c], {"client": c or "(unnamed)"}) for c in sorted({c for _, c in pairs})]
    totals = _add(priced, {})
    return _safe({
        "totals": totals,
        "by_model": sorted(by_model, key=lambda r: -int(r["tokens_in"])),
        "by_client": sorted(by_client, key=lambda r: -int(r["tokens_in"])),
        "series": _series([(r.key, _figures(r, {})) for r in rows], bucket, end),
        "sessions": len(u.usage(["session"], since=since)),
        "price_source": _sources(totals["price_sources"]),
        "generated_at": end,
    })


def _sums(r: UsageRow) -> tuple[Any, ...]:
    return (r.requests, r.tokens_in, r.tokens_out, r.prompt_tokens, r.completion_tokens, r.cache_read_tokens, r.cache_write_tokens,
            r.compactions, r.fail_opens, r.errors, r.shadow, r.last_at, r.first_at)


def _sources(names: Sequence[str]) -> str:
    return "; ".join(names) if names else f"none yet (genai-prices where it knows a model, else the {OWN_TABLE})"


def _series(groups: Sequence[tuple[dict[str, Any], dict[str, Any]]], bucket: float, end: float) -> list[dict[str, Any]]:
    """Every bucket from the first request's to now's, empty ones included."""
    if not groups:
        return []
    points: dict[int, list[dict[str, Any]]] = {}
    for key, figures in groups:
        points.setdefault(round(float(key["bucket"]) / bucket), []).append(figures)
    lo, hi = min(points), max(max(points), int(end // bucket))
    lo = max(lo, hi - 2 * _SERIES_POINTS)  # a clock that went back: the recent part
    return [_add(points.get(i, []), {"at": i * bucket, "bucket": bucket}) for i in range(lo, hi + 1)]


def sessions_table(store: SessionStore, *, limit: int = 1000, reader: UsageReader | None = None) -> list[dict[str, Any]]:
    """One row per session (most recently active first): client, model, turns, tokens, saved."""
    u = reader or UsageReader(store)
    per: dict[str, dict[str, Any]] = {}
    for r in u.usage(["session", "model", "client"]):
        sid = str(r.key["session"])
        row = per.setdefault(sid, {"turns": 0, "tokens_in": 0, "tokens_out": 0, "saved": None, "last": 0.0, "main": ("", "", 0)})
        row["turns"] += r.requests
        row["tokens_in"] += r.tokens_in
        row["tokens_out"] += r.tokens_out
        row["last"] = max(row["last"], r.last_at)
        if r.requests > row["main"][2]:
            row["main"] = (str(r.key["model"]), str(r.key["client"]), r.requests)
        rates = pricing(str(r.key["model"]))
        if rates is not None:
            row["saved"] = (row["saved"] or 0.0) + max(0, r.tokens_in - r.tokens_out) * rates.read
    out = []
    for info in store.list_sessions(limit=limit):
        p = per.get(info.id, {"turns": 0, "tokens_in": 0, "tokens_out": 0, "saved": None, "last": 0.0, "main": ("", "", 0)})
        out.append({
            "id": info.id, "client": p["main"][1], "model": p["main"][0], "turns": p["turns"], "messages": info.length,
            "compactions": info.compactions, "tokens_in": p["tokens_in"], "tokens_out": p["tokens_out"],
            "saved_tokens": max(0, p["tokens_in"] - p["tokens_out"]), "saved": p["saved"], "last_active": max(info.updated_at, p["last"]),
        })
    out.sort(key=lambda r: -float(str(r["last_active"])))
    return list(redact_obj(out))


def session_detail(store: SessionStore, session_id: str) -> dict[str, Any]:
    """A session: its figures, each request (tokens as received and as sent, cache reads and
    writes) and its compactions (raises :class:`~ctxengine.errors.NotFoundError`)."""
    info = store.get_session(session_id)
    requests = store.requests(session_id)
    comps = store.compactions(session_id)
    rows = [_figures(r, price(str(r.key["model"]), r)) for r in store.usage(["model"], session_id=session_id)]
    marks = _compactions_per_request([r.created_at for r in requests], [c.created_at for c in comps])
    return _safe({
        "id": info.id,
        "messages": info.length,
        "stored": info.stored,
        "created_at": info.created_at,
        "updated_at": info.updated_at,
        "totals": _add(rows, {}),
        "models": sorted(str(r["model"]) for r in rows),
        "requests": [
            {"at": r.created_at, "compacted": marks[i], "model": r.model, "client": r.client, "outcome": r.outcome, "status": r.status, "tokens_in": r.tokens_in,
             "tokens_out": r.tokens_out, "prompt_tokens": r.prompt_tokens, "cache_read_tokens": r.cache_read_tokens,
             "cache_write_tokens": r.cache_write_tokens, "completion_tokens": r.completion_tokens, "compactions": r.compactions, "shadow": r.shadow}
            for i, r in enumerate(requests)
        ],
        "compactions": [
            {"id": c.id, "at": c.created_at, "engine": c.engine, "tokens_before": c.tokens_before, "tokens_after": c.tokens_after,
             "removed": len(c.replaced), "notes": list(c.report.get("notes") or []), "fallback": c.report.get("fallback")}
            for c in comps
        ],
        "price_source": _sources(_add(rows, {})["price_sources"]),
    })


_RECORD = re.compile(r"\[ctxengine:([a-z_]+)(?: (?:ref|node)=([^\s:\]]+))?")


def _compactions_per_request(requests: Sequence[float], compactions: Sequence[float]) -> list[int]:
    """How many of the stored compactions each request ran: those recorded after the previous
    request was logged and by the time this one was (a request is logged after its response)."""
    out = [0] * len(requests)
    i = 0
    for at in sorted(compactions):
        while i < len(requests) and requests[i] < at:
            i += 1
        if i < len(requests):
            out[i] += 1
    return out


def _stand_in(m: Message) -> tuple[str, str | None]:
    """What a message an engine put in the context is (``cut marker``, ``digest``, ``summary``
    …) and the ref ``ctx_expand`` takes for its originals, when it names one."""
    text = content_text(m.get("content"))
    found = _RECORD.search(text[:2000])
    if found:
        kind = {"cut": "cut marker", "lcm": "summary"}.get(found.group(1), found.group(1))
        return kind, found.group(2)
    return ("summary" if is_summary(m) else "changed"), None


def audit(store: SessionStore, compaction_id: str) -> dict[str, Any]:
    """A compaction's audit (raises NotFoundError): every message of the history before it that
    the context after it lacks, or that the engine reported replacing (role, size, the facts of
    it the compacted context still holds verbatim), and every message of the context after it
    that the history before it lacked (the digests, summaries and cut markers standing in).

    Messages are compared by content, not by id: a message's id chains its parent's, so every
    message after a changed one has a new id even when it is unchanged."""
    c = store.get_compaction(compaction_id)
    before_ids = store.history_ids(c.session_id, f"before:{c.id}")
    after_ids = store.history_ids(c.session_id, f"after:{c.id}")
    before = store.get_messages(before_ids)
    after = store.get_messages(after_ids)
    after_left = Counter(canonical_json(m) for m in after)
    reported = set(c.replaced)
    gone: list[int] = []
    for i, (mid, m) in enumerate(zip(before_ids, before, strict=True)):
        key = canonical_json(m)
        if after_left[key] > 0 and mid not in reported:
            after_left[key] -= 1
        else:
            gone.append(i)
    after_text = context_text(after)
    removed = [_removed(i, before_ids[i], before[i], after_text) for i in gone]
    before_left = Counter(canonical_json(m) for m in before)
    stand_ins = []
    for i, (mid, m) in enumerate(zip(after_ids, after, strict=True)):
        key = canonical_json(m)
        if before_left[key] > 0:
            before_left[key] -= 1
            continue
        kind, ref = _stand_in(m)
        stand_ins.append({"position": i, "id": mid, "role": str(m.get("role")), "kind": kind, "ref": ref, "tokens": estimate_message_tokens(m), "text": message_text(m)})
    return _safe({
        "id": c.id, "session_id": c.session_id, "at": c.created_at, "engine": c.engine, "tokens_before": c.tokens_before,
        "tokens_after": c.tokens_after, "messages_before": len(before_ids), "messages_after": len(after_ids),
        "notes": list(c.report.get("notes") or []), "removed": removed, "stand_ins": stand_ins,
    })


def _removed(position: int, mid: str, m: Message, after_text: str) -> dict[str, Any]:
    facts = extract_facts([m])
    every = facts.all()
    missing = set(missing_facts(facts, after_text).all())
    text = message_text(m)
    return {
        "position": position, "id": mid, "role": str(m.get("role")), "tokens": estimate_message_tokens(m), "chars": len(text),
        "preview": _preview(text), "facts": len(every), "facts_kept": len(every) - len(missing),
        "facts_missing": [f for f in every if f in missing][:20],
    }


def _preview(text: str, width: int = 160) -> str:
    one = " ".join(text.split())
    return one if len(one) <= width else one[: width - 1] + "…"


def expand(store: SessionStore, session_id: str, ref: str) -> dict[str, Any]:
    """What ``ctx_expand`` returns for ``ref`` (a message id, node id or cut marker's ref)."""
    store.get_session(session_id)
    return dict(redact_obj(Recall(store, session_id).expand(ref, max_tokens=20_000)))


def grep(store: SessionStore, session_id: str, query: str) -> dict[str, Any]:
    """What ``ctx_grep`` returns for ``query`` over the session."""
    store.get_session(session_id)
    return dict(redact_obj(Recall(store, session_id).grep(query, limit=50)))
