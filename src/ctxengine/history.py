"""Which messages of a turn are new: a caller's history mapped onto the session's working context.

A caller of :meth:`ctxengine.ContextManager.prepare` passes one of two things each turn:

* **the list ``prepare`` returned last time**, plus what happened since (an agent that keeps
  the prepared list): the working context continues as given;
* **its whole raw history** (a gateway, a proxy, an agent that never drops a message): every
  original from the first turn, plus what happened since. Sent through the engine as is, this
  would be compacted again on every turn past the threshold (a summarizer call each time).

:class:`SessionHistory` remembers, per session, the raw history seen so far and the working
context it maps to. Each turn it recognises which of the two the caller sent by comparing the
list with what it saw (message by message: the same objects compare in constant time, equal
copies, e.g. JSON decoded again, by value), and hands the engine the *working context plus
only the new messages*. A caller that resends its history therefore gets its working context
back, compacted as before, and compacts no more often than one that keeps the prepared list.

**Cache markers are not edits.** Clients that place their own ``cache_control`` markers move
them every turn (Claude Code marks its newest message, so last turn's newest message comes back
without its marker). Two messages that differ only in such transport details
(:func:`without_markers`) are the same message: the turn is still a resend (or a continuation),
and the caller's copy of this turn replaces the old one where the working context holds it
verbatim, so what goes out carries the caller's markers of this turn, never last turn's. The
comparison looks only at the messages from the first difference on (the last few, where the
markers moved), so recognising a turn stays a C-level list comparison plus a few messages. The
store records messages without their markers, so a moved marker never makes a message twice.

When a caller edits or truncates its history (a retry, a regenerated answer, an edited
message), the list no longer extends what was seen: the turn starts a **branch**. If the change
lies in the part of the raw history still held verbatim in the working context, the compacted
head is kept and the working context is cut at the same point; if it lies in the part already
compacted, the history is taken as given (a fresh start: the engine's per-session state is
reset, so nothing of the dropped turns comes back through a previous summary). Nothing breaks
and nothing dropped is resurrected. In the store (content-addressed, parent-linked) a branch
costs only its new messages.

Messages already passed to ``prepare`` are treated as immutable (the library never edits
them either): the same dict object is taken as the same message, so change a message by
sending a new dict, not by editing the old one in place.

Only the new messages are validated, recorded and counted: :meth:`TurnInput.check` validates
from the last turn boundary before them, and :meth:`SessionHistory.record` appends them after
the session's tip in the store instead of recording the whole history again.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ctxengine.errors import InvalidMessages
from ctxengine.messages import Message, Violation, is_summary, validate
from ctxengine.storage import SessionAppender, SessionRecorder
from ctxengine.tokens import estimate_message_tokens

__all__ = ["MARKER_KEYS", "SessionHistory", "TurnInput", "TurnKind", "first_difference", "same_but_markers", "without_markers"]

TurnKind = Literal["first", "continue", "resend", "branch", "fresh"]
"""How a turn's input relates to what the session saw:

``first``     the session's first turn;
``continue``  the working context returned last time, extended (or unchanged);
``resend``    the raw history seen so far, extended: the working context plus the new messages;
``branch``    an edited or truncated history whose change lies in the verbatim part: the working
              context cut at the change, plus the caller's messages from there;
``fresh``     an edited or truncated history whose change lies in the compacted part (or shares
              nothing): taken as given, the engine's per-session state reset.
"""


@dataclass(slots=True)
class TurnInput:
    """One turn's input, mapped onto the working context.

    ``messages`` is what goes through the engine; ``messages[:base]`` was seen (validated and
    recorded) before, ``messages[base:]`` is new. ``caller_start`` is the index in the caller's
    list of ``messages[base]`` (for error messages).
    """

    kind: TurnKind
    messages: list[Message]
    base: int
    caller_start: int
    reset_engine: bool = False
    _seen_index: Callable[[int], int] | None = None  # working index -> caller index, seen part
    # what :meth:`SessionHistory.finish` makes of the session when the turn completes
    pending: list[int] | None = None  # working index of each raw message held verbatim
    pending_raw: list[Message] | None = None  # the raw history after this turn
    pending_r0: int = 0
    swapped: list[int] | None = None  # working indices whose message the caller resent with moved markers
    dropped: int = 0  # trailing per-request messages of last turn not resent (see SessionHistory._without_trailing)
    live_at: int | None = None  # caller index of a user message rewritten in place this turn (see SessionHistory.live_texts)

    @property
    def new(self) -> list[Message]:
        return self.messages[self.base :]

    def check(self, *, context: str = "messages passed to prepare") -> None:
        """Validate the new messages in the context of the turn they continue.

        Validation starts at the last non-tool message before the new ones (the message that
        opened the tool group they may answer), so a result is matched with its call and a
        call left pending last turn must be answered now. Raises
        :class:`~ctxengine.errors.InvalidMessages` with indices in the caller's list.
        """
        msgs = self.messages
        if self.base >= len(msgs) and self.kind != "first":
            return
        start = self.base
        while start > 0:
            start -= 1
            m = msgs[start]
            if not isinstance(m, dict) or m.get("role") != "tool":
                break
        window = msgs[start:] if start else msgs
        errors = validate(window, allow_pending_calls=True, errors_only=True)
        if errors:
            raise InvalidMessages([Violation(self._caller_index(v.index + start), v.code, v.detail, v.severity) for v in errors], context)

    def _caller_index(self, i: int) -> int:
        if i >= self.base:
            return self.caller_start + (i - self.base)
        return self._seen_index(i) if self._seen_index is not None else i


MARKER_KEYS = frozenset({"cache_control"})
"""Keys that are per-turn transport details, not content: a client moves them from message to
message (and changes a marker's ``ttl``) without editing anything."""


def _plain_parts(parts: list[Any]) -> list[Any] | None:
    """``parts`` without marker keys (on a part, and on the blocks of a tool result's own
    ``content`` list), ``None`` when there is none to remove."""
    for p in parts:  # the usual list holds no marker: looked at once, nothing built
        if type(p) is dict and ("cache_control" in p or type(p.get("content")) is list):
            break
    else:
        return None
    out: list[Any] | None = None
    for i, p in enumerate(parts):
        if type(p) is not dict:
            continue
        q = p
        if not MARKER_KEYS.isdisjoint(p):
            q = {k: v for k, v in p.items() if k not in MARKER_KEYS}
        inner = q.get("content")
        if type(inner) is list:
            plain = _plain_parts(inner)
            if plain is not None:
                q = {**q, "content": plain}
        if q is not p:
            if out is None:
                out = list(parts)
            out[i] = q
    return out


def without_markers(message: Any, *, keep_shape: bool = False) -> Any:
    """``message`` without its transport details (:data:`MARKER_KEYS` on the message, on its
    content parts or blocks, on blocks nested in a tool result, on tool calls), and a content
    list left as one plain text part (what a marker on string content makes of it) written as
    that string, unless ``keep_shape``. The same object when there is nothing to remove; never
    edits the input."""
    if type(message) is not dict:
        return message
    content = message.get("content")
    calls = message.get("tool_calls")
    if "cache_control" not in message and type(content) is not list and calls is None:
        return message  # the usual message: string content, no marker
    out = message
    if not MARKER_KEYS.isdisjoint(message):
        out = {k: v for k, v in message.items() if k not in MARKER_KEYS}
    if type(content) is list:
        plain = _plain_parts(content)
        new = content if plain is None else plain
        if not keep_shape and len(new) == 1 and type(new[0]) is dict and new[0].get("type") == "text" and len(new[0]) == 2 and type(new[0].get("text")) is str:
            new = new[0]["text"]
        if new is not content:
            out = {**out, "content": new}
    if type(calls) is list:
        plain = _plain_parts(calls)
        if plain is not None:
            out = {**out, "tool_calls": plain}
    return out


def same_but_markers(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same message once their transport details are left out
    (:func:`without_markers`)."""
    return a is b or a == b or without_markers(a) == without_markers(b)


def first_difference(a: list[Any], b: list[Any], n: int) -> int:
    """The first index below ``n`` where ``a`` and ``b`` differ (``n`` when none does). The
    differences a moved marker makes lie at the end, so the prefixes before the last 1, 2, 4 …
    items are compared first (each in C, stopping at its own first difference); the index is
    then looked for among those last items only."""
    if a[:n] == b[:n]:
        return n
    t = 1
    while t < n:
        k = n - t
        if a[:k] == b[:k]:
            break
        t *= 2
    else:
        k = 0
    while k < n and (a[k] is b[k] or a[k] == b[k]):
        k += 1
    return k


def _marker_moves(given: list[Any], seen: list[Any]) -> list[int] | None:
    """The indices where ``given`` holds a message of ``seen`` that differs only in its markers,
    when ``given`` starts with every message of ``seen`` that way; ``None`` otherwise. Only the
    messages from the first difference on are looked at (a real difference ends the search
    there)."""
    n = len(seen)
    if len(given) < n:
        return None
    moved: list[int] = []
    p = 0
    while p < n:
        p += first_difference(given[p:n], seen[p:], n - p)
        if p >= n:
            break
        if without_markers(given[p]) != without_markers(seen[p]):
            return None
        moved.append(p)
        p += 1
    return moved


def _common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Length of the common prefix of two message lists (same objects first, then by value)."""
    n = min(len(a), len(b))
    if n and a[n - 1] is b[n - 1] and list(a[:n]) == list(b[:n]):
        return n
    lo, hi = 0, n
    # binary search on "the first k match": equality of prefixes is monotonic
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if list(a[:mid]) == list(b[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _extends(given: Sequence[Any], seen: list[Any]) -> bool:
    """``given`` starts with every message of ``seen``."""
    n = len(seen)
    if len(given) < n:
        return False
    if n == 0:
        return True
    # the last one first: a mismatch (another list) is found without walking the prefix
    last = given[n - 1]
    if last is not seen[-1] and last != seen[-1]:
        return False
    # a list's slice is a list already: copying it again would touch every message once more
    return (given[:n] if isinstance(given, list) else list(given[:n])) == seen


def _one_extends_the_other(a: list[Any], b: list[Any]) -> bool:
    """The shorter of ``a`` and ``b`` is a prefix of the longer."""
    n = min(len(a), len(b))
    return a[:n] == b[:n]


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
        self._tokens: dict[int, tuple[Message, int]] = {}
        self._sums: list[int] = []  # running token sums of ``working``
        self._last_summary = -1  # index of the last summary in ``working``
        self._last_kind: TurnKind | None = None  # what the last finished turn was
        self._plain_memo: dict[int, tuple[Message, Message]] = {}  # marked message -> its copy without markers
        self.live_at: int | None = None  # caller index of the user message rewritten in place (live_texts)

    # -- the turn ----------------------------------------------------------------------------
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
        raw_first = self._last_kind == "resend" and not _one_extends_the_other(w, raw)
        if raw_first and _extends(given, raw):
            return self._resend(given)
        if _extends(given, w):
            return self._take(given, "continue", base=len(w))
        if not raw_first and _extends(given, raw):
            return self._resend(given)
        # the same history, with the caller's cache markers moved since last turn
        for seen in (raw, w) if raw_first or self._last_kind == "resend" else (w, raw):
            moved = _marker_moves(given, seen)
            if moved is not None:
                return self._resend(given, moved) if seen is raw else self._continue(given, moved)
        trailing = self._without_trailing(given)
        if trailing is not None:
            return trailing
        p = _common_prefix(given, raw)
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
        q = _common_prefix(given, w)
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
        if not t or len(wpos) < t or wpos[-t:] != list(range(len(w) - t, len(w))) or not _extends(given, raw[:n]):
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
            self._prune_tokens(result)
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
        self._follow_working(old, result)

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

    # -- tokens and the planner's inputs -----------------------------------------------------
    def _follow_working(self, old: list[Message], new: list[Message]) -> None:
        """Keep the running token sums and the last summary's index of ``working`` up to date,
        counting only the messages appended since the last turn."""
        n = len(old)
        if not (len(new) >= n and len(self._sums) == n and (n == 0 or new[n - 1] is old[-1]) and new[:n] == old):
            self._sums, self._last_summary, n = [], -1, 0
        acc = self._sums[-1] if self._sums else 0
        added = new[n:]
        for i, t in enumerate(self.message_tokens(added), start=n):
            acc += t
            self._sums.append(acc)
            if is_summary(new[i]):
                self._last_summary = i

    def planner_inputs(self, messages: Sequence[Message]) -> tuple[list[int], int] | None:
        """Running token sums and the last summary's index of ``messages`` when it is the
        working context (what ``prepare`` returned), else ``None``."""
        w = self.working
        if len(messages) != len(w) or len(self._sums) != len(w) or not w or messages[-1] is not w[-1] or (messages if isinstance(messages, list) else list(messages)) != w:
            return None
        return self._sums, self._last_summary

    def message_tokens(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Estimated tokens of each message, each message estimated once per session."""
        memo = self._tokens
        out = []
        grew = False
        for m in messages:
            hit = memo.get(id(m))
            if hit is not None and hit[0] is m:
                out.append(hit[1])
                continue
            t = estimate_message_tokens(m)
            memo[id(m)] = (m, t)  # type: ignore[assignment]
            out.append(t)
            grew = True
        # (checked when the memo grew: most calls, a turn's messages asked again, only read it)
        if grew and len(memo) > 4 * max(len(messages), len(self.working)) + 256:
            # bounded by the working context (and this call's messages), which stay memoised:
            # a call for a turn's few new messages must not forget the session's other ones
            self._prune_tokens([*self.working, *messages])
        return out

    def _prune_tokens(self, keep: Sequence[Mapping[str, Any]]) -> None:
        ids = {id(m) for m in keep}
        # the items copied at once: an engine's compress that ran past its deadline may still
        # be counting through this memo on its worker thread (ctxengine.kernel.counting.SessionEstimate)
        self._tokens = {k: v for k, v in list(self._tokens.items()) if k in ids}
