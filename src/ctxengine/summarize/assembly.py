"""Building a compaction summary into a message list: recognise an earlier summary, prune what
the summarizer sees, bound a summary to its budget and place it between head and tail.

Used by the ``compressor`` engine (phases 1, 3 and 4 of its module docstring).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ctxengine.facts import Facts
from ctxengine.messages import Message, content_text, is_summary
from ctxengine.summarize.base import has_template
from ctxengine.summarize.extractive import PRUNED_MARKER
from ctxengine.tokens import estimate

__all__ = [
    "PRUNE_MIN_CHARS",
    "SUMMARY_END",
    "SUMMARY_PREFIX",
    "bounded",
    "own_summary",
    "place_summary",
    "pruned",
    "split_summary",
    "with_note",
]

SUMMARY_PREFIX = "[CONTEXT COMPACTION]"
SUMMARY_END = "[END OF CONTEXT COMPACTION]"

PRUNE_MIN_CHARS = 200
"""Tool results longer than this are pruned outside the tail (the seed's value)."""


def own_summary(m: Message) -> bool:
    """A compaction summary (a message of its own or opening a tail message); cut tool
    outputs are records of one output, not summaries."""
    return m.get("role") not in ("system", "developer", "tool") and is_summary(m)


def split_summary(text: str) -> tuple[str, str]:
    """``(summary, rest)`` of a message opened by a compaction summary."""
    body = text
    rest = ""
    end = text.find(SUMMARY_END)
    if end >= 0:
        body = text[:end]
        rest = text[end + len(SUMMARY_END) :].strip()
    # drop the header line(s) before the template
    at = body.find("## ")
    if at >= 0:
        body = body[at:]
    return body.strip(), rest


def pruned(m: Message, facts: Facts) -> Message:
    """A tool result over PRUNE_MIN_CHARS becomes the marker plus a one-line digest (first
    line, up to three error lines) for the summarizer."""
    if m.get("role") != "tool":
        return m
    text = content_text(m.get("content"))
    if len(text) <= PRUNE_MIN_CHARS or text.startswith(PRUNED_MARKER):
        return m
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")[:160]
    digest = [first, *facts.errors[:3]]
    return {**m, "content": "\n".join([PRUNED_MARKER, *dict.fromkeys(d for d in digest if d)])}


def bounded(summary: str, budget: int, fallback: Callable[[int], str], notes: list[str]) -> str:
    """A summary longer than its budget is cut to the budget at a line boundary (headings are
    kept); if that loses the template, ``fallback(budget)`` (the extractive summary) is used.
    What happened is appended to ``notes``."""
    size = estimate(summary)
    if size <= budget:
        return summary
    kept: list[str] = []
    used = 0
    for line in summary.split("\n"):
        t = estimate(line) + 1
        if used + t > budget:
            if line.startswith("#"):
                kept.append(line)  # headings are cheap and keep the template whole
                used += t
            continue
        kept.append(line)
        used += t
    cut = "\n".join(kept)
    if not has_template(cut) or estimate(cut) > budget + 200:
        notes.append(f"summary of {size:,} tokens over its budget of {budget:,}: extractive summary used")
        return fallback(budget)
    notes.append(f"summary of {size:,} tokens cut to its budget of {budget:,}")
    return cut


def with_note(system: Message, note: str) -> Message:
    """The system message with ``note`` appended (unchanged when it already holds it)."""
    content = system.get("content")
    text = content_text(content)
    if note in text:
        return system
    if isinstance(content, list):
        return {**system, "content": [*content, {"type": "text", "text": note}]}
    return {**system, "content": f"{text}\n\n{note}" if text else note}


def place_summary(head: list[Message], body: str, pulled: list[Message], tail: list[Message]) -> list[Message]:
    """``head + summary + pulled + tail``, the summary ``body`` in a role that avoids two
    consecutive same-role messages and keeps the first non-system message a user message."""
    prev_role = head[-1].get("role") if head else None
    nxt = (pulled or tail)[:1]
    next_role = nxt[0].get("role") if nxt else None
    if prev_role in (None, "system", "developer"):
        role: str | None = "user" if next_role != "user" else None
    else:
        role = next((r for r in ("user", "assistant") if r != prev_role and r != next_role), None)
    if role is not None:
        return [*head, {"role": role, "content": body}, *pulled, *tail]
    if not pulled and tail and tail[0].get("role") == "assistant":
        # user … [summary] … assistant: no standalone role fits; the summary opens the
        # first tail message instead of creating two consecutive same-role messages
        first = tail[0]
        content = first.get("content")
        if isinstance(content, list):
            merged: Any = [{"type": "text", "text": body}, *content]
        elif isinstance(content, str) and content:
            merged = f"{body}\n\n{content}"
        else:
            merged = body
        return [*head, {**first, "content": merged}, *tail[1:]]
    opener = tail[0] if tail and not pulled else None
    if (
        opener is not None
        and opener.get("role") == "user"
        and isinstance(opener.get("content"), str)
        and any(m.get("role") == "user" for m in tail[1:])
    ):
        # assistant … [summary] … user (not the latest one): the summary opens that user
        # message, whose words stay verbatim after it
        return [*head, {**opener, "content": f"{body}\n\n{opener['content']}"}, *tail[1:]]
    # no role avoids a repeat and nothing to merge into: user, so the first non-system
    # message stays a user message (providers merge consecutive user turns)
    return [*head, {"role": "user", "content": body}, *pulled, *tail]
