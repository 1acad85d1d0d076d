"""Answers sized for the window: ``ctx_grep``'s page of ranked results within
:data:`~ctxengine.recall.spec.GREP_MAX_CHARS`, lists shortened to a token bound, and any
answer cut with a note saying how to get the rest."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ctxengine.facts import MAX_ERROR_LINE
from ctxengine.recall.rank import Result
from ctxengine.recall.spec import GREP_MAX_CHARS, GROUP_MAX, LINE_CHARS, NARROW_CHARS

__all__ = ["ENVELOPE_TOKENS", "answer_page", "dump", "fit_answer", "fit_list", "pick"]

ENVELOPE_TOKENS = 90
"""Tokens of an answer besides its messages or results (keys, ids, a note)."""


def fit_list(data: dict[str, Any], key: str, max_tokens: int | None, count: Callable[[str], int], tool: str) -> dict[str, Any]:
    """``data`` with its ``key`` list shortened from the end until the answer fits
    ``max_tokens`` (unchanged without a bound), and a note saying what was left out."""
    items = data.get(key)
    if max_tokens is None or not isinstance(items, list) or count(dump(data)) <= max_tokens:
        return data
    budget = max(0, int(max_tokens) - ENVELOPE_TOKENS - count(dump({**data, key: []})))
    kept: list[Any] = []
    used = 0
    for item in items:
        t = count(dump(item)) + 1
        if used + t > budget:
            break
        kept.append(item)
        used += t
    left = len(items) - len(kept)
    how = "narrow the query or ask with a smaller limit" if tool.endswith("grep") else "describe the children one by one"
    return {**data, key: kept, "omitted": left, "note": f"{left} of {len(items)} {key} not shown to fit the room left in the context window; {how}"}


def fit_answer(answer: str, max_tokens: int, count: Callable[[str], int], *, tool: str = "the tool") -> str:
    """``answer`` when it is at most ``max_tokens`` (by ``count``), else a JSON object holding
    its head (``text``), ``truncated``, and a ``note`` saying what was cut and how to get the
    rest (for an answer no tool could shorten itself)."""
    size = count(answer)
    if size <= max_tokens:
        return answer
    room = max(0, max_tokens - ENVELOPE_TOKENS)
    keep = len(answer) * room // max(size, 1)
    for _ in range(6):
        out = json.dumps(
            {
                "truncated": True,
                "text": answer[:keep],
                "note": (
                    f"{tool}'s answer ({size:,} tokens) was cut to its first {keep:,} of {len(answer):,} characters to fit "
                    "the room left in the context window; ask for less (a narrower query, an offset) for the rest"
                ),
            },
            ensure_ascii=False,
        )
        if count(out) <= max_tokens or keep == 0:
            return out
        keep = keep * 3 // 4
    return out


def pick(args: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {k: args[k] for k in names if k in args and args[k] is not None}


def dump(data: Mapping[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, default=str)


# -- ranking ---------------------------------------------------------------------------------------

def _cut(text: str, at: int, lo: int, hi: int) -> int:
    """A cut near ``at`` (within ``lo..hi``) at whitespace, so no token is split."""
    if at >= len(text):
        return len(text)
    j = text.find(" ", at, hi)
    if j >= 0:
        return j
    k = text.rfind(" ", lo, at)
    return k if k > lo else at


def _show(text: str, query: str) -> str:
    """``text`` whole when short; else its start (an error line's first MAX_ERROR_LINE
    characters at least) and the window around the match, cut at whitespace."""
    if len(text) <= LINE_CHARS:
        return text
    head_end = _cut(text, MAX_ERROR_LINE, MAX_ERROR_LINE // 2, MAX_ERROR_LINE + 120)
    at = text.lower().find(query.lower())
    if at >= 0 and at + len(query) <= head_end:
        return text[:head_end] + " …"
    if at < 0:
        return text[:head_end] + " …"
    a = text.rfind(" ", max(head_end, at - 100), at)
    a = at if a < 0 else a + 1
    b = _cut(text, at + len(query) + 80, at + len(query), at + len(query) + 200)
    tail = " …" if b < len(text) else ""
    return f"{text[:head_end]} … {text[a:b]}{tail}"


def _narrowing(hidden: Sequence[str], items: Sequence[str]) -> str:
    """How to name one of the ``hidden`` paths of a listing: the tail every listed path shares,
    the directories that tell them apart (each once, in order, up to :data:`NARROW_CHARS`) and
    a query that singles the first of them out, e.g. ``ttyS8/power/uevent``."""
    split = [[x for x in p.split("/") if x] for p in items]
    tail = 0
    while all(len(s) > tail + 1 for s in split) and len({s[-1 - tail] for s in split}) == 1:
        tail += 1
    if tail == 0:
        return ""
    common = "/".join(split[0][-tail:])
    kinds = list(dict.fromkeys(s[-1 - tail] for s in ([x for x in p.split("/") if x] for p in hidden) if len(s) > tail))
    if not kinds:
        return ""
    names, used = [], 0
    for k in kinds:
        if used + len(k) + 2 > NARROW_CHARS:
            break
        names.append(k)
        used += len(k) + 2
    rest = f" and {len(kinds) - len(names)} more" if len(kinds) > len(names) else ""
    return f"{len(hidden)} more end with /{common} under: {', '.join(names)}{rest}; name one, e.g. ctx_grep \"{kinds[0]}/{common}\""


def _render(r: Result, query: str, scope: str, room: int) -> dict[str, Any]:
    d: dict[str, Any] = {"kind": r.kind, "type": r.type}
    if r.items:
        shown: list[str] = []
        used = 0
        for item in r.items[:GROUP_MAX]:
            if shown and used + min(len(item), LINE_CHARS + 200) + 4 > room:
                break
            shown.append(item)
            used += min(len(item), LINE_CHARS + 200) + 4
        d["snippet"] = "\n".join(shown)
        if r.type == "errors":
            d["snippet"] = "\n".join(_show(x, query) for x in shown)
        if len(r.items) > len(shown):
            d["more_items"] = len(r.items) - len(shown)
            if r.type == "paths":
                narrow = _narrowing(r.items[len(shown) :], r.items)
                if narrow:
                    d["narrow"] = narrow
    else:
        d["role"] = r.role
        d["snippet"] = _show(r.text, query)
    d["id"] = r.ids[0] if r.ids else ""
    if r.n > 1:
        d["n"] = r.n
        if len(r.ids) > 1:
            d["ids"] = r.ids
    if scope == "all":
        d["session_ids"] = r.sessions[:5]
    return d


def answer_page(query: str, scope: str, ranked: Sequence[Result], skip: int, limit: int) -> dict[str, Any]:
    page = ranked[skip:]
    results: list[dict[str, Any]] = []
    head = len(dump({"query": query, "scope": scope, "count": 0, "results": [], "more": 0, "next_offset": 0,
                      "hint": "NNN more: ctx_grep with offset=NNN, or a longer query"}))
    used = head
    for r in page[:limit]:
        # the leading listing (what the query names best) may take three quarters of the answer
        share = 4 if not results else 2
        room = max(600, (GREP_MAX_CHARS - used) * (share - 1) // share) if r.items else 0
        d = _render(r, query, scope, room)
        size = len(dump(d)) + 2
        while r.items and used + size > GREP_MAX_CHARS and room > 300:
            room //= 2  # JSON escaping made the listing larger than its room: list fewer
            d = _render(r, query, scope, room)
            size = len(dump(d)) + 2
        if results and used + size > GREP_MAX_CHARS:
            break
        if not results and used + size > GREP_MAX_CHARS:
            d["snippet"] = d["snippet"][: max(200, GREP_MAX_CHARS - used - 400)] + " …"
            size = len(dump(d)) + 2
        results.append(d)
        used += size
    more = len(page) - len(results)
    out: dict[str, Any] = {"query": query, "scope": scope, "count": len(results), "results": results}
    if more > 0:
        out["more"] = more
        out["next_offset"] = skip + len(results)
        out["hint"] = f"{more} more: ctx_grep with offset={skip + len(results)}, or a longer query"
    return out

