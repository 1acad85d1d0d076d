"""A deterministic summarizer that needs no LLM: the default, and the fallback of every LLM.

It fills the structured template from what the span shows, without inventing anything:

* **Goal**: kept from the previous summary, else the first user message of the span;
* **Constraints & Preferences**: user lines that state a rule (``must``, ``never``, ``please``…),
  verbatim;
* **Progress / Done**: one line per tool call (name, arguments, first line of the result);
  **In Progress**: the latest assistant intent; **Blocked**: the latest error lines;
* **Key Decisions**: the first line of each assistant message;
* **Relevant Files**: paths named in tool-call arguments, then in outputs;
* **Next Steps**: the last assistant plan of the span;
* **Critical Context**: URLs, plus what the previous summary kept there.

Updating a previous summary merges list sections (older items first, trimmed oldest-first to
the budget) and replaces the "now" sections (In Progress, Next Steps). Same input, same output.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ctxengine.facts import error_lines, paths_in, urls_in
from ctxengine.messages import (
    Message,
    content_text,
    tool_call_args,
    tool_call_id,
    tool_call_name,
    tool_calls,
)
from ctxengine.summarize.base import bound_summary, parse_sections, render_sections
from ctxengine.summarize.ledger import LEDGER_HEADING
from ctxengine.tokens import estimate

__all__ = ["PRUNED_MARKER", "ExtractiveSummarizer"]

PRUNED_MARKER = "[Old tool output cleared to save context space]"

_LEDGER_TITLE = LEDGER_HEADING.removeprefix("### ")

_RULE_RE = re.compile(
    r"(?i)\b(?:must|never|always|don't|do not|should|shouldn't|prefer|please|only|avoid|without|make sure|required?|no more than|at most|at least)\b"
)
_LIST_SECTIONS = ("Constraints & Preferences", "Progress/Done", "Progress/Blocked", "Key Decisions", "Relevant Files", "Critical Context")
_LIMITS = {
    "Constraints & Preferences": 30,
    "Progress/Done": 60,
    "Progress/Blocked": 8,
    "Key Decisions": 20,
    "Relevant Files": 60,
    "Critical Context": 400,
}
# trimmed first when over budget (Critical Context is never trimmed: the ledger owns it)
_TRIM_ORDER = ("Progress/Done", "Key Decisions", "Relevant Files", "Constraints & Preferences", "Progress/Blocked")


def _one_line(text: str, limit: int) -> str:
    s = " ".join(text.split())
    return s if len(s) <= limit else s[: limit - 1].rstrip() + "…"


def _first_line(text: str, limit: int) -> str:
    for line in text.splitlines():
        s = line.strip()
        if s and s != PRUNED_MARKER:
            return _one_line(s, limit)
    return ""


def _args_brief(call: dict[str, object], limit: int = 140) -> str:
    args = tool_call_args(call)
    if isinstance(args, dict):
        if len(args) == 1:
            (v,) = args.values()
            return _one_line(v if isinstance(v, str) else str(v), limit)
        return _one_line(", ".join(f"{k}={v}" for k, v in args.items()), limit)
    return _one_line(args, limit)


def _items(body: str) -> list[str]:
    return [ln for ln in body.splitlines() if ln.strip() and ln.strip() != "- (none)"]


def _merge(old: list[str], new: list[str]) -> list[str]:
    return list(dict.fromkeys([*old, *new]))


class ExtractiveSummarizer:
    """Deterministic template filler (see the module docstring). No configuration needed."""

    name = "extractive"

    def summarize(
        self,
        span: Sequence[Message],
        *,
        previous_summary: str | None = None,
        focus_topic: str | None = None,
        budget_tokens: int = 2000,
    ) -> str:
        new = self._extract(span)
        prev = parse_sections(previous_summary) if previous_summary else {}
        sections: dict[str, list[str]] = {}
        goal = _items(prev.get("Goal", "")) or new.get("Goal", [])
        if not goal:
            goal = ["- Continue the task set by the first user message (kept verbatim above)."]
        if focus_topic:
            goal = [g for g in goal if not g.startswith("- Focus:")] + [f"- Focus: {_one_line(focus_topic, 300)}"]
        sections["Goal"] = goal
        for key in _LIST_SECTIONS:
            old = _items(prev.get(key, ""))
            if key == "Critical Context":
                # subsections are carried too, except the fact ledger's block: the ledger
                # re-adds those facts by priority at every compaction
                old += [
                    ln
                    for k, v in prev.items()
                    if k.startswith("Critical Context/") and k != f"Critical Context/{_LEDGER_TITLE}"
                    for ln in [f"### {k.split('/', 1)[1]}", *_items(v)]
                ]
            if key == "Progress/Done":
                # what was in progress before is done or superseded now
                old += [ln.replace("- ", "- (earlier) ", 1) for ln in _items(prev.get("Progress/In Progress", ""))]
            merged = _merge(old, new.get(key, []))
            limit = _LIMITS[key]
            sections[key] = merged[-limit:]
        sections["Progress/In Progress"] = new.get("Progress/In Progress") or _items(prev.get("Progress/In Progress", ""))
        sections["Next Steps"] = new.get("Next Steps") or _items(prev.get("Next Steps", ""))
        if focus_topic:
            topic = focus_topic.lower()
            for key in _TRIM_ORDER:
                lines = sections.get(key, [])
                # lines about the focus topic survive trimming: move them to the end
                sections[key] = [ln for ln in lines if topic not in ln.lower()] + [ln for ln in lines if topic in ln.lower()]
        self._trim(sections, budget_tokens)
        text = render_sections(sections)
        # a summary never exceeds its budget: what the trim could not take (carried critical
        # context, long lines) is cut by the bound every summarizer's text gets
        return text if estimate(text) <= budget_tokens else bound_summary(text, budget_tokens)

    @staticmethod
    def _trim(sections: dict[str, list[str]], budget: int) -> None:
        def size() -> int:
            return sum(estimate(ln) + 1 for lines in sections.values() for ln in lines) + 40

        total = size()
        for key in _TRIM_ORDER:
            lines = sections.get(key, [])
            while total > budget and len(lines) > 1:
                total -= estimate(lines.pop(0)) + 1
            if total <= budget:
                return
        # still over: carried critical context, oldest first (headings of subsections kept)
        lines = sections.get("Critical Context", [])
        i = 0
        while total > budget and i < len(lines):
            if lines[i].startswith("#"):
                i += 1
                continue
            total -= estimate(lines.pop(i)) + 1

    @staticmethod
    def _extract(span: Sequence[Message]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {k: [] for k in ("Goal", *_LIST_SECTIONS, "Progress/In Progress", "Next Steps")}
        results: dict[str, str] = {}
        for m in span:
            if m.get("role") == "tool":
                cid = m.get("tool_call_id")
                if isinstance(cid, str):
                    results.setdefault(cid, content_text(m.get("content")))
        files_args: dict[str, None] = {}
        files_out: dict[str, None] = {}
        urls: dict[str, None] = {}
        errors: list[str] = []
        last_assistant = ""
        pending_results: list[str] = []
        for m in span:
            role = m.get("role")
            text = content_text(m.get("content"))
            if role == "user":
                if not out["Goal"] and text.strip():
                    out["Goal"].append("- " + _one_line(text, 400))
                fenced = False
                for line in text.splitlines():
                    s = line.strip()
                    if s.startswith(("```", "~~~")):
                        fenced = not fenced  # pasted files are not the user's rules
                        continue
                    if not fenced and 8 <= len(s) <= 300 and _RULE_RE.search(s):
                        out["Constraints & Preferences"].append(f'- User: "{s}"')
            elif role == "assistant":
                first = _first_line(text, 200)
                if first:
                    out["Key Decisions"].append("- " + first)
                    last_assistant = text
                for c in tool_calls(m):
                    name = tool_call_name(c)
                    brief = _args_brief(c)
                    res = results.get(tool_call_id(c), "")
                    outcome = _first_line(res, 160) if res else ""
                    line = f"- {name}({brief})" + (f" → {outcome}" if outcome else "")
                    out["Progress/Done"].append(line)
                    for p in paths_in(brief):
                        files_args[p] = None
                    pending_results.append(res)
            elif role == "tool":
                for p in paths_in(text)[:20]:
                    files_out[p] = None
                errors.extend(error_lines(text)[:3])
            for u in urls_in(text) if role != "system" else []:
                urls[u] = None
        files = list(files_args) + [p for p in files_out if p not in files_args][: max(0, 30 - len(files_args))]
        out["Relevant Files"] = [f"- {p}" for p in files]
        out["Progress/Blocked"] = [f"- {e}" for e in errors[-5:]]
        out["Critical Context"] = [f"- {u}" for u in urls]
        if last_assistant:
            now = _one_line(last_assistant, 300)
            out["Progress/In Progress"] = [f"- {now}"]
            out["Next Steps"] = [f"- Continue from: {now}"]
        return out

