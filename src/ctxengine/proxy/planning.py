"""The manager's part of a request (:class:`Planning`): the session it belongs to (routed by its history when the client names none), and the plan: on the event loop when the turn only appends, else in a worker thread (see :mod:`ctxengine.proxy.base` for the layers)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import anyio

from ctxengine.manager import CompactionDue, ContextManager
from ctxengine.messages import tool_name
from ctxengine.proxy import provider_compaction
from ctxengine.proxy.apis import Api, Marking, has_cache_control
from ctxengine.proxy.base import (
    Plan,
    _same,
)
from ctxengine.proxy.rawbody import BodyCache
from ctxengine.proxy.session import (
    SessionKey,
    session_key,
    system_prompt_digest,
)
from ctxengine.proxy.settling import Settling
from ctxengine.proxy.state import ProxySession
from ctxengine.proxy.turns import Ticket
from ctxengine.proxy.writer import outgoing

log = logging.getLogger("ctxengine.proxy")

SEED_SCAN = 256
"""How many of the most recently updated stored sessions a key's first request after a
restart looks through for the key's other conversations."""


OPENING = "a session to open"
"""Why :meth:`Planning._plan_inline` cannot plan a request: its session is not open in this
process (on the model it names); :meth:`Planning._open` opens it in a worker thread."""


class TurnElsewhere(Exception):
    """A turn the event loop cannot plan because of another process (:meth:`Planning._take_turn`)."""


class Planning(Settling):
    """See the module docstring."""

    async def _route(self, api: Api, headers: Mapping[str, str], body: Mapping[str, Any]) -> str:
        """The session of a request that names none (:func:`session_key`, then the router;
        ``headers`` by their lower-case names); a
        key's first request since this process started seeds the router with the key's stored
        conversation first, so that after a restart a request resumes the conversation it
        continues and no other one."""
        history = api.history(body)
        k = session_key(api.name, headers, body, api.system(body), history)
        if not k.routed:
            return k.key
        if self.store is not None and not self.router.knows(k.key):
            return await anyio.to_thread.run_sync(self._seed_route_open, api, k, history, body)
        return self.router.route(k.key, history, branches=k.branches, prompt=k.prompt)

    def _seed_route_open(self, api: Api, k: SessionKey, history: Any, body: Mapping[str, Any]) -> str:
        """A key's first request in this process, in one worker thread: the router seeded from
        the store, the request routed, and its session opened (:meth:`_open`), so that the
        plan itself can run on the event loop."""
        self._seed(api, k)
        sid = self.router.route(k.key, history, branches=k.branches, prompt=k.prompt)
        try:
            self._open(api, sid, body)
        except Exception as exc:  # the plan opens it again, in a worker thread, and fails open there
            log.debug("session %s not opened with its route: %s: %s", sid, type(exc).__name__, exc)
        return sid

    def _seed(self, api: Api, k: SessionKey) -> None:
        """Give the router the stored conversations of ``k``: the one named by the key and its
        other conversations ``<key>.…`` among the recently updated sessions (worker thread;
        best effort). A client whose turns start a conversation of their own under a derived
        key (aider rewrites its files message: a different history at an early position) is
        then found again after a restart."""
        originals = getattr(self.store, "originals", None)
        listing = getattr(self.store, "list_sessions", None)
        if not callable(originals):
            return
        ids = [k.key]
        if callable(listing):
            try:
                recent = [s.id for s in listing(limit=SEED_SCAN) if str(s.id).startswith(k.key + ".")]
            except Exception as exc:  # an unreadable listing: the key's own conversation only
                log.debug("router: stored conversations of %s not listed: %s", k.key, exc)
                recent = []
            ids += list(reversed(recent[: self.router.per_key - 1]))  # the most recent seeded last
        for sid in ids:
            try:
                stored = list(originals(sid))
                if stored:
                    system, history = api.as_history(stored)
                    self.router.seed(k.key, sid, history, prompt=system_prompt_digest(system, history) if k.branches else None)
            except Exception as exc:  # no such session, an unreadable record: routed without it
                log.debug("router not seeded with %s: %s", sid, exc)

    def _body_cache(self, api: Api, session: str) -> BodyCache:
        """The session's last body (the session is opened here when new)."""
        return self.sessions.open(api.name, session).body

    def _sticky_betas(self, s: ProxySession | None, headers: dict[str, str]) -> None:
        """Keep a session's ``anthropic-beta`` flags once sent: a turn that drops one would
        change how the request is processed and miss the cache built with it."""
        if s is None:
            return
        key = next((k for k in headers if k.lower() == "anthropic-beta"), None)
        if key is None and not s.betas:
            return  # the usual request: no flags sent, none kept
        key = key or "anthropic-beta"
        sent = [b.strip() for b in headers.get(key, "").split(",") if b.strip()]
        s.betas.extend(b for b in sent if b not in s.betas)  # on the event loop: no other writer
        if s.betas:
            headers[key] = ",".join(s.betas)

    # -- the manager's part (worker thread, or the event loop when quick) -----------------
    def _plan(self, api: Api, session: str, body: Mapping[str, Any], raw: bytes) -> Plan:
        started = time.perf_counter()
        now = time.monotonic()
        s = self.sessions.open(api.name, session, now)
        if self.sessions.sweep_due(now, claim=True):
            self.end_idle_sessions(now)
        with s.lock:
            ticket = self._take_turn(api, s, wait=self.settings.timeout)
            try:
                plan = self._plan_locked(api, s, body, raw)
            except BaseException:
                if ticket is not None:
                    ticket.release()
                raise
            self._hold(plan, ticket)
        plan.started, plan.finished, plan.planned = started, time.perf_counter(), "worker"
        self.metrics.child(self.metrics.plans, api.name, "worker").inc()
        return plan

    def _shadow_plan(self, plan: Plan) -> None:
        """Shadow mode: what ctxengine would have sent for ``plan`` (forwarded unchanged), planned
        now, after the response (worker thread), its figures kept on ``plan`` for the request
        log and the session's turn recorded; a failure is a fail-open, the client has its answer."""
        try:
            would = self._plan(plan.api, plan.session, plan.body, plan.content)
            plan.tokens_in, plan.tokens_out, plan.compactions = would.tokens_in, would.tokens_out, would.compactions
            if would.deferred and would.manager is not None:
                would.manager.flush_records(plan.session)
        except Exception as exc:
            self._fail_open(plan.api, plan, "shadow", exc)

    def _open(self, api: Api, session: str, body: Mapping[str, Any]) -> None:
        """Open ``session`` for the model ``body`` names in this process (a worker thread: it
        reads the store, builds engines, counts tool lists): its proxy state, the model's
        manager, the manager's session resumed from the store's record (after a restart) or
        started with its engine, and the request's tool definitions counted. The turn is then
        planned on the event loop when it only appends (:meth:`_plan_inline`)."""
        started, now = time.perf_counter(), time.monotonic()
        s = self.sessions.open(api.name, session, now)
        if self.sessions.sweep_due(now, claim=True):
            self.end_idle_sessions(now)
        tools = body.get("tools")
        with s.lock:
            ticket = self._take_turn(api, s, wait=self.settings.timeout)
            try:
                mgr = self._open_manager(api, s, str(body["model"]))
            finally:
                if ticket is not None:
                    ticket.release()
            mgr.count_tools(tools if isinstance(tools, list) else None, session_id=session)
            s.fresh = max(time.perf_counter() - started, 1e-9)

    def _plan_inline(self, api: Api, session: str, body: Mapping[str, Any], raw: bytes) -> Plan | str:
        """The plan, made on the event loop when that is quick and cannot block it; else why it
        must go to a worker thread (:meth:`_plan`; the request's log line says it).

        Quick means: a local store (or none); the session open here on the same model (else
        :data:`OPENING`: :meth:`_open` opens it in a worker thread, resumed from the store,
        and the plan is tried here again); no idle sweep due; no other
        thread planning the session or holding its lock; and a turn that only appends
        (``prepare(may_compact=False)``: no store write now, no tool calls to answer), or one
        whose compaction or window cut is local work (:meth:`_compacts_inline`). A worker
        thread costs 0.2-0.8 ms of hand-over each way; the quick turn is a fraction of a
        millisecond."""
        if not self._local_store:
            return "a shared store"
        now = time.monotonic()
        s = self.sessions.get(api.name, session)
        if s is None or s.model != body["model"] or self.sessions.sweep_due(now):
            return OPENING if s is None or s.model != body["model"] else "an idle sweep"
        s.seen = now
        if not s.lock.acquire(blocking=False):
            return "the session is busy"
        ticket = None
        try:
            started = time.perf_counter()
            ticket = self._take_turn(api, s, wait=0.0)
            try:
                plan = self._plan_locked(api, s, body, raw, quick=True)
            except CompactionDue as exc:
                if not self._compacts_inline(api, s, exc):
                    return exc.reason
                plan = self._plan_locked(api, s, body, raw)
            self._hold(plan, ticket)
            ticket = None
        except TurnElsewhere as exc:
            return str(exc)
        finally:
            if ticket is not None:
                ticket.release()
            s.lock.release()
        plan.started, plan.finished, plan.planned = started, time.perf_counter(), "inline"
        self.metrics.child(self.metrics.plans, api.name, "inline").inc()
        return plan

    def _compacts_inline(self, api: Api, s: ProxySession, due: CompactionDue) -> bool:
        """Whether the compaction (or window cut) ``due`` is planned on the event loop too: it
        is local work (no store read, no tool calls, no wait for a lock), the session's engine
        calls no model (``calls_model`` False: digests, the extractive summary, rules; a summary
        by an LLM takes seconds) and the messages are at most ``proxy.inline_compaction_tokens``
        (a digest compaction of 30K tokens is 5-15 ms of CPU, which a worker thread spends
        under the same interpreter lock plus its hand-over; its store record waits for the
        response like a quick turn's)."""
        limit = self.settings.inline_compaction_tokens
        if not due.local or due.tokens > limit or s.model is None:
            return False
        mgr = self._managers.get((api.name, s.model))
        return mgr is not None and getattr(mgr.engine(s.id), "calls_model", True) is False

    def _take_turn(self, api: Api, s: ProxySession, *, wait: float) -> Ticket | None:
        """The session's turn across processes sharing the store (under ``s.lock``;
        :mod:`ctxengine.proxy.turns`): when another process served the session since this one
        did, its working context here is dropped and the plan resumes it from the store.
        ``None``: one process only (no store, or one in memory). On the event loop (``wait``
        0) a turn held elsewhere, or a session to reload, raises :class:`TurnElsewhere` (the
        plan goes to a worker thread, which waits for the turn and reloads); in a worker
        thread a turn still held after ``wait`` seconds is planned without it, logged."""
        turns = self.turns()
        if turns is None:
            return None
        ticket = turns.take(s.id, wait=wait)
        if ticket is None:
            if not wait:
                raise TurnElsewhere("the session's turn is held by another process")
            log.warning("a session's turn was held by another process too long; planned without it", extra={"fields": {"session": s.id, "waited_s": wait}})
            return None
        if s.version is not None and ticket.before != s.version and s.opened:
            if not wait:
                ticket.release()
                raise TurnElsewhere("another process served the session")
            self._reload(api, s)
        s.version = ticket.after
        return ticket

    def _reload(self, api: Api, s: ProxySession) -> None:
        """Drop the session's working context here (another process moved it in the store): the
        plan resumes it from the store (:meth:`_open_manager`)."""
        mgr = self._managers.get((api.name, s.model)) if s.model is not None else None
        if mgr is not None:
            mgr.end_session(s.id)
        s.model = None
        self.metrics.child(self.metrics.plans, api.name, "reloaded").inc()
        log.debug("session %s reloaded from the store: another process served it", s.id)

    @staticmethod
    def _hold(plan: Plan, ticket: Ticket | None) -> None:
        """Keep the turn until the plan's record is written (:meth:`Settling._settle_later`),
        or release it now when the record is already written."""
        if ticket is None:
            return
        if plan.deferred:
            plan.ticket = ticket
        else:
            ticket.release()

    def end_idle_sessions(self, now: float | None = None) -> int:
        """End the sessions idle longer than ``proxy.session_idle_seconds`` (``on_session_end``,
        their in-memory state dropped; the store keeps their record, and a returning client
        resumes from it). Runs on its own every so often; returns how many were ended."""
        now = time.monotonic() if now is None else now
        ended = 0
        for s in self.sessions.idle(now):
            with s.lock:
                if not self.sessions.drop(s, now):  # a request came in meanwhile
                    continue
                if s.model is not None:
                    mgr = self._managers.get((s.api, s.model))
                    if mgr is not None:
                        try:
                            mgr.end_session(s.id)
                        except Exception as exc:  # an engine's on_session_end must not stop the sweep
                            log.warning("ending an idle session failed", extra={"fields": {"session": s.id, "error": f"{type(exc).__name__}: {exc}"}})
            ended += 1
        if ended:
            self.metrics.idle_ended.inc(ended)
            log.info("idle sessions ended", extra={"fields": {"ended": ended, "idle_seconds": self.sessions.idle_seconds}})
        return ended

    def _open_manager(self, api: Api, s: ProxySession, model: str) -> ContextManager:
        """The manager of ``model`` holding the session (under ``s.lock``): a session new in
        this process resumes from the store; a session whose client switched models moves to
        the new model's manager the same way (its working context as recorded, not the full
        history compacted again)."""
        mgr = self.manager(api, model)
        if s.model == model:
            return mgr
        if s.model is not None:
            old = self._managers.get((api.name, s.model))
            if old is not None:
                old.end_session(s.id)  # writes what is pending first
        mgr.resume_session(s.id)
        s.model = model
        return mgr

    def _plan_locked(self, api: Api, s: ProxySession, body: Mapping[str, Any], raw: bytes, *, quick: bool = False) -> Plan:
        """The plan of one request, under the session's lock. ``quick``: only a turn that
        appends, else :class:`CompactionDue` before anything changed (:meth:`_plan_inline`)."""
        session = s.id
        mgr = self._open_manager(api, s, str(body["model"]))
        msgs, conv = api.read(body, s)
        recalled = s.pending_recall.apply(msgs) if s.pending_recall else None
        if recalled is not None:  # the recall turns the client never sends back
            msgs, conv = recalled, None
        before = 0 if quick else mgr.counters(session)["compactions"]  # a quick turn never compacts
        tools = body.get("tools")  # the window counts the tool definitions as the provider does
        if not isinstance(tools, list):
            tools = None
        # the recall tools reach the model only beside the client's own tools (_engine_tools):
        # otherwise no marker or summary may point to them
        reach = None if self.settings.recall_tools and tools else False
        # the provider's own compaction and what precedes it go as sent; the manager gets the rest
        frozen, live, counted = provider_compaction.split(msgs, tools) if provider_compaction.NEEDLE in raw else ([], msgs, tools)
        out = mgr.prepare(live, counted, session_id=session, defer_record=self._local_store, may_compact=not quick, recall=reach)
        out = provider_compaction.join(frozen, out)
        after_status = mgr.counters(session)
        plan = Plan(api, session, body, raw, state=s, request=body, request_raw=raw, manager=mgr, context=out, deferred=self._local_store and mgr.store is not None)
        plan.compactions = 0 if quick else after_status["compactions"] - before
        if s.fresh:
            plan.opened = True
            plan.stages.append(("open", s.fresh))
            s.fresh = 0.0
        changed = recalled is not None or not _same(out, msgs) or api.expands(raw)
        incoming = s.incoming
        if changed:  # after a compaction, every turn: each message estimated once
            plan.tokens_in, plan.tokens_out = incoming.tokens_in.count(msgs), incoming.tokens_out.count(out)
        else:
            plan.tokens_in = plan.tokens_out = after_status["last_tokens"]
        indices: list[int] = []
        # the byte check is quick (only the bytes new since last turn, when the cache parsed
        # this body); only a body that names the key is walked
        if mgr.caching.enabled and not (s.body.contains(raw, b'"cache_control"') and has_cache_control(body)):
            indices = mgr.breakpoints(out, session_id=session)
        # the TTL as the library marks it: with cache_ttl: auto, the session's pace chooses
        # (every request is observed, the ones the client marked itself too: their TTL is kept)
        ttl = mgr.cache_ttl(session_id=session) if mgr.caching.enabled else mgr.caching.cache_ttl
        marking = Marking(indices, ttl, mgr.caching.native_anthropic)
        sent = outgoing(api, s, body, raw, conv, out, changed, marking, self._engine_tools(api, mgr, s, body))
        plan.body, plan.content, plan.engine_tools = sent.body, sent.content, sent.engine_tools
        client = api.history(body)
        s.last_out = (len(client), client[-1] if client else None, sent.body)
        return plan

    def _plan_capped(self, api: Api, session: str, body: Mapping[str, Any], raw: bytes) -> Plan:
        """The plan of a request whose planning failed (fail open): the client's conversation
        held under the window by the window cap alone (:meth:`ContextManager.fit_window`), so
        what goes upstream is never over the window because context management failed; the
        client's request unchanged when it fits, or when even this fails (logged). What is cut
        is recorded in the session's store first (its markers point there). The session's own
        state is not touched: its next request is planned as usual."""
        plain = Plan(api, session, body, raw)
        try:
            mgr = self.manager(api, str(body["model"]))
            scratch = ProxySession(api.name, session)  # the session's own state stays as it was
            msgs, conv = api.read(body, scratch)
            tools = body.get("tools")
            frozen, live, counted = provider_compaction.split(msgs, tools if isinstance(tools, list) else None)
            fitted = provider_compaction.join(frozen, mgr.fit_window(live, counted, session_id=session))  # what is cut: recorded first
            if _same(fitted, msgs):
                return plain
            sent = outgoing(api, scratch, body, raw, conv, fitted, True, Marking([], mgr.caching.cache_ttl, mgr.caching.native_anthropic))
        except Exception as exc:  # the request goes as the client sent it
            log.warning("the window cap could not hold a failed request; forwarding it unchanged", extra={"fields": {"api": api.name, "session": session, "error": f"{type(exc).__name__}: {exc}"}})
            return plain
        log.info("a failed request held under the window", extra={"fields": {"api": api.name, "session": session, "messages_in": len(msgs), "messages_out": len(fitted)}})
        return Plan(api, session, sent.body, sent.content, request=body, request_raw=raw, context=fitted)

    def _engine_tools(self, api: Api, mgr: ContextManager, s: ProxySession, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The engine's tools to add: only when enabled and the client sends tools of its own;
        once added for a session they stay (a stable tool list keeps the cache warm)."""
        client_tools = body.get("tools")
        if not self.settings.recall_tools or not isinstance(client_tools, list) or not client_tools:
            return []
        offered = mgr.tools([], session_id=s.id)
        sticky = s.injected  # under the session's lock
        known = {tool_name(t) for t in sticky}
        for t in offered:
            name = tool_name(t)
            if name not in known:
                sticky.append(dict(t))
                known.add(name)
        taken = api.tool_names(body)
        return [t for t in sticky if tool_name(t) not in taken]
