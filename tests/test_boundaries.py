"""ctxengine.boundaries: atomic tool groups, cut alignment, pair sanitizing (examples + properties)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxengine.boundaries import (
    STUB_RESULT,
    align_cut,
    group_spans,
    sanitize_tool_pairs,
    turn_starts,
)
from ctxengine.messages import validate


def call(cid: str, name: str = "bash") -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}


def asst(*ids: str, content: str | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {"role": "assistant", "content": content}
    if ids:
        m["tool_calls"] = [call(i) for i in ids]
    return m


def res(cid: str, content: str = "out") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": cid, "content": content}


def user(text: str = "go") -> dict[str, Any]:
    return {"role": "user", "content": text}


SYS = {"role": "system", "content": "sys"}


# -- group_spans --------------------------------------------------------------------------------


def test_group_spans_absorb_results_of_parallel_calls() -> None:
    msgs = [SYS, user(), asst("a", "b", "c"), res("a"), res("c"), res("b"), asst(content="done"), user()]
    assert group_spans(msgs) == [(0, 1), (1, 2), (2, 6), (6, 7), (7, 8)]


def test_group_spans_stray_results_are_their_own_units() -> None:
    msgs = [user(), res("x"), res("y"), asst(content="hi"), res("z")]
    assert group_spans(msgs) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]


def test_group_spans_call_without_results_and_back_to_back_groups() -> None:
    msgs = [asst("a"), asst("b"), res("b"), asst("c"), res("c")]
    assert group_spans(msgs) == [(0, 1), (1, 3), (3, 5)]


def test_group_spans_empty() -> None:
    assert group_spans([]) == []


# -- align_cut -----------------------------------------------------------------------------------


MSGS = [SYS, user(), asst("a", "b"), res("a"), res("b"), asst(content="ok"), user("more"), asst("c"), res("c")]


@pytest.mark.parametrize(
    ("index", "backward", "forward"),
    [
        (0, 0, 0),
        (1, 1, 1),
        (2, 2, 2),
        (3, 2, 5),  # inside the group of message 2
        (4, 2, 5),
        (5, 5, 5),
        (8, 7, 9),
        (9, 9, 9),
    ],
)
def test_align_cut(index: int, backward: int, forward: int) -> None:
    assert align_cut(MSGS, index) == backward
    assert align_cut(MSGS, index, direction="backward") == backward
    assert align_cut(MSGS, index, direction="forward") == forward


def test_align_cut_clamps_out_of_range() -> None:
    assert align_cut(MSGS, -5) == 0
    assert align_cut(MSGS, 99) == len(MSGS)
    assert align_cut([], 3) == 0


def test_align_cut_leading_stray_results() -> None:
    msgs = [res("x"), res("y"), user()]
    assert align_cut(msgs, 1) == 0
    assert align_cut(msgs, 1, direction="forward") == 2


def test_align_cut_rejects_bad_direction() -> None:
    with pytest.raises(ValueError, match="direction"):
        align_cut(MSGS, 3, direction="sideways")


def test_turn_starts() -> None:
    assert turn_starts(MSGS) == [1, 6]
    assert turn_starts([]) == []


# -- sanitize_tool_pairs -----------------------------------------------------------------------


def test_sanitize_valid_list_is_unchanged_and_keeps_identity() -> None:
    out = sanitize_tool_pairs(MSGS)
    assert out == MSGS
    assert out is not MSGS
    assert all(a is b for a, b in zip(out, MSGS, strict=True))


def test_sanitize_drops_stray_results() -> None:
    msgs = [user(), res("ghost"), asst(content="hi"), res("ghost2")]
    assert sanitize_tool_pairs(msgs) == [user(), asst(content="hi")]


def test_sanitize_drops_result_of_a_call_from_an_earlier_group() -> None:
    msgs = [user(), asst("a"), res("a"), asst("b"), res("a"), res("b")]
    out = sanitize_tool_pairs(msgs)
    assert out == [user(), asst("a"), res("a"), asst("b"), res("b")]


def test_sanitize_drops_duplicate_results() -> None:
    first, second = res("a", "first"), res("a", "second")
    out = sanitize_tool_pairs([user(), asst("a"), first, second])
    assert out == [user(), asst("a"), first]
    assert out[2] is first


def test_sanitize_stubs_missing_results_of_parallel_calls_after_the_group() -> None:
    msgs = [user(), asst("a", "b", "c"), res("c"), res("a"), user("next")]
    out = sanitize_tool_pairs(msgs)
    assert out == [user(), asst("a", "b", "c"), res("c"), res("a"), res("b", STUB_RESULT), user("next")]
    assert validate(out) == []


def test_sanitize_stub_at_end_and_custom_stub_text() -> None:
    out = sanitize_tool_pairs([user(), asst("a", "b")], stub="[gone]")
    assert out[2:] == [res("a", "[gone]"), res("b", "[gone]")]
    assert validate(out) == []


def test_sanitize_reused_ids_are_matched_per_group() -> None:
    msgs = [user(), asst("a"), res("a", "1"), asst("a"), res("a", "2")]
    assert sanitize_tool_pairs(msgs) == msgs


def test_sanitize_does_not_mutate() -> None:
    msgs = [user(), asst("a", "b"), res("b"), res("zz"), res("b"), user()]
    snapshot = copy.deepcopy(msgs)
    out = sanitize_tool_pairs(msgs)
    assert msgs == snapshot
    assert len(out) == 5
    assert out[1] is msgs[1]
    assert out[1]["tool_calls"] == snapshot[1]["tool_calls"]


def test_sanitize_accepts_a_tuple() -> None:
    assert sanitize_tool_pairs((user(), res("x"))) == [user()]


# -- properties ----------------------------------------------------------------------------------

IDS = st.sampled_from(["a", "b", "c", "d", "e"])


@st.composite
def any_message(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["system", "user", "assistant", "calls", "tool", "tool"]))
    if kind == "system":
        return {"role": "system", "content": draw(st.text(max_size=5))}
    if kind == "user":
        return user(draw(st.text(max_size=5)))
    if kind == "assistant":
        return asst(content=draw(st.text(max_size=5)))
    if kind == "calls":
        ids = draw(st.lists(IDS, min_size=1, max_size=4, unique=True))
        return asst(*ids)
    return res(draw(IDS), draw(st.text(max_size=5)))


messy_lists = st.lists(any_message(), max_size=25)


@st.composite
def valid_lists(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Well-formed conversations: every call answered in its group, in some order."""
    out: list[dict[str, Any]] = [SYS]
    for _ in range(draw(st.integers(0, 8))):
        out.append(user())
        for _ in range(draw(st.integers(0, 3))):
            ids = draw(st.lists(IDS, min_size=1, max_size=4, unique=True))
            out.append(asst(*ids))
            out += [res(i) for i in draw(st.permutations(ids))]
        if draw(st.booleans()):
            out.append(asst(content="reply"))
    return out


def _errors(msgs: list[dict[str, Any]]) -> list[str]:
    return [str(v) for v in validate(msgs) if v.severity == "error"]


@settings(max_examples=150, deadline=None)
@given(messy_lists)
def test_prop_sanitize_output_is_always_valid(msgs: list[dict[str, Any]]) -> None:
    assert _errors(sanitize_tool_pairs(msgs)) == []


@settings(max_examples=150, deadline=None)
@given(messy_lists)
def test_prop_sanitize_keeps_every_non_tool_message_in_order_and_never_mutates(msgs: list[dict[str, Any]]) -> None:
    snapshot = copy.deepcopy(msgs)
    out = sanitize_tool_pairs(msgs)
    assert msgs == snapshot
    kept = [m for m in out if m.get("role") != "tool"]
    original = [m for m in msgs if m.get("role") != "tool"]
    assert len(kept) == len(original)
    assert all(a is b for a, b in zip(kept, original, strict=True))
    # tool messages are either input objects or stubs
    ids = {id(m) for m in msgs}
    for m in out:
        if m.get("role") == "tool" and id(m) not in ids:
            assert m["content"] == STUB_RESULT


@settings(max_examples=150, deadline=None)
@given(messy_lists)
def test_prop_sanitize_is_idempotent(msgs: list[dict[str, Any]]) -> None:
    once = sanitize_tool_pairs(msgs)
    assert sanitize_tool_pairs(once) == once


@settings(max_examples=100, deadline=None)
@given(valid_lists())
def test_prop_sanitize_leaves_valid_lists_alone(msgs: list[dict[str, Any]]) -> None:
    assert _errors(msgs) == []
    out = sanitize_tool_pairs(msgs)
    assert len(out) == len(msgs)
    assert all(a is b for a, b in zip(out, msgs, strict=True))


@settings(max_examples=150, deadline=None)
@given(messy_lists)
def test_prop_group_spans_partition_the_list(msgs: list[dict[str, Any]]) -> None:
    spans = group_spans(msgs)
    pos = 0
    for start, end in spans:
        assert start == pos and end > start
        # only tool results follow the first message of a unit
        assert all(m.get("role") == "tool" for m in msgs[start + 1 : end])
        pos = end
    assert pos == len(msgs)


@settings(max_examples=150, deadline=None)
@given(messy_lists, st.integers(-3, 30), st.sampled_from(["backward", "forward"]))
def test_prop_align_cut_lands_on_a_unit_boundary(msgs: list[dict[str, Any]], index: int, direction: str) -> None:
    cut = align_cut(msgs, index, direction=direction)
    n = len(msgs)
    assert 0 <= cut <= n
    boundaries = {s for s, _ in group_spans(msgs)} | {n}
    assert cut in boundaries or (cut == 0)
    clamped = max(0, min(index, n))
    if direction == "backward":
        assert cut <= clamped
    else:
        assert cut >= clamped
    # a cut never separates a call from its results: the message at the cut is not a tool
    # result, unless nothing precedes it
    assert cut in (0, n) or msgs[cut].get("role") != "tool"


@settings(max_examples=100, deadline=None)
@given(valid_lists(), st.integers(0, 60))
def test_prop_both_sides_of_an_aligned_cut_are_valid(msgs: list[dict[str, Any]], index: int) -> None:
    for direction in ("backward", "forward"):
        cut = align_cut(msgs, index, direction=direction)
        assert _errors(msgs[:cut]) == []
        assert _errors(msgs[cut:]) == []
