"""The store's value types: what reads return (sessions, events, compactions, summary nodes,
search hits). Frozen records, built from rows; nothing here touches a database."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["CompactionInfo", "Event", "NodeInfo", "SearchHit", "SearchMode", "SessionInfo"]


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session: its tip, the length of its current history, stored messages, compactions."""

    id: str
    tip: str | None
    length: int
    stored: int
    compactions: int
    created_at: float
    updated_at: float
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Event:
    """One tip move. ``number`` is its 1-based rank in the session (the ``event:N`` point)."""

    number: int
    kind: Literal["messages", "append", "compaction", "restore", "import"] | str
    tip: str | None
    length: int
    compaction: str | None
    created_at: float


@dataclass(frozen=True, slots=True)
class CompactionInfo:
    """A compaction event: what ran, what it cost and saved, what it replaced."""

    id: str
    session_id: str
    created_at: float
    engine: str
    config: dict[str, Any]
    report: dict[str, Any]
    tokens_before: int
    tokens_after: int
    before_tip: str | None
    after_tip: str | None
    replaced: list[str]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A summary node: its text, depth, children (``("message"|"node", id)``) and parents."""

    id: str
    session_id: str
    depth: int
    text: str
    tokens: int
    created_at: float
    meta: dict[str, Any]
    children: list[tuple[str, str]]
    parents: list[str]


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One search result.

    ``kind`` is ``message`` or ``node``; ``id`` the message (or node) id; ``snippet`` the lines
    around the match, verbatim, with the match whole; ``message_ids`` every message of the scope
    carrying this exact content; ``node_ids`` the summary nodes that cover them.
    """

    kind: Literal["message", "node"]
    id: str
    role: str
    snippet: str
    session_ids: list[str] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)
    node_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "id": self.id,
            "role": self.role,
            "snippet": self.snippet,
            "session_ids": list(self.session_ids),
            "message_ids": list(self.message_ids),
            "node_ids": list(self.node_ids),
        }


SearchMode = Literal["text", "regex"]
