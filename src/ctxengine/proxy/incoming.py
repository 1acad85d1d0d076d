"""An Anthropic session's incoming history, converted incrementally.

A client resends its whole history every turn. The manager recognises the part it has seen
(:mod:`ctxengine.history`), but the Anthropic request must first be turned into OpenAI-form
messages, and converting the whole history every turn costs as much as everything else the
proxy does. :class:`IncomingHistory` keeps, per session, each Anthropic message of the last
request with its OpenAI-form group (the adapter turns one Anthropic message into one or more
OpenAI messages), so only the messages not seen last turn are converted; and
:meth:`IncomingHistory.to_anthropic` writes cache markers back by converting only the groups
that carry one, leaving every other message of the body as the client sent it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxengine.anthropic_adapter import anthropic_to_openai, openai_to_anthropic
from ctxengine.messages import Message

__all__ = ["Converted", "IncomingHistory"]


@dataclass(slots=True)
class Converted:
    """One Anthropic request in OpenAI form, and where each OpenAI message came from."""

    messages: list[Message]
    system_index: int  # index of the system message in ``messages``, -1 without one
    owner: list[int]  # per OpenAI message: the Anthropic message index (-1: the system)
    starts: list[int]  # per Anthropic message: index of its first OpenAI message


@dataclass(slots=True)
class IncomingHistory:
    """The last request of one session (see the module docstring).

    Besides the pairs (each Anthropic message with its OpenAI-form group) it keeps the flat
    lists built from them last turn (``body``: every group's messages in order, ``body_owner``
    and ``body_starts`` as in :class:`Converted` but without the system message), so a turn
    that only appends messages extends copies of those lists instead of walking the history.
    """

    messages: list[Message] = field(default_factory=list)
    anthropic: list[tuple[Any, list[Message]]] = field(default_factory=list)
    system_raw: Any = None
    system_msg: Message | None = None
    raw: list[Any] = field(default_factory=list)  # the Anthropic messages of the last request
    body: list[Message] = field(default_factory=list)
    body_owner: list[int] = field(default_factory=list)
    body_starts: list[int] = field(default_factory=list)

    def from_anthropic(self, system: Any, messages: Sequence[Any]) -> Converted:
        """The request in OpenAI form, converting only the messages not seen last turn.

        Raises :class:`~ctxengine.errors.InputError` for a malformed message (as the adapter does).
        """
        if self.system_msg is None or system != self.system_raw:
            converted = anthropic_to_openai(system, []) if system is not None else []
            self.system_raw, self.system_msg = system, (converted[0] if converted else None)
        prev = self.anthropic
        n = len(prev)
        if n <= len(messages) and self.raw == messages[:n]:
            k = n  # the usual turn: everything seen before is resent as is (compared in C, identity first)
        else:
            k = 0
            for m, (seen, _) in zip(messages, prev, strict=False):
                if m is not seen and m != seen:
                    break
                k += 1
        pairs = prev[:k]
        cut = self.body_starts[k] if k < len(self.body_starts) else len(self.body)
        body, owner, starts = self.body[:cut], self.body_owner[:cut], self.body_starts[:k]
        for a in range(k, len(messages)):
            m = messages[a]
            if pairs:
                before = pairs[-1]
                # one message of context: a tool result's conversion looks at the message before
                group = anthropic_to_openai(None, [before[0], m])[len(before[1]) :]
            else:
                group = anthropic_to_openai(None, [m])
            pairs.append((m, group))
            starts.append(len(body))
            body.extend(group)
            owner.extend([a] * len(group))
        self.anthropic, self.raw = pairs, list(messages)
        self.body, self.body_owner, self.body_starts = body, owner, starts
        if self.system_msg is not None and system is not None:
            out = [self.system_msg, *body]
            self.messages = out
            return Converted(out, 0, [-1, *owner], [i + 1 for i in starts])
        self.messages = list(body)
        return Converted(self.messages, -1, list(owner), list(starts))

    @staticmethod
    def to_anthropic(body: Mapping[str, Any], conv: Converted, sent: Sequence[Message], marked: Sequence[int]) -> dict[str, Any]:
        """``body`` with the cache markers of ``sent`` (``conv.messages`` with the messages at
        ``marked`` replaced by marked copies) written back: only the Anthropic messages that
        own a marked message are converted back; the others stay the client's own objects."""
        out = dict(body)
        messages = list(body["messages"])
        touched = sorted({conv.owner[i] for i in marked})
        for a in touched:
            if a < 0:
                system, rest = openai_to_anthropic([sent[conv.system_index]])
                if rest:
                    raise ValueError("the system message converted to more than a system prompt")
                out["system"] = system
                continue
            end = conv.starts[a + 1] if a + 1 < len(conv.starts) else len(sent)
            system, group = openai_to_anthropic(list(sent[conv.starts[a] : end]))
            if system is not None or len(group) != 1:
                raise ValueError(f"message {a} did not convert back to one Anthropic message")
            messages[a] = group[0]
        out["messages"] = messages
        return out
