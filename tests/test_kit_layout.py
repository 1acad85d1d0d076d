"""The incremental message layout (kit.tail.Layout) equals the one built from scratch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxengine.boundaries import group_spans
from ctxengine.engines.kit import is_marked
from ctxengine.engines.kit.records import MARK
from ctxengine.engines.kit.tail import Layout, tail_by_exchanges
from ctxengine.messages import Message
from ctxengine.tokens import estimate_message_tokens

KINDS = ("system", "user", "assistant", "call", "tool", "digest")


def _message(kind: str, n: int) -> Message:
    text = "word " * n
    if kind == "call":
        return {"role": "assistant", "content": "", "tool_calls": [{"id": f"c{n}", "type": "function", "function": {"name": "run", "arguments": "{}"}}]}
    if kind == "digest":
        return {"role": "assistant", "content": f"{MARK}digest] {text}"}
    return {"role": kind, "content": text}


messages_st = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 40)), max_size=40).map(lambda xs: [_message(k, n) for k, n in xs])


def _fresh(messages: list[Message]) -> Layout:
    return Layout.of(messages, count=estimate_message_tokens, marked=is_marked)


def _fields(lay: Layout) -> tuple[Any, ...]:
    return (lay.roles, lay.tokens, lay.totals, lay.marked, lay.spans, lay.exchanges, [id(m) for m in lay.messages])


@settings(max_examples=300, deadline=None)
@given(old=messages_st, keep=st.integers(0, 40), added=messages_st)
def test_an_extended_layout_is_the_one_built_from_scratch(old: list[Message], keep: int, added: list[Message]) -> None:
    # the new list shares a prefix of the old one's objects (all of it when a turn appends)
    new = old[:keep] + added
    previous = _fresh(old)
    extended = Layout.of(new, count=estimate_message_tokens, marked=is_marked, previous=previous)
    assert _fields(extended) == _fields(_fresh(new))
    assert extended.spans == group_spans(new)
    assert extended.totals[-1] == sum(estimate_message_tokens(m) for m in new)
    for n in range(5):
        assert extended.tail(n) == tail_by_exchanges(new, n)


@settings(max_examples=100, deadline=None)
@given(old=messages_st, at=st.integers(0, 39), other=st.sampled_from(KINDS))
def test_a_replaced_message_is_read_again(old: list[Message], at: int, other: str) -> None:
    # an equal-looking list with one message object replaced (a compaction's output)
    new = list(old)
    if at < len(new):
        new[at] = _message(other, 3)
    extended = Layout.of(new, count=estimate_message_tokens, marked=is_marked, previous=_fresh(old))
    assert _fields(extended) == _fields(_fresh(new))


def test_shared_counts_the_leading_equal_messages() -> None:
    a: list[Mapping[str, Any]] = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    lay = _fresh(list(a))  # type: ignore[arg-type]
    assert lay.shared(a) == 2
    assert lay.shared([a[0], dict(a[1])]) == 2  # an equal copy reads the same
    assert lay.shared([a[0], {"role": "assistant", "content": "z"}, a[1]]) == 1
    assert lay.shared(tuple(a)) == 2
    assert lay.describes(a) and lay.describes([dict(m) for m in a])
    assert not lay.describes([*a, a[0]]) and not lay.describes(a[:1])


@settings(max_examples=100, deadline=None)
@given(old=messages_st, keep=st.integers(0, 40), added=messages_st)
def test_a_layout_extends_over_equal_copies(old: list[Message], keep: int, added: list[Message]) -> None:
    # the same history decoded again (a proxy): equal messages, none the same object
    new = [dict(m) for m in old[:keep]] + added
    extended = Layout.of(new, count=estimate_message_tokens, marked=is_marked, previous=_fresh(old))
    assert _fields(extended)[:-1] == _fields(_fresh(new))[:-1]


def test_tool_results_appended_to_an_open_group_join_it() -> None:
    call = _message("call", 1)
    first = [_message("user", 2), call, _message("tool", 3)]
    lay = _fresh(first)
    assert lay.spans == [(0, 1), (1, 3)]
    more = Layout.of([*first, _message("tool", 4), _message("user", 1)], count=estimate_message_tokens, marked=is_marked, previous=lay)
    assert more.spans == [(0, 1), (1, 4), (4, 5)]
    assert more.exchanges == [1]


@pytest.mark.parametrize("n", [0, 1, 3])
def test_an_empty_list_has_an_empty_layout(n: int) -> None:
    lay = _fresh([])
    assert lay.spans == [] and lay.totals == [0] and lay.tail(n) == 0
