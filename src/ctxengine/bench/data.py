"""Where the benchmark trajectories are: the one data-folder lookup of ``ctxengine bench``, the
``scripts/bench_*.py`` benchmarks and the test suite.

The published trajectories (τ-bench's airline runs and Multi-SWE-bench's SWE-agent Java runs,
converted to one session per JSON line) are not part of the repository: ``scripts/fetch_data``
downloads them from their published sources into ``data/`` of the checkout. A folder is looked
for, in this order:

1. the folder named by ``$CTXENGINE_DATA`` (when set, the only one looked at);
2. ``data/`` under the base folder (the checkout, or the current directory for the CLI);
3. ``../shared/data`` beside the base folder (the project's own machines keep the files there).

The first that holds ``*.jsonl`` files wins.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "CTXENGINE_DATA"
"""Names a folder of ``*.jsonl`` trajectories."""

FETCH_COMMAND = "scripts/fetch_data"
"""Downloads the published trajectories into ``data/`` (run from a clone of the repository)."""

PUBLISHED_FILES = ("swe_agent_java_multi_swe_bench.jsonl", "tau_bench_airline_gpt4o.jsonl")
"""The files ``scripts/fetch_data`` writes, by name: the figures of the benchmarks and of the
tests that assert them are measured on these."""


def candidate_dirs(base: Path | None = None) -> list[Path]:
    """The folders looked at, in order (see the module's docstring); ``base`` defaults to the
    current directory."""
    named = os.environ.get(ENV_VAR, "").strip()
    if named:
        return [Path(named).expanduser()]
    root = (base or Path.cwd()).resolve()
    return [root / "data", root.parent / "shared" / "data"]


def trajectory_files(folder: Path) -> list[Path]:
    """The ``*.jsonl`` files of ``folder``, sorted by name (none when it is not a folder)."""
    return sorted(folder.glob("*.jsonl")) if folder.is_dir() else []


def find_data_dir(base: Path | None = None) -> Path | None:
    """The first candidate folder that holds trajectories, or None."""
    return next((d for d in candidate_dirs(base) if trajectory_files(d)), None)


def missing_data_message(base: Path | None = None) -> str:
    """What to do when no trajectories were given or found: the flag, the variable, the command."""
    looked = ", ".join(str(d) for d in candidate_dirs(base))
    return (
        f"no trajectories given and none found (looked in {looked}). Pass FILE... or --data DIR, "
        f"or set {ENV_VAR}=DIR to a folder of *.jsonl sessions; to get the published benchmark "
        f"trajectories (tau-bench, Multi-SWE-bench), run {FETCH_COMMAND} in a clone of the "
        "repository: it downloads them into data/ (see README, 'Benchmark data')."
    )
