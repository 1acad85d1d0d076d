"""Shared test setup: a temporary home so nothing touches the user's real directories, and the
agent sessions the data tests replay.

The data tests (those using the ``dataset``, ``trajectories``, ``trajectory_files``, ``swe_file``,
``tau_file`` or ``data_dir`` fixtures) run on every dataset found, one test id each:

* ``sample`` — always: what the repository carries, ``tests/data/`` (τ-bench airline
  trajectories, MIT, see ``tests/data/README.md``) and SWE-agent-style sessions written by
  ``scripts/make_sessions.py`` (the recorded SWE-agent runs carry no licence);
* ``full`` — when the published files are found (``$CTXENGINE_DATA``, ``data/`` of the checkout
  as ``scripts/fetch_data`` writes it, or ``../shared/data`` beside it): the same tests on the
  42 recorded trajectories, with the figures the issues quote.

:func:`full_data_dir` is the suite's only way to those files: no test names a data path itself.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ctxengine.bench.data import PUBLISHED_FILES, find_data_dir

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = ROOT / "tests" / "data"
TAU_SAMPLE = SAMPLE_DIR / "tau_bench_airline_gpt4o_sample.jsonl"
SWE_SAMPLE_NAME = "swe_agent_like_synthetic.jsonl"


def full_data_dir() -> Path | None:
    """The folder holding the published trajectory files, or None (then only the sample runs)."""
    found = find_data_dir(ROOT)
    if found is None or not all((found / name).is_file() for name in PUBLISHED_FILES):
        return None
    return found


FULL_DIR = full_data_dir()
DATASETS = ["sample", "full"] if FULL_DIR is not None else ["sample"]
DATA_FIXTURES = frozenset({"trajectories", "trajectory_files", "swe_file", "tau_file", "data_dir", "dataset"})


def pytest_report_header(config: pytest.Config) -> str:
    full = f" + full ({FULL_DIR})" if FULL_DIR is not None else " (no published files found: the full-data runs are not collected)"
    return f"trajectories: sample ({SAMPLE_DIR.relative_to(ROOT)} + scripts/make_sessions.py){full}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that reads agent sessions is marked ``trajectories`` (``-m trajectories``
    selects them: ``.ci/run`` runs them again from a copy with nothing beside it)."""
    for item in items:
        if DATA_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.trajectories)


@pytest.fixture(autouse=True)
def _hermetic_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    for var in ("CTXENGINE_CONFIG", "CTXENGINE_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY", "CTXENGINE_STORE_DSN", "CTXENGINE_DATA"):
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


@dataclass(frozen=True)
class Dataset:
    """One set of agent sessions: ``sample`` (in the repository) or ``full`` (the published files)."""

    name: str
    swe: Path
    tau: Path

    @property
    def full(self) -> bool:
        return self.name == "full"

    @property
    def files(self) -> list[Path]:
        return [self.swe, self.tau]


class Trajectories(list[dict[str, Any]]):
    """The sessions of one dataset, in file order; ``dataset`` tells which (figures tuned to the
    full files are asserted there, the sample's own figures on the sample)."""

    def __init__(self, dataset: Dataset, items: list[dict[str, Any]]) -> None:
        super().__init__(items)
        self.dataset = dataset


def is_swe_agent(t: dict[str, Any]) -> bool:
    """A SWE-agent session: recorded (Multi-SWE-bench) or written by scripts/make_sessions.py."""
    return str(t["id"]).startswith(("msb-", "synthetic-swe/"))


def write_swe_sample(folder: Path) -> Path:
    """The SWE-agent-style sessions of ``scripts/make_sessions.py``, written into ``folder``."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import make_sessions
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    out = folder / SWE_SAMPLE_NAME
    make_sessions.main(["make_sessions", str(out)])
    return out


def read_jsonl(files: list[Path]) -> list[dict[str, Any]]:
    return [json.loads(line) for f in files for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="session", params=DATASETS)
def dataset(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    if request.param == "full":
        assert FULL_DIR is not None
        return Dataset("full", FULL_DIR / PUBLISHED_FILES[0], FULL_DIR / PUBLISHED_FILES[1])
    return Dataset("sample", write_swe_sample(tmp_path_factory.mktemp("sample")), TAU_SAMPLE)


@pytest.fixture(scope="session")
def trajectory_files(dataset: Dataset) -> list[Path]:
    return dataset.files


@pytest.fixture(scope="session")
def swe_file(dataset: Dataset) -> Path:
    return dataset.swe


@pytest.fixture(scope="session")
def tau_file(dataset: Dataset) -> Path:
    return dataset.tau


@pytest.fixture(scope="session")
def data_dir(dataset: Dataset) -> Path:
    """One folder holding the dataset's ``*.jsonl`` files and nothing else."""
    if dataset.full:
        assert FULL_DIR is not None
        return FULL_DIR
    assert dataset.swe.parent != SAMPLE_DIR
    (dataset.swe.parent / TAU_SAMPLE.name).write_bytes(TAU_SAMPLE.read_bytes())
    return dataset.swe.parent


@pytest.fixture(scope="session")
def trajectories(dataset: Dataset) -> Trajectories:
    data = Trajectories(dataset, read_jsonl(dataset.files))
    assert data, dataset
    return data
