"""Which session a request belongs to.

A client that can set a header names its session: ``x-ctxengine-session: <name>`` (the name is
the session id in the store, so ``ctxengine sessions show <name>`` finds it). Otherwise the id is
derived from what stays the same across the turns of one conversation: the API, a digest of the
client's key, the system prompt's text and the first user message's text (cache markers and
other non-text keys left out, since clients move them from turn to turn). Two conversations
that share all of these share a session; a client that rewrites its first message (its own
``/compact``) starts a new one. The key itself never leaves this function: only a digest of it
is mixed into another digest.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ctxengine.messages import content_text

__all__ = ["SESSION_HEADER", "SessionIdError", "derive_session_id", "session_from_header"]

SESSION_HEADER = "x-ctxengine-session"
_VALID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


class SessionIdError(ValueError):
    """The session header holds something that cannot be a session id."""


def session_from_header(value: str | None) -> str | None:
    """The session named by the header, ``None`` when absent; :class:`SessionIdError` if invalid."""
    if value is None or value == "":
        return None
    if not _VALID.fullmatch(value):
        raise SessionIdError(f"{SESSION_HEADER} must be 1-128 characters of letters, digits and . _ : @ / + = -")
    return value


def _key(headers: Mapping[str, str]) -> str:
    key = headers.get("x-api-key") or headers.get("authorization") or ""
    return hashlib.sha256(key.encode("utf-8")).hexdigest() if key else ""


def derive_session_id(api: str, headers: Mapping[str, str], system: Any, messages: Sequence[Any]) -> str:
    """The deterministic id of a conversation (see the module docstring): ``px-`` + 24 hex digits.

    ``system`` is the Anthropic ``system`` value (``None`` for OpenAI, whose system prompt is
    the first ``system``/``developer`` message of ``messages``).
    """
    system_text = content_text(system) if system is not None else ""
    first_user = ""
    for m in messages:
        if not isinstance(m, Mapping):
            continue
        role = m.get("role")
        if system is None and not system_text and role in ("system", "developer"):
            system_text = content_text(m.get("content"))
        elif role == "user":
            content = m.get("content")
            if isinstance(content, list):  # Anthropic tool results are not the opening message
                content = [p for p in content if not (isinstance(p, Mapping) and p.get("type") == "tool_result")]
            first_user = content_text(content)
            break
    h = hashlib.sha256()
    for part in (api, _key(headers), system_text, first_user):
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return "px-" + h.hexdigest()[:24]
