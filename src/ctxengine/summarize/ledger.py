"""The fact ledger: what a summary must still say after the span it replaces is gone.

Any summary (from an LLM or the extractive summarizer) is checked against the
preservation-guarantee facts (:mod:`ctxengine.facts`) of the span it replaces or prunes:
user messages, tool names, error lines, URLs and file paths. Each fact that appears neither in
the summary nor in the rest of the context is appended verbatim under ``## Critical Context``,
so the guarantee holds whatever the model wrote.

The ledger has a token budget: a compaction that has to fit a window cannot keep every path of
a recursive listing. Facts are added by priority (user messages most recent first, then tool
names, errors, URLs, paths in order of appearance); what does not fit is counted in
:attr:`LedgerResult.dropped` so the caller can report it honestly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ctxengine.facts import Facts
from ctxengine.tokens import estimate

__all__ = ["LEDGER_HEADING", "LedgerResult", "apply_ledger"]

LEDGER_HEADING = "### Preserved facts (verbatim)"


@dataclass(slots=True)
class LedgerResult:
    """The summary with the ledger applied, and what was added or left out (by fact kind)."""

    text: str
    added: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    tokens: int = 0

    @property
    def complete(self) -> bool:
        """True when every missing fact fitted."""
        return not any(self.dropped.values())


def _missing(items: Sequence[str], summary: str, present: str) -> list[str]:
    return [f for f in items if f not in summary and f not in present]



def apply_ledger(
    summary: str,
    required: Facts,
    present: str = "",
    *,
    budget_tokens: int = 4000,
    user_budget_tokens: int = 20_000,
) -> LedgerResult:
    """Append the facts of ``required`` missing from ``summary`` and ``present``.

    ``present`` is the text of the messages kept verbatim next to the summary (head, tail):
    a fact found there needs no copy. ``user_budget_tokens`` caps the verbatim user quotes
    (most recent first); they come first, and what they use is taken from ``budget_tokens``
    for the other facts.
    """
    result = LedgerResult(summary)
    left = max(0, budget_tokens)
    lines: list[str] = []

    # a user message counts as kept only as a message of its own (not in ``required``) or
    # quoted in the summary: the same words inside an assistant text are not the user's
    users = _missing(list(reversed(required.users)), summary, "")
    quoted = 0
    # user messages are intent: their own budget, not the leftovers of the others
    user_left = max(0, user_budget_tokens)
    user_lines: list[str] = []
    for u in users:
        cost = estimate(u) + 4
        if cost > user_left:
            continue
        user_left -= cost
        left = max(0, left - cost)
        quoted += 1
        user_lines += ["<<<", u, ">>>"]
    if user_lines:
        lines.append("Earlier user messages (verbatim, most recent first):")
        lines += user_lines
    result.added["users"] = quoted
    result.dropped["users"] = len(users) - quoted

    def take(kind: str, items: list[str], title: str, sep: str) -> None:
        nonlocal left
        kept: list[str] = []
        for f in items:
            cost = estimate(f) + 1
            if cost > left:
                break
            left -= cost
            kept.append(f)
        result.added[kind] = len(kept)
        result.dropped[kind] = len(items) - len(kept)
        if not kept:
            return
        if sep == ", ":
            lines.append(f"{title}: " + ", ".join(kept))
        else:
            lines.append(f"{title}:")
            lines.extend(f"- {f}" for f in kept)

    take("tools", _missing(required.tools, summary, present), "Tools used", ", ")
    take("errors", _missing(required.errors, summary, present), "Errors seen", "\n")
    take("urls", _missing(required.urls, summary, present), "URLs", "\n")
    take("paths", _missing(required.paths, summary, present), "Paths", ", ")
    dropped = sum(result.dropped.values())
    if dropped:
        detail = ", ".join(f"{n} {k}" for k, n in result.dropped.items() if n)
        lines.append(f"(Not shown for lack of space: {detail}.)")
    if not lines:
        result.tokens = estimate(summary)
        return result
    block = "\n".join([LEDGER_HEADING, *lines])
    result.text = _insert_critical(summary, block)
    result.tokens = estimate(result.text)
    return result


def _insert_critical(summary: str, block: str) -> str:
    marker = "## Critical Context"
    at = summary.find(marker)
    if at < 0:
        return summary.rstrip() + f"\n\n{marker}\n{block}\n"
    nxt = summary.find("\n## ", at + len(marker))
    if nxt < 0:
        return summary.rstrip() + "\n" + block + "\n"
    return summary[:nxt].rstrip() + "\n" + block + "\n" + summary[nxt:]
