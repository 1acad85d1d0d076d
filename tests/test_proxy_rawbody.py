"""The incremental body parser gives exactly what a full parse gives, reusing last turn's messages."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxengine.proxy.rawbody import BodyCache


def body(n: int, **extra: Any) -> dict[str, Any]:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "x" * i} for i in range(n)]
    return {"model": "gpt-4o", "messages": msgs, **extra}


@pytest.mark.parametrize("dumps", [lambda b: json.dumps(b).encode(), lambda b: json.dumps(b, indent=2).encode(), orjson.dumps])
def test_a_resent_history_reuses_the_messages_already_seen(dumps: Any) -> None:
    cache = BodyCache()
    first = cache.parse(dumps(body(5)))
    assert first == body(5)
    second = cache.parse(dumps(body(7, stream=True, tools=[{"type": "function"}])))
    assert second == body(7, stream=True, tools=[{"type": "function"}])
    assert list(second) == ["model", "messages", "stream", "tools"]  # key order kept
    assert all(a is b for a, b in zip(first["messages"], second["messages"][:5], strict=True))
    third = cache.parse(dumps(body(7)))  # the same history again, other keys changed
    assert third == body(7) and third["messages"][6] is second["messages"][6]


def test_an_edited_history_keeps_only_the_unchanged_prefix() -> None:
    cache = BodyCache()
    first = cache.parse(json.dumps(body(6)).encode())
    edited = body(6)
    edited["messages"][3] = {"role": "assistant", "content": "rewritten"}
    out = cache.parse(json.dumps(edited).encode())
    assert out == edited
    assert out["messages"][2] is first["messages"][2] and out["messages"][3] is not first["messages"][3]
    shorter = cache.parse(json.dumps(body(2)).encode())
    assert shorter == body(2)
    assert cache.parse(json.dumps(body(0)).encode()) == body(0)


def test_unusual_bodies_fall_back_to_a_full_parse() -> None:
    cache = BodyCache()
    cache.parse(json.dumps(body(3)).encode())
    unicode = body(4)
    unicode["messages"][3]["content"] = "héllo ✓"
    raw = json.dumps(unicode, ensure_ascii=False).encode()
    assert cache.parse(raw) == orjson.loads(raw)
    cache.parse(json.dumps(body(3)).encode())
    dup = json.dumps(body(3)).encode()[:-1] + b', "messages": []}'
    assert cache.parse(dup) == orjson.loads(dup)
    other = json.dumps({"messages": [{"role": "user", "content": "a"}], "model": "m"}).encode()
    assert cache.parse(other) == orjson.loads(other)
    with pytest.raises(orjson.JSONDecodeError):
        cache.parse(b'{"model": "m", "messages": [')
    assert cache.parse(b"[1, 2]") == [1, 2]


def test_splice_rewrites_only_the_replaced_messages() -> None:
    cache = BodyCache()
    cache.parse(json.dumps(body(4)).encode())
    raw = json.dumps(body(6, stream=True), indent=1).encode()
    parsed = cache.parse(raw)
    new = dict(parsed)
    new["messages"] = list(parsed["messages"])
    new["messages"][0] = {"role": "user", "content": [{"type": "text", "text": "m0", "cache_control": {"type": "ephemeral"}}]}
    new["messages"][5] = {"role": "assistant", "content": "marked é"}
    out = cache.splice(raw, parsed, new)
    assert out is not None and orjson.loads(out) == new
    assert json.dumps(parsed["messages"][2], indent=1).replace("\n", "\n  ").encode() in out  # untouched bytes as sent
    assert cache.splice(raw, parsed, new, [5, 0]) == out  # the replaced ones named: the same bytes
    assert cache.splice(raw, parsed, parsed) == raw
    other = dict(new, model="other")  # a key before the array is rewritten in place
    assert orjson.loads(cache.splice(raw, parsed, other) or b"null") == other
    assert cache.splice(raw, parsed, dict(new, stream=False)) is None  # after the array: serialise it all
    assert cache.splice(json.dumps(body(6)).encode(), parsed, new) is None  # not the body remembered


def test_splice_rewrites_a_key_before_the_messages_too() -> None:
    cache = BodyCache()
    first = {"model": "claude", "system": "be brief", "messages": [{"role": "user", "content": "a"}], "max_tokens": 5}
    cache.parse(json.dumps(first).encode())
    second = dict(first, messages=[*first["messages"], {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}])
    raw = json.dumps(second).encode()
    parsed = cache.parse(raw)
    new = dict(parsed, system=[{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}])
    new["messages"] = [*parsed["messages"][:2], {"role": "user", "content": [{"type": "text", "text": "c", "cache_control": {"type": "ephemeral"}}]}]
    out = cache.splice(raw, parsed, new)
    assert out is not None and orjson.loads(out) == new
    assert cache.splice(raw, parsed, new, [2]) == out
    assert cache.splice(raw, parsed, dict(parsed, max_tokens=9)) is None  # after the array: not remembered


def test_the_keys_before_the_messages_are_last_bodys_values_and_the_keys_after_are_read_again() -> None:
    cache = BodyCache()
    system = [{"type": "text", "text": "You are an agent. " * 50}]
    first = cache.parse(json.dumps({"model": "claude", "system": system, **body(3), "stream": True}).encode())
    second = cache.parse(json.dumps({"model": "claude", "system": system, **body(5), "stream": False, "metadata": {"a": 1}}).encode())
    assert second == {"model": "claude", "system": system, **body(5), "stream": False, "metadata": {"a": 1}}
    assert list(second) == ["model", "system", "messages", "stream", "metadata"]
    assert first["system"] == system
    again = cache.parse(json.dumps({"model": "claude", "system": system, **body(6)}).encode())
    assert again["system"] is second["system"]  # not decoded again
    third = cache.parse(json.dumps({"model": "claude", "system": "another", **body(6)}).encode())
    assert third["system"] == "another"


def test_the_keys_after_the_messages_are_last_bodys_values_while_their_bytes_are_the_same() -> None:
    """A tool list resent unchanged is the same object each turn (the manager counts its tokens
    once, by identity) and is not decoded again."""
    cache = BodyCache()
    tools = [{"type": "function", "function": {"name": f"t{i}", "description": "reads a file " * 20, "parameters": {"type": "object"}}} for i in range(5)]
    bodies = [json.dumps({**body(n), "tools": tools, "stream": True}).encode() for n in (3, 5, 7)]
    parsed = [cache.parse(b) for b in bodies]
    assert all(p == {**body(n), "tools": tools, "stream": True} for p, n in zip(parsed, (3, 5, 7), strict=True))
    assert parsed[2]["tools"] is parsed[1]["tools"]
    changed = cache.parse(json.dumps({**body(9), "tools": tools[:4], "stream": True}).encode())
    assert changed["tools"] == tools[:4] and changed["tools"] is not parsed[2]["tools"]
    back = cache.parse(json.dumps({**body(11), "tools": tools, "stream": True}).encode())
    assert back["tools"] == tools and back["tools"] is not parsed[2]["tools"]
    assert cache.parse(json.dumps(body(12)).encode()) == body(12)  # no key after the messages any more


@pytest.mark.parametrize(
    "ending",
    [b"}", b" }\n", b', "stream": true}', b' ,\n "stream" : true , "max_tokens": 5 }', b', "model": "other"}', b', "system": "s2"}', b", }", b"} x", b', "stream": true', b"]", b', "messages": []}'],
)
def test_whatever_follows_the_messages_parses_as_a_full_parse_does(ending: bytes) -> None:
    head = b'{"model": "m", "system": "s", "model": "m2", "messages": '
    cache = BodyCache()
    cache.parse(head + json.dumps(body(2)["messages"]).encode() + b"}")
    raw = head + json.dumps(body(3)["messages"]).encode() + ending
    try:
        expected = orjson.loads(raw)
    except orjson.JSONDecodeError:
        with pytest.raises(orjson.JSONDecodeError):
            cache.parse(raw)
    else:
        got = cache.parse(raw)
        assert got == expected and list(got) == list(expected)
    # and a body that resent one of the keys before the messages after them, then stopped
    cache = BodyCache()
    cache.parse(head + json.dumps(body(2)["messages"]).encode() + b', "system": "late"}')
    raw = head + json.dumps(body(3)["messages"]).encode() + b"}"
    assert cache.parse(raw) == orjson.loads(raw) == {"model": "m2", "system": "s", "messages": body(3)["messages"]}


_NEEDLE = b'"cache_control"'
# texts that make the needle appear anywhere: inside a message, across the end of the bytes
# shared with last turn's body, in a key after the messages, or not at all
_TEXTS = st.sampled_from(["a", "cache_control", '"cache_control"', "x" * 30, "é", "cache_", "control"])


@settings(max_examples=300, deadline=None)
@given(
    turns=st.lists(
        st.tuples(st.lists(_TEXTS, max_size=3), st.sampled_from(["", "search", "others"]), st.integers(0, 3), st.sampled_from(["", "cache_control", "other"])),
        min_size=1,
        max_size=6,
    )
)
def test_contains_is_a_search_of_the_whole_body(turns: list[tuple[list[str], str, int, str]]) -> None:
    """Searching only the bytes new since last turn answers what ``needle in raw`` answers,
    whatever the bodies (appended, cut back, edited, non-ASCII, or with a key after the array);
    also when the same body is searched twice, or not searched on some turns."""
    cache = BodyCache()
    msgs: list[dict[str, Any]] = []
    for texts, search, cut, key in turns:
        msgs = [*msgs[: max(0, len(msgs) - cut)], *({"role": "user", "content": t} for t in texts)]
        extra = {key: True} if key else {}
        raw = json.dumps({"model": "m", "system": "s", "messages": msgs, **extra}, ensure_ascii=False).encode()
        assert cache.parse(raw) == orjson.loads(raw)
        if search == "search":
            assert cache.contains(raw, _NEEDLE) == (_NEEDLE in raw)
            assert cache.contains(raw, _NEEDLE) == (_NEEDLE in raw)
        elif search == "others":
            assert cache.contains(raw, b'"content"') == (b'"content"' in raw)  # another needle
            assert cache.contains(raw + b" ", _NEEDLE) == (_NEEDLE in raw)  # not the body parsed last: searched whole


def test_contains_searches_only_the_new_bytes_of_a_resent_body() -> None:
    cache = BodyCache()
    first = json.dumps(body(3)).encode()
    cache.parse(first)
    assert not cache.contains(first, _NEEDLE)
    later = json.dumps(body(4)).encode()
    cache.parse(later)
    assert cache.searched is not None and cache.searched[1] is later
    assert cache.searched[2] == len(json.dumps(body(3)["messages"][:3])[:-1]) + len('{"model": "gpt-4o", "messages": ')
    marked = dict(body(4), messages=[*body(4)["messages"], {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {}}]}])
    raw = json.dumps(marked).encode()
    cache.parse(raw)
    assert cache.contains(raw, _NEEDLE)


def test_splice_serialises_a_value_written_last_turn_once() -> None:
    cache = BodyCache()
    system = [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}]
    first = {"model": "claude", "system": "be brief", "messages": [{"role": "user", "content": "a"}]}
    raw = json.dumps(first).encode()
    parsed = cache.parse(raw)
    out = cache.splice(raw, parsed, dict(parsed, system=system))
    assert out is not None and orjson.loads(out) == dict(parsed, system=system)
    assert cache.dumped[id(system)] == (system, orjson.dumps(system))
    second = dict(first, messages=[*first["messages"], {"role": "assistant", "content": "b"}])
    raw = json.dumps(second).encode()
    parsed = cache.parse(raw)
    marked = {"role": "assistant", "content": [{"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}]}
    new = dict(parsed, system=system, messages=[parsed["messages"][0], marked])
    out = cache.splice(raw, parsed, new, [1])
    assert out is not None and orjson.loads(out) == new
    assert set(cache.dumped) == {id(system), id(marked)}  # only this turn's values are kept
    other = [{"type": "text", "text": "be brief!", "cache_control": {"type": "ephemeral"}}]  # another object: serialised
    out = cache.splice(raw, parsed, dict(new, system=other), [1])
    assert out is not None and orjson.loads(out) == dict(new, system=other)
