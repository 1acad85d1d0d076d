"""The proxy command freezes its start-up heap out of the cyclic collector's way."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import anyio
import pytest

from ctxengine.config import Config
from ctxengine.proxy import server
from ctxengine.proxy.app import Proxy


def _frozen_during_lifespan(proxy: Proxy) -> int:
    async def run() -> int:
        async with proxy._lifespan(proxy.app):
            return gc.get_freeze_count()

    before = gc.get_freeze_count()
    try:
        return anyio.run(run) - before
    finally:
        gc.unfreeze()  # give this test process its collector back


def test_a_proxy_with_freeze_gc_freezes_its_heap_at_startup() -> None:
    assert _frozen_during_lifespan(Proxy(Config(), store=None, freeze_gc=True)) > 1000


def test_an_embedded_proxy_leaves_the_collector_alone() -> None:
    assert _frozen_during_lifespan(Proxy(Config(), store=None)) == 0


def test_the_proxy_command_freezes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    made: list[dict[str, Any]] = []

    class Recorded(Proxy):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(kwargs)
            super().__init__(*args, **{**kwargs, "store": None})

    class NoServer:
        def __init__(self, config: Any) -> None:
            pass

        def run(self) -> None:
            pass

    monkeypatch.setattr(server, "Proxy", Recorded)
    monkeypatch.setattr(server.uvicorn, "Server", NoServer)
    server.serve(Config().with_overrides(store={"path": str(tmp_path / "s.db")}))
    assert made and made[0].get("freeze_gc") is True


def test_collector_pauses_are_counted_by_generation() -> None:
    proxy = Proxy(Config(), store=None, freeze_gc=True)

    async def run() -> None:
        async with proxy._lifespan(proxy.app):
            gc.collect()
        assert proxy._gc_timer not in gc.callbacks  # removed at shutdown

    try:
        anyio.run(run)
    finally:
        gc.unfreeze()
    proxy._drain_gc_pauses()
    text = proxy.metrics.render().decode()
    assert 'ctxengine_proxy_gc_pause_seconds_count{generation="2"} 1.0' in text
