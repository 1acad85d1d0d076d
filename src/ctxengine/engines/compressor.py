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

Cache-aware (DESIGN §3.8, §3.11): before any summary, tool outputs are **cut** (head + tail
lines and a verbatim facts block, :func:`ctxengine.engines.kit.cut_output`) in batches, soon
after use: an output stays whole while it is one of the last ``keep_recent`` tool exchanges, and
the older whole outputs are cut together once ``batch`` of them (or ``batch_tokens``) wait *and*
the cut pays for the cache it invalidates (:func:`ctxengine.cost.compaction_break_even`). A
giant output (over ``giant_ratio`` of the window) is cut wherever it sits, head and tail
included, before it is ever sent: protection keeps a message's place and facts, not its size.
Cut text is never cut again, so the settled prefix stays byte-stable; compaction never runs on
more than ``max_consecutive`` calls in a row unless the window requires it. Everything removed
(cut outputs, user messages that no longer fit verbatim) stays retrievable
(:meth:`ContextCompressor.retrievable`, and the session store's recall tools).

Failure never loses context: a summarizer error falls back to the deterministic extractive
summary; an authentication error keeps the messages unchanged (reported in :meth:`get_status`
and logged) unless the context is over the hard limit; a compression that cannot get below the
threshold backs off ``backoff_turns`` turns instead of firing again every turn.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

from ctxengine.boundaries import align_cut, group_spans, sanitize_tool_pairs
from ctxengine.cost import compaction_break_even
from ctxengine.engine import CompactionReport, ContextEngine
from ctxengine.engines.kit import MARK, cut_output
from ctxengine.engines.kit.tail import tail_by_exchanges
from ctxengine.errors import ConfigError, SummarizerAuthError, SummarizerError
from ctxengine.facts import FACT_KINDS, Facts, extract_facts
from ctxengine.messages import (
    Message,
    content_text,
    is_summary,
    message_text,
    tool_call_args,
    tool_calls,
)
from ctxengine.models import DEFAULT_CONTEXT_LENGTH
from ctxengine.redact import redact
from ctxengine.summarize.base import Summarizer, has_template
from ctxengine.summarize.extractive import PRUNED_MARKER, ExtractiveSummarizer
from ctxengine.summarize.ledger import LedgerResult, TextIndex, apply_ledger
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


KEEP_RECENT = 3
"""Tool exchanges at the end kept whole (the agent is still using them): an output is whole for
at least the two calls after the one that produced it."""
BATCH = 3
BATCH_TOKENS = 6_000
"""Older whole outputs are cut together once this many wait, or once they hold this many tokens
(measured on the long sessions: batches of 3 cost the same as 4-6 and keep each compaction
short)."""
CUT_TOKENS = 256
"""What a cut output keeps: marker, first and last lines, facts of the removed middle."""
CUT_MIN_TOKENS = 400
"""Outputs shorter than this are never cut: the record would save little."""
GIANT_RATIO = 0.08
"""An output over this fraction of the window is cut wherever it sits, before it is sent."""
GIANT_TOKENS = 8_000
GIANT_KEEP_RATIO = 0.02
"""What a giant output keeps (of the window, at least CUT_TOKENS, at most 4,000 tokens)."""
MAX_CONSECUTIVE = 3
MIN_CUT_TOKENS = 64
"""The least a tool output is cut to when the window requires it (the marker and a line)."""
CUTS_SUFFICED = "cutting the older outputs was enough: no summary needed"
MIN_SHRUNK_SUMMARY = 150
"""A summary shrunk to make room for user quotes keeps at least this many tokens."""
"""Compaction never runs on more calls in a row than this unless the window requires it."""
MIN_HORIZON = 8
"""A batch cut must pay for its cache rewrite within max(MIN_HORIZON, calls so far) calls."""

_SERVICES = frozenset({"store", "session_id", "model_name", "config", "services"})


def _hermes_summarizer(model: str, base_url: str, api_key: str, provider: str) -> Summarizer:
    """The LLM summarizer Hermes' keywords name (``summary_model_override`` and its endpoint)."""
    from ctxengine.clients.factory import build_client
    from ctxengine.config import SummarizerConfig
    from ctxengine.summarize.llm import LlmSummarizer

    env = {"CTXENGINE_SUMMARY_API_KEY": api_key} if api_key else {}
    cfg = SummarizerConfig(
        provider=provider or "auto",
        model=model,
        base_url=base_url or None,
        api_key_env="CTXENGINE_SUMMARY_API_KEY" if api_key else None,
    )
    return LlmSummarizer(build_client(cfg, environ=env or None), model)


@dataclass(slots=True)
class _Scan:
    """The per-call view of a message list (see :meth:`ContextCompressor._scan`)."""

    n: int = 0
    first: Message | None = None
    last: Message | None = None
    toks: list[int] = field(default_factory=list)
    cum: list[int] = field(default_factory=lambda: [0])
    total: int = 0
    groups: list[int] = field(default_factory=list)
    """Indices of assistant messages whose tool results follow (tool exchanges)."""
    cands: list[int] = field(default_factory=list)
    """Tool outputs large enough to cut and not cut yet."""


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
        **services: Any,
    ) -> None:
        """Keywords as in the seed's config (``threshold``, ``target_ratio`` …) or as Hermes
        Agent's ``ContextCompressor`` takes them, positional order included (``model``,
        ``threshold_percent``, ``protect_first_n``, ``protect_last_n``, ``summary_target_ratio``,
        ``quiet_mode``, ``summary_model_override``, ``base_url``, ``api_key``,
        ``config_context_length``, ``provider``, ``api_mode``, ``abort_on_summary_failure``,
        ``max_tokens``), with Hermes' meaning:

        * the window is ``context_length``, else ``config_context_length``, else the model
          table's window for ``model``; ``max_tokens`` (a positive int) is the reply's
          reservation: the threshold is taken of ``window - max_tokens``;
        * ``summary_target_ratio`` is clamped to [0.10, 0.80] as Hermes does;
        * ``summary_model_override`` with ``base_url``/``api_key``/``provider`` selects the LLM
          that writes summaries (none: the deterministic extractive summary);
        * ``abort_on_summary_failure``: a failed summary keeps the messages unchanged instead
          of using the extractive summary;
        * ``quiet_mode`` silences the informational log line.

        ``cut_before_summary``: at the threshold, first cut every older whole output; when that
        lands at or under ``0.75 × threshold`` no summary is written (a cheaper rewrite; measured
        on the long sessions 0.50x -> 0.48x of no compaction, at 32K 1.05x -> 1.02x).

        Unknown keywords are refused (``TypeError``) except the host services (``store``,
        ``session_id`` …), which are accepted and unused.
        """
        unknown = sorted(set(services) - _SERVICES)
        if unknown:
            raise TypeError(f"ContextCompressor got unexpected keyword argument(s): {', '.join(unknown)}")
        self.model = model or ""
        self.base_url = base_url or ""
        self.api_key = api_key or ""
        self.provider = provider or ""
        self.api_mode = api_mode or ""
        self.quiet_mode = bool(quiet_mode)
        self.abort_on_summary_failure = bool(abort_on_summary_failure)
        self.summary_model = summary_model_override or ""
        reserve = max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0 else None
        self.max_tokens = reserve
        if context_length is None:
            if config_context_length is not None:
                context_length = int(config_context_length)
            elif model:
                from ctxengine.models import resolve_model

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    context_length = resolve_model(model).context_length
            else:
                context_length = DEFAULT_CONTEXT_LENGTH
        if int(context_length) <= 0:
            raise ConfigError(f"context_length must be a positive number of tokens, not {context_length}")
        if threshold is None:
            threshold = threshold_percent if threshold_percent is not None else 0.50
        if not 0.0 < float(threshold) <= 1.0:
            raise ConfigError(f"threshold must be a fraction of the window in (0, 1], not {threshold}")
        super().__init__(context_length=int(context_length), threshold=float(threshold))
        self._apply_reserve()
        if target_ratio is None:
            target_ratio = max(0.10, min(float(summary_target_ratio), 0.80)) if summary_target_ratio is not None else 0.20
        self.target_ratio = float(target_ratio)
        self.summary_target_ratio = self.target_ratio
        self.threshold_percent = self.threshold_ratio
        self.protect_last_n = int(protect_last_n)
        self.protect_first_n = int(protect_first_n)
        self.user_quote_budget_tokens = int(user_quote_budget_tokens)
        self.backoff_turns = int(backoff_turns)
        self.enabled = bool(enabled)
        self.keep_recent = max(0, int(keep_recent))
        self.batch = max(1, int(batch))
        self.batch_tokens = max(0, int(batch_tokens))
        self.cut_tokens = max(64, int(cut_tokens))
        self.cut_min_tokens = max(self.cut_tokens + 1, int(cut_min_tokens))
        self.giant_ratio = float(giant_ratio)
        self.cost_aware = bool(cost_aware)
        self.max_consecutive = max(1, int(max_consecutive))
        self.cut_before_summary = bool(cut_before_summary)
        if summarizer is None and self.summary_model:
            summarizer = _hermes_summarizer(self.summary_model, self.base_url, self.api_key, self.provider)
        self.summarizer: Summarizer = summarizer or ExtractiveSummarizer()
        self._fallback = ExtractiveSummarizer()
        self.counter: TokenCounter = counter or EstimateCounter()
        self.recall = recall
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
        self._tok_memo: dict[int, tuple[Message, int]] = {}
        self._fact_memo: dict[int, tuple[Message, Facts]] = {}
        self._scan_state: _Scan | None = None
        # what left the context (cut outputs, user messages that no longer fit): retrievable
        self._originals: list[str] = []
        self._recallable: set[str] = set()
        self._summaries = 0
        self._calls = 0
        self._streak = 0
        self._compacted = False
        self._expected_stable: int | None = None
        self._stable_ratio = 1.0
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

    def _apply_reserve(self) -> None:
        """Hermes' ``max_tokens``: the reply's room comes out of the window the threshold is
        taken of."""
        if self.max_tokens is not None and self.max_tokens < self.context_length:
            self.threshold_tokens = int((self.context_length - self.max_tokens) * self.threshold_ratio)

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
        extractive (no LLM). ``store`` is accepted for the registry's uniform call: the session
        store records the originals; ``recall`` (a :class:`ctxengine.recall.Recall`), when given,
        also answers :meth:`retrievable`.
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
            recall=services.get("recall"),
            quiet_mode=True,
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
        :meth:`compress` are taken as what was sent). Counts the calls in a row that compacted,
        and learns from the cache fields how much of a kept prefix the provider really reads."""
        u = self._record_usage(usage)
        if self._sent is not None and u.prompt_tokens > 0:
            self._anchor.anchor(self._sent, u.prompt_tokens)
        self._calls += 1
        self._streak = self._streak + 1 if self._compacted else 0
        self._compacted = False
        if self._expected_stable is not None and (u.cache_read_tokens or u.cache_write_tokens):
            if self._expected_stable > 0:
                self._stable_ratio = min(1.0, u.cache_read_tokens / self._expected_stable)
            self._expected_stable = None

    def _thrashing(self, tokens: int) -> bool:
        """True when the last ``max_consecutive`` calls all compacted and the window does not
        require another one now."""
        return self._streak >= self.max_consecutive and tokens < self.hard_limit_tokens

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        """True when the prompt reaches ``threshold × context_length``.

        Uses ``prompt_tokens`` when given, else the last provider-reported prompt tokens.
        While backing off after a compression that could not get under the threshold, turns
        are skipped (each call counts one) unless the hard limit is reached; so are calls after
        ``max_consecutive`` compacting calls in a row.
        """
        if not self.enabled:
            return False
        tokens = self.last_prompt_tokens if prompt_tokens is None else int(prompt_tokens)
        if tokens < self.threshold_tokens:
            return False
        if self._backoff > 0 and tokens < self.hard_limit_tokens:
            self._backoff -= 1
            return False
        return not self._thrashing(tokens)

    def should_compress_preflight(self, messages: list[Message]) -> bool:
        """Before the API call: True when a giant output waits to be cut (it was never sent:
        cutting it costs nothing), when a batch of older outputs is due and pays for itself, or
        when the last real prompt tokens plus an estimate of the messages appended since
        (anchored counting) reach the threshold."""
        self._sent = messages
        if not self.enabled:
            return False
        scan = self._scan(messages)
        limit = self.giant_tokens
        if any(scan.toks[i] > limit for i in scan.cands):
            return True
        tokens = self._anchor.count(messages)
        if self._thrashing(tokens):
            return False
        if tokens >= self.threshold_tokens:
            return self._backoff == 0 or tokens >= self.hard_limit_tokens
        keep = self.keep_recent
        tail = len(messages) if keep <= 0 or not scan.groups else scan.groups[-keep] if len(scan.groups) >= keep else scan.groups[0]
        waiting = [i for i in scan.cands if i < tail]
        return bool(self._batch_pays(waiting, scan.toks, scan.total, lambda k: scan.cum[k]))

    def _scan(self, msgs: list[Message]) -> _Scan:
        """What the per-call check needs, kept incrementally: a list that extends the one seen
        last (same message objects) costs only its new messages, so the check before each call
        stays flat however long the session grows; any other list is scanned anew."""
        st = self._scan_state
        n = st.n if st is not None else 0
        if st is None or n == 0 or len(msgs) < n or msgs[n - 1] is not st.last or msgs[0] is not st.first:
            st = _Scan()
            n = 0
        for i in range(n, len(msgs)):
            m = msgs[i]
            t = self._tokens(m)
            st.toks.append(t)
            st.total += t
            st.cum.append(st.total)
            if m.get("role") == "tool":
                prev = msgs[i - 1] if i > 0 else None
                if prev is not None and prev.get("role") == "assistant" and prev.get("tool_calls"):
                    st.groups.append(i - 1)
                if self._cuttable(m, t):
                    st.cands.append(i)
        if msgs:
            st.n, st.first, st.last = len(msgs), msgs[0], msgs[-1]
        self._scan_state = st
        return st

    def update_model(self, model: str, context_length: int, **kwargs: Any) -> None:
        """Switch window: ``threshold_tokens`` and every budget follow the new length."""
        super().update_model(model, context_length, **kwargs)
        self.model = model
        self._apply_reserve()

    def on_session_reset(self) -> None:
        super().on_session_reset()
        self._previous_summary = None
        self._carried = Facts()
        self._backoff = 0
        self._last_error = None
        self._frozen = None
        self._sent = None
        self._anchor.reset()
        self._originals = []
        self._recallable = set()
        self._scan_state = None
        self._summaries = 0
        self._calls = 0
        self._streak = 0
        self._compacted = False
        self._expected_stable = None
        self._stable_ratio = 1.0

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

    # -- cutting ---------------------------------------------------------------------------------
    def _tokens(self, m: Message) -> int:
        hit = self._tok_memo.get(id(m))
        if hit is not None and hit[0] is m:
            return hit[1]
        t = self.counter.count_messages([m])
        if len(self._tok_memo) > 200_000:
            self._tok_memo.clear()
        self._tok_memo[id(m)] = (m, t)
        return t

    def _facts(self, m: Message) -> Facts:
        """The facts of one message, memoised per message object (a message is extracted once
        however many compactions see it)."""
        hit = self._fact_memo.get(id(m))
        if hit is not None and hit[0] is m:
            return hit[1]
        f = extract_facts([m])
        if len(self._fact_memo) > 50_000:
            self._fact_memo.clear()
        self._fact_memo[id(m)] = (m, f)
        return f

    @property
    def giant_tokens(self) -> int:
        """Outputs larger than this are cut wherever they sit (``giant_ratio`` of the window,
        and at least GIANT_TOKENS or a quarter of the window, whichever is less)."""
        ratio = int(self.context_length * self.giant_ratio)
        # an ordinary long output (a few thousand tokens) is not giant in a small window: it is
        # kept whole for its turns like any other; giant means over GIANT_TOKENS as well, unless
        # that is more than a quarter of the window
        return max(self.cut_min_tokens, ratio, min(GIANT_TOKENS, self.context_length // 4))

    @property
    def giant_keep_tokens(self) -> int:
        return max(self.cut_tokens, min(4_000, int(self.context_length * GIANT_KEEP_RATIO)))

    def _cuttable(self, m: Message, tokens: int) -> bool:
        if m.get("role") != "tool" or tokens < self.cut_min_tokens:
            return False
        content = m.get("content")
        if not isinstance(content, str | list):
            return False
        text = content_text(content)
        return not _settled(text)

    def _giants(self, msgs: list[Message], toks: list[int]) -> list[int]:
        limit = self.giant_tokens
        return [i for i, m in enumerate(msgs) if toks[i] > limit and self._cuttable(m, toks[i])]

    def _tail_start(self, msgs: list[Message]) -> int:
        """Where the last ``keep_recent`` tool exchanges begin (kept whole)."""
        return tail_by_exchanges(msgs, self.keep_recent)

    def _waiting(self, msgs: list[Message], toks: list[int]) -> list[int]:
        end = self._tail_start(msgs)
        return [i for i in range(end) if self._cuttable(msgs[i], toks[i])]

    def _due_batch(self, msgs: list[Message], toks: list[int]) -> list[int]:
        """The older whole outputs to cut now, or ``[]``: enough of them wait *and* cutting
        them pays for the cache it invalidates within as many calls as the session has made
        (at least MIN_HORIZON)."""
        waiting = self._waiting(msgs, toks)
        if not waiting:
            return []
        total = sum(toks)
        return self._batch_pays(waiting, toks, total, lambda k: sum(toks[:k]))

    def _batch_pays(self, waiting: list[int], toks: list[int], total: int, prefix: Callable[[int], int]) -> list[int]:
        """``waiting`` when it is a batch worth cutting now, else ``[]`` (``prefix(k)``: tokens
        of the first ``k`` messages)."""
        if not waiting:
            return []
        sizes = [toks[i] for i in waiting]
        # when the provider reads little of a kept prefix from cache (a rolling placement such
        # as system_and_3 re-reads only the system prompt after any edit), every cut rewrites
        # nearly everything: batches grow so that rewrites are rarer (up to 8x; measured on the
        # long sessions: 0.65x -> 0.52x of no compaction under system_and_3)
        scale = 1.0 / max(0.125, min(1.0, self._stable_ratio))
        if len(waiting) < self.batch * scale and sum(sizes) < self.batch_tokens * scale:
            return []
        if not self.cost_aware:
            return waiting
        saved = sum(max(0, t - self.cut_tokens) for t in sizes)
        stable = int(prefix(waiting[0]) * self._stable_ratio)
        horizon = max(MIN_HORIZON, self._calls)
        return waiting if compaction_break_even(total, total - saved, stable) <= horizon else []

    def _cut(self, m: Message, budget: int) -> Message:
        text = content_text(m.get("content"))
        cut = cut_output(text, budget_tokens=budget, counter=self.counter)
        if cut == text:
            return m
        self._keep_original(text)
        return {**m, "content": cut}

    def _keep_original(self, text: str) -> None:
        self._originals.append(text)

    def _remember(self, span: list[Message]) -> None:
        """Keep the text of messages a summary replaces (and each tool call's arguments as the
        model wrote them) so :meth:`retrievable` answers for them as recall over the store does."""
        for m in span:
            if _own_summary(m) or _settled(content_text(m.get("content"))):
                continue  # already a record: its originals were kept when it was written
            text = message_text(m)
            if text:
                self._keep_original(text)
            for c in tool_calls(m):
                args = tool_call_args(c)
                values = [args] if isinstance(args, str) else [v for v in args.values() if isinstance(v, str)]
                for v in values:
                    if v:
                        self._keep_original(v)

    def _cut_stage(
        self, msgs: list[Message], toks: list[int], *, batch: bool, report: CompactionReport, everything: bool = False
    ) -> tuple[list[Message], list[int]]:
        """Cut giant outputs anywhere and, with ``batch``, the batch of older whole outputs when
        it is due. Returns the new list and the indices cut (``toks`` is updated in place)."""
        giants = self._giants(msgs, toks)
        waiting = (self._waiting(msgs, toks) if everything else self._due_batch(msgs, toks)) if batch else []
        targets = sorted(set(giants) | set(waiting))
        if not targets:
            return msgs, []
        out = list(msgs)
        done: list[int] = []
        big = set(giants)
        for i in targets:
            budget = self.giant_keep_tokens if i in big and i >= self._tail_start(msgs) else self.cut_tokens
            new = self._cut(msgs[i], budget)
            if new is msgs[i]:
                continue
            out[i] = new
            toks[i] = self._tokens(new)
            done.append(i)
        if done:
            report.notes.append(f"cut {len(done)} tool output(s) to head and tail lines with their facts (originals retrievable)")
        return out, done

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
        reported = before
        # at the threshold the summary folds the older outputs anyway: only giants are cut first
        msgs, cut = self._cut_stage(msgs, toks, batch=not over and focus_topic is None, report=report)
        if over and focus_topic is None and self.cut_before_summary:
            # every older whole output cut may be enough: a cheaper rewrite than a summary
            trial_toks = list(toks)
            trial_notes = len(report.notes)
            trial, more = self._cut_stage(msgs, trial_toks, batch=True, report=report, everything=True)
            both = sorted(set(cut) | set(more))
            if both and before - (total - sum(trial_toks)) <= int(self.threshold_tokens * TARGET_AFTER_RATIO):
                report.replaced = both
                report.notes.append(CUTS_SUFFICED)
                return self._finish(report, trial, t0, changed=True, first_changed=both[0])
            # not enough: the summary folds those outputs anyway, and cutting them first would
            # only rewrite the head; the trial is dropped (its originals stay retrievable)
            del report.notes[trial_notes:]
        report.replaced = list(cut)
        if not over and focus_topic is None:
            # under the threshold only cuts happen (giant outputs, a due batch): no summary
            if cut:
                return self._finish(report, msgs, t0, changed=True, first_changed=cut[0])
            report.notes.append("under the threshold: nothing to do")
            return self._finish(report, msgs, t0, changed=False)
        if cut:
            # the threshold was reached: the summary follows the cuts in the same rewrite
            before = max(0, before - (total - sum(toks)))
            total = sum(toks)

        plan = self._plan(msgs, toks)
        if not plan.middle:
            out = self._clip_to_limit(msgs, report, plan.head_end)
            report.notes.append("no message between head and tail to summarize")
            changed = [i for i, (a, b) in enumerate(zip(out, messages, strict=True)) if a is not b]
            if not changed:
                return self._finish(report, list(messages), t0, changed=False)
            if len(changed) > len(cut):
                self._frozen = (changed[-1] + 1, out[changed[-1]])
            return self._finish(report, out, t0, changed=True, first_changed=changed[0])

        head = msgs[: plan.head_end]
        tail = msgs[plan.tail_start :]
        pulled = [msgs[plan.pulled_user]] if plan.pulled_user is not None else []
        middle = [msgs[i] for i in plan.middle]

        # previous summaries in the middle become the text to update, not content to summarize
        previous = self._previous_summary
        span: list[Message] = []
        acc: dict[str, dict[str, None]] = {k: {} for k in FACT_KINDS}
        self._remember(middle)
        for m in middle:
            if _own_summary(m):
                text, rest = _split_summary(content_text(m.get("content")))
                if previous is None:
                    previous = text
                if rest or m.get("tool_calls"):
                    m = {**m, "content": rest}
                else:
                    continue
            facts = self._facts(m)
            for k in FACT_KINDS:
                acc[k].update(dict.fromkeys(getattr(facts, k)))
            span.append(_pruned(m, facts))
        required = Facts(**{k: list(v) for k, v in acc.items()}).merge(self._carried)
        if previous is not None and not self._carried.all():
            required = required.merge(extract_facts([{"role": "assistant", "content": previous}], include_users=False))

        content_tokens = sum(toks[i] for i in plan.middle)
        budget = self.summary_budget(content_tokens)
        # the hard-limit decisions go by the size the caller reported (before any cut)
        summary, fallback = self._summarize(span, previous, focus_topic, budget, reported, report)
        if summary is None:  # authentication failed below the hard limit (or abort): keep all
            self._backoff = self.backoff_turns
            if cut:
                return self._finish(report, msgs, t0, changed=True, first_changed=cut[0])
            return self._finish(report, list(messages), t0, changed=False)
        summary = self._bounded(summary, budget, span, previous, focus_topic, content_tokens, report)
        if fallback is None and estimate(summary) >= content_tokens > 0:
            # a summary that does not shrink what it replaces is no summary: extractive instead
            report.notes.append(f"summary of {estimate(summary):,} tokens does not shrink the {content_tokens:,} it replaces: extractive summary used")
            summary = self._fallback.summarize(span, previous_summary=previous, focus_topic=focus_topic, budget_tokens=budget)
            fallback = "extractive"

        kept = (*head, *pulled, *tail)
        fixed = sum(self._tokens(m) for m in kept)
        # what the kept messages need at least: tool outputs can still be cut to fit the window
        floor = sum(min(self._tokens(m), MIN_CUT_TOKENS) if m.get("role") == "tool" else self._tokens(m) for m in kept)
        # facts extracted from the kept messages occur in their text: a set lookup answers most
        known: set[str] = set()
        for m in kept:
            f = self._facts(m)
            known.update(f.paths, f.urls, f.tools, f.errors)
        present = TextIndex("\n".join(message_text(m) for m in kept), known)

        def ledger_for(text: str) -> LedgerResult:
            return apply_ledger(
                text,
                required,
                present,
                budget_tokens=max(0, self.hard_limit_tokens - fixed - estimate(text) - 200),
                # the user's words are anchors: quoted while they fit the window (outputs of the
                # tail are cut afterwards if need be); those that cannot fit stay retrievable
                user_budget_tokens=max(0, int(self.context_length * 0.98) - floor - estimate(text) - 100),
            )

        ledger = ledger_for(summary)
        if ledger.unquoted_users and estimate(summary) > MIN_SHRUNK_SUMMARY:
            # user messages come before the summary's prose: shrink it to make room for them
            need = sum(estimate(u) + 4 for u in ledger.unquoted_users)
            smaller = max(MIN_SHRUNK_SUMMARY, estimate(summary) - need)
            summary = self._bounded(summary, smaller, span, previous, focus_topic, content_tokens, report)
            ledger = ledger_for(summary)
        if ledger.unquoted_users:
            for u in ledger.unquoted_users:
                self._recallable.add(u)
            report.notes.append(
                f"{len(ledger.unquoted_users)} older user message(s) do not fit the window verbatim: "
                "kept in the store, retrievable verbatim with ctx_grep"
            )
        if not ledger.complete:
            detail = ", ".join(f"{n} {k}" for k, n in ledger.dropped.items() if n)
            report.notes.append(f"fact ledger out of space: {detail} not in the summary (retrievable with ctx_grep)")
        summary_text = ledger.text.strip()

        out = self._assemble(head, summary_text, pulled, tail)
        out = sanitize_tool_pairs(out)
        if head:
            self._frozen = (len(head), out[len(head) - 1])
        out = self._clip_to_limit(out, report, len(head) + 1)
        self._previous_summary = summary_text
        self._carried = required
        self._summaries += 1
        report.fallback = fallback
        report.replaced = sorted(set(cut) | set(plan.middle))
        first = 0 if out and messages and out[0] is not messages[0] else len(head)
        return self._finish(report, out, t0, changed=True, first_changed=first)

    def _bounded(
        self,
        summary: str,
        budget: int,
        span: list[Message],
        previous: str | None,
        focus_topic: str | None,
        content_tokens: int,
        report: CompactionReport,
    ) -> str:
        """A summary longer than its budget (a server that ignores ``max_tokens``) is cut to the
        budget at a line boundary; if that loses the template, the extractive summary is used."""
        size = estimate(summary)
        if size <= budget:
            return summary
        kept: list[str] = []
        used = 0
        for line in summary.split("\n"):
            t = estimate(line) + 1
            if used + t > budget:
                if line.startswith("#"):
                    kept.append(line)  # headings are cheap and keep the template whole
                    used += t
                continue
            kept.append(line)
            used += t
        cut = "\n".join(kept)
        if not has_template(cut) or estimate(cut) > budget + 200:
            report.notes.append(f"summary of {size:,} tokens over its budget of {budget:,}: extractive summary used")
            return self._fallback.summarize(span, previous_summary=previous, focus_topic=focus_topic, budget_tokens=budget)
        report.notes.append(f"summary of {size:,} tokens cut to its budget of {budget:,}")
        return cut

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
            self._sent = out
            self._scan_state = None  # earlier messages changed: the next check scans anew
            self._anchor.reset()
            self.last_prompt_tokens = after
            self.compression_count += 1
            self._compacted = True
            self._expected_stable = sum(self._tokens(m) for m in out[:first_changed])
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
            if _own_summary(msgs[i]):
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
            if self.abort_on_summary_failure and tokens < self.hard_limit_tokens:
                log.warning("%s; abort_on_summary_failure: messages kept unchanged", self._last_error)
                report.fallback = "unchanged"
                report.notes.append(f"{self._last_error}; messages kept unchanged (abort_on_summary_failure)")
                return None, "unchanged"
            log.warning("%s; using the extractive summary", self._last_error)
            report.notes.append(self._last_error)
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
        toks = [self._tokens(m) for m in msgs]
        total = sum(toks)
        if total <= limit:
            return msgs
        out = list(msgs)
        # Outputs an earlier pass already cut are final: re-cutting them would rewrite text that
        # was sent and cached (prefix stability) for a few tokens each time.
        tools = [
            i
            for i, m in enumerate(msgs)
            if i >= start and m.get("role") == "tool" and not _settled(content_text(m.get("content")))
        ]
        order = sorted(tools, key=lambda i: -toks[i])
        for i in order:
            if total <= limit:
                break
            excess = total - limit
            keep = max(MIN_CUT_TOKENS, toks[i] - excess - 50)
            candidate = self._cut(msgs[i], keep)
            if candidate is msgs[i]:
                continue
            new = self._tokens(candidate)
            if new >= toks[i]:
                continue  # cutting would not shrink it: leave the message byte-identical
            out[i] = candidate
            total += new - toks[i]
            report.notes.append(f"tool output at {i} cut from {toks[i]:,} to {new:,} tokens to fit the window")
        if total > limit:
            report.notes.append(f"still {total:,} tokens after cutting tool outputs (hard limit {limit:,})")
        return out




def _own_summary(m: Message) -> bool:
    """A compaction summary (a message of its own or opening a tail message); cut tool
    outputs are records of one output, not summaries."""
    return m.get("role") not in ("system", "developer", "tool") and is_summary(m)


def _settled(text: str) -> bool:
    """True for an output ctxengine already wrote or cut (final: never cut again). A prefix
    test: this runs on every output each call, so it never scans the text."""
    return text.startswith(MARK) or text.startswith(PRUNED_MARKER)


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
