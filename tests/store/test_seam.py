"""The store seam: one module (ctxengine.storage) names what the rest of ctxengine needs from a
store, and the backends implement all of it."""

from __future__ import annotations

from pathlib import Path

from ctxengine import storage
from ctxengine.engines.kit import nodes
from ctxengine.store import SqliteStore


def test_a_sqlite_store_implements_every_protocol_of_the_seam(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    try:
        for proto in (storage.SessionRecorder, storage.SessionAppender, storage.RecallStore, storage.RecallIndexStore, storage.NodeStore):
            assert isinstance(store, proto), proto.__name__
        assert not isinstance(object(), storage.NodeStore)
    finally:
        store.close()


def test_the_kit_takes_the_node_store_protocol_from_the_seam() -> None:
    assert nodes.NodeStore is storage.NodeStore
