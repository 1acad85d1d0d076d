"""Shared test setup: a temporary home so nothing touches the user's real directories."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _hermetic_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    for var in ("CTXENGINE_CONFIG", "CTXENGINE_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY", "CTXENGINE_STORE_DSN"):
        monkeypatch.delenv(var, raising=False)
    yield home


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """The ``ctxengine`` logger as each test found it: a command run in-process (``ctxengine
    proxy`` sends the package's records to its own handler) must not hide later tests' records
    from ``caplog``."""
    logger = logging.getLogger("ctxengine")
    saved = (list(logger.handlers), logger.level, logger.propagate, logger.disabled)
    yield
    logger.handlers[:], logger.level, logger.propagate, logger.disabled = saved


def load_trajectories() -> list[dict[str, Any]]:
    """Every trajectory in ../shared/data (empty when the folder is absent)."""
    out: list[dict[str, Any]] = []
    if not DATA_DIR.is_dir():
        return out
    for f in sorted(DATA_DIR.glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append(json.loads(line))
    return out


@pytest.fixture(scope="session")
def trajectories() -> list[dict[str, Any]]:
    data = load_trajectories()
    if not data:
        pytest.fail(f"the shared trajectories are missing: {DATA_DIR}")
    return data
