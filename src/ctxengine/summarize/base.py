"""The summarizer seam and the structured summary template every summarizer fills.

A :class:`Summarizer` turns a span of messages (plus the previous summary, an optional focus
topic and a token budget) into summary text laid out with the seed's template::

    ## Goal
    ## Constraints & Preferences
    ## Progress
    ### Done
    ### In Progress
    ### Blocked
    ## Key Decisions
    ## Relevant Files
    ## Next Steps
    ## Critical Context

Two implementations ship: :class:`ctxengine.summarize.extractive.ExtractiveSummarizer`
(deterministic, no LLM, the default) and :class:`ctxengine.summarize.llm.LlmSummarizer`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ctxengine.messages import Message
from ctxengine.tokens import estimate

__all__ = [
    "CUT_NOTE",
    "SECTIONS",
    "SUBSECTIONS",
    "Summarizer",
    "bound_summary",
    "has_template",
    "parse_sections",
    "render_sections",
]

SECTIONS = (
    "Goal",
    "Constraints & Preferences",
    "Progress",
    "Key Decisions",
    "Relevant Files",
    "Next Steps",
    "Critical Context",
)
"""The top-level ``##`` headings of the template, in order."""

SUBSECTIONS = ("Done", "In Progress", "Blocked")
"""The ``###`` headings under ``## Progress``."""

_HEADING_RE = re.compile(r"^(#{2,3})\s+(.+?)\s*$", re.MULTILINE)


@runtime_checkable
class Summarizer(Protocol):
    """Produces summary text for a span of messages.

    ``previous_summary`` is the summary an earlier compaction produced: the new text must
    *update* it (move items from In Progress to Done, add new progress, drop what is obsolete)
    rather than start over. ``budget_tokens`` is a target, not a hard cut. Implementations
    raise :class:`ctxengine.errors.SummarizerError` (or a subclass) when they cannot produce a
    summary; they never return an empty or template-less text.
    """

    name: str

    def summarize(
        self,
        span: Sequence[Message],
        *,
        previous_summary: str | None = None,
        focus_topic: str | None = None,
        budget_tokens: int = 2000,
    ) -> str: ...


def has_template(text: str) -> bool:
    """True when ``text`` carries every top-level heading of the template.

    The check is on headings only (case-insensitive), so a model may word the contents freely;
    a reply without the structure is treated as a failed summary.
    """
    found = {m.group(2).strip().lower() for m in _HEADING_RE.finditer(text) if m.group(1) == "##"}
    return all(s.lower() in found for s in SECTIONS)


def parse_sections(text: str) -> dict[str, str]:
    """Split template text into ``{heading: body}`` for ``##`` and ``###`` headings.

    Subsection keys are ``"Progress/Done"`` and so on. Text before the first heading is kept
    under the key ``""``. Unknown headings are kept under their own name.
    """
    out: dict[str, str] = {}
    parent = ""
    key = ""
    pos = 0
    pieces: list[tuple[str, int, int]] = []
    for m in _HEADING_RE.finditer(text):
        pieces.append((key, pos, m.start()))
        level, title = m.group(1), m.group(2).strip()
        if level == "##":
            parent = title
            key = title
        else:
            key = f"{parent}/{title}" if parent else title
        pos = m.end()
    pieces.append((key, pos, len(text)))
    for k, a, b in pieces:
        body = text[a:b].strip("\n")
        if k in out:
            out[k] = (out[k] + "\n" + body).strip("\n")
        else:
            out[k] = body
    return out


def render_sections(sections: dict[str, list[str]]) -> str:
    """Render the template from ``{section: lines}`` (keys as in :func:`parse_sections`).

    Empty sections get ``- (none)`` so the structure is always complete.
    """
    parts: list[str] = []
    for s in SECTIONS:
        parts.append(f"## {s}")
        if s == "Progress":
            for sub in SUBSECTIONS:
                parts.append(f"### {sub}")
                parts.extend(sections.get(f"Progress/{sub}") or ["- (none)"])
        else:
            parts.extend(sections.get(s) or ["- (none)"])
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"


CUT_NOTE = "- … (cut: the summary exceeded its token budget)"
"""The line that ends a section :func:`bound_summary` shortened."""

_MIN_SECTION_TOKENS = 12


def _cut_line(line: str, tokens: int) -> str:
    """The longest prefix of ``line`` whose estimate is at most ``tokens`` (binary search)."""
    lo, hi = 0, min(len(line), max(0, tokens) * 6)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate(line[:mid]) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return line[:lo]


def _keep_lines(body: str, tokens: int) -> list[str]:
    out: list[str] = []
    used = 0
    for line in body.splitlines():
        t = estimate(line) + 1
        if used + t > tokens:
            rest = tokens - used - 1
            if rest > _MIN_SECTION_TOKENS // 2:
                out.append(_cut_line(line, rest))
            out.append(CUT_NOTE)
            return out
        out.append(line)
        used += t
    return out


def bound_summary(text: str, max_tokens: int) -> str:
    """``text`` cut to at most about ``max_tokens`` (estimated): whatever a summarizer returns
    is bounded (a server that ignores ``max_tokens`` once returned 330K tokens).

    A text within the budget is returned unchanged. A template text keeps every heading and the
    first lines of each section, each section getting an equal share of the budget, and each
    shortened section ends with :data:`CUT_NOTE`; any other text keeps its head. The result is
    never more than ``max_tokens`` estimated tokens (plus the note lines' own few tokens).
    """
    max_tokens = max(1, int(max_tokens))
    if estimate(text) <= max_tokens:
        return text
    if has_template(text):
        sections = parse_sections(text)
        keys = [k for k in sections if k]
        skeleton = render_sections({})
        room = max_tokens - estimate(skeleton)
        share = max(_MIN_SECTION_TOKENS, room // max(1, len(keys)))
        kept = {k: _keep_lines(sections[k], share) for k in keys}
        out = render_sections(kept)
        if estimate(out) <= max_tokens + estimate(CUT_NOTE) * len(keys):
            return out
    return _cut_line(text, max(1, max_tokens - estimate(CUT_NOTE) - 1)).rstrip() + "\n" + CUT_NOTE
