"""Reading and writing session files.

Accepted inputs (by content, not extension):

* a JSON list of messages;
* a JSON object with a ``messages`` list (optional ``id``, ``tools``, ``meta``);
* JSON Lines, one such object (or list) per line — the format of agent trajectory dumps.

Errors name the file, the line (for JSONL) and the problem; they never surface as a traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxengine.errors import InputError
from ctxengine.messages import Message

__all__ = ["Session", "dump_session", "iter_sessions", "parse_sessions", "read_sessions"]


@dataclass(slots=True)
class Session:
    """One conversation read from a file."""

    id: str
    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


def _session_from(obj: Any, where: str, default_id: str) -> Session:
    if isinstance(obj, list):
        return Session(default_id, _messages(obj, where))
    if isinstance(obj, dict):
        if "messages" not in obj:
            raise InputError(f"{where}: object has no 'messages' key (keys: {sorted(obj)[:8]})")
        msgs = _messages(obj["messages"], where)
        tools = obj.get("tools") or []
        if not isinstance(tools, list):
            raise InputError(f"{where}: 'tools' must be a list")
        meta = obj.get("meta") or {}
        sid = obj.get("id") or obj.get("session_id") or default_id
        return Session(str(sid), msgs, list(tools), dict(meta) if isinstance(meta, dict) else {"meta": meta})
    raise InputError(f"{where}: expected a list of messages or an object with 'messages', got {type(obj).__name__}")


def _messages(value: Any, where: str) -> list[Message]:
    if not isinstance(value, list):
        raise InputError(f"{where}: 'messages' must be a list, got {type(value).__name__}")
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise InputError(f"{where}: message {i} is a {type(m).__name__}, not an object")
    return value


def parse_sessions(text: str, source: str = "<input>") -> list[Session]:
    """Parse the text of a session file (JSON or JSON Lines) into sessions.

    A text that is not one JSON document is read as JSON Lines when its first line is a JSON
    document by itself; otherwise (a pretty-printed file with a mistake) the error names the
    line and column where JSON parsing stopped. A leading UTF-8 byte-order mark is ignored.
    """
    body = text.removeprefix("\ufeff")
    if not body.strip():
        raise InputError(f"{source}: file is empty")
    try:
        obj = json.loads(body)  # surrounding whitespace is fine and keeps line numbers exact
    except json.JSONDecodeError as exc:
        lines = body.split("\n")  # not splitlines(): U+2028 and U+0085 may occur inside JSON strings
        first = next((ln for ln in lines if ln.strip()), "")
        if sum(1 for ln in lines if ln.strip()) < 2 or not _is_json(first):
            raise InputError(f"{source}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
        return list(_iter_jsonl(lines, source))
    return [_session_from(obj, source, Path(source).stem or "session")]


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def _iter_jsonl(lines: list[str], source: str) -> Iterator[Session]:
    stem = Path(source).stem or "session"
    record = 0
    for n, line in enumerate(lines, 1):  # n: the line number in the file
        if not line.strip():
            continue
        record += 1
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{source}: line {n}: not valid JSON: {exc.msg} at column {exc.colno}") from exc
        yield _session_from(obj, f"{source}: line {n}", f"{stem}-{record}")


def read_sessions(path: str | Path) -> list[Session]:
    """Read sessions from ``path`` (``-`` reads standard input)."""
    if str(path) == "-":
        return parse_sessions(sys.stdin.read(), "<stdin>")
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise InputError(f"{p}: no such file") from exc
    except IsADirectoryError as exc:
        raise InputError(f"{p}: is a directory, not a session file") from exc
    except PermissionError as exc:
        raise InputError(f"{p}: permission denied") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise InputError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    return parse_sessions(text, str(p))


def iter_sessions(path: str | Path) -> Iterator[Session]:
    """Iterate over the sessions of a file."""
    yield from read_sessions(path)


def dump_session(session: Session, *, indent: int | None = 2) -> str:
    """JSON text of a session in the ``{"id", "messages", "tools", "meta"}`` form."""
    obj: dict[str, Any] = {"id": session.id, "messages": session.messages}
    if session.tools:
        obj["tools"] = session.tools
    if session.meta:
        obj["meta"] = session.meta
    return json.dumps(obj, ensure_ascii=False, indent=indent)
