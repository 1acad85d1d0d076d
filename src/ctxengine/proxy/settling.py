"""After the response (:class:`Settling`): its usage to the session's manager, the turn's deferred store write, the stage timings and the request's log line; the next request of a session waits for them (see :mod:`ctxengine.proxy.base` for the layers)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, cast

import anyio
from starlette.background import BackgroundTask
from starlette.responses import Response

from ctxengine.engine import normalize_usage
from ctxengine.proxy.apis import Api
from ctxengine.proxy.base import (
    Plan,
    ProxyBase,
)
from ctxengine.storage import RequestRecorder
from ctxengine.store.values import RequestRecord

log = logging.getLogger("ctxengine.proxy")


class Settling(ProxyBase):
    """See the module docstring."""

    def _usage_metrics(self, plan: Plan, usage: Mapping[str, Any] | None) -> bool:
        """Count a response's usage in the metrics; True when the manager should see it too."""
        if not usage:
            return False
        u = normalize_usage(usage)
        b = plan.billed  # every response's usage of the request (tool rounds too), for the request log
        b[0], b[1], b[2], b[3] = b[0] + u.prompt_tokens, b[1] + u.completion_tokens, b[2] + u.cache_read_tokens, b[3] + u.cache_write_tokens
        if plan.manager is None:
            return False
        api = plan.api.name
        self.metrics.child(self.metrics.prompt_tokens, api).inc(u.prompt_tokens)
        self.metrics.child(self.metrics.completion_tokens, api).inc(u.completion_tokens)
        self.metrics.child(self.metrics.cache_read, api).inc(u.cache_read_tokens)
        self.metrics.child(self.metrics.cache_write, api).inc(u.cache_write_tokens)
        return True

    async def _usage(self, plan: Plan, usage: Mapping[str, Any] | None) -> None:
        """The usage of a response feeds the session's manager (in a worker thread: it takes the
        session's lock, which a compaction may hold)."""
        if not self._usage_metrics(plan, usage):
            return
        await self._usage_to_manager(plan, dict(usage or {}))

    def _settle_later(self, plan: Plan, usage: Mapping[str, Any] | None = None) -> None:
        """What is left of a request once its response is out, off the response path, in one
        worker thread: the last response's usage to the manager and the turn's deferred store
        write (a local store: :meth:`ContextManager.flush_records`). The client has its answer
        by then; the session's next request waits for it (:meth:`_settled`), so every turn is
        planned with the previous usage and finds the previous turn recorded. Once per plan.

        A write that fails is counted (the session's ``store_errors``) and logged by the
        manager, and the next turn records the session in full: no message is lost. A process
        that dies before the write loses no message either: the client resends its history,
        and the turn is recorded with the next one."""
        if plan.settled:
            return
        plan.settled = True
        self._observe(plan)
        feed = self._usage_metrics(plan, usage)
        logged = self._logs_requests(plan) or plan.shadow
        state = plan.state
        gate, plan.gate = plan.gate, None  # recall answered beside the client's calls (_answer_beside)
        if not (feed or plan.deferred or logged):
            self._release(plan)
            if gate is not None:
                gate.set()
                if state is not None and state.settling is gate:
                    state.settling = None
            return
        done = anyio.Event()
        if state is not None:
            state.settling = done
        if gate is not None:  # its waiters now wait for ``done``
            gate.set()

        async def run() -> None:
            started = time.perf_counter()
            try:
                await anyio.to_thread.run_sync(self._settle, plan, dict(usage or {}), feed)
            finally:
                self._release(plan)  # after the turn's record: another process may take the session
                done.set()
                if state is not None and state.settling is done:
                    state.settling = None
                self.metrics.child(self.metrics.stage, plan.api.name, "settle").observe(time.perf_counter() - started)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    def _release(plan: Plan) -> None:
        ticket, plan.ticket = plan.ticket, None
        if ticket is not None:
            ticket.release()

    def _observe(self, plan: Plan) -> None:
        """The request's stage timings and added latency to the metrics (once the response is out)."""
        api = plan.api.name
        self.metrics.observe_stages(api, plan.stages)
        plan.stages = []
        if plan.added is not None:
            self.metrics.child(self.metrics.added_latency, api).observe(plan.added)
            plan.added = None

    def _settle(self, plan: Plan, usage: dict[str, Any], feed: bool) -> None:
        """:meth:`_settle_later`'s work (worker thread)."""
        mgr = plan.manager
        if feed and mgr is not None:
            self._feed_usage(plan, usage)
        if plan.deferred and mgr is not None:
            started = time.perf_counter()
            try:  # store errors are the manager's to count and log; anything else is logged here
                mgr.flush_records(plan.session)
            except Exception as exc:
                log.warning("writing a turn to the store failed", extra={"fields": {"session": plan.session, "error": f"{type(exc).__name__}: {exc}"}})
            self.metrics.child(self.metrics.stage, plan.api.name, "record").observe(time.perf_counter() - started)
        if plan.shadow:
            self._shadow_plan(plan)
        if self._logs_requests(plan):
            self._log_request(plan)

    def _shadow_plan(self, plan: Plan) -> None:
        """Shadow mode's plan of a request forwarded unchanged (:class:`~ctxengine.proxy.planning.Planning`
        makes it: planning is the layer above this one)."""

    def _logs_requests(self, plan: Plan) -> bool:
        """Whether the request goes into the store's request log: a chat request of a session,
        answered or failed, with a store that keeps the log."""
        return bool(plan.session and plan.outcome) and isinstance(self.store, RequestRecorder)

    def _log_request(self, plan: Plan) -> None:
        """The request's row in the store's request log (worker thread, after the response);
        a failed write is logged, never raised: the client has its answer."""
        try:
            prompt, completion, read, write = plan.billed
            outcome = "fail_open" if plan.failed_open and plan.outcome == "ok" else plan.outcome
            record = RequestRecord(
                session_id=plan.session, api=plan.api.name, model=str(plan.body.get("model") or ""), created_at=time.time(),
                client=plan.client, outcome=outcome, status=plan.status, tokens_in=plan.tokens_in, tokens_out=plan.tokens_out,
                prompt_tokens=prompt, completion_tokens=completion, cache_read_tokens=read, cache_write_tokens=write,
                compactions=plan.compactions, shadow=plan.shadow,
            )
            cast(RequestRecorder, self.store).record_request(record)
        except Exception as exc:
            log.warning("writing the request log failed", extra={"fields": {"session": plan.session, "error": f"{type(exc).__name__}: {exc}"}})

    def _after(self, response: Response, plan: Plan) -> Response:
        """``response`` with :meth:`_settle_later` (and ``plan.usage``) to run once it has been
        sent: the last byte of the body, or of the stream, is out."""

        async def settle() -> None:
            self._settle_later(plan, plan.usage)

        response.background = BackgroundTask(settle)
        return response

    async def _usage_to_manager(self, plan: Plan, usage: dict[str, Any]) -> None:
        await anyio.to_thread.run_sync(self._feed_usage, plan, usage)

    def _feed_usage(self, plan: Plan, usage: dict[str, Any]) -> None:
        """A response's usage to the session's manager (worker thread); a failure is logged."""
        mgr = plan.manager
        assert mgr is not None
        try:
            mgr.update_from_response(usage, session_id=plan.session)
        except Exception as exc:
            self._fail_open(plan.api, plan, "usage", exc)

    async def _settled(self, api: Api, session: str) -> None:
        """Wait for the session's previous request's :meth:`_settle_later` work."""
        s = self.sessions.get(api.name, session)
        if s is None or s.settling is None:
            return
        started = time.perf_counter()
        # one wait may hand over to the next (recall answers, then the usage and the write);
        # bounded: a response whose after-work never ran must not stall the session
        with anyio.move_on_after(self.settings.timeout):
            while (pending := s.settling) is not None and not pending.is_set():
                await pending.wait()
        self.metrics.stage.labels(api.name, "wait_settle").observe(time.perf_counter() - started)

    def _account(self, plan: Plan, outcome: str, status: int, started: float) -> None:
        plan.outcome, plan.status = outcome, status
        api = plan.api.name
        self.metrics.child(self.metrics.requests, api, outcome).inc()
        self.metrics.child(self.metrics.tokens_in, api).inc(plan.tokens_in)
        self.metrics.child(self.metrics.tokens_out, api).inc(plan.tokens_out)
        if plan.compactions:
            self.metrics.child(self.metrics.compactions, api).inc(plan.compactions)
        log.info(
            "request",
            extra={
                "fields": {
                    "api": api,
                    "session": plan.session,
                    "model": (plan.request or plan.body).get("model"),
                    "status": status,
                    "outcome": outcome,
                    "stream": (plan.request or plan.body).get("stream") is True,
                    "tokens_in": plan.tokens_in,
                    "tokens_out": plan.tokens_out,
                    "compactions": plan.compactions,
                    "planned": plan.planned or None,
                    "opened": True if plan.opened else None,
                    "plan_ms": round((plan.finished - plan.started) * 1000, 2) if plan.finished else None,
                    "ms": round((time.perf_counter() - started) * 1000, 2),
                }
            },
        )
