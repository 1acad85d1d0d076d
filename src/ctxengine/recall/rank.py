"""Matching lines ranked for an agent (:func:`rank_lines`), and the identifiers of a message's
text (:func:`identifiers`: paths, URLs, error lines, command lines) that the store indexes."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Generic, TypeVar

from ctxengine.facts import (
    _ERROR_RE,
    _ERROR_WORDS,
    _command_line,
    error_lines,
    paths_in,
    urls_in,
)
from ctxengine.messages import Message, content_text, tool_call_args, tool_call_name, tool_calls
from ctxengine.recall.spec import IDENTS_PER_MESSAGE, LINES_RANKED, LINES_SEEN

__all__ = ["Result", "Source", "identifiers", "message_parts", "rank_lines", "split_text"]

_T = TypeVar("_T")


class _TextMemo(Generic[_T]):
    """What a function returns for a text, kept for texts that recur search after search (the
    store hands out the same candidate texts, and their lines recur), up to ``max_chars``
    characters of texts (then it starts over): bounded by size, not by count, since one text
    may be a whole tool output."""

    def __init__(self, make: Callable[[str], _T], max_chars: int) -> None:
        self.make = make
        self.max_chars = max_chars
        self.data: dict[str, _T] = {}
        self.chars = 0

    def __call__(self, text: str) -> _T:
        hit = self.data.get(text)
        if hit is None:
            hit = self.make(text)
            if self.chars + len(text) > self.max_chars:
                self.data = {}
                self.chars = 0
            self.data[text] = hit
            self.chars += len(text)
        return hit


@dataclass(slots=True)
class Source:
    """One matching message (or summary node): its text, and its tool calls as lines
    ``(line, is_command)`` decoded from their JSON (see :func:`message_parts`)."""

    kind: str
    role: str
    ids: list[str]
    sessions: list[str]
    text: str
    calls: list[tuple[str, bool]]


@dataclass(slots=True)
class Result:
    type: str
    tier: int
    order: int
    text: str
    kind: str
    role: str
    ids: list[str] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    n: int = 0
    items: list[str] = field(default_factory=list)


def _main_arg(args: Any) -> str:
    if isinstance(args, str):
        return args
    if isinstance(args, Mapping):
        for k in ("command", "cmd", "input", "code", "query", "path", "file", "url"):
            v = args.get(k)
            if isinstance(v, str) and v.strip():
                return v
        return next((v for v in args.values() if isinstance(v, str) and v.strip()), "")
    return ""


def _call_lines(name: str, args: Any) -> list[tuple[str, bool]]:
    first = _command_line(args)
    out = [(f"{name}: {first}" if first else name, True)]
    body = _main_arg(args).strip().split("\n")
    out.extend((line, False) for line in body[1:])
    return out


def message_parts(m: Message) -> tuple[str, list[tuple[str, bool]]]:
    """A message as an agent reads it: its text, and each tool call as ``name: command line``
    (the call fact of :func:`ctxengine.facts.call_facts`) then the rest of its main argument,
    decoded from the JSON the call carries."""
    calls: list[tuple[str, bool]] = []
    for c in tool_calls(m):
        calls += _call_lines(tool_call_name(c), tool_call_args(c))
    return content_text(m.get("content")), calls


_STORED_CALL = re.compile(r"^([\w.:-]+)\((\{.*\})\)$", re.MULTILINE)
"""A tool call in a message's stored search text: ``name(arguments JSON)`` on its own line."""


def split_text(role: str, text: str) -> tuple[str, list[tuple[str, bool]]]:
    """The stored search text of a message split like :func:`message_parts`: an assistant's
    ``name({...})`` lines are its tool calls, decoded."""
    if role != "assistant" or "({" not in text:
        return text, []
    plain, calls = _split_calls(text)
    return plain, list(calls)


def _decode_calls(text: str) -> tuple[str, tuple[tuple[str, bool], ...]]:
    """:func:`split_text` of an assistant's text (a message recurs in search after search: its
    calls are decoded once)."""
    calls: list[tuple[str, bool]] = []
    keep: list[str] = []
    last = 0
    for m in _STORED_CALL.finditer(text):
        try:
            args = json.loads(m.group(2))
        except ValueError:
            continue
        keep.append(text[last : m.start()])
        last = m.end()
        calls += _call_lines(m.group(1), args)
    if not calls:
        return text, ()
    keep.append(text[last:])
    return "".join(keep).strip("\n"), tuple(calls)


_split_calls = _TextMemo(_decode_calls, 2_000_000)
"""An assistant's text split from its decoded calls, once per text."""


def identifiers(role: str, text: str) -> list[tuple[str, str]]:
    """The identifiers of a message's stored search text, ``(kind, identifier)``: its paths
    and URLs, its error lines (tool and assistant messages) and its tool calls' command lines
    (``name: command``); at most :data:`IDENTS_PER_MESSAGE`, unique."""
    out: dict[tuple[str, str], None] = {}
    plain, calls = split_text(role, text)
    for line, is_cmd in calls:
        if is_cmd:
            out[("command", line.strip())] = None
    out.update(dict.fromkeys(("path", p) for p in paths_in(text)))
    out.update(dict.fromkeys(("url", u) for u in urls_in(text)))
    if role in ("tool", "function", "assistant"):
        out.update(dict.fromkeys(("error", e) for e in error_lines(plain)))
    return list(out)[:IDENTS_PER_MESSAGE]


_lowered = _TextMemo(str.lower, 4_000_000)
"""``text.lower()``, once per text."""


def _matched_lines(src: Source, query: str, find: Callable[[str], tuple[int, int] | None], text_mode: bool) -> list[tuple[str, bool, bool]]:
    """The lines of ``src`` that ``find`` matches: ``(line, is_command, is_first_line)``."""
    out: list[tuple[str, bool, bool]] = []
    text = src.text
    low = query.lower()
    lowered = _lowered(text) if text_mode else ""
    if text_mode and len(lowered) == len(text):
        # one C-level scan of the whole text; lines are cut around each hit
        at = lowered.find(low)
        while at >= 0:
            start = text.rfind("\n", 0, at) + 1
            end = text.find("\n", at + len(low))
            end = len(text) if end < 0 else end
            out.append((text[start:end], False, start == 0))
            at = lowered.find(low, end)
    else:
        for i, line in enumerate(text.split("\n")):
            if find(line) is not None:
                out.append((line, False, i == 0))
    out.extend((line, cmd, False) for line, cmd in src.calls if find(line) is not None)
    return out


_WORD = re.compile(r"\w")
_CODE_LINE = re.compile(r"^(?:Line )?\d+:|\bthrows\b|^\s*(?:\*|//|#|import |catch\b|}\s*catch\b)|\bnew \w+(?:Error|Exception)\(")
"""A line of source code (a numbered editor line, a signature, a comment, an import): it names an
error class without reporting an error."""
_RAISED = re.compile(r"(?:Error|Exception|Failure)\b(?::|$)|^\s*(?:Caused by|Exception in thread|\[ERROR\]|error:|E\s)|Traceback")
"""A line that reports an error (the class then its message, a cause, a compiler error)."""


def _bounded(line: str, a: int, b: int) -> bool:
    """The match ``line[a:b]`` is a whole word (or starts/ends at a non-word edge)."""
    before = a == 0 or not (_WORD.match(line[a - 1]) and _WORD.match(line[a]))
    after = b >= len(line) or not (_WORD.match(line[b]) and _WORD.match(line[b - 1]))
    return before and after


def rank_lines(
    query: str,
    sources: Sequence[Source],
    find: Callable[[str], tuple[int, int] | None],
    *,
    text_mode: bool = False,
) -> list[Result]:
    """The matching lines of ``sources`` (newest first), ranked for an agent.

    1. one result each (``type`` ``paths``, ``urls``, ``errors``) listing, each once, the
       full paths, the URLs and the error lines that hold the query: those naming it exactly
       first (a path or URL ending with it at a segment start, an error line that reports it
       as a whole word), then those ending with it, then the rest; newest first within each
       rank; a source line that merely names an error class comes after the errors reported;
       the group that names the query best comes first;
    2. lines that name the query as an identifier: a command line (``name: command``) that
       starts with it, a user message that starts with it;
    3. other command and summary lines holding it; 4. every other matching line.
    Identical lines from several originals are one result with their count (``n``) and ids.
    """
    low = query.lower()
    seen = _collect(query, sources, find, text_mode)
    groups = _Groups()
    for (line, is_cmd), (r, first) in islice(seen.items(), LINES_RANKED):
        _classify(groups, line, is_cmd, r, first, low, find)
    out: list[Result] = []
    for group, label in ((groups.paths, "paths"), (groups.urls, "urls"), (groups.errors, "errors")):
        if group:
            items = sorted(group.values(), key=lambda x: (x.tier, x.order))
            head = items[0]
            out.append(
                Result(label, head.tier, head.order, "", head.kind, head.role, head.ids[:1],
                        list(dict.fromkeys(sid for x in items for sid in x.sessions)),
                        sum(x.n for x in items), [x.text for x in items])
            )
    # the group naming the query best first (paths before URLs before errors on a tie)
    out.sort(key=lambda x: x.tier)
    out.extend(sorted(groups.lines.values(), key=lambda x: (x.tier, x.order)))
    if len(seen) > LINES_RANKED:
        # older matching lines not ranked: listed last, unclassified, so ``more`` counts them
        out.extend(r for r, _ in islice(seen.values(), LINES_RANKED, None))
    return out


def _collect(query: str, sources: Sequence[Source], find: Callable[[str], tuple[int, int] | None], text_mode: bool) -> dict[tuple[str, bool], tuple[Result, bool]]:
    """Every matching line once, newest first (identical lines of many originals are common:
    listings, repeated views), with where it occurs: ``(line, is_command)`` → (its result, whether
    it is the first line of its message)."""
    seen: dict[tuple[str, bool], tuple[Result, bool]] = {}
    order = 0
    for src in sources:
        if len(seen) >= LINES_SEEN:
            break  # older messages would only add unranked lines
        for raw, is_cmd, first in _matched_lines(src, query, find, text_mode):
            line = raw.strip()
            if not line:
                continue
            key = (line, is_cmd)
            hit = seen.get(key)
            if hit is None:
                order += 1
                seen[key] = (Result("", 0, order, line, src.kind, src.role, list(src.ids[:3]), list(src.sessions), len(src.ids)), first)
            else:
                _merge(hit[0], src)
    return seen


@dataclass(slots=True)
class _Groups:
    """Ranked results being built: identifiers by kind, and lines."""

    paths: dict[str, Result] = field(default_factory=dict)
    urls: dict[str, Result] = field(default_factory=dict)
    errors: dict[str, Result] = field(default_factory=dict)
    lines: dict[str, Result] = field(default_factory=dict)


def _find_line_identifiers(line: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The URLs and the paths of a line (a line recurs in search after search: found once)."""
    return tuple(urls_in(line)), tuple(paths_in(line))


_line_identifiers = _TextMemo(_find_line_identifiers, 2_000_000)
"""The URLs and paths of a line, once per line."""


def _classify(groups: _Groups, line: str, is_cmd: bool, r: Result, first: bool, low: str, find: Callable[[str], tuple[int, int] | None]) -> None:
    """Add one matching line to ``groups``: its paths and URLs holding the query, and the line
    itself as a command, an error, a user message's start, a summary line or a plain line."""
    idents = False
    low_line = line.lower()
    at = low_line.find(low)
    # paths and URLs only where the match sits in a token with a '/' (or is one)
    ws = max(low_line.rfind(" ", 0, max(at, 0)), low_line.rfind("\t", 0, max(at, 0))) + 1
    we = low_line.find(" ", at + len(low)) if at >= 0 else -1
    token = low_line[ws : we if we >= 0 else len(low_line)] if at >= 0 else low_line
    if "/" in token or "/" in low:
        urls, paths = _line_identifiers(line)
        for u in urls:
            if low in u.lower():
                idents = True
                _add(groups.urls, u, "url", _ident_tier(u.lower().rstrip("/"), low), r)
        for p in paths:
            if low in p.lower():
                idents = True
                _add(groups.paths, p, "path", _ident_tier(p.lower(), low), r)
    if is_cmd:
        _, _, cmd = line.partition(": ")
        tier = 0 if cmd.lower().startswith(low) or line.lower().startswith(low) else 1
        _add(groups.lines, line, "command", tier, r)
        return
    span = find(line)
    a, b = span if span is not None else (0, 0)
    if r.kind == "node":
        kind, tier = "summary", 2 if idents else 1
    elif _ERROR_WORDS.search(low_line) is not None and _ERROR_RE.search(line):
        # a raised or reported error before source text that merely names the class
        if not _bounded(line, a, b):
            tier = 2
        elif _CODE_LINE.search(line) is not None:
            tier = 2 if r.role == "tool" else 1
        else:
            tier = 0 if _RAISED.search(line) is not None or r.role == "tool" else 1
        _add(groups.errors, line, "error", tier, r)
        return
    elif r.role == "user" and first and line.lower().startswith(low):
        kind, tier = "user", 0
    elif idents:
        kind, tier = "line", 2
    else:
        kind, tier = "line", 3 if r.role != "user" else 1
    _add(groups.lines, line, kind, tier, r)


def _ident_tier(ident: str, low: str) -> int:
    """0: the identifier ends with the query at a segment start (``a/Foo.java`` for
    ``Foo.java``, ``…/issues/12`` for ``12``); 1: ends with it; 2: holds it."""
    if ident.endswith(low):
        at = len(ident) - len(low)
        return 0 if at == 0 or ident[at - 1] in "/=?#&" or low.startswith("/") else 1
    return 2


def _merge(r: Result, src: Source) -> None:
    r.n += len(src.ids)
    for i in src.ids:
        if len(r.ids) < 3 and i not in r.ids:
            r.ids.append(i)
    for sid in src.sessions:
        if sid not in r.sessions:
            r.sessions.append(sid)


def _add(table: dict[str, Result], text: str, kind: str, tier: int, line: Result) -> None:
    """Count ``line``'s occurrences under ``text`` (a line, or an identifier it holds)."""
    r = table.get(text)
    if r is None:
        table[text] = Result(kind, tier, line.order, text, line.kind, line.role, list(line.ids), list(line.sessions), line.n)
        return
    r.tier = min(r.tier, tier)
    r.order = min(r.order, line.order)
    r.n += line.n
    for i in line.ids:
        if len(r.ids) < 3 and i not in r.ids:
            r.ids.append(i)
    for sid in line.sessions:
        if sid not in r.sessions:
            r.sessions.append(sid)
