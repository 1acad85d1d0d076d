"""One turn's input mapped onto the session (:class:`TurnInput`) and how it relates to what the
session saw (:data:`TurnKind`); see :mod:`ctxengine.history`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ctxengine.errors import InvalidMessages
from ctxengine.messages import Message, Violation, validate

__all__ = ["TurnInput", "TurnKind"]

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
