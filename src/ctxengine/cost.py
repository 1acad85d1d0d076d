"""A pure model of what a sequence of requests costs under provider prompt caching.

Two providers, simulated request by request with a clock:

**Anthropic** (explicit ``cache_control`` breakpoints)
    A request reads from cache the longest prefix, ending at a message boundary, that an
    earlier request wrote and that is still alive; candidates are each breakpoint and the block
    boundaries up to :data:`~ctxengine.caching.LOOKBACK_BLOCKS` (20) blocks before it, nothing
    further. Everything after the read point up to the last breakpoint whose prefix reaches the
    model's minimum cacheable length is written (1.25× the input price for the 5-minute TTL,
    2× for the hour), the rest is billed at 1×, reads at 0.1×. Each cacheable breakpoint leaves
    an entry; entries live ``ttl`` seconds and a read refreshes them.

**OpenAI** (automatic prefix caching)
    Every prefix a request sends becomes cached; the next request gets the longest prefix it
    shares with any live earlier one, counted in 128-token steps from 1,024 tokens (shorter
    matches are not cached), billed at the model's cached fraction of the input price
    (``openai_cached_discount`` in the model table). Entries live ``retention`` seconds after
    last use.

Prefixes are matched exactly (a hash chain over the canonical form of each message, with
``cache_control`` markers removed and string content seen as one text part), so any edit to a
message invalidates everything after it, as at the providers. Token counts per message are
given by the caller or estimated.

:func:`compaction_break_even` answers the engine's question — after how many further calls a
compaction that rewrites part of the cached prefix has paid for itself.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ctxengine.messages import Message, message_blocks
from ctxengine.models import ModelProfile
from ctxengine.tokens import estimate_message_tokens

__all__ = [
    "ANTHROPIC_READ",
    "ANTHROPIC_WRITE",
    "AnthropicCache",
    "CallCost",
    "CostReport",
    "OpenAICache",
    "PrefixHasher",
    "Request",
    "billed_cost",
    "compaction_break_even",
    "marked_breakpoints",
    "message_blocks",
    "read_price",
    "simulate",
]

ANTHROPIC_WRITE = {"5m": 1.25, "1h": 2.0}
"""Cache-write price multipliers by TTL (Anthropic's published rates)."""
ANTHROPIC_READ = 0.1
"""Cache-read price multiplier (Anthropic)."""
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}

LOOKBACK_BLOCKS = 20
"""Anthropic looks for cache hits at most about 20 content blocks before each breakpoint."""


DEFAULT_SECONDS_PER_CALL = 20.0
"""Simulated time between two calls when the caller gives no clock: a typical agent step
(model latency plus a tool run), well inside the 5-minute TTL as in real agent loops."""


@dataclass(slots=True)
class CallCost:
    """The cost of one request. Token fields add up to ``tokens``; money is USD."""

    index: int
    tokens: int
    read_tokens: int = 0
    write_tokens: int = 0
    uncached_tokens: int = 0
    cost: float = 0.0
    cost_no_cache: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "tokens": self.tokens,
            "read_tokens": self.read_tokens,
            "write_tokens": self.write_tokens,
            "uncached_tokens": self.uncached_tokens,
            "cost": self.cost,
            "cost_no_cache": self.cost_no_cache,
        }


@dataclass(slots=True)
class CostReport:
    """Per-call and total costs of a request sequence under one provider's caching."""

    provider: str
    model: str
    calls: list[CallCost] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(c.cost for c in self.calls)

    @property
    def total_no_cache(self) -> float:
        return sum(c.cost_no_cache for c in self.calls)

    @property
    def read_tokens(self) -> int:
        return sum(c.read_tokens for c in self.calls)

    @property
    def write_tokens(self) -> int:
        return sum(c.write_tokens for c in self.calls)

    @property
    def uncached_tokens(self) -> int:
        return sum(c.uncached_tokens for c in self.calls)

    def to_dict(self, *, per_call: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {
            "provider": self.provider,
            "model": self.model,
            "calls": len(self.calls),
            "total": round(self.total, 6),
            "total_no_cache": round(self.total_no_cache, 6),
            "read_tokens": self.read_tokens,
            "write_tokens": self.write_tokens,
            "uncached_tokens": self.uncached_tokens,
        }
        if per_call:
            d["per_call"] = [c.to_dict() for c in self.calls]
        return d


def _strip_markers(message: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in message.items() if k != "cache_control"}
    content = out.get("content")
    if isinstance(content, str):
        out["content"] = [{"type": "text", "text": content}] if content else None
    elif isinstance(content, list):
        parts: list[Any] = []
        for p in content:
            if isinstance(p, dict) and "cache_control" in p:
                p = {k: v for k, v in p.items() if k != "cache_control"}
            parts.append(p)
        out["content"] = parts or None
    return out


class PrefixHasher:
    """Exact-prefix identities of message lists.

    ``keys(messages)[i]`` identifies ``messages[:i+1]``: equal keys mean byte-identical
    prefixes once cache markers are ignored. Digests are memoised per message object (the
    object is kept alive with its digest, so ids are never reused while memoised), which makes
    replays that carry the same dicts forward cheap.
    """

    def __init__(self) -> None:
        self._digests: dict[int, tuple[Mapping[str, Any], bytes]] = {}
        self._chain: dict[tuple[bytes, bytes], bytes] = {}

    def digest(self, message: Mapping[str, Any]) -> bytes:
        hit = self._digests.get(id(message))
        if hit is not None and hit[0] is message:
            return hit[1]
        canon = json.dumps(_strip_markers(message), sort_keys=True, ensure_ascii=False, default=str)
        d = hashlib.blake2b(canon.encode("utf-8", "surrogatepass"), digest_size=16).digest()  # lone surrogates hash too
        self._digests[id(message)] = (message, d)
        return d

    def keys(self, messages: Sequence[Mapping[str, Any]]) -> list[bytes]:
        out: list[bytes] = []
        prev = b""
        for m in messages:
            d = self.digest(m)
            link = (prev, d)
            k = self._chain.get(link)
            if k is None:
                k = hashlib.blake2b(prev + d, digest_size=16).digest()
                self._chain[link] = k
            out.append(k)
            prev = k
        return out


def marked_breakpoints(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices of messages that carry a ``cache_control`` marker (on the message or a part)."""
    out = []
    for i, m in enumerate(messages):
        if "cache_control" in m:
            out.append(i)
            continue
        content = m.get("content")
        if isinstance(content, list) and any(isinstance(p, dict) and "cache_control" in p for p in content):
            out.append(i)
    return out


def _tokens(messages: Sequence[Mapping[str, Any]], tokens: Sequence[int] | None) -> list[int]:
    if tokens is None:
        return [estimate_message_tokens(m) for m in messages]
    if len(tokens) != len(messages):
        raise ValueError(f"got {len(tokens)} token counts for {len(messages)} messages")
    return [int(t) for t in tokens]


class _Clock:
    def __init__(self, step: float) -> None:
        self.step = step
        self.now = 0.0
        self.started = False

    def tick(self, now: float | None) -> float:
        if now is not None:
            self.now = float(now)
        elif self.started:
            self.now += self.step
        self.started = True
        return self.now


class AnthropicCache:
    """Anthropic's explicit prompt cache for one conversation (see the module docstring).

    ``input_price`` is USD per million input tokens. ``ttl`` is the TTL of the markers
    (``5m``/``1h``); ``min_cache_tokens`` the model's shortest cacheable prefix.
    """

    provider = "anthropic"

    def __init__(
        self,
        *,
        input_price: float = 3.0,
        min_cache_tokens: int = 1024,
        ttl: Literal["5m", "1h"] = "5m",
        lookback: int = LOOKBACK_BLOCKS,
        seconds_per_call: float = DEFAULT_SECONDS_PER_CALL,
        hasher: PrefixHasher | None = None,
    ) -> None:
        if ttl not in ANTHROPIC_WRITE:
            raise ValueError(f"ttl must be '5m' or '1h', not {ttl!r}")
        self.input_price = float(input_price)
        self.min_cache_tokens = int(min_cache_tokens)
        self.ttl = ttl
        self.lookback = int(lookback)
        self.hasher = hasher or PrefixHasher()
        self._clock = _Clock(seconds_per_call)
        self._entries: dict[bytes, float] = {}
        self._n = 0

    def call(
        self,
        messages: Sequence[Mapping[str, Any]],
        breakpoints: Sequence[int] | None = None,
        *,
        tokens: Sequence[int] | None = None,
        now: float | None = None,
        ttl: Literal["5m", "1h"] | None = None,
    ) -> CallCost:
        """Bill one request. ``breakpoints`` are message indices carrying ``cache_control``
        (read from the messages when omitted); ``ttl`` the TTL of this request's markers
        (default: the cache's ``ttl``; ``cache_ttl: auto`` changes it during a session)."""
        ttl = ttl or self.ttl
        if ttl not in ANTHROPIC_WRITE:
            raise ValueError(f"ttl must be '5m' or '1h', not {ttl!r}")
        t = self._clock.tick(now)
        toks = _tokens(messages, tokens)
        total = sum(toks)
        bps = sorted(set(marked_breakpoints(messages) if breakpoints is None else breakpoints))
        keys = self.hasher.keys(messages)
        prefix: list[int] = []
        blocks: list[int] = []
        acc = 0
        bacc = 0
        for m, tk in zip(messages, toks, strict=True):
            acc += tk
            bacc += message_blocks(m)
            prefix.append(acc)
            blocks.append(bacc)
        self._entries = {k: exp for k, exp in self._entries.items() if exp >= t}
        live = self._entries
        hit = -1
        for bp in bps:
            j = bp
            while j >= 0 and blocks[bp] - blocks[j] <= self.lookback:
                if j > hit and keys[j] in live:
                    hit = j
                    break
                j -= 1
        read = prefix[hit] if hit >= 0 else 0
        cacheable = [bp for bp in bps if prefix[bp] >= self.min_cache_tokens]
        last = cacheable[-1] if cacheable else -1
        write = prefix[last] - read if last > hit else 0
        uncached = total - read - write
        expiry = t + TTL_SECONDS[ttl]
        if hit >= 0:
            self._entries[keys[hit]] = expiry
        for bp in cacheable:
            self._entries[keys[bp]] = expiry
        price = self.input_price / 1e6
        cost = price * (read * ANTHROPIC_READ + write * ANTHROPIC_WRITE[ttl] + uncached)
        cc = CallCost(self._n, total, read, write, uncached, cost, price * total)
        self._n += 1
        return cc


class OpenAICache:
    """OpenAI's automatic prefix cache (see the module docstring).

    ``cached_discount`` is the fraction of the input price billed for cached tokens.
    """

    provider = "openai"

    def __init__(
        self,
        *,
        input_price: float = 2.5,
        cached_discount: float = 0.5,
        min_tokens: int = 1024,
        step: int = 128,
        retention: float = 600.0,
        seconds_per_call: float = DEFAULT_SECONDS_PER_CALL,
        hasher: PrefixHasher | None = None,
    ) -> None:
        self.input_price = float(input_price)
        self.cached_discount = float(cached_discount)
        self.min_tokens = int(min_tokens)
        self.step = int(step)
        self.retention = float(retention)
        self.hasher = hasher or PrefixHasher()
        self._clock = _Clock(seconds_per_call)
        self._entries: dict[bytes, float] = {}
        self._n = 0

    def cached_tokens(self, matched: int) -> int:
        """Tokens billed as cached for a shared prefix of ``matched`` tokens."""
        if matched < self.min_tokens:
            return 0
        return self.min_tokens + (matched - self.min_tokens) // self.step * self.step

    def call(
        self,
        messages: Sequence[Mapping[str, Any]],
        breakpoints: Sequence[int] | None = None,
        *,
        tokens: Sequence[int] | None = None,
        now: float | None = None,
    ) -> CallCost:
        """Bill one request (``breakpoints`` are ignored: OpenAI caches automatically)."""
        t = self._clock.tick(now)
        toks = _tokens(messages, tokens)
        total = sum(toks)
        keys = self.hasher.keys(messages)
        matched = 0
        acc = 0
        for k, tk in zip(keys, toks, strict=True):
            acc += tk
            exp = self._entries.get(k)
            if exp is None or exp < t:
                break
            matched = acc
        cached = self.cached_tokens(matched)
        expiry = t + self.retention
        for k in keys:
            self._entries[k] = expiry
        price = self.input_price / 1e6
        cost = price * (cached * self.cached_discount + (total - cached))
        cc = CallCost(self._n, total, cached, 0, total - cached, cost, price * total)
        self._n += 1
        return cc


@dataclass(slots=True)
class Request:
    """One request of a simulated sequence: the messages sent, where the cache markers are
    (``None``: read them from the messages), per-message token counts (``None``: estimated)
    and the time it is sent in seconds (``None``: the simulator's clock)."""

    messages: Sequence[Message]
    breakpoints: Sequence[int] | None = None
    tokens: Sequence[int] | None = None
    at: float | None = None


def simulate(
    requests: Iterable[Request | Sequence[Message]],
    *,
    provider: Literal["anthropic", "openai"] = "anthropic",
    profile: ModelProfile | None = None,
    ttl: Literal["5m", "1h"] = "5m",
    seconds_per_call: float = DEFAULT_SECONDS_PER_CALL,
) -> CostReport:
    """Bill a sequence of requests of one conversation and return the per-call costs.

    ``profile`` gives the input price, the minimum cacheable length and the OpenAI cached
    discount (defaults: Claude Sonnet's $3/M for Anthropic, GPT-4o's $2.5/M for OpenAI).
    """
    sim: AnthropicCache | OpenAICache
    if provider == "anthropic":
        sim = AnthropicCache(
            input_price=profile.input if profile else 3.0,
            min_cache_tokens=profile.min_cache_tokens if profile else 1024,
            ttl=ttl,
            seconds_per_call=seconds_per_call,
        )
    elif provider == "openai":
        sim = OpenAICache(
            input_price=profile.input if profile else 2.5,
            cached_discount=profile.openai_cached_discount if profile else 0.5,
            seconds_per_call=seconds_per_call,
        )
    else:
        raise ValueError(f"provider must be 'anthropic' or 'openai', not {provider!r}")
    report = CostReport(provider, profile.name if profile else provider)
    for r in requests:
        req = r if isinstance(r, Request) else Request(list(r))
        report.calls.append(sim.call(req.messages, req.breakpoints, tokens=req.tokens, now=req.at))
    return report


def compaction_break_even(
    tokens_before: int,
    tokens_after: int,
    stable_prefix_tokens: int,
    *,
    ttl: Literal["5m", "1h"] = "5m",
) -> float:
    """Calls after which a compaction has paid for the cache it invalidates (Anthropic rates).

    Without compaction the next call reads ``tokens_before`` from cache. With it, the call reads
    the untouched ``stable_prefix_tokens`` and writes the rest of ``tokens_after`` again; every
    later call then reads ``tokens_before - tokens_after`` fewer tokens. Returns ``inf`` when
    the compaction saves nothing, ``0.0`` when it is cheaper at once.
    """
    saved_per_call = (tokens_before - tokens_after) * ANTHROPIC_READ
    if saved_per_call <= 0:
        return math.inf
    rewritten = max(0, tokens_after - stable_prefix_tokens)
    extra = stable_prefix_tokens * ANTHROPIC_READ + rewritten * ANTHROPIC_WRITE[ttl] - tokens_before * ANTHROPIC_READ
    return max(0.0, extra / saved_per_call)


def read_price(profile: ModelProfile) -> float:
    """USD per million prompt tokens read from the provider's cache: Anthropic's read rate, or
    OpenAI's cached discount, times the input price."""
    rate = ANTHROPIC_READ if profile.is_claude else profile.openai_cached_discount
    return profile.input * rate


def billed_cost(
    profile: ModelProfile,
    *,
    prompt_tokens: int,
    cache_read_tokens: int = 0,
    cache_write_tokens: int = 0,
    completion_tokens: int = 0,
    ttl: Literal["5m", "1h"] = "5m",
) -> float:
    """USD a request costs as the provider bills its usage (``prompt_tokens`` includes the cached
    parts, as :func:`ctxengine.engine.normalize_usage` reads it): uncached prompt tokens at the
    input price, cache reads at :func:`read_price`, cache writes at Anthropic's write rate for
    ``ttl`` (OpenAI bills its automatic writes as plain input), completion at the output price."""
    uncached = max(0, prompt_tokens - cache_read_tokens - cache_write_tokens)
    write_rate = ANTHROPIC_WRITE[ttl] if profile.is_claude else 1.0
    return (
        uncached * profile.input
        + cache_read_tokens * read_price(profile)
        + cache_write_tokens * profile.input * write_rate
        + completion_tokens * profile.output
    ) / 1_000_000
