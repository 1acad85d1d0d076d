"""The cache cost model: Anthropic breakpoints, lookback, minimum, TTL; OpenAI prefix caching."""

from __future__ import annotations

import math
from typing import Any

import pytest

from ctxengine.caching import apply_anthropic_cache_control
from ctxengine.cost import (
    AnthropicCache,
    OpenAICache,
    PrefixHasher,
    Request,
    compaction_break_even,
    marked_breakpoints,
    simulate,
)
from ctxengine.models import resolve_model


def _msgs(n: int) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(n)]


def test_first_call_writes_up_to_the_last_breakpoint_and_bills_the_rest() -> None:
    sim = AnthropicCache(input_price=1e6, min_cache_tokens=0)  # $1 per token: costs read as tokens
    msgs = _msgs(4)
    c = sim.call(msgs, [1], tokens=[100, 100, 100, 100])
    assert (c.read_tokens, c.write_tokens, c.uncached_tokens) == (0, 200, 200)
    assert c.cost == pytest.approx(200 * 1.25 + 200)
    assert c.cost_no_cache == pytest.approx(400)


def test_appending_reads_the_previous_prefix() -> None:
    sim = AnthropicCache(input_price=1e6, min_cache_tokens=0)
    msgs = _msgs(4)
    sim.call(msgs, [3], tokens=[100] * 4)
    more = [*msgs, *_msgs(6)[4:]]
    c = sim.call(more, [5], tokens=[100] * 6)
    assert (c.read_tokens, c.write_tokens, c.uncached_tokens) == (400, 200, 0)
    assert c.cost == pytest.approx(400 * 0.1 + 200 * 1.25)


def test_an_edit_invalidates_everything_after_it() -> None:
    sim = AnthropicCache(input_price=1e6, min_cache_tokens=0)
    msgs = _msgs(6)
    sim.call(msgs, [0, 5], tokens=[100] * 6)
    edited = list(msgs)
    edited[2] = {"role": "user", "content": "changed"}
    c = sim.call(edited, [0, 5], tokens=[100] * 6)
    assert c.read_tokens == 100  # only the first breakpoint's prefix survives
    assert c.write_tokens == 500


def test_lookback_is_limited_to_twenty_blocks() -> None:
    msgs = _msgs(40)
    near = AnthropicCache(input_price=1e6, min_cache_tokens=0)
    near.call(msgs[:20], [19], tokens=[10] * 20)
    hit = near.call(msgs[:39], [38], tokens=[10] * 39)  # breakpoint 19 blocks after the entry
    assert hit.read_tokens == 200
    far = AnthropicCache(input_price=1e6, min_cache_tokens=0)
    far.call(msgs[:15], [14], tokens=[10] * 15)
    miss = far.call(msgs[:40], [39], tokens=[10] * 40)  # 25 blocks: out of reach
    assert miss.read_tokens == 0 and miss.write_tokens == 400


def test_prefixes_below_the_minimum_are_not_cached() -> None:
    sim = AnthropicCache(input_price=1e6, min_cache_tokens=1024)
    msgs = _msgs(3)
    c1 = sim.call(msgs, [0, 2], tokens=[500, 400, 300])
    assert c1.write_tokens == 1200 and c1.uncached_tokens == 0  # only the 1,200-token prefix is cached
    c2 = sim.call(msgs, [0, 2], tokens=[500, 400, 300])
    assert c2.read_tokens == 1200
    small = AnthropicCache(input_price=1e6, min_cache_tokens=1024)
    c3 = small.call(msgs, [0, 1], tokens=[500, 400, 300])
    assert c3.write_tokens == 0 and c3.uncached_tokens == 1200


def test_ttl_expiry_refresh_and_one_hour_price() -> None:
    msgs = _msgs(2)
    sim = AnthropicCache(input_price=1e6, min_cache_tokens=0, ttl="5m")
    sim.call(msgs, [1], tokens=[100, 100], now=0)
    assert sim.call(msgs, [1], tokens=[100, 100], now=290).read_tokens == 200
    assert sim.call(msgs, [1], tokens=[100, 100], now=580).read_tokens == 200  # refreshed at 290
    assert sim.call(msgs, [1], tokens=[100, 100], now=1000).read_tokens == 0  # expired
    hour = AnthropicCache(input_price=1e6, min_cache_tokens=0, ttl="1h")
    first = hour.call(msgs, [1], tokens=[100, 100], now=0)
    assert first.cost == pytest.approx(200 * 2.0)
    assert hour.call(msgs, [1], tokens=[100, 100], now=3000).read_tokens == 200


def test_markers_are_read_from_messages_and_ignored_for_prefix_identity() -> None:
    msgs = [{"role": "system", "content": "sys"}, *_msgs(5)]
    marked = apply_anthropic_cache_control(msgs, native_anthropic=True)
    assert marked_breakpoints(marked) == [0, 3, 4, 5]
    h = PrefixHasher()
    assert h.keys(marked) == h.keys(msgs)
    sim = AnthropicCache(input_price=1e6, min_cache_tokens=0)
    sim.call(marked, tokens=[10] * 6)
    assert sim.call(apply_anthropic_cache_control(msgs), tokens=[10] * 6).read_tokens == 60


def test_openai_prefix_caching_in_128_token_steps() -> None:
    sim = OpenAICache(input_price=1e6, cached_discount=0.5)
    msgs = _msgs(3)
    assert sim.cached_tokens(1023) == 0
    assert sim.cached_tokens(1024) == 1024
    assert sim.cached_tokens(1300) == 1024 + 256
    c1 = sim.call(msgs, tokens=[1000, 300, 50])
    assert c1.read_tokens == 0 and c1.cost == pytest.approx(1350)
    c2 = sim.call([*msgs, {"role": "user", "content": "more"}], tokens=[1000, 300, 50, 10])
    assert c2.read_tokens == 1280  # 1,350 shared tokens, counted in 128-token steps from 1,024
    assert c2.cost == pytest.approx(1280 * 0.5 + 80)
    edited = [msgs[0], {"role": "assistant", "content": "other"}]
    assert sim.call(edited, tokens=[1000, 300]).read_tokens == 0  # 1,000 shared: below the minimum


def test_simulate_uses_the_model_table() -> None:
    msgs = _msgs(4)
    reqs = [Request(msgs[:2], [1]), Request(msgs, [3])]
    profile = resolve_model("claude-sonnet-4.5")
    rep = simulate(reqs, provider="anthropic", profile=profile)
    assert len(rep.calls) == 2 and rep.total > 0
    assert rep.total_no_cache == pytest.approx(sum(c.tokens for c in rep.calls) * profile.input / 1e6)
    oai = simulate([msgs[:2], msgs], provider="openai", profile=resolve_model("gpt-4.1"))
    assert oai.to_dict()["calls"] == 2
    with pytest.raises(ValueError, match="provider"):
        simulate(reqs, provider="bedrock")  # type: ignore[arg-type]


def test_token_counts_must_match_messages() -> None:
    with pytest.raises(ValueError, match="token counts"):
        AnthropicCache().call(_msgs(2), [1], tokens=[1])


def test_block_rule_matches_the_placement_module() -> None:
    from ctxengine import caching, cost

    samples: list[dict[str, Any]] = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "a"}, {"id": "b"}]},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]},
        {"role": "tool", "tool_call_id": "a", "content": None},
    ]
    assert [cost.message_blocks(m) for m in samples] == [caching.message_blocks(m) for m in samples] == [1, 2, 2, 1]
    assert cost.LOOKBACK_BLOCKS == caching.LOOKBACK_BLOCKS


def test_compaction_break_even() -> None:
    # 100K context cut to 40K keeping a 38K stable prefix: 2K rewritten at 1.25 plus 3.8K read
    # costs less than reading the 100K (10K): cheaper at once
    assert compaction_break_even(100_000, 40_000, 38_000) == 0.0
    # with a 30K stable prefix (3K read + 12.5K written) it pays after 5.5K / 6K per call
    assert compaction_break_even(100_000, 40_000, 30_000) == pytest.approx(5_500 / 6_000)
    # a small cut that rewrites a lot pays only after many calls
    n = compaction_break_even(50_000, 48_000, 1_000)
    assert n == pytest.approx((1_000 * 0.1 + 47_000 * 1.25 - 50_000 * 0.1) / (2_000 * 0.1))
    assert math.isinf(compaction_break_even(10_000, 10_000, 0))
