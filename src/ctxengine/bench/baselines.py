"""The two baselines every benchmark shows next to the engines.

``none``
    No compaction at all: what the session costs when the context only grows (requests past
    the window are counted, not refused).
``mask10``
    Rolling observation masking, the baseline of the JetBrains "Complexity Trap" study: on
    every call, each tool output older than the last 10 is replaced by a short placeholder.
    Cheap to compute and effective on raw size, but every call edits one more old message, so
    under explicit cache breakpoints each request rewrites the prefix after it.
"""

from __future__ import annotations

from typing import Any

from ctxengine.engine import CompactionReport, ContextEngine
from ctxengine.messages import Message, content_text
from ctxengine.models import DEFAULT_CONTEXT_LENGTH
from ctxengine.tokens import estimate_messages_tokens

__all__ = ["MASK_PLACEHOLDER", "MaskingBaseline", "NoCompaction"]

MASK_PLACEHOLDER = "[ctxengine:masked] Old tool output omitted for brevity."


class NoCompaction(ContextEngine):
    """The ``none`` baseline: never compresses."""

    deterministic = True

    def __init__(self, *, context_length: int = DEFAULT_CONTEXT_LENGTH, threshold: float | None = None) -> None:
        super().__init__(context_length=context_length, threshold=threshold)

    @property
    def name(self) -> str:
        return "none"

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        return False

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        return list(messages)


class MaskingBaseline(ContextEngine):
    """The ``mask10`` baseline: tool outputs older than the last ``keep`` are masked, every call."""

    deterministic = True

    def __init__(self, *, context_length: int = DEFAULT_CONTEXT_LENGTH, threshold: float | None = None, keep: int = 10) -> None:
        super().__init__(context_length=context_length, threshold=threshold)
        self.keep = keep

    @property
    def name(self) -> str:
        return f"mask{self.keep}"

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        return True

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        tools = [i for i, m in enumerate(messages) if m.get("role") == "tool"]
        old = [i for i in tools[: max(0, len(tools) - self.keep)] if content_text(messages[i].get("content")) != MASK_PLACEHOLDER]
        if not old:
            return list(messages)
        out = list(messages)
        for i in old:
            out[i] = {**messages[i], "content": MASK_PLACEHOLDER}
        self.compression_count += 1
        self.last_report = CompactionReport(
            self.name,
            len(messages),
            len(out),
            estimate_messages_tokens(messages),
            estimate_messages_tokens(out),
            replaced=old,
        )
        return out
