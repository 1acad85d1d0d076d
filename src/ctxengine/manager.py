"""The per-turn loop: one object an agent calls every turn.

::

    ctx = ContextManager.from_config("config.yaml", model="anthropic/claude-sonnet-4.5")
    messages = ctx.prepare(messages)          # compacts if needed; returns what to send
    request = ctx.request(messages)           # + cache_control markers for this provider
    resp = client.chat.completions.create(messages=request, tools=ctx.tools(my_tools), ...)
    ctx.update_from_response(resp.usage)      # real token counts drive the next decision

``prepare`` does, in order:

1. validates the input (:class:`~ctxengine.errors.InvalidMessages` lists every problem);
2. runs the context engine's own tools the model called in the last assistant message
   (``lcm_grep`` …) through ``handle_tool_call`` and appends their results;
3. **gateway session hygiene** (seeds 000/001): a safety net fixed at 85 % of the model's window,
   counted from the last provider-reported prompt tokens plus an estimate of what was added
   since (the rough estimate alone when no response was seen), only with ≥ 4 messages and
   compression enabled. It fires once when the session crosses 85 % and re-arms only after the
   session fell below it again: firing on every turn of a long session is what made the seed
   move it from 50 % to 85 %;
4. the engine's ``should_compress`` (or ``should_compress_preflight``) and ``compress``;
5. checks what the engine returned and raises :class:`~ctxengine.errors.EngineError` naming
   the broken rule; records the history and any compaction in the session store.

One manager serves many sessions (``session_id=`` on every method); each session has its own
engine instance, token anchor and lock, so calls for one session are serialised while
different sessions proceed in parallel. Lifecycle hooks follow seed 002: ``on_session_start``
on a session's first use, ``on_session_reset`` on :meth:`ContextManager.reset_session`,
``on_session_end`` on :meth:`ContextManager.end_session` / :meth:`ContextManager.close`.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ctxengine.caching import (
    CachingStatus,
    apply_anthropic_cache_control,
    apply_breakpoints,
    caching_status,
    plan_breakpoints,
    system_and_3_breakpoints,
)
from ctxengine.config import Config, load_config
from ctxengine.engine import CompactionReport, ContextEngine, normalize_usage
from ctxengine.errors import ConfigError, EngineError
from ctxengine.messages import (
    Message,
    check,
    content_text,
    is_summary,
    tool_call_args,
    tool_call_id,
    tool_call_name,
    tool_calls,
    validate,
)
from ctxengine.models import ModelProfile, UnknownModelWarning, resolve_model
from ctxengine.redact import redact_obj
from ctxengine.registry import EngineRegistry
from ctxengine.storage import SessionRecorder
from ctxengine.tokens import AnchoredCounter, TokenCounter, estimate_message_tokens, get_counter

__all__ = ["HYGIENE_MIN_MESSAGES", "HYGIENE_RATIO", "ContextManager", "default_store"]

log = logging.getLogger("ctxengine.manager")

HYGIENE_RATIO = 0.85
"""Gateway hygiene fires at 85 % of the window (seed 000): high enough that it never competes
with the engine's own trigger (50–75 %), low enough to leave room for the next turn."""

HYGIENE_MIN_MESSAGES = 4
"""Hygiene ignores histories shorter than this (seed 000): nothing to compact yet."""

PRESSURE_RATIO = 0.85
"""Context pressure warnings (seed 000, off by default) at 85 % of the compaction threshold."""

StoreArg = SessionRecorder | Literal["default"] | None


def default_store(config: Config) -> SessionRecorder | None:
    """The store the config asks for (SQLite by default), or ``None`` when storage is off or
    the store package is unavailable.

    ``ctxengine.store`` is imported lazily, so this module never depends on it; its
    ``open_store(config.store)`` returns a :class:`~ctxengine.storage.SessionRecorder`. A store
    that fails to open is logged and treated as absent: the agent keeps working.
    """
    if not config.store.enabled:
        return None
    try:
        module = importlib.import_module("ctxengine.store")
    except ImportError:
        return None
    factory = getattr(module, "open_store", None)
    if not callable(factory):
        return None
    try:
        store = factory(config.store)
    except Exception as exc:  # a broken store must not stop the agent
        log.warning("session store unavailable: %s: %s", type(exc).__name__, exc)
        return None
    return store if isinstance(store, SessionRecorder) else None


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


def _tool_name(schema: Mapping[str, Any]) -> str:
    fn = schema.get("function")
    if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
        return str(fn["name"])
    name = schema.get("name")
    return name if isinstance(name, str) else ""


def _as_openai_tool(schema: Mapping[str, Any]) -> dict[str, Any]:
    if schema.get("type") == "function" and isinstance(schema.get("function"), Mapping):
        return dict(schema)
    return {"type": "function", "function": dict(schema)}


def _fingerprint(messages: Sequence[Message]) -> str:
    raw = json.dumps(list(messages), sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()  # lone surrogates hash too


class ContextManager:
    """The per-turn facade (see the module docstring).

    Build it with :meth:`from_config`. ``engine_factory`` (tests, benchmarks) replaces the
    registry lookup: it is called once per session and must return a fresh engine.
    ``strict=False`` (benchmarks) logs broken input or engine output instead of raising, so a
    misbehaving engine can be measured rather than stopped.
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
    ) -> None:
        self.config = config
        self.strict = strict
        self.model = model
        self.provider = provider or config.model.provider
        with warnings.catch_warnings():
            if engine_factory is not None:
                warnings.simplefilter("ignore", UnknownModelWarning)
            self.profile: ModelProfile = resolve_model(
                model,
                overrides=config.models,
                default_context_length=config.model.default_context_length,
                context_length=context_length if context_length is not None else config.model.context_length,  # 0 is an error, not "unset"
            )
        self.context_length = self.profile.context_length
        self.default_session = session_id
        self.store: SessionRecorder | None = default_store(config) if store == "default" else store
        self._registry = registry
        self._engine_factory = engine_factory
        self._counter = counter or get_counter(config.context.token_counter)
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        pc = config.prompt_caching
        self.caching: CachingStatus = caching_status(model, self.provider, cache_ttl=config.cache_ttl, enabled=pc.enabled)
        self.placement = pc.strategy

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

    # -- sessions ---------------------------------------------------------------------------
    def _new_engine(self) -> ContextEngine:
        if self._engine_factory is not None:
            engine = self._engine_factory()
        else:
            if self._registry is None:
                self._registry = EngineRegistry(plugin_dirs=self.config.plugins.dirs, entry_points=self.config.plugins.entry_points)
            registry = self._registry
            services: dict[str, Any] = {}
            if self.store is not None:
                services["store"] = self.store
            engine = registry.create(self.config.context.engine, self.config, context_length=self.context_length, **services)
        if engine.context_length != self.context_length:
            engine.update_model(self.model, self.context_length)
        return engine

    def _session(self, session_id: str | None) -> _Session:
        sid = session_id or self.default_session
        with self._lock:
            s = self._sessions.get(sid)
            if s is None:
                s = _Session(sid, self._new_engine(), AnchoredCounter(self._counter))
                self._sessions[sid] = s
        if not s.started:
            with s.lock:
                if not s.started:
                    s.engine.on_session_start(sid, model=self.model, context_length=self.context_length)
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
            s.engine.on_session_reset()
            s.counter.reset()
            s.hygiene_armed = True
            s.last_sent = []
            s.last_request = None
            s.last_tokens = 0
            s.pressure_warning = None

    def end_session(self, session_id: str | None = None, messages: Sequence[Message] | None = None) -> None:
        """The session ends (exit, expiry): ``on_session_end`` runs and the state is dropped."""
        sid = session_id or self.default_session
        with self._lock:
            s = self._sessions.pop(sid, None)
        if s is None:
            return
        with s.lock:
            if s.started:
                s.engine.on_session_end(sid, list(messages) if messages is not None else list(s.last_sent))

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
        """The agent's tool list with the engine's tools appended (OpenAI ``tools`` format).

        An engine tool whose name the agent already uses is left out, with a warning: the
        agent's own tool wins.
        """
        out = [dict(t) for t in agent_tools or []]
        taken = {_tool_name(t) for t in out}
        for schema in self._session(session_id).engine.get_tool_schemas():
            name = _tool_name(schema)
            if name in taken:
                log.warning("engine tool %r shadowed by an agent tool of the same name", name)
                continue
            out.append(_as_openai_tool(schema))
        return out

    def _dispatch_engine_tools(self, s: _Session, messages: list[Message]) -> list[Message]:
        names = {_tool_name(t) for t in s.engine.get_tool_schemas()}
        if not names:
            return messages
        last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") != "tool"), -1)
        if last < 0 or messages[last].get("role") != "assistant":
            return messages
        answered = {m.get("tool_call_id") for m in messages[last + 1 :]}
        out = messages
        for call in tool_calls(messages[last]):
            cid = tool_call_id(call)
            name = tool_call_name(call)
            if name not in names or cid in answered:
                continue
            args = tool_call_args(call)
            try:
                result = s.engine.handle_tool_call(name, args if isinstance(args, dict) else {"input": args}, session_id=s.id, messages=messages)
            except Exception as exc:  # the model sees the failure instead of the agent crashing
                result = json.dumps({"error": f"{name} failed: {type(exc).__name__}: {exc}"})
            if out is messages:
                out = list(messages)
            out.append({"role": "tool", "tool_call_id": cid, "content": result})
        return out

    # -- the turn ---------------------------------------------------------------------------
    def count_tokens(self, messages: Sequence[Message], *, session_id: str | None = None) -> int:
        """Tokens of ``messages`` as the decisions see them: the last real prompt tokens plus an
        estimate of the messages added since, or an estimate of everything."""
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
    ) -> list[Message]:
        """What to send this turn (see the module docstring). Never mutates ``messages``.

        ``tools`` (the agent's tool list) is only checked for clashes with engine tools here;
        send :meth:`tools` to the provider.
        """
        s = self._session(session_id)
        with s.lock:
            if self.strict:
                msgs = check(messages, context="messages passed to prepare", allow_pending_calls=True)
            else:
                msgs = list(messages)
            if tools is not None:
                self.tools(tools, session_id=s.id)
            msgs = self._dispatch_engine_tools(s, msgs)
            history = msgs
            enabled = self.config.compression.enabled
            tokens = s.counter.count(msgs)
            if tokens < self.hygiene_threshold:
                s.hygiene_armed = True
            elif enabled and s.hygiene_armed and len(msgs) >= HYGIENE_MIN_MESSAGES:
                s.hygiene_armed = False
                s.hygiene_fired += 1
                log.info("session hygiene: %s at %d tokens (>= %d), compacting", s.id, tokens, self.hygiene_threshold)
                msgs = self._compress(s, msgs, tokens, focus_topic, trigger="hygiene")
                tokens = s.counter.count(msgs)
            if enabled and (s.engine.should_compress(tokens) or s.engine.should_compress_preflight(msgs)):
                msgs = self._compress(s, msgs, tokens, focus_topic, trigger="engine")
                tokens = s.counter.count(msgs)
            s.last_sent = msgs
            s.last_tokens = tokens
            s.turns += 1
            self._update_pressure(s, tokens)
            self._record(s, history)
            return msgs

    def _compress(self, s: _Session, msgs: list[Message], tokens: int, focus_topic: str | None, trigger: str) -> list[Message]:
        engine = s.engine
        before_fp = _fingerprint(msgs)
        t0 = time.perf_counter()
        try:
            out = engine.compress(msgs, current_tokens=tokens, focus_topic=focus_topic)
        except TypeError:
            # seed-era plugins: compress(messages, current_tokens=None) without focus_topic
            out = engine.compress(msgs, current_tokens=tokens)
        elapsed = (time.perf_counter() - t0) * 1000.0
        try:
            self._check_output(engine, msgs, out, before_fp)
        except EngineError as exc:
            if self.strict:
                raise
            s.engine_errors += 1
            log.warning("%s", exc)
        if out == msgs:
            return msgs
        s.compactions += 1
        s.counter.reset()
        report = engine.last_report
        if report is None or report.messages_after != len(out):
            report = CompactionReport(
                engine.name, len(msgs), len(out), tokens, self._counter.count_messages(out), elapsed_ms=elapsed
            )
        data = report.to_dict()
        data["trigger"] = trigger
        s.last_compaction = data
        if self.store is not None:
            try:
                self.store.record_compaction(s.id, data, msgs, out)
            except Exception as exc:  # the agent keeps going; status() reports it
                s.store_errors += 1
                log.warning("session store: recording a compaction of %s failed: %s", s.id, exc)
        return list(out)

    def _check_output(self, engine: ContextEngine, before: list[Message], out: Any, before_fp: str) -> None:
        name = engine.name
        if not isinstance(out, list) or not all(isinstance(m, dict) for m in out):
            raise EngineError(f"engine {name!r} broke rule 1 (valid in, valid out): compress returned {type(out).__name__}, not a list of message dicts")
        if _fingerprint(before) != before_fp:
            raise EngineError(f"engine {name!r} broke rule 2 (no mutation of the input): compress edited the messages it was given")
        errors = [v for v in validate(out, allow_pending_calls=True) if v.severity == "error"]
        if errors:
            shown = "; ".join(str(v) for v in errors[:3])
            raise EngineError(f"engine {name!r} broke rule 1 (valid in, valid out): {len(errors)} violation(s): {shown}")
        if before and before[0].get("role") == "system" and (not out or out[0].get("role") != "system"):
            raise EngineError(f"engine {name!r} broke rule 5 (anchors survive): the system prompt is no longer first")
        # an engine's own user-role summary is not the user's latest message
        last_user = next((m for m in reversed(before) if m.get("role") == "user" and not is_summary(m)), None)
        if last_user is not None:
            text = content_text(last_user.get("content"))
            if not any(m.get("role") == "user" and content_text(m.get("content")) == text for m in out):
                raise EngineError(f"engine {name!r} broke rule 5 (anchors survive): the latest user message was not kept verbatim")

    def _record(self, s: _Session, history: list[Message]) -> None:
        if self.store is None:
            return
        try:
            self.store.record_messages(s.id, history)
        except Exception as exc:
            s.store_errors += 1
            log.warning("session store: recording the history of %s failed: %s", s.id, exc)

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
        if not self.caching.enabled:
            return []
        if self.placement == "planner":
            return plan_breakpoints(
                messages,
                min_cache_tokens=self.profile.min_cache_tokens,
                tokens=list(tokens) if tokens is not None else [estimate_message_tokens(m) for m in messages],
                native_anthropic=self.caching.native_anthropic,
                previous=previous,
            )
        return system_and_3_breakpoints(messages)

    def request(self, messages: Sequence[Message], *, session_id: str | None = None) -> list[Message]:
        """The messages to send, with ``cache_control`` markers when caching applies to this
        model and provider (a deep copy; ``messages`` is untouched)."""
        indices = self.breakpoints(messages, session_id=session_id)
        if not self.caching.enabled:
            return list(messages)
        ttl = self.caching.cache_ttl
        native = self.caching.native_anthropic
        if self.placement == "system_and_3":
            return apply_anthropic_cache_control(messages, cache_ttl=ttl, native_anthropic=native)
        return apply_breakpoints(messages, indices, cache_ttl=ttl, native_anthropic=native)

    def update_from_response(self, usage: Any, *, session_id: str | None = None) -> None:
        """Record a response's usage (OpenAI or Anthropic shape, dict or SDK object): the engine
        sees it, and the next token counts are anchored on its real prompt tokens."""
        s = self._session(session_id)
        with s.lock:
            u = normalize_usage(usage)
            s.engine.update_from_response(usage)
            if u.prompt_tokens > 0 and s.last_sent:
                s.counter.anchor(s.last_sent, u.prompt_tokens)
            s.cache_read_tokens += u.cache_read_tokens
            s.cache_write_tokens += u.cache_write_tokens
            s.prompt_tokens_total += u.prompt_tokens

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
                }
            )
            if s.pressure_warning:
                st["pressure_warning"] = s.pressure_warning
            if s.last_compaction is not None:
                st["last_compaction"] = s.last_compaction
            clean: dict[str, Any] = redact_obj(st)  # no secret in status(): a plugin's or custom summarizer's text too
            return clean
