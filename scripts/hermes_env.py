#!/usr/bin/env python3
"""Create (or reuse) the venv the Hermes tests use: ``hermes-agent`` from PyPI plus this
checkout of ctxengine installed editable with the ``hermes`` extra.

    python scripts/hermes_env.py            # prints the venv's python; builds it when missing
    python scripts/hermes_env.py --version 0.19.0 --force

The venv lives under ``.cache/hermes-venv/`` (git-ignored), keyed by the Hermes version, the
Python version and a hash of ``pyproject.toml``; see :mod:`ctxengine.bench.hermes_env`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ctxengine.bench.hermes_env import HermesEnvUnavailable, ensure_hermes_venv

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "hermes-venv"


def test_venv(version: str | None = None, *, force: bool = False) -> Path:
    """The python of the tests' Hermes venv (raises HermesEnvUnavailable with the reason)."""
    return ensure_hermes_venv(version, cache_dir=CACHE, ctxengine_source=REPO, force=force)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Create the Hermes Agent venv used by the Hermes tests.")
    parser.add_argument("--version", default=None, help="hermes-agent version from PyPI (default: the pinned one)")
    parser.add_argument("--force", action="store_true", help="rebuild even when a ready venv exists")
    args = parser.parse_args(argv)
    try:
        print(test_venv(args.version, force=args.force))
    except HermesEnvUnavailable as exc:
        print(f"hermes venv unavailable: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
