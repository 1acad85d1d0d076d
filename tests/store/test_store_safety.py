"""Store safety: regex search in linear time, text that cannot be encoded, no secret in a
compactions row (SQLite and PostgreSQL)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxengine.errors import InputError
from ctxengine.redact import MARK, clear_secrets, register_secret
from ctxengine.safe_regex import MAX_PATTERN_CHARS, compile_pattern
from ctxengine.store import SessionStore
from ctxengine.store.base import canonical_json
from ctxengine.textsafe import dumps

CATASTROPHIC = ["(a+)+$", "(a|aa)+$", "(a*)*b", "(x+x+)+y", "^(([a-z])+.)+[A-Z]([a-z])+$", "(.*a){20}"]


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_backtracking_patterns_answer_at_once(store: SessionStore, pattern: str) -> None:
    # under Python's re, (a+)+$ on this text takes longer than the test suite
    text = "a" * 5_000 + "!"
    store.record_messages("s", [{"role": "user", "content": text}, {"role": "assistant", "content": "x" * 5_000 + "!"}])
    hits = store.search(pattern, session_id="s", mode="regex")
    assert isinstance(hits, list)


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=a)b", r"(?<=a)b", "x" * (MAX_PATTERN_CHARS + 1), "("])
def test_patterns_the_linear_engine_cannot_run_are_named(store: SessionStore, pattern: str) -> None:
    with pytest.raises(InputError, match="regular expression"):
        store.search(pattern, mode="regex")


def test_lone_surrogates_are_recorded_and_restored_exactly(store: SessionStore) -> None:
    msgs = [{"role": "user", "content": "bad \ud800 text"}, {"role": "assistant", "content": "ok \udfff", "extra": {"k\ud83d": "v"}}]
    store.record_messages("sur", msgs)
    assert store.history("sur") == msgs  # preserved, not replaced
    hits = store.search("bad", session_id="sur")
    assert hits and "\ufffd" in hits[0].snippet  # derived search text is cleaned
    doc = store.export_session("sur")
    json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")
    assert [m["message"] for m in doc["messages"]] == msgs


def test_compaction_rows_never_hold_a_secret(store: SessionStore) -> None:
    clear_secrets()
    key = "sk-proj-abcdefghijklmnop0123456789"
    register_secret(key)
    before = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    after = [{"role": "user", "content": "hi"}]
    report = {
        "engine": "compressor",
        "tokens_before": 10,
        "tokens_after": 5,
        "replaced": [1],
        "notes": [f"summarizer failed: http://bob:pa55word@10.0.0.1/v1 answered 401: bad key {key}"],
        "config": {"base_url": "https://h.example/v1?key=AIzaSyA1234567890abcdefghijklmnopqrstu"},
    }
    store.record_compaction("sec", report, before, after)
    (comp,) = store.compactions("sec")
    row = json.dumps(comp.report) + json.dumps(comp.config)
    assert key not in row and "pa55word" not in row and "AIzaSy" not in row
    assert MARK in row
    clear_secrets()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=st.text(alphabet="a()+*?|.^$[]{}\\b1", min_size=1, max_size=24))
def test_any_pattern_is_an_answer_or_an_input_error(pattern: str) -> None:
    try:
        find = compile_pattern(pattern)
    except InputError:
        return
    result = find("a" * 3_000 + "!")
    assert result is None or (0 <= result[0] <= result[1] <= 3_001)


_texts = st.text(max_size=6) | st.lists(st.sampled_from(["a", "é", "中", "\ud800", "\udfff", "\u2028", '"', "\\"]), max_size=6).map("".join)
_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _texts,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(_texts, kids, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_texts, _values, max_size=5))
def test_canonical_json_is_sorted_compact_json_with_lone_surrogates_escaped(message: dict[str, object]) -> None:
    text = canonical_json(message)
    assert text == dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    text.encode("utf-8")  # always encodable (a lone surrogate is written as its escape)


_plain_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.text(max_size=8) | _texts,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4) | _texts, kids, max_size=3),
    max_leaves=16,
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(max_size=4) | _texts, _plain_values, max_size=5))
def test_canonical_json_without_floats_is_byte_for_byte_the_reference_encoding(message: dict[str, object]) -> None:
    # messages without floats take the fast encoder: every control character, quote, backslash,
    # line separator, non-BMP character, 64-bit boundary and key order must come out exactly as
    # the reference encoder writes them, or a message would change its content hash
    assert canonical_json(message) == dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "\x00\x1f\x7f\b\t\n\f\r\"\\/\u2028\u2029\U0001f600"},
        {"role": "tool", "content": "", "n": 2**63 - 1, "m": -(2**63), "big": 2**64},
        {"b": {"é": 1, "z": 2, "\U0001f600": 3, "\uffff": 4, "": 0}, "a": [True, False, None, [], {}]},
        {"role": "user", "content": "lone \ud800"},
        {"role": "user", "content": "x", "score": 1e-07, "other": 1e16, "t": (1, 2)},
    ],
)
def test_canonical_json_edge_cases_match_the_reference_encoding(message: dict[str, object]) -> None:
    assert canonical_json(message) == dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
