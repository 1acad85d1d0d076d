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

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ctxengine.facts import Facts
from ctxengine.tokens import estimate

__all__ = ["LEDGER_HEADING", "QUOTE_TOKENS", "LedgerResult", "TextIndex", "apply_ledger", "brief_quote"]

LEDGER_HEADING = "### Preserved facts (verbatim)"

QUOTE_TOKENS = 120
"""A user message longer than this is quoted briefly (:func:`brief_quote`): its first words and
the names of the files it pastes, the rest kept verbatim in the store. A client like aider
pastes whole files into user messages: quoting them whole filled the window with quotes."""

DEFAULT_POINTER = "retrievable verbatim with ctx_grep"
"""What the ledger says about facts it leaves out, unless the engine says otherwise (the
words come from :func:`ctxengine.engines.kit.records.recall_pointer`)."""

_FENCE_RE = re.compile(r"^\s*(```|~~~)")


def brief_quote(text: str, *, tokens: int = QUOTE_TOKENS, pointer: str = DEFAULT_POINTER) -> str:
    """``text`` when it fits ``tokens``; else its first words outside fenced blocks (the user's
    own words, about ``tokens`` of them), the file names its fenced blocks follow (the line
    before each opening fence, as aider and most chat clients paste files) and one bracketed
    line saying how much was left out and where it is (``pointer``). Deterministic."""
    size = estimate(text)
    if size <= tokens:
        return text
    own: list[str] = []
    names: list[str] = []
    fenced = False
    prev = ""
    for line in text.split("\n"):
        if _FENCE_RE.match(line):
            if not fenced and prev.strip() and len(prev.strip()) <= 200:
                name = prev.strip()
                if own and own[-1] == prev:
                    own.pop()
                if name not in names:
                    names.append(name)
            fenced = not fenced
            prev = ""
            continue
        if not fenced:
            own.append(line)
        prev = line
    words = " ".join(" ".join(own).split())
    room = max(40, tokens * 4 - 40)  # characters: about ``tokens`` of prose
    if not names and len(words) <= room:
        return text  # short prose the estimate overcounts: nothing would be left out
    head = words if len(words) <= room else words[:room].rsplit(" ", 1)[0] + " …"
    parts = [head] if head else []
    files = f" of pasted {', '.join(names[:12])}{' …' if len(names) > 12 else ''}" if names else ""
    parts.append(f"[~{max(0, size - estimate(head)):,} tokens{files} left out here: {pointer}]")
    return "\n".join(parts)


@dataclass(slots=True)
class LedgerResult:
    """The summary with the ledger applied, and what was added or left out (by fact kind)."""

    text: str
    added: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    unquoted_users: list[str] = field(default_factory=list)
    """User messages missing from the summary that did not fit the user budget (most recent
    first): the caller keeps them retrievable and says so."""
    briefed_users: list[str] = field(default_factory=list)
    """User messages quoted briefly (:func:`brief_quote`): the caller keeps them retrievable."""

    @property
    def complete(self) -> bool:
        """True when every missing fact fitted."""
        return not any(self.dropped.values())


_TOKEN_RE = re.compile(r"""[^\s,;()\[\]{}<>"'`]+""")
_BARE_RE = re.compile(r"""[^\s,;()\[\]{}<>"'`]*[^\s,;()\[\]{}<>"'`.:!?]""")


class TextIndex:
    """Answers ``fact in text`` for many facts over one text, in about one pass of the text.

    Built once per text: a set of its stripped lines and of its words (split at whitespace, at
    ``,;()[]{}<>`` and quotes, with and without trailing ``.:!?``), collected by C-level
    ``split``/``findall``; or, when the caller already knows facts that occur in the text
    (``keys``: e.g. the facts extracted from its messages), that set. A fact found in the set
    occurs in the text; only a fact not found there is searched for with ``in``. So the cost
    is linear in the text plus the facts, and the per-fact scan is paid only for facts that
    are really missing (the few a compaction adds to the ledger), never for every carried
    fact. Exact: the answer is always that of ``fact in text``.
    """

    __slots__ = ("_keys", "text")

    def __init__(self, text: str, keys: Iterable[str] | None = None) -> None:
        self.text = text
        if keys is not None:
            self._keys = keys if isinstance(keys, set) else set(keys)
            return
        found = set(text.split())
        found.update(_TOKEN_RE.findall(text))
        found.update(_BARE_RE.findall(text))
        found.update(line.strip() for line in text.split("\n"))
        self._keys = found

    def __contains__(self, fact: object) -> bool:
        if not isinstance(fact, str):
            return False
        return fact in self._keys or fact in self.text


def _missing(items: Sequence[str], summary: TextIndex, present: TextIndex | None) -> list[str]:
    return [f for f in items if f not in summary and (present is None or f not in present)]


def _quoted(summary: str) -> set[str]:
    """Texts quoted between ``<<<`` and ``>>>`` lines (the ledger's verbatim user quotes)."""
    out: set[str] = set()
    at = summary.find("<<<\n")
    while at >= 0:
        end = summary.find("\n>>>", at + 4)
        if end < 0:
            break
        out.add(summary[at + 4 : end])
        at = summary.find("<<<\n", end + 4)
    return out


def _quote_users(result: LedgerResult, lines: list[str], users: list[str], user_left: int, quote_tokens: int | None, pointer: str) -> int:
    """Quote ``users`` (most recent first) into ``lines`` within ``user_left`` tokens, briefly
    when longer than ``quote_tokens``; returns the tokens the quotes use."""
    quoted = 0
    used = 0
    user_lines: list[str] = []
    for u in users:
        q = u if quote_tokens is None else brief_quote(u, tokens=quote_tokens, pointer=pointer)
        cost = estimate(q) + 4
        if cost > user_left:
            result.unquoted_users.append(u)
            continue
        user_left -= cost
        used += cost
        quoted += 1
        if q is not u:
            result.briefed_users.append(u)
        user_lines += ["<<<", q, ">>>"]
    if user_lines:
        lines.append("Earlier user messages (verbatim or their first words, most recent first):" if result.briefed_users else "Earlier user messages (verbatim, most recent first):")
        lines += user_lines
    result.added["users"] = quoted
    result.dropped["users"] = len(users) - quoted
    return used


def _take(result: LedgerResult, lines: list[str], left: int, kind: str, items: list[str], title: str, sep: str) -> int:
    """Add the ``items`` of one ``kind`` that fit in ``left`` tokens under ``title``; returns
    the tokens left."""
    kept: list[str] = []
    for f in items:
        cost = estimate(f) + 1
        if cost > left:
            break
        left -= cost
        kept.append(f)
    result.added[kind] = len(kept)
    result.dropped[kind] = len(items) - len(kept)
    if kept and sep == ", ":
        lines.append(f"{title}: " + ", ".join(kept))
    elif kept:
        lines.append(f"{title}:")
        lines.extend(f"- {f}" for f in kept)
    return left


def apply_ledger(
    summary: str,
    required: Facts,
    present: str | TextIndex = "",
    *,
    budget_tokens: int = 4000,
    user_budget_tokens: int = 20_000,
    quote_tokens: int | None = None,
    pointer: str = DEFAULT_POINTER,
) -> LedgerResult:
    """Append the facts of ``required`` missing from ``summary`` and ``present``.

    ``present`` is the text of the messages kept verbatim next to the summary (head, tail), or
    a :class:`TextIndex` of it: a fact found there needs no copy. ``user_budget_tokens`` caps
    the verbatim user quotes (most recent first); they come first, and what they use is taken
    from ``budget_tokens`` for the other facts. The user messages that do not fit are listed
    in :attr:`LedgerResult.unquoted_users` (the caller keeps them retrievable).
    ``quote_tokens``: a user message longer than this is quoted briefly (:func:`brief_quote`;
    listed in :attr:`LedgerResult.briefed_users`); ``None`` quotes whole. ``pointer`` says
    where what is left out is (a recall tool, or the session store when none reaches the model).
    """
    result = LedgerResult(summary)
    left = max(0, budget_tokens)
    lines: list[str] = []
    quoted_already = _quoted(summary)
    index = TextIndex(summary)
    present_index = present if isinstance(present, TextIndex) else (TextIndex(present) if present else None)

    # a user message counts as kept only as a message of its own (not in ``required``) or
    # quoted in the summary: the same words inside an assistant text are not the user's
    users = [u for u in reversed(required.users) if u not in quoted_already and u not in index]
    # user messages are intent: their own budget, not the leftovers of the others
    left = max(0, left - _quote_users(result, lines, users, max(0, user_budget_tokens), quote_tokens, pointer))
    left = _take(result, lines, left, "tools", _missing(required.tools, index, present_index), "Tools used", ", ")
    left = _take(result, lines, left, "errors", _missing(required.errors, index, present_index), "Errors seen", "\n")
    left = _take(result, lines, left, "urls", _missing(required.urls, index, present_index), "URLs", "\n")
    _take(result, lines, left, "paths", _missing(required.paths, index, present_index), "Paths", ", ")
    dropped = sum(result.dropped.values())
    if dropped:
        detail = ", ".join(f"{n} {k}" for k, n in result.dropped.items() if n)
        lines.append(f"(Not shown for lack of space, {pointer}: {detail}.)")
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
