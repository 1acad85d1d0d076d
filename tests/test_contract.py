"""The contract kit passes correct toy engines and catches deliberately broken ones, naming the
invariant each breaks."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from ctxengine.engine import ContextEngine
from ctxengine.messages import Message, content_text, is_summary, message_text, validate
from ctxengine.testing.contract import (
    ContractReport,
    ContractViolation,
    check_engine_contract,
    show_messages,
)
from ctxengine.testing.strategies import conversations

WINDOW = 4_000
FAST: dict[str, Any] = {"examples": 30, "shrink_seconds": 3.0}


class ToyEngine(ContextEngine):
    """Base of the toys: fires at half the window, records usage."""

    deterministic = True

    @property
    def name(self) -> str:
        return type(self).__name__.lower()

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        tokens = self.last_prompt_tokens if prompt_tokens is None else prompt_tokens
        return tokens >= self.threshold_tokens

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        self.compression_count += 1
        return list(messages)


def last_user_index(messages: list[Message]) -> int:
    return max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages))


class Identity(ToyEngine):
    """Correct: never changes anything."""


class Masker(ToyEngine):
    """Correct (but not fact-preserving, so it does not claim determinism): tool results before
    the latest user message become a marked placeholder of the same call."""

    deterministic = False

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        self.compression_count += 1
        cut = last_user_index(messages)
        return [
            {**m, "content": "[ctxengine:masked tool output]"} if i < cut and m.get("role") == "tool" else m
            for i, m in enumerate(messages)
        ]


class Mutator(ToyEngine):
    """Broken (2): shortens tool outputs in place."""

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        for m in messages:
            if m.get("role") == "tool" and isinstance(m.get("content"), str) and len(m["content"]) > 50:
                m["content"] = m["content"][:50]
        return list(messages)


class UserDropper(ToyEngine):
    """Broken (5): keeps only the latest user message."""

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        last = last_user_index(messages)
        return [m for i, m in enumerate(messages) if m.get("role") != "user" or i == last]


class Orphaner(ToyEngine):
    """Broken (1): drops assistant messages with tool calls but keeps their results."""

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        return [m for m in messages if not (m.get("role") == "assistant" and m.get("tool_calls"))]


_COUNTER = itertools.count()


class Nondeterministic(ToyEngine):
    """Broken (6): claims determinism, stamps each summary with a global counter."""

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        return [*messages[:1], {"role": "user", "content": f"[ctxengine:summary {next(_COUNTER)}]"}, *messages[1:]]


class Fabricator(ToyEngine):
    """Broken (4): invents an unmarked assistant message."""

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        return [*messages, {"role": "assistant", "content": "All tests pass, the task is done."}]


class TriggerHappy(Identity):
    """Broken (3): wants to compress whatever the size."""

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        return True


class PrefixRewriter(Masker):
    """Broken (7): stamps every placeholder with the compaction number, so each compaction
    rewrites the placeholders the previous one wrote."""

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        self.compression_count += 1
        cut = last_user_index(messages)
        note = f"[ctxengine:masked at compaction {self.compression_count}]"
        return [{**m, "content": note} if i < cut and m.get("role") == "tool" else m for i, m in enumerate(messages)]


class FactLoser(Masker):
    """Broken (8): a deterministic engine that drops tool outputs without keeping their facts."""

    deterministic = True


class SystemDropper(ToyEngine):
    """Broken (5): drops the system prompt."""

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        return [m for m in messages if m.get("role") != "system"]


class Raiser(ToyEngine):
    """Broken (1): crashes on tool messages with list content."""

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        for m in messages:
            if m.get("role") == "tool" and isinstance(m.get("content"), list):
                raise TypeError("unexpected list content")
        return list(messages)


class KeepsOriginals(FactLoser):
    """Correct: like FactLoser, but the masked outputs stay retrievable (``retrievable``), which
    the preservation guarantee accepts ("or retrievable verbatim from the store")."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.originals: list[str] = []

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        cut = last_user_index(messages)
        self.originals += [message_text(m) for m in messages[:cut] if m.get("role") == "tool"]
        return super().compress(messages, current_tokens, focus_topic)

    def retrievable(self, fact: str) -> bool:
        return any(fact in text for text in self.originals)


class Folder(ToyEngine):
    """Correct: folds everything before the latest user message into one marked summary that
    quotes the user messages (and the previous summary) verbatim; rewriting the summary at each
    compaction is a fold, which prefix stability allows."""

    deterministic = False

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        head = messages[:1] if messages and messages[0].get("role") == "system" else []
        cut = last_user_index(messages)
        span = messages[len(head) : cut]
        if not span:
            return list(messages)
        quoted = [
            content_text(m.get("content")).split("\n", 1)[-1] if is_summary(m) else content_text(m.get("content"))
            for m in span
            if m.get("role") == "user" or is_summary(m)
        ]
        summary = {"role": "assistant", "content": "\n".join(["[ctxengine:summary of earlier turns]", *quoted])}
        return [*head, summary, *messages[cut:]]


def factory(cls: type[ToyEngine]) -> Any:
    return lambda: cls(context_length=WINDOW)


@pytest.mark.parametrize("cls", [Identity, Masker, KeepsOriginals, Folder])
def test_correct_engines_pass(cls: type[ToyEngine]) -> None:
    report = check_engine_contract(factory(cls), **FAST)
    assert isinstance(report, ContractReport)
    assert report.engine == cls.__name__.lower()
    assert report.examples == FAST["examples"]
    assert report.turn_compactions > 0
    for n in (1, 2, 3, 4, 5, 7):
        assert report.checks[n] > 0, n
    assert (report.checks[6] > 0) == cls.deterministic
    assert "examples" in str(report)


def test_an_engine_instance_is_reset_between_examples() -> None:
    engine = Masker(context_length=WINDOW)
    report = check_engine_contract(engine, **FAST)
    assert report.turn_compactions > 0
    assert engine.compression_count < report.compress_calls  # on_session_reset cleared it


@pytest.mark.parametrize(
    ("cls", "invariant"),
    [
        (Mutator, 2),
        (UserDropper, 5),
        (Orphaner, 1),
        (Nondeterministic, 6),
        (Fabricator, 4),
        (TriggerHappy, 3),
        (PrefixRewriter, 7),
        (FactLoser, 8),
        (SystemDropper, 5),
        (Raiser, 1),
    ],
)
def test_broken_engines_are_caught(cls: type[ToyEngine], invariant: int) -> None:
    with pytest.raises(ContractViolation) as info:
        check_engine_contract(factory(cls), **FAST)
    violation = info.value
    assert isinstance(violation, AssertionError)
    assert violation.invariant == invariant, str(violation)
    assert violation.engine == cls.__name__.lower()
    text = str(violation)
    assert text.startswith(f"invariant {invariant} (")
    assert "minimal example" in text
    assert violation.example, "the example must be shown"


def test_the_example_is_shrunk_and_shown_readably() -> None:
    with pytest.raises(ContractViolation) as info:
        check_engine_contract(factory(Fabricator), examples=20, shrink_seconds=10.0)
    # the fabricated message is added to anything: hypothesis shrinks to a tiny conversation
    assert len(info.value.example) <= 2
    assert "[0]" in str(info.value)


def test_show_messages_bounds_long_strings() -> None:
    shown = show_messages([{"role": "tool", "tool_call_id": "c", "content": "x" * 10_000}])
    assert "chars]" in shown and len(shown) < 400
    assert show_messages([]) == "    (empty)"


def test_rejects_what_is_not_an_engine() -> None:
    with pytest.raises(TypeError):
        check_engine_contract(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        check_engine_contract(lambda: object())  # type: ignore[arg-type,return-value]


def test_reports_when_compaction_never_fires() -> None:
    report = check_engine_contract(lambda: Identity(context_length=10_000_000), examples=5, huge_tokens=500)
    assert report.turn_compactions == 0
    assert any("no compaction fired" in n for n in report.notes)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(conversations())
def test_generated_conversations_are_valid(messages: list[Message]) -> None:
    assert [v for v in validate(messages) if v.severity == "error"] == []


FEATURES: dict[str, Any] = {
    "reused tool-call ids": lambda ms: any(v.code == "reused_tool_call_id" for v in validate(ms)),
    "parallel tool calls": lambda ms: any(len(m.get("tool_calls") or []) >= 2 for m in ms),
    "multimodal user parts": lambda ms: any(m["role"] == "user" and isinstance(m["content"], list) for m in ms),
    "CJK text": lambda ms: any("上下文" in message_text(m) or "你好" in message_text(m) for m in ms),
    "emoji": lambda ms: any("🚀" in message_text(m) or "🙂" in message_text(m) for m in ms),
    "huge tool output": lambda ms: any(m["role"] == "tool" and len(content_text(m["content"])) > 5_000 for m in ms),
    "empty content": lambda ms: any(m.get("content") in ("", None) for m in ms),
    "unknown keys": lambda ms: any("x_trace" in m for m in ms),
    "system prompt": lambda ms: bool(ms) and ms[0]["role"] == "system",
}


def test_generated_conversations_cover_what_real_sessions_hold() -> None:
    seen: set[str] = set()

    @settings(max_examples=150, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(conversations(huge_tokens=4_000))
    def collect(messages: list[Message]) -> None:
        seen.update(name for name, predicate in FEATURES.items() if predicate(messages))

    collect()
    assert sorted(set(FEATURES) - seen) == []


class Nibbler(ContextEngine):
    """Over its threshold it trims a few lines off the largest output, every turn: the
    compaction loop of a giant output in the protected tail."""

    @property
    def name(self) -> str:
        return "nibbler"

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        return (prompt_tokens or 0) >= self.threshold_tokens > 0

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        out = list(messages)
        tools = [i for i, m in enumerate(out) if m.get("role") == "tool" and isinstance(m.get("content"), str)]
        if tools:
            i = max(tools, key=lambda k: len(out[k]["content"]))
            lines = out[i]["content"].splitlines()
            out[i] = {**out[i], "content": "\n".join(lines[: max(1, len(lines) - 5)])}
        return out


def test_the_kit_catches_an_engine_that_compacts_on_every_turn() -> None:
    from ctxengine.testing.contract import _Harness

    harness = _Harness(lambda: Nibbler(context_length=4000))
    with pytest.raises(ContractViolation) as info:
        harness.thrash()
    assert info.value.invariant == 12
    assert "consecutive turns" in str(info.value)


def test_kernel_checks_are_counted() -> None:
    report = check_engine_contract(lambda: Identity(context_length=4000), examples=3)
    assert report.checks[10] > 0 and report.checks[11] > 0 and report.checks[12] == 1
    assert report.max_consecutive_compactions <= 3


def _drawn(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Fingerprints of the conversations the kit generates for one fixed-seed run."""
    from ctxengine.loop import fingerprint
    from ctxengine.testing import contract

    seen: list[str] = []
    run = contract._Harness.run

    def record(self: Any, conv: list[Message]) -> None:
        seen.append(fingerprint(conv))
        run(self, conv)

    with monkeypatch.context() as m:
        m.setattr(contract._Harness, "run", record)
        check_engine_contract(factory(Identity), examples=15, kernel=False, shrink_seconds=1.0)
    return seen


def test_a_fixed_seed_draws_the_same_conversations_whatever_ran_before(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same seed gave other conversations run alone than after other tests: hypothesis
    mixes the literals of every module of the user's code imported so far into what it draws
    (a process-wide pool). Here an "earlier test" imports a module full of new literals."""
    import importlib
    import sys

    fresh = _drawn(monkeypatch)
    literals = "\n".join(f"V{i} = ({i * 7919}, {f'probe-{i}-/src/probe/file_{i}.py'!r}, {i / 3!r})" for i in range(200))
    (tmp_path / "ctxengine_order_probe.py").write_text(literals + "\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module("ctxengine_order_probe")
        warmed = _drawn(monkeypatch)
    finally:
        sys.modules.pop("ctxengine_order_probe", None)
    assert fresh == warmed
