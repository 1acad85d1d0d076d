"""The window cap: no request leaves the manager larger than the window, whatever the engine did.

The limit of one request is::

    limit = context_length − completion_reserve − window_margin × context_length

* ``completion_reserve`` (``context.completion_reserve``) keeps room for the model's answer.
  Default ``min(8192, context_length // 16)``: 2,000 tokens at 32K, 8,000 at 128K, 8,192 from
  about 131K up — what agents usually ask for as ``max_tokens``.
* ``window_margin`` (``context.window_margin``, default 3 % of the window) absorbs the
  difference between o200k, which the cap counts with, and a provider's own tokenizer.

Counting (:class:`WindowCounter`): the cap counts every message with the o200k tokenizer,
memoised per text, so a long session costs one exact count per new text (the estimate is 16 %
low on a ``/sys`` listing in the data, 20 % on mixed Unicode, 60 % on base64: no estimate is
trusted at the limit). A text not tokenized yet is first taken at a safe upper bound (its
UTF-8 byte count: an o200k token is never shorter than a byte) and tokenized only when the
request with these bounds is not under the limit. Each
session keeps running sums (:class:`WindowTally`): a list that extends the last one measured
costs only its new messages, and the same list measured again (``request`` after ``prepare``)
costs nothing. For the engines' decisions the manager's session counter estimates short texts
and counts texts of :data:`EXACT_CHARS` characters or more exactly.

When the request is over (:meth:`WindowCap.fit`), the cap cuts, in this order (no tool pair
breaks; no user message is lost: one stubbed or folded stays in the store, returned by recall):

1. the largest tool outputs, then the largest assistant texts and marked summaries, each with
   :func:`ctxengine.engines.kit.cut.cut_output` (head + tail lines, a ``[ctxengine:cut ref=…]``
   marker naming the original's store id, the paths, URLs and error lines of the removed middle
   as far as the budget allows); a message is cut to what the excess requires plus 5 % of the
   limit of headroom, so the next turns do not cut again by a few tokens each;
2. oversized tool-call arguments (the arguments become a JSON object holding the cut text);
3. older user messages become recall stubs (a cut with their ``ref``), oldest first;
   with recall (a store), then every older user message down to its marker alone;
4. whole old exchanges (an assistant message and its tool results), oldest first, never the
   last one (only when the messages alone, each cut to its marker, overflow: thousands of
   turns in a small window);
5. with recall, the oldest messages left before the latest user message (stubs, markers,
   records) fold into one ``[ctxengine:folded: …]`` line pointing at recall, as few as needed;
6. if the system prompt and the latest user message alone do not fit, it raises
   :class:`~ctxengine.errors.ContextWindowError` naming the sizes: nothing valid can be sent.

**Tool definitions** count too (the provider counts them in the prompt): ``over`` and ``fit``
take ``reserve``, the tokens a request carries besides its messages (the serialised tool
schemas, :class:`ToolTokens`), and hold the messages to ``limit - reserve``.

The originals are in the session store (the manager records every message each turn), so
everything cut stays retrievable verbatim through recall (:mod:`ctxengine.recall`). Without a
store the cut keeps the facts it can list and the marker has no ``ref``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from ctxengine.engines.kit.cut import cut_output
from ctxengine.engines.kit.records import GREP_TOOL, header, recall_pointer
from ctxengine.errors import ContextWindowError, TokenizerError
from ctxengine.messages import Message, content_text, is_summary
from ctxengine.tokens import EstimateCounter, ExactCounter, TokenCounter, estimate, message_tokens

__all__ = [
    "EXACT_CHARS",
    "TOOLS_OVERHEAD_TOKENS",
    "CapResult",
    "ToolTokens",
    "WindowCap",
    "WindowCounter",
    "WindowLimit",
    "WindowTally",
    "default_completion_reserve",
]

log = logging.getLogger("ctxengine.window")

EXACT_CHARS = 20_000
"""Texts at least this long are counted with the real tokenizer, never estimated: a single
one can hold a listing or a minified file where the estimate is off by 15 % or more, and
one exact count of 20,000 characters takes about a millisecond."""

HEADROOM_RATIO = 0.05
"""A cut frees this share of the limit beyond the excess, so the next few turns fit without
cutting again (each cut rewrites the cached prefix from that message on)."""

MIN_KEEP_TOKENS = 256
"""A cut leaves at least this much of an output (marker, first lines, facts)."""

STUB_TOKENS = 200

MARKER_TOKENS = 24
"""The least a cut leaves: about the marker line alone (small windows only)."""
"""What an older user message keeps when even the anchors do not fit (a recall stub)."""

_MEMO_SIZE = 65_536

TOOLS_OVERHEAD_TOKENS = 350
"""Added once to a non-empty tool list: the text a provider wraps tool definitions in
(Anthropic documents a 346-token tool-use system prompt; OpenAI renders the schemas into a
namespace of its own)."""

_TOOL_MEMO_SIZE = 64
_TOOL_IDS = 256
_TOOL_IDS_BYTES = 2 * 1024 * 1024
"""Lists remembered by identity: at most this many, holding at most this much JSON (each is
kept alive while remembered; a proxy's session keeps its own anyway)."""


def default_completion_reserve(context_length: int) -> int:
    """``min(8192, context_length // 16)``: room for the answer (see the module docstring)."""
    return max(0, min(8192, int(context_length) // 16))


@dataclass(frozen=True, slots=True)
class WindowLimit:
    """The largest request for a window: ``context_length - reserve - margin`` tokens."""

    context_length: int
    reserve: int
    margin: int

    @classmethod
    def for_window(
        cls,
        context_length: int,
        *,
        completion_reserve: int | None = None,
        margin_ratio: float = 0.03,
    ) -> WindowLimit:
        n = int(context_length)
        if n <= 0:
            raise ContextWindowError(f"context_length must be positive, not {n}")
        reserve = (
            default_completion_reserve(n) if completion_reserve is None else int(completion_reserve)
        )
        margin = int(n * float(margin_ratio))
        if reserve + margin >= n:
            raise ContextWindowError(
                f"completion_reserve ({reserve:,}) plus window_margin ({margin:,}) leave no room in a {n:,}-token window"
            )
        return cls(n, reserve, margin)

    @property
    def limit(self) -> int:
        return self.context_length - self.reserve - self.margin


class WindowCounter:
    """Token counts for window decisions: the estimate for short texts, o200k for long ones
    (and for everything with :meth:`exact_messages`), memoised per text.

    Falls back to the estimate when the ``exact`` extra is not installed (logged once); the
    margin is then the only protection against an undercount.
    """

    def __init__(
        self, exact: TokenCounter | None = None, *, exact_chars: int = EXACT_CHARS
    ) -> None:
        self._exact: TokenCounter | None = exact if exact is not None else ExactCounter()
        self.exact_chars = int(exact_chars)
        self._memo: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        self.name = "window"
        # per message object: a turn measures only the messages it has not seen (the same dict
        # is the same message: messages passed to the manager are never edited in place);
        # the flag says whether the size is exact (else a safe upper bound, see bound_message)
        self._by_message: dict[int, tuple[Mapping[str, Any], int, bool]] = {}

    per_message = True  # count_messages is the sum of each message's count

    @property
    def has_exact(self) -> bool:
        return self._exact is not None

    def _exact_count(self, text: str) -> int:
        with self._lock:
            hit = self._memo.get(text)
            if hit is not None:
                self._memo.move_to_end(text)
                return hit
        if self._exact is None:
            return estimate(text)
        try:
            n = int(self._exact.count(text))
        except TokenizerError as exc:
            log.warning("exact token counts unavailable, estimating instead: %s", exc)
            self._exact = None
            return estimate(text)
        with self._lock:
            self._memo[text] = n
            if len(self._memo) > _MEMO_SIZE:
                self._memo.popitem(last=False)
        return n

    def count(self, text: str) -> int:
        """Estimate, or the exact count for a text of :attr:`exact_chars` or more."""
        if not text:
            return 0
        return self._exact_count(text) if len(text) >= self.exact_chars else estimate(text)

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return sum(message_tokens(m, self.count) for m in messages)

    def count_message(self, message: Mapping[str, Any], estimated: Callable[[Mapping[str, Any]], int]) -> int:
        """``count_messages([message])`` when ``estimated(message)`` is the message's estimate
        (memoised by the caller): below :attr:`exact_chars` every text counts as its estimate,
        so only a message holding a longer text is counted here (finding one costs a walk over
        the message, not the estimate's pass over each character)."""
        limit = self.exact_chars
        n = estimated(message)
        # A text of L characters is estimated at 20 * tokens >= L - 3 (ASCII: at most 3/4 of
        # its bytes are four-space runs, the rest 1/5 token each; other characters cost more),
        # and a message's estimate is at least each of its texts': a message estimated below
        # that bound for ``limit`` holds no long text, and its count is its estimate, without
        # the walk over the message looking for one (~4K instructions a new message a turn)
        if 20 * n < limit - 3:
            return n
        long = False

        def probe(text: str) -> int:
            nonlocal long
            long = long or len(text) >= limit
            return 0

        message_tokens(message, probe)
        return message_tokens(message, self.count) if long else n

    def exact_text(self, text: str) -> int:
        """The exact count of any text (memoised)."""
        return self._exact_count(text) if text else 0

    def _remember(self, message: Mapping[str, Any], n: int, exact: bool) -> None:
        with self._lock:
            if len(self._by_message) >= _MEMO_SIZE:
                self._by_message.clear()
            self._by_message[id(message)] = (message, n, exact)

    def exact_message(self, message: Mapping[str, Any]) -> int:
        hit = self._by_message.get(id(message))
        if hit is not None and hit[0] is message and hit[2]:
            return hit[1]
        n = message_tokens(message, self.exact_text)
        self._remember(message, n, True)
        return n

    def bound_message(self, message: Mapping[str, Any]) -> tuple[int, bool]:
        """``(size, exact)``: the exact size of ``message``, or a safe upper bound of it when it
        holds a text not tokenized yet (``exact`` is False)."""
        hit = self._by_message.get(id(message))
        if hit is not None and hit[0] is message:
            return hit[1], hit[2]
        loose = False

        def bound(text: str) -> int:
            nonlocal loose
            if not text:
                return 0
            known = self._memo.get(text)
            if known is not None:
                return known
            loose = True
            # o200k tokens are at least one byte each: the UTF-8 length is never an undercount
            return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))

        n = message_tokens(message, bound)
        self._remember(message, n, not loose)
        return n, not loose

    def exact_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        return [self.exact_message(m) for m in messages]

class ToolTokens:
    """Tokens of tool definitions as a provider counts them: the list serialised as compact JSON
    (``orjson``, non-ASCII kept) plus :data:`TOOLS_OVERHEAD_TOKENS`, as ``(decision, window)``
    counts: ``count`` (the configured counter, for the engines' trigger and hygiene) and
    ``exact`` (o200k, for the window cap). An empty list costs ``(0, 0)``.

    Memoised per distinct list: first by the list object (a caller that keeps its tool list
    pays a dictionary lookup), then by its serialised bytes (a list decoded from JSON again each
    turn, as a proxy does, pays one ``orjson.dumps`` — about 60 µs for 16K tokens of schemas —
    and a byte comparison, never a count: counting them exactly takes about 3 ms). Thread-safe."""

    def __init__(self, count: Callable[[str], int], exact: Callable[[str], int]) -> None:
        self._count = count
        self._exact = exact
        self._lock = threading.Lock()
        # id(list) -> (list, counts, JSON size): the list is kept so its id is not reused while remembered
        self._by_id: OrderedDict[int, tuple[Sequence[Any], tuple[int, int], int]] = OrderedDict()
        self._id_bytes = 0
        # len(bytes) -> [(bytes, counts)]: a byte comparison instead of hashing 100 KB each turn
        self._by_bytes: dict[int, list[tuple[bytes, tuple[int, int]]]] = {}
        self._n_bytes = 0

    def known(self, tools: Sequence[Any]) -> tuple[int, int] | None:
        """The counts of ``tools`` when this list was counted before (no count now), else ``None``."""
        if not tools:
            return (0, 0)
        hit = self._by_id.get(id(tools))
        if hit is not None and hit[0] is tools:
            return hit[1]
        raw = self._dump(tools)
        with self._lock:
            for seen, counts in self._by_bytes.get(len(raw), ()):
                if seen == raw:
                    self._remember_id(tools, counts, len(raw))
                    return counts
        return None

    def count(self, tools: Sequence[Any]) -> tuple[int, int]:
        """``(decision, window)`` tokens of ``tools`` (memoised, see the class docstring)."""
        hit = self.known(tools)
        if hit is not None:
            return hit
        raw = self._dump(tools)
        text = raw.decode("utf-8", "surrogatepass")
        counts = (int(self._count(text)) + TOOLS_OVERHEAD_TOKENS, int(self._exact(text)) + TOOLS_OVERHEAD_TOKENS)
        with self._lock:
            if self._n_bytes >= _TOOL_MEMO_SIZE:
                self._by_bytes.clear()
                self._n_bytes = 0
            self._by_bytes.setdefault(len(raw), []).append((raw, counts))
            self._n_bytes += 1
            self._remember_id(tools, counts, len(raw))
        return counts

    def _remember_id(self, tools: Sequence[Any], counts: tuple[int, int], size: int) -> None:
        old = self._by_id.pop(id(tools), None)
        if old is not None:
            self._id_bytes -= old[2]
        self._by_id[id(tools)] = (tools, counts, size)
        self._id_bytes += size
        while len(self._by_id) > 1 and (len(self._by_id) > _TOOL_IDS or self._id_bytes > _TOOL_IDS_BYTES):
            self._id_bytes -= self._by_id.popitem(last=False)[1][2]

    @staticmethod
    def _dump(tools: Sequence[Any]) -> bytes:
        try:
            return orjson.dumps(tools if isinstance(tools, list) else list(tools), default=str)
        except (TypeError, orjson.JSONEncodeError):  # keys that are not strings, lone surrogates
            return json.dumps(list(tools), ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8", "surrogatepass")


class _ExactAdapter:
    """A :class:`TokenCounter` view of :meth:`WindowCounter.exact_text` (for ``cut_output``)."""

    def __init__(self, counter: WindowCounter) -> None:
        self._c = counter
        self.name = "window-exact"

    def count(self, text: str) -> int:
        return self._c.exact_text(text)

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return sum(self._c.exact_messages(messages))


class WindowTally:
    """Running sizes of the last list a session measured (see the module docstring): the
    messages, each one's size (exact, or a safe upper bound for those in :attr:`loose`) and
    their sum. One per session; :meth:`WindowCap.fit` keeps it up to date."""

    __slots__ = ("loose", "msgs", "sizes", "total")

    def __init__(self) -> None:
        self.msgs: list[Message] = []
        self.sizes: list[int] = []
        self.total = 0
        self.loose: list[int] = []

    def reset(self, msgs: list[Message] | None = None, sizes: list[int] | None = None) -> None:
        """Forget everything, or hold ``msgs`` with their exact ``sizes``."""
        self.msgs = list(msgs or [])
        self.sizes = list(sizes or [])
        self.total = sum(self.sizes)
        self.loose = []


@dataclass(slots=True)
class CapResult:
    """What :meth:`WindowCap.fit` did: the messages to send, their exact size, what was cut."""

    messages: list[Message]
    tokens: int
    limit: int
    cut: list[int] = field(default_factory=list)
    stubbed_users: list[int] = field(default_factory=list)
    dropped: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.cut or self.stubbed_users or self.dropped)


RefFor = Callable[[int, Message], str | None]
"""``ref_for(index, message)``: the store id of the original behind a message, or ``None``."""


def _is_first_system(messages: Sequence[Message], i: int) -> bool:
    return i == 0 and messages[0].get("role") in ("system", "developer")


def _latest_user(messages: Sequence[Message]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.get("role") == "user" and not is_summary(m):
            return i
    return -1


class WindowCap:
    """Holds :class:`WindowLimit` over any message list (see the module docstring)."""

    def __init__(self, limit: WindowLimit, counter: WindowCounter | None = None) -> None:
        self.window = limit
        self.counter = counter or WindowCounter()
        self._exact = _ExactAdapter(self.counter)
        self._estimate = EstimateCounter()

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
    ) -> CapResult:
        """``messages`` within the limit (a new list when anything was cut; the input is never
        mutated). ``estimated`` is accepted for callers that have a count and ignored (see
        :meth:`measure`). ``tally`` is the session's running sums (:class:`WindowTally`): with
        it, only messages not measured before are counted; it then holds the returned list.
        ``reserve``: tokens the request carries besides the messages (tool definitions); the
        messages get ``limit - reserve``. ``recall`` False: the recall tools do not reach the
        model, so no marker or note names them (they say the originals are in the session store).
        When nothing is cut, ``tokens`` of the result (the messages') may be an upper bound of
        the exact size. Raises :class:`ContextWindowError` when even the anchors overflow."""
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
            self._fit_over(messages, msgs, sizes, total, limit, result, ref_for, reserve, recall)
        except ContextWindowError:
            t.reset()
            raise
        t.reset(result.messages, self.counter.exact_messages(result.messages))
        return result

    def _fit_over(
        self,
        messages: Sequence[Message],
        msgs: list[Message],
        sizes: list[int],
        total: int,
        limit: int,
        result: CapResult,
        ref_for: RefFor | None,
        reserve: int = 0,
        recall: bool = True,
    ) -> None:
        latest = _latest_user(msgs)
        headroom = int(HEADROOM_RATIO * limit)

        def ref(i: int) -> str | None:
            return ref_for(i, messages[i]) if ref_for is not None else None

        # 1. the largest outputs, assistant texts and summaries
        candidates = [
            i
            for i, m in enumerate(msgs)
            if not _is_first_system(msgs, i)
            and i != latest
            and (
                m.get("role") in ("tool", "function", "assistant")
                or (m.get("role") in ("user", "system") and is_summary(m))
            )
            and isinstance(m.get("content"), str | list)
            and content_text(m.get("content"))
        ]
        floor = max(MARKER_TOKENS, min(MIN_KEEP_TOKENS, limit // 40))

        def order(k: int) -> tuple[int, int]:
            # tool outputs first (the agent's own words and summaries are worth more), then
            # the rest; small messages last; the largest first within each tier
            big = sizes[k] > 4 * floor
            tier = (0 if msgs[k].get("role") in ("tool", "function") else 1) if big else 2
            return tier, -sizes[k]

        for i in sorted(candidates, key=order):
            if total <= limit:
                break
            total = self._cut_content(
                msgs, sizes, i, total, limit, headroom, ref(i), floor, result.cut, recall=recall
            )
        # 1b. still over (many outputs, a small window): every candidate down to its marker
        if total > limit:
            for i in sorted(candidates, key=lambda k: sizes[k], reverse=True):
                if total <= limit:
                    break
                total = self._cut_content(
                    msgs, sizes, i, total, limit, 0, ref(i), MARKER_TOKENS, result.cut, stub=True, recall=recall
                )
        # 2. oversized tool-call arguments
        if total > limit:
            for i in sorted(
                (k for k, m in enumerate(msgs) if m.get("tool_calls")),
                key=lambda k: sizes[k],
                reverse=True,
            ):
                if total <= limit:
                    break
                total = self._cut_arguments(
                    msgs, sizes, i, total, limit, headroom, ref(i), result.cut, recall=recall
                )
        # 3. older user messages become recall stubs, oldest first
        stub_floor = max(MARKER_TOKENS, min(STUB_TOKENS, limit // 40))
        if total > limit:
            for i, m in enumerate(msgs):
                if total <= limit:
                    break
                if (
                    m.get("role") != "user"
                    or i == latest
                    or is_summary(m)
                    or sizes[i] <= stub_floor
                ):
                    continue
                before = total
                total = self._cut_content(
                    msgs,
                    sizes,
                    i,
                    total,
                    limit,
                    0,
                    ref(i),
                    stub_floor,
                    result.stubbed_users,
                    stub=True,
                    recall=recall,
                )
                if total < before:
                    result.notes.append(
                        f"user message {i} is a recall stub: the anchors alone overflow the window"
                    )
        # 3b. still over: older user messages down to the marker alone (short recall stubs);
        # only with recall, which returns them whole
        if total > limit and ref_for is not None:
            for i, m in enumerate(msgs):
                if total <= limit:
                    break
                if m.get("role") != "user" or i == latest or is_summary(m):
                    continue
                total = self._cut_content(
                    msgs, sizes, i, total, limit, 0, ref(i), MARKER_TOKENS, result.stubbed_users, stub=True, recall=recall
                )
        # 4. whole old exchanges (an assistant message and its tool results), oldest first
        if total > limit:
            msgs, sizes, total = self._drop_exchanges(msgs, sizes, total, limit, latest, result)
            result.messages = msgs
            latest = _latest_user(msgs)
        # 5. the oldest messages (stubs, markers, records, old exchanges) fold into one line
        # pointing at the store (and recall, when it reaches the model)
        if total > limit and ref_for is not None:
            msgs, sizes, total = self._fold(msgs, sizes, total, limit, result, recall=recall)
            result.messages = msgs
            latest = _latest_user(msgs)
        if total > limit:
            tools = f" - tool definitions {reserve:,}" if reserve else ""
            raise ContextWindowError(
                f"the request cannot fit the window: {total:,} tokens of messages after cutting every output and older user message "
                f"(limit {limit:,} = window {self.window.context_length:,} - completion reserve {self.window.reserve:,} "
                f"- margin {self.window.margin:,}{tools}); the system prompt and the latest user message alone are "
                f"{sizes[0] if msgs and _is_first_system(msgs, 0) else 0:,} + {sizes[latest] if latest >= 0 else 0:,} tokens"
                + (f", the tool definitions {reserve:,}" if reserve else "")
            )
        result.tokens = total
        if result.cut:
            result.notes.append(
                f"window cap: cut {len(result.cut)} message(s) to fit {limit:,} tokens"
            )

    def _fold(
        self, msgs: list[Message], sizes: list[int], total: int, limit: int, result: CapResult, *, recall: bool = True
    ) -> tuple[list[Message], list[int], int]:
        """Replace the oldest messages after the system prompt, up to the latest user message at
        most, by one line pointing at recall; as few as the limit allows. Never splits a tool
        pair (the folded run never ends between a call and its results)."""
        start = 1 if msgs and _is_first_system(msgs, 0) else 0
        latest = _latest_user(msgs)
        if latest <= start:
            return msgs, sizes, total
        removed = 0
        users = 0
        best: tuple[int, Message, int] | None = None
        for k in range(start + 1, latest + 1):
            gone = msgs[k - 1]
            removed += sizes[k - 1]
            if gone.get("role") == "user":
                users += 1
            if msgs[k].get("role") in ("tool", "function"):
                continue  # a tool result may not lose its call
            line = self._fold_message(k - start, users, recall=recall)
            size = self.counter.exact_message(line)
            best = (k, line, size)
            if total - removed + size <= limit:
                break
        if best is None:
            return msgs, sizes, total
        k, line, size = best
        folded = k - start
        total = total - sum(sizes[start:k]) + size
        result.dropped += folded
        result.notes.append(
            f"window cap: folded the {folded} oldest message(s) into one line (originals in the store{f', {GREP_TOOL} finds them' if recall else ''})"
        )
        return (
            [*msgs[:start], line, *msgs[k:]],
            [*sizes[:start], size, *sizes[k:]],
            total,
        )

    @staticmethod
    def _fold_message(n: int, users: int, *, recall: bool = True) -> Message:
        detail = f"{n} earlier message(s), {users} of them from the user, are not shown here; "
        if recall:
            detail += "they are in the session store: ctx_grep finds them, ctx_expand returns them whole"
        else:
            detail += f"they are {recall_pointer(recall)}"
        return {"role": "user", "content": header("folded", detail)}

    def _drop_exchanges(
        self,
        msgs: list[Message],
        sizes: list[int],
        total: int,
        limit: int,
        latest: int,
        result: CapResult,
    ) -> tuple[list[Message], list[int], int]:
        """Remove the oldest whole exchanges (an assistant message and the tool results that
        follow it) until the request fits; never the last exchange, never a user message."""
        groups: list[tuple[int, int]] = []
        i = 0
        while i < len(msgs):
            if msgs[i].get("role") == "assistant":
                j = i + 1
                while j < len(msgs) and msgs[j].get("role") in ("tool", "function"):
                    j += 1
                groups.append((i, j))
                i = j
            else:
                i += 1
        drop: set[int] = set()
        for a, b in groups[:-1]:
            if total <= limit:
                break
            drop.update(range(a, b))
            total -= sum(sizes[a:b])
            result.dropped += b - a
        if not drop:
            return msgs, sizes, total
        result.notes.append(
            f"window cap: dropped {len(drop)} message(s) of old exchanges whole (originals in the store)"
        )
        keep = [k for k in range(len(msgs)) if k not in drop]
        return [msgs[k] for k in keep], [sizes[k] for k in keep], total

    def _cut_content(
        self,
        msgs: list[Message],
        sizes: list[int],
        i: int,
        total: int,
        limit: int,
        headroom: int,
        ref: str | None,
        floor: int,
        cut_log: list[int],
        *,
        stub: bool = False,
        recall: bool = True,
    ) -> int:
        m = msgs[i]
        text = content_text(m.get("content"))
        t = sizes[i]
        overhead = t - self.counter.exact_text(text)
        excess = total - limit
        target = floor if stub else max(floor, t - excess - headroom - overhead)
        if target >= t - overhead:
            return total
        new_text = cut_output(text, budget_tokens=target, ref=ref, counter=self._exact, recall=recall)
        if new_text == text:
            return total
        msgs[i] = {**m, "content": new_text}
        new_size = self.counter.exact_message(msgs[i])
        if new_size >= t:
            msgs[i] = m
            return total
        sizes[i] = new_size
        if i not in cut_log:
            cut_log.append(i)
        return total - t + new_size

    def _cut_arguments(
        self,
        msgs: list[Message],
        sizes: list[int],
        i: int,
        total: int,
        limit: int,
        headroom: int,
        ref: str | None,
        cut_log: list[int],
        *,
        recall: bool = True,
    ) -> int:
        m = msgs[i]
        calls = m.get("tool_calls")
        if not isinstance(calls, list):
            return total
        new_calls: list[Any] = []
        floor = max(MARKER_TOKENS, min(MIN_KEEP_TOKENS, limit // 40))
        changed = False
        excess = total - limit + headroom
        for c in calls:
            fn = c.get("function") if isinstance(c, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else None
            if (
                excess > 0
                and isinstance(fn, dict)
                and isinstance(args, str)
                and self.counter.exact_text(args) > floor * 2
            ):
                t = self.counter.exact_text(args)
                cut = cut_output(
                    args,
                    budget_tokens=max(floor, t - excess),
                    ref=ref,
                    counter=self._exact,
                    recall=recall,
                )
                if cut != args:
                    wrapped = json.dumps({"ctxengine_cut": cut}, ensure_ascii=False)
                    excess -= t - self.counter.exact_text(wrapped)
                    new_calls.append({**c, "function": {**fn, "arguments": wrapped}})
                    changed = True
                    continue
            new_calls.append(c)
        if not changed:
            return total
        msgs[i] = {**m, "tool_calls": new_calls}
        new_size = self.counter.exact_message(msgs[i])
        t = sizes[i]
        sizes[i] = new_size
        cut_log.append(i)
        return total - t + new_size
