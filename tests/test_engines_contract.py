"""Every built-in engine keeps the engine contract (DESIGN §3.3), checked by the public kit.

Engines are built the way users get them, through the registry, with a small window so that
compaction fires on the generated sessions. An engine that cannot be built fails its test (it
is never skipped); the ``lcm`` engine gets a real SQLite store injected, as ContextManager does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxengine.config import Config
from ctxengine.engine import ContextEngine
from ctxengine.registry import BUILTIN_ENGINES, EngineRegistry
from ctxengine.testing.contract import check_engine_contract

WINDOW = 4_000
"""Small enough that generated sessions (a few turns, outputs up to twice the threshold)
cross every engine's threshold, large enough for a system prompt, a summary and a tail."""


@pytest.fixture
def services(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A real SQLite session store for engines that take one (``store=``)."""
    from ctxengine.store import open_store

    store = open_store(Config.from_dict({"store": {"path": str(tmp_path / "sessions.db")}}).store)
    yield {"store": store}
    close = getattr(store, "close", None)
    if callable(close):
        close()


@pytest.mark.parametrize("name", sorted(BUILTIN_ENGINES))
def test_builtin_engine_keeps_the_contract(name: str, services: dict[str, Any]) -> None:
    registry = EngineRegistry(entry_points=False)

    def make() -> ContextEngine:
        return registry.create(name, Config(), context_length=WINDOW, **services)

    report = check_engine_contract(make, examples=40, shrink_seconds=10.0)
    assert report.engine == name
    assert report.turn_compactions > 0, str(report)
    for invariant in (1, 2, 3, 4, 5, 7):
        assert report.checks[invariant] > 0, (invariant, str(report))
    if report.deterministic:
        assert report.checks[6] > 0 and report.checks[8] > 0, str(report)


@pytest.mark.parametrize("name", sorted(BUILTIN_ENGINES))
def test_whether_a_builtin_engine_calls_a_model(name: str, services: dict[str, Any]) -> None:
    """``calls_model`` is False only while no summarizing model is configured: a host (the
    proxy's event loop) runs such a compaction where a call taking seconds must not run."""
    registry = EngineRegistry(entry_points=False)
    local = registry.create(name, Config(), context_length=WINDOW, **services)
    assert local.calls_model is False
    if name in ("compressor", "lcm"):  # they summarize with the configured model
        cfg = Config.from_dict({"auxiliary": {"compression": {"model": "gpt-4o-mini", "base_url": "http://127.0.0.1:9/v1"}}})
        assert registry.create(name, cfg, context_length=WINDOW, **services).calls_model is True
    assert ContextEngine.calls_model is True  # any other engine (a plugin) is taken to call one
