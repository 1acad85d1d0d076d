"""The facts the preservation guarantee protects (seed 004), and how to find them.

"File paths, URLs, tool names and error messages are never dropped." This module defines each
of those precisely, so engines that keep them, the fact ledger that checks summaries, and the
benchmark that measures retention all agree:

* **paths**: tokens with a ``/`` that end in a file name with an extension
  (``src/app/main.py``, ``/etc/hosts.conf``), plus absolute paths of at least two segments
  (``/usr/lib/jvm``); dotted Java/Python module names and URLs are not paths.
* **urls**: ``http(s)://`` and ``file://`` addresses, trailing punctuation stripped.
* **tools**: names of called tools.
* **errors**: lines of tool output or assistant text that report a failure (``error``,
  ``exception``, ``traceback``, ``failed``, ``fatal``, ``panic``, ``denied``, ``not found``,
  Java/Python exception class names), stripped and cut to :data:`MAX_ERROR_LINE` characters.
* **users**: user message texts (kept verbatim; engines never edit them).
* **calls** (measured by the benchmark, :func:`call_facts`): each tool call as
  ``name: command line`` (``bash: open src/Foo.java``).

A fact is *kept* when its exact text appears in the text of the context, or when recall over
the session store returns it verbatim (the kernel offers recall to every engine).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxengine.messages import (
    content_text,
    message_text,
    tool_call_args,
    tool_call_name,
    tool_calls,
)

__all__ = [
    "CALL_KIND",
    "FACT_KINDS",
    "MAX_ERROR_LINE",
    "FactMemo",
    "Facts",
    "call_facts",
    "call_retention",
    "error_lines",
    "extract_facts",
    "missing_facts",
    "paths_in",
    "retention",
    "urls_in",
]

FACT_KINDS = ("users", "paths", "urls", "tools", "errors")

MAX_ERROR_LINE = 240
"""Error lines longer than this are kept by their first MAX_ERROR_LINE characters: enough to
identify the error; stack-dump lines of several KB would otherwise dominate the context."""

_URL_RE = re.compile(r"""(?:https?|file)://[^\s<>"'`\\|^{}\[\]]+""")
_URL_TRAIL = ".,;:!?)]}'\""
# a path: optional leading ./ ../ ~/ or /, segments of path chars, at least one '/', ending in
# name.ext (ext 1-10 alnum chars), or an absolute path of >= 2 segments.
_PATH_RE = re.compile(
    r"""(?<![\w.:/~-])"""
    r"""((?:~|\.{1,2})?/?(?:[\w@+-][\w.@+-]*/)+[\w@+-][\w.@+-]*\.[A-Za-z][A-Za-z0-9]{0,9}"""
    r"""|/(?:[\w@+-][\w.@+-]*/)+[\w@+-][\w.@+-]*)"""
    r"""(?![\w/])"""
)
_ERROR_RE = re.compile(
    r"""(?i)(?:\berror\b|\berrors\b|\bexception\b|\btraceback\b|\bfailed\b|\bfailure\b|\bfatal\b|\bpanic\b"""
    r"""|permission denied|not found|no such file|cannot find symbol|\bsegmentation fault\b)"""
    r"""|\b[A-Z]\w*(?:Error|Exception)\b"""
)
# lines that merely mention the words without reporting a failure
_ERROR_NOISE_RE = re.compile(r"""(?i)^\W*(?:0 errors?|errors?: 0|failures: 0, errors: 0|tests run: \d+, failures: 0, errors: 0\b.*)\W*$""")


def urls_in(text: str) -> list[str]:
    """URLs in ``text``, in order, without duplicates."""
    out: dict[str, None] = {}
    if "://" not in text:
        return []
    for m in _URL_RE.finditer(text):
        u = m.group(0).rstrip(_URL_TRAIL)
        if len(u) > 10:
            out[u] = None
    return list(out)


def paths_in(text: str) -> list[str]:
    """File paths in ``text``, in order, without duplicates (URLs excluded).

    A path holds a ``/`` and never spans lines, and whether it is part of a URL is decided by
    text that also holds a ``/``; so on long texts only the lines with a ``/`` are scanned.
    """
    if "/" not in text:
        return []
    if len(text) > 2000 and "\n" in text:
        text = "\n".join(line for line in text.split("\n") if "/" in line)
    out: dict[str, None] = {}
    for m in _PATH_RE.finditer(text):
        p = m.group(1)
        start = m.start(1)
        # skip the path part of a URL
        if start >= 3 and text[max(0, start - 3) : start] == "://":
            continue
        if "://" in p or p.startswith("//"):
            continue
        p = p.rstrip(".")
        if p.count("/") == 0 or len(p) < 4:
            continue
        out[p] = None
    if "://" in text and out:
        # drop paths that are only pieces of a URL in the same text
        urls = urls_in(text)
        if urls:
            joined = "\n".join(urls)
            for p in list(out):
                if p in joined and p not in _strip_urls(text, urls):
                    del out[p]
    return list(out)


def _strip_urls(text: str, urls: Sequence[str]) -> str:
    for u in urls:
        text = text.replace(u, " ")
    return text


_ERROR_WORD_LIST = (
    "error",
    "exception",
    "traceback",
    "failed",
    "failure",
    "fatal",
    "panic",
    "denied",
    "not found",
    "no such file",
    "cannot find symbol",
    "segmentation fault",
)
_ERROR_WORDS = re.compile("|".join(_ERROR_WORD_LIST))
"""Every line :data:`_ERROR_RE` matches holds one of these words once lowercased; a literal
scan for them skips most lines without running the costlier case-insensitive pattern."""

_BARE_WORDS = frozenset(("not found", "no such file", "cannot find symbol"))
"""Words of :data:`_ERROR_WORD_LIST` that :data:`_ERROR_RE` matches wherever they occur."""


def _word_char(low: str, i: int) -> bool:
    """Whether ``low[i]`` is a word character (``\\w`` in ASCII text; outside it: no)."""
    return 0 <= i < len(low) and (low[i].isalnum() or low[i] == "_")


def _matches_at(low: str, word: str, at: int) -> bool:
    """Whether :data:`_ERROR_RE` surely matches the ASCII lowercased text ``low`` at the
    keyword ``word`` found at ``at`` (False: it may still match elsewhere on the line)."""
    if word in _BARE_WORDS:
        return True
    if word == "denied":
        return low.startswith("permission ", at - 11) and at >= 11
    end = at + len(word)
    if word in ("error", "exception") and not _word_char(low, end):
        # \b[A-Z]\w*(?:Error|Exception)\b, case-insensitive: a word starting with a letter
        # before the keyword (IOException, java.lang.IllegalStateException)
        start = at
        while _word_char(low, start - 1):
            start -= 1
        if start < at and low[start].isalpha():
            return True
    if word == "error" and low.startswith("s", end):
        end += 1  # \berrors\b
    return not _word_char(low, at - 1) and not _word_char(low, end)


_OTHER_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e"
"""Line breaks ``str.splitlines`` honours in ASCII text besides ``\\n``."""


def error_lines(text: str) -> list[str]:
    """Lines of ``text`` that report an error, stripped and cut to MAX_ERROR_LINE chars.

    Equivalent to testing every line of ``text.splitlines()`` against the error pattern (a test
    checks it on every trajectory), but only lines holding one of the error words are visited:
    several times faster on long tool outputs, where compaction spends its time.
    """
    out: dict[str, None] = {}

    def keep(line: str, sure: bool = False) -> None:
        s = line.strip()
        if s and len(s) >= 4 and (sure or _ERROR_RE.search(s)) and not _ERROR_NOISE_RE.match(s):
            out[s[:MAX_ERROR_LINE].rstrip()] = None

    if text.isascii() and not any(c in text for c in _OTHER_BREAKS):
        # lines split at "\n" only and lower() keeps offsets: visit just the keyword lines,
        # found by one C-level str.find pass per word (a regex alternation of the words runs
        # several times slower), in the order of the text; a line where a word found is
        # already a match of the pattern is not searched again
        low = text.lower()
        starts: dict[int, bool] = {}
        for word in _ERROR_WORD_LIST:
            at = low.find(word)
            while at >= 0:
                start = low.rfind("\n", 0, at) + 1
                starts[start] = starts.get(start, False) or _matches_at(low, word, at)
                end = low.find("\n", at + len(word))
                if end < 0:
                    break
                at = low.find(word, end)
        for start in sorted(starts):
            end = text.find("\n", start)
            keep(text[start:] if end < 0 else text[start:end], starts[start])
        return list(out)
    for line in text.splitlines():
        if line.isascii() and _ERROR_WORDS.search(line.lower()) is None:
            continue
        keep(line)
    return list(out)


class FactMemo:
    """:func:`paths_in`, :func:`urls_in` and :func:`error_lines` remembered per text: an
    engine's memo for the session it serves.

    An engine scans the same tool output at many compactions: it receives a deep copy of the
    messages on every call (so a memo keyed by the message object never hits), and cutting an
    output, the fact ledger and the summarizer each scan it again. A deep copy shares its
    strings, and a string caches its hash, so a lookup by text is a dictionary probe however
    long the text is. Exact: the answers are those of the functions (each call gets a new
    list). Texts shorter than ``min_chars`` are scanned again (about as cheap as a lookup);
    the memo holds at most ``max_chars`` characters of text, dropping the oldest first.
    Thread-safe: the lock is held only to update it.
    """

    __slots__ = ("_held", "_lock", "_memo", "max_chars", "min_chars")

    def __init__(self, *, min_chars: int = 512, max_chars: int = 2_000_000) -> None:
        self.min_chars = min_chars
        self.max_chars = max_chars
        self._memo: dict[tuple[str, str], tuple[str, ...]] = {}
        self._held = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            return {"min_chars": self.min_chars, "max_chars": self.max_chars, "memo": dict(self._memo), "held": self._held}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.min_chars, self.max_chars = state["min_chars"], state["max_chars"]
        self._memo, self._held = dict(state["memo"]), state["held"]
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict[int, Any]) -> FactMemo:
        # an engine is deep-copied (a registry prototype, a host's worker): the copy gets its
        # own lock and dictionary; the remembered texts and answers are immutable, so shared
        clone = FactMemo.__new__(FactMemo)
        clone.__setstate__(self.__getstate__())
        return clone

    def _get(self, kind: str, fn: Callable[[str], list[str]], text: str) -> list[str]:
        if len(text) < self.min_chars:
            return fn(text)
        key = (kind, text)
        hit = self._memo.get(key)
        if hit is not None:
            return list(hit)
        found = fn(text)
        with self._lock:
            if key not in self._memo:
                self._memo[key] = tuple(found)
                self._held += len(text)
                while self._held > self.max_chars and self._memo:
                    oldest = next(iter(self._memo))
                    del self._memo[oldest]
                    self._held -= len(oldest[1])
        return found

    def paths(self, text: str) -> list[str]:
        """:func:`paths_in` of ``text``."""
        return self._get("paths", paths_in, text)

    def urls(self, text: str) -> list[str]:
        """:func:`urls_in` of ``text``."""
        return self._get("urls", urls_in, text)

    def errors(self, text: str) -> list[str]:
        """:func:`error_lines` of ``text``."""
        return self._get("errors", error_lines, text)

    def clear(self) -> None:
        with self._lock:
            self._memo.clear()
            self._held = 0


@dataclass(slots=True)
class Facts:
    """Preservation-guarantee facts of a span of messages, by kind (ordered, unique)."""

    users: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def by_kind(self) -> dict[str, list[str]]:
        return {k: list(getattr(self, k)) for k in FACT_KINDS}

    def all(self) -> list[str]:
        return [f for k in FACT_KINDS for f in getattr(self, k)]

    def __len__(self) -> int:
        return sum(len(getattr(self, k)) for k in FACT_KINDS)

    def merge(self, other: Facts) -> Facts:
        merged = Facts()
        for k in FACT_KINDS:
            seen = dict.fromkeys(getattr(self, k))
            seen.update(dict.fromkeys(getattr(other, k)))
            setattr(merged, k, list(seen))
        return merged


def extract_facts(messages: Iterable[Mapping[str, Any]], *, include_users: bool = True, memo: FactMemo | None = None) -> Facts:
    """Facts of ``messages``: paths and URLs from every text and tool argument, tool names from
    tool calls, error lines from tool results and assistant text, user texts verbatim.

    System messages contribute nothing: they are configuration, not session facts. ``memo``
    (an engine's :class:`FactMemo`) answers for texts scanned before.
    """
    find_paths, find_urls, find_errors = (memo.paths, memo.urls, memo.errors) if memo is not None else (paths_in, urls_in, error_lines)
    users: dict[str, None] = {}
    paths: dict[str, None] = {}
    urls: dict[str, None] = {}
    tools: dict[str, None] = {}
    errors: dict[str, None] = {}
    for m in messages:
        role = m.get("role")
        if role in ("system", "developer"):
            continue
        if role == "user":
            t = content_text(m.get("content"))
            if include_users and t.strip():
                users[t] = None
            text = t
        else:
            text = message_text(m)
            for c in tool_calls(m):
                tools[tool_call_name(c)] = None
        if not text:
            continue
        paths.update(dict.fromkeys(find_paths(text)))
        urls.update(dict.fromkeys(find_urls(text)))
        if role in ("tool", "function", "assistant"):
            errors.update(dict.fromkeys(find_errors(content_text(m.get("content")))))
    return Facts(list(users), list(paths), list(urls), list(tools), list(errors))


def missing_facts(facts: Facts, text: str) -> Facts:
    """The facts of ``facts`` whose exact text does not occur in ``text``."""
    out = Facts()
    for k in FACT_KINDS:
        setattr(out, k, [f for f in getattr(facts, k) if f not in text])
    return out


def retention(
    facts: Facts,
    messages: Iterable[Mapping[str, Any]],
    retrievable: Callable[[str], bool] | None = None,
) -> tuple[dict[str, int], dict[str, int], Facts]:
    """How many of ``facts`` the context ``messages`` keeps, by kind: ``(total, kept, missing)``.

    A fact is kept when its exact text is in the context, or when ``retrievable(fact)`` says an
    engine with a store can give it back verbatim.
    """
    missing = missing_facts(facts, context_text(messages))
    if retrievable is not None:
        for k in FACT_KINDS:
            setattr(missing, k, [f for f in getattr(missing, k) if not retrievable(f)])
    total = {k: len(getattr(facts, k)) for k in FACT_KINDS}
    kept = {k: total[k] - len(getattr(missing, k)) for k in FACT_KINDS}
    return total, kept, missing


def context_text(messages: Iterable[Mapping[str, Any]]) -> str:
    """All text of ``messages`` (system included) joined, for fact lookups."""
    return "\n".join(message_text(m) for m in messages)


CALL_KIND = "calls"
"""The measured fact kind of tool calls: ``name: command line`` (``bash: open src/Foo.java``)."""

_MAIN_ARGS = ("command", "cmd", "input", "code", "query", "path", "file", "url")
MAX_CALL_LINE = 200


def _command_line(args: Any) -> str:
    if isinstance(args, str):
        value: Any = args
    elif isinstance(args, Mapping):
        value = next((args[k] for k in _MAIN_ARGS if isinstance(args.get(k), str) and args[k].strip()), None)
        if value is None:
            value = next((v for v in args.values() if isinstance(v, str) and v.strip()), "")
    else:
        value = ""
    line = next((x.strip() for x in str(value).splitlines() if x.strip()), "")
    return line[:MAX_CALL_LINE]


def call_facts(messages: Iterable[Mapping[str, Any]]) -> list[str]:
    """Tool-call facts of ``messages``: ``name: command line`` per call (the first non-empty line
    of its main argument — ``command``, ``cmd``, ``input`` … — at most 200 characters), or the
    bare name for a call without arguments; ordered, unique."""
    out: dict[str, None] = {}
    for m in messages:
        for c in tool_calls(m):
            name = tool_call_name(c)
            line = _command_line(tool_call_args(c))
            out[f"{name}: {line}" if line else name] = None
    return list(out)


def call_retention(calls: Sequence[str], messages: Iterable[Mapping[str, Any]], retrievable: Callable[[str], bool] | None = None) -> tuple[int, int, list[str]]:
    """``(total, kept, missing)`` for tool-call facts: a call is kept when ``name: command line``
    is in the context verbatim, or its name is and its command line is in the context or
    returned verbatim by ``retrievable`` (recall over the store)."""
    text = context_text(messages)
    missing: list[str] = []
    for fact in calls:
        if fact in text:
            continue
        name, _, line = fact.partition(": ")
        # the arguments are JSON in a call: the line may appear escaped there (quotes, \uXXXX)
        forms = dict.fromkeys([line, json.dumps(line, ensure_ascii=False)[1:-1], json.dumps(line)[1:-1]])
        if name in text and (not line or any(f in text for f in forms) or (retrievable is not None and any(retrievable(f) for f in forms))):
            continue
        missing.append(fact)
    return len(calls), len(calls) - len(missing), missing
