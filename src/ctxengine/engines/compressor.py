"""The ``compressor`` engine: the seed's four-phase summarizing compressor.

1. **Prune**: old tool results (> 200 characters) outside the protected tail are cleared to
   ``[Old tool output cleared to save context space]`` before the summarizer sees them (their
   paths, URLs and errors go to the fact ledger, so nothing the guarantee protects is lost).
2. **Boundaries**: the head is ``protect_first_n`` messages (system + first exchange), extended
   to hold the task-setting first user message; the tail walks back from the end by the token
   budget ``threshold_tokens × target_ratio`` and keeps at least ``protect_last_n`` messages as
   long as that still lands under the threshold (a tail that would not fit is shrunk: a request
   over the window is never produced). Cuts never split a tool call from its results. The
   latest user message always stays verbatim; a previous summary never sits in the head, so
   every later compression can compress again.
3. **Summary**: the middle is summarized with the structured template, updating the previous
   summary (``_previous_summary``) instead of starting over; budget ``content_tokens × 0.20``
   clamped to ``[2,000, min(context_length × 0.05, 12,000)]``; optional ``focus_topic``. The fact
   ledger appends what the summary misses (older user messages verbatim, most recent first,
   up to ``user_quote_budget_tokens``; tool names, errors, URLs, paths).
4. **Assemble**: head (a note appended to the system prompt on the first compression only, so
   the cached system prefix stays byte-stable afterwards), the ``[CONTEXT COMPACTION]`` summary
   with a role that avoids two consecutive same-role messages and keeps the first non-system
   message a user message, then the tail; orphaned tool pairs are sanitized.

Failure never loses context: a summarizer error falls back to the deterministic extractive
summary; an authentication error keeps the messages unchanged (reported in :meth:`get_status`
and logged) unless the context is over the hard limit; a compression that cannot get below the
threshold backs off ``backoff_turns`` turns instead of firing again every turn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from ctxengine.boundaries import align_cut, group_spans, sanitize_tool_pairs
from ctxengine.engine import CompactionReport, ContextEngine
from ctxengine.errors import SummarizerAuthError, SummarizerError
from ctxengine.facts import FACT_KINDS, Facts, error_lines, extract_facts, paths_in, urls_in
from ctxengine.messages import Message, content_text, is_summary, message_text
from ctxengine.models import DEFAULT_CONTEXT_LENGTH
from ctxengine.redact import redact
from ctxengine.summarize.base import Summarizer, has_template
from ctxengine.summarize.extractive import PRUNED_MARKER, ExtractiveSummarizer
from ctxengine.summarize.ledger import apply_ledger
from ctxengine.tokens import AnchoredCounter, EstimateCounter, TokenCounter, estimate

if TYPE_CHECKING:
    from ctxengine.config import Config

__all__ = ["SUMMARY_END", "SUMMARY_PREFIX", "ContextCompressor"]

log = logging.getLogger("ctxengine.compressor")

SUMMARY_PREFIX = "[CONTEXT COMPACTION]"
SUMMARY_END = "[END OF CONTEXT COMPACTION]"

PRUNE_MIN_CHARS = 200
"""Tool results longer than this are pruned outside the tail (the seed's value)."""

SUMMARY_RATIO = 0.20
MIN_SUMMARY_TOKENS = 2_000
MAX_SUMMARY_TOKENS = 12_000
SUMMARY_WINDOW_RATIO = 0.05

TARGET_AFTER_RATIO = 0.75
"""A compression aims to land at or below this fraction of the threshold, so the next one is
several turns away (compactions in batches keep prompt caches warm); the tail may exceed its
token budget to keep ``protect_last_n`` messages only up to that level."""

HARD_LIMIT_RATIO = 0.90
"""Above this fraction of the window a request has no room left for the reply: compression
runs even while backing off, and an authentication failure no longer keeps messages as they
are (the deterministic summary is used instead). Compressed output never exceeds it."""


def _prompt(name: str) -> str:
    return resources.files("ctxengine.summarize").joinpath(f"prompts/{name}").read_text(encoding="utf-8").strip()


@dataclass(slots=True)
class _Plan:
    head_end: int
    tail_start: int
    pulled_user: int | None
    middle: list[int]


class ContextCompressor(ContextEngine):
    """The default engine (see the module docstring).

    ``summarizer`` writes summaries; ``None`` uses the deterministic
    :class:`~ctxengine.summarize.extractive.ExtractiveSummarizer`, so the engine works with no
    LLM and no API key. ``counter`` counts tokens (the fast estimate by default).
    """

    def __init__(
        self,
        *,
        context_length: int = DEFAULT_CONTEXT_LENGTH,
        threshold: float = 0.50,
        target_ratio: float = 0.20,
        protect_last_n: int = 20,
        protect_first_n: int = 3,
        user_quote_budget_tokens: int = 20_000,
        backoff_turns: int = 3,
        enabled: bool = True,
        summarizer: Summarizer | None = None,
        counter: TokenCounter | None = None,
    ) -> None:
        super().__init__(context_length=context_length, threshold=threshold)
        self.target_ratio = float(target_ratio)
        self.protect_last_n = int(protect_last_n)
        self.protect_first_n = int(protect_first_n)
        self.user_quote_budget_tokens = int(user_quote_budget_tokens)
        self.backoff_turns = int(backoff_turns)
        self.enabled = bool(enabled)
        self.summarizer: Summarizer = summarizer or ExtractiveSummarizer()
        self._fallback = ExtractiveSummarizer()
        self.counter: TokenCounter = counter or EstimateCounter()
        self._anchor = AnchoredCounter(self.counter)
        self._sent: list[Message] | None = None
        self._previous_summary: str | None = None
        self._carried = Facts()
        self._backoff = 0
        self._last_error: str | None = None
        # (length, last message) of the prefix the last compaction left stable: later ones never
        # cut inside it, so it stays byte-identical and is read from the prompt cache
        self._frozen: tuple[int, Message] | None = None
        self._note = _prompt("system_note.md")
        self._header = _prompt("summary_header.md")

    @property
    def name(self) -> str:
        return "compressor"

    @classmethod
    def from_config(
        cls,
        config: Config,
        context_length: int,
        *,
        summarizer: Summarizer | None = None,
        store: Any = None,
        **services: Any,
    ) -> ContextCompressor:
        """Build from ``config.compression`` and ``config.auxiliary.compression``.

        With no ``summarizer`` given and ``auxiliary.compression.model`` null, summaries are
        extractive (no LLM). ``store`` is accepted for the registry's uniform call and unused:
        this engine keeps no originals.
        """
        c = config.compression
        if summarizer is None and config.auxiliary.compression.model:
            from ctxengine.summarize.llm import LlmSummarizer

            summarizer = LlmSummarizer.from_config(config.auxiliary.compression)
        counter = services.get("counter")
        return cls(
            context_length=context_length,
            threshold=c.threshold,
            target_ratio=c.target_ratio,
            protect_last_n=c.protect_last_n,
            protect_first_n=c.protect_first_n,
            user_quote_budget_tokens=c.user_quote_budget_tokens,
            backoff_turns=c.backoff_turns,
            enabled=c.enabled,
            summarizer=summarizer,
            counter=counter if isinstance(counter, TokenCounter) else None,
        )

    # -- budgets ---------------------------------------------------------------------------------
    @property
    def tail_token_budget(self) -> int:
        """``threshold_tokens × target_ratio``: tokens the protected tail may hold."""
        return int(self.threshold_tokens * self.target_ratio)

    @property
    def max_summary_tokens(self) -> int:
        """``min(context_length × 0.05, 12,000)``: the ceiling of a summary's budget."""
        return int(min(self.context_length * SUMMARY_WINDOW_RATIO, MAX_SUMMARY_TOKENS))

    @property
    def hard_limit_tokens(self) -> int:
        return int(self.context_length * HARD_LIMIT_RATIO)

    def summary_budget(self, content_tokens: int) -> int:
        """``content_tokens × 0.20`` clamped to ``[2,000, max_summary_tokens]``.

        When the window is so small that the ceiling is under 2,000, the floor wins: a summary
        shorter than that cannot hold the template.
        """
        return max(MIN_SUMMARY_TOKENS, min(int(content_tokens * SUMMARY_RATIO), self.max_summary_tokens))

    # -- accounting ------------------------------------------------------------------------------
    def update_from_response(self, usage: Any) -> None:
        """Record the real token counts; they also anchor the estimate of the next request
        (the messages last seen by :meth:`should_compress_preflight` or returned by
        :meth:`compress` are taken as what was sent)."""
        u = self._record_usage(usage)
        if self._sent is not None and u.prompt_tokens > 0:
            self._anchor.anchor(self._sent, u.prompt_tokens)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        """True when the prompt reaches ``threshold × context_length``.

        Uses ``prompt_tokens`` when given, else the last provider-reported prompt tokens.
        While backing off after a compression that could not get under the threshold, turns
        are skipped (each call counts one) unless the hard limit is reached.
        """
        if not self.enabled:
            return False
        tokens = self.last_prompt_tokens if prompt_tokens is None else int(prompt_tokens)
        if tokens < self.threshold_tokens:
            return False
        if self._backoff > 0 and tokens < self.hard_limit_tokens:
            self._backoff -= 1
            return False
        return True

    def should_compress_preflight(self, messages: list[Message]) -> bool:
        """Before the API call: the last real prompt tokens plus an estimate of the messages
        appended since (anchored counting), or an estimate of everything when ``messages`` no
        longer starts with what was sent last (after a compaction, another list)."""
        self._sent = messages
        return self.enabled and self._anchor.count(messages) >= self.threshold_tokens

    def update_model(self, model: str, context_length: int, **kwargs: Any) -> None:
        """Switch window: ``threshold_tokens`` and every budget follow the new length."""
        super().update_model(model, context_length, **kwargs)

    def on_session_reset(self) -> None:
        super().on_session_reset()
        self._previous_summary = None
        self._carried = Facts()
        self._backoff = 0
        self._last_error = None
        self._frozen = None
        self._sent = None
        self._anchor.reset()

    def get_status(self) -> dict[str, Any]:
        status = super().get_status()
        status.update(
            {
                "summarizer": getattr(self.summarizer, "name", type(self.summarizer).__name__),
                "tail_token_budget": self.tail_token_budget,
                "max_summary_tokens": self.max_summary_tokens,
                "backoff_turns_left": self._backoff,
                "last_error": self._last_error,
                "has_previous_summary": self._previous_summary is not None,
            }
        )
        return status

    # -- compression -------------------------------------------------------------------------------
    def compress(
        self,
        messages: list[Message],
        current_tokens: int | None = None,
        focus_topic: str | None = None,
    ) -> list[Message]:
        """Compact ``messages`` (never mutated) and return the new list; see the module docstring.

        ``current_tokens`` is the prompt size to judge against the threshold (the estimate of
        ``messages`` when ``None``). Under the threshold the list comes back unchanged, unless
        a ``focus_topic`` is given (a manual ``/compress <topic>``). :attr:`last_report` says
        what happened, including ``fallback`` (``"extractive"`` or ``"unchanged"``).
        """
        t0 = time.perf_counter()
        msgs = list(messages)
        toks = [self.counter.count_messages([m]) for m in msgs]
        total = sum(toks)
        before = int(current_tokens) if current_tokens is not None else total
        report = CompactionReport(self.name, len(msgs), len(msgs), before, before)
        self.last_report = report
        if not msgs or (before < self.threshold_tokens and focus_topic is None):
            report.notes.append("under the threshold: nothing to do")
            return self._finish(report, msgs, t0, changed=False)

        plan = self._plan(msgs, toks)
        if not plan.middle:
            out = self._clip_to_limit(msgs, report, plan.head_end)
            report.notes.append("no message between head and tail to summarize")
            changed = [i for i, (a, b) in enumerate(zip(out, msgs, strict=True)) if a is not b]
            if not changed:
                return self._finish(report, msgs, t0, changed=False)
            self._frozen = (changed[-1] + 1, out[changed[-1]])
            return self._finish(report, out, t0, changed=True)

        head = msgs[: plan.head_end]
        tail = msgs[plan.tail_start :]
        pulled = [msgs[plan.pulled_user]] if plan.pulled_user is not None else []
        middle = [msgs[i] for i in plan.middle]

        # previous summaries in the middle become the text to update, not content to summarize
        previous = self._previous_summary
        span: list[Message] = []
        acc: dict[str, dict[str, None]] = {k: {} for k in FACT_KINDS}
        for m in middle:
            if m.get("role") != "system" and is_summary(m):
                text, rest = _split_summary(content_text(m.get("content")))
                if previous is None:
                    previous = text
                if rest or m.get("tool_calls"):
                    m = {**m, "content": rest}
                else:
                    continue
            facts = extract_facts([m])
            for k in FACT_KINDS:
                acc[k].update(dict.fromkeys(getattr(facts, k)))
            span.append(_pruned(m, facts))
        required = Facts(**{k: list(v) for k, v in acc.items()}).merge(self._carried)
        if previous is not None and not self._carried.all():
            required = required.merge(extract_facts([{"role": "assistant", "content": previous}], include_users=False))

        content_tokens = sum(toks[i] for i in plan.middle)
        budget = self.summary_budget(content_tokens)
        summary, fallback = self._summarize(span, previous, focus_topic, budget, before, report)
        if summary is None:  # authentication failed below the hard limit: keep everything
            self._backoff = self.backoff_turns
            return self._finish(report, msgs, t0, changed=False)

        fixed = sum(toks[: plan.head_end]) + sum(toks[plan.tail_start :]) + sum(self.counter.count_messages([p]) for p in pulled)
        present = "\n".join(message_text(m) for m in (*head, *pulled, *tail))
        ledger_budget = max(0, self.hard_limit_tokens - fixed - estimate(summary) - 200)
        ledger = apply_ledger(
            summary,
            required,
            present,
            budget_tokens=ledger_budget,
            # the user's words are anchors: only their own budget limits them (tool outputs of
            # the tail are cut afterwards if the result does not fit the window)
            user_budget_tokens=min(self.user_quote_budget_tokens, self.context_length),
        )
        if not ledger.complete:
            detail = ", ".join(f"{n} {k}" for k, n in ledger.dropped.items() if n)
            report.notes.append(f"fact ledger out of space: {detail} not kept")
        summary_text = ledger.text.strip()

        out = self._assemble(head, summary_text, pulled, tail)
        out = sanitize_tool_pairs(out)
        if head:
            self._frozen = (len(head), out[len(head) - 1])
        out = self._clip_to_limit(out, report, len(head) + 1)
        self._previous_summary = summary_text
        self._carried = required
        self.compression_count += 1
        report.fallback = fallback
        report.replaced = list(plan.middle)
        return self._finish(report, out, t0, changed=True)

    def _finish(self, report: CompactionReport, out: list[Message], t0: float, *, changed: bool) -> list[Message]:
        after = self.counter.count_messages(out) if changed else report.tokens_before
        report.messages_after = len(out)
        report.tokens_after = after
        if changed:
            self._sent = out
            self._anchor.reset()
            self.last_prompt_tokens = after
            if after >= self.threshold_tokens and self._backoff == 0:
                self._backoff = self.backoff_turns
                report.notes.append(f"still at {after:,} tokens (threshold {self.threshold_tokens:,}): backing off {self.backoff_turns} turns")
        elif report.tokens_before >= self.threshold_tokens and self._backoff == 0:
            self._backoff = self.backoff_turns
        report.elapsed_ms = (time.perf_counter() - t0) * 1000.0
        return out

    # phase 2
    def _plan(self, msgs: list[Message], toks: list[int]) -> _Plan:
        n = len(msgs)
        head_end = align_cut(msgs, min(self.protect_first_n, n), direction="forward")
        first_user = next((i for i, m in enumerate(msgs) if m.get("role") == "user"), None)
        if first_user is not None and first_user >= head_end and not is_summary(msgs[first_user]):
            head_end = align_cut(msgs, first_user + 1, direction="forward")
        if self._frozen is not None:
            k, last = self._frozen
            if head_end < k <= n and msgs[k - 1] == last:
                head_end = align_cut(msgs, k, direction="forward")
        for i in range(1, head_end):
            if is_summary(msgs[i]):
                head_end = i
                break
        head_tokens = sum(toks[:head_end])
        reserve = self.summary_budget(max(0, sum(toks) - head_tokens - self.tail_token_budget))
        budget = self.tail_token_budget
        soft_cap = max(budget, int(self.threshold_tokens * TARGET_AFTER_RATIO) - head_tokens - reserve)
        start = n
        acc = 0
        count = 0
        spans = [(a + head_end, b + head_end) for a, b in group_spans(msgs[head_end:])]
        for a, b in reversed(spans):
            g = sum(toks[a:b])
            if start < n and not (acc + g <= budget or (count < self.protect_last_n and acc + g <= soft_cap)):
                break
            acc += g
            count += b - a
            start = a
        last_user = next((i for i in range(n - 1, -1, -1) if msgs[i].get("role") == "user"), None)
        # everything after the head fits the tail (or the middle would hold only the latest
        # user message): give the middle the oldest groups back, keeping the last group
        k = 0
        while k < len(spans) - 1 and (start <= head_end or all(i == last_user for i in range(head_end, start))):
            start = max(start, spans[k][1])
            k += 1
        acc = sum(toks[start:])
        pulled: int | None = None
        if last_user is not None and head_end <= last_user < start:
            if acc + sum(toks[last_user:start]) <= soft_cap and last_user > head_end:
                start = last_user
            else:
                pulled = last_user
        middle = [i for i in range(head_end, start) if i != pulled]
        return _Plan(head_end, start, pulled, middle)

    # phase 3
    def _summarize(
        self,
        span: list[Message],
        previous: str | None,
        focus_topic: str | None,
        budget: int,
        tokens: int,
        report: CompactionReport,
    ) -> tuple[str | None, str | None]:
        """The summary text and the fallback used (``None``); ``(None, ...)`` keeps messages."""
        try:
            text = self.summarizer.summarize(span, previous_summary=previous, focus_topic=focus_topic, budget_tokens=budget)
            if not text.strip() or not has_template(text):
                raise SummarizerError("the summary is empty or lacks the template headings")
            self._last_error = None
            return text, None
        except SummarizerAuthError as exc:
            reason = redact(f"summarizer authentication failed: {exc}")
            self._last_error = reason
            if tokens < self.hard_limit_tokens:
                log.warning("%s; messages kept unchanged", reason)
                report.fallback = "unchanged"
                report.notes.append(reason + "; messages kept unchanged")
                return None, "unchanged"
            log.warning("%s; over the hard limit, using the extractive summary", reason)
            report.notes.append(reason + "; over the hard limit: extractive summary")
        except SummarizerError as exc:
            self._last_error = redact(f"summarizer failed: {exc}")  # a custom summarizer's text too
            log.warning("%s; using the extractive summary", self._last_error)
            report.notes.append(f"summarizer failed: {exc}")
        except Exception as exc:  # a custom summarizer's bug must not lose the conversation
            self._last_error = redact(f"summarizer raised {type(exc).__name__}: {exc}")
            log.warning("%s; using the extractive summary", self._last_error)
            report.notes.append(self._last_error)
        text = self._fallback.summarize(span, previous_summary=previous, focus_topic=focus_topic, budget_tokens=budget)
        return text, "extractive"

    # phase 4
    def _assemble(self, head: list[Message], summary: str, pulled: list[Message], tail: list[Message]) -> list[Message]:
        head = list(head)
        # the first compaction only: once a prefix is frozen (even by a cut without summary)
        # the system prompt is part of it and must stay byte-identical
        if self.compression_count == 0 and self._frozen is None and head and head[0].get("role") == "system":
            head[0] = self._with_note(head[0])
        body = f"{self._header}\n\n{summary}\n{SUMMARY_END}"
        prev_role = head[-1].get("role") if head else None
        nxt = (pulled or tail)[:1]
        next_role = nxt[0].get("role") if nxt else None
        if prev_role in (None, "system", "developer"):
            role: str | None = "user" if next_role != "user" else None
        else:
            role = next((r for r in ("user", "assistant") if r != prev_role and r != next_role), None)
        if role is not None:
            return [*head, {"role": role, "content": body}, *pulled, *tail]
        if not pulled and tail and tail[0].get("role") == "assistant":
            # user … [summary] … assistant: no standalone role fits; the summary opens the
            # first tail message instead of creating two consecutive same-role messages
            first = tail[0]
            content = first.get("content")
            if isinstance(content, list):
                merged: Any = [{"type": "text", "text": body}, *content]
            elif isinstance(content, str) and content:
                merged = f"{body}\n\n{content}"
            else:
                merged = body
            return [*head, {**first, "content": merged}, *tail[1:]]
        opener = tail[0] if tail and not pulled else None
        if (
            opener is not None
            and opener.get("role") == "user"
            and isinstance(opener.get("content"), str)
            and any(m.get("role") == "user" for m in tail[1:])
        ):
            # assistant … [summary] … user (not the latest one): the summary opens that user
            # message, whose words stay verbatim after it
            return [*head, {**opener, "content": f"{body}\n\n{opener['content']}"}, *tail[1:]]
        # no role avoids a repeat and nothing to merge into: user, so the first non-system
        # message stays a user message (providers merge consecutive user turns)
        return [*head, {"role": "user", "content": body}, *pulled, *tail]

    def _with_note(self, system: Message) -> Message:
        content = system.get("content")
        text = content_text(content)
        if self._note in text:
            return system
        if isinstance(content, list):
            return {**system, "content": [*content, {"type": "text", "text": self._note}]}
        return {**system, "content": f"{text}\n\n{self._note}" if text else self._note}

    def _clip_to_limit(self, msgs: list[Message], report: CompactionReport, start: int = 0) -> list[Message]:
        """Last resort: cut the largest tool outputs from ``start`` on (head + tail lines + their
        facts) until the list fits the hard limit. Never touches user, system or assistant
        messages, nor anything before ``start`` (the stable prefix)."""
        limit = self.hard_limit_tokens
        toks = [self.counter.count_messages([m]) for m in msgs]
        total = sum(toks)
        if total <= limit:
            return msgs
        out = list(msgs)
        # Outputs an earlier pass already cut are final: re-cutting them would rewrite text that
        # was sent and cached (prefix stability) for a few tokens each time.
        tools = [
            i
            for i, m in enumerate(msgs)
            if i >= start and m.get("role") == "tool" and _CLIP_NOTE not in content_text(m.get("content"))
        ]
        order = sorted(tools, key=lambda i: -toks[i])
        for i in order:
            if total <= limit:
                break
            excess = total - limit
            keep = max(200, toks[i] - excess - 50)
            clipped = _clip_output(content_text(msgs[i].get("content")), keep, self.counter.count)
            candidate = {**msgs[i], "content": clipped}
            new = self.counter.count_messages([candidate])
            if new >= toks[i]:
                continue  # cutting would not shrink it: leave the message byte-identical
            out[i] = candidate
            total += new - toks[i]
            report.notes.append(f"tool output at {i} cut from {toks[i]:,} to {new:,} tokens to fit the window")
        if total > limit:
            report.notes.append(f"still {total:,} tokens after cutting tool outputs (hard limit {limit:,})")
        return out


def _split_summary(text: str) -> tuple[str, str]:
    """``(summary, rest)`` of a message opened by a compaction summary."""
    body = text
    rest = ""
    end = text.find(SUMMARY_END)
    if end >= 0:
        body = text[:end]
        rest = text[end + len(SUMMARY_END) :].strip()
    # drop the header line(s) before the template
    at = body.find("## ")
    if at >= 0:
        body = body[at:]
    return body.strip(), rest


def _pruned(m: Message, facts: Facts) -> Message:
    """Phase 1: a tool result over PRUNE_MIN_CHARS becomes the marker plus a one-line digest
    (first line, up to three error lines) for the summarizer."""
    if m.get("role") != "tool":
        return m
    text = content_text(m.get("content"))
    if len(text) <= PRUNE_MIN_CHARS or text.startswith(PRUNED_MARKER):
        return m
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")[:160]
    digest = [first, *facts.errors[:3]]
    return {**m, "content": "\n".join([PRUNED_MARKER, *dict.fromkeys(d for d in digest if d)])}


_CLIP_NOTE = "lines cut by ctxengine to fit the context window"


def _clip_output(text: str, keep_tokens: int, count: Callable[[str], int]) -> str:
    """Head and tail lines of ``text`` within about ``keep_tokens`` (by ``count``), plus the
    error lines, URLs and paths of the cut middle, as many as fit."""
    lines = text.splitlines()
    used = 0
    head: list[str] = []
    for ln in lines:
        t = count(ln) + 1
        if used + t > keep_tokens // 2:
            break
        head.append(ln)
        used += t
    tail: list[str] = []
    for ln in reversed(lines[len(head) :]):
        t = count(ln) + 1
        if used + t > keep_tokens * 3 // 4:
            break
        tail.append(ln)
        used += t
    tail.reverse()
    cut = lines[len(head) : len(lines) - len(tail)]
    if not cut:
        return text
    cut_text = "\n".join(cut)
    kept: list[str] = []
    for f in [*error_lines(cut_text), *urls_in(cut_text), *paths_in(cut_text)]:
        t = count(f) + 1
        if used + t > keep_tokens:
            break
        kept.append(f)
        used += t
    note = f"[... {len(cut)} {_CLIP_NOTE}"
    note += f"; named in them: {', '.join(kept)}]" if kept else "]"
    return "\n".join([*head, note, *tail])
