"""One per-session cache of per-message token counts (``ctxengine.tokens.MessageTokens``):
the kernel keeps it in the session's history and hands it to the session's engine; an engine
built alone makes a private one; no engine keeps a memo of its own."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import ctxengine.tokens as tokens_module
from ctxengine.config import Config
from ctxengine.engine import Services
from ctxengine.engines.cacheaware import CacheAwareEngine
from ctxengine.engines.compressor import ContextCompressor
from ctxengine.engines.lcm import LcmEngine
from ctxengine.engines.rules import RulesEngine
from ctxengine.history import SessionHistory
from ctxengine.manager import ContextManager
from ctxengine.messages import Message
from ctxengine.store.sqlite import SqliteStore
from ctxengine.tokens import EstimateCounter, ExactCounter, MessageTokens, estimate_message_tokens

ENGINES = ["compressor", "rules", "lcm", "cacheaware"]


class Tally:
    """A counter that counts with the estimate and remembers each message it counted."""

    name = "tally"
    per_message = True

    def __init__(self) -> None:
        self.seen: list[int] = []

    def count(self, text: str) -> int:
        return EstimateCounter().count(text)

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        self.seen.extend(id(m) for m in messages)
        return sum(estimate_message_tokens(m) for m in messages)


class Framed(Tally):
    """A counter whose count of a list is not the sum of its messages' (a fixed frame per list)."""

    name = "framed"
    per_message = False

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return super().count_messages(messages) + 3


def _tool(k: int, size: int = 300) -> Message:
    return {"role": "tool", "tool_call_id": f"c{k}", "content": f"line {k} of /src/app/m{k}.py\n" * size}


def _session(turns: int) -> list[Message]:
    msgs: list[Message] = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "fix the build"}]
    for k in range(turns):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "read_file", "arguments": f'{{"path": "/src/app/m{k}.py"}}'}}
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call]}, _tool(k)]
    return msgs


def test_each_message_is_counted_once_and_as_the_counter_counts_it() -> None:
    tally = Tally()
    cache = MessageTokens(tally)
    msgs = _session(5)
    assert cache.counts(msgs) == [estimate_message_tokens(m) for m in msgs]
    assert cache.count_messages(msgs) == EstimateCounter().count_messages(msgs)
    assert [cache.message(m) for m in msgs] == cache.counts(msgs)
    assert sorted(tally.seen) == sorted(id(m) for m in msgs)  # each message once
    twin = copy.deepcopy(msgs[3])  # an equal message is another message: counted anew
    assert twin not in cache and msgs[3] in cache
    assert cache.message(twin) == cache.message(msgs[3])
    assert len(tally.seen) == len(msgs) + 1
    assert cache.name == "tally" and cache.count("abc def") == EstimateCounter().count("abc def")


def test_a_counter_that_does_not_sum_messages_counts_lists_itself() -> None:
    cache = MessageTokens(Framed())
    msgs = _session(2)
    assert cache.count_messages(msgs) == Framed().count_messages(msgs) == sum(estimate_message_tokens(m) for m in msgs) + 3
    assert cache.message(msgs[0]) == estimate_message_tokens(msgs[0]) + 3  # one message: its own list


def test_of_hands_back_a_session_cache_and_makes_a_private_one_for_a_counter() -> None:
    shared = MessageTokens(ExactCounter())
    assert MessageTokens.of(shared) is shared
    own = MessageTokens.of(None)
    assert isinstance(own.counter, EstimateCounter) and len(own) == 0
    exact = ExactCounter()
    assert MessageTokens.of(exact).counter is exact


def test_the_memo_is_bounded_and_a_deep_copy_starts_empty() -> None:
    cache = MessageTokens(limit=10)
    msgs = [{"role": "user", "content": f"m{k}"} for k in range(25)]
    for m in msgs:
        cache.message(m)
    assert len(cache) <= 11
    assert cache.counts(msgs) == [estimate_message_tokens(m) for m in msgs]  # answers stay right
    assert len(cache) <= len(msgs)
    clone = copy.deepcopy(cache)
    assert len(clone) == 0 and clone.counts(msgs[:3]) == cache.counts(msgs[:3])
    cache.prune(msgs[:2])
    assert len(cache) == 2 and msgs[0] in cache and msgs[5] not in cache


def test_the_session_history_owns_the_estimates_and_one_cache_per_other_counter() -> None:
    h = SessionHistory()
    assert h.tokens.for_counter(EstimateCounter()) is h.tokens.estimates
    exact = ExactCounter()
    other = h.tokens.for_counter(exact)
    assert other is not h.tokens.estimates and other.counter is exact
    assert h.tokens.for_counter(exact) is other  # kept for the session


@pytest.mark.parametrize("name", ENGINES)
def test_the_manager_hands_each_engine_its_sessions_estimates(name: str) -> None:
    cfg = Config.from_dict({"context": {"engine": name}})
    with ContextManager(cfg, model="gpt-4o", context_length=32_000, store=SqliteStore(":memory:")) as mgr:
        mgr.prepare(_session(3), session_id="a")
        mgr.prepare(_session(2), session_id="b")
        a, b = mgr.engine("a"), mgr.engine("b")
        tokens_a = a.tokens  # type: ignore[attr-defined]
        assert tokens_a is mgr._session("a").history.tokens.estimates
        assert tokens_a is not b.tokens  # type: ignore[attr-defined]  # never shared between sessions
        assert isinstance(a.counter, EstimateCounter)  # type: ignore[attr-defined]  # the counter stays the configured one


@pytest.mark.parametrize("name", ENGINES)
def test_with_the_exact_counter_the_engine_reads_the_sessions_exact_counts(name: str) -> None:
    cfg = Config.from_dict({"context": {"engine": name, "token_counter": "exact"}})
    with ContextManager(cfg, model="gpt-4o", context_length=32_000, store=SqliteStore(":memory:")) as mgr:
        mgr.prepare(_session(2), session_id="s")
        engine = mgr.engine("s")
        tokens = engine.tokens  # type: ignore[attr-defined]
        assert isinstance(tokens.counter, ExactCounter) and tokens.counter is engine.counter  # type: ignore[attr-defined]
        history = mgr._session("s").history
        assert tokens is history.tokens.for_counter(engine.counter)  # type: ignore[attr-defined]
        # the kernel's own count for decisions (anchored, the configured counter) read it too
        assert all(m in tokens for m in history.working)


@pytest.mark.parametrize("build", [
    lambda: ContextCompressor(context_length=32_000, quiet_mode=True),
    lambda: CacheAwareEngine(context_length=32_000),
    lambda: RulesEngine(context_length=32_000),
    lambda: LcmEngine(store=SqliteStore(":memory:"), context_length=32_000),
])
def test_an_engine_built_alone_counts_into_a_private_cache(build: Any) -> None:
    one, two = build(), build()
    assert isinstance(one.tokens, MessageTokens) and one.tokens is not two.tokens
    assert isinstance(one.counter, EstimateCounter) and one.tokens.counter is one.counter


def test_from_config_reads_services_tokens_and_keeps_the_configured_counter() -> None:
    cache = MessageTokens(ExactCounter())
    services = Services(context_length=32_000, store=SqliteStore(":memory:"), counter=cache.counter, tokens=cache)
    for cls in (ContextCompressor, CacheAwareEngine, RulesEngine, LcmEngine):
        engine: Any = cls.from_config(None, services)
        assert engine.tokens is cache and engine.counter is cache.counter
    digests = ContextCompressor.from_config(None, services)._digests  # the compressor's digest mode
    assert digests is not None and digests.tokens is cache


def test_a_turn_counts_each_new_message_once_for_the_kernel_and_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    counted: list[int] = []

    def counting(m: Mapping[str, Any]) -> int:
        counted.append(id(m))
        return estimate_message_tokens(m)

    monkeypatch.setattr(tokens_module, "estimate_message_tokens", counting)
    cfg = Config.from_dict({"context": {"engine": "compressor"}, "compressor": {"mode": "summary"}})
    with ContextManager(cfg, model="gpt-4o", context_length=128_000) as mgr:
        msgs = _session(3)
        out = mgr.prepare(list(msgs), session_id="s")
        mgr.update_from_response({"prompt_tokens": 9_000, "completion_tokens": 10}, session_id="s")
        before = len(counted)
        new = [{"role": "assistant", "content": "reading more"}, {"role": "user", "content": "go on"}]
        mgr.prepare([*out, *new], session_id="s")
        # the trigger's anchored count, the engine's preflight scan and the planner read one memo
        assert sorted(counted[before:]) == sorted(id(m) for m in mgr._session("s").history.working[-2:])
