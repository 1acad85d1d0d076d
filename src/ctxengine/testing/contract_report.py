"""The vocabulary of the engine contract kit: the invariants by number, the violation it raises
and the report it returns (see :mod:`ctxengine.testing.contract`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxengine.engine import ContextEngine
from ctxengine.messages import Message

__all__ = [
    "INVARIANTS",
    "MAX_ANNOTATION_CHARS",
    "ContractReport",
    "ContractViolation",
    "EngineSource",
    "show_messages",
]

INVARIANTS: dict[int, str] = {
    1: "valid in, valid out",
    2: "no mutation",
    3: "under the threshold nothing changes",
    4: "no fabrication",
    5: "anchors survive",
    6: "deterministic engines are deterministic",
    7: "prefix stability",
    8: "preservation guarantee",
    10: "window held (kernel, exact count)",
    11: "removed facts retrievable (kernel recall)",
    12: "no thrash",
}
"""The invariants of DESIGN §3.3 the kit checks, by number."""

EngineSource = ContextEngine | Callable[[], ContextEngine]
"""An engine instance, or a callable returning a fresh engine (preferred)."""

MAX_ANNOTATION_CHARS = 500
"""Longest bracketed annotation line a reduced message may add (truncation notes, the system
prompt note of the seed's compressor, which is about 240 characters)."""

_SHOW_STRING = 160
_SHOW_MESSAGES = 60


class ContractViolation(AssertionError):
    """An engine broke an invariant. ``invariant`` is its number (see :data:`INVARIANTS`),
    ``example`` the message list (the engine's input) that shows it."""

    def __init__(self, invariant: int, engine: str, detail: str, example: Sequence[Message], where: str = "") -> None:
        self.invariant = invariant
        self.engine = engine
        self.detail = detail
        self.example = list(example)
        self.where = where
        head = f"invariant {invariant} ({INVARIANTS.get(invariant, '?')}) broken by engine {engine!r}: {detail}"
        if where:
            head += f"\n  where: {where}"
        super().__init__(f"{head}\n  minimal example ({len(self.example)} messages):\n{show_messages(self.example)}")


@dataclass(slots=True)
class ContractReport:
    """What :func:`check_engine_contract` exercised (it raises on the first violation).

    ``checks`` counts, per invariant number, how many times it was checked;
    ``turn_compactions`` counts compactions fired by ``should_compress`` on the per-turn path
    (0 means the generated sessions never reached the threshold: use a smaller
    ``context_length``, or invariants 3 and 7 were barely exercised); ``facts_beyond_window``
    counts facts missing from outputs that could not have held them inside the window;
    ``anchors_beyond_window`` counts checks made on inputs whose system prompt and user
    messages alone overflow the window (only the latest user message is then required
    verbatim, and prefix stability is not checked).
    """

    engine: str
    deterministic: bool
    examples: int = 0
    compress_calls: int = 0
    turn_compactions: int = 0
    facts_beyond_window: int = 0
    anchors_beyond_window: int = 0
    checks: dict[int, int] = field(default_factory=lambda: dict.fromkeys(INVARIANTS, 0))
    max_consecutive_compactions: int = 0
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        counts = ", ".join(f"{k}:{v}" for k, v in sorted(self.checks.items()))
        text = (
            f"engine {self.engine!r}: {self.examples} examples, {self.compress_calls} compress calls, "
            f"{self.turn_compactions} per-turn compactions, {self.facts_beyond_window} facts and "
            f"{self.anchors_beyond_window} anchor sets beyond the window; "
            f"checks per invariant {counts}"
        )
        return text + "".join(f"\n  note: {n}" for n in self.notes)


def show_messages(messages: Sequence[Any]) -> str:
    """A readable, bounded rendering of a message list: one JSON line per message, long
    strings cut in the middle, at most 60 messages."""

    def shorten(v: Any) -> Any:
        if isinstance(v, str) and len(v) > _SHOW_STRING:
            half = _SHOW_STRING // 2
            return f"{v[:half]}…[{len(v) - _SHOW_STRING} chars]…{v[-half:]}"
        if isinstance(v, list):
            return [shorten(x) for x in v]
        if isinstance(v, dict):
            return {k: shorten(x) for k, x in v.items()}
        return v

    lines = []
    for i, m in enumerate(messages[:_SHOW_MESSAGES]):
        lines.append(f"    [{i}] {json.dumps(shorten(m), ensure_ascii=False, default=repr)}")
    if len(messages) > _SHOW_MESSAGES:
        lines.append(f"    … {len(messages) - _SHOW_MESSAGES} more")
    return "\n".join(lines) if lines else "    (empty)"
