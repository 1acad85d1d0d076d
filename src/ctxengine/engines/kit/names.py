"""Names a folded output gave the agent, ranked by how likely it picks them up again.

A digest's facts block keeps paths, URLs and error lines; what an agent copies from an output
into its next calls is often something else: a payment id from a user record
(``credit_card_2198526``), a flight number, a date, an amount, the file it opens next from a
short ``search_dir`` listing, the method names of a file it viewed (``constructType``). This
module picks those *names* out of the outputs a digest folds and ranks them:

1. **used before**: the agent already wrote it in a call or a message of the span (what it used
   once, it tends to use again);
2. **named by the user** in a message the digest folds;
3. **in a short listing** (an output of a few short lines: every hit is a candidate the agent
   picks from) or **defined by a file view** (``class Foo``, ``def bar``, ``void baz(``);
4. **an id**: letters with digits (``HAT170``, ``sofia_kim_7287``), a date, an amount;
5. **recent**: the later outputs of the span first, then the more frequent.

A digest folded again (a finished task's digests folded into one) passes its names on: they
compete with the new ones, behind those the agent used.

:func:`ranked_names` returns them best first; the digest lists as many as its ``name_tokens``
budget allows (the originals stay one ``ctx_grep`` away). A name the rest of the conversation
still shows (a user message, the agent's own words, another digest) takes no room.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from ctxengine.messages import Message, content_text, is_summary, tool_calls

__all__ = ["NAMES_PREFIX", "SHORT_LISTING_LINES", "fit_names", "ranked_names"]

SHORT_LISTING_LINES = 24
"""An output of at most this many non-empty lines, each short, is a listing whose every entry
the agent may pick next."""

SCAN_CHARS = 4_000
"""Characters of one output scanned for names (its head and tail)."""

MEMO_TEXTS = 512
"""Texts whose tokens and names are remembered (a bounded memo, for the whole process)."""

MEMO_CHARS = 32_000
"""The longest text whose tokens are remembered (with :data:`MEMO_TEXTS`, at most ~16M characters
kept alive; an output's names are taken from its first and last :data:`SCAN_CHARS`)."""

_LISTING_LINE_CHARS = 120
_MAX_NAME = 80
_MIN_NAME = 4

_TOKEN = re.compile(r"[\w$][\w$./\-]*[\w$]|\$?\d[\d,]*\.\d\d")
"""A candidate: a run of word characters, dots, slashes and dashes (one simple pattern: scanning
an output with one alternative per kind of name cost four times as much), or an amount."""
_DEFINED = re.compile(
    r"\b(?:class|interface|enum|record|struct|trait|def|fn|func|function|module|type)\s+([A-Za-z_$][\w$]*)"
    r"|\b([A-Za-z_$][\w$]*)\s*\([^()\n]{0,120}\)\s*(?:throws\s+[\w.,\s]+)?\{"
)
_ID = re.compile(r"\d")
_TRAIL = ".,;:!?)]}'\"`"
_KEYWORDS = frozenset(("this.", "self.", "return", "public", "private", "static", "import", "package", "while", "switch"))


def _clip(text: str) -> str:
    """The part of an output names are taken from: its first and last SCAN_CHARS // 2
    characters (a giant output's middle is one ctx_grep away like the rest)."""
    half = SCAN_CHARS // 2
    return text if len(text) <= SCAN_CHARS else text[:half] + "\n" + text[-half:]


@lru_cache(maxsize=MEMO_TEXTS)
def _names(text: str) -> tuple[str, ...]:
    """The name-like tokens of ``text``, each once, in order of first appearance: paths, dotted,
    ``snake_case`` and ``camelCase`` names, tokens mixing letters and digits (ids), dates,
    amounts, long numbers; not plain words."""
    out: list[str] = []
    for tok in dict.fromkeys(_TOKEN.findall(text)):  # a file view repeats most of its tokens
        tok = tok.rstrip(_TRAIL)
        if not _MIN_NAME <= len(tok) <= _MAX_NAME or tok in _KEYWORDS:
            continue
        if tok.isdigit():
            if len(tok) >= 5:
                out.append(tok)
        elif "/" in tok or "_" in tok or "." in tok or "$" in tok or "-" in tok:
            if "//" not in tok:
                out.append(tok)
        elif not (tok.isalpha() and (tok.islower() or tok.isupper() or tok[1:].islower())):
            out.append(tok)  # camelCase, PascalCase with an inner capital, letters with digits
    return tuple(dict.fromkeys(out))


def _listing(text: str) -> list[str] | None:
    """The entries of a short listing (the names of its lines, and each line that is one word:
    ``ls`` output), or None when ``text`` is not one."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines or len(lines) > SHORT_LISTING_LINES or any(len(ln) > _LISTING_LINE_CHARS for ln in lines):
        return None
    out: list[str] = []
    for ln in lines:
        words = ln.split()
        if len(words) == 1 and 2 <= len(words[0].strip(_TRAIL)) <= _MAX_NAME:
            out.append(words[0].strip(_TRAIL))
        out.extend(_names(ln))
    return out


def _defined(text: str) -> list[str]:
    """What a file view defines: ``class Foo``, ``def bar``, ``void baz(…) {`` (only the lines
    that open a block or name a definition are scanned)."""
    lines = [ln for ln in text.splitlines() if ln.rstrip().endswith(("{", ":")) or "class " in ln or "def " in ln]
    if not lines:
        return []
    return [n for m in _DEFINED.finditer("\n".join(lines)) for n in m.groups() if n and len(n) >= _MIN_NAME and n not in _KEYWORDS]


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _written(span: Sequence[Message]) -> list[str]:
    """What the agent wrote in ``span``: its messages' text and its calls' arguments."""
    parts: list[str] = []
    for m in span:
        if m.get("role") != "assistant" or is_summary(m):
            continue
        parts.append(content_text(m.get("content")))
        for c in tool_calls(m):
            fn = c.get("function") or {}
            raw = fn.get("arguments") if isinstance(fn, Mapping) else None
            try:
                parts.extend(_strings(json.loads(raw)) if isinstance(raw, str) else _strings(raw))
            except ValueError:
                parts.append(str(raw))
    return parts


def _tokens(text: str) -> frozenset[str]:
    """The candidate tokens of ``text`` and its whitespace-separated words (what a name is
    looked up in: a set, not a substring search per name). Memoised for texts up to
    :data:`MEMO_CHARS` (the user messages and the agent's messages are read again by every
    digest of a session; the memo never keeps a pasted file alive)."""
    return _token_set(text) if len(text) > MEMO_CHARS else _memo_tokens(text)


@lru_cache(maxsize=MEMO_TEXTS)
def _memo_tokens(text: str) -> frozenset[str]:
    return _token_set(text)


def _token_set(text: str) -> frozenset[str]:
    return frozenset({t.rstrip(_TRAIL) for t in _TOKEN.findall(text)} | {w.strip(_TRAIL + "(['\"") for w in text.split()})


def _all_tokens(texts: Iterable[str]) -> set[str]:
    out: set[str] = set()
    for t in texts:
        if t:
            out |= _tokens(t)
    return out


def ranked_names(span: Sequence[Message], *, shown: str = "", context: Sequence[Message] = ()) -> list[str]:
    """The names of ``span``'s outputs (tool results) best first (see the module docstring),
    each once, leaving out those already in ``shown`` (the digest's other lines) or in
    the text around the span that stays in view (``context``'s system prompt, user and assistant
    messages and digests: a name there needs no room in the digest)."""
    written = _all_tokens(_written(span))
    users = _all_tokens(content_text(m.get("content")) for m in span if m.get("role") == "user" and not is_summary(m))
    # what stays in view around the span: the system prompt, user messages, the agent's own
    # messages and other digests (tool outputs are left out: they are folded in their turn)
    visible = _tokens(shown) | _all_tokens([*(content_text(m.get("content")) for m in context if m.get("role") != "tool"), *_written(context)])
    score: dict[str, tuple[int, int, int]] = {}  # name -> (class, recency, count)
    # the names earlier digests of the span listed: a digest folded again keeps them in the race
    for m in span:
        if is_summary(m):
            for line in content_text(m.get("content")).splitlines():
                if line.startswith(NAMES_PREFIX):
                    for name in line[len(NAMES_PREFIX) :].split(", "):
                        if name and name not in visible and name not in score:
                            score[name] = (1 if name in written else 3, 1, 1)
    outputs = [_clip(content_text(m.get("content"))) for m in span if m.get("role") == "tool" and not is_summary(m)]
    for age, text in enumerate(outputs):
        listing = _listing(text)
        defined = _defined(text)
        picked = {*(listing or ()), *defined}
        for name in dict.fromkeys([*(listing or ()), *defined, *_names(text)]):
            if name in visible:
                continue
            cls = 1 if name in written else 2 if name in users else 3 if name in picked else 4 if _ID.search(name) else 5
            prev = score.get(name)
            if prev is None:
                score[name] = (cls, -age, 1)
            else:
                score[name] = (min(prev[0], cls), min(prev[1], -age), prev[2] + 1)
    return sorted(score, key=lambda n: (score[n][0], score[n][1], -score[n][2]))


NAMES_PREFIX = "Names: "
"""How a digest's line of names begins."""


def fit_names(names: Sequence[str], budget_tokens: int, count: Callable[[str], int]) -> list[str]:
    """The best ``names`` whose ``, ``-joined line fits ``budget_tokens`` (``count`` measures a
    text); a name inside one already chosen adds nothing and is skipped."""
    chosen: list[str] = []
    used = count(NAMES_PREFIX)
    for n in names:
        if used >= budget_tokens:
            break
        cost = count(n) + 1
        if used + cost > budget_tokens or any(n in k for k in chosen):
            continue
        chosen.append(n)
        used += cost
    return chosen
