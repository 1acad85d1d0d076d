"""Fact blocks: the verbatim list of paths, URLs and error lines a record keeps.

One format for every engine, cheap in tokens (paths and URLs hold no spaces, so a line lists
many of them) and parsed back exactly::

    [facts]
    urls: https://a.example/x https://b.example/y
    paths: src/app/main.py /etc/hosts.conf
    errors:
    ERROR: cannot find symbol Foo
    java.lang.NullPointerException at Bar.java:12

:func:`fit_facts` chooses what fits a token budget: errors first (most telling), then URLs,
then paths; what is left out is reported so the caller can say it is retrievable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from ctxengine.facts import Facts
from ctxengine.tokens import estimate

__all__ = [
    "FACTS_HEADER",
    "FIT_ORDER",
    "fit_facts",
    "parse_facts_block",
    "render_facts",
    "search_names",
    "split_facts_block",
    "unseen",
]

FACTS_HEADER = "[facts]"
"""Line that opens a facts block."""

FIT_ORDER = ("errors", "urls", "paths")
"""Which facts a budget keeps first."""

_LABELS = {"urls": "urls: ", "paths": "paths: ", "errors": "errors:"}


def render_facts(facts: Facts) -> list[str]:
    """The lines of a facts block (empty when there is no path, URL or error line)."""
    if not (facts.paths or facts.urls or facts.errors):
        return []
    lines = [FACTS_HEADER]
    if facts.urls:
        lines.append("urls: " + " ".join(facts.urls))
    if facts.paths:
        lines.append("paths: " + " ".join(facts.paths))
    if facts.errors:
        lines += ["errors:", *facts.errors]
    return lines


def parse_facts_block(block: str) -> Facts:
    """The facts listed by ``block`` (the lines after :data:`FACTS_HEADER`)."""
    facts = Facts()
    in_errors = False
    for line in block.split("\n"):
        if in_errors:
            if line:
                facts.errors.append(line)
        elif line.startswith("urls: "):
            facts.urls += [u for u in line[6:].split(" ") if u]
        elif line.startswith("paths: "):
            facts.paths += [p for p in line[7:].split(" ") if p]
        elif line == "errors:":
            in_errors = True
    return facts


def split_facts_block(text: str) -> tuple[str, Facts]:
    """A record's text before its facts block, and the facts the block lists."""
    before, sep, block = text.rpartition("\n" + FACTS_HEADER + "\n")
    if not sep:
        if text.startswith(FACTS_HEADER + "\n"):
            return "", parse_facts_block(text[len(FACTS_HEADER) + 1 :])
        return text, Facts()
    return before, parse_facts_block(block)


def unseen(facts: Facts, *texts: str, known: Iterable[str] | None = None) -> Facts:
    """Paths, URLs and error lines of ``facts`` that occur in none of ``texts`` and are not in
    ``known`` (users and tools are not block facts and are left out)."""
    known_set = known if isinstance(known, set | frozenset) else set(known or ())

    def gone(f: str) -> bool:
        return f not in known_set and not any(f in t for t in texts)

    return Facts([], [p for p in facts.paths if gone(p)], [u for u in facts.urls if gone(u)], [], [e for e in facts.errors if gone(e)])


def fit_facts(
    facts: Facts,
    budget_tokens: int | None,
    *,
    count: Callable[[str], int] = estimate,
) -> tuple[Facts, int]:
    """The facts of ``facts`` whose block fits ``budget_tokens`` (``None``: all of them),
    chosen errors, then URLs, then paths; a fact too large is skipped and smaller ones after it
    may still fit. Returns the chosen facts and how many were left out.

    Linear in the number of facts: each fact is measured once (its text plus the separator),
    which never undercounts the rendered block by more than the few tokens reserved for the
    header and labels.
    """
    if budget_tokens is None:
        return Facts([], list(facts.paths), list(facts.urls), [], list(facts.errors)), 0
    chosen = Facts()
    dropped = 0
    used = count(FACTS_HEADER) + 2
    for kind in FIT_ORDER:
        items: list[str] = getattr(facts, kind)
        if not items:
            continue
        have: list[str] = getattr(chosen, kind)
        label = count(_LABELS[kind]) + 1
        for item in items:
            cost = count(item) + 1 + (0 if have else label)
            if used + cost > budget_tokens:
                dropped += 1
                continue
            used += cost
            have.append(item)
    return chosen, dropped


_CLASS = re.compile(r"\b([A-Z][\w$]*(?:Error|Exception|Failure))\b")
SEARCH_NAMES_CHARS = 90
"""Characters of the names a pointer lists at most (see :func:`search_names`)."""


def search_names(facts: Facts, *, max_chars: int = SEARCH_NAMES_CHARS) -> list[str]:
    """What an agent would search for to find ``facts`` again with ``ctx_grep``: error classes,
    file names (a path's last segment) and URL hosts, most frequent first (ties: first seen),
    each once, within ``max_chars``. Used by cut markers and digests to name what they left out."""
    counts: dict[str, int] = {}
    for e in facts.errors:
        m = _CLASS.search(e)
        if m:
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    for p in facts.paths:
        name = p.rstrip("/").rsplit("/", 1)[-1]
        if name:
            counts[name] = counts.get(name, 0) + 1
    for u in facts.urls:
        host = u.split("://", 1)[-1].split("/", 1)[0]
        if host:
            counts[host] = counts.get(host, 0) + 1
    ranked = sorted(counts, key=lambda k: -counts[k])  # stable: first seen wins a tie
    out: list[str] = []
    used = 0
    for name in ranked:
        if used + len(name) + 2 > max_chars:
            break
        out.append(name)
        used += len(name) + 2
    return out

