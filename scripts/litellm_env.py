#!/usr/bin/env python3
"""Create (or reuse) the venv the LiteLLM tests and benchmark use: ``litellm[proxy]`` from PyPI
plus this checkout of ctxengine installed editable with the ``litellm`` extra.

    python scripts/litellm_env.py            # prints the venv's python; builds it when missing
    python scripts/litellm_env.py --force

The venv lives under ``.cache/litellm-venv/`` (git-ignored), keyed by the Python version and a
hash of ``pyproject.toml``; see :mod:`ctxengine.bench.litellm_env`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from ctxengine.bench.litellm_env import LiteLLMEnvUnavailable, ensure_litellm_venv  # noqa: E402

CACHE = REPO / ".cache" / "litellm-venv"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Create the LiteLLM venv used by the LiteLLM tests and benchmark.")
    parser.add_argument("--force", action="store_true", help="rebuild even when a ready venv exists")
    args = parser.parse_args(argv)
    try:
        print(ensure_litellm_venv(CACHE, REPO, force=args.force))
    except LiteLLMEnvUnavailable as exc:
        print(f"litellm venv unavailable: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
