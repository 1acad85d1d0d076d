"""The data the repository carries for its tests (tests/data/README.md), and the rule that no
test reaches the large trajectory files except through tests/conftest.py's one resolver."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "tau_bench_airline_gpt4o_sample.jsonl"
SWE_DIGEST = "71ae2519390daf5cd8bba3b2dfa4d115131ec8e93826769e284a7d897d18ed10"
"""sha256 of scripts/make_sessions.py's output: the sample figures the tests assert (compactions,
fact counts) were measured on exactly these sessions; a change of the generator changes this
digest, and its author measures the figures again."""


def _make_sessions() -> Any:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import make_sessions
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return make_sessions


def test_the_generated_sessions_are_the_measured_ones(tmp_path: Path) -> None:
    gen = _make_sessions()
    text = gen.render()
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == SWE_DIGEST
    assert gen.main(["make_sessions", str(tmp_path / "s.jsonl")]) == 0
    assert (tmp_path / "s.jsonl").read_text(encoding="utf-8") == text
    sessions = [json.loads(line) for line in text.splitlines()]
    assert len(sessions) == 6 and all(s["id"].startswith("synthetic-swe/") for s in sessions)


def test_the_tau_sample_is_mit_and_documented() -> None:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    readme = (ROOT / "tests" / "data" / "README.md").read_text(encoding="utf-8")
    assert len(lines) == 4 and SAMPLE.stat().st_size < 200_000
    assert "Copyright (c) 2024 Sierra" in readme and "Permission is hereby granted" in readme
    for line in lines:
        t = json.loads(line)
        assert t["meta"]["repo"] == "sierra-research/tau-bench" and t["meta"]["license"].startswith("MIT")
        assert f"`{t['id']}`" in readme


def test_the_tau_sample_lines_are_the_published_ones(dataset: Any) -> None:
    """On the full files: every line of the sample is a line of the published file, unchanged."""
    published = set(dataset.tau.read_text(encoding="utf-8").splitlines())
    assert set(SAMPLE.read_text(encoding="utf-8").splitlines()) <= published


_DATA_PATH = re.compile(r"""shared["']?\s*/\s*["']?data|/\s*["']shared["']|\.\./shared|/work/shared""")


def test_no_test_reaches_the_trajectory_files_but_through_conftest() -> None:
    """The suite must pass in a plain clone: a test naming ../shared/data (or any data folder)
    itself would fail there, or run only where the folder happens to be. The data tests take
    their sessions from conftest's fixtures instead."""
    offenders = []
    for f in sorted((ROOT / "tests").rglob("*.py")):
        if f == ROOT / "tests" / "conftest.py" or f == Path(__file__):
            continue
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if _DATA_PATH.search(line):
                offenders.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []


def _fetch_data() -> Any:
    from importlib.machinery import SourceFileLoader
    from importlib.util import module_from_spec, spec_from_loader

    loader = SourceFileLoader("ctxengine_fetch_data", str(ROOT / "scripts" / "fetch_data"))
    spec = spec_from_loader(loader.name, loader)
    assert spec is not None
    module = module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_fetch_data_converts_as_the_published_files_were() -> None:
    """scripts/fetch_data cannot download here; its conversion is checked on what the sample
    holds: the τ-bench records it would write equal the sample's lines (messages, statistics), and
    a SWE-agent history becomes assistant turns with one bash call each and their results."""
    fetch = _fetch_data()
    for line in SAMPLE.read_text(encoding="utf-8").splitlines():
        t = json.loads(line)
        messages = [fetch._message(m) for m in t["messages"]]
        assert json.dumps(messages, ensure_ascii=False) == json.dumps(t["messages"], ensure_ascii=False)
        assert fetch.stats(messages) == t["meta"]["stats"]
    traj = {
        "history": [
            {"role": "system", "content": "SETTING: ..."},
            {"role": "user", "content": "demo", "is_demo": True},
            {"role": "user", "content": "ISSUE: x fails"},
            {"role": "assistant", "content": "DISCUSSION\nlook\n```\nls\n```", "thought": "DISCUSSION\nlook\n", "action": "ls\n"},
            {"role": "user", "content": "a.java\n(Open file: n/a)\nbash-$"},
            {"role": "assistant", "content": "", "thought": "", "action": "exit_cost"},
            {"role": "user", "content": "Exited (autosubmitted)"},
        ],
        "info": {"exit_status": "submitted", "model_stats": {"api_calls": 2}, "submission": "diff"},
    }
    run = fetch.swe_agent_run(traj, "m", "org__repo-1", "p.traj", True)
    assert [m["role"] for m in run["messages"]] == ["system", "user", "user", "assistant", "tool"]
    call = run["messages"][3]["tool_calls"][0]
    assert run["messages"][3]["content"] == "DISCUSSION\nlook" and json.loads(call["function"]["arguments"]) == {"command": "ls"}
    assert run["messages"][4]["tool_call_id"] == call["id"] == "call_m_org__repo-1_1"
    assert run["meta"]["dropped_harness_steps"] == ["exit_cost"] and run["meta"]["exit_status"] == "submitted (exit_cost)"
    assert run["meta"]["stats"]["tool_calls"] == 1
