"""Digests: turns folded into what was done and what was seen.

One deterministic digest for every engine that folds turns (``cacheaware`` in batches,
``lcm`` as the body of a summary node): user messages verbatim (they are the task; a caller
folding a finished task may show their beginning only),
then each action as ``- tool: command line``, the names its outputs gave the agent that it is
most likely to use again (:mod:`.names`, within ``name_tokens``), then a facts block (:mod:`.blocks`) of the paths,
URLs and error lines within ``fact_tokens``, then the first line of assistant messages while
the digest stays within ``budget_tokens``. What is not shown is counted in a last line that
points at recall.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ctxengine.engines.kit.blocks import fit_facts, render_facts, search_names, unseen
from ctxengine.engines.kit.names import NAMES_PREFIX, fit_names, ranked_names
from ctxengine.facts import FactMemo, Facts, extract_facts
from ctxengine.messages import Message, content_text, is_summary, tool_call_name, tool_calls
from ctxengine.tokens import estimate

__all__ = ["ACTION_CHARS", "SHARED_FACTS", "actions", "digest"]

ACTION_CHARS = 160
"""Characters of a tool call's arguments an action line shows (the rest is retrievable)."""


def actions(span: Sequence[Message], max_chars: int = ACTION_CHARS) -> list[str]:
    """``tool: arguments`` for every tool call of ``span`` (whitespace collapsed, capped)."""
    out: list[str] = []
    for m in span:
        for c in tool_calls(m):
            fn = c.get("function") or {}
            args = fn.get("arguments") if isinstance(fn, dict) else ""
            if not isinstance(args, str):
                args = json.dumps(args, ensure_ascii=False)
            try:
                parsed = json.loads(args) if args.strip().startswith("{") else None
            except ValueError:
                parsed = None
            if isinstance(parsed, dict) and len(parsed) == 1:
                only = next(iter(parsed.values()))
                if isinstance(only, str):
                    args = only  # {"command": "open Foo.java"} reads as the command line
            line = " ".join(args.split())
            if len(line) > max_chars:
                line = line[:max_chars] + "…"
            out.append(f"{tool_call_name(c)}: {line}")
    return out


def _clip(text: str, chars: int | None) -> str:
    if chars is None:
        return text
    flat = " ".join(text.split())
    return flat if len(flat) <= chars else flat[:chars] + "…"


SHARED_FACTS = FactMemo()
"""The facts of the texts digests were made of, for every engine of the process: an engine
folds the copy of its context it is given on each call, whose strings are the caller's, and
folds a run a second time when the first pass did not get under its target."""


def _assistant_notes(span: Sequence[Message], room: int) -> tuple[list[str], int]:
    """The first line of each assistant message of ``span`` (200 characters at most) within
    ``room`` tokens, in order, and how many did not fit."""
    notes: list[str] = []
    skipped = used = 0
    for m in span:
        if m.get("role") != "assistant" or is_summary(m):
            continue
        first = next((ln.strip() for ln in content_text(m.get("content")).splitlines() if ln.strip()), "")
        if not first:
            continue
        cost = estimate(first[:200]) + 3
        if used + cost > room:
            skipped += 1
            continue
        notes.append(f"- {first[:200]}")
        used += cost
    return notes, skipped


def digest(
    span: Sequence[Message],
    *,
    budget_tokens: int,
    fact_tokens: int | None,
    facts: Facts | None = None,
    recall_hint: str = "ctx_grep",
    memo: FactMemo | None = None,
    user_chars: int | None = None,
    name_tokens: int = 0,
    context: Sequence[Message] = (),
) -> str:
    """The digest of ``span`` (see the module docstring). ``fact_tokens`` ``None`` lists every
    fact (no store: facts stay in context). ``memo``: where the facts of long texts are
    remembered (default :data:`SHARED_FACTS`), so each is scanned once. ``user_chars``: user
    messages are shown by their first ``user_chars`` characters (whitespace collapsed; the
    originals stay in the store) instead of verbatim. ``name_tokens``: room for a ``Names:`` line
    of the names the folded outputs gave the agent, ranked by how likely it uses them again
    (:mod:`.names`; ``context``: the conversation around ``span``, read for what the agent and
    the user named there)."""
    if facts is None:
        # records folded again still hold facts (their blocks and kept lines)
        facts = extract_facts(span, memo=SHARED_FACTS if memo is None else memo)
    lines: list[str] = []
    for m in span:
        if is_summary(m) and m.get("role") != "tool":
            lines.append("Earlier: " + content_text(m.get("content")).split("\n", 1)[0][:300])
    users = dict.fromkeys(content_text(m.get("content")) for m in span if m.get("role") == "user" and not is_summary(m))
    lines += [f"User: {_clip(u, user_chars)}" for u in users if u]
    acts = actions(span)
    if acts:
        lines += ["Actions:", *(f"- {a}" for a in acts)]
    shown = "\n".join(lines)
    tools = [t for t in facts.tools if t not in shown]
    if tools:
        lines.append("Tools: " + ", ".join(tools))
    candidates = unseen(facts, shown)
    chosen, dropped = fit_facts(candidates, fact_tokens)
    # the facts left out are named by what an agent would search for (the pointer's room is
    # kept out of the notes' budget)
    names = search_names(unseen(candidates, "\n".join(chosen.all()))) if dropped else []
    reserve = 8 + (estimate(", ".join(names)) + 4 if names else 0)
    block = render_facts(chosen)
    if name_tokens > 0:
        picked = fit_names(ranked_names(span, shown="\n".join([*lines, *block]), context=context), name_tokens, estimate)
        if picked:
            lines.append(NAMES_PREFIX + ", ".join(picked))
    used = sum(estimate(x) + 1 for x in [*lines, *block])
    notes, skipped = _assistant_notes(span, budget_tokens - reserve - used)
    if notes:
        lines += ["Assistant:", *notes]
    if dropped or skipped:
        what = [f"{dropped} facts"] if dropped else []
        if names:
            what[0] += f" (e.g. {', '.join(names)})"
        if skipped:
            what.append(f"{skipped} assistant notes")
        lines.append(f"[not shown here: {', '.join(what)}; {recall_hint} finds them]")
    return "\n".join([*lines, *block])
