"""Regular expressions from untrusted callers (a model's ``ctx_grep``/``lcm_grep`` pattern), in
linear time.

Python's ``re`` backtracks: ``(a+)+$`` took over 70 s on a 41-character message, and a recall
tool runs whatever pattern the model writes. Search patterns therefore run on RE2 (the
``google-re2`` package, the ``safe-regex`` extra), whose matching time is linear in the text
for every pattern. Why RE2 rather than a time limit (``regex``'s ``timeout=``): a time limit
still spends the whole limit on every bad pattern, and it gives a partial answer that depends
on the machine's speed; RE2 answers every pattern completely, in time proportional to the text.

The price is syntax: RE2 has no backreferences (``\\1``) and no lookarounds (``(?=…)``,
``(?<=…)``). Such a pattern is refused with an :class:`~ctxengine.errors.InputError` that says
so, as is a pattern longer than :data:`MAX_PATTERN_CHARS`. Without ``google-re2`` installed,
regex mode is refused (text search always works): it never falls back to backtracking.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ctxengine.errors import InputError
from ctxengine.textsafe import clean

__all__ = ["MAX_PATTERN_CHARS", "compile_pattern", "regex_available"]

MAX_PATTERN_CHARS = 2_000
"""Longest pattern accepted (RE2's compile time and memory grow with the pattern)."""

_PATTERN_MEMORY = 32 << 20  # bytes RE2 may use for one compiled pattern


def _re2() -> Any:
    try:
        import re2
    except ImportError:
        return None
    return re2


def regex_available() -> bool:
    """True when the linear-time engine is installed (regex search is possible)."""
    return _re2() is not None


def compile_pattern(pattern: str) -> Callable[[str], tuple[int, int] | None]:
    """A finder for ``pattern``: ``finder(text)`` is the ``(start, end)`` character span of the
    first match, or ``None``. Raises :class:`InputError` for a pattern RE2 cannot run."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise InputError(f"regular expression too long ({len(pattern):,} characters; at most {MAX_PATTERN_CHARS:,})")
    re2 = _re2()
    if re2 is None:
        raise InputError(
            "regex search needs the linear-time engine: pip install 'ctxengine[safe-regex]' "
            "(google-re2); plain text search works without it"
        )
    options = re2.Options()
    options.log_errors = False
    options.max_mem = _PATTERN_MEMORY
    try:
        rx = re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        hint = ""
        if "perl operator" in reason or "escape sequence" in reason:
            hint = " (backreferences and lookarounds are not supported: matching must stay linear-time)"
        raise InputError(f"invalid regular expression {clean(pattern)[:200]!r}: {reason}{hint}") from None

    def find(text: str) -> tuple[int, int] | None:
        try:
            m = rx.search(text)
        except UnicodeEncodeError:  # a lone surrogate: search the text as stored for search
            m = rx.search(clean(text))
        return None if m is None else (int(m.start()), int(m.end()))

    return find
