"""A damaged session export is refused whole: every record and field checked before the store
is written, the error naming the record and the field (issue 24, item 2)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from ctxengine.errors import InputError
from ctxengine.store import SqliteStore
from ctxengine.store.export_doc import COMPACTION, EVENT, MESSAGE, NODE, SESSION, validate_export

SECTIONS = {"messages": MESSAGE, "events": EVENT, "compactions": COMPACTION, "nodes": NODE}


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real export: messages, an lcm compaction (a node, events)."""
    from ctxengine import ContextManager
    from ctxengine.config import Config

    path = tmp_path_factory.mktemp("exp") / "s.db"
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for t in range(30):
        msgs += [{"role": "user", "content": f"request {t} " + "tidy " * 30}, {"role": "assistant", "content": f"done {t} " + "details " * 40}]
    ctx = ContextManager.from_config(Config.from_dict({"context": {"engine": "lcm"}, "store": {"path": str(path)}}), model="gpt-4o", context_length=4_000, session_id="s1")
    ctx.prepare(msgs)
    with SqliteStore(path) as store:
        doc = store.export_session("s1")
    assert doc["compactions"] and doc["events"] and doc["nodes"] and doc["messages"]
    return doc


def _cases(doc: dict[str, Any]) -> list[tuple[str, int | None, str]]:
    out: list[tuple[str, int | None, str]] = [("session", None, "id")]
    for section, fields in SECTIONS.items():
        for i in (0, len(doc[section]) - 1):
            out += [(section, i, f) for f, (_check, required) in fields.items() if required]
    return out


def test_a_whole_export_is_valid_and_imports(export: dict[str, Any], tmp_path: Path) -> None:
    validate_export(export)
    with SqliteStore(tmp_path / "t.db") as store:
        assert store.import_session(export, session_id="copy") == "copy"
        assert len(store.compactions("copy")) == len(export["compactions"])
        assert len(store.events("copy")) == len(export["events"])


def test_every_missing_field_of_every_record_is_named_and_nothing_is_written(export: dict[str, Any], tmp_path: Path) -> None:
    cases = _cases(export)
    assert len(cases) > 30
    with SqliteStore(tmp_path / "t.db") as store:
        for section, i, field in cases:
            doc = copy.deepcopy(export)
            record = doc[section] if i is None else doc[section][i]
            del record[field]
            with pytest.raises(InputError) as info:
                store.import_session(doc, session_id="copy")
            where = section if i is None else f"{section}[{i}]"
            assert where in str(info.value) and repr(field) in str(info.value), str(info.value)
            assert "missing field" in str(info.value)
            assert store.list_sessions() == []  # nothing written, not even the session row


@pytest.mark.parametrize(
    ("section", "field", "value", "expected"),
    [
        ("compactions", "tokens_before", "lots", "must be a non-negative integer"),
        ("compactions", "created_at", None, "must be a number"),
        ("compactions", "replaced", "abc", "must be a list of ids"),
        ("compactions", "before_tip", "feedface", "not in the export"),
        ("events", "compaction", "nope", "names compaction 'nope'"),
        ("events", "created_at", True, "must be a number"),
        ("events", "tip", 7, "must be a non-empty string or null"),
        ("nodes", "children", [["message", "missing"]], "names message 'missing'"),
        ("nodes", "children", [["blob", "x"]], '["message"|"node", id] pairs'),
        ("nodes", "depth", -1, "must be a non-negative integer"),
        ("messages", "parent", "unknown", "an earlier message"),
        ("messages", "message", "text", "must be an object"),
    ],
)
def test_a_bad_value_or_a_dangling_reference_is_named(export: dict[str, Any], tmp_path: Path, section: str, field: str, value: Any, expected: str) -> None:
    doc = copy.deepcopy(export)
    doc[section][0][field] = value
    with SqliteStore(tmp_path / "t.db") as store:
        with pytest.raises(InputError, match=rf"record {section}\[0\]") as info:
            store.import_session(doc)
        assert expected in str(info.value), str(info.value)
        assert store.list_sessions() == []


@pytest.mark.parametrize("section", ["messages", "events", "compactions", "nodes"])
def test_a_record_that_is_not_an_object_or_a_missing_list_is_named(export: dict[str, Any], section: str) -> None:
    doc = copy.deepcopy(export)
    doc[section][-1] = "cut"
    with pytest.raises(InputError, match=rf"record {section}\[{len(doc[section]) - 1}\] is a str"):
        validate_export(doc)
    del doc[section]
    with pytest.raises(InputError, match=f"the '{section}' list is missing"):
        validate_export(doc)


def test_a_session_record_that_is_cut_short_is_named(export: dict[str, Any]) -> None:
    doc = copy.deepcopy(export)
    doc["session"] = {"id": "s1", "tip": "0" * 32}
    with pytest.raises(InputError, match="record session: field 'tip' names message"):
        validate_export(doc)
    assert set(SESSION) >= {"id", "tip"}
