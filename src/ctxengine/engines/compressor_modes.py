"""The ``compressor``'s two modes: digests (the default) or summaries (when one is asked for).

``compression.mode`` decides how the ``compressor`` compacts a session built from a config:

* ``digest`` — the policy that costs least under prompt caching (the ``cacheaware`` engine's,
  :mod:`ctxengine.engines.cacheaware`, settings from the ``cacheaware:`` section): the last
  tool exchanges stay whole, older ones are folded in batches into digests of actions and
  facts, giant outputs are cut before they are sent, the settled prefix is never rewritten.
  Measured on real agent runs it costs a little over half of the summarizing path on long
  sessions and less on single runs, with every fact kept (verbatim or retrievable). What
  digests cannot bring under the threshold (files pasted into user messages, long chats
  without tools) is then summarized, as in ``summary`` mode: the summary only where it pays.
* ``summary`` — the structured summary of :mod:`ctxengine.engines.compressor`, written by the
  configured LLM (or the extractive summarizer), updated iteratively.
* ``auto`` (default) — ``summary`` when a summarizer is configured
  (``auxiliary.compression.model``, the older ``compression.summary_model``, or a summarizer
  handed to the host): whoever names a model wants its summaries; ``digest`` otherwise.

:class:`DigestMode` is the mixin that hands the engine contract to the digest policy when the
mode is ``digest``; a :class:`~ctxengine.engines.compressor.ContextCompressor` built directly
(Hermes' constructor) summarizes unless ``mode="digest"`` is given, as Hermes' own does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from ctxengine.engines.cacheaware import CacheAwareEngine
from ctxengine.engines.kit.originals import Originals
from ctxengine.errors import ConfigError
from ctxengine.messages import Message

if TYPE_CHECKING:
    from ctxengine.config import Config
    from ctxengine.engines.kit.records import RecallReach
    from ctxengine.storage import NodeStage
    from ctxengine.tokens import TokenCounter

__all__ = ["MODES", "DigestMode", "digest_policy", "resolve_mode"]

MODES = ("auto", "digest", "summary")

Mode = Literal["digest", "summary"]


def resolve_mode(mode: str, *, summarizer: Any) -> Mode:
    """``digest`` or ``summary`` for the setting ``mode`` (``auto``: summary when a summarizer
    is configured, i.e. ``summarizer`` is not None)."""
    if mode not in MODES:
        raise ConfigError(f"compression.mode must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "auto":
        return "summary" if summarizer is not None else "digest"
    return "digest" if mode == "digest" else "summary"


def digest_policy(
    config: Config | None,
    context_length: int,
    *,
    store: Any = None,
    counter: TokenCounter | None = None,
    reach: RecallReach | None = None,
    session_id: str | None = None,
    threshold: float | None = None,
    nodes: NodeStage | None = None,
) -> CacheAwareEngine:
    """The digest policy for one session: ``cacheaware:`` settings of ``config``, originals in
    ``store``; ``threshold`` (an explicit ``compression.threshold``) is where old turns fold."""
    from ctxengine.config import CacheAwareConfig

    settings = config.cacheaware if config is not None else CacheAwareConfig()
    if threshold is not None:
        settings = settings.model_copy(update={"fold_ratio": float(threshold), "fold_target": min(settings.fold_target, float(threshold) * 0.7)})
    originals = Originals(store, session_id or "default", counter=counter, reach=reach, stage=nodes) if store is not None else None
    return CacheAwareEngine(
        context_length=context_length,
        settings=settings,
        originals=originals,
        counter=counter,
        cache_ttl=config.cache_ttl if config is not None else "5m",
    )


class DigestMode:
    """Mixin of the ``compressor``: with a digest policy set (``_digests``), the trigger,
    compaction and recall are the policy's; the compressor keeps its own status and counts.
    Without one every call goes to the summarizing path (the next class in the MRO)."""

    _digests: CacheAwareEngine | None = None
    enabled: bool
    compression_count: int
    last_report: Any
    threshold_ratio: float
    threshold_tokens: int

    @property
    def clock(self) -> Callable[[], float] | None:
        """The digest policy's clock (seconds; a replay sets its simulated one), else None."""
        return self._digests.clock if self._digests is not None else None

    @clock.setter
    def clock(self, value: Callable[[], float]) -> None:
        if self._digests is not None:
            self._digests.clock = value

    @property
    def mode(self) -> Mode:
        """``digest`` or ``summary``: how this engine compacts."""
        return "digest" if self._digests is not None else "summary"

    def update_from_response(self, usage: Any) -> None:
        d = self._digests
        if d is not None:
            d.update_from_response(usage)
        super().update_from_response(usage)  # type: ignore[misc]

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        d = self._digests
        if d is None:
            return bool(super().should_compress(prompt_tokens))  # type: ignore[misc]
        return self.enabled and d.should_compress(prompt_tokens)

    def should_compress_preflight(self, messages: list[Message]) -> bool:
        d = self._digests
        if d is None:
            return bool(super().should_compress_preflight(messages))  # type: ignore[misc]
        return self.enabled and d.should_compress_preflight(messages)

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        d = self._digests
        if d is None:
            out: list[Message] = super().compress(messages, current_tokens, focus_topic)  # type: ignore[misc]
            return out
        count = d.compression_count
        out = d.compress(messages, current_tokens, focus_topic)
        if d.compression_count != count:
            self.compression_count += 1
            self.last_report = d.last_report
        judged = max(int(current_tokens or 0), sum(d._tokens(m) for m in messages))
        if judged >= d.threshold_tokens or focus_topic is not None:
            # at the threshold, what digests cannot fold (pasted files, long chats without
            # tools) is summarized: the summary pays where nothing else gets under it
            left = sum(d._tokens(m) for m in out)
            if left >= d.threshold_tokens or (focus_topic is not None and out is messages):
                summarized: list[Message] = super().compress(out, max(left, int(current_tokens or 0)) if out is messages else left, focus_topic)  # type: ignore[misc]
                return summarized
        return out

    def retrievable(self, text: str) -> bool:
        d = self._digests
        if d is not None and d.retrievable(text):
            return True
        return bool(super().retrievable(text))  # type: ignore[misc]

    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        if self._digests is not None:
            self._digests.on_session_start(session_id, **kwargs)
        super().on_session_start(session_id, **kwargs)  # type: ignore[misc]

    def on_session_reset(self) -> None:
        super().on_session_reset()  # type: ignore[misc]
        if self._digests is not None:
            self._digests.on_session_reset()

    def update_model(self, model: str, context_length: int, **kwargs: Any) -> None:
        super().update_model(model, context_length, **kwargs)  # type: ignore[misc]
        if self._digests is not None:
            self._digests.update_model(model, context_length, **kwargs)
            self.threshold_tokens = self._digests.threshold_tokens

    def get_status(self) -> dict[str, Any]:
        status: dict[str, Any] = super().get_status()  # type: ignore[misc]
        status["mode"] = self.mode
        if self._digests is not None:
            status["digest_threshold_tokens"] = self._digests.threshold_tokens
        return status
