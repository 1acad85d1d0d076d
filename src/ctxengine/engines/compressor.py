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
   ledger appends what the summary misses (older user messages, most recent first, within
   ``min(user_quote_budget_tokens, budget / 2)``, each over 120 tokens quoted by its first
   words and the names of the files it pastes; tool names, errors, URLs, paths); summary and
   ledger together stay within the budget, what does not fit is counted and retrievable.

Where a compaction lands (the settings that say it): the tail gets ``threshold × target_ratio``
tokens (``compression.target_ratio``), and may grow to keep ``protect_last_n`` messages only up
to :data:`TARGET_AFTER_RATIO` × threshold with the head and the summary; so a compaction at
``compression.threshold`` (default 50 % of the window) lands at or under about 37 % of it and the
next turns append without compacting. A client that pastes whole files into user messages
(aider) is compacted the same way: its older user messages fold into brief quotes, their
originals in the store (measured with ``scripts/aider_session.py``).

The texts written in place of originals name a recall tool only when the tools reach the model
(``reach``, the session's :class:`~ctxengine.engines.kit.records.RecallReach` that the host sets
from ``ContextManager.prepare(recall=...)``).
4. **Assemble**: head (a note appended to the system prompt on the first compression only, so
   the cached system prefix stays byte-stable afterwards), the ``[CONTEXT COMPACTION]`` summary
   with a role that avoids two consecutive same-role messages and keeps the first non-system
   message a user message, then the tail; orphaned tool pairs are sanitized.

Cache-aware (DESIGN §3.8, §3.11): before any summary, tool outputs are **cut** in batches
that pay for the cache they invalidate, giant outputs wherever they sit, before they are sent
(:mod:`ctxengine.engines.kit.cutpolicy`, which also runs the cut-first trial); compaction never
runs on more than ``max_consecutive`` calls in a row unless the window requires it (the
trigger, back-off included, is :class:`ctxengine.engines.kit.trigger.SummaryTrigger`).
Everything removed stays retrievable (:meth:`ContextCompressor.retrievable`, and the session
store's recall tools). Phases 1 and 4 are built with :mod:`ctxengine.summarize.assembly`,
phase 3 (summary span to fact ledger, the summary budget) with :mod:`ctxengine.summarize.fold`;
the head/tail plan is :func:`ctxengine.engines.kit.tail.plan_head_tail`.

Failure never loses context: a summarizer error falls back to the deterministic extractive
summary; an authentication error keeps the messages unchanged (reported in :meth:`get_status`
and logged) unless the context is over the hard limit; a compression that cannot get below the
threshold backs off ``backoff_turns`` turns instead of firing again every turn.
"""

from __future__ import annotations

import logging
import time
from importlib import resources
from typing import TYPE_CHECKING, Any, ClassVar, Self

from ctxengine.boundaries import sanitize_tool_pairs
from ctxengine.config import CompressionConfig
from ctxengine.engine import CompactionReport, Services
from ctxengine.engines.cacheaware import CacheAwareEngine
from ctxengine.engines.compressor_compat import (
    check_keywords,
    hermes_summarizer,
    reply_reserve,
    target_ratio_for,
    window_for,
)
from ctxengine.engines.compressor_modes import DigestMode, digest_policy, resolve_mode
from ctxengine.engines.kit.build import checked, configured_summarizer, session_counter
from ctxengine.engines.kit.cutpolicy import (
    BATCH,
    BATCH_TOKENS,
    CUT_MIN_TOKENS,
    CUT_TOKENS,
    CUTS_SUFFICED,
    GIANT_RATIO,
    KEEP_RECENT,
    MIN_CUT_TOKENS,
)
from ctxengine.engines.kit.pacing import MAX_CONSECUTIVE
from ctxengine.engines.kit.records import RecallReach, recall_pointer
from ctxengine.engines.kit.tail import HeadTailPlan, plan_head_tail
from ctxengine.engines.kit.trigger import HARD_LIMIT_RATIO, SummaryTrigger
from ctxengine.errors import ConfigError
from ctxengine.facts import Facts
from ctxengine.messages import Message
from ctxengine.summarize.assembly import (
    SUMMARY_END,
    SUMMARY_PREFIX,
    own_summary,
    place_summary,
    with_note,
)
from ctxengine.summarize.base import Summarizer
from ctxengine.summarize.extractive import ExtractiveSummarizer
from ctxengine.summarize.fold import fold_span, max_summary_tokens, summary_budget
from ctxengine.tokens import MessageTokens, TokenCounter

if TYPE_CHECKING:
    from ctxengine.summarize.fold import Folded

__all__ = ["CUTS_SUFFICED", "HARD_LIMIT_RATIO", "SUMMARY_END", "SUMMARY_PREFIX", "ContextCompressor"]

log = logging.getLogger("ctxengine.compressor")

TARGET_AFTER_RATIO = 0.75
"""A compression aims to land at or below this fraction of the threshold, so the next one is
several turns away (compactions in batches keep prompt caches warm); the tail may exceed its
token budget to keep ``protect_last_n`` messages only up to that level."""

def _prompt(name: str) -> str:
    return resources.files("ctxengine.summarize").joinpath(f"prompts/{name}").read_text(encoding="utf-8").strip()




class SummaryCompressor(SummaryTrigger):
    """The summarizing path of the default engine (see the module docstring); the engine is
    :class:`ContextCompressor`, which adds the digest mode.

    ``summarizer`` writes summaries; ``None`` uses the deterministic
    :class:`~ctxengine.summarize.extractive.ExtractiveSummarizer`, so the engine works with no
    LLM and no API key. ``counter`` counts tokens (the fast estimate by default; a session's
    :class:`~ctxengine.tokens.MessageTokens` is also where each message's count is read).
    """

    Settings: ClassVar[type[CompressionConfig]] = CompressionConfig
    """The ``compressor:`` section (``compression:`` in the seeds)."""
    _digests: CacheAwareEngine | None = None
    """The digest policy (digest mode: :class:`~ctxengine.engines.compressor_modes.DigestMode`)."""

    def __init__(
        self,
        model: str | None = None,
        threshold_percent: float | None = None,
        protect_first_n: int = 3,
        protect_last_n: int = 20,
        summary_target_ratio: float | None = None,
        quiet_mode: bool = False,
        summary_model_override: str | None = None,
        base_url: str | None = "",
        api_key: str | None = "",
        config_context_length: int | None = None,
        provider: str | None = "",
        api_mode: str | None = "",
        abort_on_summary_failure: bool = False,
        max_tokens: int | None = None,
        *,
        context_length: int | None = None,
        threshold: float | None = None,
        target_ratio: float | None = None,
        user_quote_budget_tokens: int = 20_000,
        backoff_turns: int = 3,
        enabled: bool = True,
        summarizer: Summarizer | None = None,
        counter: TokenCounter | None = None,
        keep_recent: int = KEEP_RECENT,
        batch: int = BATCH,
        batch_tokens: int = BATCH_TOKENS,
        cut_tokens: int = CUT_TOKENS,
        cut_min_tokens: int = CUT_MIN_TOKENS,
        giant_ratio: float = GIANT_RATIO,
        cost_aware: bool = True,
        max_consecutive: int = MAX_CONSECUTIVE,
        cut_before_summary: bool = True,
        recall: Any = None,
        reach: RecallReach | None = None,
        mode: str = "summary",
        **services: Any,
    ) -> None:
        """Keywords as in the seed's config (``threshold``, ``target_ratio`` …) or as Hermes
        Agent's ``ContextCompressor`` takes them, positional order included (``model``,
        ``threshold_percent``, ``protect_first_n``, ``protect_last_n``, ``summary_target_ratio``,
        ``quiet_mode``, ``summary_model_override``, ``base_url``, ``api_key``,
        ``config_context_length``, ``provider``, ``api_mode``, ``abort_on_summary_failure``,
        ``max_tokens``), with Hermes' meaning (:mod:`ctxengine.engines.compressor_compat`:
        window, reply reservation, clamped target ratio, summary model);
        ``abort_on_summary_failure``: a failed summary keeps the messages unchanged instead of
        using the extractive summary; ``quiet_mode`` silences the informational log line.

        ``cut_before_summary``: at the threshold, first cut every older whole output; when that
        lands at or under ``0.75 × threshold`` no summary is written (a cheaper rewrite; measured
        on the long sessions 0.50x -> 0.48x of no compaction, at 32K 1.05x -> 1.02x).

        ``mode``: ``summary`` (the default of a direct construction, as Hermes' compressor),
        ``digest`` (the cheapest policy under prompt caching, what a config without a
        summarizer gets) or ``auto`` (summary when a summarizer is given).

        Unknown keywords are refused (``TypeError``) except the host services (``store``,
        ``session_id`` …), which are accepted and unused.
        """
        check_keywords(services)
        self.model = model or ""
        self.base_url = base_url or ""
        self.api_key = api_key or ""
        self.provider = provider or ""
        self.api_mode = api_mode or ""
        self.quiet_mode = bool(quiet_mode)
        self.abort_on_summary_failure = bool(abort_on_summary_failure)
        self.summary_model = summary_model_override or ""
        self.max_tokens = reply_reserve(max_tokens)
        window = window_for(model, context_length, config_context_length)
        if threshold is None:
            threshold = threshold_percent if threshold_percent is not None else 0.50
        if not 0.0 < float(threshold) <= 1.0:
            raise ConfigError(f"threshold must be a fraction of the window in (0, 1], not {threshold}")
        super().__init__(context_length=window, threshold=float(threshold))
        self._apply_reserve()
        self.target_ratio = target_ratio_for(target_ratio, summary_target_ratio)
        self.summary_target_ratio = self.target_ratio
        self.threshold_percent = self.threshold_ratio
        self.protect_last_n = int(protect_last_n)
        self.protect_first_n = int(protect_first_n)
        self.user_quote_budget_tokens = int(user_quote_budget_tokens)
        self._init_cuts(
            keep_recent=keep_recent,
            batch=batch,
            batch_tokens=batch_tokens,
            cut_tokens=cut_tokens,
            cut_min_tokens=cut_min_tokens,
            giant_ratio=giant_ratio,
            cost_aware=cost_aware,
        )
        self.cut_before_summary = bool(cut_before_summary)
        if summarizer is None and self.summary_model:
            summarizer = hermes_summarizer(self.summary_model, self.base_url, self.api_key, self.provider)
        self.summarizer: Summarizer = summarizer or ExtractiveSummarizer()
        self.calls_model = not isinstance(self.summarizer, ExtractiveSummarizer)  # digests and the extractive summary are local work
        self._fallback = ExtractiveSummarizer()
        self.tokens = MessageTokens.of(counter)  # each message's count: the session's, else the engine's own
        self.counter: TokenCounter = self.tokens.counter
        self.recall = recall
        # whether the recall tools reach the model (the host sets it each turn): what the
        # texts written in place of originals say about where they are
        self.reach = reach if reach is not None else RecallReach()
        self._init_trigger(backoff_turns=backoff_turns, max_consecutive=max_consecutive, enabled=enabled)
        self._previous_summary: str | None = None
        self._carried = Facts()
        self._last_error: str | None = None
        # (length, last message) of the prefix the last compaction left stable: later ones never
        # cut inside it, so it stays byte-identical and is read from the prompt cache
        self._frozen: tuple[int, Message] | None = None
        self._note = _prompt("system_note.md")
        self._header = _prompt("summary_header.md")
        self._recallable: set[str] = set()
        self._summaries = 0
        if resolve_mode(mode, summarizer=summarizer) == "digest":
            self._use_digests(
                digest_policy(None, window, store=services.get("store"), counter=self.tokens, reach=self.reach, session_id=services.get("session_id"))
            )
        if not self.quiet_mode:
            log.info(
                "compressor: context_length=%d threshold=%d (%.0f%%) tail budget=%d summarizer=%s",
                self.context_length,
                self.threshold_tokens,
                self.threshold_ratio * 100,
                self.tail_token_budget,
                getattr(self.summarizer, "name", type(self.summarizer).__name__),
            )

    @property
    def name(self) -> str:
        return "compressor"

    def _use_digests(self, policy: CacheAwareEngine) -> None:
        """Compact with ``policy`` from now on (digest mode); the engine's threshold is the
        policy's (what a host judges a forced compaction by)."""
        self._digests = policy
        self.threshold_ratio = policy.threshold_ratio
        self.threshold_tokens = policy.threshold_tokens

    def _apply_reserve(self) -> None:
        """Hermes' ``max_tokens``: the reply's room comes out of the window the threshold is
        taken of."""
        if self.max_tokens is not None and self.max_tokens < self.context_length:
            self.threshold_tokens = int((self.context_length - self.max_tokens) * self.threshold_ratio)

    @classmethod
    def from_config(cls, settings: CompressionConfig | None = None, services: Services | None = None) -> Self:
        """Build from the ``compressor:`` section (``compression:`` in the seeds) and the
        session's :class:`~ctxengine.engine.Services`.

        The summarizer is ``services.summarizer``, else the one ``auxiliary.compression.model``
        configures, else extractive (no LLM). ``compression.mode`` (default ``auto``) picks
        digests when no summarizer is configured, summaries otherwise
        (:mod:`ctxengine.engines.compressor_modes`). The session store records the originals;
        ``services.recall`` (a :class:`ctxengine.recall.Recall`), when given, also answers
        :meth:`retrievable`; ``services.reach`` says whether the recall tools reach the model,
        so the summary never names a tool the model cannot call.
        """
        c, services = checked(CompressionConfig, settings, services)
        summarizer = configured_summarizer(services.config, services.summarizer)
        engine = cls(
            context_length=services.context_length,
            threshold=c.threshold,
            target_ratio=c.target_ratio,
            protect_last_n=c.protect_last_n,
            protect_first_n=c.protect_first_n,
            user_quote_budget_tokens=c.user_quote_budget_tokens,
            backoff_turns=c.backoff_turns,
            enabled=c.enabled,
            summarizer=summarizer,
            counter=session_counter(services),
            recall=services.recall,
            reach=services.reach,
            quiet_mode=True,
        )
        if resolve_mode(c.mode, summarizer=summarizer) == "digest":
            engine._use_digests(digest_policy(
                services.config,
                engine.context_length,
                store=services.store,
                counter=engine.tokens,
                reach=engine.reach,
                session_id=services.session_id,
                nodes=services.nodes,
                # a threshold other than the default says where old turns fold
                threshold=c.threshold if c.threshold != type(c).model_fields["threshold"].default else None,
            ))
        return engine

    # -- budgets ---------------------------------------------------------------------------------
    @property
    def tail_token_budget(self) -> int:
        """``threshold_tokens × target_ratio``: tokens the protected tail may hold."""
        return int(self.threshold_tokens * self.target_ratio)

    @property
    def max_summary_tokens(self) -> int:
        """``min(context_length × 0.05, 12,000)``: the ceiling of a summary's budget."""
        return max_summary_tokens(self.context_length)

    def summary_budget(self, content_tokens: int) -> int:
        """``content_tokens × 0.20`` clamped to ``[2,000, max_summary_tokens]``
        (:func:`ctxengine.summarize.fold.summary_budget`)."""
        return summary_budget(content_tokens, self.context_length)

    def update_model(self, model: str, context_length: int, **kwargs: Any) -> None:
        """Switch window: ``threshold_tokens`` and every budget follow the new length."""
        super().update_model(model, context_length, **kwargs)
        self.model = model
        self._apply_reserve()

    def on_session_reset(self) -> None:
        super().on_session_reset()
        self._previous_summary = None
        self._carried = Facts()
        self._last_error = None
        self._frozen = None
        self._reset_trigger()
        self._reset_cuts()
        self._recallable = set()
        self._summaries = 0

    def retrievable(self, text: str) -> bool:
        """True when ``text`` occurs verbatim in what this engine removed from the context (cut
        outputs, user messages that no longer fit), or the session store's recall finds it."""
        if not text:
            return False
        if text in self._recallable or any(text in o for o in self._originals):
            return True
        recall = self.recall
        if recall is not None:
            try:
                return bool(recall.retrievable(text))
            except Exception:  # a broken store answers "not retrievable", never raises here
                return False
        return False

    def get_status(self) -> dict[str, Any]:
        status = super().get_status()
        for key in ("last_prompt_tokens", "last_completion_tokens", "last_total_tokens"):
            # hosts set -1 while awaiting the real usage after a compaction: never show it
            status[key] = max(0, int(status.get(key) or 0))
        status.update(
            {
                "summarizer": getattr(self.summarizer, "name", type(self.summarizer).__name__),
                "tail_token_budget": self.tail_token_budget,
                "max_summary_tokens": self.max_summary_tokens,
                "backoff_turns_left": self._backoff,
                "last_error": self._last_error,
                "has_previous_summary": self._previous_summary is not None,
                "originals_kept": len(self._originals),
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
        toks = [self._tokens(m) for m in msgs]
        total = sum(toks)
        before = int(current_tokens) if current_tokens is not None else total
        report = CompactionReport(self.name, len(msgs), len(msgs), before, before)
        self.last_report = report
        if not msgs:
            report.notes.append("no messages: nothing to do")
            return self._finish(report, msgs, t0, changed=False)
        over = before >= self.threshold_tokens
        # at the threshold the summary folds the older outputs anyway: only giants are cut first
        msgs, cut = self._cut_stage(msgs, toks, batch=not over and focus_topic is None, report=report)
        if over and focus_topic is None and self.cut_before_summary:
            # every older whole output cut may be enough: a cheaper rewrite than a summary
            target = int(self.threshold_tokens * TARGET_AFTER_RATIO)
            trial = self._cuts_suffice(msgs, toks, cut, before=before, total=total, target=target, report=report)
            if trial is not None:
                return self._finish(report, trial, t0, changed=True, first_changed=report.replaced[0])
        report.replaced = list(cut)
        if not over and focus_topic is None:
            # under the threshold only cuts happen (giant outputs, a due batch): no summary
            if cut:
                return self._finish(report, msgs, t0, changed=True, first_changed=cut[0])
            report.notes.append("under the threshold: nothing to do")
            return self._finish(report, msgs, t0, changed=False)
        # the threshold was reached: the summary follows the cuts in the same rewrite (the
        # hard-limit decisions go by the size the caller reported, before any cut)
        return self._summarized(messages, msgs, toks, cut, focus_topic, reported=before, total=total, report=report, t0=t0)

    def _summarized(
        self,
        messages: list[Message],
        msgs: list[Message],
        toks: list[int],
        cut: list[int],
        focus_topic: str | None,
        *,
        reported: int,
        total: int,
        report: CompactionReport,
        t0: float,
    ) -> list[Message]:
        """Phases 2 to 4 on ``msgs`` (``messages`` after the cuts ``cut``, ``toks`` their
        sizes, ``total`` their sum before the cuts): the middle folded into the summary."""
        plan = self._plan(msgs, toks)
        if not plan.middle:
            return self._without_middle(messages, msgs, cut, plan, report, t0)
        head = msgs[: plan.head_end]
        tail = msgs[plan.tail_start :]
        # the client's live messages (its working set) and the latest user message stay verbatim
        pulled = [msgs[i] for i in plan.live] + ([msgs[plan.pulled_user]] if plan.pulled_user is not None else [])
        middle = [msgs[i] for i in plan.middle]

        # previous summaries in the middle become the text to update, not content to summarize
        self._remember(middle)
        folded = self._fold_middle(middle, (*head, *pulled, *tail), sum(toks[i] for i in plan.middle), focus_topic, reported, report)
        self._last_error = folded.error
        if folded.text is None:  # authentication failed below the hard limit (or abort): keep all
            report.fallback = folded.fallback
            self._backoff = self.backoff_turns
            if cut:
                return self._finish(report, msgs, t0, changed=True, first_changed=cut[0])
            return self._finish(report, list(messages), t0, changed=False)
        self._recallable.update(folded.unquoted_users)
        summary_text = folded.text

        out = self._assemble(head, summary_text, pulled, tail)
        out = sanitize_tool_pairs(out)
        if not cut and sum(self._tokens(m) for m in out) >= total:
            # the middle was smaller than its summary (a few short turns between messages kept
            # verbatim): a rewrite that grows the context is not a compaction
            report.notes.append("the summary would not shrink the context: nothing changed")
            return self._finish(report, list(messages), t0, changed=False)
        if head:
            self._frozen = (len(head), out[len(head) - 1])
        out = self._clip_to_limit(out, report, self.hard_limit_tokens, len(head) + 1)
        self._previous_summary = summary_text
        self._carried = folded.required
        self._summaries += 1
        report.fallback = folded.fallback
        report.replaced = sorted(set(cut) | set(plan.middle))
        first = 0 if out and messages and out[0] is not messages[0] else len(head)
        return self._finish(report, out, t0, changed=True, first_changed=first)

    def _without_middle(self, messages: list[Message], msgs: list[Message], cut: list[int], plan: HeadTailPlan, report: CompactionReport, t0: float) -> list[Message]:
        """Nothing between head and tail to summarize: ``msgs`` clipped to the hard limit."""
        out = self._clip_to_limit(msgs, report, self.hard_limit_tokens, plan.head_end)
        report.notes.append("no message between head and tail to summarize")
        changed = [i for i, (a, b) in enumerate(zip(out, messages, strict=True)) if a is not b]
        if not changed:
            return self._finish(report, list(messages), t0, changed=False)
        if len(changed) > len(cut):
            self._frozen = (changed[-1] + 1, out[changed[-1]])
        return self._finish(report, out, t0, changed=True, first_changed=changed[0])

    # phase 3
    def _fold_middle(self, middle: list[Message], kept: tuple[Message, ...], content_tokens: int, focus_topic: str | None, reported: int, report: CompactionReport) -> Folded:
        """``middle`` (``content_tokens`` of it) folded next to the ``kept`` messages
        (:func:`~ctxengine.summarize.fold.fold_span`), the caller having ``reported`` tokens."""
        budget = self.summary_budget(content_tokens)
        return fold_span(
            middle,
            kept,
            previous=self._previous_summary,
            carried=self._carried,
            summarizer=self.summarizer,
            fallback=self._fallback,
            focus_topic=focus_topic,
            budget=budget,
            content_tokens=content_tokens,
            tokens_of=self._tokens,
            facts_of=self._facts,
            hard_limit=self.hard_limit_tokens,
            context_length=self.context_length,
            min_output_tokens=MIN_CUT_TOKENS,
            over_hard_limit=reported >= self.hard_limit_tokens,
            abort_on_failure=self.abort_on_summary_failure,
            notes=report.notes,
            log=log,
            # the quotes share the summary's budget: at most half of it (and the setting)
            quote_budget=min(self.user_quote_budget_tokens, budget // 2),
            pointer=recall_pointer(self.reach),
        )

    def _finish(
        self,
        report: CompactionReport,
        out: list[Message],
        t0: float,
        *,
        changed: bool,
        first_changed: int = 0,
        tokens_before: int | None = None,
    ) -> list[Message]:
        if tokens_before is not None:
            report.tokens_before = tokens_before
        after = sum(self._tokens(m) for m in out) if changed else report.tokens_before
        report.messages_after = len(out)
        report.tokens_after = after
        if changed:
            self.compression_count += 1
            self._compacted_to(out, after, first_changed, report.notes)
        elif report.tokens_before >= self.threshold_tokens:
            self._back_off()
        report.elapsed_ms = (time.perf_counter() - t0) * 1000.0
        return out

    # phase 2
    def _plan(self, msgs: list[Message], toks: list[int]) -> HeadTailPlan:
        budget = self.tail_token_budget
        total = sum(toks)

        def soft_cap(head_tokens: int) -> int:
            reserve = self.summary_budget(max(0, total - head_tokens - budget))
            return max(budget, int(self.threshold_tokens * TARGET_AFTER_RATIO) - head_tokens - reserve)

        return plan_head_tail(
            msgs,
            toks,
            protect_first_n=self.protect_first_n,
            protect_last_n=self.protect_last_n,
            tail_budget=budget,
            soft_cap=soft_cap,
            frozen=self._frozen,
            is_own_summary=own_summary,
            live=self.reach.is_live if self.reach.live else None,
        )

    # phase 4
    def _assemble(self, head: list[Message], summary: str, pulled: list[Message], tail: list[Message]) -> list[Message]:
        head = list(head)
        # the first compaction only: once a prefix is frozen (even by a cut without summary)
        # the system prompt is part of it and must stay byte-identical
        if self.compression_count == 0 and self._frozen is None and head and head[0].get("role") == "system":
            head[0] = with_note(head[0], self._note)
        return place_summary(head, f"{self._header}\n\n{summary}\n{SUMMARY_END}", pulled, tail)


class ContextCompressor(DigestMode, SummaryCompressor):
    """The default engine: built from a config with no summarizer it compacts with digests
    (``compression.mode``, :mod:`ctxengine.engines.compressor_modes`), else with summaries
    (:class:`SummaryCompressor`, the module docstring)."""
