#!/usr/bin/env python
"""A synthetic aider-like session driven through ``ContextManager.prepare(..., recall=False)``.

aider 0.86 (DESIGN §3.12) sends no tools, always the same first exchange (its example), user
messages that paste whole files (``path`` then a fenced block) and assistant replies made of
SEARCH/REPLACE edit blocks; it resends the whole history every turn. :func:`aider_session`
builds such a history (deterministic for a seed); :func:`measure` replays it turn by turn the
way the proxy does (the raw history each turn, a store, ``recall=False``) and reports:

* input tokens sent against sending everything (saved share);
* turns that compacted, turns the window cap cut, the longest run of cut turns in a row;
* the largest summary (tokens, against the summary budget's ceiling);
* requests over the window, invalid requests, summaries or markers naming a recall tool.

Usage::

    python scripts/aider_session.py [--windows 16000,24000,40000] [--turns 36] [--seed 1] [--reminder] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from ctxengine.config import Config
from ctxengine.manager import ContextManager
from ctxengine.messages import Message, content_text, is_summary, validate
from ctxengine.store.sqlite import SqliteStore
from ctxengine.summarize.assembly import split_summary
from ctxengine.summarize.fold import summary_budget
from ctxengine.tokens import estimate

__all__ = ["REMINDER", "AiderRun", "aider_session", "measure", "with_reminder"]

SYSTEM = (
    "Act as an expert software developer.\nAlways use best practices when coding.\n"
    "Respect and use existing conventions, libraries, etc that are already present in the code base.\n"
    "Take requests for changes to the supplied code.\nIf the request is ambiguous, ask questions.\n\n"
    "Once you understand the request you MUST:\n1. Decide if you need to propose *SEARCH/REPLACE* edits to any files.\n"
    "2. Think step-by-step and explain the needed changes in a few short sentences.\n"
    "3. Describe each change with a *SEARCH/REPLACE block* per the examples below.\n\n"
    "# *SEARCH/REPLACE block* Rules:\nEvery *SEARCH/REPLACE block* must use this format:\n"
    "1. The *FULL* file path alone on a line, verbatim.\n2. The opening fence and code language.\n"
    "3. The start of search block: <<<<<<< SEARCH\n4. A contiguous chunk of lines to search for in the existing source code\n"
    "5. The dividing line: =======\n6. The lines to replace into the source code\n7. The end of the replace block: >>>>>>> REPLACE\n"
)
EXAMPLE_USER = "Change get_factorial() to use math.factorial"
EXAMPLE_ASSISTANT = (
    "To make this change we need to modify `mathweb/flask/app.py` to:\n\n"
    "1. Import the math package.\n2. Remove the existing factorial() function.\n3. Update get_factorial() to call math.factorial instead.\n\n"
    "Here are the *SEARCH/REPLACE* blocks:\n\nmathweb/flask/app.py\n```python\n<<<<<<< SEARCH\nfrom flask import Flask\n=======\n"
    "import math\nfrom flask import Flask\n>>>>>>> REPLACE\n```\n"
)
_WORDS = ["value", "result", "config", "handler", "request", "session", "cache", "token", "window", "parser", "buffer", "index", "record", "client", "server"]
_ASKS = [
    "Add input validation to {f} and raise ValueError on a bad {w}.",
    "Refactor the {w} handling in {f} so it never mutates its argument.",
    "There is a bug in {f}: the {w} is read twice. Fix it and keep the public API.",
    "Please add a docstring and type hints to every function in {f}.",
    "Make {f} log the {w} at debug level instead of printing it.",
    "Rename the {w} helper in {f} to something clearer and update its callers.",
]


def _file(rng: random.Random, path: str, tokens: int) -> str:
    lines = [f'"""Module {path}."""', "", "import logging", ""]
    n = 0
    while estimate("\n".join(lines)) < tokens:
        n += 1
        w = rng.choice(_WORDS)
        lines += [
            f"def {w}_{n}(data, limit={rng.randint(1, 99)}):",
            f'    """Return the {w} of data, at most limit items."""',
            "    out = [x for x in data if x is not None][:limit]",
            f"    logging.getLogger(__name__).debug('{w} %d', len(out))",
            "    return out",
            "",
        ]
    return "\n".join(lines)


def _edit(rng: random.Random, path: str) -> str:
    w = rng.choice(_WORDS)
    return (
        f"{path}\n```python\n<<<<<<< SEARCH\n    out = [x for x in data if x is not None][:limit]\n=======\n"
        f"    if limit < 0:\n        raise ValueError('bad {w}')\n    out = [x for x in data if x is not None][:limit]\n>>>>>>> REPLACE\n```\n"
    )


def aider_session(turns: int = 36, *, seed: int = 1) -> list[Message]:
    """The whole history of an aider-like session: system prompt, the fixed example exchange,
    then ``turns`` user turns (a request pasting 1–3 files of 1–4K tokens) each answered by a
    SEARCH/REPLACE reply. Deterministic for a seed."""
    rng = random.Random(seed)
    files = [f"src/pkg/{rng.choice(_WORDS)}_{i}.py" for i in range(12)]
    sizes = {f: rng.randint(1000, 4000) for f in files}
    out: list[Message] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": EXAMPLE_USER},
        {"role": "assistant", "content": EXAMPLE_ASSISTANT},
    ]
    for t in range(turns):
        chosen = rng.sample(files, rng.randint(1, 3))
        ask = rng.choice(_ASKS).format(f=chosen[0], w=rng.choice(_WORDS))
        pasted = "\n\n".join(f"{f}\n```python\n{_file(rng, f, sizes[f] + 40 * t)}\n```" for f in chosen)
        out.append({"role": "user", "content": f"{ask}\n\nI added these files to the chat:\n\n{pasted}"})
        reply = "I will change the files as asked.\n\n" + "\n".join(_edit(rng, f) for f in chosen)
        out.append({"role": "assistant", "content": reply})
    return out


REMINDER = (
    "# *SEARCH/REPLACE block* Rules:\n\nEvery *SEARCH/REPLACE block* must use this format:\n"
    "1. The *FULL* file path alone on a line, verbatim.\n2. The opening fence and code language.\n"
    "ONLY EVER RETURN CODE IN A *SEARCH/REPLACE BLOCK*!"
)
"""aider's system reminder (``reminder: user``, its default, appends it to the newest user message)."""


def with_reminder(history: list[Message], reminder: str = REMINDER) -> list[Message]:
    """The request aider sends for ``history`` (which ends with a user message): the newest user
    message with the reminder appended; next turn that message goes out without it again."""
    last = history[-1]
    return [*history[:-1], {**last, "content": f"{last['content']}\n\n{reminder}"}]


@dataclass
class AiderRun:
    window: int
    turns: int = 0
    sent_tokens: int = 0
    full_tokens: int = 0
    compact_turns: int = 0
    cut_turns: int = 0
    max_cut_streak: int = 0
    largest_summary_tokens: int = 0  # the summary's text, its header and end line aside
    summary_ceiling: int = 0  # the largest budget a summary gets in this window
    over_window: int = 0
    invalid: int = 0
    tool_names_shown: int = 0
    peak_ratio: float = 0.0
    per_turn: list[float] = field(default_factory=list)

    @property
    def saved(self) -> float:
        return 1.0 - self.sent_tokens / self.full_tokens if self.full_tokens else 0.0


def measure(window: int, *, turns: int = 36, seed: int = 1, recall: bool | None = False, config: Config | None = None, reminder: bool = False) -> AiderRun:
    """Replay :func:`aider_session` through a manager at ``window`` tokens (see the module
    docstring); tokens are the window cap's o200k counts. ``reminder``: each request as aider
    sends it by default (:func:`with_reminder`)."""
    history = aider_session(turns, seed=seed)
    ctx = ContextManager(config or Config(), model="gpt-4o", context_length=window, store=SqliteStore(":memory:"))
    run = AiderRun(window, summary_ceiling=summary_budget(10**9, window))
    count = ctx.window.measure
    streak = 0
    for end in range(4, len(history) + 1, 2):  # each request ends with a user turn
        raw = with_reminder(history[:end]) if reminder else history[:end]
        s = ctx._session("aider")
        compactions, cuts = s.compactions, s.window_cuts
        out = ctx.prepare(raw, session_id="aider", recall=recall) if recall is not None else ctx.prepare(raw, session_id="aider")
        sent = count(out)
        run.turns += 1
        run.sent_tokens += sent
        run.full_tokens += count(raw)
        run.per_turn.append(round(sent / window, 3))
        run.peak_ratio = max(run.peak_ratio, sent / window)
        if s.compactions > compactions:
            run.compact_turns += 1
        if s.window_cuts > cuts:
            run.cut_turns += 1
            streak += 1
            run.max_cut_streak = max(run.max_cut_streak, streak)
        else:
            streak = 0
        if sent > ctx.window.limit:
            run.over_window += 1
        if validate(out, errors_only=True):
            run.invalid += 1
        for m in out:
            text = content_text(m.get("content"))
            if is_summary(m):
                run.largest_summary_tokens = max(run.largest_summary_tokens, estimate(split_summary(text)[0]))
            if "ctx_expand" in text or "ctx_grep" in text:
                run.tool_names_shown += 1
        ctx.update_from_response({"prompt_tokens": sent, "completion_tokens": 300}, session_id="aider")
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", default="16000,24000,40000")
    ap.add_argument("--turns", type=int, default=36)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--recall", choices=("false", "default"), default="false", help="prepare(recall=False), or the default (None)")
    ap.add_argument("--reminder", action="store_true", help="aider's default reminder: appended to the newest user message, dropped next turn")
    ns = ap.parse_args()
    recall = False if ns.recall == "false" else None
    rows: list[dict[str, Any]] = []
    for w in (int(x) for x in ns.windows.split(",")):
        r = measure(w, turns=ns.turns, seed=ns.seed, recall=recall, reminder=ns.reminder)
        row = {**asdict(r), "saved": round(r.saved, 3)}
        rows.append(row)
        print(
            f"window {w:>6,}: saved {r.saved:6.1%}  compact {r.compact_turns}/{r.turns}  cut {r.cut_turns}/{r.turns} "
            f"(max {r.max_cut_streak} in a row)  summary {r.largest_summary_tokens:,}/{r.summary_ceiling:,} tok  "
            f"over {r.over_window}  invalid {r.invalid}  tool names {r.tool_names_shown}  peak {r.peak_ratio:.0%}"
        )
        print("   per turn:", " ".join(f"{x:.2f}" for x in r.per_turn))
    if ns.json:
        with open(ns.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
