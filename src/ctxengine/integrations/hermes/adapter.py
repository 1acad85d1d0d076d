"""The Hermes-side engine's behaviour, kept free of Hermes imports so it is testable anywhere.

:class:`HermesAdapter` speaks Hermes Agent's context-engine contract (``agent.context_engine``)
and delegates every decision to a ctxengine engine built from ctxengine's config (or the
``ctxengine:`` section of Hermes' ``config.yaml``). :mod:`.engine` mixes it with Hermes' own
ABC, which Hermes' plugin manager requires (it checks ``isinstance``).

What it adds around the delegate engine:

* **Sessions are recorded** in ctxengine's store (SQLite by default): the history each time
  Hermes hands over messages (compaction, tool calls, turn end, session end) and every
  compaction as an event with the list before and after.
* **Recall tools** (``get_tool_schemas`` / ``handle_tool_call``): the platform's recall over the
  store (``ctx_grep``, ``ctx_expand``; ``lcm_*`` names for the lossless engine), else (no store)
  the delegate engine's own tools. Hermes asks for the schemas once, when the agent starts, so
  they are offered from the start whenever a store is enabled.
* **Commit only when used** (Hermes' newer contract): ``compress`` may run on a pooled worker
  thread under a host timeout, on a deep copy of the messages. It computes on a *clone* of the
  delegate engine and keeps the clone pending; the clone replaces the live engine only once the
  host shows it used the result (the compaction boundary's ``on_session_start``, a later call
  whose messages start with the compacted list, a turn completing). A result the host dropped
  leaves the engine as it was.
* **The kernel's output guard and window cap**: a compacted list the kernel would reject
  (:func:`ctxengine.loop.check_output`: not a valid chat sequence, the system prompt no longer
  first, the latest user message lost) is never returned; the input is returned unchanged
  instead (Hermes then reports "no progress" and carries on) and the reason is logged. A valid
  one is held to the window cap (:class:`ctxengine.window.WindowCap`: the window minus the
  completion reserve and margin), as the kernel holds every request.
* **Lifecycle**: a compaction boundary (``boundary_reason="compression"``, Hermes rotating the
  session id) continues the same ctxengine session; ``on_session_reset`` clears it;
  ``update_model`` resizes the window. Hermes deep-copies the registered engine for every agent
  it builds: a copy starts fresh with the same settings and shares the store.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxengine.config import SECTION_ALIASES, Config, load_config
from ctxengine.engine import ContextEngine as CtxEngine
from ctxengine.engine import Services
from ctxengine.errors import ConfigError, ContextWindowError, EngineError
from ctxengine.loop import check_output
from ctxengine.manager import default_store
from ctxengine.messages import Message, tool_name
from ctxengine.models import DEFAULT_CONTEXT_LENGTH
from ctxengine.recall import LCM_ALIASES, Recall
from ctxengine.registry import EngineRegistry
from ctxengine.storage import RecallStore, SessionRecorder
from ctxengine.window import WindowCap, WindowLimit

__all__ = ["ENGINE_NAME", "HermesAdapter", "HermesSettings", "settings_from_hermes_config"]

log = logging.getLogger("ctxengine.integrations.hermes")

ENGINE_NAME = "ctxengine"
"""The name Hermes selects with ``context.engine: ctxengine``."""

SECTION = "ctxengine"
"""The section of Hermes' ``config.yaml`` read for settings."""


@dataclass(frozen=True, slots=True)
class HermesSettings:
    """Which ctxengine engine serves Hermes, and with which ctxengine config.

    ``config`` is a full ctxengine :class:`~ctxengine.config.Config`; ``engine`` overrides its
    ``context.engine`` (Hermes' own ``context.engine`` holds ``ctxengine``, the plugin's name).
    """

    config: Config = field(default_factory=Config)
    engine: str | None = None

    @property
    def engine_name(self) -> str:
        return self.engine or self.config.context.engine


def settings_from_hermes_config(hermes_config: Mapping[str, Any] | None) -> HermesSettings:
    """Read the ``ctxengine:`` section of Hermes' config.yaml.

    Keys: ``engine`` (the ctxengine engine: ``compressor``, ``rules``, ``lcm``, ``cacheaware`` or
    a plugin), ``config_file`` (a ctxengine config.yaml; default ``$CTXENGINE_CONFIG`` or the
    defaults), and any ctxengine config section (``compressor`` or its older name
    ``compression``, ``store``, ``auxiliary`` …)
    overriding that file. Unknown keys raise :class:`~ctxengine.errors.ConfigError` naming them.
    """
    section: Any = (hermes_config or {}).get(SECTION) or {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"Hermes config.yaml: '{SECTION}' must be a mapping, not {type(section).__name__}")
    data = dict(section)
    engine = data.pop("engine", None)
    if engine is not None and not isinstance(engine, str):
        raise ConfigError(f"Hermes config.yaml: '{SECTION}.engine' must be an engine name, not {engine!r}")
    config_file = data.pop("config_file", None)
    config = load_config(Path(str(config_file)).expanduser() if config_file else None)
    if data:
        unknown = [k for k in data if (k not in Config.model_fields and k not in SECTION_ALIASES) or k == "source"]
        if unknown:
            raise ConfigError(f"Hermes config.yaml: unknown key(s) in '{SECTION}': {', '.join(sorted(unknown))}")
        config = config.with_overrides(**{k: v for k, v in data.items()})
    if engine == ENGINE_NAME or (engine is None and config.context.engine == ENGINE_NAME):
        raise ConfigError(f"'{SECTION}.engine' names a ctxengine engine (compressor, rules, lcm …), not the plugin itself")
    return HermesSettings(config=config, engine=engine)


def _clone(engine: CtxEngine, shared: Sequence[Any]) -> CtxEngine:
    """A copy of ``engine`` whose own state (attributes, the lists/dicts/sets they hold and its
    ctxengine helper objects) can change without touching ``engine``; ``shared`` objects (store,
    summarizer, counter, the per-message token counts) stay shared.

    One level deep: engines replace or extend their containers, and a deep copy of a long
    session's state would cost more than the compaction itself.
    """
    clone = object.__new__(type(engine))
    shared_ids = {id(s) for s in shared if s is not None}
    state: dict[str, Any] = {}
    for key, value in vars(engine).items():
        if id(value) in shared_ids:
            state[key] = value
        elif isinstance(value, list | dict | set | bytearray):
            state[key] = copy.copy(value)
        elif type(value).__module__.startswith("ctxengine.") and not isinstance(value, type):
            # the engine's own helpers (token anchor, fact sets …): the clone gets its own copy
            state[key] = copy.copy(value)
        else:
            state[key] = value
    vars(clone).update(state)
    return clone


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equal messages, ignoring the host's private bookkeeping keys (Hermes adds ``_db_persisted``
    and the like to messages it carries forward)."""
    if a == b:
        return True
    return {k: v for k, v in a.items() if not str(k).startswith("_")} == {k: v for k, v in b.items() if not str(k).startswith("_")}


def _bare_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Hermes wants ``{"name", "description", "parameters"}``; OpenAI's wrapper is removed."""
    fn = schema.get("function")
    if schema.get("type") == "function" and isinstance(fn, Mapping):
        return dict(fn)
    return dict(schema)


class HermesAdapter:
    """Hermes' context-engine contract over a ctxengine engine (see the module docstring)."""

    # Hermes reads these directly (display, preflight)
    last_prompt_tokens: int
    last_completion_tokens: int
    last_total_tokens: int
    threshold_tokens: int
    context_length: int
    compression_count: int
    threshold_percent: float
    protect_first_n: int
    protect_last_n: int

    def __init__(
        self,
        settings: HermesSettings | None = None,
        *,
        store: SessionRecorder | str | None = "default",
        registry: EngineRegistry | None = None,
        settings_loader: Callable[[], HermesSettings] | None = None,
    ) -> None:
        self._settings = settings
        self._settings_loader = settings_loader
        self._store_arg = store
        self._store: SessionRecorder | None = None
        self._store_ready = False
        self._registry = registry
        self._lock = threading.RLock()
        self._inner: CtxEngine | None = None
        self._pending: tuple[CtxEngine, list[Message]] | None = None
        self._recall: Recall | None = None
        self._cap: WindowCap | None = None  # the window cap over what compress returns
        self.session_id: str | None = None
        self.model = ""
        self.last_prompt_tokens = 0
        self.last_completion_tokens = 0
        self.last_total_tokens = 0
        self.compression_count = 0
        self.context_length = DEFAULT_CONTEXT_LENGTH
        self.threshold_percent = 0.5
        self.threshold_tokens = int(self.context_length * self.threshold_percent)
        self.protect_first_n = 3
        self.protect_last_n = 20
        self.compactions_rejected = 0

    # -- identity ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return ENGINE_NAME

    @property
    def settings(self) -> HermesSettings:
        if self._settings is None:
            self._settings = self._settings_loader() if self._settings_loader is not None else HermesSettings()
        return self._settings

    @property
    def store(self) -> SessionRecorder | None:
        """ctxengine's session store (the config's; ``None`` when storage is off)."""
        if not self._store_ready:
            self._store_ready = True
            if self._store_arg == "default":
                self._store = default_store(self.settings.config)
            elif self._store_arg is None or isinstance(self._store_arg, str):
                self._store = None
            else:
                self._store = self._store_arg
        return self._store

    @property
    def engine(self) -> CtxEngine:
        """The ctxengine engine doing the work (built on first use)."""
        with self._lock:
            if self._inner is None:
                self._inner = self._build(self.context_length)
                self._sync()
            return self._inner

    def _build(self, context_length: int) -> CtxEngine:
        s = self.settings
        registry = self._registry or EngineRegistry(plugin_dirs=s.config.plugins.dirs, entry_points=s.config.plugins.entry_points)
        services = Services(context_length=context_length, store=self.store, config=s.config)
        return registry.create(s.engine_name, s.config, context_length=context_length, services=services)

    def _sync(self) -> None:
        inner = self._inner
        if inner is None:
            return
        self.context_length = inner.context_length
        self.threshold_tokens = inner.threshold_tokens
        self.threshold_percent = float(getattr(inner, "threshold_ratio", self.threshold_percent))
        self.protect_first_n = int(getattr(inner, "protect_first_n", self.protect_first_n))
        self.protect_last_n = int(getattr(inner, "protect_last_n", self.protect_last_n))

    def __deepcopy__(self, memo: dict[int, Any]) -> HermesAdapter:
        # Hermes deep-copies the registered engine for each agent it builds: start fresh with
        # the same settings, sharing the store (its connection cannot be copied).
        store = self._store if self._store_ready else self._store_arg
        twin = type(self)(self._settings, store=store, registry=self._registry, settings_loader=self._settings_loader)
        twin.context_length = self.context_length
        twin.threshold_tokens = self.threshold_tokens
        twin.model = self.model
        memo[id(self)] = twin
        return twin

    # -- commit only when used -----------------------------------------------------------------
    def _adopt_pending(self, messages: Sequence[Message] | None = None) -> None:
        """Make a pending compaction's engine state live when the host used its result: always
        when ``messages`` is None (an explicit boundary), else when ``messages`` starts with it.
        A pending result the host did not carry forward is dropped."""
        with self._lock:
            if self._pending is None:
                return
            clone, out = self._pending
            if messages is not None:
                n = len(out)
                if len(messages) < n or any(not _same(a, b) for a, b in zip(messages[:n], out, strict=True)):
                    self._pending = None
                    log.info("ctxengine: a compaction result was not used by the host; its state is dropped")
                    return
            self._inner = clone
            self._pending = None
            self.compression_count += 1
            self._sync()

    # -- Hermes' required methods ----------------------------------------------------------------
    def update_from_response(self, usage: Mapping[str, Any] | Any) -> None:
        with self._lock:
            inner = self.engine
            inner.update_from_response(usage or {})
            if self._pending is not None:  # the clone must not miss usage it may take over
                self._pending[0].update_from_response(usage or {})
        self.last_prompt_tokens = inner.last_prompt_tokens
        self.last_completion_tokens = inner.last_completion_tokens
        self.last_total_tokens = inner.last_total_tokens

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        tokens = prompt_tokens if prompt_tokens is not None else self.last_prompt_tokens
        if tokens is None or tokens < 0:  # Hermes' -1: "compression just ran, awaiting real usage"
            return False
        return bool(self.engine.should_compress(int(tokens)))

    def compress(
        self,
        messages: list[dict[str, Any]],
        current_tokens: int | None = None,
        focus_topic: str | None = None,
        force: bool = False,
        memory_context: str = "",
    ) -> list[dict[str, Any]]:
        """Compact ``messages`` through the ctxengine engine (on a clone; see the module docstring).

        ``force`` (manual ``/compress``) and ``memory_context`` are accepted; ctxengine's engines
        have no cooldown to bypass, and the memory text is kept as a focus hint when no focus
        topic is given.
        """
        msgs = list(messages)
        self._adopt_pending(msgs)
        self._record_history(msgs)
        with self._lock:
            base = self.engine
            clone = _clone(base, self._shared_services(base))
        focus = focus_topic or (memory_context.strip()[:500] or None if memory_context else None)
        try:
            out = clone.compress(msgs, current_tokens=current_tokens, focus_topic=focus)
        except Exception as exc:  # never crash the agent: keep the context and say why
            log.warning("ctxengine: %s compress failed, context kept as it was: %s: %s", clone.name, type(exc).__name__, exc)
            self.compactions_rejected += 1
            return messages
        problem = self._problem(clone, msgs, out)
        if problem is not None:
            log.warning("ctxengine: %s returned %s; context kept as it was", clone.name, problem)
            self.compactions_rejected += 1
            return messages
        if out == msgs:
            return messages
        out = self._capped(out)
        with self._lock:
            self._pending = (clone, list(out))
        self._record_compaction(clone, msgs, out)
        return list(out)

    @staticmethod
    def _shared_services(engine: CtxEngine) -> list[Any]:
        return [getattr(engine, attr, None) for attr in ("store", "_store", "summarizer", "_fallback", "counter", "tokens", "recall")]

    @staticmethod
    def _problem(engine: CtxEngine, before: list[Message], out: Any) -> str | None:
        """Why ``out`` cannot replace ``before`` (the kernel's output guard,
        :func:`ctxengine.loop.check_output`), or ``None``."""
        if not isinstance(out, list) or not all(isinstance(m, dict) for m in out):
            return f"{type(out).__name__}, not a list of messages"
        try:
            check_output(engine, before, out)
        except EngineError as exc:
            return str(exc)
        return None

    def _capped(self, out: list[Message]) -> list[Message]:
        """``out`` within the window cap (:class:`ctxengine.window.WindowCap`, as the kernel holds
        it after any engine: the window minus the completion reserve and margin); as it was when
        even the anchors overflow (Hermes then meets the provider's own limit)."""
        ctx = self.settings.config.context
        with self._lock:
            if self._cap is None or self._cap.window.context_length != self.context_length:
                self._cap = WindowCap(WindowLimit.for_window(self.context_length, completion_reserve=ctx.completion_reserve, margin_ratio=ctx.window_margin))
            cap = self._cap
        try:
            # the history was recorded before compress (_record_history): with a store, what is cut is kept
            result = cap.fit(out, recall=self._recall_tools() is not None, originals=self.store is not None)
        except ContextWindowError as exc:
            log.warning("ctxengine: the compacted context does not fit the window: %s", exc)
            return out
        for note in result.notes:
            log.info("ctxengine: %s", note)
        return result.messages if result.changed else out

    # -- optional methods -------------------------------------------------------------------------
    def should_compress_preflight(self, messages: list[dict[str, Any]]) -> bool:
        return bool(self.engine.should_compress_preflight(list(messages)))

    def has_content_to_compress(self, messages: list[dict[str, Any]]) -> bool:
        return len(messages) > self.protect_first_n + 1

    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        """A conversation begins, or (``boundary_reason="compression"``) continues under a new
        id after a compaction: the latter keeps the ctxengine session and commits the result."""
        if kwargs.get("boundary_reason") == "compression" and self.session_id is not None:
            self._adopt_pending()
            return
        self._pending = None
        self.session_id = session_id
        self._recall = None
        self.engine.on_session_start(session_id, **{k: v for k, v in kwargs.items() if k in ("model", "context_length", "platform")})

    def on_session_end(self, session_id: str, messages: list[dict[str, Any]]) -> None:
        self._adopt_pending(messages)
        self._record_history(list(messages))
        self.engine.on_session_end(self.session_id or session_id, list(messages))

    def on_session_reset(self) -> None:
        with self._lock:
            self._pending = None
        self.engine.on_session_reset()
        self.last_prompt_tokens = 0
        self.last_completion_tokens = 0
        self.last_total_tokens = 0
        self.compression_count = 0

    def on_turn_complete(self, messages: list[dict[str, Any]], usage: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        """Hermes' newer hook: a finished turn shows what the host kept; record it."""
        self._adopt_pending(messages)
        self._record_history(list(messages))

    def update_model(
        self,
        model: str,
        context_length: int,
        base_url: str = "",
        api_key: str = "",
        provider: str = "",
        api_mode: str = "",
    ) -> None:
        self.model = model
        if not context_length or int(context_length) <= 0:  # unknown window: keep the current one
            context_length = self.context_length
        with self._lock:
            self.context_length = int(context_length)
            if self._inner is None:
                self._inner = self._build(self.context_length)
            self._inner.update_model(model, int(context_length))
            if self._pending is not None:
                self._pending[0].update_model(model, int(context_length))
            self._sync()

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        tools = self._recall_tools()
        if tools is not None:
            return [_bare_schema(t) for t in tools[0]]
        return [_bare_schema(t) for t in self.engine.get_tool_schemas()]

    def handle_tool_call(self, name: str, args: Mapping[str, Any], **kwargs: Any) -> str:
        messages = kwargs.get("messages")
        if isinstance(messages, list):
            self._record_history(messages)
        try:
            tools = self._recall_tools()
            if tools is not None and name in {tool_name(t) for t in tools[0]}:
                return str(tools[1](name, dict(args)))
            return str(self.engine.handle_tool_call(name, dict(args), session_id=self.session_id))
        except Exception as exc:
            return json.dumps({"error": f"{name} failed: {type(exc).__name__}: {exc}"})

    def get_status(self) -> dict[str, Any]:
        last = max(self.last_prompt_tokens, 0)
        status = {
            "engine": f"{ENGINE_NAME}:{self.settings.engine_name}",
            "last_prompt_tokens": last,
            "threshold_tokens": max(self.threshold_tokens, 0),
            "context_length": self.context_length,
            "usage_percent": min(100.0, last / self.context_length * 100) if self.context_length else 0,
            "compression_count": self.compression_count,
            "store": type(self.store).__name__ if self.store is not None else None,
        }
        if self.compactions_rejected:
            status["compactions_rejected"] = self.compactions_rejected
        return status

    # -- store and recall -------------------------------------------------------------------------
    def _sid(self) -> str:
        return self.session_id or "hermes"

    def _record_history(self, messages: list[Message]) -> None:
        store = self.store
        if store is None or not messages:
            return
        try:
            store.record_messages(self._sid(), messages)
        except Exception as exc:  # the agent keeps going
            log.warning("ctxengine: recording session %s failed: %s", self._sid(), exc)

    def _record_compaction(self, engine: CtxEngine, before: list[Message], out: list[Message]) -> None:
        store = self.store
        if store is None:
            return
        report = engine.last_report
        data: dict[str, Any] = report.to_dict() if report is not None else {"engine": engine.name, "messages_before": len(before), "messages_after": len(out)}
        data["trigger"] = "hermes"
        try:
            store.record_compaction(self._sid(), data, before, out)
        except Exception as exc:
            log.warning("ctxengine: recording a compaction of %s failed: %s", self._sid(), exc)

    def _recall_tools(self) -> tuple[list[dict[str, Any]], Callable[[str, dict[str, Any]], str]] | None:
        """The platform's recall over the store (``ctx_grep``/``ctx_expand``; ``lcm_*`` names
        when the delegate engine is the lossless one), or ``None`` when no store is enabled."""
        store = self.store
        if store is None or not isinstance(store, RecallStore):
            return None
        engine_tools = {tool_name(t) for t in self.engine.get_tool_schemas()}
        aliases = LCM_ALIASES if engine_tools & set(LCM_ALIASES) else None
        recall = self._recall
        if recall is None or recall.session_id != self._sid() or bool(recall.aliases) != bool(aliases):
            recall = self._recall = Recall(store, self._sid(), aliases=aliases)
        return list(recall.tool_schemas()), recall.handle
