"""When a summarizing engine with cache-aware cuts compacts, and when it holds back.

:class:`SummaryTrigger` is the base of an engine that cuts tool outputs with the cut policy
(:class:`~ctxengine.engines.kit.cutpolicy.CachedCuts`) and folds spans into summaries (the
``compressor``). It owns the trigger and the state it needs between calls:

* **threshold, anchored** — the last provider-reported prompt tokens plus an estimate of the
  messages appended since (:class:`~ctxengine.tokens.AnchoredCounter`) reach
  ``threshold_tokens``;
* **before it is sent** — a giant output waits to be cut, or a batch of older outputs is due
  and pays for itself (:meth:`SummaryTrigger.should_compress_preflight`);
* **back-off** — after a compaction that could not get under the threshold, ``backoff_turns``
  turns are skipped unless the hard limit is reached;
* **no thrash** — never more than ``max_consecutive`` compacting calls in a row unless the hard
  limit is reached;
* **what the cache reads** — the first response after a compaction says how much of the kept
  prefix the provider really read from cache; later batches are weighed with it.
"""

from __future__ import annotations

from typing import Any

from ctxengine.engine import ContextEngine
from ctxengine.engines.kit.cutpolicy import CachedCuts
from ctxengine.engines.kit.pacing import Streak
from ctxengine.messages import Message
from ctxengine.tokens import AnchoredCounter

__all__ = ["HARD_LIMIT_RATIO", "SummaryTrigger"]

HARD_LIMIT_RATIO = 0.90
"""Above this fraction of the window a request has no room left for the reply: compression
runs even while backing off, and an authentication failure no longer keeps messages as they
are (the deterministic summary is used instead). Compressed output never exceeds it."""


class SummaryTrigger(CachedCuts, ContextEngine):
    """The trigger of a summarizing engine (see the module docstring); the engine calls
    :meth:`_init_trigger` once its counter and per-message counts (``tokens``) are set,
    :meth:`_reset_trigger` on a session reset and :meth:`_compacted_to` after each compaction
    that changed the messages."""

    enabled: bool
    backoff_turns: int

    def _init_trigger(self, *, backoff_turns: int, max_consecutive: int, enabled: bool) -> None:
        self.backoff_turns = int(backoff_turns)
        self._streak = Streak(limit=max(1, int(max_consecutive)))
        self.enabled = bool(enabled)
        # the anchored count reads the session's per-message counts: each new message is counted once
        self._anchor = AnchoredCounter(self.counter, per_message=self._tokens)
        self._reset_trigger()

    def _reset_trigger(self) -> None:
        """A new session: nothing sent, no back-off, no streak."""
        self._sent: list[Message] | None = None
        self._anchor.reset()
        self._backoff = 0
        self._streak.reset()
        self._compacted = False
        self._expected_stable: int | None = None

    @property
    def hard_limit_tokens(self) -> int:
        return int(self.context_length * HARD_LIMIT_RATIO)

    def update_from_response(self, usage: Any) -> None:
        """Record the real token counts; they also anchor the estimate of the next request
        (the messages last seen by :meth:`should_compress_preflight` or returned by
        :meth:`compress` are taken as what was sent). Counts the calls in a row that compacted,
        and learns from the cache fields how much of a kept prefix the provider really reads."""
        u = self._record_usage(usage)
        if self._sent is not None and u.prompt_tokens > 0:
            self._anchor.anchor(self._sent, u.prompt_tokens)
        self._calls += 1
        self._streak.record(self._compacted)
        self._compacted = False
        if self._expected_stable is not None and (u.cache_read_tokens or u.cache_write_tokens):
            if self._expected_stable > 0:
                self._stable_ratio = min(1.0, u.cache_read_tokens / self._expected_stable)
            self._expected_stable = None

    def _thrashing(self, tokens: int) -> bool:
        """True when the last ``max_consecutive`` calls all compacted and the window does not
        require another one now."""
        return self._streak.resting and tokens < self.hard_limit_tokens

    @property
    def max_consecutive(self) -> int:
        return self._streak.limit

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
        if self._giant_waits(scan):
            return True
        tokens = self._anchor.count(messages)
        if self._thrashing(tokens):
            return False
        if tokens >= self.threshold_tokens:
            return self._backoff == 0 or tokens >= self.hard_limit_tokens
        return self._scan_batch_due(messages, scan)

    def _back_off(self) -> bool:
        """Start backing off ``backoff_turns`` turns unless a back-off runs; True when started."""
        if self._backoff != 0:
            return False
        self._backoff = self.backoff_turns
        return True

    def _compacted_to(self, out: list[Message], after: int, first_changed: int, notes: list[str]) -> None:
        """A compaction sent ``out`` (``after`` tokens, unchanged before ``first_changed``): the
        next count starts anew, the streak grows, the cache read of the kept prefix is awaited,
        and a result still at the threshold starts a back-off."""
        self._sent = out
        self._carry_scan(out)  # the next check scans only the messages that changed
        self._anchor.reset()
        self.last_prompt_tokens = after
        self._compacted = True
        self._expected_stable = sum(self._tokens(m) for m in out[:first_changed])
        if after >= self.threshold_tokens and self._back_off():
            notes.append(f"still at {after:,} tokens (threshold {self.threshold_tokens:,}): backing off {self.backoff_turns} turns")
