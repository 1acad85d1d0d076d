"""The engine host: each session's engine built (never shared between sessions), started, told
the window, replaced by ``context.fallback_engine`` when it fails, and its ``compress`` run
through the one loop (:mod:`ctxengine.loop`: a deep copy, ``context.engine_timeout``, the
output guard ``check_output``), the compaction recorded in the store."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ctxengine.config import Config
from ctxengine.engine import CompactionReport, ContextEngine, Services
from ctxengine.engines.kit.records import RecallReach
from ctxengine.errors import EngineError
from ctxengine.history import SessionHistory
from ctxengine.kernel.counting import Counting
from ctxengine.kernel.recording import Recorder
from ctxengine.kernel.state import ModelWindow, SessionState
from ctxengine.loop import check_output, engine_label, run_compress, should_compact
from ctxengine.messages import Message
from ctxengine.recall import Recall
from ctxengine.registry import EngineRegistry
from ctxengine.storage import NodeBatchStore, NodeStage, RecallStore

__all__ = ["EngineHost"]

log = logging.getLogger("ctxengine.manager")  # the kernel logs under the manager's name


class EngineHost:
    """Builds and runs the sessions' engines. ``engine_factory`` (tests, benchmarks) replaces
    the registry lookup; ``strict=False`` logs an engine's failure instead of raising, and so
    does ``contain=True`` for the engine's failures alone (the proxy: a failed or rejected
    compaction leaves the messages as they were and the window cap holds the window)."""

    def __init__(
        self,
        config: Config,
        window: ModelWindow,
        recorder: Recorder,
        counting: Counting,
        *,
        registry: EngineRegistry | None = None,
        engine_factory: Callable[[], ContextEngine] | None = None,
        strict: bool = True,
        contain: bool = False,
    ) -> None:
        self.config = config
        self.window = window
        self.recorder = recorder
        self.counting = counting
        self._registry = registry
        self.engine_factory = engine_factory
        self.strict = strict
        self.contain = contain

    # -- building ---------------------------------------------------------------------------
    def services(self, sid: str, history: SessionHistory | None = None, reach: RecallReach | None = None, nodes: NodeStage | None = None) -> Services:
        store = self.recorder.store
        recall = Recall(store, sid) if isinstance(store, RecallStore) else None
        return Services(
            context_length=self.window.context_length,
            session_id=sid,
            store=store,
            recall=recall,
            counter=self.counting.counter,
            tokens=self.counting.for_engine(history),
            model=self.window.model,
            config=self.config,
            reach=reach,
            # a store that records nodes with the compaction: the engine stages them
            nodes=nodes if isinstance(store, NodeBatchStore) else None,
        )

    @property
    def registry(self) -> EngineRegistry:
        if self._registry is None:
            self._registry = EngineRegistry(plugin_dirs=self.config.plugins.dirs, entry_points=self.config.plugins.entry_points)
        return self._registry

    def new_engine(
        self, sid: str, name: str | None = None, history: SessionHistory | None = None, reach: RecallReach | None = None, nodes: NodeStage | None = None
    ) -> ContextEngine:
        """A fresh engine for session ``sid`` (never shared between sessions); ``history`` is
        the session's, whose per-message counts the engine reads (``Services.tokens``)."""
        length = self.window.context_length
        if self.engine_factory is not None and name is None:
            engine = self.engine_factory()
        else:
            engine = self.registry.create(name or self.config.context.engine, self.config, context_length=length, services=self.services(sid, history, reach, nodes))
        if engine.context_length != length:
            engine.update_model(self.window.model, length)
        return engine

    def start_engine(self, sid: str, history: SessionHistory, reach: RecallReach, nodes: NodeStage | None = None) -> ContextEngine:
        """A new session's engine, the fallback when the configured one fails to start."""
        try:
            return self.new_engine(sid, history=history, reach=reach, nodes=nodes)
        except EngineError as exc:
            name = self.config.context.fallback_engine
            if not name or self.engine_factory is not None:
                raise
            log.warning("session %s: engine %r failed to start, using the fallback %r: %s", sid, self.config.context.engine, name, exc)
            return self.new_engine(sid, name, history, reach, nodes)

    def on_start(self, s: SessionState) -> None:
        """The engine's ``on_session_start`` (under the session's lock), the fallback's when it fails."""
        try:
            s.engine.on_session_start(s.id, model=self.window.model, context_length=self.window.context_length)
        except Exception as exc:
            err = EngineError(f"engine {engine_label(s.engine)} failed in on_session_start: {type(exc).__name__}: {exc}")
            if not self.fallback(s, str(err)):
                raise err from exc

    def fallback(self, s: SessionState, reason: str) -> bool:
        """Switch ``s`` to ``context.fallback_engine`` after its engine failed; False when none
        is configured (or the fallback is the engine that failed)."""
        name = self.config.context.fallback_engine
        if not name or name == s.engine.name:
            return False
        log.warning("session %s: engine %s replaced by the fallback %r: %s", s.id, engine_label(s.engine), name, reason)
        engine = self.new_engine(s.id, name, s.history, s.reach, s.nodes)
        engine.on_session_start(s.id, model=self.window.model, context_length=self.window.context_length)
        s.engine = engine
        s.fallback_reason = reason
        return True

    # -- the window ---------------------------------------------------------------------------
    def sync_window(self, s: SessionState) -> None:
        """Tell the session's engine the manager's window (under the session's lock)."""
        version = self.window.version
        if s.window_version == version:
            return
        s.window_version = version
        self.fit(s, s.tool_window)
        s.hygiene_armed = True

    def fit(self, s: SessionState, tool_window: int) -> None:
        """Give the session's engine the room its messages have: the window less the tool
        definitions sent with them (``tool_window``), so that a large fixed tool list (Claude
        Code sends ~19K tokens of them) does not hold the trigger over its threshold on every
        turn. At least a quarter of the window: below that the trigger would fire every turn,
        and the window cap holds the window anyway."""
        length = self.window.context_length
        room = max(length - tool_window, length // 4) if tool_window else length
        if s.engine.context_length == room:
            return
        try:
            s.engine.update_model(self.window.model, room)
        except Exception as exc:  # the window cap still holds the new window
            s.engine_errors += 1
            log.warning("session %s: engine %s failed in update_model: %s: %s", s.id, engine_label(s.engine), type(exc).__name__, exc)

    # -- running ------------------------------------------------------------------------------
    def should_compact(self, s: SessionState, tokens: int, msgs: list[Message]) -> bool:
        """The engine's trigger, the fallback's when it fails."""
        try:
            return should_compact(s.engine, tokens, msgs)
        except EngineError as exc:
            if self.fallback(s, str(exc)):
                return should_compact(s.engine, tokens, msgs)
            if self.strict and not self.contain:
                raise
            s.engine_errors += 1
            log.warning("%s", exc)
            return False

    def compress(self, s: SessionState, msgs: list[Message], tokens: int, focus_topic: str | None, trigger: str) -> list[Message]:
        """One compaction through the shared loop (a copy, under ``context.engine_timeout``);
        returns ``msgs`` itself when nothing changed."""
        self.recorder.flush(s)  # the engine and the compaction's record see the turn recorded
        engine = s.engine
        s.nodes.take()  # nothing staged by an earlier compaction that was not recorded
        try:
            outcome = run_compress(engine, msgs, tokens=tokens, focus_topic=focus_topic, deadline=self.config.context.engine_timeout)
            out = outcome.output
            check_output(engine, msgs, out)
        except EngineError as exc:
            if self.fallback(s, str(exc)):
                return self.compress(s, msgs, tokens, focus_topic, trigger)
            if self.strict and not self.contain:
                raise
            s.engine_errors += 1
            log.warning("%s", exc)
            return msgs
        if out == msgs:
            s.nodes.take()
            return msgs
        s.compactions += 1
        s.lost = True
        s.counter.reset()
        report = engine.last_report
        if report is None or report.messages_after != len(out):
            report = CompactionReport(engine.name, len(msgs), len(out), tokens, s.history.tokens.for_counter(self.counting.counter).count_messages(out), elapsed_ms=outcome.elapsed_ms)
        data = report.to_dict()
        data["trigger"] = trigger
        s.last_compaction = data
        self.recorder.compaction(s, data, msgs, out, nodes=s.nodes.take())
        return list(out)
