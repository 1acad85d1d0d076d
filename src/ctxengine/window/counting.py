"""What the window cap counts with: the request's limit (:class:`WindowLimit`), the o200k counts
memoised per text (:class:`WindowCounter`), the tool definitions' size (:class:`ToolTokens`)
and a session's running sums (:class:`WindowTally`); see :mod:`ctxengine.window`."""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ctxengine.errors import ContextWindowError, TokenizerError
from ctxengine.messages import Message
from ctxengine.tokens import ExactCounter, TokenCounter, estimate, message_tokens

__all__ = [
    "EXACT_CHARS",
    "TOOLS_OVERHEAD_TOKENS",
    "ExactView",
    "ToolTokens",
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

    def forget(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """Drop what is remembered of ``messages`` (a session that ended): their sizes, and
        the exact counts of their long texts."""
        texts: list[str] = []

        def collect(text: str) -> int:
            if len(text) >= self.exact_chars:
                texts.append(text)
            return 0

        for m in messages:
            message_tokens(m, collect)
        with self._lock:
            for m in messages:
                hit = self._by_message.get(id(m))
                if hit is not None and hit[0] is m:
                    del self._by_message[id(m)]
            for t in texts:
                self._memo.pop(t, None)

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


class ExactView:
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


