"""The one place the proxy writes the bodies it sends upstream.

A request's outgoing body is the client's body with the working context as its conversation,
cache breakpoints where the proxy places them, and the engine's tools added to the tool list;
every other key stays as the client sent it. What is written costs what changed since the
session's last request, not the whole history: the API adapter converts only what changed
(:meth:`Api.write`), and the bytes are spliced into last turn's (:class:`BodyCache.splice`)
wherever the rest of the body is the same. The follow-up requests of the proxy's own recall
round trips are written here too (:func:`encode`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ctxengine.messages import Message, tool_name
from ctxengine.proxy.apis import Api, Marking
from ctxengine.proxy.incoming import Converted
from ctxengine.proxy.state import ProxySession

__all__ = ["Outgoing", "encode", "outgoing", "tool_name"]


@dataclass(slots=True)
class Outgoing:
    """An outgoing body: the decoded value, its bytes, the engine tools it carries."""

    body: Mapping[str, Any]
    content: bytes
    engine_tools: frozenset[str] = frozenset()


def encode(body: Mapping[str, Any]) -> bytes:
    """A body written whole (a follow-up request, or a body the splice cannot reuse)."""
    return orjson.dumps(body)


def outgoing(
    api: Api,
    session: ProxySession,
    body: Mapping[str, Any],
    raw: bytes,
    conv: Converted | None,
    context: list[Message],
    changed: bool,
    marking: Marking,
    tools: Sequence[Mapping[str, Any]] = (),
) -> Outgoing:
    """The body that goes upstream for ``body`` (the client's, ``raw`` its bytes) with the
    working ``context`` (``changed``: it differs from the client's history), ``marking``'s
    cache breakpoints and the engine ``tools`` (OpenAI format) added."""
    new_body, rewritten = api.write(body, session, conv, context, changed, marking)
    names: frozenset[str] = frozenset()
    if tools:
        new_body = api.with_tools(new_body, tools)
        names = frozenset(tool_name(t) for t in tools)
    if new_body is body:
        return Outgoing(body, raw, names)
    known = [a for a in rewritten if a >= 0] if rewritten is not None else None
    spliced = session.body.splice(raw, body, new_body, known)
    return Outgoing(new_body, spliced if spliced is not None else encode(new_body), names)
