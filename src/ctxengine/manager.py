"""The per-turn loop: one object an agent calls every turn.

::

    ctx = ContextManager.from_config("config.yaml", model="anthropic/claude-sonnet-4.5")
    messages = ctx.prepare(messages)          # compacts if needed; returns what to send
    request = ctx.request(messages)           # + cache_control markers for this provider
    resp = client.chat.completions.create(messages=request, tools=ctx.tools(my_tools), ...)
    ctx.update_from_response(resp.usage)      # real token counts drive the next decision

``prepare`` does, in order:

1. maps the input onto the session's working context (:mod:`ctxengine.history`): the list
   ``prepare`` returned last time plus new messages, or the caller's whole raw history resent
   (a gateway, a proxy), which gets the working context back plus only the new messages; an
   edited or truncated history starts a branch. Only the new messages are validated
   (:class:`~ctxengine.errors.InvalidMessages` lists every problem, with indices in the
   caller's list), counted and recorded in the store (appended after the last recorded one);
2. answers the recall tools the model called in the last assistant message (``ctx_grep``,
   ``ctx_expand``: :mod:`ctxengine.recall`, over the session store; outside the session lock,
   so a long search never blocks the session), then the engine's own tools (``lcm_grep`` …)
   through ``handle_tool_call``, and appends their results;
3. **gateway session hygiene** (seeds 000/001): a safety net fixed at 85 % of the model's window,
   counted from the last provider-reported prompt tokens plus a count of what was added
   since (long texts counted with o200k), only with ≥ 4 messages and compression enabled. It
   fires once when the session crosses 85 % and re-arms only after the session fell below it
   again: firing on every turn of a long session is what made the seed move it from 50 % to 85 %;
4. the engine's trigger and ``compress`` through the one agent loop (:mod:`ctxengine.loop`: a
   deep copy, ``context.engine_timeout``, anything the engine raises — ``SystemExit``
   included — an :class:`~ctxengine.errors.EngineError` naming it, or ``context.fallback_engine``
   takes the session over). After compactions on 3 consecutive turns, compaction rests a turn,
   unless the window cap would cut the request (a compaction beats a cut);
5. checks what the engine returned (rules 1, 2 and 5) and records any compaction in the
   session store;
6. **the window cap** (:mod:`ctxengine.window`), after any engine: the request is counted with
   o200k and, when it exceeds the window minus the completion reserve and margin, its largest
   outputs are cut (originals in the store, retrievable through recall).

The window holds what the provider counts: given ``prepare(messages, tools=agent_tools)``, the
tool definitions the caller sends (the agent's, the engine's and, once offered, the recall
tools: what :meth:`ContextManager.tools` returns) count in hygiene and the window cap
(:class:`ctxengine.window.ToolTokens`: serialised, memoised per distinct list). The engine works
against the room its messages have: its window is the window less those definitions (at least a
quarter of it) and its trigger sees the messages' tokens, so a large fixed tool list does not hold
every turn over the threshold. The
window itself can change at run time (:meth:`ContextManager.set_context_length`: a configured
or a learnt window), for the open sessions and the next ones.

From the first turn whose context lost text (a compaction or a cut), :meth:`tools` offers the
recall tools — with a store only, and not to an engine that answers recall itself.
One manager serves many sessions (``session_id=`` on every method); each session has its own
engine instance, token anchor and lock, so calls for one session are serialised while
different sessions proceed in parallel. Lifecycle hooks follow seed 002: ``on_session_start``
on a session's first use, ``on_session_reset`` on :meth:`ContextManager.reset_session`,
``on_session_end`` on :meth:`ContextManager.end_session` / :meth:`ContextManager.close`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ctxengine.caching import CachingStatus, Placement, caching_status, default_placement
from ctxengine.config import Config, load_config
from ctxengine.engine import ContextEngine
from ctxengine.errors import ConfigError
from ctxengine.kernel.breakpoints import CachePlan
from ctxengine.kernel.cap import CapStage
from ctxengine.kernel.compaction import HYGIENE_MIN_MESSAGES, HYGIENE_RATIO, Compaction
from ctxengine.kernel.compaction import MAX_CONSECUTIVE_COMPACTIONS as MAX_CONSECUTIVE_COMPACTIONS
from ctxengine.kernel.counting import Counting
from ctxengine.kernel.engines import EngineHost
from ctxengine.kernel.recording import Recorder, StoreArg, default_store
from ctxengine.kernel.sessions import SessionTable
from ctxengine.kernel.state import CompactionDue, ModelWindow, SessionState
from ctxengine.kernel.status import PRESSURE_RATIO as PRESSURE_RATIO
from ctxengine.kernel.status import counters, report
from ctxengine.kernel.tools import ToolDesk
from ctxengine.kernel.turn import TurnOptions, TurnPlanner
from ctxengine.messages import Message
from ctxengine.models import ModelProfile, UnknownModelWarning, resolve_model
from ctxengine.registry import EngineRegistry
from ctxengine.storage import SessionRecorder
from ctxengine.tokens import TokenCounter, get_counter
from ctxengine.window import ToolTokens, WindowCap, WindowCounter, WindowLimit

__all__ = ["HYGIENE_MIN_MESSAGES", "HYGIENE_RATIO", "CompactionDue", "ContextManager", "default_store"]
log = logging.getLogger("ctxengine.manager")


class ContextManager:
    """The per-turn facade (see the module docstring) over the kernel's stages
    (:mod:`ctxengine.kernel`).

    Build it with :meth:`from_config`. ``engine_factory`` (tests, benchmarks) replaces the
    registry lookup: it is called once per session and must return a fresh engine.
    ``strict=False`` (benchmarks) logs broken input or engine output instead of raising, so a
    misbehaving engine can be measured rather than stopped. ``cap_window=False`` turns the
    window cap off (only for the benchmark's no-compaction baseline).
    """

    def __init__(
        self,
        config: Config,
        *,
        model: str,
        provider: str | None = None,
        store: StoreArg = None,
        registry: EngineRegistry | None = None,
        session_id: str = "default",
        context_length: int | None = None,
        engine_factory: Callable[[], ContextEngine] | None = None,
        counter: TokenCounter | None = None,
        strict: bool = True,
        cap_window: bool = True,
    ) -> None:
        self.config = config
        self.model = model
        self.provider = provider or config.model.provider
        with warnings.catch_warnings():
            if engine_factory is not None:
                warnings.simplefilter("ignore", UnknownModelWarning)
            profile = resolve_model(
                model,
                overrides=config.models,
                default_context_length=config.model.default_context_length,
                context_length=context_length,
                configured_context_length=config.model.context_length,  # models.<name> entries win over it
            )
        self._window = ModelWindow(model, profile)
        self.default_session = session_id
        self.store: SessionRecorder | None = default_store(config) if store == "default" else store
        self._recorder = Recorder(self.store)
        self._counting = Counting(counter or get_counter(config.context.token_counter))
        self.window_counter: WindowCounter = self._counting.window
        self._tool_counts: ToolTokens = self._counting.tools
        ctx = config.context
        limit = WindowLimit.for_window(self.context_length, completion_reserve=ctx.completion_reserve, margin_ratio=ctx.window_margin)
        self.window = WindowCap(limit, self.window_counter)
        self._host = EngineHost(config, self._window, self._recorder, self._counting, registry=registry, engine_factory=engine_factory, strict=strict)
        self._table = SessionTable(self._host, self._counting, self._recorder, default=session_id)
        self._sessions: dict[str, SessionState] = self._table.by_id
        self._lock = self._table.lock
        self._tools = ToolDesk(self._counting)
        self._cap = CapStage(self.window, self._recorder, self._tools, enabled=cap_window)
        self._compaction = Compaction(config, self._window, self._host, self._cap, self._tools, self._recorder)
        self._turns = TurnPlanner(config, self._host, self._recorder, self._tools, self._compaction, self._cap)
        pc = config.prompt_caching
        self.caching: CachingStatus = caching_status(model, self.provider, cache_ttl=config.cache_ttl, enabled=pc.enabled)
        self.placement: Placement = default_placement(self.provider) if pc.strategy == "auto" else pc.strategy
        self._cache = CachePlan(self.caching, self.placement, self._window)

    @classmethod
    def from_config(
        cls,
        config: str | Path | Config | None = None,
        *,
        model: str | None = None,
        store: StoreArg = "default",
        registry: EngineRegistry | None = None,
        session_id: str = "default",
        provider: str | None = None,
        context_length: int | None = None,
    ) -> ContextManager:
        """A manager for ``model`` from a config file, a :class:`Config`, or the defaults.

        ``store="default"`` opens the configured store (SQLite unless ``store.enabled`` is
        false) when the store package is available; pass a recorder or ``None`` to choose.
        """
        cfg = config if isinstance(config, Config) else load_config(config)
        name = model or cfg.model.default
        if not name:
            raise ConfigError("no model: pass model=... or set model.default in the config")
        return cls(cfg, model=name, provider=provider, store=store, registry=registry, session_id=session_id, context_length=context_length)

    # -- settings the stages share ----------------------------------------------------------
    @property
    def profile(self) -> ModelProfile:
        return self._window.profile

    @property
    def context_length(self) -> int:
        return self._window.context_length

    @property
    def window_source(self) -> str:
        return self._window.source

    @property
    def strict(self) -> bool:
        return self._host.strict

    @strict.setter
    def strict(self, value: bool) -> None:
        self._host.strict = value

    @property
    def contain_engine_errors(self) -> bool:
        """Whether an engine's failure (it raised, missed its deadline, or broke rule 1 or 5)
        is contained even when :attr:`strict`: the turn goes on with the messages the engine was
        given, and the window cap holds the window (the proxy sets it: what goes upstream is
        then never over the window because an engine failed)."""
        return self._host.contain

    @contain_engine_errors.setter
    def contain_engine_errors(self, value: bool) -> None:
        self._host.contain = value

    @property
    def cap_window(self) -> bool:
        return self._cap.enabled

    @cap_window.setter
    def cap_window(self, value: bool) -> None:
        self._cap.enabled = value

    @property
    def hygiene_threshold(self) -> int:
        return self._compaction.hygiene_threshold

    # -- the window ---------------------------------------------------------------------------
    def set_context_length(self, tokens: int, *, source: str = "set") -> None:
        """Change the window of this manager's model to ``tokens``, for the open sessions and the
        next ones: the window cap, the hygiene threshold and each engine's ``context_length`` and
        ``threshold_tokens`` (the seed contract's ``update_model``). ``source`` says where the
        window comes from (``"config"``, ``"learnt"`` from a provider's rejection, ``"table"``,
        ``"default"`` …); :meth:`status` reports it as ``window_source``.

        Never waits for a session: an engine busy in another call (a compaction) is told at
        the start of its session's next call. Raises :class:`~ctxengine.errors.ConfigError` for
        a window that is not a positive integer, and
        :class:`~ctxengine.errors.ContextWindowError` when the configured completion reserve and
        margin leave no room in it (nothing is changed then)."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
            raise ConfigError(f"context length must be a positive number of tokens, not {tokens!r}")
        ctx = self.config.context
        limit = WindowLimit.for_window(tokens, completion_reserve=ctx.completion_reserve, margin_ratio=ctx.window_margin)
        with self._lock:
            changed = tokens != self.context_length
            self._window.profile = replace(self._window.profile, context_length=tokens, window_source=source)
            self.window.window = limit
            if changed:
                self._window.version += 1
            sessions = list(self._sessions.values())
        if not changed:
            return
        log.info("model %s: window set to %s tokens (%s)", self.model, f"{tokens:,}", source)
        for s in sessions:
            if s.lock.acquire(blocking=False):
                try:
                    self._host.sync_window(s)
                finally:
                    s.lock.release()

    def room(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None, *, session_id: str | None = None) -> int:
        """Tokens left in the window (limit = window - completion reserve - margin) after
        ``messages`` and the tool definitions: ``tools`` as in :meth:`prepare` (the agent's
        list; the engine's and offered recall tools are added), ``None`` for the tools the
        session's last :meth:`prepare` counted. Messages are counted with o200k, exactly.

        For a proxy that answers recall calls itself: the follow-up request is the context plus
        the assistant message that made the calls plus one result per call, so
        ``room(context + [assistant], tools)`` is what the results may use together; give each
        of ``n`` calls ``room // n - MESSAGE_OVERHEAD_TOKENS`` as ``max_tokens`` of
        :meth:`handle_tool_call`."""
        s = self._session(session_id)
        with s.lock:
            reserve = self._tools.cost(s, tools)[1] if tools is not None else s.tool_window
            return self._cap.room(s, messages, reserve)

    # -- sessions ---------------------------------------------------------------------------
    def _session(self, session_id: str | None) -> SessionState:
        return self._table.get(session_id)

    def engine(self, session_id: str | None = None) -> ContextEngine:
        """The engine instance serving ``session_id`` (created on first use)."""
        return self._session(session_id).engine

    @property
    def sessions(self) -> list[str]:
        return self._table.ids()

    def reset_session(self, session_id: str | None = None) -> None:
        """``/new`` or ``/reset``: the engine clears per-session state; counters start over."""
        self._table.reset(self._session(session_id))

    def end_session(self, session_id: str | None = None, messages: Sequence[Message] | None = None) -> None:
        """The session ends (exit, expiry): ``on_session_end`` runs and the state is dropped."""
        self._table.end(session_id, messages)

    def resume_session(self, session_id: str) -> bool:
        """Start ``session_id`` from its record in the store (after a restart, or a session
        ended while idle): the store's latest working context and its originals come back, so
        the caller's resent raw history maps onto the working context again instead of being
        compacted anew. False (nothing done) when the session is already open, has no record,
        or the store cannot read histories back."""
        return self._table.resume(session_id)

    def close(self) -> None:
        """End every open session."""
        for sid in self.sessions:
            self.end_session(sid)

    def __enter__(self) -> ContextManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tools ------------------------------------------------------------------------------
    def tools(self, agent_tools: Sequence[Mapping[str, Any]] | None = None, *, session_id: str | None = None) -> list[dict[str, Any]]:
        """The agent's tool list with the engine's tools and, once the session's context lost
        text and a store is enabled, the recall tools (``ctx_grep``, ``ctx_expand``) appended
        (OpenAI ``tools`` format).

        A tool whose name the agent already uses is left out, with a warning: the agent's own
        tool wins. Once offered, the recall tools stay for the session (a stable tool list
        keeps the provider's prompt cache warm).
        """
        return self._tools.listing(self._session(session_id), agent_tools)

    def count_tools(self, agent_tools: Sequence[Mapping[str, Any]] | None, *, session_id: str | None = None) -> int:
        """The window tokens of the tool definitions the session's next request sends with
        ``agent_tools`` (the engine's and offered recall tools included), counted now and
        memoised, so that a quick turn (``prepare(may_compact=False)``) finds them counted
        instead of refusing: a caller opening a session off its event loop counts them there."""
        s = self._session(session_id)
        with s.lock:
            return self._tools.cost(s, agent_tools)[1]

    def tool_names(self, *, session_id: str | None = None) -> frozenset[str]:
        """Names of the tools :meth:`handle_tool_call` answers for the session: the engine's,
        and the recall tools once they are offered (see :meth:`tools`)."""
        s = self._session(session_id)
        with s.lock:
            return frozenset(self._tools.names(s))

    def handle_tool_call(
        self,
        name: str,
        args: Any,
        *,
        session_id: str | None = None,
        messages: Sequence[Message] | None = None,
        max_tokens: int | None = None,
    ) -> str:
        """Answer one call the model made to an engine or recall tool (a proxy that runs the
        round trip itself, instead of passing the call back through :meth:`prepare`): the
        same dispatch ``prepare`` uses. Returns the tool result (a JSON error for a failure
        or a name the session does not answer); ``messages`` is the context the call was made
        in (the session's last prepared list by default).

        ``max_tokens`` bounds the answer (o200k tokens of the returned text; see :meth:`room`):
        a recall tool returns fewer messages or results, or the first message cut, and says in
        a ``note`` what was left out and how to ask for it; any other tool's answer is cut to
        its head with such a note (:func:`ctxengine.recall.fit_answer`)."""
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
            raise ValueError(f"max_tokens must be a positive number of tokens, not {max_tokens!r}")
        return self._tools.answer(self._session(session_id), name, args, messages, max_tokens)

    def retrievable(self, text: str, *, session_id: str | None = None) -> bool:
        """True when ``text`` can be given back verbatim to the agent: by the recall tools over
        the session store, or by the engine's own means (:meth:`ContextEngine.retrievable`)."""
        s = self._session(session_id)
        if s.pending is not None:
            with s.lock:
                self._recorder.flush(s)
        if s.recall is not None and s.recall.retrievable(text):
            return True
        try:
            return bool(s.engine.retrievable(text))
        except Exception:
            return False

    # -- the turn ---------------------------------------------------------------------------
    def fit_window(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None, *, session_id: str | None = None
    ) -> list[Message]:
        """``messages`` held under the window by the window cap alone, ``tools`` counted as the
        provider counts them: no engine, and no session's state used or changed. The last resort
        of a caller whose turn failed (the proxy's fail-open path); raises
        :class:`~ctxengine.errors.ContextWindowError` when even the anchors overflow.

        With ``session_id`` and a store, messages that are over the window are first recorded
        in that session's store, as :meth:`prepare` records a turn's input (a failed write is
        logged), and every cut points at its original (``kept verbatim in the session store``,
        no recall tool named). Without them nothing is recorded: outputs and older user messages
        are cut to their head and old exchanges dropped, with no marker saying the originals are
        kept anywhere."""
        reserve = self._tool_counts.count(tools)[1] if tools else 0
        return self._cap.fit_alone(messages, reserve, session_id).messages

    def count_tokens(self, messages: Sequence[Message], *, session_id: str | None = None) -> int:
        """Tokens of ``messages`` as the decisions see them: the last real prompt tokens plus a
        count of the messages added since (long texts counted exactly), or a count of all."""
        return self._session(session_id).counter.count(messages)

    def prepare(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        session_id: str | None = None,
        focus_topic: str | None = None,
        defer_record: bool = False,
        may_compact: bool = True,
        compact: bool = False,
        recall: bool | None = None,
    ) -> list[Message]:
        """What to send this turn (see the module docstring). Never mutates ``messages``.

        ``messages`` is either the list this method returned last time for ``session_id`` plus
        what happened since, or the caller's **whole raw history** every turn (the gateway and
        proxy pattern: ``prepare(raw_history, session_id=conversation)``). In the second case
        the manager recognises the part it has seen (message by message, by identity or by
        value, so a history decoded from JSON again each turn is recognised too) and returns
        the session's working context, compacted as before, plus the new messages: resending
        the history never causes a compaction the prepared list would not. A history edited or
        truncated by the client (a retry, an edited message) branches: from the change on,
        the caller's messages replace the old ones; when the change lies in the part already
        compacted, the history is taken as given and the engine's per-session state is reset,
        so nothing from the dropped turns comes back. The mapping lives in memory per session
        (a new manager starts from the history it is given). A message already passed is taken
        as unchanged while it is the same dict: edit by sending a new dict, not in place.

        ``tools`` (the agent's tool list) is only checked for clashes with engine tools here;
        send :meth:`tools` to the provider. The result is never larger than the window minus
        the completion reserve and margin (:mod:`ctxengine.window`); when even the system prompt
        and the latest user message cannot fit, :class:`~ctxengine.errors.ContextWindowError`.

        ``defer_record=True`` leaves the store write of a turn that continues the session (the
        common turn: it appends to the record, or records the whole list after a compaction)
        for :meth:`flush_records`, so a caller can run it while the provider answers (an async
        caller): the turn's result is the same. The write runs
        anyway before anything else reads or writes the session's record: the next call for
        the session, a compaction or a window cut in this turn, a recall or tool call,
        :meth:`end_session`. A compaction in such a turn leaves its own record (the event and
        the compacted context) pending the same way, after the turn's write.

        ``may_compact=False`` asks for the cheap turn only (a caller that would rather not hand
        the call to a worker thread when it is quick, e.g. an event loop): when this call would
        compact, cut, reset the engine, answer tool calls, write to the store now (with
        ``defer_record=True`` a turn that continues the session does not) or wait for the session's lock, it
        raises :class:`CompactionDue` before changing anything, and the caller makes the same
        call with ``may_compact=True`` (in its worker thread). Otherwise the result is the
        same as without the flag. The engine's trigger is asked once either way.

        ``compact=True`` compacts this turn whatever the trigger says (a client's own
        compaction request, e.g. the Responses API's ``/responses/compact``): the engine's
        ``compress`` runs unless session hygiene already compacted the turn.

        ``recall`` says whether the recall tools reach the model this turn. ``None`` (default):
        as the manager decides (the caller sends :meth:`tools`, which offers them once the
        context lost text). ``False``: they do not (a proxy whose client sends no tools, e.g.
        aider): :meth:`tools` does not add them, no marker, summary or window-cap note names
        ``ctx_expand``/``ctx_grep`` (they say what was removed and that the originals are kept
        in the session store), and recall calls are not answered. ``True``: same as ``None``.
        Each call says it again (the engine's texts of this turn follow it).
        """
        s = self._session(session_id)
        opts = TurnOptions(focus_topic=focus_topic, defer_record=defer_record, may_compact=may_compact, compact=compact, recall=recall)
        return self._turns.prepare(s, messages, tools, opts)

    def flush_records(self, session_id: str | None = None) -> None:
        """Write the recordings ``prepare(defer_record=True)`` left pending: of ``session_id``,
        or of every session when ``None``. Store errors are counted and logged, as in
        :meth:`prepare`; the next turn then records the session in full."""
        self._table.flush(session_id)

    def breakpoints(self, messages: Sequence[Message], *, session_id: str | None = None, tokens: Sequence[int] | None = None) -> list[int]:
        """Indices that get a cache marker under the configured placement ([] when caching is
        off). Also remembers ``messages`` as the session's latest request: the planner places
        a breakpoint where the next request stops sharing its prefix. ``tokens`` (per message)
        saves estimating them again."""
        return self._cache.breakpoints(self._session(session_id), messages, tokens)

    def request(self, messages: Sequence[Message], *, session_id: str | None = None) -> list[Message]:
        """The messages to send, with ``cache_control`` markers when caching applies to this
        model and provider. A new list; ``messages`` is untouched: the marked messages are
        copies, the others are the same dicts (copying the whole history every turn would cost
        more than the rest of the turn), so treat the request as read-only.

        ``messages`` is meant to be what :meth:`prepare` returned. Given anything else (a tool
        result appended after ``prepare``, a list ``prepare`` never saw, one it returned with
        messages dropped), ``request`` prepares it first, exactly as ``prepare(messages,
        tools)`` with the ``tools`` and ``recall`` of the session's last ``prepare`` would: the
        new messages are validated and recorded in the session store before anything is cut,
        the engine may compact, and the window cap's cuts point at the originals. Nothing is
        ever cut unrecorded. Such a ``request`` is a turn (it may take as long as a compacting
        ``prepare``); call :meth:`tools` after it, as usual, for the tool list to send."""
        s = self._session(session_id)
        with s.lock:
            seen = s.history.is_working(messages)
            tools, reach = s.agent_tools, s.reach.tools
        if not seen:
            log.debug("session %s: request() given messages prepare() did not return: prepared first", s.id)
            messages = self._turns.prepare(s, messages, tools, TurnOptions(recall=None if reach else False))
        if self.cap_window:
            # the session's running sums: the list prepare just returned costs nothing here
            with s.lock:
                messages = self._cap.fit_request(s, messages)
        return self._cache.mark(messages, self.breakpoints(messages, session_id=session_id), s.pace)

    def cache_ttl(self, *, session_id: str | None = None) -> str:
        """The TTL of the cache markers of the request about to be sent in ``session_id``
        (what :meth:`request` marks with): ``prompt_caching.cache_ttl``, or with ``auto`` the
        session's pace's choice (1h once a person's pauses cost more than the dearer writes).
        Observes the request: call once per request, for a caller that places markers itself."""
        return self._cache.ttl(self._session(session_id).pace)

    def update_from_response(self, usage: Any, *, session_id: str | None = None) -> None:
        """Record a response's usage (OpenAI or Anthropic shape, dict or SDK object): the engine
        sees it, and the next token counts are anchored on its real prompt tokens."""
        s = self._session(session_id)
        with s.lock:
            self._counting.take_usage(s, usage)

    def counters(self, session_id: str | None = None) -> dict[str, int]:
        """The session's turn counters (``turns``, ``compactions``, ``last_tokens``): what
        :meth:`status` reports of them, without asking the engine (cheap enough per request)."""
        s = self._session(session_id)
        with s.lock:
            return counters(s)

    def status(self, session_id: str | None = None) -> dict[str, Any]:
        """Engine status plus the manager's view: hygiene, caching, cache usage, store."""
        s = self._session(session_id)
        with s.lock:
            return report(
                s,
                self._window,
                caching=self.caching,
                placement=self.placement,
                store=self.store,
                limit=self.window.limit,
                hygiene_threshold=self.hygiene_threshold,
                recall_offered=lambda: self._tools.recall_offered(s),
            )
