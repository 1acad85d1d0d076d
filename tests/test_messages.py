"""ctxengine.messages: validation with indices, text helpers, tool-call helpers."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxengine.errors import InvalidMessages
from ctxengine.messages import (
    ROLES,
    Violation,
    check,
    content_text,
    copy_messages,
    identical_prefix,
    is_summary,
    message_text,
    roles,
    tool_call_args,
    tool_call_id,
    tool_call_name,
    tool_calls,
    validate,
)
from ctxengine.tokens import estimate_message_tokens


def call(cid: str, name: str = "read_file", args: Any = '{"path": "a.py"}') -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def asst(*calls: dict[str, Any], content: Any = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def result(cid: str, content: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": cid, "content": content}


SYS = {"role": "system", "content": "You are helpful."}
USER = {"role": "user", "content": "Fix the bug."}


def codes(vs: list[Violation]) -> list[tuple[int, str]]:
    return [(v.index, v.code) for v in vs]


# -- validate: valid inputs ------------------------------------------------------------------


def test_valid_conversation_has_no_violations() -> None:
    msgs = [
        SYS,
        USER,
        asst(call("a"), call("b", "grep", '{"q": "x"}')),
        result("a"),
        result("b"),
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": [{"type": "text", "text": "thanks"}, {"type": "image_url", "image_url": {"url": "data:,"}}]},
    ]
    assert validate(msgs) == []
    assert check(msgs) == msgs


def test_empty_list_is_valid() -> None:
    assert validate([]) == []


@pytest.mark.parametrize("role", sorted(ROLES - {"tool"}))
def test_every_known_role_is_accepted(role: str) -> None:
    assert validate([{"role": role, "content": "x"}]) == []


def test_results_may_come_in_any_order_within_their_group() -> None:
    msgs = [USER, asst(call("a"), call("b")), result("b"), result("a")]
    assert validate(msgs) == []


def test_tuple_input_is_accepted() -> None:
    assert validate((USER, {"role": "assistant", "content": "hi"})) == []


# -- validate: every violation code, with its index -------------------------------------------


def test_not_a_list() -> None:
    vs = validate({"role": "user"})
    assert codes(vs) == [(-1, "not_a_list")]
    assert "dict" in vs[0].detail


def test_not_a_dict() -> None:
    assert codes(validate([USER, "hello", 3])) == [(1, "not_a_dict"), (2, "not_a_dict")]


def test_missing_role() -> None:
    assert codes(validate([USER, {"content": "x"}])) == [(1, "missing_role")]


@pytest.mark.parametrize("role", ["robot", "", "USER", 5, ["user"]])
def test_bad_role(role: Any) -> None:
    vs = validate([USER, {"role": role, "content": "x"}])
    assert codes(vs) == [(1, "bad_role")]
    assert repr(role) in vs[0].detail


@pytest.mark.parametrize("content", [5, 1.5, {"text": "x"}, True])
def test_bad_content_type(content: Any) -> None:
    vs = validate([SYS, {"role": "user", "content": content}])
    assert codes(vs) == [(1, "bad_content")]


@pytest.mark.parametrize("parts", [["plain string"], [{"type": 3}], [None], [{"type": "text", "text": "ok"}, 7]])
def test_bad_content_parts(parts: list[Any]) -> None:
    assert codes(validate([{"role": "user", "content": parts}])) == [(0, "bad_content")]


def test_tool_call_without_result_points_at_the_call() -> None:
    msgs = [USER, asst(call("a"), call("b")), result("a"), {"role": "user", "content": "next"}]
    vs = validate(msgs)
    assert codes(vs) == [(1, "tool_call_without_result")]
    assert "'b'" in vs[0].detail and "message 3" in vs[0].detail


def test_tool_call_without_result_at_end() -> None:
    vs = validate([USER, asst(call("a")), {"role": "assistant", "content": "x"}, asst(call("b"))])
    assert codes(vs) == [(1, "tool_call_without_result"), (3, "tool_call_without_result")]


def test_result_without_call() -> None:
    vs = validate([USER, result("ghost")])
    assert codes(vs) == [(1, "result_without_call")]
    assert "ghost" in vs[0].detail


def test_duplicate_tool_call_id_in_one_group() -> None:
    vs = validate([USER, asst(call("a"), call("a")), result("a")])
    assert (1, "duplicate_tool_call_id") in codes(vs)
    assert all(v.severity == "error" for v in vs)


def test_duplicate_result() -> None:
    vs = validate([USER, asst(call("a")), result("a"), result("a", "again")])
    assert codes(vs) == [(3, "duplicate_result")]


def test_result_not_adjacent() -> None:
    msgs = [USER, asst(call("a")), {"role": "user", "content": "hurry"}, result("a")]
    assert codes(validate(msgs)) == [(1, "tool_call_without_result"), (3, "result_not_adjacent")]


@pytest.mark.parametrize("cid", [None, "", 7])
def test_missing_tool_call_id(cid: Any) -> None:
    msg: dict[str, Any] = {"role": "tool", "content": "x"}
    if cid is not None:
        msg["tool_call_id"] = cid
    assert codes(validate([USER, msg])) == [(1, "missing_tool_call_id")]


@pytest.mark.parametrize(
    ("calls", "needle"),
    [
        ({"id": "a"}, "not a list"),
        (["nope"], "not a dict"),
        ([{"type": "function", "function": {"name": "f", "arguments": "{}"}}], "no string 'id'"),
        ([{"id": "a", "type": "function"}], "no function name"),
        ([{"id": "a", "function": {"name": 5}}], "no function name"),
        ([{"id": "a", "function": {"name": "f", "arguments": 12}}], "are a int"),
    ],
)
def test_bad_tool_calls(calls: Any, needle: str) -> None:
    vs = validate([USER, {"role": "assistant", "content": None, "tool_calls": calls}, result("a")])
    bad = [v for v in vs if v.code == "bad_tool_calls"]
    assert [v.index for v in bad] == [1]
    assert needle in bad[0].detail


def test_tool_calls_none_is_a_plain_assistant_message() -> None:
    assert validate([USER, {"role": "assistant", "content": "hi", "tool_calls": None}]) == []


def test_empty_tool_calls_list_is_an_error() -> None:
    # OpenAI answers 400 "Invalid 'messages[1].tool_calls': empty array"
    vs = validate([USER, {"role": "assistant", "content": "hi", "tool_calls": []}])
    assert codes(vs) == [(1, "empty_tool_calls")]
    assert vs[0].severity == "error"


def test_dict_arguments_are_accepted() -> None:
    assert validate([USER, asst(call("a", args={"path": "x"})), result("a")]) == []


def test_every_violation_is_reported_not_just_the_first() -> None:
    msgs = ["junk", {"role": "robot"}, {"content": "x"}, {"role": "user", "content": 3}, result("ghost")]
    assert codes(validate(msgs)) == [
        (0, "not_a_dict"),
        (1, "bad_role"),
        (2, "missing_role"),
        (3, "bad_content"),
        (4, "result_without_call"),
    ]


def test_violations_sorted_by_index() -> None:
    msgs = [USER, asst(call("a")), {"role": "user", "content": 5}, result("zzz")]
    idx = [v.index for v in validate(msgs)]
    assert idx == sorted(idx)
    assert idx == [1, 2, 3]


# -- warnings ---------------------------------------------------------------------------------


def test_reused_id_in_a_later_group_is_a_warning() -> None:
    msgs = [USER, asst(call("a")), result("a"), asst(call("a")), result("a")]
    vs = validate(msgs)
    assert codes(vs) == [(3, "reused_tool_call_id")]
    assert vs[0].severity == "warning"
    assert check(msgs) == msgs  # warnings never raise


def test_non_json_arguments_is_a_warning() -> None:
    msgs = [USER, asst(call("a", args="{not json")), result("a")]
    vs = validate(msgs)
    assert codes(vs) == [(1, "non_json_arguments")]
    assert vs[0].severity == "warning"
    assert check(msgs) == msgs


@pytest.mark.parametrize("args", ["", "   ", "[1, 2]", "null", '"s"'])
def test_empty_or_non_object_json_arguments_are_not_flagged(args: str) -> None:
    assert validate([USER, asst(call("a", args=args)), result("a")]) == []


# -- pending calls --------------------------------------------------------------------------


def test_pending_calls_of_the_last_assistant_are_allowed_on_request() -> None:
    msgs = [USER, asst(call("a"), call("b")), result("a")]
    assert codes(validate(msgs)) == [(1, "tool_call_without_result")]
    assert validate(msgs, allow_pending_calls=True) == []
    assert check(msgs, allow_pending_calls=True) == msgs


def test_pending_calls_only_for_the_last_assistant() -> None:
    msgs = [USER, asst(call("a")), {"role": "user", "content": "?"}, asst(call("b"))]
    vs = validate(msgs, allow_pending_calls=True)
    assert codes(vs) == [(1, "tool_call_without_result")]


def test_pending_does_not_excuse_an_earlier_assistant_followed_by_more_calls() -> None:
    msgs = [USER, asst(call("a")), asst(call("b"))]
    assert codes(validate(msgs, allow_pending_calls=True)) == [(1, "tool_call_without_result")]


# -- check ------------------------------------------------------------------------------------


def test_check_raises_with_every_error() -> None:
    msgs = [USER, asst(call("a")), result("ghost"), {"role": "x"}]
    with pytest.raises(InvalidMessages) as info:
        check(msgs, context="request")
    err = info.value
    assert [v.code for v in err.violations] == ["tool_call_without_result", "result_without_call", "bad_role"]
    assert "invalid request" in str(err) and "3 violation(s)" in str(err)
    assert "[2] result_without_call" in str(err)


def test_check_returns_a_new_list() -> None:
    msgs = [USER]
    out = check(msgs)
    assert out == msgs and out is not msgs


def test_invalid_messages_message_truncates_after_ten() -> None:
    with pytest.raises(InvalidMessages) as info:
        check([result(f"g{i}") for i in range(13)])
    assert len(info.value.violations) == 13
    assert "and 3 more" in str(info.value)


def test_violation_str() -> None:
    assert str(Violation(4, "bad_role", "unknown role 'x'")) == "[4] bad_role: unknown role 'x'"


# -- no mutation ------------------------------------------------------------------------------


def test_validate_and_check_do_not_mutate() -> None:
    msgs = [
        SYS,
        USER,
        asst(call("a"), call("a"), call("b", args="{bad")),
        result("a"),
        result("zz"),
        {"role": "user", "content": [{"type": "text", "text": "x"}], "extra": {"k": [1]}},
    ]
    snapshot = copy.deepcopy(msgs)
    validate(msgs)
    validate(msgs, allow_pending_calls=True)
    with pytest.raises(InvalidMessages):
        check(msgs)
    content_text(msgs[5]["content"])
    message_text(msgs[2])
    tool_call_args(msgs[2]["tool_calls"][2])
    assert msgs == snapshot


def test_copy_messages_is_deep() -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}]}]
    out = copy_messages(msgs)
    out[0]["content"][0]["text"] = "changed"
    assert msgs[0]["content"][0]["text"] == "a"


# -- text helpers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, ""),
        ("plain", "plain"),
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "a\nb"),
        ([{"type": "image_url", "image_url": {"url": "data:,"}}, {"type": "text", "text": "cap"}], "cap"),
        ([{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "ok"}], "hmm\nok"),
        (["raw", {"type": "text", "text": "x"}], "raw\nx"),
        ([], ""),
        (42, "42"),
    ],
)
def test_content_text(content: Any, expected: str) -> None:
    assert content_text(content) == expected


def test_message_text_includes_tool_calls() -> None:
    m = asst(call("a", "read_file", '{"path": "src/x.py"}'), call("b", "grep", {"q": "TODO"}), content="Looking.")
    assert message_text(m) == 'Looking.\nread_file({"path": "src/x.py"})\ngrep({"q": "TODO"})'


def test_message_text_without_content_or_calls() -> None:
    assert message_text({"role": "assistant", "content": None, "tool_calls": [call("a", "ls", None)]}) == "ls()"
    assert message_text({"role": "user", "content": "hi"}) == "hi"
    assert message_text({"role": "assistant"}) == ""


def test_message_text_tolerates_malformed_tool_calls() -> None:
    # found by the fuzz test below: validate checks tool_calls on assistants only
    assert message_text({"role": "system", "content": "s", "tool_calls": 1}) == "s"
    assert message_text({"role": "assistant", "content": "x", "tool_calls": [call("a", "f", "{}"), "junk"]}) == "x\nf({})"


def test_is_summary() -> None:
    assert is_summary({"role": "assistant", "content": "[CONTEXT COMPACTION] earlier turns"})
    assert is_summary({"role": "user", "content": [{"type": "text", "text": "[ctxengine:rules] collapsed"}]})
    assert not is_summary({"role": "user", "content": "please see [CONTEXT COMPACTION]"})
    assert not is_summary({"role": "user", "content": None})


def test_roles() -> None:
    assert roles([SYS, USER, asst(call("a")), result("a")]) == ["system", "user", "assistant", "tool"]
    assert roles([{"content": "x"}]) == ["None"]


# -- tool-call helpers -----------------------------------------------------------------------


def test_tool_calls_helper() -> None:
    c = call("a")
    assert tool_calls(asst(c, "junk")) == [c]  # type: ignore[arg-type]
    assert tool_calls({"role": "assistant", "content": "x"}) == []
    assert tool_calls({"role": "assistant", "tool_calls": None}) == []
    assert tool_calls({"role": "assistant", "tool_calls": "weird"}) == []


def test_tool_call_id_and_name() -> None:
    c = call("call_1", "bash")
    assert tool_call_id(c) == "call_1"
    assert tool_call_name(c) == "bash"
    assert tool_call_id({"id": 3}) == ""
    assert tool_call_name({"function": "bash"}) == "?"
    assert tool_call_name({}) == "?"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ('{"path": "a.py", "n": 2}', {"path": "a.py", "n": 2}),
        ({"path": "a.py"}, {"path": "a.py"}),
        ("", {}),
        (None, {}),
        ("  ", {}),
        ("{not json", "{not json"),
        ("[1, 2]", "[1, 2]"),
    ],
)
def test_tool_call_args(args: Any, expected: Any) -> None:
    assert tool_call_args(call("a", args=args)) == expected


def test_tool_call_args_without_function() -> None:
    assert tool_call_args({"id": "a"}) == {}


# -- real data --------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_trajectories_have_no_errors(trajectories: list[dict[str, Any]]) -> None:
    for traj in trajectories:
        errors = [v for v in validate(traj["messages"]) if v.severity == "error"]
        assert errors == [], (traj["id"], errors[:3])
        # the texts of every message are strings the token counters can take
        for m in traj["messages"]:
            assert isinstance(message_text(m), str)
            for c in tool_calls(m):
                assert isinstance(tool_call_args(c), dict | str)
    assert json.dumps(trajectories[0]["messages"])  # still plain JSON after validation


# -- robustness: arbitrary JSON never crashes validate -----------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
message_like = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["system", "user", "assistant", "tool", "robot"]) | json_values,
        "content": json_values,
        "tool_calls": st.lists(
            st.fixed_dictionaries({}, optional={"id": st.sampled_from(["a", "b"]) | json_values, "function": st.fixed_dictionaries({}, optional={"name": json_values, "arguments": json_values}) | json_values})
            | json_values,
            max_size=3,
        )
        | json_values,
        "tool_call_id": st.sampled_from(["a", "b"]) | json_values,
    },
)


@settings(max_examples=150, deadline=None)
@given(st.lists(message_like | json_values, max_size=8) | json_values)
def test_prop_validate_never_crashes_and_indexes_are_in_range(messages: Any) -> None:
    snapshot = copy.deepcopy(messages)
    vs = validate(messages)
    assert messages == snapshot
    assert all(isinstance(v, Violation) for v in vs)
    if isinstance(messages, list):
        assert all(0 <= v.index < max(1, len(messages)) for v in vs)
        if not [v for v in vs if v.severity == "error"]:
            # what validate accepts, the token estimate and text helpers can read
            for m in messages:
                assert isinstance(message_text(m), str)
                assert estimate_message_tokens(m) >= 4
    else:
        assert codes(vs) == [(-1, "not_a_list")]


@settings(max_examples=150, deadline=None)
@given(st.lists(message_like | json_values, max_size=8) | json_values, st.booleans())
def test_prop_errors_only_gives_exactly_the_errors(messages: Any, pending: bool) -> None:
    """``validate(errors_only=True)`` is ``validate()`` without its warnings, in the same order."""
    full = validate(messages, allow_pending_calls=pending)
    assert validate(messages, allow_pending_calls=pending, errors_only=True) == [v for v in full if v.severity == "error"]


def test_errors_only_keeps_the_errors_of_reused_ids_and_bad_arguments() -> None:
    call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": "not json"}}
    msgs = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "a", "content": "r"},
        {"role": "assistant", "content": None, "tool_calls": [call]},  # a reused id: a warning
        {"role": "tool", "tool_call_id": "a", "content": "r"},
        {"role": "tool", "tool_call_id": "a", "content": "again"},  # an error
        {"role": "assistant", "content": None, "tool_calls": [{"id": "b", "type": "function", "function": {"name": "f", "arguments": 3}}]},
    ]
    assert {v.code for v in validate(msgs)} == {"non_json_arguments", "reused_tool_call_id", "duplicate_result", "bad_tool_calls", "tool_call_without_result"}
    assert [v.code for v in validate(msgs, errors_only=True)] == ["duplicate_result", "bad_tool_calls", "tool_call_without_result"]


# -- json_problem: the fast check agrees with the path-building walk -----------------------------
class _StrSub(str):
    pass


class _DictSub(dict):  # type: ignore[type-arg]
    pass


_json_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=5),
    st.floats(allow_nan=True, allow_infinity=True), st.binary(max_size=3),
    st.builds(_StrSub, st.text(max_size=3)), st.sampled_from([set(), frozenset({1}), object])
)
_json_values = st.recursive(
    _json_leaves,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4),
        st.lists(kids, max_size=3).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers(), st.none()), kids, max_size=4),
        st.dictionaries(st.text(max_size=4), kids, max_size=3).map(_DictSub),
    ),
    max_leaves=20,
)


def _nested(depth: int, leaf: Any = "x") -> Any:
    v: Any = leaf
    for i in range(depth):
        v = {"k": v} if i % 2 else [v]
    return v


@settings(max_examples=400, deadline=None)
@given(_json_values)
def test_json_problem_fast_check_agrees_with_the_full_walk(value: Any) -> None:
    from ctxengine.messages import _json_problem_at, json_problem

    assert json_problem(value) == _json_problem_at(value)
    assert json_problem({"role": "user", "content": value}) == _json_problem_at({"role": "user", "content": value})


@pytest.mark.parametrize("depth", [199, 200, 201, 250])
def test_json_problem_nesting_limit_is_unchanged(depth: int) -> None:
    from ctxengine.messages import MAX_NESTING, _json_problem_at, json_problem

    value = _nested(depth)
    assert json_problem(value) == _json_problem_at(value)
    assert (json_problem(value) is None) == (depth <= MAX_NESTING)
    assert json_problem({"role": "tool", "content": [{"x": float("nan")}]}) == "content[0].x is nan, which JSON cannot carry"


@given(st.lists(st.integers(0, 5), max_size=12), st.lists(st.integers(0, 5), max_size=12), st.integers(0, 12))
def test_identical_prefix_counts_the_leading_same_objects(a: list[int], b: list[int], shared: int) -> None:
    objs = [{"i": i} for i in range(12)]
    left = objs[:shared] + [{"i": i} for i in a]  # equal values, other objects after the shared part
    right = objs[:shared] + [{"i": i} for i in b]
    expected = 0
    while expected < min(len(left), len(right)) and left[expected] is right[expected]:
        expected += 1
    assert identical_prefix(left, right) == identical_prefix(right, left) == expected == min(shared, len(left), len(right))
    assert identical_prefix(left, left[: len(left) // 2]) == len(left) // 2
