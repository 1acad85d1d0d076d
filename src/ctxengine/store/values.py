"""The store's value types: what reads return (sessions, events, compactions, summary nodes,
search hits). Frozen records, built from rows; nothing here touches a database."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["CompactionInfo", "Event", "NodeInfo", "RequestRecord", "SearchHit", "SearchMode", "SessionInfo", "UsageRow"]


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


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One proxied request, as the request log keeps it (``SessionStore.record_request``).

    ``tokens_in``: the conversation the client sent (estimated tokens); ``tokens_out``: what went
    upstream (with ``shadow``: what ctxengine would have sent, the request having gone out
    unchanged). ``prompt_tokens`` … ``cache_write_tokens``: the usage the provider reported
    (``prompt_tokens`` includes the cached parts); 0 when it reported none.
    """

    session_id: str
    api: str
    model: str
    created_at: float = 0.0
    client: str = ""
    outcome: str = "ok"
    status: int = 200
    tokens_in: int = 0
    tokens_out: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    compactions: int = 0
    shadow: bool = False


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Requests added up over a group (``SessionStore.usage``): a model, a client, a session or a
    time bucket; ``key`` names the group's values (e.g. ``{"model": …, "client": …}``)."""

    key: dict[str, Any]
    requests: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    compactions: int = 0
    fail_opens: int = 0
    errors: int = 0
    shadow: int = 0
    last_at: float = 0.0
    first_at: float = 0.0
