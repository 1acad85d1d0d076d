"""Recall: the agent gets back, verbatim, whatever compaction removed from its context.

One implementation for every engine (DESIGN §3.9). The session store already records every
original message each turn; :class:`Recall` reads them back for one session through the tools
``ctx_grep``, ``ctx_expand`` and ``ctx_describe`` (what each does, its arguments and limits:
:mod:`~ctxengine.recall.spec`, the one place they are described).

The manager offers these tools (:meth:`Recall.tool_schemas`) only once a session's context has
lost text and a store is enabled — tool definitions cost tokens on every request — and answers
the model's calls itself (:meth:`Recall.handle`). Engines that name their tools otherwise get
aliases: ``Recall(store, sid, aliases=LCM_ALIASES)`` answers ``lcm_grep``, ``lcm_describe`` and
``lcm_expand`` with the same code. :meth:`Recall.retrievable` is the preservation check of
DESIGN §3.3 #8: a fact missing from the context still counts when ``ctx_grep`` returns it
verbatim.

Every answer is a JSON string; a bad argument or an unknown id comes back as ``{"error": …}``
for the model to read, never as an exception out of the agent loop.

An answer can be bounded (``handle(..., max_tokens=N)``: the room left in the window, which a
proxy answering several calls in one reply shares among them): ``ctx_expand`` returns fewer
messages or the first one cut (``next_offset`` / ``next_text_offset`` say where the rest
starts), ``ctx_grep`` and ``ctx_describe`` fewer results; a ``note`` says what was left out and
how to get it. :func:`fit_answer` bounds any other tool's answer the same way.

The package, by concern: :mod:`~ctxengine.recall.spec` (tool names, limits and definitions),
:mod:`~ctxengine.recall.tools` (:class:`Recall`, the tools over a store),
:mod:`~ctxengine.recall.rank` (matching lines ranked for an agent, identifiers of a text) and
:mod:`~ctxengine.recall.answer` (answers sized and paged).
"""

from __future__ import annotations

from ctxengine.recall.answer import fit_answer
from ctxengine.recall.rank import identifiers, rank_lines
from ctxengine.recall.spec import (
    DESCRIBE_TOOL,
    EXPAND_DEFAULT_TOKENS,
    EXPAND_TOOL,
    GREP_CANDIDATES,
    GREP_DEFAULT_LIMIT,
    GREP_MAX_CHARS,
    GREP_TOOL,
    LCM_ALIASES,
)
from ctxengine.recall.tools import Recall

__all__ = [
    "DESCRIBE_TOOL",
    "EXPAND_DEFAULT_TOKENS",
    "EXPAND_TOOL",
    "GREP_CANDIDATES",
    "GREP_DEFAULT_LIMIT",
    "GREP_MAX_CHARS",
    "GREP_TOOL",
    "LCM_ALIASES",
    "Recall",
    "fit_answer",
    "identifiers",
    "rank_lines",
]
