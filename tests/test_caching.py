"""Prompt caching: the seed's system_and_3 placement table, the planner, and when caching applies."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxengine.caching import (
    MAX_BREAKPOINTS,
    apply_anthropic_cache_control,
    apply_breakpoints,
    cache_marker,
    caching_status,
    message_blocks,
    plan_breakpoints,
    system_and_3_breakpoints,
)

EPH = {"type": "ephemeral"}


def _marked(m: dict[str, Any]) -> Any:
    if "cache_control" in m:
        return m["cache_control"]
    c = m.get("content")
    if isinstance(c, list) and c and isinstance(c[-1], dict):
        return c[-1].get("cache_control")
    return None


def _conv() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
        {"role": "assistant", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
        {"role": "user", "content": "thanks", "name": "bob"},
    ]


def test_system_and_3_marks_system_and_last_three_non_system() -> None:
    msgs = _conv()
    assert system_and_3_breakpoints(msgs) == [0, 3, 4, 5]
    out = apply_anthropic_cache_control(msgs, native_anthropic=True)
    assert [i for i, m in enumerate(out) if _marked(m)] == [0, 3, 4, 5]
    assert sum(1 for m in out if _marked(m)) <= MAX_BREAKPOINTS


def test_placement_table_string_list_none_and_tool() -> None:
    msgs = _conv()
    out = apply_anthropic_cache_control(msgs, native_anthropic=True)
    # string content becomes one text part carrying the marker
    assert out[0]["content"] == [{"type": "text", "text": "You are helpful.", "cache_control": EPH}]
    assert out[5]["content"] == [{"type": "text", "text": "thanks", "cache_control": EPH}]
    assert out[5]["name"] == "bob"  # unknown keys kept
    # list content: only the last part is marked
    assert "cache_control" not in out[4]["content"][0]
    assert out[4]["content"][1]["cache_control"] == EPH
    # tool message: on the message, native Anthropic only
    assert out[3]["cache_control"] == EPH and out[3]["content"] == "a.py"
    via_router = apply_anthropic_cache_control(msgs, native_anthropic=False)
    assert "cache_control" not in via_router[3]
    # None content: marker on the message itself
    empty = [{"role": "system", "content": "s"}, {"role": "assistant", "content": None}]
    assert apply_anthropic_cache_control(empty)[1]["cache_control"] == EPH


def test_deep_copy_leaves_input_untouched() -> None:
    msgs = _conv()
    snapshot = copy.deepcopy(msgs)
    out = apply_anthropic_cache_control(msgs, cache_ttl="1h", native_anthropic=True)
    assert msgs == snapshot
    assert out[4]["content"] is not msgs[4]["content"]


def test_ttl_marker() -> None:
    assert cache_marker("5m") == {"type": "ephemeral"}
    assert cache_marker("1h") == {"type": "ephemeral", "ttl": "1h"}
    out = apply_anthropic_cache_control(_conv(), cache_ttl="1h")
    assert _marked(out[0]) == {"type": "ephemeral", "ttl": "1h"}
    with pytest.raises(ValueError, match="cache_ttl"):
        cache_marker("10m")


def test_short_conversations_and_no_system() -> None:
    assert system_and_3_breakpoints([]) == []
    assert system_and_3_breakpoints([{"role": "user", "content": "x"}]) == [0]
    no_sys = [{"role": "user", "content": str(i)} for i in range(6)]
    assert system_and_3_breakpoints(no_sys) == [2, 3, 4, 5]


def test_apply_breakpoints_refuses_more_than_four() -> None:
    with pytest.raises(ValueError, match="at most 4"):
        apply_breakpoints(_conv(), [0, 1, 2, 3, 4])


def test_caching_status_lines() -> None:
    st = caching_status("anthropic/claude-sonnet-4.5")
    assert st.enabled and st.line == "Prompt caching: ENABLED (Claude via OpenRouter, 5m TTL)"
    native = caching_status("claude-sonnet-4-5-20250929", "anthropic", cache_ttl="1h")
    assert native.enabled and native.native_anthropic and native.line == "Prompt caching: ENABLED (Claude via Anthropic, 1h TTL)"
    gpt = caching_status("gpt-4o", "openai")
    assert not gpt.enabled and "not a Claude model" in gpt.line
    other = caching_status("claude-sonnet-4.5", "bedrock")
    assert not other.enabled and "bedrock" in other.reason
    assert not caching_status("anthropic/claude-sonnet-4.5", enabled=False).enabled


def _long(n_pairs: int, size: int = 400) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "alpha beta gamma delta " * 300}, {"role": "user", "content": "task"}]
    for k in range(n_pairs):
        cid = f"c{k}"
        msgs.append({"role": "assistant", "content": "step", "tool_calls": [{"id": cid, "type": "function", "function": {"name": "run", "arguments": "{}"}}]})
        msgs.append({"role": "tool", "tool_call_id": cid, "content": "output line\n" * (size // 12)})
    return msgs


def test_planner_marks_end_previous_end_stable_prefix_turn_start_and_system() -> None:
    msgs = _long(10)
    msgs[5] = {"role": "tool", "tool_call_id": "c1", "content": "[ctxengine:cut] run output"}
    # the previous request's end is within the end's lookback: no bridge needed; the user's
    # message (index 1) starts the current turn
    assert plan_breakpoints(msgs, min_cache_tokens=1024) == [0, 1, 5, len(msgs) - 1]
    # a parallel tool group of 25 results puts it out of reach: the bridge takes a slot, and
    # the system prompt (read through the turn's start anyway) gives up its own
    calls = [{"id": f"p{k}", "type": "function", "function": {"name": "run", "arguments": "{}"}} for k in range(25)]
    wide = [*msgs, {"role": "assistant", "content": None, "tool_calls": calls}, *({"role": "tool", "tool_call_id": f"p{k}", "content": "ok"} for k in range(25))]
    assert plan_breakpoints(wide, min_cache_tokens=1024) == [1, 5, len(msgs) - 1, len(wide) - 1]


def test_planner_keeps_the_starts_of_the_current_and_the_previous_turn_warm() -> None:
    # an earlier turn folded (a digest), then a new user turn whose own steps were digested
    # too: the stable prefix is the newest digest; the new turn's start keeps its entry (where
    # folding the whole turn when it ends starts rewriting), and so does the previous turn's
    # (where folding what it left whole, with its digest, starts rewriting)
    msgs = _long(6)
    msgs[2] = {"role": "assistant", "content": "[ctxengine:digest] the first task"}
    del msgs[3]
    turn = len(msgs)
    msgs += [{"role": "user", "content": "next task " * 200}, {"role": "assistant", "content": "[ctxengine:digest] its first steps"}]
    msgs += _long(3)[2:]
    assert plan_breakpoints(msgs, min_cache_tokens=1024) == [1, turn, turn + 1, len(msgs) - 1]
    # a user-role digest starts no turn
    msgs[turn + 1] = {**msgs[turn + 1], "role": "user"}
    assert plan_breakpoints(msgs, min_cache_tokens=1024) == [1, turn, turn + 1, len(msgs) - 1]
    # the previous request is known and the end's lookback reaches its end: no bridge
    assert plan_breakpoints(msgs, min_cache_tokens=1024, previous=msgs[:-2]) == [1, turn, turn + 1, len(msgs) - 1]


def test_planner_skips_prefixes_below_the_minimum() -> None:
    msgs = [{"role": "system", "content": "short"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "more"}]
    assert plan_breakpoints(msgs, min_cache_tokens=1024) == []
    assert plan_breakpoints(msgs, min_cache_tokens=0) == [0, 1, 3]  # the end (the turn's start), the previous turn's, the system prompt


def test_planner_bridges_to_where_the_previous_request_diverged() -> None:
    prev = _long(8)
    cur = list(prev)
    cur[6] = {**cur[6], "content": "[ctxengine:cut] shorter"}
    cur += _long(9)[-2:]
    bps = plan_breakpoints(cur, min_cache_tokens=1024, previous=prev)
    assert 5 in bps  # last message shared with the previous request
    assert 6 in bps  # the new stable prefix
    assert len(cur) - 1 in bps


def test_planner_moves_tool_breakpoints_back_without_native_anthropic() -> None:
    msgs = _long(4)
    bps = plan_breakpoints(msgs, min_cache_tokens=0, native_anthropic=False)
    assert all(msgs[i]["role"] != "tool" for i in bps)
    assert len(bps) <= MAX_BREAKPOINTS


def test_message_blocks() -> None:
    assert message_blocks({"role": "user", "content": "x"}) == 1
    assert message_blocks({"role": "assistant", "content": "x", "tool_calls": [{"id": "a"}, {"id": "b"}]}) == 3
    assert message_blocks({"role": "assistant", "content": None}) == 1
    assert message_blocks({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}) == 2


_part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=5)}) | st.text(max_size=3)
_msg = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant", "tool"]),
        "content": st.none() | st.text(max_size=8) | st.lists(_part, max_size=3),
    },
    optional={"tool_calls": st.lists(st.fixed_dictionaries({"id": st.text(max_size=3), "function": st.fixed_dictionaries({"name": st.text(max_size=3)})}), max_size=2)},
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_msg, min_size=1, max_size=8), st.data(), st.booleans(), st.sampled_from(["5m", "1h"]))
def test_sharing_the_unmarked_messages_marks_like_a_deep_copy_and_leaves_the_input_untouched(
    msgs: list[dict[str, Any]], data: st.DataObject, native: bool, ttl: str
) -> None:
    indices = data.draw(st.lists(st.integers(0, len(msgs) - 1), max_size=4, unique=True))
    before = copy.deepcopy(msgs)
    shared = apply_breakpoints(msgs, indices, cache_ttl=ttl, native_anthropic=native, share_unmarked=True)
    assert shared == apply_breakpoints(msgs, indices, cache_ttl=ttl, native_anthropic=native)
    assert msgs == before  # the caller's dicts, lists and parts are never marked
    assert all(shared[i] is msgs[i] for i in range(len(msgs)) if i not in indices)
