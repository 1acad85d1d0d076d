"""When to compact: the settled prefix, batching with back-off, and the no-thrash rules.

Under explicit cache breakpoints every byte after the first changed one is written again at
1.25× (DESIGN §3.8, §3.11), so a policy must compact rarely and in batches, never revisit the
settled prefix, and never nibble. :class:`Pacing` holds, for one session:

* **worth it** — a compaction that would free less than ``min_gain`` of the threshold is not
  done (:meth:`Pacing.worth`);
* **one prefix rewrite per N turns** — at most one compaction that rewrites the cached prefix
  every ``rewrite_every`` turns, unless the window requires it (:meth:`Pacing.may_rewrite`);
* **back-off** — when a compaction could not get under its target, the next trigger waits
  until the context has grown by a whole batch (:meth:`Pacing.armed`);
* **no nibbling** — when what may be compacted cannot bring the context under the threshold,
  the giant outputs of the protected tail are cut instead (:func:`giant_outputs`);
* **no thrash** — after compactions on :data:`MAX_CONSECUTIVE` calls in a row, the next call
  rests unless the window requires it (:class:`Streak`, the one owner of that count: the
  kernel's rest between turns and a summarizing engine's trigger both keep one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxengine.engines.kit.records import is_marked

__all__ = ["MAX_CONSECUTIVE", "Pacing", "Streak", "first_change", "giant_outputs", "settled_end"]

MAX_CONSECUTIVE = 3
"""Compaction never runs on more calls (or turns) in a row than this unless the window requires
it: an engine that cannot get under its own threshold would otherwise compact, and rewrite the
cached prefix, on every one."""


def settled_end(messages: Sequence[Mapping[str, Any]]) -> int:
    """Index just after the last record (``[ctxengine:`` message) of an earlier compaction:
    everything before it was settled then and is read from the cache; a policy never revisits
    it (0 when nothing was compacted yet)."""
    for i in range(len(messages) - 1, -1, -1):
        if is_marked(messages[i]):
            return i + 1
    return 0


def first_change(before: Sequence[Any], after: Sequence[Any]) -> int:
    """Index of the first message ``after`` changes (where the cached prefix stops)."""
    for i, (a, b) in enumerate(zip(before, after, strict=False)):
        if a is not b and a != b:
            return i
    return min(len(before), len(after))


def giant_outputs(
    messages: Sequence[Mapping[str, Any]],
    sizes: Sequence[int],
    *,
    start: int,
    excess: int,
    min_tokens: int,
) -> list[int]:
    """Tool outputs from ``start`` on, largest first, whose sizes cover ``excess`` tokens (each
    at least ``min_tokens``): what to cut when nothing else can get the context under its
    threshold, instead of compacting a little on every turn."""
    found = sorted(
        (i for i in range(start, len(messages)) if messages[i].get("role") == "tool" and sizes[i] >= min_tokens and not is_marked(messages[i])),
        key=lambda i: (-sizes[i], i),
    )
    out: list[int] = []
    covered = 0
    for i in found:
        if covered >= excess:
            break
        out.append(i)
        covered += sizes[i]
    return out


@dataclass(slots=True)
class Pacing:
    """The no-thrash state of one session (see the module docstring)."""

    min_gain: float = 0.05
    """Share of the threshold a compaction must free to be done."""
    rewrite_every: int = 4
    """Turns between two compactions that rewrite the cached prefix (unless the window requires)."""
    turn: int = 0
    last_rewrite: int | None = None
    rearm_at: int | None = None

    def tick(self) -> None:
        """One more turn (call from ``update_from_response``)."""
        self.turn += 1

    def reset(self) -> None:
        self.turn = 0
        self.last_rewrite = None
        self.rearm_at = None

    def worth(self, before: int, after: int, threshold: int) -> bool:
        """True when going from ``before`` to ``after`` tokens frees enough of the threshold."""
        return before - after >= self.min_gain * threshold

    def may_rewrite(self, *, required: bool = False) -> bool:
        """True when a compaction may rewrite the cached prefix this turn."""
        if required or self.last_rewrite is None or self.rewrite_every <= 0:
            return True
        return self.turn - self.last_rewrite >= self.rewrite_every

    def armed(self, tokens: int, threshold: int, window: int) -> bool:
        """True when ``tokens`` should trigger a compaction: at the threshold, or after a
        back-off, once a whole batch has accumulated (or halfway from the threshold to the
        window, whichever comes first)."""
        if tokens < threshold:
            return False
        if self.rearm_at is None:
            return True
        ceiling = max(threshold, (threshold + window) // 2)
        return tokens >= min(self.rearm_at, ceiling)

    def compacted(self, *, after: int, target: int, batch: int, rewrote: bool = True) -> None:
        """Record a compaction that left ``after`` tokens: back off by ``batch`` when it could
        not reach ``target``."""
        if rewrote:
            self.last_rewrite = self.turn
        self.rearm_at = after + max(1, batch) if after > target else None


@dataclass(slots=True)
class Streak:
    """Compactions in a row (the no-thrash count): :meth:`record` after each call or turn,
    :attr:`resting` once ``limit`` of them compacted; ``longest`` is the longest run seen."""

    limit: int = MAX_CONSECUTIVE
    count: int = 0
    longest: int = 0

    @property
    def resting(self) -> bool:
        """True when the last ``limit`` calls all compacted (the next one rests unless the
        window requires it)."""
        return self.count >= self.limit

    def record(self, compacted: bool) -> None:
        self.count = self.count + 1 if compacted else 0
        self.longest = max(self.longest, self.count)

    def reset(self) -> None:
        """A new session: no streak (``longest`` is kept, it reports the whole run)."""
        self.count = 0
