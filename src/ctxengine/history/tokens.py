"""A session's per-message token counts (the one cache the kernel hands the session's
engine) and the running sums of its working context (for the decisions and the cache
planner); see :mod:`ctxengine.history`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ctxengine.messages import Message, is_summary
from ctxengine.tokens import EstimateCounter, MessageTokens, TokenCounter

__all__ = ["PlannerInputs", "WorkingTokens"]


class WorkingTokens:
    """The owner of a session's per-message counts: ``estimates``, each message's estimate
    (a :class:`~ctxengine.tokens.MessageTokens`, the one the session's engine counts with
    when the configured counter is the estimate), kept bounded by the working context; the
    configured counter's own per-message counts when it is another (:meth:`for_counter`); and
    the running token sums and last summary's index of the working context (the planner's
    inputs). Not thread-safe on its own: used under the session's lock (a compaction past its
    deadline may still read the counts: :meth:`MessageTokens.prune` swaps a memo whole)."""

    __slots__ = ("_last_summary", "_other", "_sums", "_users", "estimates")

    def __init__(self) -> None:
        self.estimates = MessageTokens(EstimateCounter())
        self._other: MessageTokens | None = None  # the configured counter's, when not the estimate
        self._sums: list[int] = []  # running token sums of ``working``
        self._last_summary = -1  # index of the last summary in ``working``
        self._users: list[int] = []  # indices of the user messages of ``working`` (summaries not)

    def for_counter(self, counter: TokenCounter) -> MessageTokens:
        """The session's per-message counts with ``counter`` (what its engine counts with):
        the estimates for the estimate, else one cache of ``counter``'s, kept for the session."""
        if type(counter) is EstimateCounter:
            return self.estimates
        other = self._other
        if other is None or other.counter is not counter:
            other = self._other = MessageTokens(counter)
        return other

    def counts(self, messages: Sequence[Mapping[str, Any]], working: Sequence[Message]) -> list[int]:
        """Estimated tokens of each message, each message estimated once per session."""
        cache = self.estimates
        n = len(cache)
        out = cache.counts(messages)
        # (checked when the memo grew: most calls, a turn's messages asked again, only read it)
        if len(cache) > n and len(cache) > 4 * max(len(messages), len(working)) + 256:
            # bounded by the working context (and this call's messages), which stay memoised:
            # a call for a turn's few new messages must not forget the session's other ones
            self.prune([*working, *messages])
        return out

    def prune(self, keep: Sequence[Mapping[str, Any]]) -> None:
        """Forget every message but ``keep`` (in each of the session's per-message counts)."""
        self.estimates.prune(keep)
        if self._other is not None:
            self._other.prune(keep)

    def follow(self, old: list[Message], new: list[Message]) -> None:
        """Keep the running token sums and the last summary's index of the working context
        (``old``, now ``new``) up to date, counting only the messages appended since."""
        n = len(old)
        if not (len(new) >= n and len(self._sums) == n and (n == 0 or new[n - 1] is old[-1]) and new[:n] == old):
            self._sums, self._last_summary, self._users, n = [], -1, [], 0
        acc = self._sums[-1] if self._sums else 0
        added = new[n:]
        for i, t in enumerate(self.counts(added, new), start=n):
            acc += t
            self._sums.append(acc)
            if is_summary(new[i]):
                self._last_summary = i
            elif new[i].get("role") == "user":
                self._users.append(i)

    def planner_inputs(self, messages: Sequence[Message], working: list[Message]) -> PlannerInputs | None:
        """What :func:`ctxengine.caching.plan_breakpoints` reads of ``messages`` when it is the
        working context (:class:`PlannerInputs`), else ``None``."""
        w = working
        if len(messages) != len(w) or len(self._sums) != len(w) or not w or messages[-1] is not w[-1] or (messages if isinstance(messages, list) else list(messages)) != w:
            return None
        users = self._users
        j = len(users) - 1
        while j > 0 and users[j - 1] == users[j] - 1:
            j -= 1
        turns = (users[-1], users[j - 1] if j > 0 else -1) if users else (-1, -1)
        return PlannerInputs(self._sums, self._last_summary, turns)


class PlannerInputs(NamedTuple):
    """What the cache planner reads of the working context, kept turn by turn."""

    sums: list[int]
    """Running token sums of its messages."""
    stable: int
    """The last summary's index (-1: none)."""
    turns: tuple[int, int]
    """Where the current turn and the one before start: the last user message that is not a
    summary, and the last one before that turn's user messages (-1: none)."""
