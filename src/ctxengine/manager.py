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
tools: what :meth:`ContextManager.tools` returns) count in hygiene, the engine's trigger and the
window cap (:class:`ctxengine.window.ToolTokens`: serialised, memoised per distinct list). The
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

import importlib
import json
import logging
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ctxengine.caching import (
    CachePace,
    CachingStatus,
    Placement,
    apply_breakpoints,
    caching_status,
    default_placement,
    plan_breakpoints,
    system_and_3_breakpoints,
)
from ctxengine.config import Config, load_config
from ctxengine.engine import CompactionReport, ContextEngine, Services, normalize_usage
from ctxengine.engines.kit.records import RecallReach
from ctxengine.errors import ConfigError, CtxEngineError, EngineError, StoreError
from ctxengine.history import SessionHistory, TurnInput
from ctxengine.loop import check_output, engine_label, run_compress, should_compact
from ctxengine.messages import (
    Message,
    check,
    tool_call_args,
    tool_call_id,
    tool_call_name,
    tool_calls,
)
from ctxengine.models import ModelProfile, UnknownModelWarning, resolve_model
from ctxengine.recall import LCM_ALIASES, Recall, fit_answer
from ctxengine.redact import redact_obj
from ctxengine.registry import EngineRegistry
from ctxengine.storage import RecallStore, SessionAppender, SessionRecorder
from ctxengine.tokens import (
    AnchoredCounter,
    EstimateCounter,
    TokenCounter,
    get_counter,
)
from ctxengine.window import (
    TOOLS_OVERHEAD_TOKENS,
    CapResult,
    ToolTokens,
    WindowCap,
    WindowCounter,
    WindowLimit,
    WindowTally,
)

__all__ = ["HYGIENE_MIN_MESSAGES", "HYGIENE_RATIO", "CompactionDue", "ContextManager", "default_store"]

log = logging.getLogger("ctxengine.manager")

HYGIENE_RATIO = 0.85
"""Gateway hygiene fires at 85 % of the window (seed 000): high enough that it never competes
with the engine's own trigger (50–75 %), low enough to leave room for the next turn."""

HYGIENE_MIN_MESSAGES = 4
"""Hygiene ignores histories shorter than this (seed 000): nothing to compact yet."""

MAX_CONSECUTIVE_COMPACTIONS = 3
"""After compactions on this many consecutive turns, neither hygiene nor the engine's trigger
runs on the next turn (the window cap still holds the window): an engine that cannot get under
its own threshold would otherwise compact — and rewrite the cached prefix — on every turn."""

PRESSURE_RATIO = 0.85
"""Context pressure warnings (seed 000, off by default) at 85 % of the compaction threshold."""

StoreArg = SessionRecorder | Literal["default"] | None


class CompactionDue(CtxEngineError):
    """``prepare(..., may_compact=False)`` would do more than map the input and append it: a
    compaction, a window cut, an engine reset, tool calls to answer, a store write now, or it
    would wait for the session's lock (``reason`` says which). Raised before the session
    changed; the same call with ``may_compact=True`` does the turn."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _HeldNow:
    """``lock`` held for the block, or :class:`CompactionDue` when taking it would wait.

    A class rather than a generator context manager: the quick turn enters one twice, and
    each generator-based one costs a generator and its frames (~4K instructions)."""

    __slots__ = ("_lock",)

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise CompactionDue("another call holds the session")

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def default_store(config: Config) -> SessionRecorder | None:
    """The store the config asks for (SQLite by default), or ``None`` when storage is off.

    ``ctxengine.store`` is imported lazily, so this module never depends on it; its
    ``open_store(config.store)`` returns a :class:`~ctxengine.storage.SessionRecorder`.

    A store that cannot be opened (a directory that cannot be created, a file that is not a
    database, a PostgreSQL server that refuses the connection) is an error here, at
    construction: :class:`~ctxengine.errors.StoreError` naming the backend and the path,
    never a warning followed by a session that is silently not recorded. Set
    ``store.enabled: false`` to run without one.
    """
    if not config.store.enabled:
        return None
    try:
        module = importlib.import_module("ctxengine.store")
    except ImportError as exc:
        raise StoreError(f"the session store is enabled but cannot be loaded ({exc}); set store.enabled: false to run without it") from exc
    factory = getattr(module, "open_store", None)
    if not callable(factory):
        raise StoreError("the session store is enabled but ctxengine.store has no open_store()")
    where = _store_location(config)
    try:
        store = factory(config.store)
    except ConfigError:
        raise
    except StoreError as exc:
        message = str(exc)
        raise StoreError(message if where in message else f"cannot open the session store at {where}: {message}") from exc
    except Exception as exc:
        raise StoreError(f"cannot open the session store at {where}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(store, SessionRecorder):
        raise StoreError(f"the session store at {where} ({type(store).__name__}) cannot record sessions")
    return store


def _store_location(config: Config) -> str:
    """Where the configured store lives, for error messages (never a DSN: it may hold a password)."""
    st = config.store
    if st.backend == "postgres":
        return f"PostgreSQL (DSN from ${st.dsn_env})"
    if st.path:
        return str(st.path)
    try:
        import platformdirs

        return str(Path(platformdirs.user_data_dir("ctxengine")) / "sessions.db")
    except ImportError:  # pragma: no cover - platformdirs is a dependency
        return "the default SQLite path"


@dataclass
class _Session:
    id: str
    engine: ContextEngine
    counter: AnchoredCounter
    lock: threading.RLock = field(default_factory=threading.RLock)
    started: bool = False
    hygiene_armed: bool = True
    hygiene_fired: int = 0
    compactions: int = 0
    turns: int = 0
    last_sent: list[Message] = field(default_factory=list)
    last_request: list[Message] | None = None
    last_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    prompt_tokens_total: int = 0
    pressure_warning: str | None = None
    store_errors: int = 0
    engine_errors: int = 0
    last_compaction: dict[str, Any] | None = None
    recall: Recall | None = None
    # whether the recall tools reach the model (prepare(recall=...)); the session's engine
    # holds the same object (Services.reach), so its markers and the window cap's agree
    reach: RecallReach = field(default_factory=RecallReach)
    lost: bool = False
    streak: int = 0
    max_streak: int = 0
    window_cuts: int = 0
    fallback_reason: str | None = None
    history: SessionHistory = field(default_factory=SessionHistory)
    pace: CachePace = field(default_factory=CachePace)  # cache_ttl: auto (caching.CachePace)
    pending: Callable[[], list[str] | None] | None = None  # a turn's deferred recording (prepare(defer_record=True))
    tally: WindowTally = field(default_factory=WindowTally)  # the window cap's running sums
    # what the last prepared request carries besides its messages (tool definitions): the
    # decisions' count and the window cap's (o200k); update_from_response takes the first out
    # of the provider's prompt tokens, which include it
    tool_tokens: int = 0
    tool_window: int = 0
    window_version: int = 0  # the manager's window this session's engine was told (set_context_length)


class _SessionEstimate(EstimateCounter):
    """The estimate an engine of one session counts with: the same numbers as
    :class:`EstimateCounter`, memoised per message in the session's history (which keeps them
    for the cache planner), so each new message is estimated once a turn, not once by the
    engine's trigger and again when the turn is remembered."""

    def __init__(self, history: SessionHistory) -> None:
        self._history = history

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return sum(self._history.message_tokens(messages))


def _tool_name(schema: Mapping[str, Any]) -> str:
    fn = schema.get("function")
    if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
        return str(fn["name"])
    name = schema.get("name")
    return name if isinstance(name, str) else ""


def _answer(handler: Callable[[str, Any], str], name: str, args: Any) -> str:
    try:
        return handler(name, args)
    except Exception as exc:  # the model sees the failure instead of the agent crashing
        return json.dumps({"error": f"{name} failed: {type(exc).__name__}: {exc}"})


def _as_openai_tool(schema: Mapping[str, Any]) -> dict[str, Any]:
    if schema.get("type") == "function" and isinstance(schema.get("function"), Mapping):
        return dict(schema)
    return {"type": "function", "function": dict(schema)}


class ContextManager:
    """The per-turn facade (see the module docstring).

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
        self.strict = strict
        self.cap_window = cap_window
        self.model = model
        self.provider = provider or config.model.provider
        with warnings.catch_warnings():
            if engine_factory is not None:
                warnings.simplefilter("ignore", UnknownModelWarning)
            self.profile: ModelProfile = resolve_model(
                model,
                overrides=config.models,
                default_context_length=config.model.default_context_length,
                context_length=context_length,
                configured_context_length=config.model.context_length,  # models.<name> entries win over it
            )
        self.context_length = self.profile.context_length
        self.window_source: str = self.profile.window_source
        self._window_version = 0
        self.default_session = session_id
        self.store: SessionRecorder | None = default_store(config) if store == "default" else store
        # checked once: a runtime protocol check costs more than recording a turn
        self._appender: SessionAppender | None = self.store if isinstance(self.store, SessionAppender) else None
        self._registry = registry
        self._engine_factory = engine_factory
        self._counter = counter or get_counter(config.context.token_counter)
        self.window_counter = WindowCounter()
        # decisions count long new texts exactly (the estimate is 16 % low on a /sys listing)
        self._session_counter: TokenCounter = self.window_counter if isinstance(self._counter, EstimateCounter) else self._counter
        ctx = config.context
        self.window = WindowCap(
            WindowLimit.for_window(
                self.context_length,
                completion_reserve=ctx.completion_reserve,
                margin_ratio=ctx.window_margin,
            ),
            self.window_counter,
        )
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        self._tool_counts = ToolTokens(self._session_counter.count, self.window_counter.exact_text)
        pc = config.prompt_caching
        self.caching: CachingStatus = caching_status(model, self.provider, cache_ttl=config.cache_ttl, enabled=pc.enabled)
        self.placement: Placement = default_placement(self.provider) if pc.strategy == "auto" else pc.strategy

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
        return cls(
            cfg,
            model=name,
            provider=provider,
            store=store,
            registry=registry,
            session_id=session_id,
            context_length=context_length,
        )

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
            self.context_length = tokens
            self.profile = replace(self.profile, context_length=tokens, window_source=source)
            self.window_source = source
            self.window.window = limit
            if changed:
                self._window_version += 1
            sessions = list(self._sessions.values())
        if not changed:
            return
        log.info("model %s: window set to %s tokens (%s)", self.model, f"{tokens:,}", source)
        for s in sessions:
            if s.lock.acquire(blocking=False):
                try:
                    self._sync_window(s)
                finally:
                    s.lock.release()

    def _sync_window(self, s: _Session) -> None:
        """Tell the session's engine the manager's window (under the session's lock)."""
        version = self._window_version
        if s.window_version == version:
            return
        s.window_version = version
        if s.engine.context_length != self.context_length:
            try:
                s.engine.update_model(self.model, self.context_length)
            except Exception as exc:  # the window cap still holds the new window
                s.engine_errors += 1
                log.warning("session %s: engine %s failed in update_model: %s: %s", s.id, engine_label(s.engine), type(exc).__name__, exc)
        s.hygiene_armed = True

    def _tools_cost(self, s: _Session, agent: Sequence[Mapping[str, Any]] | None, *, quiet: bool = False, recall: bool | None = None) -> tuple[int, int]:
        """``(decision, window)`` tokens of the tool definitions the caller sends with the
        session's next request: ``agent`` (``None``: no tools at all) plus the engine's tools and
        the recall tools when offered (``recall`` overrides whether they are). ``quiet``: a
        list never counted before is :class:`CompactionDue` (counting 10K tokens of schemas
        takes milliseconds)."""
        if agent is None:
            return (0, 0)
        counts = self._tool_counts
        mine = counts.known(agent) if quiet else counts.count(agent)
        if mine is None:
            raise CompactionDue("a tool list not counted yet")
        own = s.engine.get_tool_schemas()
        offered = self._recall_offered(s) if recall is None else recall
        if not own and not (offered and s.recall is not None):
            return mine
        extra = [_as_openai_tool(t) for t in own]
        if offered and s.recall is not None:
            extra += [_as_openai_tool(t) for t in s.recall.tool_schemas()]
        theirs = counts.known(extra) if quiet else counts.count(extra)
        if theirs is None:
            raise CompactionDue("a tool list not counted yet")
        if mine == (0, 0):
            return theirs
        # one list: the fixed overhead once
        return (mine[0] + theirs[0] - TOOLS_OVERHEAD_TOKENS, mine[1] + theirs[1] - TOOLS_OVERHEAD_TOKENS)

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
            reserve = self._tools_cost(s, tools)[1] if tools is not None else s.tool_window
            return self.window.room(messages, tally=s.tally, reserve=reserve)

    # -- sessions ---------------------------------------------------------------------------
    def _services(self, sid: str, history: SessionHistory | None = None, reach: RecallReach | None = None) -> Services:
        recall = Recall(self.store, sid) if isinstance(self.store, RecallStore) else None
        counter = self._counter
        if history is not None and type(counter) is EstimateCounter:
            counter = _SessionEstimate(history)
        return Services(
            context_length=self.context_length,
            session_id=sid,
            store=self.store,
            recall=recall,
            counter=counter,
            model=self.model,
            config=self.config,
            reach=reach,
        )

    def _registry_get(self) -> EngineRegistry:
        if self._registry is None:
            self._registry = EngineRegistry(plugin_dirs=self.config.plugins.dirs, entry_points=self.config.plugins.entry_points)
        return self._registry

    def _new_engine(self, sid: str, name: str | None = None, history: SessionHistory | None = None, reach: RecallReach | None = None) -> ContextEngine:
        """A fresh engine for session ``sid`` (never shared between sessions); ``history`` is
        the session's, whose per-message estimates the engine's counter shares."""
        if self._engine_factory is not None and name is None:
            engine = self._engine_factory()
        else:
            engine = self._registry_get().create(
                name or self.config.context.engine,
                self.config,
                context_length=self.context_length,
                services=self._services(sid, history, reach),
            )
        if engine.context_length != self.context_length:
            engine.update_model(self.model, self.context_length)
        return engine

    def _fallback(self, s: _Session, reason: str) -> bool:
        """Switch ``s`` to ``context.fallback_engine`` after its engine failed; False when none
        is configured (or the fallback is the engine that failed)."""
        name = self.config.context.fallback_engine
        if not name or name == s.engine.name:
            return False
        log.warning(
            "session %s: engine %s replaced by the fallback %r: %s",
            s.id,
            engine_label(s.engine),
            name,
            reason,
        )
        engine = self._new_engine(s.id, name, s.history, s.reach)
        engine.on_session_start(s.id, model=self.model, context_length=self.context_length)
        s.engine = engine
        s.fallback_reason = reason
        return True

    def _start_engine(self, sid: str, history: SessionHistory, reach: RecallReach) -> ContextEngine:
        try:
            return self._new_engine(sid, history=history, reach=reach)
        except EngineError as exc:
            name = self.config.context.fallback_engine
            if not name or self._engine_factory is not None:
                raise
            log.warning(
                "session %s: engine %r failed to start, using the fallback %r: %s",
                sid,
                self.config.context.engine,
                name,
                exc,
            )
            return self._new_engine(sid, name, history, reach)

    def _anchored_counter(self, history: SessionHistory) -> AnchoredCounter:
        """The session's token count for decisions (anchored on the provider's prompt tokens)."""
        wc = self.window_counter
        if self._session_counter is not wc or type(self._counter) is not EstimateCounter:
            return AnchoredCounter(self._session_counter)

        # the window counter's count of a message without long texts is its estimate, which
        # the session's history memoises (the engine's trigger and the planner count with it)
        def one(m: Mapping[str, Any]) -> int:
            return wc.count_message(m, lambda x: history.message_tokens((x,))[0])

        return AnchoredCounter(wc, per_message=one)

    def _session(self, session_id: str | None) -> _Session:
        sid = session_id or self.default_session
        with self._lock:
            s = self._sessions.get(sid)
            if s is None:
                history = SessionHistory()
                reach = RecallReach()
                s = _Session(sid, self._start_engine(sid, history, reach), self._anchored_counter(history), history=history, reach=reach)
                if isinstance(self.store, RecallStore):
                    s.recall = Recall(self.store, sid)
                self._sessions[sid] = s
        if not s.started:
            with s.lock:
                if not s.started:
                    try:
                        s.engine.on_session_start(sid, model=self.model, context_length=self.context_length)
                    except Exception as exc:
                        err = EngineError(f"engine {engine_label(s.engine)} failed in on_session_start: {type(exc).__name__}: {exc}")
                        if not self._fallback(s, str(err)):
                            raise err from exc
                    s.started = True
        return s

    def engine(self, session_id: str | None = None) -> ContextEngine:
        """The engine instance serving ``session_id`` (created on first use)."""
        return self._session(session_id).engine

    @property
    def sessions(self) -> list[str]:
        with self._lock:
            return sorted(self._sessions)

    def reset_session(self, session_id: str | None = None) -> None:
        """``/new`` or ``/reset``: the engine clears per-session state; counters start over."""
        s = self._session(session_id)
        with s.lock:
            self._flush(s)
            s.engine.on_session_reset()
            s.counter.reset()
            s.hygiene_armed = True
            s.last_sent = []
            s.last_request = None
            s.last_tokens = 0
            s.pressure_warning = None
            s.lost = False
            s.streak = 0
            s.history.reset()
            s.tally.reset()

    def end_session(self, session_id: str | None = None, messages: Sequence[Message] | None = None) -> None:
        """The session ends (exit, expiry): ``on_session_end`` runs and the state is dropped."""
        sid = session_id or self.default_session
        with self._lock:
            s = self._sessions.pop(sid, None)
        if s is None:
            return
        with s.lock:
            self._flush(s)
            if s.started:
                s.engine.on_session_end(sid, list(messages) if messages is not None else list(s.last_sent))

    def resume_session(self, session_id: str) -> bool:
        """Start ``session_id`` from its record in the store (after a restart, or a session
        ended while idle): the store's latest working context and its originals come back, so
        the caller's resent raw history maps onto the working context again instead of being
        compacted anew. False (nothing done) when the session is already open, has no record,
        or the store cannot read histories back."""
        history = getattr(self.store, "history", None)
        originals = getattr(self.store, "originals", None)
        with self._lock:
            if session_id in self._sessions or not callable(history) or not callable(originals):
                return False
        try:
            working, raw = list(history(session_id)), list(originals(session_id))
        except Exception:  # no such session (NotFoundError) or an unreadable record
            return False
        if not raw:
            return False
        s = self._session(session_id)
        with s.lock:
            if s.turns or s.history.turns:
                return False
            s.history.resume(raw, working)
            s.last_sent = s.history.working
            s.lost = working != raw
        return True

    def close(self) -> None:
        """End every open session."""
        for sid in self.sessions:
            self.end_session(sid)

    def __enter__(self) -> ContextManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tools ------------------------------------------------------------------------------
    def _recall_offered(self, s: _Session) -> bool:
        """Recall tools go out once the context lost text, with a store, unless the engine
        answers recall itself (its own tools under a recall name, e.g. ``lcm_grep``)."""
        return s.lost and self._would_offer_recall(s)

    def _would_offer_recall(self, s: _Session) -> bool:
        """Whether the recall tools go out once the session's context lost text (never while
        the caller said they do not reach the model: ``prepare(recall=False)``)."""
        if s.recall is None or not s.reach.tools:
            return False
        own = {_tool_name(t) for t in s.engine.get_tool_schemas()}
        return not (own & (s.recall.names() | set(LCM_ALIASES)))

    def tools(
        self,
        agent_tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        session_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """The agent's tool list with the engine's tools and, once the session's context lost
        text and a store is enabled, the recall tools (``ctx_grep``, ``ctx_expand``) appended
        (OpenAI ``tools`` format).

        A tool whose name the agent already uses is left out, with a warning: the agent's own
        tool wins. Once offered, the recall tools stay for the session (a stable tool list
        keeps the provider's prompt cache warm).
        """
        s = self._session(session_id)
        out = [dict(t) for t in agent_tools or []]
        taken = {_tool_name(t) for t in out}
        schemas = list(s.engine.get_tool_schemas())
        if s.recall is not None and self._recall_offered(s):
            schemas += s.recall.tool_schemas()
        for schema in schemas:
            name = _tool_name(schema)
            if name in taken:
                log.warning("engine tool %r shadowed by an agent tool of the same name", name)
                continue
            taken.add(name)
            out.append(_as_openai_tool(schema))
        return out

    def _pending_calls(self, messages: list[Message], names: set[str] | Callable[[], set[str]]) -> list[tuple[str, str, Any]]:
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

    def _dispatch_recall(self, s: _Session, messages: list[Message]) -> list[Message]:
        """Answer the model's recall calls. Runs without the session lock: a search may take
        long, and other calls for this session must not wait on it."""
        recall = s.recall
        if recall is None:
            return messages
        pending = self._pending_calls(messages, lambda: recall.names() if self._recall_offered(s) else set())
        if not pending:
            return messages
        out = list(messages)
        for cid, name, args in pending:
            out.append({"role": "tool", "tool_call_id": cid, "content": _answer(recall.handle, name, args)})
        return out

    def _dispatch_engine_tools(self, s: _Session, messages: list[Message]) -> list[Message]:
        pending = self._pending_calls(messages, lambda: {_tool_name(t) for t in s.engine.get_tool_schemas()})
        if not pending:
            return messages
        out = list(messages)
        for cid, name, args in pending:
            out.append({"role": "tool", "tool_call_id": cid, "content": self._engine_answer(s, name, args, messages)})
        return out

    def _engine_answer(self, s: _Session, name: str, args: Any, messages: list[Message]) -> str:
        return _answer(lambda n, a: s.engine.handle_tool_call(n, a, session_id=s.id, messages=messages), name, args)

    def tool_names(self, *, session_id: str | None = None) -> frozenset[str]:
        """Names of the tools :meth:`handle_tool_call` answers for the session: the engine's,
        and the recall tools once they are offered (see :meth:`tools`)."""
        s = self._session(session_id)
        with s.lock:
            names = {_tool_name(t) for t in s.engine.get_tool_schemas()}
            if s.recall is not None and self._recall_offered(s):
                names |= s.recall.names()
        return frozenset(names)

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
        s = self._session(session_id)
        with s.lock:
            self._flush(s)  # recall reads the record
            own = {_tool_name(t) for t in s.engine.get_tool_schemas()}
            context = list(messages) if messages is not None else list(s.last_sent)
        recall = s.recall
        exact = self.window_counter.exact_text
        if name not in own and recall is not None and name in recall.names():
            # outside the lock, as in prepare
            return _answer(lambda n, a: recall.handle(n, a, max_tokens=max_tokens, count=exact), name, args)
        if name not in own:
            return json.dumps({"error": f"unknown tool {name!r} for this session"})
        with s.lock:
            answer = self._engine_answer(s, name, args, context)
        return answer if max_tokens is None else fit_answer(answer, max_tokens, exact, tool=name)

    def retrievable(self, text: str, *, session_id: str | None = None) -> bool:
        """True when ``text`` can be given back verbatim to the agent: by the recall tools over
        the session store, or by the engine's own means (:meth:`ContextEngine.retrievable`)."""
        s = self._session(session_id)
        if s.pending is not None:
            with s.lock:
                self._flush(s)
        if s.recall is not None and s.recall.retrievable(text):
            return True
        try:
            return bool(s.engine.retrievable(text))
        except Exception:
            return False

    # -- the turn ---------------------------------------------------------------------------
    def count_tokens(self, messages: Sequence[Message], *, session_id: str | None = None) -> int:
        """Tokens of ``messages`` as the decisions see them: the last real prompt tokens plus a
        count of the messages added since (long texts counted exactly), or a count of all."""
        return self._session(session_id).counter.count(messages)

    @property
    def hygiene_threshold(self) -> int:
        return int(self.context_length * HYGIENE_RATIO)

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
        :meth:`end_session`.

        ``may_compact=False`` asks for the cheap turn only (a caller that would rather not hand
        the call to a worker thread when it is quick, e.g. an event loop): when this call would
        compact, cut, reset the engine, answer tool calls, write to the store now (with
        ``defer_record=True`` an appending turn does not) or wait for the session's lock, it
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
        with s.lock if may_compact else _HeldNow(s.lock):
            s.reach.tools = recall is not False
            if not may_compact and s.pending is not None:
                raise CompactionDue("a deferred store write is pending")
            self._flush(s)
            self._sync_window(s)
            turn = self._input(s, messages, quiet=not may_compact)
        msgs = self._dispatch_recall(s, turn.messages) if may_compact else turn.messages
        with s.lock if may_compact else _HeldNow(s.lock):
            extra, extra_window = self._tools_cost(s, tools, quiet=not may_compact)
            counted = None if may_compact else self._check_quiet(s, turn, defer_record, extra, extra_window)
            if tools is not None and may_compact:
                self.tools(tools, session_id=s.id)  # warns of a clash (once per turn that may compact)
            msgs = self._dispatch_engine_tools(s, msgs)
            history = msgs
            ids = self._record(s, turn, history, defer=defer_record)
            enabled = self.config.compression.enabled
            # the quiet check counted this very list (no tool answer was added since)
            tokens = counted if counted is not None and msgs is turn.messages else s.counter.count(msgs) + extra
            compacted = False
            resting = s.streak >= MAX_CONSECUTIVE_COMPACTIONS
            if resting and may_compact and self.cap_window and self.window.over(msgs, tally=s.tally, reserve=extra_window):
                # resting would hand the turn to the window cap: a compaction cuts less blindly
                # (a client whose every turn is a large share of the window, e.g. aider's pasted files)
                resting = False
                log.info("session %s: %d consecutive compactions, but the window cap would cut: compacting", s.id, s.streak)
            if resting:
                log.info("session %s: %d consecutive compactions, compaction rests this turn (the window cap holds the window)", s.id, s.streak)
            if tokens < self.hygiene_threshold:
                s.hygiene_armed = True
            elif enabled and not resting and self._hygiene_due(s, tokens, msgs):
                s.hygiene_armed = False
                s.hygiene_fired += 1
                log.info("session hygiene: %s at %d tokens (>= %d), compacting", s.id, tokens, self.hygiene_threshold)
                out = self._compress(s, msgs, tokens, focus_topic, trigger="hygiene")
                compacted = out is not msgs
                msgs = out
                tokens = s.counter.count(msgs) + extra
            forced = compact and may_compact and not compacted
            if enabled and may_compact and (forced or (not resting and self._should_compact(s, tokens, msgs))):
                # a forced compaction is judged as at the threshold (the seed's manual /compress)
                judged = max(tokens, int(getattr(s.engine, "threshold_tokens", 0) or 0)) if forced else tokens
                out = self._compress(s, msgs, judged, focus_topic, trigger="client" if forced else "engine")
                compacted = compacted or out is not msgs
                msgs = out
                tokens = s.counter.count(msgs) + extra
            s.streak = s.streak + 1 if compacted else 0
            s.max_streak = max(s.max_streak, s.streak)
            if compacted and tools is not None:  # the recall tools may go out from now on
                extra, extra_window = self._tools_cost(s, tools)
            capped = self._cap(s, msgs, tokens, history, ids, tools, extra_window)
            if capped.changed:
                msgs = capped.messages
                extra, extra_window = self._tools_cost(s, tools)  # recall offered after a cut
                tokens = capped.tokens + extra
                s.counter.reset()
            s.tool_tokens, s.tool_window = extra, extra_window
            s.last_sent = msgs
            s.last_tokens = tokens
            s.turns += 1
            self._update_pressure(s, tokens)
            s.history.finish(turn, history, msgs)
            return msgs

    def _hygiene_due(self, s: _Session, tokens: int, msgs: list[Message]) -> bool:
        """Whether session hygiene compacts ``msgs`` (``tokens``) when compaction may run."""
        return tokens >= self.hygiene_threshold and s.hygiene_armed and len(msgs) >= HYGIENE_MIN_MESSAGES

    def _check_quiet(self, s: _Session, turn: TurnInput, defer_record: bool, extra: int = 0, extra_window: int = 0) -> int:
        """:class:`CompactionDue` unless this turn (``prepare(may_compact=False)``) only appends:
        the decisions :meth:`prepare` makes next, asked before anything changes (under the
        session's lock). Returns the tokens of the turn's messages and ``extra`` (its tool
        definitions: the count the turn uses); ``extra_window`` is their size for the window cap."""
        msgs = turn.messages

        def names() -> set[str]:
            own = {_tool_name(t) for t in s.engine.get_tool_schemas()}
            return own | s.recall.names() if s.recall is not None and self._recall_offered(s) else own

        if self._pending_calls(msgs, names):
            raise CompactionDue("tool calls to answer")
        if self.store is not None and not (defer_record and self._appender is not None and s.history.appends(turn)):
            raise CompactionDue("the turn is written to the store now")
        tokens = s.counter.count(msgs) + extra
        if self.config.compression.enabled and s.streak < MAX_CONSECUTIVE_COMPACTIONS:
            if self._hygiene_due(s, tokens, msgs):
                raise CompactionDue("session hygiene fires")
            try:
                due = should_compact(s.engine, tokens, msgs)
            except EngineError as exc:
                raise CompactionDue(f"the engine's trigger failed: {exc}") from exc
            if due:
                raise CompactionDue("the engine compacts")
        if self.cap_window and self.window.over(msgs, tally=s.tally, reserve=extra_window):
            raise CompactionDue("the window cap cuts")
        return tokens

    def _should_compact(self, s: _Session, tokens: int, msgs: list[Message]) -> bool:
        try:
            return should_compact(s.engine, tokens, msgs)
        except EngineError as exc:
            if self._fallback(s, str(exc)):
                return should_compact(s.engine, tokens, msgs)
            if self.strict:
                raise
            s.engine_errors += 1
            log.warning("%s", exc)
            return False

    def _cap(
        self,
        s: _Session,
        msgs: list[Message],
        tokens: int,
        history: list[Message],
        ids_of: Callable[[], list[str] | None],
        tools: Sequence[Mapping[str, Any]] | None = None,
        reserve: int = 0,
    ) -> CapResult:
        """Hold the window after the engine (see :mod:`ctxengine.window`), ``reserve`` tokens of
        tool definitions included; what is cut stays in the store, retrievable through recall."""
        if not self.cap_window:
            return CapResult(msgs, tokens, self.window.limit)
        ref_for = None
        over = self.window.over(msgs, tally=s.tally, reserve=reserve)
        if over and not s.lost and tools is not None and self._would_offer_recall(s):
            reserve = self._tools_cost(s, tools, recall=True)[1]  # a cut offers the recall tools
        # the ids only when something is cut (a deferred recording is written then)
        ids = ids_of() if self.store is not None and over else None
        if ids is not None and len(ids) == len(history):
            # built on the first cut only
            maps: list[dict[Any, str]] = []

            def ref_for(i: int, m: Message) -> str | None:
                if not maps:
                    pairs = list(zip(history, ids, strict=True))
                    maps.append({h.get("tool_call_id"): mid for h, mid in pairs if h.get("role") == "tool"})
                    maps.append({json.dumps(h, sort_keys=True, default=str): mid for h, mid in pairs if h.get("role") == "user"})
                if m.get("role") == "tool":
                    return maps[0].get(m.get("tool_call_id"))
                return maps[1].get(json.dumps(m, sort_keys=True, default=str))

        result = self.window.fit(msgs, ref_for=ref_for, tally=s.tally, reserve=reserve, recall=s.reach.tools)
        if result.changed:
            s.window_cuts += len(result.cut) + len(result.stubbed_users)
            s.lost = True
            for note in result.notes:
                log.info("session %s: %s", s.id, note)
        return result

    def _compress(self, s: _Session, msgs: list[Message], tokens: int, focus_topic: str | None, trigger: str) -> list[Message]:
        """One compaction through the shared loop (a copy, under ``context.engine_timeout``);
        returns ``msgs`` itself when nothing changed."""
        self._flush(s)  # the engine and the compaction's record see the turn recorded
        engine = s.engine
        deadline = self.config.context.engine_timeout
        try:
            outcome = run_compress(engine, msgs, tokens=tokens, focus_topic=focus_topic, deadline=deadline)
            out = outcome.output
            check_output(engine, msgs, out)
        except EngineError as exc:
            if self._fallback(s, str(exc)):
                return self._compress(s, msgs, tokens, focus_topic, trigger)
            if self.strict:
                raise
            s.engine_errors += 1
            log.warning("%s", exc)
            return msgs
        if out == msgs:
            return msgs
        s.compactions += 1
        s.lost = True
        s.counter.reset()
        report = engine.last_report
        if report is None or report.messages_after != len(out):
            report = CompactionReport(
                engine.name,
                len(msgs),
                len(out),
                tokens,
                self._counter.count_messages(out),
                elapsed_ms=outcome.elapsed_ms,
            )
        data = report.to_dict()
        data["trigger"] = trigger
        s.last_compaction = data
        if self.store is not None:
            try:
                self.store.record_compaction(s.id, data, s.history.plain(msgs), s.history.plain(out))
            except Exception as exc:  # the agent keeps going; status() reports it
                s.store_errors += 1
                log.warning("session store: recording a compaction of %s failed: %s", s.id, exc)
        return list(out)

    def _input(self, s: _Session, messages: Sequence[Message], *, quiet: bool = False) -> TurnInput:
        """The input stage: which messages are new (:mod:`ctxengine.history`), validated.
        ``quiet`` (``prepare(may_compact=False)``): :class:`CompactionDue` instead of an
        engine reset."""
        if not isinstance(messages, list | tuple):
            check(messages, context="messages passed to prepare")  # raises: not a list
        turn = s.history.begin(messages)
        if self.strict:
            turn.check(context="messages passed to prepare")
        if quiet and turn.reset_engine:
            raise CompactionDue("the history changed where it was compacted (the engine is reset)")
        if turn.reset_engine:
            # the caller's history changed where it was already compacted: the engine's
            # per-session state (a previous summary) belongs to the dropped branch
            s.engine.on_session_reset()
            s.counter.reset()
            s.hygiene_armed = True
        return turn

    def _record(self, s: _Session, turn: TurnInput, history: list[Message], *, defer: bool = False) -> Callable[[], list[str] | None]:
        """Record the turn's input (every original, before any cut): only what is new when the
        store's tip is the last working context (:meth:`SessionHistory.record`). Returns what
        gives the store ids of all of ``history`` (``None`` without a store or when recording
        failed); with ``defer``, an appending turn is left pending (:meth:`flush_records`) and
        asking for its ids records it now."""
        if self.store is None:
            return lambda: None
        if defer:
            job = s.history.record_later(self.store, s.id, turn, history, appender=self._appender)
            if job is not None:
                done: list[list[str] | None] = []

                def once() -> list[str] | None:
                    if not done:
                        try:
                            done.append(job())
                        except Exception as exc:
                            self._record_failed(s, exc)
                            done.append(None)
                    return done[0]

                s.pending = once
                return once
        try:
            ids = s.history.record(self.store, s.id, turn, history, appender=self._appender)
        except Exception as exc:
            self._record_failed(s, exc)
            return lambda: None
        return lambda: ids

    def _record_failed(self, s: _Session, exc: Exception) -> None:
        s.history.forget_tip()
        s.store_errors += 1
        log.warning("session store: recording the history of %s failed: %s", s.id, exc)

    def _flush(self, s: _Session) -> list[str] | None:
        """Run the session's deferred recording, if any (under the session's lock)."""
        job, s.pending = s.pending, None
        return job() if job is not None else None

    def flush_records(self, session_id: str | None = None) -> None:
        """Write the recordings ``prepare(defer_record=True)`` left pending: of ``session_id``,
        or of every session when ``None``. Store errors are counted and logged, as in
        :meth:`prepare`; the next turn then records the session in full."""
        with self._lock:
            targets = [self._sessions[session_id]] if session_id in self._sessions else [] if session_id is not None else list(self._sessions.values())
        for s in targets:
            with s.lock:
                self._flush(s)

    def _update_pressure(self, s: _Session, tokens: int) -> None:
        if not self.config.prompt_caching.pressure_warnings:
            return
        threshold = s.engine.threshold_tokens
        if threshold <= 0:
            return
        if tokens >= PRESSURE_RATIO * threshold:
            pct = round(100 * tokens / threshold)
            s.pressure_warning = f"Context is {pct}% to compaction threshold ({tokens:,}/{threshold:,} tokens)"
            log.warning(s.pressure_warning)
        else:
            s.pressure_warning = None

    def breakpoints(
        self, messages: Sequence[Message], *, session_id: str | None = None, tokens: Sequence[int] | None = None
    ) -> list[int]:
        """Indices that get a cache marker under the configured placement ([] when caching is
        off). Also remembers ``messages`` as the session's latest request: the planner places
        a breakpoint where the next request stops sharing its prefix. ``tokens`` (per message)
        saves estimating them again."""
        s = self._session(session_id)
        with s.lock:
            previous = s.last_request
            s.last_request = list(messages)
            s.last_sent = s.last_request
            planner = self.caching.enabled and self.placement == "planner"
            known = s.history.planner_inputs(messages) if planner and tokens is None else None
            toks = list(tokens) if tokens is not None else s.history.message_tokens(messages) if planner and known is None else []
        if not self.caching.enabled:
            return []
        if planner:
            return plan_breakpoints(
                messages,
                min_cache_tokens=self.profile.min_cache_tokens,
                tokens=toks if known is None else None,
                prefix_tokens=known[0] if known is not None else None,
                stable=known[1] if known is not None else None,
                native_anthropic=self.caching.native_anthropic,
                previous=previous,
            )
        return system_and_3_breakpoints(messages)

    def request(self, messages: Sequence[Message], *, session_id: str | None = None) -> list[Message]:
        """The messages to send, with ``cache_control`` markers when caching applies to this
        model and provider. A new list; ``messages`` is untouched: the marked messages are
        copies, the others are the same dicts (copying the whole history every turn would cost
        more than the rest of the turn), so treat the request as read-only."""
        if self.cap_window:
            # the session's running sums: the list prepare just returned costs nothing here
            s = self._session(session_id)
            with s.lock:
                messages = self.window.fit(messages, tally=s.tally, reserve=s.tool_window).messages
        indices = self.breakpoints(messages, session_id=session_id)
        if not self.caching.enabled:
            return list(messages)
        pace = self._session(session_id).pace
        ttl = pace.ttl("auto" if self.caching.auto_ttl else self.caching.cache_ttl)
        pace.observe(time.monotonic(), ttl)
        native = self.caching.native_anthropic
        return apply_breakpoints(messages, indices, cache_ttl=ttl, native_anthropic=native, share_unmarked=True)

    def update_from_response(self, usage: Any, *, session_id: str | None = None) -> None:
        """Record a response's usage (OpenAI or Anthropic shape, dict or SDK object): the engine
        sees it, and the next token counts are anchored on its real prompt tokens."""
        s = self._session(session_id)
        with s.lock:
            u = normalize_usage(usage)
            s.engine.update_from_response(usage)
            if u.prompt_tokens > 0 and s.last_sent:
                # the provider counted the tool definitions too: the anchor is the messages'
                s.counter.anchor(s.last_sent, max(0, u.prompt_tokens - s.tool_tokens))
            s.cache_read_tokens += u.cache_read_tokens
            s.cache_write_tokens += u.cache_write_tokens
            s.prompt_tokens_total += u.prompt_tokens
            s.pace.wrote(u.cache_write_tokens, u.prompt_tokens)

    def counters(self, session_id: str | None = None) -> dict[str, int]:
        """The session's turn counters (``turns``, ``compactions``, ``last_tokens``): what
        :meth:`status` reports of them, without asking the engine (cheap enough per request)."""
        s = self._session(session_id)
        with s.lock:
            return {"turns": s.turns, "compactions": s.compactions, "last_tokens": s.last_tokens}

    def status(self, session_id: str | None = None) -> dict[str, Any]:
        """Engine status plus the manager's view: hygiene, caching, cache usage, store."""
        s = self._session(session_id)
        with s.lock:
            st = dict(s.engine.get_status())
            st.update(
                {
                    "session": s.id,
                    "model": self.model,
                    "context_length": self.context_length,
                    "turns": s.turns,
                    "compactions": s.compactions,
                    "last_tokens": s.last_tokens,
                    "hygiene_threshold": self.hygiene_threshold,
                    "hygiene_fired": s.hygiene_fired,
                    "caching": self.caching.line,
                    "placement": self.placement if self.caching.enabled else None,
                    "cache_read_tokens": s.cache_read_tokens,
                    "cache_write_tokens": s.cache_write_tokens,
                    "store": type(self.store).__name__ if self.store is not None else None,
                    "store_errors": s.store_errors,
                    "engine_errors": s.engine_errors,
                    "window_limit": self.window.limit,
                    "window_source": self.window_source,
                    "tool_tokens": s.tool_window,
                    "window_cuts": s.window_cuts,
                    "max_consecutive_compactions": s.max_streak,
                    "recall_offered": self._recall_offered(s),
                }
            )
            if s.pressure_warning:
                st["pressure_warning"] = s.pressure_warning
            if s.last_compaction is not None:
                st["last_compaction"] = s.last_compaction
            if s.fallback_reason is not None:
                st["fallback_reason"] = s.fallback_reason
            clean: dict[str, Any] = redact_obj(st)  # no secret in status(): a plugin's or custom summarizer's text too
            return clean
