"""Building a compaction summary into a message list: recognise an earlier summary, prune what
the summarizer sees, bound a summary to its budget and place it between head and tail.

Used by the ``compressor`` engine (phases 1, 3 and 4 of its module docstring).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ctxengine.errors import SummarizerAuthError, SummarizerError
from ctxengine.facts import FACT_KINDS, Facts
from ctxengine.messages import Message, content_text, is_summary, message_text
from ctxengine.redact import redact
from ctxengine.summarize.base import Summarizer, bound_summary, has_template
from ctxengine.summarize.extractive import PRUNED_MARKER
from ctxengine.summarize.ledger import DEFAULT_POINTER, LedgerResult, TextIndex, apply_ledger
from ctxengine.tokens import estimate

__all__ = [
    "PRUNE_MIN_CHARS",
    "SUMMARY_END",
    "SUMMARY_PREFIX",
    "bounded",
    "fit_ledger",
    "own_summary",
    "place_summary",
    "pruned",
    "run_summarizer",
    "split_summary",
    "summary_span",
    "with_note",
]

SUMMARY_PREFIX = "[CONTEXT COMPACTION]"
SUMMARY_END = "[END OF CONTEXT COMPACTION]"

PRUNE_MIN_CHARS = 200
"""Tool results longer than this are pruned outside the tail (the seed's value)."""
MIN_SHRUNK_SUMMARY = 150
"""A summary shrunk to make room for user quotes keeps at least this many tokens."""
LEDGER_SHARE = 0.6
"""At most this share of a summary's budget goes to its fact ledger (quotes and facts) when the
prose and the ledger do not both fit: the rest stays prose."""


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


def summary_span(middle: list[Message], previous: str | None, facts_of: Callable[[Message], Facts]) -> tuple[list[Message], str | None, Facts]:
    """What the summarizer reads of ``middle``: ``(span, previous summary, facts of the span)``.

    Earlier compaction summaries become the text to update (the first one found, unless
    ``previous`` is given), not content to summarize; tool results are :func:`pruned`."""
    span: list[Message] = []
    acc: dict[str, dict[str, None]] = {k: {} for k in FACT_KINDS}
    for m in middle:
        if own_summary(m):
            text, rest = split_summary(content_text(m.get("content")))
            if previous is None:
                previous = text
            if rest or m.get("tool_calls"):
                m = {**m, "content": rest}
            else:
                continue
        facts = facts_of(m)
        for k in FACT_KINDS:
            acc[k].update(dict.fromkeys(getattr(facts, k)))
        span.append(pruned(m, facts))
    return span, previous, Facts(**{k: list(v) for k, v in acc.items()})


def fit_ledger(
    summary: str,
    required: Facts,
    kept: Sequence[Message],
    *,
    tokens_of: Callable[[Message], int],
    facts_of: Callable[[Message], Facts],
    hard_limit: int,
    context_length: int,
    min_output_tokens: int,
    shrink: Callable[[str, int], str],
    budget: int | None = None,
    quote_budget: int | None = None,
    quote_tokens: int | None = None,
    pointer: str = DEFAULT_POINTER,
) -> LedgerResult:
    """The fact ledger of ``summary`` next to the ``kept`` messages: the facts in ``required``
    they miss, within the room the hard limit leaves; the user's words are quoted while they
    fit the window (tool outputs in ``kept`` can still be cut to ``min_output_tokens``). When
    user messages do not fit, the summary is first ``shrink``-ed (to at least
    MIN_SHRUNK_SUMMARY tokens) to make room for them.

    ``budget`` (the summary's budget): summary and ledger together stay within it — the
    summary gives up to :data:`LEDGER_SHARE` of it to the ledger when facts or quotes miss room;
    what is left out is counted and stays retrievable. ``quote_budget`` caps the quotes,
    ``quote_tokens`` each quote (:func:`~ctxengine.summarize.ledger.brief_quote`); ``pointer``
    is what the ledger says about what it leaves out."""
    ledger_for = _ledger_maker(
        required,
        kept,
        tokens_of=tokens_of,
        facts_of=facts_of,
        hard_limit=hard_limit,
        context_length=context_length,
        min_output_tokens=min_output_tokens,
        quote_budget=quote_budget,
        quote_tokens=quote_tokens,
        pointer=pointer,
    )
    if budget is None:
        ledger = ledger_for(summary, None)
        if ledger.unquoted_users and estimate(summary) > MIN_SHRUNK_SUMMARY:
            # user messages come before the summary's prose: shrink it to make room for them
            need = sum(estimate(u) + 4 for u in ledger.unquoted_users)
            smaller = max(MIN_SHRUNK_SUMMARY, estimate(summary) - need)
            ledger = ledger_for(shrink(summary, smaller), None)
        return ledger
    return _fit_within(summary, budget, ledger_for, shrink)


_LedgerFor = Callable[[str, int | None], LedgerResult]
"""The ledger of a summary text within an optional room (see :func:`_ledger_maker`)."""


def _ledger_maker(
    required: Facts,
    kept: Sequence[Message],
    *,
    tokens_of: Callable[[Message], int],
    facts_of: Callable[[Message], Facts],
    hard_limit: int,
    context_length: int,
    min_output_tokens: int,
    quote_budget: int | None,
    quote_tokens: int | None,
    pointer: str,
) -> _LedgerFor:
    """The ledger of a summary text next to ``kept`` (see :func:`fit_ledger`), with what the
    kept messages need computed once."""
    fixed = sum(tokens_of(m) for m in kept)
    # what the kept messages need at least: tool outputs can still be cut to fit the window
    floor = sum(min(tokens_of(m), min_output_tokens) if m.get("role") == "tool" else tokens_of(m) for m in kept)
    # facts extracted from the kept messages occur in their text: a set lookup answers most
    known: set[str] = set()
    for m in kept:
        f = facts_of(m)
        known.update(f.paths, f.urls, f.tools, f.errors)
    present = TextIndex("\n".join(message_text(m) for m in kept), known)

    def ledger_for(text: str, room: int | None) -> LedgerResult:
        facts = max(0, hard_limit - fixed - estimate(text) - 200)
        # the user's words are anchors: quoted while they fit the window (outputs of the
        # tail are cut afterwards if need be); those that cannot fit stay retrievable
        users = max(0, int(context_length * 0.98) - floor - estimate(text) - 100)
        if quote_budget is not None:
            users = min(users, quote_budget)
        if room is not None:
            facts, users = min(facts, room), min(users, room)
        return apply_ledger(
            text,
            required,
            present,
            budget_tokens=facts,
            user_budget_tokens=users,
            quote_tokens=quote_tokens,
            pointer=pointer,
        )

    return ledger_for


def _fit_within(summary: str, budget: int, ledger_for: _LedgerFor, shrink: Callable[[str, int], str]) -> LedgerResult:
    """Summary and ledger together within ``budget``: the prose gives up to LEDGER_SHARE of it
    to the ledger, the ledger's headings are taken off its room, and when not even those fit
    the prose goes alone with everything it missed counted."""
    base = summary
    ledger = ledger_for(base, max(0, budget - estimate(base)))
    if (ledger.unquoted_users or not ledger.complete) and estimate(base) > MIN_SHRUNK_SUMMARY:
        # the ledger (the user's words, the facts) comes before the summary's prose: the
        # prose gives up to LEDGER_SHARE of the budget to what the ledger would use
        want = ledger_for(base, budget).tokens - estimate(base)
        smaller = max(MIN_SHRUNK_SUMMARY, budget - min(want, int(budget * LEDGER_SHARE)))
        if smaller < estimate(base):
            base = shrink(base, smaller)
            ledger = ledger_for(base, max(0, budget - estimate(base)))
    # headings and separators are not in the per-fact costs: take the excess off the room
    for _ in range(4):
        over = estimate(ledger.text) - budget
        if over <= 0 or ledger.text == base:
            break
        room = max(0, budget - estimate(base) - over - 8 * (_ + 1))
        ledger = ledger_for(base, room)
    if estimate(ledger.text) > budget:
        # not even the ledger's headings fit: the prose alone, everything it missed counted:
        # the ledger of the prose with no room lists every user message and fact it misses
        # (those the last ledger quoted included: they are no longer in the text)
        prose = shrink(base, budget)
        missed = ledger_for(prose, 0)
        ledger = LedgerResult(prose, dropped=dict(missed.dropped), unquoted_users=[*missed.briefed_users, *missed.unquoted_users])
    return ledger


def run_summarizer(
    summarizer: Summarizer,
    fallback: Summarizer,
    span: list[Message],
    previous: str | None,
    focus_topic: str | None,
    budget: int,
    *,
    over_hard_limit: bool,
    abort_on_failure: bool,
    notes: list[str],
    log: logging.Logger,
) -> tuple[str | None, str | None, str | None]:
    """``(summary, fallback used, error)``: the summary bounded to ``budget`` with
    :func:`~ctxengine.summarize.base.bound_summary` (any summarizer's text); on failure the
    ``fallback`` (extractive) summary (``"extractive"``), or ``None`` with ``"unchanged"``
    when messages are to be kept: an authentication error, or any failure with
    ``abort_on_failure``, below the hard limit. What happened goes to ``notes`` and ``log``."""
    try:
        text = summarizer.summarize(span, previous_summary=previous, focus_topic=focus_topic, budget_tokens=budget)
        if not text.strip() or not has_template(text):
            raise SummarizerError("the summary is empty or lacks the template headings")
        short = bound_summary(text, budget)
        if short != text:
            notes.append(f"summary of {estimate(text):,} tokens cut to its budget of {budget:,}")
        return short, None, None
    except SummarizerAuthError as exc:
        error = redact(f"summarizer authentication failed: {exc}")
        if not over_hard_limit:
            log.warning("%s; messages kept unchanged", error)
            notes.append(error + "; messages kept unchanged")
            return None, "unchanged", error
        log.warning("%s; over the hard limit, using the extractive summary", error)
        notes.append(error + "; over the hard limit: extractive summary")
    except SummarizerError as exc:
        error = redact(f"summarizer failed: {exc}")  # a custom summarizer's text too
        if abort_on_failure and not over_hard_limit:
            log.warning("%s; abort_on_summary_failure: messages kept unchanged", error)
            notes.append(f"{error}; messages kept unchanged (abort_on_summary_failure)")
            return None, "unchanged", error
        log.warning("%s; using the extractive summary", error)
        notes.append(error)
    except Exception as exc:  # a custom summarizer's bug must not lose the conversation
        error = redact(f"summarizer raised {type(exc).__name__}: {exc}")
        log.warning("%s; using the extractive summary", error)
        notes.append(error)
    text = fallback.summarize(span, previous_summary=previous, focus_topic=focus_topic, budget_tokens=budget)
    return text, "extractive", error
