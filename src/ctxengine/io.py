"""Reading and writing session files.

Accepted inputs (by content, not extension):

* a JSON list of messages;
* a JSON object with a ``messages`` list (optional ``id``, ``tools``, ``meta``);
* JSON Lines, one such object (or list) per line — the format of agent trajectory dumps.

Errors name the file, the line (for JSONL) and the problem; they never surface as a traceback:
a binary or non-UTF-8 file, a truncated document, JSON nested deeper than the parser allows
and an empty file are each an :class:`~ctxengine.errors.InputError`. A leading UTF-8 byte-order
mark is ignored; JSON Lines are split at ``\n`` only, so a raw U+2028 inside a string is text.
Strings with lone surrogates (``"\ud800"`` escapes) are kept as they are
(see :mod:`ctxengine.textsafe`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ctxengine.errors import InputError
from ctxengine.messages import Message
from ctxengine.textsafe import dumps

__all__ = [
    "Document",
    "Session",
    "dump_session",
    "iter_sessions",
    "loads_json",
    "parse_document",
    "parse_sessions",
    "read_document",
    "read_sessions",
    "read_text",
]


@dataclass(slots=True)
class Session:
    """One conversation read from a file."""

    id: str
    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Document:
    """A parsed session file: its sessions, its shape (``list``, ``object`` or ``jsonl``) and
    the raw JSON values (one per session), so a tool can write results back in the same shape."""

    sessions: list[Session]
    shape: Literal["list", "object", "jsonl"]
    raw: list[Any]


def loads_json(text: str, source: str, line: int | None = None) -> Any:
    """:func:`json.loads` whose failures are :class:`InputError` naming ``source`` (and the
    line of a JSON Lines file): syntax errors with line and column, nesting too deep for the
    parser (``RecursionError``) included. Raises ``json.JSONDecodeError`` never."""
    where = f"{source}: line {line}" if line is not None else source
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        at = f"column {exc.colno}" if line is not None else f"line {exc.lineno} column {exc.colno}"
        raise InputError(f"{where}: not valid JSON: {exc.msg} at {at}") from None
    except RecursionError:
        raise InputError(f"{where}: JSON nested too deeply to read") from None


def read_text(path: str | Path, what: str = "file") -> str:
    """The UTF-8 text of ``path`` (``-``: standard input) without a leading byte-order mark;
    binary, unreadable or missing files are an :class:`InputError` naming the file."""
    if str(path) == "-":
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8", "surrogateescape")
        name = "<stdin>"
    else:
        p = Path(path)
        name = str(p)
        try:
            data = p.read_bytes()
        except FileNotFoundError as exc:
            raise InputError(f"{p}: no such file") from exc
        except IsADirectoryError as exc:
            raise InputError(f"{p}: is a directory, not a {what}") from exc
        except PermissionError as exc:
            raise InputError(f"{p}: permission denied") from exc
        except OSError as exc:
            raise InputError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: not UTF-8 text, is it a binary file? ({exc.reason} at byte {exc.start})") from None
    if "\x00" in text:
        raise InputError(f"{name}: holds NUL bytes: a binary file, not a {what}")
    return text.removeprefix("\ufeff")


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


def parse_document(text: str, source: str = "<input>") -> Document:
    """Parse the text of a session file (JSON or JSON Lines) into a :class:`Document`.

    A text that is not one JSON document is read as JSON Lines when its first line is a JSON
    document by itself; otherwise (a pretty-printed file with a mistake) the error names the
    line and column where JSON parsing stopped. A leading UTF-8 byte-order mark is ignored.
    """
    body = text.removeprefix("\ufeff")
    if not body.strip():
        raise InputError(f"{source}: file is empty")
    try:
        obj = json.loads(body)  # surrounding whitespace is fine and keeps line numbers exact
    except RecursionError:
        raise InputError(f"{source}: JSON nested too deeply to read") from None
    except json.JSONDecodeError as exc:
        lines = body.split("\n")  # not splitlines(): U+2028 and U+0085 may occur inside JSON strings
        first = next((ln for ln in lines if ln.strip()), "")
        if sum(1 for ln in lines if ln.strip()) < 2 or not _is_json(first):
            raise InputError(f"{source}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        raws: list[Any] = []
        sessions: list[Session] = []
        stem = Path(source).stem or "session"
        for n, line in enumerate(lines, 1):  # n: the line number in the file
            if not line.strip():
                continue
            raw = loads_json(line, source, n)
            raws.append(raw)
            sessions.append(_session_from(raw, f"{source}: line {n}", f"{stem}-{len(raws)}"))
        return Document(sessions, "jsonl", raws)
    session = _session_from(obj, source, Path(source).stem or "session")
    return Document([session], "list" if isinstance(obj, list) else "object", [obj])


def parse_sessions(text: str, source: str = "<input>") -> list[Session]:
    """The sessions of a session file's text (see :func:`parse_document`)."""
    return parse_document(text, source).sessions


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return False
    return True


def read_document(path: str | Path) -> Document:
    """Read and parse the session file at ``path`` (``-`` reads standard input)."""
    name = "<stdin>" if str(path) == "-" else str(Path(path))
    return parse_document(read_text(path, "session file"), name)


def read_sessions(path: str | Path) -> list[Session]:
    """Read sessions from ``path`` (``-`` reads standard input)."""
    return read_document(path).sessions


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
    return dumps(obj, indent=indent)
