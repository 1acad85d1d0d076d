"""An engine built on the kit: cut old tool outputs to a budget, nothing else (docs/architecture.md)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, Field

from ctxengine import ContextEngine
from ctxengine.engine import Services
from ctxengine.engines.kit import cut_output, is_marked
from ctxengine.engines.kit.originals import Originals, Refs
from ctxengine.engines.kit.pacing import Pacing, settled_end
from ctxengine.engines.kit.tail import tail_by_exchanges
from ctxengine.messages import Message, content_text
from ctxengine.tokens import estimate_message_tokens


class TrimSettings(BaseModel):
    threshold: float = Field(0.6, gt=0, le=1)
    keep_recent: int = Field(3, ge=0)
    output_tokens: int = Field(300, ge=60)


class TrimEngine(ContextEngine):
    """Cut the tool outputs no compaction has settled yet, except the most recent ones."""

    deterministic = True
    calls_model = False  # compress is local work: a proxy may run it on its event loop
    Settings: ClassVar[type[TrimSettings]] = TrimSettings

    def __init__(self, *, context_length: int = 128_000, settings: TrimSettings | None = None, originals: Originals | None = None) -> None:
        self.settings = settings or TrimSettings()
        super().__init__(context_length=context_length, threshold=self.settings.threshold)
        self.originals = originals  # with a store: cut text stays recallable (ctx_expand ref=…)
        self.pacing = Pacing()

    @classmethod
    def from_config(cls, settings: TrimSettings | None = None, services: Services | None = None) -> TrimEngine:
        services = services or Services()
        return cls(context_length=services.context_length, settings=settings, originals=Originals.from_services(services))

    @property
    def name(self) -> str:
        return "trim"

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)
        self.pacing.tick()

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        tokens = self.last_prompt_tokens if prompt_tokens is None else prompt_tokens
        return self.pacing.armed(tokens, self.threshold_tokens, self.context_length)

    def retrievable(self, text: str) -> bool:
        return self.originals is not None and self.originals.retrievable(text)

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        start, end = settled_end(messages), tail_by_exchanges(messages, self.settings.keep_recent)
        refs, out = Refs(self.originals, messages), list(messages)
        for i in range(start, end):
            m = messages[i]
            if m.get("role") == "tool" and not is_marked(m):
                ref = refs.node([i], kind="cut", text=None)
                text = cut_output(content_text(m.get("content")), budget_tokens=self.settings.output_tokens, ref=ref)
                refs.text(ref, text)
                out[i] = {**m, "content": text}
        if out == messages:
            return list(messages)
        refs.commit({content_text(m.get("content")) for m in out})
        after = sum(estimate_message_tokens(m) for m in out)
        self.pacing.compacted(after=after, target=self.threshold_tokens // 2, batch=self.threshold_tokens // 4)
        self.compression_count += 1
        return out
