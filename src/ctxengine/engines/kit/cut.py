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
    n = len(lines)
    if memo is not None:
        found = Facts([], memo.paths(text), memo.urls(text), [], memo.errors(text))
    else:
        found = Facts([], paths_in(text), urls_in(text), [], error_lines(text))
    all_facts = unseen(found, known=known)
    n_facts = len(all_facts)
    # the marker with the largest numbers it can show: the real one is never longer
    marker_cost = count(_marker(ref, n, n, n, total_tokens, n_facts, recall, search_names(all_facts))) + 1
    rest = budget_tokens - marker_cost
    if rest <= 0:
        floor = _marker(ref, n, n, 0, total_tokens, n_facts, recall)
        return floor if count(floor) < total_tokens else text

    block_all = sum(count(f) + 1 for f in all_facts.all()) + (8 if n_facts else 0)
    line_budget = rest - block_all if block_all <= rest // 2 else rest // 2
    lead, lead_n = _lead(lines, line_budget, count, line_chars)
    body = lines[lead_n:]
    nb = len(body)
    line_budget -= sum(count(x) + 1 for x in lead)
    head, tail = _choose_lines(body, line_budget, count, head_lines, tail_lines, line_chars)
    while True:
        kept = [*lead, *(_cap(x, line_chars) for x in body[:head])]
        kept_tail = [_cap(x, line_chars) for x in body[nb - tail :]] if tail else []
        kept_text = "\n".join([*kept, *kept_tail])
        removed = nb - head - tail
        lost = unseen(all_facts, kept_text)
        used = sum(count(x) + 1 for x in kept) + sum(count(x) + 1 for x in kept_tail)
        chosen, unlisted = fit_facts(lost, max(0, rest - used), count=count)
        out = _assemble(_marker(ref, removed, n, lead_n + head, total_tokens, unlisted, recall, _left_out(lost, chosen)), kept, kept_tail, chosen)
        if count(out) <= budget_tokens:
            # the per-fact costs are upper bounds: top up with facts the real slack still holds
            for _ in range(3):
                slack = budget_tokens - count(out)
                if not unlisted or slack <= 2:
                    break
                more, _ = fit_facts(unseen(lost, "\n".join(chosen.all())), slack, count=count)
                if not len(more):
                    break
                bigger = chosen.merge(more)
                left = unlisted - len(more)
                trial = _assemble(_marker(ref, removed, n, lead_n + head, total_tokens, left, recall, _left_out(lost, bigger)), kept, kept_tail, bigger)
                if count(trial) > budget_tokens:
                    break
                out, chosen, unlisted = trial, bigger, left
            return out
        if head == 0 and tail == 0 and not len(chosen):
            if lead:  # the header alone does not fit: the marker and facts without it
                lead, lead_n = [], 0
                body, nb = lines, n
                continue
            return out
        # the sum of parts undercounted the whole (a tokenizer merging across lines): give up
        # a tail line, else a head line, else facts, and measure again
        if tail:
            tail -= 1
        elif head:
            head -= 1
        else:
            rest -= max(1, count(out) - budget_tokens)


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
