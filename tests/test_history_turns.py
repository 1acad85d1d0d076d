"""The cache planner's turn starts kept turn by turn (history.tokens.WorkingTokens) equal the
walk over the whole context (caching._turn_starts)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxengine.caching import _turn_starts, plan_breakpoints
from ctxengine.history.tokens import WorkingTokens
from ctxengine.messages import Message

KINDS = ("system", "user", "assistant", "tool", "summary")


def _message(kind: str, n: int) -> Message:
    if kind == "summary":
        return {"role": "user", "content": f"[CONTEXT COMPACTION] earlier turns {n}"}
    return {"role": kind, "content": f"{kind} message {n} " + "x" * (40 * n)}


messages_st = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 30)), max_size=30).map(lambda xs: [_message(k, n) for k, n in xs])


@settings(max_examples=200, deadline=None)
@given(first=messages_st, more=messages_st, keep=st.integers(0, 30))
def test_turn_starts_followed_turn_by_turn_equal_the_walk(first: list[Message], more: list[Message], keep: int) -> None:
    tokens = WorkingTokens()
    tokens.follow([], first)
    # (an empty list is never a working context: nothing is known of it)
    known = tokens.planner_inputs(first, first)
    assert (known.turns if known is not None else None) == (_turn_starts(first) if first else None)
    # the next working context extends the first, or replaces its end (a compaction)
    second = [*first, *more] if keep >= len(first) else [*first[:keep], *more]
    tokens.follow(first, second)
    known = tokens.planner_inputs(second, second)
    if not second:
        assert known is None
        return
    assert known is not None and known.turns == _turn_starts(second)
    assert plan_breakpoints(second, prefix_tokens=known.sums, stable=known.stable, turns=known.turns, min_cache_tokens=1) == plan_breakpoints(second, min_cache_tokens=1)


def test_turn_starts_of_a_list_that_is_not_the_working_context_are_unknown() -> None:
    tokens = WorkingTokens()
    working: list[Message] = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}, {"role": "user", "content": "d"}]
    tokens.follow([], working)
    known = tokens.planner_inputs(working, working)
    assert known is not None and known.turns == (3, 0) == _turn_starts(working)  # the turn began with two user messages
    assert tokens.planner_inputs(working[:2], working) is None
