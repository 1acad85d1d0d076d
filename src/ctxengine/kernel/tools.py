"""Tool dispatch: the tool list a session sends (the agent's, the engine's, and the recall tools
once the context lost text), what those definitions cost in the window, and the answers to the
model's calls to engine and recall tools."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ctxengine.kernel.counting import Counting
from ctxengine.kernel.recording import Recorder
from ctxengine.kernel.state import CompactionDue, SessionState
from ctxengine.messages import (
    Message,
    tool_call_args,
    tool_call_id,
    tool_call_name,
    tool_calls,
    tool_name,
)
from ctxengine.recall import LCM_ALIASES, fit_answer
from ctxengine.window import TOOLS_OVERHEAD_TOKENS

__all__ = ["ToolDesk", "as_openai_tool", "pending_calls", "tool_name"]

log = logging.getLogger("ctxengine.manager")  # the kernel logs under the manager's name


def _answer(handler: Callable[[str, Any], str], name: str, args: Any) -> str:
    try:
        return handler(name, args)
    except Exception as exc:  # the model sees the failure instead of the agent crashing
        return json.dumps({"error": f"{name} failed: {type(exc).__name__}: {exc}"})


def as_openai_tool(schema: Mapping[str, Any]) -> dict[str, Any]:
    if schema.get("type") == "function" and isinstance(schema.get("function"), Mapping):
        return dict(schema)
    return {"type": "function", "function": dict(schema)}


def pending_calls(messages: list[Message], names: set[str] | Callable[[], set[str]]) -> list[tuple[str, str, Any]]:
    """``(call id, name, args)`` of the last assistant message's calls to ``names`` that
    have no result yet (``names`` may be a function: asked only when a call is unanswered,
    which most turns, ending on the results of the agent's own calls, are not)."""
    if not names:
        return []
    last = len(messages) - 1  # the last message that is not a tool result (a loop: no generator a turn)
    while last >= 0 and messages[last].get("role") == "tool":
        last -= 1
    if last < 0 or messages[last].get("role") != "assistant":
        return []
    calls = tool_calls(messages[last])
    if not calls:
        return []
    answered = {m.get("tool_call_id") for m in messages[last + 1 :]}
    open_calls = [(tool_call_id(call), tool_call_name(call), call) for call in calls]
    open_calls = [c for c in open_calls if c[0] not in answered]
    if not open_calls:
        return []
    wanted = names() if callable(names) else names
    out = []
    for cid, name, call in open_calls:
        if name in wanted:
            args = tool_call_args(call)
            out.append((cid, name, args if isinstance(args, dict) else {"input": args}))
    return out


class ToolDesk:
    """The tools of a manager's sessions: ``counting.tools`` memoises the definitions' counts."""

    def __init__(self, counting: Counting) -> None:
        self.counts = counting.tools
        self.exact = counting.window.exact_text

    # -- what is offered ----------------------------------------------------------------------
    def recall_offered(self, s: SessionState) -> bool:
        """Recall tools go out once the context lost text, with a store, unless the engine
        answers recall itself (its own tools under a recall name, e.g. ``lcm_grep``)."""
        return s.lost and self.would_offer_recall(s)

    @staticmethod
    def would_offer_recall(s: SessionState) -> bool:
        """Whether the recall tools go out once the session's context lost text (never while
        the caller said they do not reach the model: ``prepare(recall=False)``)."""
        if s.recall is None or not s.reach.tools:
            return False
        own = {tool_name(t) for t in s.engine.get_tool_schemas()}
        return not (own & (s.recall.names() | set(LCM_ALIASES)))

    def listing(self, s: SessionState, agent_tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
        """The agent's tools, then the engine's and the offered recall tools (OpenAI format);
        a name the agent already uses is left out with a warning."""
        out = [dict(t) for t in agent_tools or []]
        taken = {tool_name(t) for t in out}
        schemas = list(s.engine.get_tool_schemas())
        if s.recall is not None and self.recall_offered(s):
            schemas += s.recall.tool_schemas()
        for schema in schemas:
            name = tool_name(schema)
            if name in taken:
                log.warning("engine tool %r shadowed by an agent tool of the same name", name)
                continue
            taken.add(name)
            out.append(as_openai_tool(schema))
        return out

    def names(self, s: SessionState) -> set[str]:
        """The tools the session answers: the engine's, and the recall tools once offered."""
        own = {tool_name(t) for t in s.engine.get_tool_schemas()}
        return own | s.recall.names() if s.recall is not None and self.recall_offered(s) else own

    def cost(self, s: SessionState, agent: Sequence[Mapping[str, Any]] | None, *, quiet: bool = False, recall: bool | None = None) -> tuple[int, int]:
        """``(decision, window)`` tokens of the tool definitions the caller sends with the
        session's next request: ``agent`` (``None``: no tools at all) plus the engine's tools and
        the recall tools when offered (``recall`` overrides whether they are). ``quiet``: a
        list never counted before is :class:`CompactionDue` (counting 10K tokens of schemas
        takes milliseconds)."""
        if agent is None:
            return (0, 0)
        counts = self.counts
        mine = counts.known(agent) if quiet else counts.count(agent)
        if mine is None:
            raise CompactionDue("a tool list not counted yet")
        own = s.engine.get_tool_schemas()
        offered = self.recall_offered(s) if recall is None else recall
        if not own and not (offered and s.recall is not None):
            return mine
        extra = [as_openai_tool(t) for t in own]
        if offered and s.recall is not None:
            extra += [as_openai_tool(t) for t in s.recall.tool_schemas()]
        theirs = counts.known(extra) if quiet else counts.count(extra)
        if theirs is None:
            raise CompactionDue("a tool list not counted yet")
        if mine == (0, 0):
            return theirs
        # one list: the fixed overhead once
        return (mine[0] + theirs[0] - TOOLS_OVERHEAD_TOKENS, mine[1] + theirs[1] - TOOLS_OVERHEAD_TOKENS)

    # -- answering ----------------------------------------------------------------------------
    def dispatch_recall(self, s: SessionState, messages: list[Message]) -> list[Message]:
        """Answer the model's recall calls. Runs without the session lock: a search may take
        long, and other calls for this session must not wait on it."""
        recall = s.recall
        if recall is None:
            return messages
        pending = pending_calls(messages, lambda: recall.names() if self.recall_offered(s) else set())
        if not pending:
            return messages
        out = list(messages)
        for cid, name, args in pending:
            out.append({"role": "tool", "tool_call_id": cid, "content": _answer(recall.handle, name, args)})
        return out

    def dispatch_engine_tools(self, s: SessionState, messages: list[Message]) -> list[Message]:
        """Answer the model's calls to the engine's tools (under the session's lock)."""
        pending = pending_calls(messages, lambda: {tool_name(t) for t in s.engine.get_tool_schemas()})
        if not pending:
            return messages
        out = list(messages)
        for cid, name, args in pending:
            out.append({"role": "tool", "tool_call_id": cid, "content": self.engine_answer(s, name, args, messages)})
        return out

    @staticmethod
    def engine_answer(s: SessionState, name: str, args: Any, messages: list[Message]) -> str:
        return _answer(lambda n, a: s.engine.handle_tool_call(n, a, session_id=s.id, messages=messages), name, args)

    def answer(self, s: SessionState, name: str, args: Any, messages: Sequence[Message] | None, max_tokens: int | None) -> str:
        """One call to an engine or recall tool (``ContextManager.handle_tool_call``)."""
        with s.lock:
            Recorder.flush(s)  # recall reads the record
            own = {tool_name(t) for t in s.engine.get_tool_schemas()}
            context = list(messages) if messages is not None else list(s.last_sent)
        recall = s.recall
        exact = self.exact
        if name not in own and recall is not None and name in recall.names():
            # outside the lock, as in prepare
            return _answer(lambda n, a: recall.handle(n, a, max_tokens=max_tokens, count=exact), name, args)
        if name not in own:
            return json.dumps({"error": f"unknown tool {name!r} for this session"})
        with s.lock:
            answer = self.engine_answer(s, name, args, context)
        return answer if max_tokens is None else fit_answer(answer, max_tokens, exact, tool=name)
