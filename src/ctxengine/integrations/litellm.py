"""ctxengine inside LiteLLM: a hook that a LiteLLM proxy's config, or a program calling the LiteLLM
SDK, names; no second proxy in front of the gateway.

LiteLLM proxy (``config.yaml``)::

    litellm_settings:
      callbacks: ctxengine.integrations.litellm.ctxengine_hook

LiteLLM SDK (``litellm.acompletion``, ``litellm.anthropic_messages``, a ``Router``'s async calls)::

    import litellm
    from ctxengine.integrations.litellm import ctxengine_hook
    litellm.callbacks = [ctxengine_hook]

``ctxengine_hook`` is built on first use from ``$CTXENGINE_CONFIG`` (else the defaults); a
program may build its own :class:`CtxEngineHook` with a config or a store instead.

What it does, per call, with the proxy's own request path (:class:`~ctxengine.proxy.app.Proxy`
used without its HTTP server, so every rule is the proxy's):

* **before the call** (``async_pre_call_deployment_hook``: LiteLLM runs it once the deployment
  is chosen, in the proxy and in the SDK's async calls alike): a chat-completions or Anthropic
  messages request is read as the proxy reads its body; its session is named as the proxy names
  one (``x-ctxengine-session``; LiteLLM's own session id: ``x-litellm-session-id``,
  ``litellm_session_id``, ``metadata.session_id``; a client's own id; else derived from the
  conversation and told apart from others by its history); the resent history is mapped onto
  the session's working context and compacted when due; cache breakpoints are placed for Claude
  models unless the client placed its own. The window is the proxy's rule (config > learnt >
  table > default) with LiteLLM's model info (the deployment's ``model_info.max_input_tokens``,
  else ``litellm.get_model_info``) in place of the table when ctxengine's config names none.
* **after the call** (``async_log_success_event`` / ``async_log_failure_event``): the response's
  usage goes to the session's manager and the turn is written to ctxengine's store; the
  session's next call waits for that.

**Shadow mode** (``proxy.shadow: true`` in ctxengine's config): every call goes as it came, and
what ctxengine would have sent is planned after the response and logged with the request in the
store's request log (``ctxengine stats``, the dashboard), as ``ctxengine proxy --shadow`` does.
Every call is logged there, shadow or not.

**Recall**: LiteLLM gives a hook no round trip of its own, so the engine's recall tools are never
offered: the hook runs the proxy's no-tools mode (``prepare(..., recall=False)``), in which no
marker or summary points to a tool the model cannot call; originals stay in the store
(``ctxengine sessions show``).

**Fail open**: an error inside the hook never fails the call: the request goes on held under the
window by the window cap alone (unchanged when even that fails), logged and counted
(``ctxengine_proxy_fail_open_total`` in :attr:`CtxEngineHook.proxy`'s metrics, and
:attr:`CtxEngineHook.failed`).

The synchronous ``litellm.completion`` runs no hook that may change a request, so it is not
compacted; use ``litellm.acompletion``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import anyio
import orjson
from litellm.integrations.custom_logger import CustomLogger

from ctxengine.config import Config, load_config
from ctxengine.proxy.apis import ANTHROPIC, OPENAI, Api
from ctxengine.proxy.app import Proxy
from ctxengine.proxy.base import Plan
from ctxengine.proxy.limits import Window, Windows
from ctxengine.proxy.session import SESSION_HEADER, session_from_header
from ctxengine.storage import SessionRecorder

__all__ = ["CtxEngineHook", "LiteLLMWindows", "ctxengine_hook"]  # noqa: F822 (module __getattr__)

log = logging.getLogger("ctxengine.litellm")

_APIS: dict[str, Api] = {"completion": OPENAI, "acompletion": OPENAI, "anthropic_messages": ANTHROPIC}
"""LiteLLM's call types the hook serves, and the proxy's adapter for each."""

_BODY_KEYS = ("model", "messages", "system", "tools", "stream", "prompt_cache_key")
"""The request's keys the proxy's path reads (its body); every other key stays LiteLLM's."""

_WRITTEN = ("messages", "system", "tools")
"""The keys a plan may change."""

SETTLE_WAIT = 60.0
"""Seconds a session's call waits at most for its previous call's after-work (usage, store
write), which LiteLLM's log event starts; past that it is planned anyway."""

MAX_HELD = 10_000
"""Calls whose after-call work waits for LiteLLM's log event at most (older ones are settled
without their usage: a call whose event never came must not hold memory or its session)."""


class LiteLLMWindows(Windows):
    """The proxy's windows (config > learnt > table > default) with LiteLLM's model info in place
    of the table: the deployment's ``model_info.max_input_tokens``, else
    ``litellm.get_model_info(model)``'s, when ctxengine's config names no window for the model."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.reported: dict[str, int | None] = {}

    def note(self, model: str, kwargs: Mapping[str, Any]) -> None:
        """Remember the window LiteLLM knows for ``model`` (looked up once per model)."""
        if model in self.reported:
            return
        tokens = _max_input(kwargs.get("model_info"))
        if tokens is None:
            try:
                import litellm

                tokens = _max_input(litellm.get_model_info(model))
            except Exception:  # a model LiteLLM does not know: ctxengine's own rule
                tokens = None
        self.reported[model] = tokens

    def window_for(self, api: str, model: str) -> Window:
        reported = self.reported.get(model)
        if reported is not None and self.configured(model) is None and self.learnt(api, model) is None:
            return Window(reported, "litellm")
        return super().window_for(api, model)


def _max_input(info: Any) -> int | None:
    if not isinstance(info, Mapping):
        return None
    for key in ("max_input_tokens", "max_tokens"):
        value = info.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


class CtxEngineHook(CustomLogger):  # type: ignore[misc]  # LiteLLM is untyped
    """The hook (see the module docstring). ``config``: a :class:`~ctxengine.config.Config`, a
    YAML path, or ``None`` (``$CTXENGINE_CONFIG``, else the defaults); ``store``: as
    :class:`~ctxengine.proxy.app.Proxy` takes it (``"default"``: the configured store)."""

    def __init__(self, config: Config | str | Path | None = None, *, store: SessionRecorder | Literal["default"] | None = "default") -> None:
        super().__init__()
        cfg = config if isinstance(config, Config) else load_config(config)
        # no round trip of its own inside LiteLLM: the proxy's no-tools mode (recall=False)
        # (and the proxy's timeout, which bounds a session's wait for its previous call's
        # after-work: the hook itself calls no upstream)
        proxy_cfg = cfg.proxy.model_copy(update={"recall_tools": False, "timeout": min(cfg.proxy.timeout, SETTLE_WAIT)})
        cfg = cfg.model_copy(update={"proxy": proxy_cfg})
        self.proxy = Proxy(cfg, store=store)
        self.windows = LiteLLMWindows(cfg)
        self.proxy.windows = self.windows
        self.failed = 0
        """Calls whose context management failed (forwarded under the window cap, or unchanged)."""
        self._held: dict[str, Plan] = {}

    async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any], call_type: Any) -> dict[str, Any] | None:
        """The request with its messages mapped onto the session's working context (compacted
        when due), or ``None`` (unchanged: not a chat call, nothing to change, or a failure
        even the window cap could not hold: logged and counted, never raised)."""
        api = _APIS.get(str(getattr(call_type, "value", call_type)))
        if api is None or not isinstance(kwargs.get("messages"), list):
            return None
        try:
            return await self._pre_call(api, kwargs)
        except Exception as exc:  # the call goes on as it came
            self.failed += 1
            self.proxy._fail_open(api, Plan(api, "", {}, b""), "hook", exc)
            return None

    async def _pre_call(self, api: Api, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        started = time.perf_counter()
        call_id = str(kwargs.get("litellm_call_id") or "")
        retried = self._held.pop(call_id, None) if call_id else None
        if retried is not None:  # LiteLLM sends the call again (a retry, a fallback): its first plan is done
            self.proxy._settle_later(retried)
        body = _body(kwargs)
        if api.problem(body) is not None:
            return None
        raw = orjson.dumps(body)
        plan = Plan(api, "", body, raw)
        try:
            self.windows.note(body["model"], kwargs)
            plan.session = await self._session(api, _headers(kwargs), body)
            if self.proxy.settings.shadow:
                # shadow mode (proxy.shadow): the call goes as it came; what ctxengine would have
                # sent is planned after the response and logged with the request
                plan.shadow, plan.client, plan.added = True, "litellm", time.perf_counter() - started
                self._hold(call_id, plan)
                return None
            plan = await self.proxy._planned(api, plan.session, body, raw)
        except Exception as exc:  # fail open: the request held under the window by the cap alone
            self.failed += 1
            self.proxy._fail_open(api, plan, "prepare", exc)
            try:
                plan = await anyio.to_thread.run_sync(self.proxy._plan_capped, api, plan.session, body, raw)
            except Exception as cap:  # not even the window cap: the call goes as it came
                log.warning("the window cap could not hold a failed call; it goes unchanged: %s: %s", type(cap).__name__, cap)
                return None
        plan.added = time.perf_counter() - started
        self._hold(call_id, plan)
        return _applied(kwargs, plan, body)

    async def _session(self, api: Api, headers: dict[str, str], body: Mapping[str, Any]) -> str:
        named = session_from_header(headers.get(SESSION_HEADER))
        return named if named is not None else await self.proxy._route(api, headers, body)

    def _hold(self, call_id: str, plan: Plan) -> None:
        """Keep ``plan`` until LiteLLM's log event brings the call's usage; until then the
        session's next call waits (the proxy's gate, at most :data:`SETTLE_WAIT` seconds)."""
        if (plan.manager is None and not plan.shadow) or not call_id:
            self.proxy._settle_later(plan)
            return
        gate = anyio.Event()
        plan.gate = gate
        if plan.state is not None:
            plan.state.settling = gate
        self._held[call_id] = plan
        while len(self._held) > MAX_HELD:
            self.proxy._settle_later(self._held.pop(next(iter(self._held))))

    def _release(self, kwargs: Mapping[str, Any], response: Any, *, ok: bool = True) -> None:
        plan = self._held.pop(str(kwargs.get("litellm_call_id") or ""), None)
        if plan is None:
            return
        # how the call ended, for the store's request log (the dashboard), as the proxy logs it
        plan.outcome, plan.status = ("ok", 200) if ok else ("upstream_error", 0)
        plan.client = plan.client or "litellm"
        try:
            usage = _usage(response)
        except Exception as exc:  # the turn is still written; only its usage is lost
            log.warning("the usage of a LiteLLM response could not be read: %s: %s", type(exc).__name__, exc)
            usage = None
        self.proxy._settle_later(plan, usage)

    async def async_log_success_event(self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any) -> None:
        """The call's usage to the session's manager, the turn written to the store."""
        self._release(kwargs, response_obj)

    async def async_log_failure_event(self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any) -> None:
        """A failed call: the turn is still written (no usage)."""
        self._release(kwargs, None, ok=False)

    def close(self) -> None:
        """End every session (what is pending is written first)."""
        self.proxy.close()


def _plain(value: Any) -> Any:
    """A pydantic object an SDK caller passed back (a previous response's message) as JSON."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(exclude_none=True)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _body(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The request as the proxy reads a body: the keys it reads, as plain JSON values, plus the
    Anthropic ``metadata.user_id`` (Claude Code's session id) when there is one."""
    body: dict[str, Any] = orjson.loads(orjson.dumps({k: kwargs[k] for k in _BODY_KEYS if kwargs.get(k) is not None}, default=_plain))
    metadata = kwargs.get("metadata")
    if isinstance(metadata, Mapping) and isinstance(metadata.get("user_id"), str):
        body["metadata"] = {"user_id": metadata["user_id"]}
    return body


def _headers(kwargs: Mapping[str, Any]) -> dict[str, str]:
    """The client's request headers (lower-case names; the LiteLLM proxy keeps them in
    ``proxy_server_request``, an SDK caller's are its ``extra_headers``), with LiteLLM's own
    session id as ``x-litellm-session-id`` when the request carries one."""
    headers: dict[str, str] = {}
    psr = kwargs.get("proxy_server_request")
    for source in (psr.get("headers") if isinstance(psr, Mapping) else None, kwargs.get("extra_headers"), kwargs.get("headers")):
        if isinstance(source, Mapping):
            for k, v in source.items():
                if isinstance(k, str) and isinstance(v, str):
                    headers.setdefault(k.lower(), v)
    if "x-litellm-session-id" not in headers:
        for value in _session_ids(kwargs):
            headers["x-litellm-session-id"] = value
            break
    return headers


def _session_ids(kwargs: Mapping[str, Any]) -> list[str]:
    """LiteLLM's session id as a request may carry it: ``litellm_session_id``, else
    ``metadata.session_id`` / ``litellm_metadata.session_id`` (LiteLLM's trace id is not one:
    LiteLLM makes one up per call when the client sends none)."""
    found = [kwargs.get("litellm_session_id")]
    for key in ("metadata", "litellm_metadata"):
        meta = kwargs.get(key)
        if isinstance(meta, Mapping):
            found.append(meta.get("session_id"))
    return [v for v in found if isinstance(v, str) and v]


def _applied(kwargs: dict[str, Any], plan: Plan, body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``kwargs`` with what the plan changed in ``body`` (messages, system, tools), or None
    when it goes as it came (the proxy's writer returns the body itself then)."""
    sent = plan.body
    if sent is body:
        return None
    out = dict(kwargs)
    for key in _WRITTEN:
        if key in sent:
            out[key] = sent[key]
    return out


def _usage(response: Any) -> dict[str, Any] | None:
    """A LiteLLM response's usage as a plain dict (``None`` values left out), or None."""
    usage = response.get("usage") if isinstance(response, Mapping) else getattr(response, "usage", None)
    if usage is None:
        return None
    dump = getattr(usage, "model_dump", None)
    data = dump() if callable(dump) else usage
    if not isinstance(data, Mapping):
        return None
    return {k: v for k, v in data.items() if v is not None}


_default: CtxEngineHook | None = None


def __getattr__(name: str) -> Any:
    """``ctxengine_hook``: the hook a LiteLLM config names, built on first use."""
    global _default
    if name == "ctxengine_hook":
        if _default is None:
            _default = CtxEngineHook()
        return _default
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
