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

By concern: :mod:`~ctxengine.history.turn` (:class:`TurnInput`, :data:`TurnKind`),
:mod:`~ctxengine.history.markers` (markers set aside), :mod:`~ctxengine.history.session`
(:class:`SessionHistory`), :mod:`~ctxengine.history.tokens` (the session's per-message counts,
the one cache its engine reads too; the working context's running sums).

Only the new messages are validated, recorded and counted: :meth:`TurnInput.check` validates
from the last turn boundary before them, and :meth:`SessionHistory.record` appends them after
the session's tip in the store instead of recording the whole history again.
"""

from __future__ import annotations

from ctxengine.history.markers import (
    MARKER_KEYS,
    first_difference,
    same_but_markers,
    same_but_tail,
    without_markers,
)
from ctxengine.history.session import SessionHistory
from ctxengine.history.tokens import WorkingTokens
from ctxengine.history.turn import TurnInput, TurnKind

__all__ = ["MARKER_KEYS", "SessionHistory", "TurnInput", "TurnKind", "WorkingTokens", "first_difference", "same_but_markers", "same_but_tail", "without_markers"]
