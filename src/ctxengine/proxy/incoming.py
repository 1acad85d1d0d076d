"""An Anthropic session's incoming history, converted incrementally.

A client resends its whole history every turn. The manager recognises the part it has seen
(:mod:`ctxengine.history`), but the Anthropic request must first be turned into OpenAI-form
messages, and converting the whole history every turn costs as much as everything else the
proxy does. :class:`IncomingHistory` keeps, per session, each Anthropic message of the last
request with its OpenAI-form group (the adapter turns one Anthropic message into one or more
OpenAI messages), so only the messages not seen last turn are converted; and
:meth:`IncomingHistory.with_markers` writes cache markers back by converting only the groups
that carry one, leaving every other message of the body as the client sent it.

**A client's cache markers are not edits.** Claude Code moves its ``cache_control`` marker to
the newest message every turn (and marks system blocks, with a ``ttl``). The OpenAI-form
messages handed to the manager are converted *without* the client's markers, and a message
sent again with only its markers changed keeps last turn's conversion: the manager sees the
same objects turn after turn (its quick turn, one store row per message, a resumed session
recognised after a restart); only a message whose shape changed with its marker (string
content sent as a marked text block, then as a string again) is converted again, the manager
taking it as the same message. The client's markers of this turn are not lost: a body sent
unchanged goes out as the client sent it, and a context converted in full
(:meth:`IncomingHistory.outgoing_anthropic`, after a compaction) gets them back on the messages
the client marked this turn, wherever they are still held verbatim.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxengine.anthropic_adapter import (
    ConversionMemo,
    anthropic_message_to_openai,
    anthropic_to_openai,
    openai_to_anthropic,
)
from ctxengine.caching import apply_breakpoints, cache_marker
from ctxengine.errors import InputError
from ctxengine.history import first_difference, without_markers
from ctxengine.messages import Message, identical_prefix
from ctxengine.tokens import estimate_message_tokens

__all__ = ["Converted", "IncomingHistory", "TokenTally"]


@dataclass(slots=True)
class TokenTally:
    """Estimated tokens of one session's message lists, turn after turn: a list that starts
    with last turn's list (the same objects, as a resent history and the working context do)
    costs only its new messages; anything else is estimated from the first difference on."""

    messages: list[Message] = field(default_factory=list)
    sums: list[int] = field(default_factory=list)  # sums[k]: the tokens of messages[: k + 1]

    def count(self, messages: Sequence[Message]) -> int:
        n = identical_prefix(messages, self.messages)
        sums = self.sums[:n]
        total = sums[-1] if sums else 0
        for m in messages[n:]:
            total += estimate_message_tokens(m)
            sums.append(total)
        self.messages, self.sums = list(messages), sums
        return total


@dataclass(slots=True)
class Converted:
    """One Anthropic request in OpenAI form, and where each OpenAI message came from.

    The positions are kept as :class:`IncomingHistory` has them, without the system message
    (``body_owner``, ``body_starts``: its own lists, never edited once handed out), and
    shifted past it where they are read (``shift``): building shifted copies
    cost two passes over the history in Python every turn."""

    messages: list[Message]
    system_index: int  # index of the system message in ``messages``, -1 without one
    body_owner: list[int]  # per OpenAI message after the system one: the Anthropic message index
    body_starts: list[int]  # per Anthropic message: index of its first OpenAI message, not counting the system one

    @property
    def shift(self) -> int:
        """How far the system message moves the history's positions (1 with one, else 0)."""
        return 1 if self.system_index >= 0 else 0

    @property
    def owner(self) -> list[int]:
        """Per OpenAI message: the Anthropic message index (-1: the system)."""
        return [-1, *self.body_owner] if self.shift else list(self.body_owner)

    @property
    def starts(self) -> list[int]:
        """Per Anthropic message: index of its first OpenAI message."""
        shift = self.shift
        return [i + shift for i in self.body_starts]


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
    # what :meth:`with_markers` wrote last turn, by Anthropic index (-1: the system prompt): the
    # OpenAI group it came from (the objects), the marked positions in it, the marker's
    # settings, and the Anthropic message (or system prompt) it gave
    marked: dict[int, tuple[tuple[Message, ...], tuple[int, ...], tuple[str, bool], Any]] = field(default_factory=dict)
    # the last context converted to the Anthropic form in full (:meth:`outgoing_anthropic`):
    # the OpenAI messages, where and how they were marked, the system prompt and messages they
    # gave, where each of those starts, and openai_to_anthropic's memo of single messages
    out_context: list[Message] = field(default_factory=list)
    out_marks: frozenset[int] = frozenset()
    out_setting: tuple[str, bool] | None = None
    out_system: Any = None
    out_messages: list[Any] = field(default_factory=list)
    out_starts: list[int] = field(default_factory=list)
    outgoing: ConversionMemo = field(default_factory=dict)
    # the tokens of the history the client sent and of the context sent upstream, for the metrics
    tokens_in: TokenTally = field(default_factory=TokenTally)
    tokens_out: TokenTally = field(default_factory=TokenTally)
    # the client's own markers of the last request: the system prompt as sent when it carries
    # one, and the Anthropic index of each message that carries one (the message as sent); and
    # their conversions with the markers, by the id of what was converted
    client_system: Any = None
    client_marked: dict[int, Any] = field(default_factory=dict)
    client_memo: dict[int, tuple[Any, list[Message]]] = field(default_factory=dict)

    def from_anthropic(self, system: Any, messages: Sequence[Any]) -> Converted:
        """The request in OpenAI form, converting only the messages not seen last turn.

        Raises :class:`~ctxengine.errors.InputError` for a malformed message (as the adapter does).
        """
        self._take_system(system)
        prev = self.anthropic
        n = len(prev)
        moved: list[int] = []
        if n <= len(messages) and self.raw == messages[:n]:
            k = n  # the usual turn: everything seen before is resent as is (compared in C, identity first)
        else:
            # the first difference, looked for from the end (a moved marker is there); a message
            # sent again with only its markers changed is the same message (its conversion stays)
            lim, raw = min(n, len(messages)), self.raw
            seen = messages if isinstance(messages, list) else list(messages)
            k = 0
            while True:
                k += first_difference(seen[k:lim], raw[k:lim], lim - k)
                # (string content that came as a marked text block is another shape: converted
                # again, so what goes out keeps the client's shape of this turn)
                if k >= lim or not _same_shape_but_markers(seen[k], raw[k]):
                    break
                moved.append(k)
                k += 1
        pairs = prev[:k]
        marked = {a: m for a, m in self.client_marked.items() if a < k}
        for a in moved:
            m = messages[a]
            if without_markers(m, keep_shape=True) is m:
                marked.pop(a, None)
            else:
                marked[a] = m
        cut = self.body_starts[k] if k < len(self.body_starts) else len(self.body)
        body, owner, starts = self.body[:cut], self.body_owner[:cut], self.body_starts[:k]
        for a in range(k, len(messages)):
            m = messages[a]
            plain = without_markers(m, keep_shape=True)
            if plain is not m:
                marked[a] = m
            # a tool result's conversion looks at the OpenAI message before it
            group = anthropic_message_to_openai(plain, index=a, previous=pairs[-1][1][-1] if pairs and pairs[-1][1] else None)
            pairs.append((m, group))
            starts.append(len(body))
            body.extend(group)
            owner.extend([a] * len(group))
        self.anthropic, self.raw = pairs, list(messages)
        self.body, self.body_owner, self.body_starts = body, owner, starts
        self.client_marked = marked
        if self.system_msg is not None and system is not None:
            out = [self.system_msg, *body]
            self.messages = out
            return Converted(out, 0, owner, starts)
        self.messages = list(body)
        return Converted(self.messages, -1, owner, starts)

    def _take_system(self, system: Any) -> None:
        """Convert ``system`` unless it is last turn's (or differs from it only in markers)."""
        if self.system_msg is None or system != self.system_raw:
            if system is None or self.system_msg is None or not _same_system(system, self.system_raw):
                plain = _plain_system(system)
                converted = anthropic_to_openai(plain, []) if plain is not None else []
                self.system_msg = converted[0] if converted else None
            self.system_raw = system  # (only its markers moved: last turn's conversion stays)
            self.client_system = system if system is not None and _plain_system(system) is not system else None

    def outgoing_anthropic(self, context: Sequence[Message], marked: Sequence[int], *, cache_ttl: str, native_anthropic: bool) -> tuple[Any, list[Any]]:
        """:func:`openai_to_anthropic` of ``context`` with cache markers on the messages at
        ``marked`` (a context sent upstream in full, e.g. every turn after a compaction),
        converting only what changed since last turn: the Anthropic messages that ended before
        the first message that differs (another object, or marked where it was not, or the
        reverse) are last turn's; the rest is converted again, each message once (the memo)."""
        context = self._client_markers(context)
        setting = (cache_ttl, native_anthropic)
        marks = frozenset(marked)
        n = identical_prefix(context, self.out_context) if setting == self.out_setting else 0
        n = min([n, *(i for i in marks ^ self.out_marks if i < n)])
        # the Anthropic messages that ended before the change (never the last: it may go on)
        keep = max(0, min(bisect.bisect_right(self.out_starts, n) - 1, len(self.out_starts) - 1)) if n else 0
        begin = self.out_starts[keep] if keep else 0
        sent = apply_breakpoints(context, sorted(marks), cache_ttl=cache_ttl, native_anthropic=native_anthropic, share_unmarked=True) if marks else list(context)
        starts: list[int] = []
        # the rest converted on its own: it starts with a message that starts an Anthropic one
        if 0 < begin < len(sent) and isinstance(sent[begin], Mapping) and sent[begin].get("role") in ("user", "assistant", "tool"):
            try:
                _, tail = openai_to_anthropic(sent[begin:], memo=self.outgoing, starts=starts)
            except InputError:
                begin = 0  # converted in full below: the error names the message's real index
            else:
                system, messages = self.out_system, [*self.out_messages[:keep], *tail]
                starts = [*self.out_starts[:keep], *(begin + i for i in starts)]
        else:
            begin = 0
        if not begin:
            starts = []
            system, messages = openai_to_anthropic(sent, memo=self.outgoing, starts=starts)
        self.out_context, self.out_marks, self.out_setting = list(context), marks, setting
        self.out_system, self.out_messages, self.out_starts = system, list(messages), starts
        if len(self.outgoing) > 2 * len(sent) + 64:  # bounded by the context (compacted and marked messages go)
            ids = {id(m) for m in sent}
            self.outgoing = {k: v for k, v in self.outgoing.items() if k in ids}
        return system, messages

    def _client_markers(self, context: Sequence[Message]) -> Sequence[Message]:
        """``context`` with the client's markers of the last request back on the messages it
        marked (:meth:`from_anthropic` hands the manager their conversions without markers),
        where they are still held verbatim: the system prompt at the start, a message at its
        place counted from the end (the context's tail is the history's). Only the marked
        messages are looked at; their marked conversions are made once per message object."""
        if self.client_system is None and not self.client_marked:
            return context
        out: list[Message] | None = None
        memo: dict[int, tuple[Any, list[Message]]] = {}
        if self.client_system is not None and context and context[0] is self.system_msg:
            group = self._marked_conversion(-1, self.client_system, memo)
            if len(group) == 1:
                out = list(context)
                out[0] = group[0]
        elif self.client_system is not None and context and self.system_msg is not None:
            # the engine rewrote the system prompt (a note appended after a compaction): the
            # client's blocks it starts with keep their markers
            rewritten = self._marked_system_rewrite(context[0], memo)
            if rewritten is not None:
                out = list(context)
                out[0] = rewritten
        shift = 1 if self.system_msg is not None and self.messages and self.messages[0] is self.system_msg else 0
        tail = len(context) - len(self.messages)
        for a, m in self.client_marked.items():
            if a >= len(self.anthropic):
                continue
            plain_group = self.anthropic[a][1]
            at = self.body_starts[a] + shift + tail
            if not plain_group or at < 0 or at + len(plain_group) > len(context):
                continue
            if not all(context[at + j] is g or context[at + j] == g for j, g in enumerate(plain_group)):
                continue
            try:
                group = self._marked_conversion(a, m, memo)
            except InputError:
                continue
            if len(group) != len(plain_group):
                continue
            if out is None:
                out = list(context)
            out[at : at + len(group)] = group
        self.client_memo = memo
        return context if out is None else out

    def _marked_system_rewrite(self, system: Any, memo: dict[int, tuple[Any, list[Message]]]) -> Message | None:
        """``system`` (a system message the engine made from the client's) with the client's
        markers on the parts it kept from the client's system prompt, when it starts with them
        (the marked prefix is then cached as the client meant); ``None`` otherwise."""
        hit = self.client_memo.get(id(system))
        if hit is not None and hit[0] is system:
            memo[id(system)] = hit
            return hit[1][0]
        if self.system_msg is None or type(system) is not dict or system.get("role") != "system":
            return None
        plain, content = self.system_msg.get("content"), system.get("content")
        if type(plain) is not list or type(content) is not list or len(content) < len(plain):
            return None
        marked = self._marked_conversion(-1, self.client_system, memo)
        if len(marked) != 1:
            return None
        client = marked[0].get("content")
        if type(client) is not list or len(client) != len(plain) or content[: len(plain)] != plain:
            return None
        result = {**system, "content": [*client, *content[len(plain) :]]}
        memo[id(system)] = (system, [result])
        return result

    def _marked_conversion(self, a: int, message: Any, memo: dict[int, tuple[Any, list[Message]]]) -> list[Message]:
        """The OpenAI form of the client's marked message ``a`` (-1: the system prompt), as
        converted last time when it is the same object (identity keeps the outgoing
        conversion incremental)."""
        hit = self.client_memo.get(id(message))
        if hit is not None and hit[0] is message:
            memo[id(message)] = hit
            return hit[1]
        if a < 0:
            group = anthropic_to_openai(message, [])
        else:
            previous = self.anthropic[a - 1][1][-1] if a > 0 and self.anthropic[a - 1][1] else None
            group = anthropic_message_to_openai(message, index=a, previous=previous)
        memo[id(message)] = (message, group)
        return group

    def with_markers(
        self, body: Mapping[str, Any], conv: Converted, context: Sequence[Message], marked: Sequence[int], *, cache_ttl: str, native_anthropic: bool
    ) -> tuple[dict[str, Any], list[int]]:
        """``body`` with cache markers on the messages of ``context`` (``conv.messages``, as the
        manager returned them) at ``marked``, written back: only the Anthropic messages that own a
        marked message are converted back, the others stay the client's own objects; and the
        Anthropic indices rewritten (-1: the system prompt).

        A breakpoint mostly stays where it was last turn (the system prompt, the end of the
        previous turn), so each rewritten message is remembered with the objects it was made
        from: a group whose messages are the same objects, marked at the same places with the
        same marker, takes last turn's result instead of being marked and converted again
        (messages handed to ctxengine are never edited in place)."""
        setting = (cache_ttl, native_anthropic)
        groups: dict[int, list[int]] = {}
        shift = conv.shift
        owner, starts = conv.body_owner, conv.body_starts
        for i in sorted(set(marked)):
            groups.setdefault(owner[i - shift] if i >= shift else -1, []).append(i)
        out = dict(body)
        messages = list(body["messages"])
        memo: dict[int, tuple[tuple[Message, ...], tuple[int, ...], tuple[str, bool], Any]] = {}
        for a, idx in groups.items():
            start = conv.system_index if a < 0 else starts[a] + shift
            end = start + 1 if a < 0 else starts[a + 1] + shift if a + 1 < len(starts) else len(context)
            objs = tuple(context[start:end])
            where = (idx[0] - start,) if len(idx) == 1 else tuple(i - start for i in idx)  # mostly one
            hit = self.marked.get(a)
            if hit is not None and hit[1] == where and hit[2] == setting and len(hit[0]) == len(objs) == identical_prefix(hit[0], objs):
                value = hit[3]
            elif a >= 0 and len(objs) == 1 and (plain := _marked_plain(messages[a], where, cache_ttl)) is not None:
                value = plain  # the usual new breakpoint: the latest user message, a string
            else:
                group = apply_breakpoints(objs, where, cache_ttl=cache_ttl, native_anthropic=native_anthropic, share_unmarked=True)
                value = _converted_back(a, group)
            memo[a] = (objs, where, setting, value)
            if a < 0:
                out["system"] = value
            else:
                messages[a] = value
        self.marked = memo
        out["messages"] = messages
        return out, sorted(groups)


def _marked_plain(message: Any, where: tuple[int, ...], cache_ttl: str) -> Any:
    """The Anthropic ``message`` with a cache marker, when it is a plain one (a user or
    assistant message of non-empty string content and no other key, whose OpenAI form is one
    message, marked at ``where == (0,)``): what marking that form and converting it back gives
    (:func:`apply_breakpoints`, then :func:`_converted_back`), written directly. ``None`` for
    any other message."""
    if where != (0,) or type(message) is not dict or len(message) != 2:
        return None
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant") or type(content) is not str or not content:
        return None
    return {"role": role, "content": [{"type": "text", "text": content, "cache_control": cache_marker(cache_ttl)}]}


def _converted_back(a: int, group: Sequence[Message]) -> Any:
    """The Anthropic message ``a`` (the system prompt when negative) from its OpenAI ``group``."""
    system, converted = openai_to_anthropic(list(group))
    if a < 0:
        if converted:
            raise ValueError("the system message converted to more than a system prompt")
        return system
    if system is not None or len(converted) != 1:
        raise ValueError(f"message {a} did not convert back to one Anthropic message")
    return converted[0]


def _plain_system(system: Any) -> Any:
    """The Anthropic ``system`` value without the client's markers (the same object without any)."""
    if type(system) is not list:
        return system
    plain = without_markers({"content": system}, keep_shape=True)["content"]
    return plain


def _same_system(a: Any, b: Any) -> bool:
    """Whether two ``system`` values differ only in their markers."""
    return bool(a == b or _plain_system(a) == _plain_system(b))


def _same_shape_but_markers(a: Any, b: Any) -> bool:
    """Whether two Anthropic messages differ only in their markers (their content in the same
    shape: a string and a text block are two shapes)."""
    return bool(a == b or without_markers(a, keep_shape=True) == without_markers(b, keep_shape=True))
