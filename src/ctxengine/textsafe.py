"""Text that cannot be encoded: one rule, applied everywhere ctxengine writes text.

Python strings may hold *lone surrogates* (``"\\ud800"``): a JSON ``"\\ud800"`` escape decodes to
one, and so does text read with ``errors="surrogateescape"``. They are not Unicode scalar values,
so encoding them as UTF-8 raises :class:`UnicodeEncodeError` — in a terminal, a file, SQLite,
PostgreSQL or an HTTP body. The rule:

* **A caller's messages are preserved exactly.** ctxengine never changes the text of a message
  it was given; engines return it as received.
* **JSON that ctxengine writes escapes them** (:func:`dumps`): a lone surrogate becomes the
  six characters ``\\udXXX``, which is valid JSON and decodes back to the same string (as with
  any JSON, a high and a low surrogate side by side decode as the one character they encode). The
  store's canonical JSON, ``sessions export`` and the CLI's JSON output use this, so a session
  with a lone surrogate is recorded, exported and restored exactly.
* **Plain text that ctxengine generates replaces them** with U+FFFD (:func:`clean`): summaries,
  search text and snippets, table cells, error messages.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["REPLACEMENT", "clean", "dumps", "escape_surrogates", "has_surrogates"]

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")


def has_surrogates(text: str) -> bool:
    """True when ``text`` holds a lone surrogate (cannot be encoded as UTF-8)."""
    return _SURROGATE.search(text) is not None


def clean(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (plain text ctxengine generates)."""
    if not text.isascii() and _SURROGATE.search(text):
        return _SURROGATE.sub(REPLACEMENT, text)
    return text


def _escape(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group(0)):04x}"


def dumps(value: Any, **kwargs: Any) -> str:
    """:func:`json.dumps` with ``ensure_ascii=False`` whose result is always encodable: lone
    surrogates (which can only occur inside JSON strings) are written as ``\\uXXXX`` escapes."""
    kwargs.setdefault("ensure_ascii", False)
    text = json.dumps(value, **kwargs)
    if kwargs["ensure_ascii"]:
        return text
    return escape_surrogates(text)


def escape_surrogates(text: str) -> str:
    """JSON text (from ``json.dumps(..., ensure_ascii=False)``) with every lone surrogate
    written as a ``\\uXXXX`` escape, as :func:`dumps` returns it."""
    if text.isascii():
        return text
    return _SURROGATE.sub(_escape, text)
