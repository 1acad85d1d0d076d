"""A session's per-message token estimates and the running sums of its working context
(each message estimated once per session, for the decisions);
see :mod:`ctxengine.history`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ctxengine.messages import Message, is_summary
from ctxengine.tokens import estimate_message_tokens

__all__ = ["WorkingTokens"]


class WorkingTokens:
    """Each message's estimate, memoised by identity and bounded by the working context, and
    the running token sums and last summary's index of the working context (the planner's
    inputs). Not thread-safe on its own: used under the session's lock (a compaction past its
    deadline may still read it: :meth:`prune` swaps the memo whole)."""

    __slots__ = ("_last_summary", "_memo", "_sums")

    def __init__(self) -> None:
        self._memo: dict[int, tuple[Mapping[str, Any], int]] = {}
        self._sums: list[int] = []  # running token sums of ``working``
        self._last_summary = -1  # index of the last summary in ``working``

    def counts(self, messages: Sequence[Mapping[str, Any]], working: Sequence[Message]) -> list[int]:
        """Estimated tokens of each message, each message estimated once per session."""
        memo = self._memo
        out = []
        grew = False
        for m in messages:
            hit = memo.get(id(m))
            if hit is not None and hit[0] is m:
                out.append(hit[1])
                continue
            t = estimate_message_tokens(m)
            memo[id(m)] = (m, t)
            out.append(t)
            grew = True
        # (checked when the memo grew: most calls, a turn's messages asked again, only read it)
        if grew and len(memo) > 4 * max(len(messages), len(working)) + 256:
            # bounded by the working context (and this call's messages), which stay memoised:
            # a call for a turn's few new messages must not forget the session's other ones
            self.prune([*working, *messages])
        return out

    def prune(self, keep: Sequence[Mapping[str, Any]]) -> None:
        """Forget every message but ``keep``."""
        ids = {id(m) for m in keep}
        # the items copied at once: an engine's compress that ran past its deadline may still
        # be counting through this memo on its worker thread (ctxengine.kernel.counting.SessionEstimate)
        self._memo = {k: v for k, v in list(self._memo.items()) if k in ids}

    def follow(self, old: list[Message], new: list[Message]) -> None:
        """Keep the running token sums and the last summary's index of the working context
        (``old``, now ``new``) up to date, counting only the messages appended since."""
        n = len(old)
        if not (len(new) >= n and len(self._sums) == n and (n == 0 or new[n - 1] is old[-1]) and new[:n] == old):
            self._sums, self._last_summary, n = [], -1, 0
        acc = self._sums[-1] if self._sums else 0
        added = new[n:]
        for i, t in enumerate(self.counts(added, new), start=n):
            acc += t
            self._sums.append(acc)
            if is_summary(new[i]):
                self._last_summary = i

    def planner_inputs(self, messages: Sequence[Message], working: list[Message]) -> tuple[list[int], int] | None:
        """Running token sums and the last summary's index of ``messages`` when it is the
        working context, else ``None``."""
        w = working
        if len(messages) != len(w) or len(self._sums) != len(w) or not w or messages[-1] is not w[-1] or (messages if isinstance(messages, list) else list(messages)) != w:
            return None
        return self._sums, self._last_summary
