"""ctxengine.io: the three accepted shapes, stdin, and one clear error per bad file."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from ctxengine.errors import InputError
from ctxengine.io import Session, dump_session, iter_sessions, parse_sessions, read_sessions

MSGS: list[dict[str, Any]] = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "fix it"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "ok"},
]


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return p


# -- accepted shapes --------------------------------------------------------------------------------


def test_json_list(tmp_path: Path) -> None:
    [s] = read_sessions(write(tmp_path, "chat.json", json.dumps(MSGS, indent=2)))
    assert s.id == "chat"
    assert s.messages == MSGS
    assert s.tools == [] and s.meta == {}


def test_json_object_with_id_tools_meta(tmp_path: Path) -> None:
    obj = {"id": "sess-1", "messages": MSGS, "tools": [{"type": "function", "function": {"name": "bash"}}], "meta": {"model": "gpt-4o"}, "extra": 1}
    [s] = read_sessions(write(tmp_path, "x.json", json.dumps(obj)))
    assert (s.id, s.messages, s.tools, s.meta) == ("sess-1", MSGS, obj["tools"], {"model": "gpt-4o"})


def test_json_object_session_id_and_defaults(tmp_path: Path) -> None:
    [s] = read_sessions(write(tmp_path, "y.json", json.dumps({"session_id": "abc", "messages": [], "tools": None, "meta": "note"})))
    assert s.id == "abc" and s.messages == [] and s.tools == []
    assert s.meta == {"meta": "note"}
    [t] = read_sessions(write(tmp_path, "z.json", json.dumps({"messages": MSGS})))
    assert t.id == "z"


def test_jsonl_records(tmp_path: Path) -> None:
    lines = [
        json.dumps({"id": "a", "messages": MSGS}),
        "",
        json.dumps({"messages": MSGS[:2]}),
        json.dumps(MSGS[:1]),  # a bare list per line is accepted too
    ]
    sessions = read_sessions(write(tmp_path, "many.jsonl", "\n".join(lines) + "\n"))
    assert [s.id for s in sessions] == ["a", "many-2", "many-3"]
    assert [len(s.messages) for s in sessions] == [4, 2, 1]


def test_jsonl_with_crlf_and_unicode_separators(tmp_path: Path) -> None:
    tricky = [{"role": "user", "content": "line\u2028sep\u0085next\u2029para"}]
    line = json.dumps({"messages": tricky}, ensure_ascii=False)
    sessions = read_sessions(write(tmp_path, "t.jsonl", line + "\r\n" + line + "\r\n"))
    assert len(sessions) == 2
    assert sessions[0].messages == tricky


def test_single_line_jsonl_is_json(tmp_path: Path) -> None:
    [s] = read_sessions(write(tmp_path, "one.jsonl", json.dumps({"id": "only", "messages": MSGS}) + "\n"))
    assert s.id == "only"


def test_byte_order_mark_is_ignored(tmp_path: Path) -> None:
    [s] = read_sessions(write(tmp_path, "bom.json", "\ufeff" + json.dumps(MSGS)))
    assert s.messages == MSGS


def test_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"messages": MSGS})))
    [s] = read_sessions("-")
    assert s.messages == MSGS
    assert s.id == "<stdin>"


def test_stdin_jsonl_and_errors_name_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"messages": MSGS}) + "\n" + json.dumps({"messages": []}) + "\n"))
    assert len(read_sessions("-")) == 2
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with pytest.raises(InputError, match=r"^<stdin>: file is empty"):
        read_sessions("-")


def test_iter_sessions(tmp_path: Path) -> None:
    p = write(tmp_path, "m.jsonl", "\n".join(json.dumps({"messages": MSGS}) for _ in range(3)))
    assert [s.id for s in iter_sessions(p)] == ["m-1", "m-2", "m-3"]


@pytest.mark.slow
def test_real_trajectories(trajectories: list[dict[str, Any]], data_dir: Path) -> None:
    sessions = [s for f in sorted(data_dir.glob("*.jsonl")) for s in read_sessions(f)]
    assert len(sessions) == len(trajectories)
    assert [s.id for s in sessions] == [t["id"] for t in trajectories]
    assert all(s.messages == t["messages"] and s.tools == t["tools"] for s, t in zip(sessions, trajectories, strict=True))


# -- errors: one clear InputError naming the file (and line) ------------------------------------


@pytest.mark.parametrize("text", ["", "   \n\n  \t\n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    p = write(tmp_path, "empty.json", text)
    with pytest.raises(InputError, match="file is empty") as info:
        read_sessions(p)
    assert str(p) in str(info.value)


def test_broken_single_line_json(tmp_path: Path) -> None:
    p = write(tmp_path, "b.json", '{"messages": [}')
    with pytest.raises(InputError) as info:
        read_sessions(p)
    assert str(info.value) == f"{p}: not valid JSON: Expecting value at line 1 column 15"


def test_broken_pretty_json_names_the_real_line(tmp_path: Path) -> None:
    text = '[\n  {"role": "system", "content": "sys"},\n  {"role": "user", "content": "hi"},\n  {"role": "assistant", "content": "x",}\n]\n'
    p = write(tmp_path, "pretty.json", text)
    with pytest.raises(InputError) as info:
        read_sessions(p)
    # the trailing comma on line 4, not "line 1" of a JSON Lines reading
    assert str(info.value) == f"{p}: not valid JSON: Expecting property name enclosed in double quotes at line 4 column 40"


def test_broken_pretty_json_with_leading_blank_lines(tmp_path: Path) -> None:
    p = write(tmp_path, "lead.json", '\n\n[\n  {"role": "user" "content": "hi"}\n]\n')
    with pytest.raises(InputError, match="at line 4 column 19"):
        read_sessions(p)


def test_broken_jsonl_line_is_named(tmp_path: Path) -> None:
    good = json.dumps({"messages": MSGS})
    p = write(tmp_path, "b.jsonl", f"{good}\n\n{good}\n{{bad json\n{good}\n")
    with pytest.raises(InputError) as info:
        read_sessions(p)
    assert str(info.value).startswith(f"{p}: line 4: not valid JSON:")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("42", "expected a list of messages or an object with 'messages', got int"),
        ('"hello"', "got str"),
        ("null", "got NoneType"),
        ('{"msgs": []}', "object has no 'messages' key (keys: ['msgs'])"),
        ('{"messages": "hi"}', "'messages' must be a list, got str"),
        ('{"messages": {"role": "user"}}', "'messages' must be a list, got dict"),
        ('[{"role": "user"}, "oops"]', "message 1 is a str, not an object"),
        ('{"messages": [], "tools": {"a": 1}}', "'tools' must be a list"),
    ],
)
def test_wrong_shapes(tmp_path: Path, text: str, needle: str) -> None:
    p = write(tmp_path, "w.json", text)
    with pytest.raises(InputError) as info:
        read_sessions(p)
    assert str(p) in str(info.value)
    assert needle in str(info.value)


def test_wrong_shape_in_jsonl_names_the_line(tmp_path: Path) -> None:
    p = write(tmp_path, "w.jsonl", json.dumps({"messages": MSGS}) + "\n" + json.dumps({"nope": 1}) + "\n")
    with pytest.raises(InputError, match=r"w\.jsonl: line 2: object has no 'messages' key"):
        read_sessions(p)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read_sessions(tmp_path / "absent.json")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory, not a session file"):
        read_sessions(tmp_path)


def test_non_utf8(tmp_path: Path) -> None:
    p = write(tmp_path, "latin.json", '[{"role": "user", "content": "caf\xe9"}]'.encode("latin-1"))
    with pytest.raises(InputError) as info:
        read_sessions(p)
    assert str(info.value).startswith(f"{p}: not UTF-8 text")
    assert "at byte 33" in str(info.value)


def test_errors_are_input_errors_and_value_errors(tmp_path: Path) -> None:
    p = write(tmp_path, "e.json", "{")
    with pytest.raises(ValueError):
        read_sessions(p)


# -- dump ------------------------------------------------------------------------------------------------


def test_dump_session_round_trip(tmp_path: Path) -> None:
    s = Session("s1", MSGS, tools=[{"type": "function"}], meta={"k": "ü"})
    text = dump_session(s)
    assert "ü" in text  # not escaped
    [back] = parse_sessions(text, "x.json")
    assert (back.id, back.messages, back.tools, back.meta) == ("s1", MSGS, [{"type": "function"}], {"k": "ü"})


def test_dump_session_minimal_and_compact() -> None:
    text = dump_session(Session("s2", MSGS[:1]), indent=None)
    assert "\n" not in text
    assert json.loads(text) == {"id": "s2", "messages": MSGS[:1]}


def test_parse_does_not_copy_or_change_messages() -> None:
    [s] = parse_sessions(json.dumps(MSGS), "p.json")
    assert s.messages == MSGS
