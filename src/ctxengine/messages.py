"""The canonical message form and its checks.

ctxengine speaks OpenAI chat-completions messages: dicts with ``role``, ``content`` (a string,
a list of parts, or ``None``), and for assistants optionally ``tool_calls``; tool results carry
``tool_call_id``. Unknown keys (``reasoning_content``, thinking blocks, ``name``, provider
extras) are preserved untouched by every function here and by every engine.

Nothing in this module mutates its arguments.
"""

from __future__ import annotations

import copy
import json
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ctxengine.errors import InvalidMessages

__all__ = [
    "ROLES",
    "Message",
    "Violation",
    "check",
    "content_text",
    "copy_messages",
    "identical_prefix",
    "is_summary",
    "json_problem",
    "message_blocks",
    "message_text",
    "plain_json_kind",
    "tool_call_args",
    "tool_call_id",
    "tool_call_name",
    "tool_calls",
    "tool_name",
    "validate",
]

Message = dict[str, Any]
"""One chat message in OpenAI chat-completions form."""

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})

Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Violation:
    """One problem found in a message list.

    ``code`` is stable and machine-readable (``not_a_list`` with index -1, ``tool_call_without_result``,
    ``result_without_call``, ``duplicate_tool_call_id``, ``bad_role``, ``missing_role``,
    ``not_a_dict``, ``bad_content``, ``bad_tool_calls``, ``empty_tool_calls``, ``missing_tool_call_id``,
    ``result_not_adjacent``, ``duplicate_result``, ``not_json``, and the warnings
    ``non_json_arguments`` and ``reused_tool_call_id``); ``severity`` is ``"warning"`` for things
    providers accept and ``"error"`` otherwise.
    """

    index: int
    code: str
    detail: str
    severity: Severity = "error"

    def __str__(self) -> str:
        return f"[{self.index}] {self.code}: {self.detail}"


MAX_NESTING = 200
"""Deepest nesting of lists and dicts a message may have (a provider's JSON parser, the
store's and Python's own would fail on much deeper values)."""


def json_problem(value: Any) -> str | None:
    """Why ``value`` is not plain JSON data, or ``None`` when it is.

    Plain JSON: dicts with string keys, lists (tuples count as lists), strings, integers,
    finite floats, booleans and ``None``, nested at most :data:`MAX_NESTING` deep. NaN and
    Infinity (no JSON has them: providers reject them and the store cannot record them),
    bytes, sets, non-string keys and other objects are named with their path.
    One rule for :func:`validate`, the store and every engine: such a message is rejected
    with its index (``not_json``), never silently changed or dropped.
    """
    if plain_json_kind(value):
        return None
    return _json_problem_at(value)


_INF = (float("inf"), float("-inf"))

PLAIN_NO_FLOAT = 2
""":func:`plain_json_kind` of plain JSON without a float."""


def plain_json_kind(value: Any) -> int:
    """:data:`PLAIN_NO_FLOAT` (2) when ``value`` is plain JSON built of the exact builtin
    types with no float, 1 when it has floats, 0 when :func:`_json_problem_at` must look (a
    problem, or a subclass or tuple whose verdict it gives). The common case is checked
    without building a path for every item."""
    kind = PLAIN_NO_FLOAT
    stack: list[tuple[Any, int]] = [(value, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        v, depth = pop()
        t = type(v)
        if t is dict:
            if depth >= MAX_NESTING:
                return 0
            for k, item in v.items():
                if type(k) is not str:
                    return 0
                ti = type(item)
                if ti is str or item is None or ti is int or ti is bool:
                    continue
                push((item, depth + 1))
        elif t is list:
            if depth >= MAX_NESTING:
                return 0
            for item in v:
                ti = type(item)
                if ti is str or item is None or ti is int or ti is bool:
                    continue
                push((item, depth + 1))
        elif t is str or v is None or t is int or t is bool:
            continue
        elif t is float:
            if v != v or v in _INF:
                return 0
            kind = 1
        else:
            return 0
    return kind


def _json_problem_at(value: Any) -> str | None:
    """:func:`json_problem` with the path of the first problem found."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        v, path, depth = stack.pop()
        if v is None or isinstance(v, str | bool | int):
            continue
        if isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                return f"{path or 'value'} is {v!r}, which JSON cannot carry"
            continue
        if depth >= MAX_NESTING:
            return f"nested more than {MAX_NESTING} levels deep at {path or 'the top'}"
        if isinstance(v, dict):
            for k, item in v.items():
                if not isinstance(k, str):
                    return f"{path or 'message'} has a {type(k).__name__} key {k!r}; JSON keys are strings"
                stack.append((item, f"{path}.{k}" if path else k, depth + 1))
        elif isinstance(v, list | tuple):
            for n, item in enumerate(v):
                stack.append((item, f"{path}[{n}]", depth + 1))
        else:
            return f"{path or 'value'} is a {type(v).__name__}, not JSON data"
    return None


def _part_ok(part: Any) -> bool:
    return isinstance(part, dict) and isinstance(part.get("type", "text"), str)


def validate(messages: Any, *, allow_pending_calls: bool = False, errors_only: bool = False) -> list[Violation]:
    """Return every violation in ``messages`` (empty list when valid).

    Checks: the list and each message have the right types; roles are known; content is a
    string, a list of part dicts, or ``None``; every assistant tool call has exactly one result
    that follows it before the next assistant or user message; every tool result answers a
    call; tool call ids are unique. Non-JSON tool arguments are reported as warnings.

    ``allow_pending_calls`` accepts tool calls of the *last* assistant message that have no
    result yet (an agent loop about to run them); a request to a provider never has those.
    ``errors_only`` leaves the warnings out (and the JSON parse of every tool call's arguments
    that only a warning needs): what a caller that raises on errors asks for, every turn.
    """
    if not isinstance(messages, list | tuple):
        return [Violation(-1, "not_a_list", f"expected a list of messages, got {type(messages).__name__}")]
    checker = _Validator(errors_only)
    for i, m in enumerate(messages):
        checker.message(i, m)
    return checker.finish(len(messages), allow_pending_calls)


class _Validator:
    """The state :func:`validate` keeps across a message list, and its checks."""

    def __init__(self, errors_only: bool) -> None:
        self.errors_only = errors_only
        self.out: list[Violation] = []
        self.seen_ids: dict[str, int] = {}
        # ids of calls still waiting for a result, in the currently open tool group
        self.open_calls: dict[str, int] = {}
        self.answered: set[str] = set()
        self.last_assistant_with_calls = -1

    def close_group(self, at: int) -> None:
        for cid, idx in self.open_calls.items():
            self.out.append(Violation(idx, "tool_call_without_result", f"tool call {cid!r} has no result before message {at}"))
        self.open_calls.clear()

    def finish(self, length: int, allow_pending_calls: bool) -> list[Violation]:
        if self.open_calls:
            if allow_pending_calls and all(idx == self.last_assistant_with_calls for idx in self.open_calls.values()):
                self.open_calls.clear()
            else:
                self.close_group(length)
        self.out.sort(key=lambda v: v.index)
        return self.out

    def message(self, i: int, m: Any) -> None:
        out = self.out
        if not isinstance(m, dict):
            out.append(Violation(i, "not_a_dict", f"message is a {type(m).__name__}, not a dict"))
            return
        problem = json_problem(m)
        if problem is not None:
            out.append(Violation(i, "not_json", problem))
        role = m.get("role")
        if role is None:
            out.append(Violation(i, "missing_role", "message has no 'role'"))
            return
        if not isinstance(role, str) or role not in ROLES:
            out.append(Violation(i, "bad_role", f"unknown role {role!r} (expected one of {sorted(ROLES)})"))
            return
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            if not isinstance(content, list):
                out.append(Violation(i, "bad_content", f"content is a {type(content).__name__}; expected str, list of parts or null"))
            elif not all(_part_ok(p) for p in content):
                out.append(Violation(i, "bad_content", "content list holds an item that is not a part dict"))
        if role == "tool":
            self.tool_result(i, m.get("tool_call_id"))
            return
        # any non-tool message closes the open tool group
        if self.open_calls:
            self.close_group(i)
        if role == "assistant" and "tool_calls" in m and m["tool_calls"] is not None:
            self.tool_calls(i, m["tool_calls"])

    def tool_result(self, i: int, cid: Any) -> None:
        out = self.out
        if not isinstance(cid, str) or not cid:
            out.append(Violation(i, "missing_tool_call_id", "tool message without a string 'tool_call_id'"))
        elif cid in self.open_calls:
            del self.open_calls[cid]
            self.answered.add(cid)
        elif cid in self.answered:
            out.append(Violation(i, "duplicate_result", f"second result for tool call {cid!r}"))
        elif cid in self.seen_ids:
            out.append(Violation(i, "result_not_adjacent", f"result for tool call {cid!r} (message {self.seen_ids[cid]}) comes after another turn"))
        else:
            out.append(Violation(i, "result_without_call", f"tool result {cid!r} answers no earlier tool call"))

    def tool_calls(self, i: int, calls: Any) -> None:
        if not isinstance(calls, list):
            self.out.append(Violation(i, "bad_tool_calls", "'tool_calls' is not a list"))
            return
        if not calls:
            self.out.append(Violation(i, "empty_tool_calls", "'tool_calls' is an empty list; OpenAI and DeepSeek reject it (omit the key)"))
            return
        self.last_assistant_with_calls = i
        for c in calls:
            self.tool_call(i, c)

    def tool_call(self, i: int, c: Any) -> None:
        out = self.out
        if not isinstance(c, dict):
            out.append(Violation(i, "bad_tool_calls", "a tool call is not a dict"))
            return
        cid = c.get("id")
        if not isinstance(cid, str) or not cid:
            out.append(Violation(i, "bad_tool_calls", "a tool call has no string 'id'"))
            return
        if cid in self.open_calls:
            out.append(Violation(i, "duplicate_tool_call_id", f"tool call id {cid!r} used twice in one tool group"))
            return
        if cid in self.seen_ids:
            # OpenAI-compatible providers accept an id reused in a later, separate group
            # (real trajectories contain this); results are matched by position.
            if not self.errors_only:
                out.append(Violation(i, "reused_tool_call_id", f"tool call id {cid!r} already used at message {self.seen_ids[cid]}", "warning"))
            self.answered.discard(cid)
        self.seen_ids[cid] = i
        self.open_calls[cid] = i
        fn = c.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            out.append(Violation(i, "bad_tool_calls", f"tool call {cid!r} has no function name"))
            return
        args = fn.get("arguments")
        if isinstance(args, str):
            if not self.errors_only and args.strip():
                try:
                    json.loads(args)
                except ValueError:
                    out.append(Violation(i, "non_json_arguments", f"arguments of tool call {cid!r} are not JSON", "warning"))
        elif args is not None and not isinstance(args, dict):
            out.append(Violation(i, "bad_tool_calls", f"arguments of tool call {cid!r} are a {type(args).__name__}"))


def check(messages: Any, *, context: str = "messages", allow_pending_calls: bool = False) -> list[Message]:
    """Raise :class:`InvalidMessages` listing every error in ``messages``; return them.

    Warnings (non-JSON tool arguments) do not raise.
    """
    violations = validate(messages, allow_pending_calls=allow_pending_calls, errors_only=True)
    if violations:
        raise InvalidMessages(violations, context)
    return list(messages)


def identical_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading items of ``a`` and ``b`` are the same objects: a list that grew from
    another one (a resent history, the working context turn after turn) is recognised in one
    pass in C, checking its last shared item first; otherwise the first difference is looked for."""
    n = min(len(a), len(b))
    if n and a[n - 1] is b[n - 1] and all(map(operator.is_, a[:n], b[:n])):
        return n
    k = 0
    while k < n and a[k] is b[k]:
        k += 1
    return k


def copy_messages(messages: Iterable[Message]) -> list[Message]:
    """A deep copy, so the result can be edited without touching the caller's data."""
    return copy.deepcopy(list(messages))


def content_text(content: Any) -> str:
    """The text of a ``content`` value: the string itself, or text parts joined by newlines.

    Non-text parts (images, audio) contribute nothing; thinking blocks contribute their text.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for p in content:
            if isinstance(p, str):
                texts.append(p)
            elif isinstance(p, dict):
                t = p.get("text")
                if t is None:
                    t = p.get("thinking")
                if isinstance(t, str):
                    texts.append(t)
        return "\n".join(texts)
    return str(content)


def message_text(message: Mapping[str, Any]) -> str:
    """The text a message carries: its content plus, for assistants, its tool calls' names and
    arguments (one ``name(arguments)`` line each)."""
    text = content_text(message.get("content"))
    calls = tool_calls(message)  # tolerates a malformed 'tool_calls' (validate flags it)
    if calls:
        lines = [text] if text else []
        lines += [f"{tool_call_name(c)}({_args_str(c)})" for c in calls]
        return "\n".join(lines)
    return text


def tool_calls(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tool calls of an assistant message (empty list when it has none)."""
    calls = message.get("tool_calls")
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def tool_name(schema: Mapping[str, Any]) -> str:
    """The name of a tool definition in any API's format (OpenAI chat nests it under
    ``function``; Anthropic and Responses tools carry it at the top); ``""`` when it has none.
    The one reader of a tool definition's name."""
    fn = schema.get("function")
    if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
        return str(fn["name"])
    name = schema.get("name")
    return name if isinstance(name, str) else ""


def tool_call_id(call: Mapping[str, Any]) -> str:
    cid = call.get("id")
    return cid if isinstance(cid, str) else ""


def tool_call_name(call: Mapping[str, Any]) -> str:
    fn = call.get("function")
    if isinstance(fn, dict):
        name = fn.get("name")
        if isinstance(name, str):
            return name
    return "?"


def _args_str(call: Mapping[str, Any]) -> str:
    fn = call.get("function")
    args = fn.get("arguments") if isinstance(fn, dict) else None
    if args is None:
        return ""
    if isinstance(args, str):
        return args
    return json.dumps(args, ensure_ascii=False, sort_keys=True)


def tool_call_args(call: Mapping[str, Any]) -> dict[str, Any] | str:
    """Parsed arguments of a tool call: a dict when they are a JSON object, else the raw string."""
    raw = _args_str(call)
    if not raw.strip():
        return {}
    try:
        val = json.loads(raw)
    except ValueError:
        return raw
    return val if isinstance(val, dict) else raw


SUMMARY_MARKERS = ("[CONTEXT COMPACTION]", "[ctxengine:")


def is_summary(message: Mapping[str, Any]) -> bool:
    """True for messages an engine created to stand in for compacted ones.

    Engines mark such messages with a text prefix: the
    compressor's ``[CONTEXT COMPACTION]`` and the ``[ctxengine:...]`` markers of the other
    engines, so they stay recognisable after a JSON round trip.
    """
    text = content_text(message.get("content"))
    return text.startswith(SUMMARY_MARKERS)


def message_blocks(message: Mapping[str, Any]) -> int:
    """How many Anthropic content blocks a message becomes (what the 20-block cache lookback
    counts): one per content part (a string is one text part), one per tool call, at least one."""
    content = message.get("content")
    n = 0
    if isinstance(content, str):
        n = 1 if content else 0
    elif isinstance(content, list):
        n = len(content)
    n += len(tool_calls(message))
    return max(1, n)


def roles(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The roles of ``messages`` in order (handy in tests and tables)."""
    return [str(m.get("role")) for m in messages]
