"""Recall as an agent uses it: one realistic ``ctx_grep`` per removed fact.

``retention`` asks recall for a fact's own text, which an agent never knows. This probe asks
what an agent would plausibly type instead, one query per fact, chosen deterministically by the
fact's kind (:func:`realistic_query`):

* **paths** — the file name, i.e. the last segment (``src/app/Foo.java`` → ``Foo.java``); for a
  directory (no extension), from its last segment that is not a standard layout name (``src``,
  ``main``, ``test``, ``java``, ``lib`` …, :data:`LAYOUT_NAMES`) to its end, as an agent names the
  module it means (``/r/dubbo-api/src/main/java`` → ``dubbo-api/src/main/java``);
* **urls** — the URL's last non-empty path segment without query or fragment
  (``https://h/a/b/issue-12?x=1`` → ``issue-12``), or the host when the path is empty;
* **errors** — for a line of source code shown by an editor or a search (it starts with a line
  number: ``42:`` or ``Line 42:``), the first four words of its code (``} catch
  (NumberFormatException nfe)`` → ``} catch (NumberFormatException nfe)``), as an agent looks
  for code it saw; else the exception class the line names (its simple name:
  ``java.io.IOException`` → ``IOException``); else the line's first three words after any
  leading ``[TAG]`` / ``TAG:`` prefixes, from the first word that holds no path or location
  (``/``, ``:[``) and stopping before the next one (a query is always a substring of the line);
* **calls** (``name: command line``) — the command line's first two words (``open src/Foo.java``;
  a one-word command is searched as is); the bare tool name for a call without arguments;
* **users** — the message's first five words; **tools** — the tool name.

A removed fact is a fact of what the agent saw that is not verbatim in the last request. It is
*recalled* when it appears verbatim in the text of one of the first :data:`TOP` results of that
one ``ctx_grep`` call (a call fact: its command line, as written or JSON-escaped).

These bare queries are what an agent types with nothing else in mind. An agent after one
particular fact knows more, and the probe's queries (:func:`agent_queries`) say it:

* a file name that more than :data:`TOP` removed paths end with is lengthened to the shortest
  tail that singles the file out (``runtime_status`` for each of the hundreds of paths of a
  ``/sys`` listing → ``ttyS5/power/runtime_status``): an agent after that file knows which
  device it wants;
* a method declaration that throws (``int getTextLength() throws JacksonException;``) is not
  an error line: an agent looks for the method, ``getTextLength(``;
* a user's message is searched by the first words of its first line that no other removed
  message of the user shares (a task template's preamble is not what the agent remembers).

The share with the bare queries is reported too (``plain``), as is the share among the facts
whose query is *distinctive* (shared by at most :data:`TOP` removed facts of the kind).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ctxengine.facts import CALL_KIND, FACT_KINDS

__all__ = ["PROBE_KINDS", "TOP", "agent_queries", "probe_recall", "realistic_query"]

TOP = 5
MISSES_KEPT = 10
"""Missed facts (with their query) a run reports per kind."""
"""A fact counts as recalled when it is in one of this many first results."""

PROBE_KINDS = (*FACT_KINDS, CALL_KIND)

_CLASS_RE = re.compile(r"\b(?:[a-z_][\w$]*\.)*([A-Z][\w$]*(?:Error|Exception|Failure|Fault))\b")
_NUMBERED = re.compile(r"^(?:Line )?\d+:")
_DECL_RE = re.compile(r"\b([A-Za-z_$][\w$]*)\s*\([^()]*\)\s*throws\s")
_TAG_RE = re.compile(r"^(?:\[[^\]]{1,20}\]\s*|[A-Z][A-Za-z]{1,15}:\s+)+")


LAYOUT_NAMES = frozenset(
    ["src", "main", "test", "tests", "java", "kotlin", "scala", "resources", "lib", "libs", "bin", "build", "target", "out", "dist", "pkg", "internal", "cmd", "app", "apps", "module", "modules", "packages", "site-packages", "node_modules", "include", "share", "usr", "local", "opt", "etc", "var", "tmp", "home", "docs", "doc", "python3", "python"]
)


def _run_of_words(text: str, n: int) -> str:
    """The first ``n`` words of ``text`` from its first word without a path or location,
    stopping before the next such word: a substring of ``text``."""
    words = list(re.finditer(r"\S+", text))
    plain = [("/" not in w.group(0) and ":[" not in w.group(0)) for w in words]
    for i, ok in enumerate(plain):
        if ok:
            j = i
            while j + 1 < len(words) and j + 1 - i < n and plain[j + 1]:
                j += 1
            return text[words[i].start() : words[j].end()]
    return ""


def _words(text: str, n: int) -> str:
    return " ".join(text.split()[:n])


def realistic_query(kind: str, fact: str) -> str | None:
    """What an agent would type to find ``fact`` of ``kind`` with nothing else in mind: the
    file name, the exception class, the first words (see the module docstring)."""
    fact = fact.strip()
    if not fact:
        return None
    if kind == "paths":
        segs = [x for x in fact.split("/") if x]
        if not segs:
            return fact
        if "." in segs[-1].lstrip("."):
            return segs[-1]
        i = len(segs) - 1
        while i > 0 and segs[i].lower() in LAYOUT_NAMES:
            i -= 1
        return "/".join(segs[i:])
    if kind == "urls":
        rest = fact.split("://", 1)[-1]
        rest = re.split(r"[?#]", rest, maxsplit=1)[0]
        host, _, path = rest.partition("/")
        segs = [s for s in path.split("/") if s]
        return segs[-1] if segs else (host or fact)
    if kind == "errors":
        return _error_query(fact)
    if kind == CALL_KIND:
        name, sep, line = fact.partition(": ")
        return _words(line, 2) if sep and line.strip() else name
    if kind == "users":
        return _words(fact, 5)
    if kind == "tools":
        return fact
    return None


def _error_query(fact: str) -> str:
    numbered = _NUMBERED.match(fact)
    if numbered:
        code = fact[numbered.end() :].strip()
        m4 = re.match(r"\S+(?:\s+\S+){0,3}", code)
        if m4:
            return m4.group(0)
    m = _CLASS_RE.search(fact)
    if m:
        return m.group(1)
    return _run_of_words(_TAG_RE.sub("", fact), 3) or _words(fact, 3)


def _path_tail(fact: str, query: str, tails: Counter[str]) -> str:
    """The shortest tail of ``fact`` (whole segments, at least ``query``) that ends at most
    :data:`TOP` of the removed paths (``tails`` counts every tail of each of them)."""
    segs = [x for x in fact.strip().split("/") if x]
    n = len([x for x in query.split("/") if x])
    for i in range(len(segs) - n, -1, -1):
        tail = "/".join(segs[i:])
        if tails[tail] <= TOP:
            return tail
    return query


def _user_query(fact: str, shared: Counter[str]) -> str:
    """The first five words of the message's first line that no other removed message of the
    user shares (a task template's preamble is not what the agent remembers), else of its
    first line."""
    lines = [ln.strip() for ln in fact.strip().splitlines() if ln.strip()]
    for ln in lines:
        if shared[ln] <= 1:
            m = re.match(r"\S+(?:\s+\S+){0,4}", ln)
            if m:
                return m.group(0)
    return _words(fact, 5)


def agent_queries(kind: str, facts: Sequence[str]) -> dict[str, str | None]:
    """One query per distinct fact of ``kind``: what an agent after that very fact would type.

    It starts from :func:`realistic_query` and names what the agent knows beside it when the
    bare query stands for more than :data:`TOP` of the removed facts: the shortest path tail
    that singles a file out (``ttyS5/power/uevent``, not ``uevent``), the first line of a
    user's message that is not a shared preamble. A method declaration that throws is searched
    by the method's name (``getTextLength(``), never by the exception it declares."""
    unique = list(dict.fromkeys(facts))
    base = {f: realistic_query(kind, f) for f in unique}
    if kind == "paths":
        tails: Counter[str] = Counter()
        for f in unique:
            segs = [x for x in f.strip().split("/") if x]
            tails.update({"/".join(segs[i:]) for i in range(len(segs))})
        share = Counter(q for q in base.values() if q is not None)
        return {f: (_path_tail(f, q, tails) if q is not None and share[q] > TOP else q) for f, q in base.items()}
    if kind == "users":
        shared: Counter[str] = Counter()
        for f in unique:
            shared.update({ln.strip() for ln in f.splitlines() if ln.strip()})
        return {f: _user_query(f, shared) if f.strip() else None for f in unique}
    if kind == "errors":
        return {f: _declared(f) or q for f, q in base.items()}
    return base


def _declared(fact: str) -> str | None:
    """``name(`` for a method declaration that throws (``int getTextLength() throws X;``)."""
    if _NUMBERED.match(fact.strip()):
        return None
    m = _DECL_RE.search(fact)
    return m.group(1) + "(" if m else None


def _forms(kind: str, fact: str) -> list[str]:
    if kind != CALL_KIND:
        return [fact]
    _name, sep, line = fact.partition(": ")
    if not sep or not line:
        return [fact]
    return list(dict.fromkeys([fact, line, json.dumps(line, ensure_ascii=False)[1:-1], json.dumps(line)[1:-1]]))


def _result_texts(answer: str) -> list[str]:
    try:
        data = json.loads(answer)
    except ValueError:
        return []
    results = data.get("results") if isinstance(data, Mapping) else None
    if not isinstance(results, list):
        return []
    out = []
    for r in results[:TOP]:
        if isinstance(r, Mapping):
            out.append("\n".join(str(r[k]) for k in ("text", "snippet", "lines") if k in r))
    return out


def _recalled(grep: Callable[[str], str], kind: str, fact: str, q: str, stats: dict[str, list[float]] | None) -> bool:
    t0 = time.perf_counter()
    answer = grep(q)
    if stats is not None:
        stats.setdefault("ms", []).append((time.perf_counter() - t0) * 1000.0)
        stats.setdefault("chars", []).append(float(len(answer)))
    texts = _result_texts(answer)
    forms = _forms(kind, fact)
    return any(f in t for t in texts for f in forms)


def probe_recall(
    grep: Callable[[str], str],
    removed: Mapping[str, Sequence[str]],
    stats: dict[str, list[float]] | None = None,
    distinct: dict[str, list[int]] | None = None,
    plain: dict[str, list[int]] | None = None,
) -> tuple[dict[str, int], dict[str, int], dict[str, list[dict[str, Any]]]]:
    """Ask ``grep`` (one ``ctx_grep`` call: query → JSON answer) once per removed fact, with
    the query of :func:`agent_queries`.

    Returns ``(total, recalled, misses)`` by kind; ``misses`` holds up to ten
    ``{"fact", "query"}`` per kind. ``stats``, when given, receives each call's time
    (``"ms"``) and answer size in characters (``"chars"``); ``distinct``, when given,
    ``[total, recalled]`` by kind over the facts whose query is distinctive (see the module
    docstring); ``plain``, when given, ``[total, recalled]`` by kind with the bare
    :func:`realistic_query` (the file name alone …), asked as well where it differs."""
    total: dict[str, int] = {}
    found: dict[str, int] = {}
    misses: dict[str, list[dict[str, Any]]] = {}
    for kind, facts in removed.items():
        queries = agent_queries(kind, facts)
        share = Counter(q for q in queries.values() if q is not None)
        for fact in facts:
            q = queries[fact]
            if q is None:
                continue
            total[kind] = total.get(kind, 0) + 1
            counted = distinct.setdefault(kind, [0, 0]) if distinct is not None and share[q] <= TOP else None
            if counted is not None:
                counted[0] += 1
            hit = _recalled(grep, kind, fact, q, stats)
            if hit:
                found[kind] = found.get(kind, 0) + 1
                if counted is not None:
                    counted[1] += 1
            elif len(misses.setdefault(kind, [])) < MISSES_KEPT:
                misses[kind].append({"fact": fact[:300], "query": q})
            if plain is not None:
                bare = realistic_query(kind, fact)
                tally = plain.setdefault(kind, [0, 0])
                tally[0] += 1
                tally[1] += int(hit if bare == q else bare is not None and _recalled(grep, kind, fact, bare, None))
    return total, found, misses
