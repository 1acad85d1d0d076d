"""The real Hermes Agent (``hermes-agent`` from PyPI) in its own cached venv.

The venv is built by ``scripts/hermes_env.py`` on first use (about 30 s) and reused after.
When it cannot be built (no package index, say) these tests are skipped and the reason is
printed; they are never skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_env_script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("ctxengine_hermes_env_script", REPO / "scripts" / "hermes_env.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def hermes_python() -> Path:
    from ctxengine.bench.hermes_env import HermesEnvUnavailable

    try:
        return Path(_load_env_script().test_venv())
    except HermesEnvUnavailable as exc:
        reason = f"Hermes Agent venv unavailable: {exc}"
        print(reason, file=sys.stderr)
        pytest.skip(reason)
