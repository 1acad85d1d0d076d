"""Cut one tool output to a token budget: the one head/tail function every engine and the
kernel's window cap use.

A cut keeps, within ``budget_tokens``:

1. one marker line in the record namespace naming ``ref`` so recall can expand it::

       [ctxengine:cut ref=a1b2: 896 of 905 lines removed after line 6 (~30,120 tokens); ctx_expand ref=a1b2]

   with, when facts were left out, what to search for them (``…; 212 more facts not listed,
   e.g. Foo.java, IOException, repo.maven.org; ctx_grep a name; …``);

2. the first and last lines of the output (about two head lines per tail line; a line longer
   than ``line_chars`` keeps its start and says how many characters it lost). An output that
   opens with a harness's header (``Key: value`` lines through a line that opens the body, as
   Codex's ``Chunk ID: … / Wall time: … / Process exited with code 0 / Original token count:
   … / Output:``, and the notes that follow it up to a blank line, e.g. ``Total output lines:
   189``) keeps that header as one line (:func:`harness_header`), and the head and tail lines
   are the body's: a cut never ends inside the header, before the output itself begins;
3. a facts block (:mod:`ctxengine.engines.kit.blocks`) with the paths, URLs and error lines of
   the removed text verbatim, errors first, as far as the budget allows; the marker says how
   many were left out (they stay retrievable from the store through ``ref``).

When the facts of the removed text are few, the lines get the room they leave; otherwise lines
and facts share the budget half and half. An output that already fits is returned unchanged.
Deterministic: the same arguments give the same text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ctxengine.engines.kit.blocks import fit_facts, render_facts, search_names, unseen
from ctxengine.engines.kit.records import GREP_TOOL, header, recall_pointer
from ctxengine.facts import FactMemo, Facts, error_lines, paths_in, urls_in
from ctxengine.tokens import TokenCounter, estimate

__all__ = ["HEADER_MAX_LINES", "LINE_CHARS", "cut_output", "harness_header", "header_lines"]

LINE_CHARS = 240
"""Kept lines longer than this keep their first LINE_CHARS characters: one line can hold a
whole minified file (the data has 96K-character lines)."""


HEADER_MAX_LINES = 10
"""A leading header longer than this is taken as the output itself."""

_HEADER_LINE = re.compile(r"[A-Z][A-Za-z0-9 _/()-]{0,40}:(?:[ \t].*)?")
_BODY_OPENS = re.compile(r"[A-Z][A-Za-z0-9 _/()-]{0,40}:")
_HEADER_CHARS = 160


def header_lines(lines: list[str]) -> int:
    """How many lines of ``lines`` form a harness's leading header: short lines through the
    line that opens the body (a key with no value, e.g. ``Output:``), then the notes that follow
    it (``Key: value`` lines) and one blank line after them; 0 when there is none."""
    opened = 0
    for i, line in enumerate(lines[:HEADER_MAX_LINES]):
        bare = line.rstrip()
        if not opened:
            if not bare or len(bare) > _HEADER_CHARS:
                return 0
            if _BODY_OPENS.fullmatch(bare):
                opened = i + 1
        elif not bare:
            return i + 1
        elif not _HEADER_LINE.fullmatch(bare):
            return opened
    return opened


def harness_header(text: str, line_chars: int = 240) -> str | None:
    """The header a cut of ``text`` keeps (:func:`header_lines`, on one line), or None."""
    lines = text.split("\n", HEADER_MAX_LINES)
    n = header_lines(lines)
    if not n:
        return None
    return _cap(" | ".join(x.strip() for x in lines[:n] if x.strip()), line_chars)


def _cap(line: str, n: int) -> str:
    if len(line) <= n:
        return line
    return f"{line[:n]}…[+{len(line) - n} chars]"


def _marker(ref: str | None, removed: int, total: int, after: int, tokens: int, unlisted: int, recall: bool = True, names: list[str] | None = None) -> str:
    detail = f"{removed:,} of {total:,} lines removed"
    if after:
        detail += f" after line {after:,}"
    detail += f" (~{tokens:,} tokens)"
    if unlisted:
        detail += f"; {unlisted:,} more facts not listed"
        if names:
            detail += f", e.g. {', '.join(names)}"
            if recall:
                detail += f"; {GREP_TOOL} a name"
    if ref is not None:
        detail += f"; {recall_pointer(recall, ref)}"
    return header("cut", detail, ref=ref)


def cut_output(
    text: str,
    *,
    budget_tokens: int,
    ref: str | None = None,
    counter: TokenCounter | None = None,
    head_lines: int | None = None,
    tail_lines: int | None = None,
    line_chars: int = LINE_CHARS,
    known: set[str] | frozenset[str] | None = None,
    memo: FactMemo | None = None,
    recall: bool = True,
) -> str:
    """``text`` cut to ``budget_tokens`` (see the module docstring); unchanged when it fits.

    ``counter`` measures tokens (default: :func:`ctxengine.tokens.estimate`). ``head_lines``
    and ``tail_lines`` cap how many lines each end keeps (default: as many as fit); facts in
    ``known`` (shown elsewhere in the context, e.g. by an earlier record) are not listed again;
    ``memo`` (the engine's :class:`~ctxengine.facts.FactMemo`) answers for texts scanned before;
    ``recall`` False: the marker names no recall tool (they do not reach the model:
    :func:`~ctxengine.engines.kit.records.recall_pointer`). The result
    never exceeds the budget, except when the budget cannot hold even the marker line: then
    the shorter of the marker alone and ``text`` is returned (the marker is the least a cut
    leaves). Raises ValueError for a
    negative budget or a non-string text.
    """
    if not isinstance(text, str):
        raise ValueError(f"cut_output needs the output's text (str), not {type(text).__name__}")
    if budget_tokens < 0:
        raise ValueError(f"budget_tokens must be >= 0, not {budget_tokens}")
    count: Callable[[str], int] = counter.count if counter is not None else estimate
    total_tokens = count(text)
    if total_tokens <= budget_tokens:
        return text
    lines = text.split("\n")
    if memo is not None:
        found = Facts([], memo.paths(text), memo.urls(text), [], memo.errors(text))
    else:
        found = Facts([], paths_in(text), urls_in(text), [], error_lines(text))
    facts = unseen(found, known=known)
    cut = _Cut(text, lines, budget_tokens, count, total_tokens, facts, ref=ref, recall=recall, line_chars=line_chars)
    return cut.run(head_lines, tail_lines)


@dataclass(frozen=True, slots=True)
class _Kept:
    """The lines one try of a cut keeps (``head`` the lead and head lines, ``tail`` the tail
    lines), how many lines it removes after line ``after``, and the facts those lines held."""

    head: list[str]
    tail: list[str]
    removed: int
    after: int
    lost: Facts


class _Cut:
    """One cut of an output over its budget: the output's lines and facts, the budget, the
    terms of its marker. :meth:`run` gives the text."""

    def __init__(self, text: str, lines: list[str], budget: int, count: Callable[[str], int], total_tokens: int, facts: Facts, *, ref: str | None, recall: bool, line_chars: int) -> None:
        self.text = text
        self.lines = lines
        self.budget = budget
        self.count = count
        self.total_tokens = total_tokens
        self.facts = facts
        self.ref = ref
        self.recall = recall
        self.line_chars = line_chars

    def marker(self, removed: int, after: int, unlisted: int, names: list[str] | None = None) -> str:
        """The marker line: ``removed`` lines gone after line ``after``, ``unlisted`` facts."""
        return _marker(self.ref, removed, len(self.lines), after, self.total_tokens, unlisted, self.recall, names)

    def run(self, head_lines: int | None, tail_lines: int | None) -> str:
        """The cut: the marker, the header, head and tail lines and the facts within the budget;
        the marker alone (or the text, when shorter) when the budget cannot hold more."""
        lines, n, n_facts, count = self.lines, len(self.lines), len(self.facts), self.count
        # the marker with the largest numbers it can show: the real one is never longer
        rest = self.budget - (count(self.marker(n, n, n_facts, search_names(self.facts))) + 1)
        if rest <= 0:
            floor = self.marker(n, 0, n_facts)
            return floor if count(floor) < self.total_tokens else self.text
        block_all = sum(count(f) + 1 for f in self.facts.all()) + (8 if n_facts else 0)
        line_budget = rest - block_all if block_all <= rest // 2 else rest // 2
        lead, lead_n = _lead(lines, line_budget, count, self.line_chars)
        line_budget -= sum(count(x) + 1 for x in lead)
        head, tail = _choose_lines(lines[lead_n:], line_budget, count, head_lines, tail_lines, self.line_chars)
        return self.fit(lead, lead_n, head, tail, rest)

    def fit(self, lead: list[str], lead_n: int, head: int, tail: int, rest: int) -> str:
        """The cut keeping ``lead`` (for the first ``lead_n`` lines), ``head`` and ``tail`` body
        lines and the facts ``rest`` tokens leave room for, measured whole: while over the
        budget it gives up a tail line, else a head line, else the header, else facts' room."""
        body = self.lines[lead_n:]
        while True:
            kept = self.kept(lead, lead_n, body, head, tail)
            used = sum(self.count(x) + 1 for x in kept.head) + sum(self.count(x) + 1 for x in kept.tail)
            chosen, unlisted = fit_facts(kept.lost, max(0, rest - used), count=self.count)
            out = self.assembled(kept, chosen, unlisted)
            if self.count(out) <= self.budget:
                return self.topped_up(out, kept, chosen, unlisted)
            if head == 0 and tail == 0 and not len(chosen):
                if lead:  # the header alone does not fit: the marker and facts without it
                    lead, lead_n = [], 0
                    body = self.lines
                    continue
                return out
            # the sum of parts undercounted the whole (a tokenizer merging across lines): give up
            # a tail line, else a head line, else facts, and measure again
            if tail:
                tail -= 1
            elif head:
                head -= 1
            else:
                rest -= max(1, self.count(out) - self.budget)

    def kept(self, lead: list[str], lead_n: int, body: list[str], head: int, tail: int) -> _Kept:
        """The lines one try keeps: the ``lead``, the first ``head`` and last ``tail`` of ``body``."""
        kept = [*lead, *(_cap(x, self.line_chars) for x in body[:head])]
        kept_tail = [_cap(x, self.line_chars) for x in body[len(body) - tail :]] if tail else []
        lost = unseen(self.facts, "\n".join([*kept, *kept_tail]))
        return _Kept(kept, kept_tail, len(body) - head - tail, lead_n + head, lost)

    def assembled(self, kept: _Kept, chosen: Facts, unlisted: int) -> str:
        """The cut's text: the marker, the ``kept`` lines, the ``chosen`` facts."""
        marker = self.marker(kept.removed, kept.after, unlisted, _left_out(kept.lost, chosen))
        return _assemble(marker, kept.head, kept.tail, chosen)

    def topped_up(self, out: str, kept: _Kept, chosen: Facts, unlisted: int) -> str:
        """``out`` with more facts while the real slack holds them: the per-fact costs
        :func:`fit_facts` goes by are upper bounds."""
        for _ in range(3):
            slack = self.budget - self.count(out)
            if not unlisted or slack <= 2:
                break
            more, _ = fit_facts(unseen(kept.lost, "\n".join(chosen.all())), slack, count=self.count)
            if not len(more):
                break
            bigger = chosen.merge(more)
            left = unlisted - len(more)
            trial = self.assembled(kept, bigger, left)
            if self.count(trial) > self.budget:
                break
            out, chosen, unlisted = trial, bigger, left
        return out


def _lead(lines: list[str], budget: int, count: Callable[[str], int], line_chars: int) -> tuple[list[str], int]:
    """The harness header a cut keeps (one line, :func:`header_lines`) and how many lines it
    stands for; none when there is no header or it would take more than half of ``budget``."""
    n = header_lines(lines)
    if not n:
        return [], 0
    line = _cap(" | ".join(x.strip() for x in lines[:n] if x.strip()), line_chars)
    if (count(line) + 1) * 2 > budget:
        return [], 0
    return [line], n


def _left_out(lost: Facts, chosen: Facts) -> list[str]:
    """Names an agent would search for to find the facts ``lost`` holds and ``chosen`` does not."""
    listed = set(chosen.all())
    rest = Facts([], [p for p in lost.paths if p not in listed], [u for u in lost.urls if u not in listed], [], [e for e in lost.errors if e not in listed])
    return search_names(rest)


def _choose_lines(
    lines: list[str],
    budget: int,
    count: Callable[[str], int],
    head_max: int | None,
    tail_max: int | None,
    line_chars: int,
) -> tuple[int, int]:
    """How many head and tail lines fit ``budget`` (two head lines per tail line)."""
    n = len(lines)
    hmax = n if head_max is None else max(0, head_max)
    tmax = n if tail_max is None else max(0, tail_max)
    head = tail = 0
    used = 0
    head_open = hmax > 0
    tail_open = tmax > 0
    while (head_open or tail_open) and head + tail < n:
        take_head = head_open and (not tail_open or head < 2 * (tail + 1))
        if take_head:
            cost = count(_cap(lines[head], line_chars)) + 1
            if used + cost > budget or head >= hmax:
                head_open = False
                continue
            head += 1
        else:
            cost = count(_cap(lines[n - 1 - tail], line_chars)) + 1
            if used + cost > budget or tail >= tmax:
                tail_open = False
                continue
            tail += 1
        used += cost
    return head, tail


def _assemble(marker: str, kept: list[str], kept_tail: list[str], facts: Facts) -> str:
    return "\n".join([marker, *kept, *kept_tail, *render_facts(facts)])
