"""Recall's tool surface: tool names, aliases, limits and the tool definitions offered.

* ``ctx_grep`` — search the session's originals and summary nodes (case-insensitive substring,
  or a regular expression with ``mode="regex"``); snippets are verbatim;
* ``ctx_expand`` — the originals behind an id: a summary node's messages in order, or one
  stored message (the ``ref=`` of a ``[ctxengine:cut …]`` marker), within a token budget;
* ``ctx_describe`` — a node's metadata, parents and children with previews.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DESCRIBE_TOOL",
    "EXPAND_DEFAULT_TOKENS",
    "EXPAND_TOOL",
    "GREP_CANDIDATES",
    "GREP_DEFAULT_LIMIT",
    "GREP_MAX_CHARS",
    "GREP_TOOL",
    "LCM_ALIASES",
    "NARROW_CHARS",
    "schemas",
]

GREP_TOOL = "ctx_grep"
EXPAND_TOOL = "ctx_expand"
DESCRIBE_TOOL = "ctx_describe"

LCM_ALIASES: dict[str, str] = {
    "lcm_grep": GREP_TOOL,
    "lcm_describe": DESCRIBE_TOOL,
    "lcm_expand": EXPAND_TOOL,
}
"""The lossless engine's historical tool names, answered by the generic tools."""

GREP_DEFAULT_LIMIT = 10
"""Results of one ``ctx_grep`` answer unless the model asks for more (at most 50); whatever the
limit, an answer stops at :data:`GREP_MAX_CHARS`."""

GREP_MAX_CHARS = 3_600
"""Bound of one ``ctx_grep`` answer, in characters of its JSON: at most ~1,500 tokens for any
tokenizer that spends at least one token per 2.4 characters (o200k spends one per 2.6 to 3.5 on
JSON-escaped paths and code). Results past the bound are counted in ``more`` and reached with ``offset``."""

GREP_CANDIDATES = 200
"""Matching messages (newest first) and summary nodes one search ranks."""

LINE_CHARS = 320
"""Lines up to this long are shown whole; a longer one shows its start and the match, each cut
at whitespace, so no path, URL or error message is cut."""

INDEX_BATCH = 500
"""Messages whose identifiers one indexing step reads and writes."""

IDENTS_PER_MESSAGE = 2_000
"""Identifiers one message contributes to the index at most (a huge listing stays bounded)."""

LINES_RANKED = 400
"""Distinct matching lines one search classifies (the newest first); the rest are counted."""

LINES_SEEN = 2_000
"""Distinct matching lines one search collects at most (then it stops reading older messages)."""

GROUP_MAX = 40
"""Distinct paths (or URLs) one identifier result lists at most."""

NARROW_CHARS = 240
"""Characters of the directory names a listing's ``narrow`` line names (those that tell apart
the paths it could not show)."""

EXPAND_DEFAULT_TOKENS = 8000
"""Default budget of one ``ctx_expand`` answer: enough for a few tool outputs, small enough
that reading them back does not itself overflow the window."""

PREVIEW_CHARS = 160
"""Characters of one child's preview in ``ctx_describe``."""


def schemas() -> dict[str, dict[str, Any]]:
    """The generic tools' definitions (``description``, ``parameters``), by tool name (new
    objects each call)."""
    return {GREP_TOOL: _grep_schema(), EXPAND_TOOL: _expand_schema(), DESCRIBE_TOOL: _describe_schema()}


def _grep_schema() -> dict[str, Any]:
    return {
        "description": (
            "Search the whole conversation, including text cut or summarized away. Type what you "
            "would look for: a file name, an error class, part of a URL, a command's first words. "
            "Full paths and whole matching lines come first, repeats counted; ids are for ctx_expand."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "description": "Text to find (case-insensitive), or a regular expression with mode=regex.",
                },
                "mode": {"type": "string", "enum": ["text", "regex"]},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                "offset": {"type": "integer", "minimum": 0, "description": "Skip this many results (see next_offset)."},
            },
            "required": ["query"],
        },
    }


def _expand_schema() -> dict[str, Any]:
    return {
        "description": (
            "Return the original messages behind an id, verbatim and in order, within a token budget "
            "(page with offset): a summary node id, or the ref= of a [ctxengine:cut ...] marker."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "id": {
                    "type": "string",
                    "description": "A summary node id, a message id, or a cut marker's ref.",
                },
                "max_tokens": {
                    "type": "integer",
                    "minimum": 100,
                    "description": f"Token budget of the answer (default {EXPAND_DEFAULT_TOKENS}).",
                },
                "offset": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Index of the first message to return (default 0).",
                },
                "text_offset": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Character where the first message's text starts (a cut answer's next_text_offset).",
                },
            },
            "required": ["id"],
        },
    }


def _describe_schema() -> dict[str, Any]:
    return {
        "description": "Show a summary node: depth, size, parents and children (messages or lower summaries) with previews.",
        "parameters": {
            "type": "object",
            "properties": {"id": {"type": "string", "description": "A summary node id."}},
            "required": ["id"],
        },
    }
