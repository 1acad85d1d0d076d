"""Bad input on every CLI path: exit 2 with one line naming the problem (and the index), never
a traceback, never exit 0 with a bad message dropped. Real processes, real files."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxengine.errors import InputError
from ctxengine.io import parse_document, read_text
from ctxengine.messages import validate
from ctxengine.textsafe import dumps

CALL = {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
BAD_SESSIONS: dict[str, tuple[str, str]] = {
    "orphan-result": (json.dumps([{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "x", "content": "r"}]), r"\[1\] result_without_call"),
    "duplicate-ids": (json.dumps([{"role": "assistant", "content": "", "tool_calls": [CALL, CALL]}, {"role": "tool", "tool_call_id": "a", "content": "r"}]), r"\[0\] duplicate_tool_call_id"),
    "content-42": (json.dumps([{"role": "user", "content": 42}]), r"\[0\] bad_content"),
    "missing-role": (json.dumps([{"role": "user", "content": "a"}, {"content": "no role"}]), r"\[1\] missing_role"),
    "nan": ('[{"role": "user", "content": "x", "score": NaN}]', r"\[0\] not_json: score is nan"),
    "infinity": ('[{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "meta": {"v": -Infinity}}]', r"\[1\] not_json: meta.v is -inf"),
    "deep": ("[" * 50_000 + "]" * 50_000, "nested too deeply"),
    "truncated": ('[{"role": "user", "content": "x"', "not valid JSON"),
}


def cli(*args: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "HOME": str(cwd), "XDG_DATA_HOME": str(cwd / "data"), "PYTHONIOENCODING": "utf-8"}
    env.pop("CTXENGINE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "ctxengine", *args], cwd=cwd, env=env, input=stdin, capture_output=True, timeout=120)


def one_error_line(proc: subprocess.CompletedProcess[bytes]) -> str:
    err = proc.stderr.decode("utf-8", "replace").strip()
    assert proc.returncode == 2, (proc.returncode, err[-2000:])
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("ctxengine: error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("engine", ["rules", "compressor", "lcm"])
@pytest.mark.parametrize("case", sorted(BAD_SESSIONS))
def test_compact_names_bad_input_for_every_engine(tmp_path: Path, case: str, engine: str) -> None:
    text, expected = BAD_SESSIONS[case]
    (tmp_path / "in.json").write_text(text, encoding="utf-8")
    line = one_error_line(cli("compact", "in.json", "--engine", engine, cwd=tmp_path))
    assert "returned an invalid chat" not in line  # never blamed on the engine
    assert re.search(expected, line), line


def test_bom_u2028_and_lone_surrogates_are_read_and_written(tmp_path: Path) -> None:
    msgs = [{"role": "user", "content": "line\u2028sep \ud800 alone"}, {"role": "assistant", "content": "ok"}]
    # raw U+2028 inside a string, the lone surrogate as the JSON escape \ud800 (a file cannot hold it raw)
    jsonl = "\n".join(dumps({"id": f"s{i}", "messages": msgs}) for i in range(2)) + "\n"
    assert "\u2028" in jsonl and "\\ud800" in jsonl
    (tmp_path / "in.jsonl").write_bytes(b"\xef\xbb\xbf" + jsonl.encode("utf-8"))
    proc = cli("compact", "in.jsonl", "--engine", "rules", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")
    out = [json.loads(line) for line in proc.stdout.decode("utf-8").split("\n") if line]
    assert [o["messages"] for o in out] == [msgs, msgs]  # exact, lone surrogate included


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (bytes(range(256)) * 8, "not UTF-8"),
        (b'{"format": "ctxengine.session/1", "session": {"id": "a"', "not valid JSON"),
        (b"[" * 50_000 + b"]" * 50_000, "nested too deeply"),
        (b"[1, 2]", "not a session export"),
        (b'{"format": "ctxengine.session/1", "session": {"id": "a"}, "messages": [{"id": "x"}]}', "session export"),
        (b"\x00\x00\x00", "binary"),
        (b"", "not valid JSON"),
    ],
    ids=["binary", "truncated", "deep", "list", "missing-fields", "nul", "empty"],
)
def test_sessions_restore_from_bad_files(tmp_path: Path, content: bytes, expected: str) -> None:
    (tmp_path / "export.json").write_bytes(content)
    line = one_error_line(cli("sessions", "restore", "--from", "export.json", "--store", str(tmp_path / "s.db"), cwd=tmp_path))
    assert expected in line, line


@pytest.mark.parametrize(("section", "field"), [("compactions", "engine"), ("compactions", "after_tip"), ("events", "created_at"), ("events", "kind"), ("nodes", "children")])
def test_sessions_restore_from_an_export_with_a_record_cut_short(tmp_path: Path, section: str, field: str) -> None:
    from ctxengine.store import SqliteStore

    msgs = [{"role": "user", "content": f"u{i} " * 20} if i % 2 == 0 else {"role": "assistant", "content": f"a{i} " * 20} for i in range(6)]
    with SqliteStore(tmp_path / "src.db") as store:
        store.record_messages("s", msgs)
        report = {"engine": "rules", "tokens_before": 100, "tokens_after": 50, "replaced": [0, 1, 2]}
        store.record_compaction("s", report, msgs, msgs[3:])
        store.add_node("s", "n1", depth=0, text="summary", children=[("message", store.history_ids("s", "event:1")[0])])
        doc = store.export_session("s")
    assert doc[section], section
    del doc[section][0][field]
    (tmp_path / "export.json").write_text(json.dumps(doc), encoding="utf-8")
    target = tmp_path / "target.db"
    line = one_error_line(cli("sessions", "restore", "--from", "export.json", "--store", str(target), cwd=tmp_path))
    assert "export.json" in line and f"record {section}[0]" in line and f"missing field {field!r}" in line, line
    assert not target.exists()  # nothing written: the store was not even opened


def test_sessions_commands_survive_lone_surrogates(tmp_path: Path) -> None:
    from ctxengine.store import SqliteStore

    msgs = [{"role": "user", "content": "bad \ud800 text"}, {"role": "assistant", "content": "ok \udfff"}]
    with SqliteStore(tmp_path / "s.db") as store:
        store.record_messages("sur", msgs)
    store_arg = ("--store", str(tmp_path / "s.db"))
    for args in (("show", "sur"), ("list",), ("search", "bad"), ("search", "bad", "--json"), ("restore", "sur", "event:1")):
        proc = cli("sessions", *args, *store_arg, cwd=tmp_path)
        assert proc.returncode == 0, (args, proc.stderr.decode("utf-8", "replace"))
        proc.stdout.decode("utf-8")
    proc = cli("sessions", "export", "sur", *store_arg, cwd=tmp_path)
    assert proc.returncode == 0
    doc = json.loads(proc.stdout)
    assert [m["message"] for m in doc["messages"]] == msgs  # exact
    (tmp_path / "export.json").write_bytes(proc.stdout)
    proc = cli("sessions", "restore", "--from", "export.json", "--as", "copy", *store_arg, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")
    with SqliteStore(tmp_path / "s.db") as store:
        assert store.history("copy") == msgs


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("context:\n  token_counter: exakt\n", "context.token_counter"),
        ("context:\n  token_counter: 'exact:p50k'\n", "unknown token counter"),
        ("models:\n  gpt-x:\n    context_lenght: 5\n", "models.gpt-x.context_lenght"),
        ("models:\n  gpt-x:\n    context_length: '5'\n", "models.gpt-x.context_length"),
        ("model:\n  context_length: 0\n", "model.context_length"),
    ],
)
def test_compact_refuses_bad_config_at_load_time(tmp_path: Path, config: str, expected: str) -> None:
    (tmp_path / "c.yaml").write_text(config, encoding="utf-8")
    (tmp_path / "in.json").write_text(json.dumps([{"role": "user", "content": "hi"}]), encoding="utf-8")
    line = one_error_line(cli("compact", "in.json", "--config", "c.yaml", cwd=tmp_path))
    assert expected in line and "c.yaml" in line


BAD_STORES = {
    "a-directory": "store:\n  path: {tmp}\n",
    "not-a-database": "store:\n  path: {tmp}/junk.db\n",
    "under-a-file": "store:\n  path: {tmp}/junk.db/sessions.db\n",
    "postgres-without-dsn": "store:\n  backend: postgres\n  dsn_env: CTXENGINE_TEST_UNSET_DSN\n",
}


@pytest.mark.parametrize("case", sorted(BAD_STORES))
def test_the_cli_refuses_the_store_configs_the_library_refuses(tmp_path: Path, case: str) -> None:
    # one validation for every entry point: what ContextManager.from_config refuses, every
    # engine of `ctxengine compact` refuses with the same message (it exited 0 before)
    from ctxengine import ContextManager
    from ctxengine.config import load_config
    from ctxengine.errors import ConfigError, StoreError

    (tmp_path / "junk.db").write_bytes(b"this is not a database" * 100)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BAD_STORES[case].format(tmp=tmp_path), encoding="utf-8")
    with pytest.raises((StoreError, ConfigError)) as lib:
        ContextManager.from_config(load_config(cfg), model="gpt-4o")
    expected = str(lib.value)
    (tmp_path / "in.json").write_text(json.dumps([{"role": "user", "content": "hi"}]), encoding="utf-8")
    for engine in ("rules", "compressor", "lcm"):
        line = one_error_line(cli("compact", "in.json", "--config", "c.yaml", "--engine", engine, cwd=tmp_path))
        assert expected in line, (engine, line, expected)


@pytest.mark.parametrize("n", ["0", "-5"])
def test_a_non_positive_context_length_is_a_config_error(tmp_path: Path, n: str) -> None:
    (tmp_path / "in.json").write_text(json.dumps([{"role": "user", "content": "hi"}]), encoding="utf-8")
    line = one_error_line(cli("compact", "in.json", f"--context-length={n}", cwd=tmp_path))
    assert "--context-length" in line


# -- the readers and validate, over open-ended input ---------------------------------------------------

json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6) | st.binary(max_size=4) | st.sets(st.integers(), max_size=2),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4) | st.integers(), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(extra=json_like)
def test_non_json_values_are_rejected_with_the_index_or_storable(extra: Any) -> None:
    from ctxengine.store.base import canonical_json

    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok", "x": extra}]
    errors = [v for v in validate(msgs) if v.code == "not_json"]
    try:
        canonical_json(msgs[1])
        storable = True
    except InputError:
        storable = False
    # one rule: validate rejects exactly what the store could not record
    assert bool(errors) == (not storable)
    if errors:
        assert errors[0].index == 1


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=300))
def test_the_session_reader_never_crashes_on_bytes(data: bytes, tmp_path_factory: pytest.TempPathFactory) -> None:
    p = tmp_path_factory.mktemp("r") / "f.json"
    p.write_bytes(data)
    with contextlib.suppress(InputError):  # a named error is fine; anything else fails the test
        parse_document(read_text(p), str(p))
