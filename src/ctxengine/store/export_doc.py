"""Validation of a session export (``sessions export``) before any of it is imported.

An export is a file: it may be cut short, edited by hand or written by another version. Every
record is checked before the store is touched (:meth:`SessionStore.import_session` writes in two
steps, so a record found bad halfway would leave half a session behind): each field present
with its type, and every reference (a parent, a tip, an event's compaction, a node's children)
naming a record of the same export. The first problem is an :class:`~ctxengine.errors.InputError`
naming the record (``compactions[2] (id 'c0…')``) and the field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ctxengine.errors import InputError

__all__ = ["ValidExport", "validate_export"]

EXPORT_FORMAT = "ctxengine.session/1"

_Check = Callable[[Any], bool]


def _str(v: Any) -> bool:
    return isinstance(v, str) and bool(v)


def _opt_str(v: Any) -> bool:
    return v is None or _str(v)


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def _text(v: Any) -> bool:
    return isinstance(v, str)


def _opt_num(v: Any) -> bool:
    return v is None or _num(v)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _obj(v: Any) -> bool:
    return isinstance(v, dict)


def _opt_obj(v: Any) -> bool:
    return v is None or isinstance(v, dict)


def _ids(v: Any) -> bool:
    return isinstance(v, list) and all(_str(x) for x in v)


def _children(v: Any) -> bool:
    return (
        isinstance(v, list)
        and bool(v)
        and all(isinstance(c, list | tuple) and len(c) == 2 and c[0] in ("message", "node") and _str(c[1]) for c in v)
    )


_WHAT: dict[_Check, str] = {
    _str: "a non-empty string",
    _opt_str: "a non-empty string or null",
    _text: "a string",
    _num: "a number",
    _opt_num: "a number or null",
    _int: "a non-negative integer",
    _obj: "an object",
    _opt_obj: "an object or null",
    _ids: "a list of ids",
    _children: 'a non-empty list of ["message"|"node", id] pairs',
}

SESSION: dict[str, tuple[_Check, bool]] = {"id": (_str, True), "created_at": (_opt_num, False), "updated_at": (_opt_num, False), "meta": (_opt_obj, False), "tip": (_opt_str, False)}
MESSAGE: dict[str, tuple[_Check, bool]] = {"id": (_str, True), "parent": (_opt_str, True), "message": (_obj, True)}
EVENT: dict[str, tuple[_Check, bool]] = {"kind": (_str, True), "tip": (_opt_str, True), "compaction": (_opt_str, True), "created_at": (_num, True)}
COMPACTION: dict[str, tuple[_Check, bool]] = {
    "id": (_str, True),
    "created_at": (_num, True),
    "engine": (_str, True),
    "config": (_obj, True),
    "report": (_obj, True),
    "tokens_before": (_int, True),
    "tokens_after": (_int, True),
    "before_tip": (_opt_str, True),
    "after_tip": (_opt_str, True),
    "replaced": (_ids, True),
}
NODE: dict[str, tuple[_Check, bool]] = {"id": (_str, True), "depth": (_int, True), "text": (_text, True), "meta": (_opt_obj, False), "children": (_children, True)}
"""Fields of each record: ``name: (check, required)``; an optional field may be absent."""


@dataclass(frozen=True, slots=True)
class ValidExport:
    """An export whose every record was checked (the records as in the document)."""

    session: dict[str, Any]
    messages: list[dict[str, Any]]
    events: list[dict[str, Any]]
    compactions: list[dict[str, Any]]
    nodes: list[dict[str, Any]]


def _name(section: str, i: int | None, rec: Any) -> str:
    where = section if i is None else f"{section}[{i}]"
    rid = rec.get("id") if isinstance(rec, dict) else None
    return f"{where} (id {rid!r})" if isinstance(rid, str) and rid else where


def _record(section: str, i: int | None, rec: Any, fields: Mapping[str, tuple[_Check, bool]]) -> dict[str, Any]:
    if not isinstance(rec, dict):
        raise InputError(f"damaged session export: record {_name(section, i, rec)} is a {type(rec).__name__}, not an object")
    for key, (check, required) in fields.items():
        if key not in rec:
            if required:
                raise InputError(f"damaged session export: record {_name(section, i, rec)} is missing field {key!r}")
            continue
        if not check(rec[key]):
            raise InputError(f"damaged session export: record {_name(section, i, rec)}: field {key!r} must be {_WHAT[check]}, not {_show(rec[key])}")
    return rec


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _list(doc: Mapping[str, Any], section: str) -> list[Any]:
    if section not in doc:
        raise InputError(f"damaged session export: the {section!r} list is missing")
    v = doc[section]
    if not isinstance(v, list):
        raise InputError(f"damaged session export: {section!r} must be a list, not a {type(v).__name__}")
    return v


def _ref(what: str, rid: str | None, known: Mapping[str, Any] | set[str], field_name: str, target: str) -> None:
    if rid is not None and rid not in known:
        raise InputError(f"damaged session export: record {what}: field {field_name!r} names {target} {rid!r}, which is not in the export")


def validate_export(document: Any) -> ValidExport:
    """Check every record of an export document (see the module docstring); return them."""
    if not isinstance(document, Mapping) or document.get("format") != EXPORT_FORMAT:
        raise InputError(f"not a ctxengine session export (expected format {EXPORT_FORMAT!r})")
    if "session" not in document:
        raise InputError("damaged session export: the 'session' record is missing")
    session = _record("session", None, document["session"], SESSION)
    messages = [_record("messages", i, r, MESSAGE) for i, r in enumerate(_list(document, "messages"))]
    events = [_record("events", i, r, EVENT) for i, r in enumerate(_list(document, "events"))]
    comps = [_record("compactions", i, r, COMPACTION) for i, r in enumerate(_list(document, "compactions"))]
    nodes = [_record("nodes", i, r, NODE) for i, r in enumerate(_list(document, "nodes"))]
    seen: set[str] = set()
    for i, m in enumerate(messages):
        _ref(_name("messages", i, m), m["parent"], seen, "parent", "an earlier message")
        seen.add(m["id"])
    _ref("session", session.get("tip"), seen, "tip", "message")
    comp_ids: set[str] = set()
    for i, c in enumerate(comps):
        for f in ("before_tip", "after_tip"):
            _ref(_name("compactions", i, c), c[f], seen, f, "message")
        comp_ids.add(c["id"])
    for i, e in enumerate(events):
        _ref(_name("events", i, e), e["tip"], seen, "tip", "message")
        _ref(_name("events", i, e), e["compaction"], comp_ids, "compaction", "compaction")
    node_ids: set[str] = set()
    for i, n in enumerate(nodes):
        for kind, cid in n["children"]:
            _ref(_name("nodes", i, n), cid, seen if kind == "message" else node_ids, "children", f"an earlier {kind}" if kind == "node" else "message")
        node_ids.add(n["id"])
    return ValidExport(session, messages, events, comps, nodes)
