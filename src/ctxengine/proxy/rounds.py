"""The proxy's own round trips (:class:`RecallRounds`): the recall calls the model makes answered (alone, or beside the client's own calls), and a request the provider rejected for its length planned again and sent once more (see :mod:`ctxengine.proxy.base` for the layers)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import anyio
import orjson

from ctxengine.proxy.apis import ToolCall
from ctxengine.proxy.base import (
    Plan,
)
from ctxengine.proxy.limits import context_limit_from_error, is_context_length_error
from ctxengine.proxy.planning import Planning
from ctxengine.proxy.upstream import (
    UpstreamResponse,
)
from ctxengine.proxy.writer import encode
from ctxengine.tokens import estimate

log = logging.getLogger("ctxengine.proxy")


class RecallRounds(Planning):
    """See the module docstring."""

    def _answers(self, plan: Plan, calls: list[ToolCall], assistant: Mapping[str, Any] | None) -> list[tuple[ToolCall, str]]:
        """The answers to the model's calls to the proxy's tools (worker thread), sized to the
        room the window leaves: the follow-up request is the context, the proxy's earlier
        round trips, ``assistant`` (the reply that made the calls) and these answers, and each
        call gets an equal share of what is left."""
        assert plan.manager is not None
        made = estimate(orjson.dumps(assistant).decode()) if assistant else 0
        try:
            room = plan.manager.room(plan.context, None, session_id=plan.session) - plan.spent - made
        except Exception as exc:  # sizing must not cost the answer
            log.debug("room unknown, recall answers unbounded: %s", exc)
            room = None
        share = max(64, room // max(1, len(calls))) if room is not None else None
        out = [(c, self._run_tool(plan, c, share)) for c in calls]
        plan.spent += made + sum(estimate(r) for _, r in out)
        return out

    def _run_tool(self, plan: Plan, call: ToolCall, max_tokens: int | None = None) -> str:
        """Answer one call to a tool the proxy added, through the manager (the engine's own
        tools and the store-backed recall tools, ``ctx_grep`` …, with the dispatch ``prepare``
        uses), in at most ``max_tokens``."""
        assert plan.manager is not None
        try:
            return plan.manager.handle_tool_call(call.name, call.arguments, session_id=plan.session, messages=plan.context, max_tokens=max_tokens)
        except Exception as exc:  # the model sees the failure, the client never does
            log.warning("engine tool failed", extra={"fields": {"session": plan.session, "tool": call.name, "error": f"{type(exc).__name__}: {exc}"}})
            return orjson.dumps({"error": f"{call.name} failed: {type(exc).__name__}: {exc}"}).decode()

    async def _shrink(self, plan: Plan, status: int, content: bytes) -> bool:
        """A rejection of ``plan``'s request as longer than the model's window: learn the window
        it names (remembered per model; one that names none: 80 % of the window assumed), plan
        the client's request again for it, once. True when the plan was made again (send it);
        False for any other response, a second rejection, or a request the proxy did not plan."""
        if plan.retried or plan.manager is None or plan.state is None or plan.request is None:
            return False
        named = context_limit_from_error(status, content)
        if named is None and not is_context_length_error(status, content):
            return False
        mgr, api = plan.manager, plan.api
        model = str(plan.request["model"])
        before = mgr.context_length
        window = self.windows.learn(api.name, model, named if named is not None else max(1024, int(before * 0.8)))
        if window.tokens >= before and named is not None and named >= before:
            # the window was right: the provider counts more than our estimate; leave a margin
            window = self.windows.learn(api.name, model, max(1024, int(before * 0.9)))
        log.warning(
            "the upstream rejected a request as over the model's window; compacting to it and sending again",
            extra={"fields": {"api": api.name, "session": plan.session, "model": model, "window": window.tokens, "was": before}},
        )
        await anyio.to_thread.run_sync(lambda: mgr.set_context_length(window.tokens, source=window.source))
        try:
            again = await anyio.to_thread.run_sync(self._plan, api, plan.session, plan.request, plan.request_raw)
        except Exception as exc:
            self._fail_open(api, plan, "retry", exc)
            return False
        plan.retried = True
        if again.ticket is not None:  # the session's turn stays held by ``plan``'s ticket
            again.ticket.release()
        plan.body, plan.content, plan.context, plan.engine_tools = again.body, again.content, again.context, again.engine_tools
        plan.tokens_out, plan.compactions = again.tokens_out, plan.compactions + again.compactions
        self.metrics.child(self.metrics.context_retries, api.name).inc()
        return True

    async def _answer_beside(self, plan: Plan, calls: list[ToolCall]) -> None:
        """Recall calls made beside the client's own calls in one reply: answered now, and put
        back into the client's next requests (:mod:`ctxengine.proxy.pending`); the client gets
        its own calls only."""
        ours = [c for c in calls if c.name in plan.engine_tools]
        anchor = next((c.id for c in calls if c.name not in plan.engine_tools), None)
        if plan.state is None or not ours or anchor is None:
            return
        # the client has its answer already: its next request must wait for these answers
        # (they go into it), until _settle_later hands over to its own work
        gate = plan.gate = plan.gate or anyio.Event()
        plan.state.settling = gate
        answers = await anyio.to_thread.run_sync(self._answers, plan, ours, None)
        answered = [(c.id, c.name, c.arguments, r) for c, r in answers]
        plan.state.pending_recall.add(anchor, answered)
        self.metrics.tool_rounds.labels(plan.api.name).inc()

    async def _answer_tools(
        self, plan: Plan, url: str, headers: dict[str, str], data: dict[str, Any], resp: UpstreamResponse, content: bytes
    ) -> tuple[int, dict[str, Any], UpstreamResponse, bytes]:
        api = plan.api
        body = plan.body
        for _ in range(self.settings.max_tool_rounds):
            calls = api.calls(data)
            if not calls or not any(c.name in plan.engine_tools for c in calls):
                break
            if not all(c.name in plan.engine_tools for c in calls):  # the client's calls too
                await self._answer_beside(plan, calls)
                break
            assistant = api.assistant_message(data)
            results = await anyio.to_thread.run_sync(self._answers, plan, calls, assistant)
            body = api.followup(body, assistant, results)
            self.metrics.tool_rounds.labels(api.name).inc()
            resp, content = await self._post(url, headers, encode(body))
            if resp.status >= 400:
                return resp.status, {}, resp, content
            data = orjson.loads(content)
            await self._usage(plan, api.usage(data))
        return resp.status, api.without_calls(data, set(plan.engine_tools)), resp, content
