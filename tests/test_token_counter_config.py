"""``context.token_counter`` reaches every built-in engine, however it is built (issue 13.9)."""

from __future__ import annotations

import pytest

from ctxengine.config import Config
from ctxengine.engine import Services
from ctxengine.engines.cacheaware import CacheAwareEngine
from ctxengine.engines.lcm import LcmEngine
from ctxengine.engines.rules import RulesEngine
from ctxengine.manager import ContextManager
from ctxengine.registry import EngineRegistry
from ctxengine.store.sqlite import SqliteStore
from ctxengine.tokens import EstimateCounter, ExactCounter, TokenCounter

ENGINES = ["compressor", "rules", "lcm", "cacheaware"]
EXACT = Config.from_dict({"context": {"token_counter": "exact"}})
# hex digests: the estimate is about a quarter low, o200k counts them exactly
BLOB = "\n".join(f"{i:08x}{'deadbeef' * 7}" for i in range(300))


def _counter(engine: object) -> TokenCounter:
    counter = getattr(engine, "counter", None)
    assert counter is not None, f"{type(engine).__name__} has no counter"
    return counter  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", ENGINES)
def test_the_manager_builds_each_engine_with_the_exact_counter(name: str) -> None:
    cfg = Config.from_dict({"context": {"token_counter": "exact", "engine": name}})
    with ContextManager(cfg, model="gpt-4o", store=SqliteStore(":memory:")) as mgr:
        counter = _counter(mgr.engine())
        assert isinstance(counter, ExactCounter)
        assert counter.count(BLOB) == ExactCounter().count(BLOB) != EstimateCounter().count(BLOB)


@pytest.mark.parametrize("name", ENGINES)
def test_the_registry_passes_the_configured_counter(name: str) -> None:
    engine = EngineRegistry().create(name, EXACT, services=Services(store=SqliteStore(":memory:")))
    assert isinstance(_counter(engine), ExactCounter)
    default = EngineRegistry().create(name, Config(), services=Services(store=SqliteStore(":memory:")))
    assert isinstance(_counter(default), EstimateCounter)


@pytest.mark.parametrize(("name", "cls"), [("rules", RulesEngine), ("cacheaware", CacheAwareEngine), ("lcm", LcmEngine)])
def test_from_config_with_services_uses_the_configured_counter(name: str, cls: type) -> None:
    services = Services(store=SqliteStore(":memory:"), config=EXACT)
    engine = cls.from_config(getattr(EXACT, name), services)  # the section named after the engine
    assert isinstance(_counter(engine), ExactCounter)
    assert services.counter is None  # the caller's services are not mutated


def test_rules_counts_messages_with_the_configured_counter() -> None:
    engine = RulesEngine.from_config(EXACT.compaction, Services(config=EXACT))
    msg = {"role": "tool", "tool_call_id": "c1", "content": BLOB}
    assert engine.tokens_of(msg) == ExactCounter().count_messages([msg])
