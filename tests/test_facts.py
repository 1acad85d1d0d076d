"""The preservation-guarantee facts: what counts as a path, URL, tool name and error line."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxengine.facts import (
    _ERROR_NOISE_RE,
    _ERROR_RE,
    MAX_ERROR_LINE,
    Facts,
    context_text,
    error_lines,
    extract_facts,
    missing_facts,
    paths_in,
    retention,
    urls_in,
)


def _reference_error_lines(text: str) -> list[str]:
    """The definition, line by line (what the fast scan must equal)."""
    out: dict[str, None] = {}
    for line in text.splitlines():
        s = line.strip()
        if s and len(s) >= 4 and _ERROR_RE.search(s) and not _ERROR_NOISE_RE.match(s):
            out[s[:MAX_ERROR_LINE].rstrip()] = None
    return list(out)


def _whole(text: str) -> list[str]:
    """Paths never span lines: scanning each line on its own is the reference."""
    seen: dict[str, None] = {}
    for line in text.split("\n"):
        for p in paths_in(line):
            seen[p] = None
    return list(seen)


def test_paths_urls_and_errors_are_found() -> None:
    text = (
        "Reading src/app/main.py and /etc/nginx/nginx.conf, see https://docs.example.com/a/b.html.\n"
        "Traceback (most recent call last):\n"
        "ValueError: bad input\n"
        "Tests run: 5, Failures: 0, Errors: 0\n"
        "com.example.Foo is a class, not a path"
    )
    assert paths_in(text) == ["src/app/main.py", "/etc/nginx/nginx.conf"]
    assert urls_in(text) == ["https://docs.example.com/a/b.html"]
    assert error_lines(text) == ["Traceback (most recent call last):", "ValueError: bad input"]


def test_url_paths_are_not_file_paths() -> None:
    assert paths_in("see https://h.io/usr/lib/x.py only") == []
    assert paths_in("https://h.io/usr/lib/x.py and usr/lib/x.py") == ["usr/lib/x.py"]


def test_long_error_lines_are_cut() -> None:
    line = "error: " + "x" * 1000
    assert error_lines(line) == [line[:MAX_ERROR_LINE]]


@pytest.mark.parametrize(
    "text",
    ["a error\r\nb", "x\x0bfailed here\x0cq", "ünïcode ERROR\nok", "İ error", "0 errors", "Exception", "NullPointerException at x"],
)
def test_fast_error_scan_equals_the_definition_on_edge_cases(text: str) -> None:
    assert error_lines(text) == _reference_error_lines(text)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(["error", "Error:", "not found", "no such", "file", " ", "\n", "x", "0 errors", "Failed", "panic\n", "IOException", "\r"]),
        max_size=40,
    ).map("".join)
)
def test_fast_error_scan_equals_the_definition_on_any_text(text: str) -> None:
    assert error_lines(text) == _reference_error_lines(text)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["error", "errors", "ERROR", "_error", "error_", "2error", "Exception", "exceptions", "java.lang.IOException", "x.yError", "_Error",
             "permission denied", "permission", "denied", "not found", "no such file", "cannot find symbol", "segmentation fault",
             "traceback", "failed", "failure", "fatal", "panic", "Failed:", " ", "\n", ".", "-", "x", "9", "0 errors"]
        ),
        max_size=30,
    ).map("".join)
)
def test_the_words_found_decide_a_line_as_the_pattern_does(text: str) -> None:
    assert error_lines(text) == _reference_error_lines(text)


@pytest.mark.slow
def test_fast_scans_equal_the_definitions_on_every_trajectory(trajectories: list[dict[str, Any]], dataset: Any) -> None:
    texts = [m["content"] for t in trajectories for m in t["messages"] if isinstance(m.get("content"), str)]
    assert len(texts) > (500 if dataset.full else 450)  # 474 on the sample
    for text in texts:
        assert error_lines(text) == _reference_error_lines(text)
        assert paths_in(text) == _whole(text)


def test_extract_facts_by_kind_and_missing() -> None:
    msgs = [
        {"role": "system", "content": "You may read /etc/secret/config.yaml"},
        {"role": "user", "content": "Fix the crash in api/server.py"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "api/server.py"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "KeyError: 'user_id' raised in api/handlers.py\nsee https://bugs.example.org/42"},
    ]
    f = extract_facts(msgs)
    assert f.users == ["Fix the crash in api/server.py"]
    assert f.tools == ["read_file"]
    assert f.paths == ["api/server.py", "api/handlers.py"]  # the system prompt contributes nothing
    assert f.urls == ["https://bugs.example.org/42"]
    assert f.errors == ["KeyError: 'user_id' raised in api/handlers.py"]
    assert len(f) == 6
    gone = missing_facts(f, context_text(msgs[:2]))
    assert gone.urls == ["https://bugs.example.org/42"] and gone.users == [] and gone.tools == ["read_file"]
    merged = f.merge(Facts(paths=["x/y.py", "api/server.py"]))
    assert merged.paths == ["api/server.py", "api/handlers.py", "x/y.py"]


def test_retention_counts_kept_and_retrievable_facts() -> None:
    facts = Facts(users=["do it"], paths=["a/b.py", "c/d.py"], errors=["Error: boom"])
    context = [{"role": "user", "content": "do it"}, {"role": "assistant", "content": "edited a/b.py"}]
    total, kept, missing = retention(facts, context)
    assert total == {"users": 1, "paths": 2, "urls": 0, "tools": 0, "errors": 1}
    assert kept == {"users": 1, "paths": 1, "urls": 0, "tools": 0, "errors": 0}
    assert missing.paths == ["c/d.py"] and missing.errors == ["Error: boom"]
    total, kept, missing = retention(facts, context, retrievable=lambda f: f == "c/d.py")
    assert kept["paths"] == 2 and kept["errors"] == 0 and len(missing) == 1


def test_call_facts_are_name_and_command_line() -> None:
    from ctxengine.facts import call_facts, call_retention

    msgs = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {
                        "name": "bash",
                        "arguments": '{"command": "open src/Foo.java\\nscroll_down"}',
                    },
                },
                {"id": "b", "type": "function", "function": {"name": "submit", "arguments": "{}"}},
            ],
        },
    ]
    assert call_facts(msgs) == ["bash: open src/Foo.java", "submit"]
    record = [
        {
            "role": "tool",
            "tool_call_id": "a",
            "content": "[ctxengine:record] bash: open src/Foo.java -> ok; submit",
        }
    ]
    assert call_retention(call_facts(msgs), record) == (2, 2, [])
    assert call_retention(call_facts(msgs), [{"role": "user", "content": "bash submit"}]) == (
        2,
        1,
        ["bash: open src/Foo.java"],
    )
    kept = call_retention(
        call_facts(msgs),
        [{"role": "user", "content": "bash submit"}],
        lambda t: t == "open src/Foo.java",
    )
    assert kept == (2, 2, [])


def _long(text: str) -> str:
    return (text + "\n") + "filler line without facts\n" * 40


def test_fact_memo_answers_as_the_functions_and_hands_out_new_lists() -> None:
    from ctxengine.facts import FactMemo

    memo = FactMemo()
    text = _long("see src/app/main.py and https://h.io/x.html\nValueError: bad input")
    for _ in range(2):  # the second round comes from the memo
        assert memo.paths(text) == paths_in(text) == ["src/app/main.py"]
        assert memo.urls(text) == urls_in(text) == ["https://h.io/x.html"]
        assert memo.errors(text) == error_lines(text) == ["ValueError: bad input"]
    memo.paths(text).append("edited by a caller")
    assert memo.paths(text) == ["src/app/main.py"]
    assert extract_facts([{"role": "tool", "tool_call_id": "a", "content": text}], memo=memo) == extract_facts(
        [{"role": "tool", "tool_call_id": "a", "content": text}]
    )


def test_fact_memo_is_bounded_and_skips_short_texts() -> None:
    from ctxengine.facts import FactMemo

    memo = FactMemo(min_chars=100, max_chars=3_000)
    texts = [_long(f"file{i}/part.py") for i in range(6)]  # ~1,050 characters each
    for t in texts:
        assert memo.paths(t) == [t.split("\n")[0]]
    assert 0 < len(memo._memo) <= 2  # the oldest were dropped to stay under max_chars
    assert ("paths", texts[-1]) in memo._memo and ("paths", texts[0]) not in memo._memo
    assert memo._held == sum(len(t) for _, t in memo._memo)
    memo.paths("a/b.py is short")
    assert ("paths", "a/b.py is short") not in memo._memo
    memo.clear()
    assert not memo._memo and memo._held == 0


def test_fact_memo_survives_deep_copy_and_pickle() -> None:
    import copy
    import pickle

    from ctxengine.facts import FactMemo

    memo = FactMemo()
    text = _long("see src/app/main.py")
    memo.paths(text)
    for clone in (copy.deepcopy(memo), pickle.loads(pickle.dumps(memo))):
        assert clone.paths(text) == ["src/app/main.py"] and ("paths", text) in clone._memo
        clone.clear()
        assert ("paths", text) in memo._memo  # each copy has its own dictionary
        assert clone.errors(_long("Error: x")) == ["Error: x"]
