"""The Anthropic Messages ⇄ OpenAI adapter: exact round trips, every block type, clear errors."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxengine.anthropic_adapter import (
    META_KEY,
    THINKING_KEY,
    anthropic_to_openai,
    openai_to_anthropic,
)
from ctxengine.errors import InputError
from ctxengine.messages import validate
from ctxengine.testing.strategies import anthropic_payloads, conversations

PROPERTY = settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

CC = {"type": "ephemeral"}
PNG = "iVBORw0KGgo="


def errors(messages: list[dict[str, Any]]) -> list[str]:
    return [str(v) for v in validate(messages) if v.severity == "error"]


# -- properties -------------------------------------------------------------------------------


@PROPERTY
@given(anthropic_payloads())
def test_anthropic_round_trip_is_exact(payload: tuple[Any, list[dict[str, Any]]]) -> None:
    system, messages = payload
    before = copy.deepcopy(payload)
    converted = anthropic_to_openai(system, messages)
    assert payload == before  # no mutation
    back = openai_to_anthropic(converted)
    assert back == (system, messages)
    assert json.dumps(back[1], ensure_ascii=False) == json.dumps(messages, ensure_ascii=False)


@PROPERTY
@given(anthropic_payloads())
def test_adapter_made_openai_round_trip_is_exact_and_valid(payload: tuple[Any, list[dict[str, Any]]]) -> None:
    converted = anthropic_to_openai(*payload)
    assert errors(converted) == []
    before = copy.deepcopy(converted)
    back = anthropic_to_openai(*openai_to_anthropic(converted))
    assert converted == before
    assert back == converted


@PROPERTY
@given(anthropic_payloads())
def test_results_share_nothing_with_the_input(payload: tuple[Any, list[dict[str, Any]]]) -> None:
    system, messages = payload
    before = copy.deepcopy(payload)
    converted = anthropic_to_openai(system, messages)
    _scramble(converted)
    assert payload == before
    fresh = anthropic_to_openai(*before)
    back_system, back_messages = openai_to_anthropic(fresh)
    _scramble(back_messages)
    _scramble(back_system)
    assert fresh == anthropic_to_openai(*before)


def _scramble(value: Any) -> None:
    """Edit every dict and list in place, to prove no object is shared."""
    if isinstance(value, dict):
        for v in list(value.values()):
            _scramble(v)
        value["__scrambled__"] = True
    elif isinstance(value, list):
        for v in value:
            _scramble(v)
        value.append("__scrambled__")


@PROPERTY
@given(conversations(non_json_arguments=False, huge_tokens=0))
def test_plain_openai_conversations_convert_and_settle(messages: list[dict[str, Any]]) -> None:
    """OpenAI conversations not made by the adapter convert to Anthropic and back to a valid
    list with the same tool-call structure; a second round trip changes nothing."""
    before = copy.deepcopy(messages)
    once = anthropic_to_openai(*openai_to_anthropic(messages))
    assert messages == before
    assert errors(once) == []
    assert [m.get("tool_call_id") for m in once] == [m.get("tool_call_id") for m in messages]
    assert [m["role"] for m in once] == [m["role"] for m in messages]
    assert anthropic_to_openai(*openai_to_anthropic(once)) == once


# -- concrete block types ---------------------------------------------------------------------


def test_system_string_and_blocks() -> None:
    assert anthropic_to_openai("be brief", []) == [{"role": "system", "content": "be brief"}]
    blocks = [{"type": "text", "text": "policy", "cache_control": CC}, {"type": "text", "text": "tools"}]
    out = anthropic_to_openai(blocks, [{"role": "user", "content": "hi"}])
    assert out[0] == {"role": "system", "content": blocks}
    assert out[0]["content"] is not blocks
    assert openai_to_anthropic(out) == (blocks, [{"role": "user", "content": "hi"}])
    assert openai_to_anthropic([{"role": "user", "content": "hi"}]) == (None, [{"role": "user", "content": "hi"}])
    assert anthropic_to_openai(None, [{"role": "user", "content": "hi"}]) == [{"role": "user", "content": "hi"}]


def test_images_base64_and_url_become_image_url_parts() -> None:
    b64 = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}, "cache_control": CC}
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    out = anthropic_to_openai(None, [{"role": "user", "content": [{"type": "text", "text": "look"}, b64, url]}])
    assert out == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}, "cache_control": CC},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            ],
        }
    ]
    assert openai_to_anthropic(out)[1][0]["content"] == [{"type": "text", "text": "look"}, b64, url]


def test_image_sources_without_a_url_form_are_kept_verbatim() -> None:
    file_image = {"type": "image", "source": {"type": "file", "file_id": "file_1"}}
    data_url_as_url = {"type": "image", "source": {"type": "url", "url": "data:image/png;base64,AAAA"}}
    out = anthropic_to_openai(None, [{"role": "user", "content": [file_image, data_url_as_url]}])
    assert out[0]["content"] == [file_image, data_url_as_url]
    assert openai_to_anthropic(out)[1][0]["content"] == [file_image, data_url_as_url]


def test_openai_image_detail_is_dropped_and_string_image_url_accepted() -> None:
    msgs = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "https://x.test/a.png", "detail": "high"}},
                {"type": "image_url", "image_url": "data:image/jpeg;base64,/9j/"},
            ],
        }
    ]
    _, out = openai_to_anthropic(msgs)
    assert out[0]["content"] == [
        {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/"}},
    ]


def test_tool_use_and_tool_result_with_error_and_content_list() -> None:
    messages = [
        {"role": "user", "content": "read it"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "reading"},
                {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.py", "n": [1, 2.5, None]}, "cache_control": CC},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "is_error": True,
                    "content": [{"type": "text", "text": "Error: no such file"}, {"type": "image", "source": {"type": "url", "url": "https://x.test/s.png"}}],
                }
            ],
        },
    ]
    out = anthropic_to_openai(None, messages)
    assert out[1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "reading"}],
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "a.py", "n": [1, 2.5, null]}'},
                "cache_control": CC,
            }
        ],
    }
    assert out[2] == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": [{"type": "text", "text": "Error: no such file"}, {"type": "image_url", "image_url": {"url": "https://x.test/s.png"}}],
        "is_error": True,
    }
    assert openai_to_anthropic(out) == (None, messages)


def test_tool_result_without_content_maps_to_none() -> None:
    messages = [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "ping", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
    ]
    out = anthropic_to_openai(None, messages)
    assert out == [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "t", "type": "function", "function": {"name": "ping", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "t", "content": None},
    ]
    assert openai_to_anthropic(out)[1] == messages


def test_several_tool_results_with_text_around_them() -> None:
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "x", "input": {}}, {"type": "tool_use", "id": "b", "name": "y", "input": {}}]}
    user = {
        "role": "user",
        "content": [
            {"type": "text", "text": "first"},
            {"type": "tool_result", "tool_use_id": "a", "content": "A"},
            {"type": "text", "text": "between"},
            {"type": "tool_result", "tool_use_id": "b", "content": "B", "cache_control": CC},
        ],
    }
    out = anthropic_to_openai(None, [call, user])
    assert [m["role"] for m in out] == ["assistant", "tool", "tool", "user"]
    assert out[3]["content"] == [{"type": "text", "text": "first"}, {"type": "text", "text": "between"}]
    assert out[3][META_KEY] == {"joins_previous": True, "order": ["content", "tool_result", "content", "tool_result"]}
    assert out[2]["cache_control"] == CC
    assert errors(out) == []
    assert openai_to_anthropic(out) == (None, [call, user])


def test_tool_results_split_over_two_user_messages_stay_split() -> None:
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "x", "input": {}}, {"type": "tool_use", "id": "b", "name": "y", "input": {}}]}
    first = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "A"}]}
    second = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "b", "content": "B"}]}
    out = anthropic_to_openai(None, [call, first, second])
    assert out[2][META_KEY] == {"new_message": True}
    assert openai_to_anthropic(out) == (None, [call, first, second])
    merged = {"role": "user", "content": first["content"] + second["content"]}
    assert openai_to_anthropic(anthropic_to_openai(None, [call, merged])) == (None, [call, merged])


def test_thinking_blocks_keep_signatures_and_order() -> None:
    thinking = {"type": "thinking", "thinking": "Let me think", "signature": "EqQBCgIYAhIM"}
    redacted = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3p"}
    usual = {"role": "assistant", "content": [thinking, redacted, {"type": "text", "text": "Done"}]}
    out = anthropic_to_openai(None, [usual])
    assert out == [{"role": "assistant", "content": [{"type": "text", "text": "Done"}], THINKING_KEY: [thinking, redacted]}]
    unusual = {"role": "assistant", "content": [{"type": "text", "text": "a"}, thinking, {"type": "tool_use", "id": "t", "name": "x", "input": {}}, {"type": "text", "text": "b"}]}
    out2 = anthropic_to_openai(None, [unusual])
    assert out2[0][META_KEY] == {"order": ["content", "thinking", "tool_use", "content"]}
    assert openai_to_anthropic(out) == (None, [usual])
    assert openai_to_anthropic(out2) == (None, [unusual])


def test_an_order_that_no_longer_fits_falls_back_to_the_default() -> None:
    unusual = {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "thinking", "thinking": "t", "signature": "s"}]}
    out = anthropic_to_openai(None, [unusual])
    out[0]["content"] = [{"type": "text", "text": "a"}, {"type": "text", "text": "added by an engine"}]
    _, back = openai_to_anthropic(out)
    assert back[0]["content"] == [{"type": "thinking", "thinking": "t", "signature": "s"}, {"type": "text", "text": "a"}, {"type": "text", "text": "added by an engine"}]


def test_a_rewritten_joined_user_message_still_converts() -> None:
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "x", "input": {}}]}
    user = {"role": "user", "content": [{"type": "text", "text": "note"}, {"type": "tool_result", "tool_use_id": "a", "content": "A"}]}
    out = anthropic_to_openai(None, [call, user])
    out[-1]["content"] = "[ctxengine: shortened]"
    _, back = openai_to_anthropic(out)
    # one content block still, so the recorded order still fits
    assert back[-1]["content"] == [{"type": "text", "text": "[ctxengine: shortened]"}, {"type": "tool_result", "tool_use_id": "a", "content": "A"}]
    out[-1]["content"] = None
    _, back = openai_to_anthropic(out)
    assert back[-1]["content"] == [{"type": "tool_result", "tool_use_id": "a", "content": "A"}]


def test_unknown_keys_and_block_types_survive() -> None:
    doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}, "title": "t"}
    messages = [
        {"role": "user", "content": [doc, {"type": "text", "text": "see", "citations": [{"type": "char_location"}]}], "x_turn": 1},
        {"role": "assistant", "content": "ok", "x_request_id": "r1"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}], "x_turn": 2},
    ]
    out = anthropic_to_openai(None, messages)
    assert out[0]["x_turn"] == 1 and out[1]["x_request_id"] == "r1"
    assert out[3][META_KEY] == {"message_keys": {"x_turn": 2}}
    assert openai_to_anthropic(out) == (None, messages)


def test_plain_openai_assistant_text_with_tool_calls_and_message_cache_control() -> None:
    msgs = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "go", "cache_control": CC},
        {"role": "assistant", "content": "Let me check", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok", "cache_control": CC},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "bash", "arguments": {"cmd": "ls"}}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "files"},
    ]
    system, out = openai_to_anthropic(msgs)
    assert system == "sys"
    assert out[0] == {"role": "user", "content": [{"type": "text", "text": "go", "cache_control": CC}]}
    assert out[1]["content"] == [{"type": "text", "text": "Let me check"}, {"type": "tool_use", "id": "c1", "name": "bash", "input": {}}]
    assert out[2]["content"] == [{"type": "tool_result", "tool_use_id": "c1", "content": "ok", "cache_control": CC}]
    assert out[3]["content"] == [{"type": "tool_use", "id": "c2", "name": "bash", "input": {"cmd": "ls"}}]


@pytest.mark.parametrize(
    ("system", "messages", "needle"),
    [
        (None, "nope", "expected a list"),
        (42, [], "system is a int"),
        (None, [{"role": "system", "content": "x"}], "message 0: role 'system'"),
        (None, [{"role": "user"}], "message 0: no 'content'"),
        (None, [{"role": "user", "content": 3}], "message 0: content is a int"),
        (None, [{"role": "user", "content": [{"text": "x"}]}], "no string 'type'"),
        (None, [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": {}}]}], "tool_use block in a user message"),
        (None, [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}], "tool_result block in an assistant message"),
        (None, [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "x"}]}], "has no 'input'"),
        (None, [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": float("nan")}]}], "not JSON"),
        (None, [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "not an Anthropic block type"),
        (None, [{"role": "user", "content": "x", "cache_control": CC}], "belongs on a content block"),
        (None, [{"role": "user", "content": "x", "tool_calls": []}], "OpenAI form uses for itself"),
        (None, [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}], "content of tool_result 't' is a int"),
    ],
)
def test_bad_anthropic_input_is_named(system: Any, messages: Any, needle: str) -> None:
    with pytest.raises(InputError, match=None) as info:
        anthropic_to_openai(system, messages)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ({"role": "user"}, "expected a list"),
        ([{"role": "user", "content": "a"}, {"role": "system", "content": "late"}], "message 1: a system message after the start"),
        ([{"role": "function", "content": "x"}], "role 'function'"),
        ([{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "x", "arguments": "{oops"}}]}], "not JSON"),
        ([{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "custom", "function": {"name": "x"}}]}], "only 'function' calls"),
        ([{"role": "assistant", "content": None, "tool_calls": "x"}], "not a list"),
        ([{"role": "tool", "content": "x"}], "without a string 'tool_call_id'"),
        ([{"role": "user", "content": "x", META_KEY: "bad"}], "expected an object"),
        ([{"role": "system", "content": "s", "name": "x"}], "cannot carry"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "no string 'url'"),
    ],
)
def test_bad_openai_input_is_named(messages: Any, needle: str) -> None:
    with pytest.raises(InputError) as info:
        openai_to_anthropic(messages)
    assert needle in str(info.value)


def _containers(value: Any) -> list[int]:
    if isinstance(value, dict):
        return [id(value), *(i for v in value.values() for i in _containers(v))]
    if isinstance(value, list):
        return [id(value), *(i for v in value for i in _containers(v))]
    return []


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(), lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=30))
def test_the_adapters_copy_of_json_data_is_a_deep_copy(value: Any) -> None:
    from ctxengine.anthropic_adapter import _clone

    out = _clone(value)
    assert out == copy.deepcopy(value)
    assert not set(_containers(out)) & set(_containers(value))  # shares no dict or list
