"""The LLM summarizer: the structured template written by a model behind a :class:`ChatClient`.

* Prompts are data files (``prompts/system.md``, ``summarize.md``, ``update.md``, ``focus.md``).
* A reply that is empty, truncated (cut at ``max_tokens``) or missing the template headings is
  a failure; a failed call is retried once, then :class:`SummarizerError` is raised so the
  engine falls back to the extractive summary. Authentication errors are never retried.
* The summarizer's own window is checked before each call (seed 003: a summarizer with a
  smaller window than the main model silently dropped turns). A span that does not fit is
  split into chunks at message boundaries (a single oversized message is split by lines) and
  summarized chunk by chunk, each call updating the summary of the chunks before it, so
  nothing is truncated blindly. If the provider still reports a context error, the chunks are
  halved once.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from importlib import resources
from string import Template
from typing import TYPE_CHECKING

from ctxengine.clients.base import ChatClient
from ctxengine.errors import SummarizerAuthError, SummarizerContextError, SummarizerError
from ctxengine.messages import Message, content_text, tool_call_name, tool_calls
from ctxengine.models import resolve_model
from ctxengine.summarize.base import has_template
from ctxengine.tokens import estimate

if TYPE_CHECKING:
    from ctxengine.config import SummarizerConfig

__all__ = ["LlmSummarizer", "render_span"]

PROMPT_MARGIN_TOKENS = 256
"""Slack for chat-template overhead and estimate error in each summarizer request."""

MIN_CHUNK_TOKENS = 512
"""Below this much room for conversation text per call, summarizing in chunks is pointless."""


def _prompt(name: str) -> str:
    return resources.files("ctxengine.summarize").joinpath(f"prompts/{name}").read_text(encoding="utf-8").strip()


def render_message(m: Message) -> str:
    """One message as plain text for the summarizer prompt."""
    role = str(m.get("role"))
    text = content_text(m.get("content"))
    if role == "tool":
        return f"[tool result]\n{text}"
    lines = [f"[{role}]"]
    if text:
        lines.append(text)
    for c in tool_calls(m):
        fn = c.get("function")
        args = fn.get("arguments") if isinstance(fn, dict) else None
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False) if args is not None else ""
        lines.append(f"→ called {tool_call_name(c)}({args})")
    return "\n".join(lines)


def render_span(span: Sequence[Message]) -> str:
    return "\n\n".join(render_message(m) for m in span if m.get("role") not in ("system", "developer"))


def _split_text(text: str, limit_tokens: int) -> list[str]:
    """Split ``text`` into pieces of about ``limit_tokens`` at line boundaries (hard-split
    lines that are longer on their own)."""
    pieces: list[str] = []
    cur: list[str] = []
    size = 0
    for line in text.splitlines():
        t = estimate(line) + 1
        while t > limit_tokens:
            cut = max(1, limit_tokens * 4)
            if cur:
                pieces.append("\n".join(cur))
                cur, size = [], 0
            pieces.append(line[:cut])
            line = line[cut:]
            t = estimate(line) + 1
        if size + t > limit_tokens and cur:
            pieces.append("\n".join(cur))
            cur, size = [], 0
        cur.append(line)
        size += t
    if cur:
        pieces.append("\n".join(cur))
    return pieces


def chunk_span(span: Sequence[Message], limit_tokens: int) -> list[str]:
    """Rendered span in chunks of at most about ``limit_tokens`` (message boundaries first)."""
    chunks: list[str] = []
    cur: list[str] = []
    size = 0
    for m in span:
        if m.get("role") in ("system", "developer"):
            continue
        r = render_message(m)
        t = estimate(r) + 2
        if t > limit_tokens:
            if cur:
                chunks.append("\n\n".join(cur))
                cur, size = [], 0
            chunks.extend(_split_text(r, limit_tokens))
            continue
        if size + t > limit_tokens and cur:
            chunks.append("\n\n".join(cur))
            cur, size = [], 0
        cur.append(r)
        size += t
    if cur:
        chunks.append("\n\n".join(cur))
    return chunks


class LlmSummarizer:
    """Summaries from an LLM (see the module docstring).

    ``context_length`` is the summarizer model's own window (looked up from the model table
    when ``None``); ``timeout`` applies per call; ``max_output_tokens`` caps the ``max_tokens``
    of each request (a summary budget of 10,000 would otherwise ask more than most models give).
    """

    name = "llm"

    def __init__(
        self,
        client: ChatClient,
        model: str,
        *,
        context_length: int | None = None,
        timeout: float = 60.0,
        max_output_tokens: int = 8192,
    ) -> None:
        self.client = client
        self.model = model
        if context_length is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                context_length = resolve_model(model).context_length
        self.context_length = int(context_length)
        self.timeout = float(timeout)
        self.max_output_tokens = int(max_output_tokens)
        self.calls = 0
        self._system = _prompt("system.md")
        self._first = Template(_prompt("summarize.md"))
        self._update = Template(_prompt("update.md"))
        self._focus = Template(_prompt("focus.md"))

    @classmethod
    def from_config(cls, config: SummarizerConfig) -> LlmSummarizer:
        """Build the client for ``auxiliary.compression`` and wrap it."""
        from ctxengine.clients.factory import build_client

        if not config.model:
            raise SummarizerError("auxiliary.compression.model is not set: there is no LLM to summarize with")
        return cls(
            build_client(config),
            config.model,
            context_length=config.context_length,
            timeout=config.timeout,
            max_output_tokens=config.max_output_tokens,
        )

    def summarize(
        self,
        span: Sequence[Message],
        *,
        previous_summary: str | None = None,
        focus_topic: str | None = None,
        budget_tokens: int = 2000,
    ) -> str:
        room = self._room(previous_summary, focus_topic, budget_tokens)
        try:
            return self._run(span, previous_summary, focus_topic, budget_tokens, room)
        except SummarizerContextError:
            # our estimate of the window was optimistic: smaller chunks, once
            return self._run(span, previous_summary, focus_topic, budget_tokens, max(MIN_CHUNK_TOKENS, room // 2))

    def _room(self, previous: str | None, focus: str | None, budget: int) -> int:
        """Tokens of conversation text one call can carry inside the summarizer's window."""
        fixed = estimate(self._system) + estimate(self._update.template) + estimate(focus or "")
        # the previous summary (or the running one) is at most about the reply budget
        carried = max(estimate(previous or ""), self._max_tokens(budget))
        room = self.context_length - fixed - carried - self._max_tokens(budget) - PROMPT_MARGIN_TOKENS
        if room < MIN_CHUNK_TOKENS:
            raise SummarizerContextError(
                f"summarizer model {self.model!r} has a {self.context_length:,}-token window: too small for "
                f"a {budget:,}-token summary plus the previous one; use a model with a larger window"
            )
        return room

    def _max_tokens(self, budget: int) -> int:
        # the budget is a target: leave the model room to finish the template, within what
        # the model accepts as max_tokens
        return min(int(budget * 1.5) + 256, self.max_output_tokens)

    def _run(self, span: Sequence[Message], previous: str | None, focus: str | None, budget: int, room: int) -> str:
        chunks = chunk_span(span, room) or [""]
        summary = self._call(chunks[0], previous, focus, budget)
        for chunk in chunks[1:]:
            summary = self._call(chunk, summary, focus, budget)
        return summary

    def _call(self, chunk: str, previous: str | None, focus: str | None, budget: int) -> str:
        focus_line = self._focus.substitute(topic=focus) if focus else ""
        if previous:
            prompt = self._update.substitute(previous=previous, span=chunk, focus=focus_line, budget=budget)
        else:
            prompt = self._first.substitute(span=chunk, focus=focus_line, budget=budget)
        messages: list[Message] = [
            {"role": "system", "content": self._system},
            {"role": "user", "content": prompt},
        ]
        problem: SummarizerError | None = None
        for _attempt in range(2):
            self.calls += 1
            try:
                text = self.client.complete(messages, model=self.model, max_tokens=self._max_tokens(budget), timeout=self.timeout)
            except (SummarizerAuthError, SummarizerContextError):
                raise
            except SummarizerError as exc:
                problem = exc
                continue
            text = text.strip()
            if not text:
                problem = SummarizerError(f"{self.model} returned an empty summary")
                continue
            if not has_template(text):
                problem = SummarizerError(f"{self.model} returned a summary without the template headings")
                continue
            return text
        raise SummarizerError(f"summary failed after a retry: {problem}") from problem
