"""The window cap over a message list: measured (the session's :class:`WindowTally` extended by
the new messages), and cut to the limit when over (:class:`WindowCap`); see
:mod:`ctxengine.window`."""

from __future__ import annotations

from collections.abc import Sequence

from ctxengine.errors import ContextWindowError
from ctxengine.messages import Message
from ctxengine.window.counting import WindowCounter, WindowLimit, WindowTally
from ctxengine.window.fitting import CapResult, Fitting, RefFor, fold_message

__all__ = ["WindowCap"]


class WindowCap:
    """Holds :class:`WindowLimit` over any message list (see :mod:`ctxengine.window`); the cuts
    of a request over the limit are :class:`~ctxengine.window.fitting.Fitting`'s."""

    _fold_message = staticmethod(fold_message)

    def __init__(self, limit: WindowLimit, counter: WindowCounter | None = None) -> None:
        self.window = limit
        self.counter = counter or WindowCounter()

    @property
    def limit(self) -> int:
        return self.window.limit

    def measure(self, messages: Sequence[Message], estimated: int | None = None) -> int:
        """The size of ``messages`` as the cap sees it: the o200k count of every message
        (memoised per text, so each text is tokenized once in a session). ``estimated`` is
        accepted for callers that have a count and ignored: the estimate is 20 % low on mixed
        Unicode and 60 % low on base64, so no estimate is trusted near any limit."""
        del estimated
        return sum(self.counter.exact_messages(messages))

    def _extend(self, tally: WindowTally, messages: Sequence[Message]) -> None:
        """Bring ``tally`` to ``messages``: only the messages after the part it already holds
        are measured (all of them when ``messages`` does not extend the tally's list)."""
        n = len(tally.msgs)
        if n and not (
            len(messages) >= n
            and messages[n - 1] is tally.msgs[-1]
            and ((n == len(messages) and messages is tally.msgs) or (messages[:n] if isinstance(messages, list) else list(messages[:n])) == tally.msgs)
        ):
            tally.reset()
            n = 0
        if len(messages) == n:
            return
        bound = self.counter.bound_message
        for m in messages[n:]:
            size, exact = bound(m)
            if not exact:
                tally.loose.append(len(tally.sizes))
            tally.msgs.append(m)
            tally.sizes.append(size)
            tally.total += size

    def _tighten(self, tally: WindowTally) -> None:
        """Replace the upper bounds in ``tally`` by exact counts."""
        for i in tally.loose:
            n = self.counter.exact_message(tally.msgs[i])
            tally.total += n - tally.sizes[i]
            tally.sizes[i] = n
        tally.loose = []

    def over(self, messages: Sequence[Message], *, tally: WindowTally | None = None, reserve: int = 0) -> bool:
        """True when :meth:`fit` would cut ``messages`` (measured as ``fit`` measures them, into
        ``tally`` when given, so the ``fit`` that follows counts nothing again). ``reserve``:
        tokens the request carries besides the messages (tool definitions)."""
        limit = self.limit - reserve
        t = tally if tally is not None else WindowTally()
        self._extend(t, messages)
        if t.total > limit and t.loose:
            self._tighten(t)
        return t.total > limit

    def room(self, messages: Sequence[Message], *, tally: WindowTally | None = None, reserve: int = 0) -> int:
        """Tokens left under the limit after ``messages`` and ``reserve`` (0 when over): the
        messages counted exactly; ``tally`` (not changed) saves counting those it holds."""
        t = WindowTally()
        if tally is not None:
            t.msgs, t.sizes, t.total, t.loose = list(tally.msgs), list(tally.sizes), tally.total, list(tally.loose)
        self._extend(t, messages)
        self._tighten(t)
        return max(0, self.limit - reserve - t.total)

    def fit(
        self,
        messages: Sequence[Message],
        *,
        estimated: int | None = None,
        ref_for: RefFor | None = None,
        tally: WindowTally | None = None,
        reserve: int = 0,
        recall: bool = True,
        originals: bool | None = None,
    ) -> CapResult:
        """``messages`` within the limit (a new list when anything was cut; the input is never
        mutated). ``estimated`` is accepted for callers that have a count and ignored (see
        :meth:`measure`). ``tally`` is the session's running sums (:class:`WindowTally`): with
        it, only messages not measured before are counted; it then holds the returned list.
        ``reserve``: tokens the request carries besides the messages (tool definitions); the
        messages get ``limit - reserve``. ``recall`` False: the recall tools do not reach the
        model, so no marker or note names them (they say the originals are in the session store).
        When nothing is cut, ``tokens`` of the result (the messages') may be an upper bound of
        the exact size. ``originals``: whether the originals of what is cut are kept (a store
        recorded them); by default when ``ref_for`` is given. When they are not, no user message
        is cut (there would be no other copy of it), and a request that fits only by cutting
        one is a :class:`ContextWindowError`. Raises :class:`ContextWindowError` when even the
        anchors overflow."""
        del estimated
        limit = self.limit - reserve
        t = tally if tally is not None else WindowTally()
        self._extend(t, messages)
        if t.total > limit and t.loose:
            self._tighten(t)
        if t.total <= limit:
            return CapResult(list(messages), t.total, limit)
        msgs = list(messages)
        sizes = list(t.sizes)
        total = t.total
        result = CapResult(msgs, total, limit)
        try:
            if limit <= 0:
                raise ContextWindowError(
                    f"the tool definitions alone ({reserve:,} tokens) fill the request limit of {self.limit:,} tokens "
                    f"(window {self.window.context_length:,} - completion reserve {self.window.reserve:,} - margin {self.window.margin:,}): "
                    "send fewer tools or use a model with a larger window"
                )
            kept = ref_for is not None if originals is None else originals
            Fitting(self.counter, self.window, messages, result, sizes, ref_for=ref_for, reserve=reserve, recall=recall, originals=kept).run()
        except ContextWindowError:
            t.reset()
            raise
        t.reset(result.messages, self.counter.exact_messages(result.messages))
        return result
