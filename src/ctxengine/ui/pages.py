"""The dashboard's pages as HTML strings, from the dicts of :mod:`ctxengine.ui.data` (already
redacted); every value is escaped here. The stylesheet and script ship in ``ui/static``."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from html import escape
from typing import Any
from urllib.parse import quote

from ctxengine.ui.charts import requests_chart, series_chart, tokens

__all__ = ["audit_page", "error_page", "expand_page", "overview_page", "session_page", "sessions_page"]


def e(value: Any) -> str:
    return escape(str(value), quote=True)


def q(value: str) -> str:
    """A path segment."""
    return quote(value, safe="")


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(float(ts), tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S") if ts else "–"


def _usd(v: float | None) -> str:
    if v is None:
        return '<span class="muted" title="no price for this model: tokens only">–</span>'
    return f"${v:,.4f}" if abs(v) < 1 else f"${v:,.2f}"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.0%}"


def _n(v: Any) -> str:
    return f"{int(v):,}"


def layout(title: str, body: str, *, base: str, active: str = "", poll: str = "") -> str:
    nav = "".join(
        f'<a href="{base}{href}" class="{"on" if key == active else ""}">{label}</a>'
        for key, href, label in (("overview", "/", "Overview"), ("sessions", "/sessions", "Sessions"))
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)} · ctxengine</title>"
        f'<link rel="stylesheet" href="{base}/static/ui.css"></head>'
        f'<body data-poll="{e(poll)}"><header><a class="brand" href="{base}/">ctxengine</a><nav>{nav}</nav>'
        '<span id="live" class="muted"></span></header>'
        f'<main id="main">{body}</main><script src="{base}/static/ui.js"></script></body></html>'
    )


def _card(label: str, value: str, sub: str = "") -> str:
    return f'<div class="card"><div class="label">{e(label)}</div><div class="value">{value}</div><div class="sub">{sub}</div></div>'


def _saved_sub(t: dict[str, Any]) -> str:
    share = t["saved_tokens"] / t["tokens_in"] if t["tokens_in"] else None
    return f"{_pct(share)} of received"


def _cards(t: dict[str, Any]) -> str:
    unpriced = f"; {_n(t['unpriced_requests'])} requests of unpriced models" if t.get("unpriced_requests") else ""
    return '<section class="cards">' + "".join([
        _card("Requests", _n(t["requests"]), f"{_n(t['shadow'])} in shadow mode" if t.get("shadow") else ""),
        _card("Tokens received", tokens(t["tokens_in"]), "what clients sent"),
        _card("Tokens sent", tokens(t["tokens_out"]), "what went upstream"),
        _card("Tokens saved", tokens(t["saved_tokens"]), _saved_sub(t)),
        _card("Money saved", _usd(t["saved"]), "at cache-read prices (a lower bound)" + unpriced),
        _card("Billed", _usd(t["cost"]), "cache reads and writes as billed"),
        _card("Cache reads", _pct(t["cache_read_share"]), f"{tokens(t['cache_read_tokens'])} read, {tokens(t['cache_write_tokens'])} written"),
        _card("Compactions", _n(t["compactions"]), ""),
        _card("Fail-opens", _n(t["fail_opens"]), "forwarded unchanged after an internal error"),
        _card("Errors", _n(t["errors"]), "upstream errors and unreachable"),
    ]) + "</section>"


def _table(headers: Sequence[tuple[str, str]], rows: Sequence[str], *, cls: str = "") -> str:
    head = "".join(f'<th class="{a}">{e(h)}</th>' for h, a in headers)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _usage_rows(rows: Sequence[dict[str, Any]], key: str) -> list[str]:
    out = []
    for r in rows:
        name = e(r[key] or "(unnamed)")
        if key == "model" and not r.get("priced"):
            name += ' <span class="tag" title="no price source knows this model: tokens only">no price</span>'
        elif key == "model":
            name = f'<span title="prices: {e("; ".join(r.get("price_sources") or []))}">{name}</span>'
        out.append(
            f"<tr><td>{name}</td><td class=num>{_n(r['requests'])}</td><td class=num>{tokens(r['tokens_in'])}</td>"
            f"<td class=num>{tokens(r['tokens_out'])}</td><td class=num>{tokens(r['saved_tokens'])}</td>"
            f"<td class=num>{_pct(r['cache_read_share'])}</td><td class=num>{_n(r['compactions'])}</td>"
            f"<td class=num>{_n(r['fail_opens'])}/{_n(r['errors'])}</td><td class=num>{_usd(r['cost'])}</td><td class=num>{_usd(r['saved'])}</td></tr>"
        )
    return out


_USAGE_HEAD = [("", ""), ("requests", "num"), ("received", "num"), ("sent", "num"), ("saved", "num"), ("cache reads", "num"),
               ("compactions", "num"), ("fail-opens/errors", "num"), ("billed", "num"), ("saved $", "num")]


def overview_page(d: dict[str, Any], *, base: str) -> str:
    t = d["totals"]
    body = (
        f'<h1>Overview <span class="muted">{_n(d["sessions"])} sessions</span></h1>' + _cards(t)
        + '<section><h2>Tokens over time</h2>' + series_chart(d["series"]) + "</section>"
        + '<section><h2>Per model</h2>' + _table([("model", ""), *_USAGE_HEAD[1:]], _usage_rows(d["by_model"], "model")) + "</section>"
        + '<section><h2>Per client</h2>' + _table([("client", ""), *_USAGE_HEAD[1:]], _usage_rows(d["by_client"], "client")) + "</section>"
        + f'<p class="source">Prices: {e(d["price_source"])}. A model without a price shows tokens only. Updated {_when(d["generated_at"])} UTC.</p>'
    )
    return layout("Overview", body, base=base, active="overview", poll=f"{base}/api/overview")


def sessions_page(rows: Sequence[dict[str, Any]], *, base: str, more: bool = False) -> str:
    trs = []
    for r in rows:
        trs.append(
            f'<tr data-text="{e((r["id"] + " " + r["client"] + " " + r["model"]).lower())}">'
            f'<td data-v="{e(r["id"])}"><a href="{base}/sessions/{q(r["id"])}">{e(r["id"])}</a></td>'
            f'<td data-v="{e(r["client"])}">{e(r["client"] or "–")}</td><td data-v="{e(r["model"])}">{e(r["model"] or "–")}</td>'
            f'<td class=num data-v="{r["turns"]}">{_n(r["turns"])}</td><td class=num data-v="{r["messages"]}">{_n(r["messages"])}</td>'
            f'<td class=num data-v="{r["compactions"]}">{_n(r["compactions"])}</td>'
            f'<td class=num data-v="{r["tokens_in"]}">{tokens(r["tokens_in"])}</td><td class=num data-v="{r["tokens_out"]}">{tokens(r["tokens_out"])}</td>'
            f'<td class=num data-v="{r["saved_tokens"]}">{tokens(r["saved_tokens"])}</td><td class=num data-v="{r["saved"] or 0}">{_usd(r["saved"])}</td>'
            f'<td data-v="{r["last_active"]}">{_when(r["last_active"])}</td></tr>'
        )
    heads = [("session", ""), ("client", ""), ("model", ""), ("turns", "num"), ("messages", "num"), ("compactions", "num"),
             ("received", "num"), ("sent", "num"), ("saved", "num"), ("saved $", "num"), ("last active (UTC)", "")]
    body = (
        f'<h1>Sessions <span class="muted">{len(rows):,}{"+" if more else ""}</span></h1>'
        '<p><input id="filter" type="search" placeholder="Filter by session, client or model" autocomplete="off"></p>'
        + (_table(heads, trs, cls="sortable") if rows else '<p class="empty">No sessions in the store yet.</p>')
        + (f'<p class="muted">The {len(rows):,} most recently active sessions. <a href="{base}/sessions?all=1">Show every session</a></p>' if more else "")
    )
    return layout("Sessions", body, base=base, active="sessions", poll=f"{base}/api/sessions")


def session_page(d: dict[str, Any], *, base: str, query: str = "", hits: dict[str, Any] | None = None) -> str:
    sid = d["id"]
    comps = [
        f'<tr><td><a href="{base}/sessions/{q(sid)}/compactions/{q(c["id"])}">{e(c["id"][:16])}</a></td><td>{e(c["engine"])}</td>'
        f'<td class=num>{_n(c["tokens_before"])}</td><td class=num>{_n(c["tokens_after"])}</td>'
        f'<td class=num>{_pct(1 - c["tokens_after"] / c["tokens_before"] if c["tokens_before"] else None)}</td>'
        f'<td class=num>{_n(c["removed"])}</td><td>{_when(c["at"])}</td></tr>'
        for c in d["compactions"]
    ]
    comp_table = _table([("compaction", ""), ("engine", ""), ("tokens before", "num"), ("after", "num"), ("reduction", "num"),
                         ("messages removed", "num"), ("at (UTC)", "")], comps) if comps else '<p class="empty">No compaction yet.</p>'
    search = (
        f'<form class="search" method="get" action="{base}/sessions/{q(sid)}"><input name="q" type="search" value="{e(query)}" '
        'placeholder="Search this session (ctx_grep)"><button>Search</button></form>'
    )
    if hits is not None:
        search += _hits(hits, sid, base)
    body = (
        f'<h1>Session <code>{e(sid)}</code></h1><p class="muted">{_n(d["messages"])} messages in the current history, '
        f'{_n(d["stored"])} stored; models: {e(", ".join(d["models"]) or "–")}; created {_when(d["created_at"])}, updated {_when(d["updated_at"])} UTC</p>'
        + _cards(d["totals"])
        + "<section><h2>Each request</h2>" + requests_chart(d["requests"]) + "</section>"
        + "<section><h2>Compactions</h2>" + comp_table + "</section>"
        + "<section><h2>Search</h2>" + search + "</section>"
        + f'<p class="source">Prices: {e(d["price_source"])}.</p>'
    )
    return layout(f"Session {sid}", body, base=base, poll=f"{base}/api/sessions/{q(sid)}" if not query else "")


def _hits(hits: dict[str, Any], sid: str, base: str) -> str:
    results = hits.get("results") or []
    if not results:
        return f'<p class="empty" id="hits">No match for <code>{e(hits.get("query", ""))}</code>.</p>'
    items = []
    for r in results:
        ref = str(r.get("id") or "")
        link = f' <a href="{base}/sessions/{q(sid)}/expand/{q(ref)}">{e(ref[:16])}</a>' if ref else ""
        tag = r.get("role") or r.get("type") or r.get("kind") or ""
        items.append(f'<li><span class="tag">{e(tag)}</span>{link}<pre>{e(r.get("snippet") or "")}</pre></li>')
    more = f'<p class="muted">{_n(hits["more"])} more results.</p>' if hits.get("more") else ""
    return f'<ol class="hits" id="hits">{"".join(items)}</ol>{more}'


def audit_page(a: dict[str, Any], *, base: str) -> str:
    sid = a["session_id"]
    removed = [
        f'<tr><td class=num>{r["position"]}</td><td>{e(r["role"])}</td><td class=num>{_n(r["tokens"])}</td>'
        f'<td class=num title="{e("; ".join(r["facts_missing"]) or "every fact is in the compacted context")}">{r["facts_kept"]}/{r["facts"]}</td>'
        f'<td class="preview">{e(r["preview"])}</td><td><a class="original" href="{base}/sessions/{q(sid)}/expand/{q(r["id"])}">original</a></td></tr>'
        for r in a["removed"]
    ]
    stands = []
    for s in a["stand_ins"]:
        link = f' · <a href="{base}/sessions/{q(sid)}/expand/{q(s["ref"])}">originals ({e(s["ref"])})</a>' if s.get("ref") else ""
        stands.append(
            f'<div class="standin"><div><span class="tag">{e(s["kind"])}</span> at position {s["position"]}, {e(s["role"])}, '
            f'{_n(s["tokens"])} tokens{link}</div><pre>{e(s["text"])}</pre></div>'
        )
    saved = a["tokens_before"] - a["tokens_after"]
    body = (
        f'<p><a href="{base}/sessions/{q(sid)}">← session {e(sid)}</a></p>'
        f'<h1>Compaction <code>{e(a["id"][:16])}</code></h1>'
        f'<p class="muted">{e(a["engine"])} at {_when(a["at"])} UTC: {_n(a["messages_before"])} → {_n(a["messages_after"])} messages, '
        f'{_n(a["tokens_before"])} → {_n(a["tokens_after"])} tokens ({_n(saved)} saved). '
        f'Facts kept: a removed message\'s paths, URLs, tool names, errors and user text found verbatim in the compacted context.</p>'
        + (f'<p class="muted">Notes: {e("; ".join(a["notes"]))}</p>' if a["notes"] else "")
        + f'<section><h2>Removed or changed <span class="muted" id="removed-count">{len(a["removed"])}</span></h2>'
        + _table([("#", "num"), ("role", ""), ("tokens", "num"), ("facts kept", "num"), ("text", ""), ("", "")], removed, cls="audit")
        + f'</section><section><h2>In their place <span class="muted">{len(a["stand_ins"])}</span></h2>'
        + ("".join(stands) or '<p class="empty">Nothing: the messages were dropped.</p>') + "</section>"
    )
    return layout(f"Compaction {a['id'][:16]}", body, base=base)


def expand_page(sid: str, ref: str, x: dict[str, Any], *, base: str) -> str:
    msgs = "".join(
        f'<div class="standin"><div><span class="tag">{e(m["message"].get("role"))}</span> <code>{e(m["id"])}</code></div>'
        f'<pre>{e(json.dumps(m["message"], ensure_ascii=False, indent=2))}</pre></div>'
        for m in x.get("messages") or []
    )
    note = f'<p class="muted">{e(x["note"])}</p>' if x.get("note") else ""
    body = (
        f'<p><a href="{base}/sessions/{q(sid)}">← session {e(sid)}</a></p><h1>Originals of <code>{e(ref[:24])}</code></h1>'
        f'<p class="muted">What ctx_expand returns: {_n(x.get("total", 0))} message(s).</p>{note}{msgs}'
    )
    return layout("Originals", body, base=base)


def error_page(status: int, title: str, detail: str, *, base: str) -> str:
    body = f'<div class="error"><h1>{status} · {e(title)}</h1><p>{e(detail)}</p><p><a href="{base}/">Overview</a></p></div>'
    return layout(title, body, base=base)
