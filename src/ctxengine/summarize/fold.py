"""Folding a span of messages into one summary: the budget, the summary, the fact ledger.

Phase 3 of the ``compressor`` engine (its module docstring), for any engine that replaces a
middle span with a structured summary:

* :func:`summary_budget` — ``content_tokens × 0.20`` clamped to ``[2,000, min(window × 0.05,
  12,000)]``;
* :func:`fold_span` — the summarizer reads the span (earlier summaries become the text to
  update, tool results pruned: :func:`~ctxengine.summarize.assembly.summary_span`); a failed,
  over-long or not-shrinking summary falls back to the deterministic extractive one; the fact
  ledger then appends what the summary and the kept messages miss (older user messages
  verbatim first, the summary shrunk to make room for them), within the room the hard limit
  leaves.

The engine keeps the state between compactions (the previous summary, the facts carried) and
decides what to do with the result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from ctxengine.facts import Facts, extract_facts
from ctxengine.messages import Message
from ctxengine.summarize.assembly import (
    MIN_SHRUNK_SUMMARY,
    bounded,
    fit_ledger,
    run_summarizer,
    summary_span,
)
from ctxengine.summarize.base import Summarizer
from ctxengine.summarize.ledger import DEFAULT_POINTER, QUOTE_TOKENS, LedgerResult
from ctxengine.tokens import estimate

__all__ = [
    "MAX_SUMMARY_TOKENS",
    "MIN_SUMMARY_TOKENS",
    "SUMMARY_RATIO",
    "SUMMARY_WINDOW_RATIO",
    "Folded",
    "fold_span",
    "max_summary_tokens",
    "summary_budget",
]

SUMMARY_RATIO = 0.20
MIN_SUMMARY_TOKENS = 2_000
MAX_SUMMARY_TOKENS = 12_000
SUMMARY_WINDOW_RATIO = 0.05


def max_summary_tokens(context_length: int) -> int:
    """``min(context_length × 0.05, 12,000)``: the ceiling of a summary's budget."""
    return int(min(context_length * SUMMARY_WINDOW_RATIO, MAX_SUMMARY_TOKENS))


def summary_budget(content_tokens: int, context_length: int) -> int:
    """``content_tokens × 0.20`` clamped to ``[2,000, max_summary_tokens]``.

    When the window is so small that the ceiling is under 2,000, the floor wins: a summary
    shorter than that cannot hold the template.
    """
    return max(MIN_SUMMARY_TOKENS, min(int(content_tokens * SUMMARY_RATIO), max_summary_tokens(context_length)))


@dataclass(slots=True)
class Folded:
    """What :func:`fold_span` gave: the summary text with its ledger (``None`` when the
    messages are to be kept unchanged), the fallback used, the summarizer's error, the facts
    the summary must keep from now on, and the user messages it could not quote."""

    text: str | None
    fallback: str | None
    error: str | None
    required: Facts
    unquoted_users: list[str] = field(default_factory=list)


def _more_quoted(ledger: LedgerResult, floor: LedgerResult, notes: list[str], mark: int) -> LedgerResult:
    """``floor`` (the ledger of the summary shrunk to its floor) when it quotes more user
    messages than ``ledger``; else ``ledger``, the notes made since ``mark`` taken back.

    The ledger shrinks the summary by what the quotes need, which is not enough when the kept
    messages alone already left less than no room."""
    if len(floor.unquoted_users) < len(ledger.unquoted_users):
        return floor
    del notes[mark:]
    return ledger


def _note_ledger(ledger: LedgerResult, notes: list[str], pointer: str) -> None:
    """Note the user messages not quoted whole and the facts the ledger had no room for."""
    if ledger.unquoted_users or ledger.briefed_users:
        n, briefed = len(ledger.unquoted_users) + len(ledger.briefed_users), len(ledger.briefed_users)
        notes.append(
            f"{n} older user message(s) not quoted whole in the summary"
            + (f" ({briefed} by their first words and file names)" if briefed else "")
            + f": {pointer}"
        )
    if not ledger.complete:
        detail = ", ".join(f"{n} {k}" for k, n in ledger.dropped.items() if n)
        notes.append(f"fact ledger out of space: {detail} not in the summary ({pointer})")


def fold_span(
    middle: list[Message],
    kept: Sequence[Message],
    *,
    previous: str | None,
    carried: Facts,
    summarizer: Summarizer,
    fallback: Summarizer,
    focus_topic: str | None,
    budget: int,
    content_tokens: int,
    tokens_of: Callable[[Message], int],
    facts_of: Callable[[Message], Facts],
    hard_limit: int,
    context_length: int,
    min_output_tokens: int,
    over_hard_limit: bool,
    abort_on_failure: bool,
    notes: list[str],
    log: logging.Logger,
    quote_budget: int | None = None,
    pointer: str = DEFAULT_POINTER,
) -> Folded:
    """Summarize ``middle`` (``content_tokens`` of it) next to the ``kept`` messages.

    ``previous`` is the last summary (an earlier summary found in ``middle`` is used when it
    is ``None``); ``carried`` the facts it had to keep. The summary is bounded to ``budget``;
    ``over_hard_limit`` and ``abort_on_failure`` decide what a failure does
    (:func:`~ctxengine.summarize.assembly.run_summarizer`); the ledger fits the hard limit and
    the window, tool outputs in ``kept`` counted at ``min_output_tokens`` at least, and the
    summary with its ledger stays within ``budget`` (the quotes within ``quote_budget``, each
    at most :data:`~ctxengine.summarize.ledger.QUOTE_TOKENS`: longer user messages are quoted by
    their first words and file names, the rest retrievable). ``pointer`` is what the summary
    says about what it leaves out (no recall tool named when none reaches the model). What
    happened goes to ``notes``.
    """
    span, previous, facts = summary_span(middle, previous, facts_of)
    required = _required_facts(facts, carried, previous)
    summary, used, error = run_summarizer(
        summarizer, fallback, span, previous, focus_topic, budget,
        over_hard_limit=over_hard_limit, abort_on_failure=abort_on_failure, notes=notes, log=log,
    )
    if summary is None:  # authentication failed below the hard limit (or abort): keep all
        return Folded(None, used, error, required)
    text = _SummaryText(span, previous, focus_topic, fallback, budget, notes)
    summary, used = text.bounded(summary, used, content_tokens)
    ledger_of = partial(
        fit_ledger, required=required, kept=kept, tokens_of=tokens_of, facts_of=facts_of,
        hard_limit=hard_limit, context_length=context_length, min_output_tokens=min_output_tokens,
        shrink=text.shrink, budget=budget, quote_budget=quote_budget, quote_tokens=QUOTE_TOKENS,
        pointer=pointer,
    )
    ledger = text.with_ledger(summary, ledger_of, quote_budget)
    _note_ledger(ledger, notes, pointer)
    return Folded(ledger.text.strip(), used, error, required, [*ledger.unquoted_users, *ledger.briefed_users])


def _required_facts(facts: Facts, carried: Facts, previous: str | None) -> Facts:
    """The facts the summary must keep: those of the span, those ``carried`` from earlier
    compactions and, when none were carried, those of the ``previous`` summary."""
    required = facts.merge(carried)
    if previous is not None and not carried.all():
        required = required.merge(extract_facts([{"role": "assistant", "content": previous}], include_users=False))
    return required


@dataclass(slots=True)
class _SummaryText:
    """The summarizer's text made a summary of ``span``: bounded to ``budget`` (the extractive
    summary of the span filling in), replaced when it does not shrink what it replaces, then
    given its fact ledger. What happened goes to ``notes``."""

    span: list[Message]
    previous: str | None
    focus_topic: str | None
    fallback: Summarizer
    budget: int
    notes: list[str]

    def extractive(self, tokens: int) -> str:
        """The deterministic summary of the span within ``tokens``."""
        return self.fallback.summarize(self.span, previous_summary=self.previous, focus_topic=self.focus_topic, budget_tokens=tokens)

    def shrink(self, text: str, tokens: int) -> str:
        """``text`` bounded to ``tokens`` (:func:`~ctxengine.summarize.assembly.bounded`)."""
        return bounded(text, tokens, self.extractive, self.notes)

    def bounded(self, summary: str, used: str | None, content_tokens: int) -> tuple[str, str | None]:
        """``summary`` within the budget, and the fallback used (``used`` unless replaced)."""
        summary = self.shrink(summary, self.budget)
        if used is None and estimate(summary) >= content_tokens > 0:
            # a summary that does not shrink what it replaces is no summary: extractive instead
            self.notes.append(f"summary of {estimate(summary):,} tokens does not shrink the {content_tokens:,} it replaces: extractive summary used")
            return self.extractive(self.budget), "extractive"
        return summary, used

    def with_ledger(self, summary: str, ledger_of: Callable[[str], LedgerResult], quote_budget: int | None) -> LedgerResult:
        """The ledger of ``summary``; of the summary shrunk to its floor instead when that
        quotes more user messages (:func:`_more_quoted`)."""
        ledger = ledger_of(summary)
        # with a quote budget the ledger shares the summary's budget (fit_ledger): the prose
        # shrinks to its floor only when not one user message could be quoted (the kept
        # messages left no room), never to squeeze in more quotes
        if ledger.unquoted_users and estimate(summary) > MIN_SHRUNK_SUMMARY and (quote_budget is None or not ledger.added.get("users")):
            # the user's words come before the summary's prose: it shrinks to its floor, kept only
            # if more user messages fit (see _more_quoted)
            mark = len(self.notes)
            ledger = _more_quoted(ledger, ledger_of(self.shrink(summary, MIN_SHRUNK_SUMMARY)), self.notes, mark)
        return ledger
