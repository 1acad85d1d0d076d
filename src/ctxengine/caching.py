"""Anthropic prompt caching: where ``cache_control`` breakpoints go, and whether to place any.

Two placements, both returning a deep copy with markers (the caller's list is never touched):

``system_and_3`` (the seed's strategy)
    Breakpoint 1 on the system prompt, breakpoints 2–4 on the last three non-system messages:
    a rolling window that re-establishes caching within a turn or two after any change.

``planner`` (beyond the seed)
    Spends the four breakpoints where they pay under Anthropic's rules. A prefix shorter than
    the model's minimum cacheable length is never marked (it would not be cached). Marked, in
    this order of priority: the end of the request (the next call reads it); the *bridge*, the
    last message this request shares with the previous one (after a compaction, the point up to
    which the old cache entries still match; when the previous request is not known, the
    message before the last assistant turn), marked only when the end's own 20-block lookback
    does not reach it; the end of the *stable prefix*, the last compaction record or summary,
    so that the next compaction, which only rewrites what follows it, finds the compacted prefix
    warm; the starts of the current turn and of the one before (the last user message that is
    not a summary, and the last one before that turn's user messages), where a folding engine
    starts rewriting when it folds a finished turn, or what that turn left whole, into one
    digest (their entries would expire while the stable prefix moves on through the newer
    digests); and the system prompt, which every other entry covers. With ``system_and_3``
    every compaction rewrites all but the system prompt, because the rolling window's lookback
    never reaches back to the cut.

Markers are placed as the seed's table says: string content becomes one text part carrying
``cache_control``; list content gets it on its last part; ``None``/empty content gets it on the
message; tool messages are marked (on the message) only for native Anthropic, as OpenRouter
drops unknown keys there.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ctxengine.messages import Message, is_summary, message_blocks
from ctxengine.models import ModelProfile, resolve_model
from ctxengine.tokens import estimate_message_tokens

__all__ = [
    "LOOKBACK_BLOCKS",
    "MAX_BREAKPOINTS",
    "CachePace",
    "CachingStatus",
    "Placement",
    "apply_anthropic_cache_control",
    "apply_breakpoints",
    "cache_marker",
    "caching_status",
    "default_placement",
    "infer_provider",
    "message_blocks",
    "plan_breakpoints",
    "system_and_3_breakpoints",
]

MAX_BREAKPOINTS = 4
"""Anthropic accepts at most four ``cache_control`` breakpoints per request."""

LOOKBACK_BLOCKS = 20
"""Anthropic checks for cache hits at block boundaries up to about 20 blocks before each
explicit breakpoint, and no further."""

Placement = Literal["system_and_3", "planner"]
CacheTTL = Literal["5m", "1h"]


def default_placement(provider: str | None = None) -> Placement:
    """The placement a manager uses when the config does not choose one (``strategy: auto``).

    Chosen by measurement (``ctxengine bench`` on the long sessions, Anthropic pricing): the
    ``planner`` costs less than ``system_and_3`` with every built-in engine, because after a
    compaction it keeps a breakpoint where the new request still shares the old one's prefix
    and on the compacted prefix, which ``system_and_3``'s rolling window never reaches. Both
    providers that take ``cache_control`` markers (Anthropic and OpenRouter) measure the same
    way; other providers cache automatically and ignore the placement.
    ``apply_anthropic_cache_control`` keeps the seed's ``system_and_3`` exactly.
    """
    return "planner"


def cache_marker(cache_ttl: str = "5m") -> dict[str, str]:
    """The ``cache_control`` value: ``{"type": "ephemeral"}``, plus ``"ttl": "1h"`` for the hour TTL."""
    if cache_ttl == "1h":
        return {"type": "ephemeral", "ttl": "1h"}
    if cache_ttl != "5m":
        raise ValueError(f"cache_ttl must be '5m' or '1h', not {cache_ttl!r}")
    return {"type": "ephemeral"}


def _mark(msg: Message, marker: Mapping[str, str], native_anthropic: bool) -> None:
    """Put ``marker`` on ``msg`` (a copy we own) following the seed's placement table."""
    if msg.get("role") == "tool":
        if native_anthropic:
            msg["cache_control"] = dict(marker)
        return
    content = msg.get("content")
    if isinstance(content, str) and content:
        msg["content"] = [{"type": "text", "text": content, "cache_control": dict(marker)}]
    elif isinstance(content, list) and content and isinstance(content[-1], dict):
        content[-1]["cache_control"] = dict(marker)
    else:
        msg["cache_control"] = dict(marker)


def _apply_cache_marker(msg: dict[str, Any], cache_marker: dict[str, Any], native_anthropic: bool = False) -> None:
    """Hermes Agent's per-message helper, under its name and with its rules, for code written
    against Hermes: put ``cache_marker`` on ``msg`` **in place**.

    * a tool message on native Anthropic: on the message (the adapter moves it into the
      ``tool_result`` block);
    * ``None``/empty content: on the message, except for a tool or assistant message off
      native Anthropic (OpenRouter ignores or rejects a top-level marker there), which is left
      unmarked;
    * string content: turned into one text part carrying the marker;
    * list content: on its last part, when that part is a dict.

    Differs from the seed's table that :func:`apply_anthropic_cache_control` follows in one
    place: a non-empty tool message off native Anthropic gets the marker on its content part
    here, and none there.
    """
    role = msg.get("role", "")
    content = msg.get("content")
    if role == "tool" and native_anthropic:
        msg["cache_control"] = cache_marker
        return
    if content is None or content == "":
        if role in ("tool", "assistant") and not native_anthropic:
            return
        msg["cache_control"] = cache_marker
        return
    if isinstance(content, str):
        msg["content"] = [{"type": "text", "text": content, "cache_control": cache_marker}]
        return
    if isinstance(content, list) and content and isinstance(content[-1], dict):
        content[-1]["cache_control"] = cache_marker


def system_and_3_breakpoints(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices the seed's ``system_and_3`` marks: the first system message and the last three
    non-system messages (at most four)."""
    out: list[int] = []
    if messages and messages[0].get("role") == "system":
        out.append(0)
    rest = [i for i, m in enumerate(messages) if m.get("role") != "system"]
    out.extend(rest[-(MAX_BREAKPOINTS - len(out)) :] if rest else [])
    return sorted(set(out))


def apply_breakpoints(
    messages: Sequence[Message],
    indices: Sequence[int],
    *,
    cache_ttl: str = "5m",
    native_anthropic: bool = False,
    share_unmarked: bool = False,
) -> list[Message]:
    """A deep copy of ``messages`` with the cache marker on each message of ``indices``.

    ``share_unmarked``: only the marked messages are copied; the others are the caller's own
    dicts, untouched (the per-turn path: copying a long history every call costs more than
    everything else a turn does). Treat such a result as read-only.
    """
    if len(set(indices)) > MAX_BREAKPOINTS:
        raise ValueError(f"at most {MAX_BREAKPOINTS} cache breakpoints, got {len(set(indices))}")
    marker = cache_marker(cache_ttl)
    out = list(messages) if share_unmarked else copy.deepcopy(list(messages))
    for i in sorted(set(indices)):
        if share_unmarked:
            out[i] = _own_for_marking(out[i])
        _mark(out[i], marker, native_anthropic)
    return out


def _own_for_marking(msg: Message) -> Message:
    """A copy of ``msg`` that :func:`_mark` may edit without touching ``msg``: the dict, its
    content list and that list's last part are copied (what a marker is put on); the rest is
    shared, as the unmarked messages of a ``share_unmarked`` result are."""
    out = dict(msg)
    content = out.get("content")
    if isinstance(content, list):
        parts = list(content)
        if parts and isinstance(parts[-1], dict):
            parts[-1] = dict(parts[-1])
        out["content"] = parts
    return out


def apply_anthropic_cache_control(
    messages: Sequence[Message],
    cache_ttl: str = "5m",
    native_anthropic: bool = False,
) -> list[Message]:
    """The seed's function: deep-copy ``messages`` and apply ``system_and_3``.

    The marker is ``{"type": "ephemeral"}`` (``"ttl": "1h"`` added for the hour TTL); see the
    module docstring for where it goes on each kind of message.
    """
    return apply_breakpoints(
        messages, system_and_3_breakpoints(messages), cache_ttl=cache_ttl, native_anthropic=native_anthropic
    )


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """``list(a) == list(b)``, without copying what is a list already."""
    return (a if isinstance(a, list) else list(a)) == (b if isinstance(b, list) else list(b))


def plan_breakpoints(
    messages: Sequence[Mapping[str, Any]],
    *,
    min_cache_tokens: int = 1024,
    tokens: Sequence[int] | None = None,
    lookback: int = LOOKBACK_BLOCKS,
    native_anthropic: bool = True,
    previous: Sequence[Mapping[str, Any]] | None = None,
    prefix_tokens: Sequence[int] | None = None,
    stable: int | None = None,
    turns: tuple[int, int] | None = None,
) -> list[int]:
    """The ``planner`` placement (see the module docstring): sorted message indices, at most four.

    ``tokens`` are per-message token counts (estimated when omitted); they decide which
    prefixes reach ``min_cache_tokens``. Without ``native_anthropic`` tool messages cannot
    carry a marker, so a wanted tool message moves back to the closest message that can.
    ``previous`` is the request sent before this one in the same conversation; without it the
    end of the previous request is taken to be the message before the last assistant turn (true
    in an agent loop that only appends).

    ``prefix_tokens`` (running sums of the per-message counts) and ``stable`` (the index of the
    last summary, -1 for none) may be given by a caller that keeps them up to date turn by turn
    (the manager does): planning then costs no pass over the whole history; so may ``turns``,
    where the current turn and the one before start (the last user message that is not a
    summary and the last one before that turn's user messages, -1 for none).
    """
    n = len(messages)
    if n == 0:
        return []
    prefix: Sequence[int]
    if prefix_tokens is not None and len(prefix_tokens) == n:
        prefix = prefix_tokens
    else:
        toks = list(tokens) if tokens is not None else [estimate_message_tokens(m) for m in messages]
        prefix = list(itertools.accumulate(toks))

    def cacheable(i: int) -> bool:
        return 0 <= i < n and prefix[i] >= min_cache_tokens

    wanted: list[int] = [n - 1]
    bridge = _bridge(messages, previous, lookback)
    if bridge >= 0:
        wanted.append(bridge)
    if stable is None or not -1 <= stable < n:
        stable = next((i for i in range(n - 1, -1, -1) if is_summary(messages[i])), -1)
    if stable >= 0:
        wanted.append(stable)
    wanted += [i for i in (_turn_starts(messages) if turns is None else turns) if i >= 0]
    if messages[0].get("role") == "system":
        wanted.append(0)
    return _chosen(messages, wanted, cacheable, native_anthropic)


def _chosen(messages: Sequence[Mapping[str, Any]], wanted: list[int], cacheable: Callable[[int], bool], native_anthropic: bool) -> list[int]:
    """The first :data:`MAX_BREAKPOINTS` of ``wanted`` that can carry a marker, sorted (a tool
    message moves back to the closest message that can, when not ``native_anthropic``)."""
    out: list[int] = []
    for i in wanted:
        if not native_anthropic:
            while i > 0 and messages[i].get("role") == "tool":
                i -= 1
        if i not in out and cacheable(i):
            out.append(i)
        if len(out) == MAX_BREAKPOINTS:
            break
    return sorted(out)


def _turn_starts(messages: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """The last user message that is not a summary (where the current turn starts) and the last
    one before that turn's user messages (where the turn before started); -1: none."""

    # (the role read first: most messages of an agent session are not the user's, and the walk
    # may cross the whole context every request)
    i = len(messages) - 1
    while i >= 0 and (messages[i].get("role") != "user" or is_summary(messages[i])):
        i -= 1
    turn = i
    while i >= 0 and messages[i].get("role") == "user" and not is_summary(messages[i]):
        i -= 1
    while i >= 0 and (messages[i].get("role") != "user" or is_summary(messages[i])):
        i -= 1
    return turn, i


def _bridge(messages: Sequence[Mapping[str, Any]], previous: Sequence[Mapping[str, Any]] | None, lookback: int) -> int:
    """The breakpoint at the end of what this request shares with the previous one (-1: none
    wanted): its cache entries (or those within the lookback of it) are what this request can
    still read. Without ``previous`` it is guessed as the message before the last assistant turn."""
    n = len(messages)
    if previous is not None:
        limit = min(len(previous), n)
        if limit and _same(previous[:limit], messages[:limit]):
            k = limit  # the agent loop's usual case, compared in one pass
        else:
            k = 0
            while k < limit and (previous[k] is messages[k] or previous[k] == messages[k]):
                k += 1
        bridge = k - 1
    else:
        last_assistant = next((i for i in range(n - 1, -1, -1) if messages[i].get("role") == "assistant"), -1)
        bridge = last_assistant - 1 if last_assistant > 0 else -1
    if bridge >= 0 and sum(message_blocks(messages[k]) for k in range(bridge + 1, n)) > lookback:
        # within the end's lookback the end's own breakpoint reads it: the slot goes to a turn's
        # start, which measured cheaper (bench --compose 5)
        return bridge
    return -1


@dataclass(frozen=True, slots=True)
class CachingStatus:
    """Whether prompt caching applies, and the status line shown at startup."""

    enabled: bool
    reason: str
    cache_ttl: str = "5m"
    native_anthropic: bool = False
    auto_ttl: bool = False
    """``cache_ttl: auto``: each session's TTL follows its pace (:class:`CachePace`);
    ``cache_ttl`` is then the TTL of a session not yet seen pausing."""

    @property
    def line(self) -> str:
        if self.enabled:
            return f"Prompt caching: ENABLED ({self.reason}, {'auto' if self.auto_ttl else self.cache_ttl} TTL)"
        return f"Prompt caching: disabled ({self.reason})"

    def __str__(self) -> str:
        return self.line


_PROVIDER_LABELS = {"anthropic": "Anthropic", "openrouter": "OpenRouter"}


def infer_provider(model: str) -> str:
    """The provider a model name implies: ``anthropic/claude-…`` style slugs are OpenRouter's,
    a bare ``claude-…`` name is the native Anthropic API, others by the model table."""
    if "/" in model:
        head = model.split("/", 1)[0].lower()
        return "openrouter" if head in ("anthropic", "openai", "google", "meta-llama", "deepseek", "qwen", "nousresearch", "openrouter") else head
    profile = _profile(model)
    return profile.provider


def _profile(model: str) -> ModelProfile:
    import warnings

    from ctxengine.models import UnknownModelWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnknownModelWarning)
        return resolve_model(model)


def caching_status(
    model: str,
    provider: str | None = None,
    *,
    cache_ttl: str = "5m",
    enabled: bool | Literal["auto"] = "auto",
) -> CachingStatus:
    """Whether ``cache_control`` markers should be sent for ``model`` through ``provider``.

    ``cache_ttl`` is ``5m``, ``1h`` or ``auto`` (:class:`CachePace`). ``enabled`` ``auto``
    (the seed's behaviour): on for Claude models on native Anthropic or OpenRouter,
    off otherwise (other providers ignore or reject the markers). ``True``/``False`` force it.
    """
    if cache_ttl == "auto":
        return dataclasses.replace(caching_status(model, provider, cache_ttl="5m", enabled=enabled), auto_ttl=True)
    cache_marker(cache_ttl)  # validates the TTL
    prov = (provider or infer_provider(model)).lower()
    claude = "claude" in model.lower() or _profile(model).anthropic_cache
    native = prov == "anthropic"
    label = f"Claude via {_PROVIDER_LABELS.get(prov, prov)}" if claude else f"{model} via {prov}"
    if enabled is False:
        return CachingStatus(False, "turned off in config", cache_ttl, native)
    if enabled is True:
        return CachingStatus(True, label, cache_ttl, native)
    if not claude:
        return CachingStatus(False, f"{model} is not a Claude model", cache_ttl, native)
    if prov not in _PROVIDER_LABELS:
        return CachingStatus(False, f"provider {prov!r} does not support cache_control", cache_ttl, native)
    return CachingStatus(True, label, cache_ttl, native)


TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
"""How long a cache entry lives after its last write or read, by TTL (as in
:data:`ctxengine.cost.TTL_SECONDS`, which this layer may not import)."""
ANTHROPIC_WRITE_5M, ANTHROPIC_WRITE_1H, ANTHROPIC_READ_PRICE = 1.25, 2.0, 0.1
"""Anthropic's cache write (by TTL) and read price multipliers (as in :mod:`ctxengine.cost`)."""



@dataclass(slots=True)
class CachePace:
    """How one session is paced, and what it means for its prompt cache.

    ``cache_ttl: auto`` picks the TTL from it (:meth:`ttl`): ``1h`` once a person's pauses
    (longer than five minutes, shorter than an hour) have cost more in prefixes written again
    than the hour's dearer writes (2× instead of 1.25×) would have cost on everything written
    so far; ``5m`` otherwise, so a machine-paced session (every request within seconds) keeps
    the cheaper writes. The session tells it each request (:meth:`observe`) and what the
    provider wrote (:meth:`wrote`). :meth:`cold` says whether the cache has expired since the
    last request (a rewrite of the settled prefix then costs nothing more: it is written anyway).
    """

    last: float | None = None
    """Time of the last request (seconds, the caller's clock)."""
    ttl_used: str = "5m"
    """The TTL of the last request's markers (what decides whether its entries still live)."""
    prompt_tokens: int = 0
    """Prompt tokens of the last request (the prefix a pause puts at risk)."""
    lost: float = 0.0
    """Input-price tokens the pauses between five minutes and an hour cost with the 5m TTL
    (each: the last prefix written again at 1.25× instead of read at 0.1×)."""
    premium: float = 0.0
    """Input-price tokens the hour TTL would have added on the writes so far (0.75× each; the
    writes a pause caused are not counted: the hour would not have made them)."""
    paused: bool = False
    """The last request came after a pause the hour TTL would have bridged."""

    def observe(self, now: float, ttl: str) -> None:
        """A request is sent at ``now`` with markers of ``ttl``."""
        self.paused = self.last is not None and TTL_SECONDS["5m"] < now - self.last <= TTL_SECONDS["1h"]
        if self.paused:
            self.lost += self.prompt_tokens * (ANTHROPIC_WRITE_5M - ANTHROPIC_READ_PRICE)
        self.last = float(now)
        self.ttl_used = ttl

    def wrote(self, write_tokens: int, prompt_tokens: int) -> None:
        """The provider's answer to the last request: tokens written to the cache, prompt size."""
        if not self.paused:
            self.premium += max(0, int(write_tokens)) * (ANTHROPIC_WRITE_1H - ANTHROPIC_WRITE_5M)
        self.prompt_tokens = max(0, int(prompt_tokens))

    def ttl(self, configured: str) -> str:
        """The TTL to mark this request with: ``configured`` unless it is ``auto``."""
        if configured != "auto":
            return configured
        return "1h" if self.lost > self.premium else "5m"

    def cold(self, now: float) -> bool:
        """True when the entries of the last request have expired by ``now``."""
        return self.last is not None and now - self.last > TTL_SECONDS.get(self.ttl_used, 300.0)
