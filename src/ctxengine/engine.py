"""The context-engine contract: one ABC every engine implements, name for name with the seed.

Lifecycle (driven by :class:`ctxengine.ContextManager` or by your own loop)::

    1. engine instantiated (built-in, plugin directory, or registered plugin)
    2. on_session_start(session_id)          conversation begins
    3. update_from_response(usage)           after each API call
    4. should_compress()                     checked each turn
    5. compress(messages)                    when should_compress() is True
    6. on_session_end(session_id, messages)  CLI exit, /reset, gateway expiry

``on_session_reset()`` clears per-session state on ``/new`` or ``/reset``.

Engines transform and never mutate: ``compress`` returns a new list and leaves the caller's
list and dicts untouched. The invariants every engine keeps (DESIGN §3.3) are checked for any
engine by :func:`ctxengine.testing.check_engine_contract`.

Engines are policies (DESIGN §3.9): what to cut or summarize, and when. The guarantees are the
kernel's, for every engine, built-in or plugin: the manager caps every request at the window
(:mod:`ctxengine.window`), offers store-backed recall tools once text was removed
(:mod:`ctxengine.recall`), and runs ``compress`` on a copy under a deadline
(:mod:`ctxengine.loop`). An engine is built per session with :meth:`ContextEngine.from_config`
from its :attr:`ContextEngine.Settings` model and the session's :class:`Services`.
"""

from __future__ import annotations

import inspect
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from ctxengine.errors import InputError
from ctxengine.messages import Message
from ctxengine.models import DEFAULT_CONTEXT_LENGTH
from ctxengine.tokens import MessageTokens, TokenCounter

if TYPE_CHECKING:
    from ctxengine.engines.kit.records import RecallReach
    from ctxengine.recall import Recall
    from ctxengine.storage import NodeStage, RecallStore, SessionRecorder

__all__ = [
    "CompactionReport",
    "ContextEngine",
    "Services",
    "Usage",
    "accepted_keywords",
    "keyword_names",
    "normalize_usage",
]


@dataclass(slots=True)
class Services:
    """What the host hands an engine when it builds one for a session.

    ``store`` records originals and answers recall reads (``None`` when storage is off);
    ``recall`` the store-backed recall tools of this session (``None`` without a store);
    ``counter`` the configured token counter; ``tokens`` the session's per-message counts with
    it (:class:`~ctxengine.tokens.MessageTokens`: the one memo of each message's count a
    session has, shared with the kernel's decisions; an engine reads its counts there and keeps
    no memo of its own, and built without one makes a private one with
    :meth:`MessageTokens.of <ctxengine.tokens.MessageTokens.of>`, so its code path is the
    same); ``summarizer`` the configured LLM summarizer, if
    any; ``session_id`` the session the engine serves; ``context_length`` the model's window;
    ``model`` its name; ``config`` the whole :class:`~ctxengine.config.Config` (for engines
    that read more than their own section); ``reach`` whether the recall tools reach the model
    (:class:`~ctxengine.engines.kit.records.RecallReach`, set by the manager every turn: the
    texts an engine writes in place of originals ask
    :func:`~ctxengine.engines.kit.records.recall_pointer` how to say where they are); ``nodes``
    where the engine stages the nodes a compaction writes, for the host to store them with the
    compaction's record (:class:`~ctxengine.storage.NodeStage`; ``None``: the engine stores
    them itself). Engines take what they need and ignore the rest.
    """

    context_length: int = DEFAULT_CONTEXT_LENGTH
    session_id: str = "default"
    store: SessionRecorder | RecallStore | Any | None = None
    recall: Recall | None = None
    counter: TokenCounter | None = None
    tokens: MessageTokens | None = None
    summarizer: Any | None = None
    model: str | None = None
    config: Any | None = None
    reach: RecallReach | None = None
    nodes: NodeStage | None = None

    def as_kwargs(self) -> dict[str, Any]:
        """The services as keyword arguments (``None`` values left out)."""
        return {k: getattr(self, k) for k in self.__slots__ if getattr(self, k) is not None}


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage of one response, normalised from OpenAI or Anthropic shapes.

    ``prompt_tokens`` is the whole prompt, cached parts included (Anthropic reports
    ``input_tokens`` without them, so they are added back).
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


def _as_mapping(usage: Any) -> Mapping[str, Any]:
    if usage is None:
        return {}
    if isinstance(usage, Mapping):
        return usage
    dump = getattr(usage, "model_dump", None)
    if callable(dump):
        data = dump()
        if isinstance(data, Mapping):
            return data
    if hasattr(usage, "__dict__"):
        return {k: v for k, v in vars(usage).items() if not k.startswith("_")}
    raise TypeError(f"usage must be a mapping or an SDK usage object, not {type(usage).__name__}")


_COUNT_FIELDS = (
    "prompt_tokens", "completion_tokens", "total_tokens", "input_tokens", "output_tokens",
    "cache_read_input_tokens", "cache_creation_input_tokens", "cached_tokens", "cache_write_tokens",
    "promptTokenCount", "candidatesTokenCount", "totalTokenCount", "cachedContentTokenCount", "thoughtsTokenCount",
)


def _check_counts(u: Mapping[str, Any], where: str = "usage") -> None:
    """Reject token counts no provider reports: NaN, infinities and negative numbers (they
    would silently become 0 or crash deep inside ``int()``)."""
    for key in _COUNT_FIELDS:
        v = u.get(key)
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            raise InputError(f"{where}.{key} is {v!r}: token counts must be finite numbers")
        if isinstance(v, int | float) and not isinstance(v, bool) and v < 0:
            raise InputError(f"{where}.{key} is {v!r}: token counts cannot be negative")
    for sub in ("prompt_tokens_details", "input_tokens_details"):
        d = u.get(sub)
        if d is not None:
            _check_counts(_as_mapping(d), f"{where}.{sub}")


def _int(value: Any) -> int:
    if value is None or isinstance(value, bool):
        return 0
    if isinstance(value, int | float):
        return max(0, int(value))
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return 0


def normalize_usage(usage: Any) -> Usage:
    """Read a usage dict or SDK object of either provider into :class:`Usage`.

    OpenAI: ``prompt_tokens``, ``completion_tokens``, ``total_tokens``,
    ``prompt_tokens_details.cached_tokens`` (and ``.cache_write_tokens`` from gateways).
    Anthropic: ``input_tokens``, ``output_tokens``, ``cache_read_input_tokens``,
    ``cache_creation_input_tokens``. Gemini: ``promptTokenCount`` (cached part included),
    ``cachedContentTokenCount``, ``candidatesTokenCount`` + ``thoughtsTokenCount``. OpenAI Responses API: ``input_tokens`` (cached part
    included), ``output_tokens``, ``input_tokens_details.cached_tokens|cache_write_tokens``.
    NaN, infinite or negative counts raise :class:`~ctxengine.errors.InputError` naming the field.
    """
    u = _as_mapping(usage)
    _check_counts(u)
    if "promptTokenCount" in u:
        # Gemini's usageMetadata: the prompt count includes the cached part; thoughts are output
        prompt = _int(u.get("promptTokenCount"))
        completion = _int(u.get("candidatesTokenCount")) + _int(u.get("thoughtsTokenCount"))
        return Usage(prompt, completion, _int(u.get("totalTokenCount")) or prompt + completion, _int(u.get("cachedContentTokenCount")), 0)
    if "input_tokens" in u and "prompt_tokens" not in u:
        completion = _int(u.get("output_tokens"))
        if u.get("input_tokens_details") is not None and "cache_read_input_tokens" not in u:
            # OpenAI Responses API: input_tokens already includes the cached part
            prompt = _int(u.get("input_tokens"))
            details_in = _as_mapping(u["input_tokens_details"])
            read, write = (
                _int(details_in.get("cached_tokens")),
                _int(details_in.get("cache_write_tokens")),
            )
            return Usage(
                prompt, completion, _int(u.get("total_tokens")) or prompt + completion, read, write
            )
        read = _int(u.get("cache_read_input_tokens"))
        write = _int(u.get("cache_creation_input_tokens"))
        prompt = _int(u.get("input_tokens")) + read + write
        return Usage(prompt, completion, prompt + completion, read, write)
    prompt = _int(u.get("prompt_tokens"))
    completion = _int(u.get("completion_tokens"))
    total = _int(u.get("total_tokens")) or prompt + completion
    details = u.get("prompt_tokens_details")
    details_map = _as_mapping(details) if details is not None else {}
    read = _int(details_map.get("cached_tokens")) or _int(u.get("cache_read_input_tokens"))
    # OpenAI-compatible gateways (OpenRouter) report cache writes in prompt_tokens_details
    write = _int(details_map.get("cache_write_tokens")) or _int(
        u.get("cache_creation_input_tokens")
    )
    return Usage(prompt, completion, total, read, write)


@dataclass(slots=True)
class CompactionReport:
    """What one ``compress`` call did, for status lines, logs and the session store.

    ``replaced`` holds the indices (in the input list) of messages that no longer appear
    verbatim in the output; ``notes`` explain fallbacks and last-resort cuts.
    """

    engine: str
    messages_before: int
    messages_after: int
    tokens_before: int
    tokens_after: int
    replaced: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fallback: str | None = None
    elapsed_ms: float = 0.0

    @property
    def reduction(self) -> float:
        """Fraction of tokens removed (0.0 when nothing changed)."""
        if self.tokens_before <= 0:
            return 0.0
        return max(0.0, 1.0 - self.tokens_after / self.tokens_before)

    def to_dict(self) -> dict[str, Any]:
        # field by field (what ``dataclasses.asdict`` gives, without its deep copy of each index)
        return {
            "engine": self.engine,
            "messages_before": self.messages_before,
            "messages_after": self.messages_after,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "replaced": list(self.replaced),
            "notes": list(self.notes),
            "fallback": self.fallback,
            "elapsed_ms": self.elapsed_ms,
            "reduction": round(self.reduction, 4),
        }


def keyword_names(func: Any) -> frozenset[str] | None:
    """The keyword arguments ``func`` accepts by name; ``None`` when it takes ``**kwargs`` (or
    cannot be inspected). The one place an engine's call shape is read: the registry adapts an
    engine once, where it is registered, with it."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def accepted_keywords(func: Any, offered: Mapping[str, Any]) -> dict[str, Any]:
    """The part of ``offered`` that ``func`` accepts by name (all of it for ``**kwargs``)."""
    names = keyword_names(func)
    return dict(offered) if names is None else {k: v for k, v in offered.items() if k in names}


class ContextEngine(ABC):
    """Base class of every context engine (the seed's contract, kept name for name).

    Subclasses implement :attr:`name`, :meth:`update_from_response`, :meth:`should_compress`
    and :meth:`compress`, and keep the six public counters below current. Optional methods have
    the seed's defaults.
    """

    last_prompt_tokens: int = 0
    last_completion_tokens: int = 0
    last_total_tokens: int = 0
    threshold_tokens: int = 0
    context_length: int = 0
    compression_count: int = 0

    #: Fraction of ``context_length`` at which compaction fires (engines set their default).
    threshold_ratio: float = 0.5
    #: True when ``compress`` is a pure function of its input (no LLM, no clock).
    deterministic: bool = False
    #: False when ``compress`` never waits for a model or a server (local CPU work, bounded by
    #: its input): a host may then run it where it would not run a call taking seconds (the
    #: proxy plans such a turn on its event loop). True, the safe default, for any other engine.
    calls_model: bool = True
    #: The report of the most recent ``compress`` call, if any.
    last_report: CompactionReport | None = None
    #: The engine's settings model (a pydantic model class), or ``None`` for engines without
    #: settings. ``from_config`` receives an instance validated from the config.
    Settings: ClassVar[type[BaseModel] | None] = None
    #: The config section holding this engine's settings; ``None`` (every built-in) means the
    #: section named after the engine's registered name (``compressor:``, ``rules:`` …).
    config_section: ClassVar[str | None] = None

    def __init__(
        self, *, context_length: int = DEFAULT_CONTEXT_LENGTH, threshold: float | None = None
    ) -> None:
        if threshold is not None:
            self.threshold_ratio = float(threshold)
        self.context_length = int(context_length)
        self.threshold_tokens = int(self.context_length * self.threshold_ratio)
        self.last_prompt_tokens = 0
        self.last_completion_tokens = 0
        self.last_total_tokens = 0
        self.compression_count = 0
        self.last_report = None

    # -- required -------------------------------------------------------------------------
    @property
    @abstractmethod
    def name(self) -> str:
        """Short identifier; must match the ``context.engine`` value that selects it."""

    @abstractmethod
    def update_from_response(self, usage: Any) -> None:
        """Record the usage of the last API call (updates the ``last_*_tokens`` counters)."""

    @abstractmethod
    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        """True when compaction should fire this turn."""

    @abstractmethod
    def compress(
        self,
        messages: list[Message],
        current_tokens: int | None = None,
        focus_topic: str | None = None,
    ) -> list[Message]:
        """Compact ``messages`` and return a new, valid OpenAI-format list (never mutate)."""

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_config(cls, settings: Any = None, services: Services | None = None) -> ContextEngine:
        """Build an engine for one session from its validated ``settings`` (an instance of
        :attr:`Settings`, or ``None``) and the session's :class:`Services`. The host calls this
        once per session; never share an instance.

        Default: ``cls(**kwargs)`` where ``kwargs`` are the settings' fields and the services
        (``context_length``, ``store``, ``counter`` …) that ``__init__`` accepts by name, so a
        simple engine needs no override. Engines of other shapes (the seed's
        ``from_config(config, context_length, **services)``, a plain constructor) are adapted
        once, where they are registered (:mod:`ctxengine.registry`).
        """
        services = Services() if services is None else services
        if not isinstance(services, Services):
            raise TypeError(
                f"from_config(settings, services): services must be a Services, not {type(services).__name__}"
            )
        offered: dict[str, Any] = services.as_kwargs()
        named = keyword_names(cls.__init__) or ()
        for newer in ("tokens", "nodes"):
            if newer in offered and newer not in named:
                # newer than the seed: only to an ``__init__`` that names it (one taking
                # ``**kwargs`` may hand them on to a constructor that refuses unknown keywords)
                del offered[newer]
        if settings is not None:
            offered.update(settings.model_dump() if isinstance(settings, BaseModel) else dict(settings))
        return cls(**accepted_keywords(cls.__init__, offered))

    def retrievable(self, text: str) -> bool:
        """True when ``text``, missing from the context, can be given back verbatim by this
        engine's own means (DESIGN §3.3 #8). Default: False — the kernel's store-backed recall
        answers for every engine; override only for an engine that keeps originals elsewhere."""
        return False

    # -- optional, with the seed's defaults ------------------------------------------------
    def on_session_start(self, session_id: str, **kwargs: Any) -> None:  # noqa: B027
        """A conversation begins (load persisted state here). Default: no-op."""

    def on_session_end(self, session_id: str, messages: list[Message]) -> None:  # noqa: B027
        """A session ends (flush state, close connections here). Default: no-op."""

    def on_session_reset(self) -> None:
        """``/new`` or ``/reset``: clear per-session state. Default: reset the token counters."""
        self.last_prompt_tokens = 0
        self.last_completion_tokens = 0
        self.last_total_tokens = 0
        self.compression_count = 0
        self.last_report = None

    def update_model(self, model: str, context_length: int, **kwargs: Any) -> None:
        """The model changed: update ``context_length`` and recompute ``threshold_tokens``."""
        self.context_length = int(context_length)
        self.threshold_tokens = int(self.context_length * self.threshold_ratio)

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        """Tools the agent may call (e.g. ``lcm_grep``). Default: none."""
        return []

    def handle_tool_call(self, name: str, args: Mapping[str, Any], **kwargs: Any) -> str:
        """Run one of this engine's tools and return its result as a JSON string."""
        return json.dumps({"error": f"Unknown tool: {name}"})

    def should_compress_preflight(self, messages: list[Message]) -> bool:
        """A cheap estimate before the API call. Default: False."""
        return False

    def get_status(self) -> dict[str, Any]:
        """The standard token/threshold dict shown in status lines."""
        last_prompt = max(self.last_prompt_tokens, 0)  # hosts set -1 while awaiting real usage
        usage = last_prompt / self.context_length if self.context_length else 0.0
        status: dict[str, Any] = {
            "engine": self.name,
            "last_prompt_tokens": last_prompt,
            "last_completion_tokens": max(self.last_completion_tokens, 0),
            "last_total_tokens": max(self.last_total_tokens, 0),
            "threshold_tokens": self.threshold_tokens,
            "context_length": self.context_length,
            "compression_count": self.compression_count,
            "usage_percent": round(100.0 * usage, 1),
        }
        if self.last_report is not None:
            status["last_compaction"] = self.last_report.to_dict()
        return status

    # -- helpers for subclasses -------------------------------------------------------------
    def _record_usage(self, usage: Any) -> Usage:
        """Store a response's usage in the public counters; returns the normalised form."""
        u = normalize_usage(usage)
        self.last_prompt_tokens = u.prompt_tokens
        self.last_completion_tokens = u.completion_tokens
        self.last_total_tokens = u.total_tokens
        return u
