"""Per-session memory of the raw history seen and the working context it maps to
(:class:`SessionHistory`); see :mod:`ctxengine.history`."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ctxengine.history.markers import (
    common_prefix,
    extends,
    marker_moves,
    one_extends_the_other,
    same_but_markers,
    without_markers,
)
from ctxengine.history.tokens import PlannerInputs, WorkingTokens
from ctxengine.history.turn import TurnInput, TurnKind
from ctxengine.messages import Message
from ctxengine.storage import SessionAppender, SessionRecorder

__all__ = ["SessionHistory"]


class SessionHistory:
    """Per-session memory of the raw history seen and the working context it maps to.

    ``raw`` is the history as the caller knows it (the messages it sent, in order, as first
    seen); ``working`` the list the last :meth:`finish` returned. The messages ``raw[r0:]`` sit
    verbatim in the working context at the increasing indices ``wpos`` (engine tool results the
    manager added sit between them); ``raw[:r0]`` was compacted into ``working[:wpos[0]]``.

    Not thread-safe on its own: the manager calls it under the session's lock.
    """

    def __init__(self) -> None:
        self.raw: list[Message] = []
        self.working: list[Message] = []
        self.r0 = 0
        self.wpos: list[int] = []
        self.compacted = False
        self.turns = 0
        self._ids: list[str] | None = None  # store ids of ``working`` when the store's tip is exactly ``working``
        self._next_ids: list[str] | None = None  # what this turn's recording made, kept by :meth:`finish`
        self._clean_turn = 0  # the last turn whose working context is its input (see record_later)
        self.tokens = WorkingTokens()  # each message's estimate, the running sums of ``working``
        self._last_kind: TurnKind | None = None  # what the last finished turn was
        self._plain_memo: dict[int, tuple[Message, Message]] = {}  # marked message -> its copy without markers
        self.live_at: int | None = None  # caller index of the user message rewritten in place (live_texts)

    # -- the turn ----------------------------------------------------------------------------
    def is_working(self, messages: Sequence[Message]) -> bool:
        """Whether ``messages`` is the working context (the list the last turn returned), message
        by message: the same dicts or equal ones, cache markers aside (a request marked from it).
        Anything else holds messages no turn has seen (or drops some it returned)."""
        w = self.working
        if not self.turns or len(messages) != len(w):
            return False
        given = messages if isinstance(messages, list) else list(messages)
        return given == w or all(same_but_markers(a, b) for a, b in zip(given, w, strict=True))

    def begin(self, messages: Sequence[Message]) -> TurnInput:
        """Map the caller's ``messages`` onto the working context (see the module docstring).

        The caller's list and dicts are never modified; nothing is remembered until
        :meth:`finish`.
        """
        given = messages if isinstance(messages, list) else list(messages)
        if self.turns == 0:
            return self._take(given, "first", base=0)
        w, raw = self.working, self.raw
        # A caller that resent its raw history last turn is asked about the raw history first:
        # when the working context and the raw history part ways (neither is a prefix of the
        # other; compared mostly by identity, they share their verbatim messages) no list
        # extends both, so the order of the two questions changes no answer; it spares
        # comparing a history decoded again by value with the working context, only to fail.
        raw_first = self._last_kind == "resend" and not one_extends_the_other(w, raw)
        if raw_first and extends(given, raw):
            return self._resend(given)
        if extends(given, w):
            return self._take(given, "continue", base=len(w))
        if not raw_first and extends(given, raw):
            return self._resend(given)
        # the same history, with the caller's cache markers moved since last turn
        for seen in (raw, w) if raw_first or self._last_kind == "resend" else (w, raw):
            moved = marker_moves(given, seen)
            if moved is not None:
                return self._resend(given, moved) if seen is raw else self._continue(given, moved)
        trailing = self._without_trailing(given)
        if trailing is not None:
            return trailing
        p = common_prefix(given, raw)
        live_at = self._rewritten(given, p)
        turn = self._branch(given, p)
        turn.live_at = live_at
        return turn

    def _rewritten(self, given: list[Message], p: int) -> int | None:
        """``p``, when the caller's list differs from the raw history first at a user message
        (``p``) and the message after it is the one seen there: a message rewritten in place
        (aider resends the files it edits as one message, with their current contents)."""
        raw = self.raw
        if p + 1 >= len(raw) or p + 1 >= len(given):
            return None
        a, b = given[p], raw[p]
        if not (isinstance(a, dict) and isinstance(b, dict) and a.get("role") == "user" == b.get("role")):
            return None
        return p if same_but_markers(given[p + 1], raw[p + 1]) else None

    def live_texts(self, turn: TurnInput, given: Sequence[Message]) -> frozenset[str]:
        """The text of the user message the caller rewrites in place (its working set), as
        found this turn or on an earlier one (and still a user message at that index of
        ``given``); empty when there is none or its content is not a string."""
        at = None if turn.kind == "first" else (turn.live_at if turn.live_at is not None else self.live_at)
        if at is None or at >= len(given):
            return frozenset()
        m = given[at]
        content = m.get("content") if isinstance(m, dict) and m.get("role") == "user" else None
        return frozenset((content,)) if isinstance(content, str) else frozenset()

    def _branch(self, given: list[Message], p: int) -> TurnInput:
        """The caller's list, which changed the history seen (``p``: common prefix with the raw
        history): an edited or truncated history (see the module docstring)."""
        w, raw = self.working, self.raw
        q = common_prefix(given, w)
        k = p - self.r0
        cut = self.wpos[k] if p > 0 and 0 <= k < len(self.wpos) else -1
        if cut > q and len(given) > self.r0:
            # an edited or truncated raw history, changed where the working context holds it
            # verbatim: the working context up to the change, then the caller's messages (a
            # history cut back into the compacted part is not continued: its latest message
            # would only survive inside a summary)
            new = given[p:]
            return TurnInput(
                "branch", [*w[:cut], *new], cut, p, _seen_index=self._seen_index(),
                pending=[*self.wpos[:k], *range(cut, cut + len(new))], pending_raw=[*raw[:p], *new], pending_r0=self.r0,
            )
        head = self.wpos[0] if self.wpos else len(w)
        if q > 0 and (not self.compacted or q > head):
            # a caller of the prepared list that edited or dropped its latest turns
            return self._take(given, "branch", base=q, keep_raw=True)
        if not self.compacted:
            return self._take(given, "branch", base=0)
        # the change lies in the compacted part: start over from the caller's list
        return self._take(given, "fresh", base=0)

    def _resend(self, given: list[Message], moved: Sequence[int] = ()) -> TurnInput:
        """The raw history seen so far, extended: the working context plus the new messages.
        ``moved``: the raw indices whose message the caller sent again with other markers (its
        copy replaces the old one, in the working context where it is held verbatim)."""
        w, raw = self.working, self.raw
        new = given[len(raw) :]
        msgs, pending_raw = [*w, *new], [*raw, *new]
        swapped = []
        for i in moved:
            pending_raw[i] = given[i]
            k = i - self.r0
            if 0 <= k < len(self.wpos):
                msgs[self.wpos[k]] = given[i]
                swapped.append(self.wpos[k])
        return TurnInput(
            "resend", msgs, len(w), len(raw), _seen_index=self._seen_index(),
            pending=[*self.wpos, *range(len(w), len(w) + len(new))], pending_raw=pending_raw, pending_r0=self.r0, swapped=swapped or None,
        )

    def _without_trailing(self, given: list[Message]) -> TurnInput | None:
        """A resend of the raw history without last turn's trailing system or developer
        messages (aider ends each request with a reminder that the next request moves to the
        end again): a per-request instruction, not history. The working context drops them
        (held verbatim at its end) and takes the new messages; ``None`` when that is not the
        case."""
        raw, w, wpos = self.raw, self.working, self.wpos
        t = 0
        while t < len(raw) - 1 and isinstance(raw[-1 - t], dict) and raw[-1 - t].get("role") in ("system", "developer"):
            t += 1
        n = len(raw) - t
        if not t or len(wpos) < t or wpos[-t:] != list(range(len(w) - t, len(w))) or not extends(given, raw[:n]):
            return None
        if len(given) > n and isinstance(given[n], dict) and given[n].get("role") in ("system", "developer"):
            return None  # the reminder resent where it was: an edit of it, or a real system message
        cut = len(w) - t
        new = given[n:]
        return TurnInput(
            "resend", [*w[:cut], *new], cut, n, _seen_index=self._seen_index(),
            pending=[*wpos[:-t], *range(cut, cut + len(new))], pending_raw=[*raw[:n], *new], pending_r0=self.r0, dropped=t,
        )

    def _continue(self, given: list[Message], moved: Sequence[int]) -> TurnInput:
        """The working context returned last time, extended, with the caller's markers moved on
        the messages at ``moved`` (its copies replace the old ones, in the raw history too)."""
        turn = self._take(given, "continue", base=len(self.working))
        msgs, raw = turn.messages, turn.pending_raw
        assert raw is not None  # a continuation keeps the raw history
        for i in moved:
            msgs[i] = given[i]
            k = bisect.bisect_left(self.wpos, i)
            if k < len(self.wpos) and self.wpos[k] == i:
                raw[self.r0 + k] = given[i]
        turn.swapped = list(moved) or None
        return turn

    def _take(self, given: list[Message], kind: TurnKind, *, base: int, keep_raw: bool = False) -> TurnInput:
        """The caller's list is the working input; ``given[:base]`` was seen and equals
        ``working[:base]``, whose own dicts are used (a list decoded again each turn then keeps
        every per-message memo of the session: token counts, the planner's sums)."""
        msgs = self.working[:base] + given[base:] if base else list(given)
        turn = TurnInput(kind, msgs, base, base, reset_engine=kind == "fresh")
        if kind == "continue" or keep_raw:
            k = len(self.wpos) if kind == "continue" else bisect.bisect_left(self.wpos, base)
            turn.pending = [*self.wpos[:k], *range(base, len(msgs))]
            turn.pending_raw = [*self.raw[: self.r0 + k], *msgs[base:]]
            turn.pending_r0 = self.r0
        else:
            turn.pending = list(range(len(msgs)))
            turn.pending_raw = msgs
            turn.pending_r0 = 0
        return turn

    def _seen_index(self) -> Callable[[int], int]:
        """Caller index of a working message that is a raw one (its own index for the others),
        computed only when an error needs it."""
        wpos, r0 = self.wpos, self.r0  # finish() replaces the list, never edits it

        def index(i: int) -> int:
            k = bisect.bisect_left(wpos, i)
            return r0 + k if k < len(wpos) and wpos[k] == i else i

        return index

    def finish(self, turn: TurnInput, inp: Sequence[Message], out: Sequence[Message]) -> None:
        """Remember the turn: its input ``inp`` (``turn.messages`` plus any engine tool results
        appended) became ``out``, the list returned to the caller."""
        self._ids, self._next_ids = self._next_ids, None
        pending = turn.pending if turn.pending is not None else list(range(len(inp)))
        raw = turn.pending_raw if turn.pending_raw is not None else list(inp)
        r0 = turn.pending_r0
        if turn.kind in ("first", "fresh"):
            self.compacted = False
        result = list(out)
        # (``out is inp``: the turn changed nothing, known without comparing every message)
        if out is not inp and (len(result) != len(inp) or result != (inp if isinstance(inp, list) else list(inp))):
            # a compaction (or a cap) rewrote the input: the raw messages still held verbatim are
            # those of the common tail of input and output
            k = 0
            limit = min(len(result), len(inp))
            while k < limit and (result[-1 - k] is inp[-1 - k] or result[-1 - k] == inp[-1 - k]):
                k += 1
            first_kept = len(inp) - k
            shift = len(result) - len(inp)
            j = bisect.bisect_left(pending, first_kept)
            self.wpos = [wp + shift for wp in pending[j:]]
            self.r0 = r0 + j
            self.compacted = True
            self._ids = None  # the store's tip is the compaction's output, or unknown
            self.tokens.prune(result)
        else:
            self.wpos = pending
            self.r0 = r0
            self._clean_turn = self.turns + 1  # the working context is this turn's input
        old = self.working
        if turn.swapped:
            # the messages whose markers moved count as they did (a marker is no content): the
            # running sums go on from the caller's copies instead of being summed again
            old = list(old)
            for i in turn.swapped:
                if i < len(old) and i < len(inp):
                    old[i] = inp[i]
        self.raw = raw
        self.working = result
        self.turns += 1
        self._last_kind = turn.kind
        if turn.kind == "first":
            self.live_at = None
        elif turn.live_at is not None:
            self.live_at = turn.live_at
        self.tokens.follow(old, result)

    def reset(self) -> None:
        """Forget everything (``reset_session``): the next turn is a first turn."""
        self.__init__()  # type: ignore[misc]

    def resume(self, raw: Sequence[Message], working: Sequence[Message]) -> None:
        """Start from a session recorded earlier (the store's originals and its latest working
        context): the next turn that resends ``raw`` plus new messages maps onto ``working``
        as if this object had seen every turn."""
        self.reset()
        raw = list(raw)
        turn = TurnInput("first", raw, 0, 0, pending=list(range(len(raw))), pending_raw=raw)
        self.finish(turn, raw, list(working))

    # -- the store ---------------------------------------------------------------------------
    def record(
        self, store: SessionRecorder, session_id: str, turn: TurnInput, messages: Sequence[Message], *, appender: SessionAppender | None = None
    ) -> list[str]:
        """Record ``messages`` (the turn's input, engine tool results included) as the session's
        history and return the store ids of all of them: only the new messages are written when
        the store's tip is the previous working context and the store can append, the whole
        list otherwise (a first turn, a branch, after a compaction; the store keeps each message
        once, so a branch costs its new messages)."""
        if appender is None and isinstance(store, SessionAppender):
            appender = store
        # what is recorded counts once the turn finishes (a turn that raises leaves the old tip,
        # so the next turn branches from there instead of chaining on the failed input)
        self._next_ids = None
        known = self._ids
        if known and self.appends(turn) and appender is not None:
            known = known[: turn.base]
            new = self.plain(messages[turn.base :])
            ids = [*known, *appender.append_messages(session_id, new, after=known[-1])] if new else known
        else:
            ids = list(store.record_messages(session_id, self.plain(messages)))
        self._next_ids = ids
        return ids

    def record_later(
        self, store: SessionRecorder, session_id: str, turn: TurnInput, messages: Sequence[Message], *, appender: SessionAppender | None = None
    ) -> Callable[[], list[str]] | None:
        """:meth:`record` as a job to run later (``prepare(defer_record=True)``): only for a turn
        that continues the session (``None`` otherwise: record it now), whether it appends to the
        store's tip or, the tip being unknown (after a compaction), records the whole list. Run
        inside the turn (before a compaction or a cap needs the ids), the job hands its ids to
        :meth:`finish`; run after the turn, it makes them the tip of the next turn's append,
        provided the turn left the working context as its input and no later turn ran."""
        if appender is None and isinstance(store, SessionAppender):
            appender = store
        if not self.defers(turn):
            return None
        known = self._ids
        write: Callable[[], list[str]]
        if known and self.appends(turn) and appender is not None:  # known: for the type checker
            new = self.plain(messages[turn.base :])
            tip = known[: turn.base]
            after, add = tip[-1], appender.append_messages

            def write() -> list[str]:
                return [*tip, *add(session_id, new, after=after)] if new else tip

        else:
            whole = self.plain(messages)

            def write() -> list[str]:
                return list(store.record_messages(session_id, whole))

        turns = self.turns
        self._next_ids = None

        def job() -> list[str]:
            ids = write()
            if self.turns == turns:  # still inside the turn
                self._next_ids = ids
            elif self.turns == turns + 1 and self._clean_turn == self.turns and self._ids is None:
                self._ids = ids
            return ids

        return job

    def plain(self, messages: Sequence[Message]) -> list[Message]:
        """``messages`` as the store keeps them: without their cache markers (:func:`without_markers`;
        a marker moved next turn must not make the message a new one). A marked message's plain
        copy is made once and kept while the message is in the working context: the store
        recognises the list it wrote last by identity."""
        out = list(messages)
        memo = self._plain_memo
        for i, m in enumerate(out):
            if type(m) is not dict:
                continue
            hit = memo.get(id(m))
            if hit is not None and hit[0] is m:
                out[i] = hit[1]
                continue
            p = without_markers(m)
            if p is not m:
                memo[id(m)] = (m, p)
                out[i] = p
        if len(memo) > 2 * len(self.working) + 64:
            ids = {id(m) for m in (*self.working, *out)}
            self._plain_memo = {k: v for k, v in memo.items() if k in ids}
        return out

    def defers(self, turn: TurnInput) -> bool:
        """Whether :meth:`record_later` can leave ``turn``'s recording for later: a turn that
        continues the session (appending to the store's tip, or, the tip unknown after a
        compaction, recording the whole list; the store keeps each message once), or the
        session's first turn (recording the whole list: nothing is in the store to branch from)."""
        if self.turns == 0:
            return turn.kind == "first"
        return turn.kind in ("continue", "resend")

    def appends(self, turn: TurnInput) -> bool:
        """Whether ``turn`` only appends to the store's tip (what :meth:`record_later` defers)."""
        known = self._ids
        # (a turn that dropped last turn's trailing reminder appends after the message before it)
        return known is not None and turn.base > 0 and len(known) == turn.base + turn.dropped and turn.kind in ("continue", "resend")

    def forget_tip(self) -> None:
        """The store's tip moved elsewhere (a compaction, a failed write): record in full next time."""
        self._ids = self._next_ids = None

    # -- tokens and the planner's inputs (WorkingTokens) -------------------------------------
    def planner_inputs(self, messages: Sequence[Message]) -> PlannerInputs | None:
        """What the cache planner reads of ``messages`` (running token sums, the last
        summary's index, the turn starts) when it is the working context (what ``prepare``
        returned), else ``None``."""
        return self.tokens.planner_inputs(messages, self.working)

    def message_tokens(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Estimated tokens of each message, each message estimated once per session."""
        return self.tokens.counts(messages, self.working)
