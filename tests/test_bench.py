"""``ctxengine bench``: composing sessions, baselines, the loop, reports and the CLI."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ctxengine.bench.baselines import MASK_PLACEHOLDER, MaskingBaseline, NoCompaction
from ctxengine.bench.compose import compose, compose_sessions
from ctxengine.bench.report import cost_and_facts, format_table, ranked, write_chart, write_json
from ctxengine.bench.runner import engine_retrievable, run_bench
from ctxengine.cli.main import cli
from ctxengine.engine import ContextEngine
from ctxengine.errors import InputError
from ctxengine.io import Session, read_sessions
from ctxengine.messages import Message, tool_calls, validate


def _sessions(path: Path, n: int) -> list[Session]:
    return read_sessions(path)[:n]


def test_compose_keeps_one_system_prompt_unique_ids_and_task_starts() -> None:
    first = Session("a", [{"role": "system", "content": "S"}, {"role": "user", "content": "task a"}, {"role": "assistant", "content": None, "tool_calls": [{"id": "x", "type": "function", "function": {"name": "t", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "x", "content": "r"}])
    second = Session("b", copy.deepcopy(first.messages))
    second.messages[1]["content"] = "task b"
    snapshot = copy.deepcopy(second.messages)
    s = compose([first, second])
    roles = [m["role"] for m in s.messages]
    assert roles == ["system", "user", "assistant", "tool", "user", "assistant", "tool"]
    assert s.messages[4]["content"] == "task b"
    ids = [c["id"] for m in s.messages for c in tool_calls(m)]
    assert len(ids) == len(set(ids)) == 2
    assert s.messages[6]["tool_call_id"] == ids[1]
    assert second.messages == snapshot  # inputs untouched
    assert not [v for v in validate(s.messages) if v.severity == "error"]


def test_compose_sessions_groups_real_trajectories(swe_file: Path) -> None:
    sessions = read_sessions(swe_file)
    composed = compose_sessions(sessions, 5)
    assert len(composed) == -(-len(sessions) // 5) >= 2  # 30 sessions -> 6 on the full file
    for c in composed:
        assert sum(1 for m in c.messages if m["role"] == "system") == 1
        ids = [x["id"] for m in c.messages for x in tool_calls(m)]
        assert len(ids) == len(set(ids))
        assert not [v for v in validate(c.messages) if v.severity == "error"]
    assert compose_sessions(sessions, 1) == sessions
    with pytest.raises(ValueError):
        compose_sessions(sessions, 0)


def test_mask10_masks_outputs_older_than_the_last_ten() -> None:
    msgs: list[Message] = [{"role": "user", "content": "go"}]
    for k in range(14):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"c{k}", "type": "function", "function": {"name": "t", "arguments": "{}"}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": f"output {k}"})
    eng = MaskingBaseline(context_length=1000)
    out = eng.compress(msgs)
    tools = [m for m in out if m["role"] == "tool"]
    assert [m["content"] == MASK_PLACEHOLDER for m in tools] == [True] * 4 + [False] * 10
    assert msgs[2]["content"] == "output 0"  # not mutated
    assert eng.compress(out) == out  # nothing new to mask
    assert NoCompaction().compress(msgs) == msgs and not NoCompaction().should_compress(10**9)


class _Recall(NoCompaction):
    def retrievable(self, text: str) -> bool:
        return text == "kept"


class _Grep(NoCompaction):
    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return [{"name": "lcm_grep", "parameters": {}}]

    def handle_tool_call(self, name: str, args: Any, **kwargs: Any) -> str:
        return json.dumps({"hits": ["line with src/x.py in it"]})


def test_engine_retrievable_hooks() -> None:
    hook = engine_retrievable(_Recall())
    assert hook is not None and hook("kept") and not hook("lost")
    grep = engine_retrievable(_Grep())
    assert grep is not None and grep("src/x.py") and not grep("src/y.py")
    assert engine_retrievable(NoCompaction()) is None


def test_run_bench_on_real_trajectories_reports_every_measure(tmp_path: Path, swe_file: Path, tau_file: Path) -> None:
    sessions = _sessions(tau_file, 2) + _sessions(swe_file, 2)
    result = run_bench(sessions, ["mask10", "cacheaware"], context_length=128_000)
    assert list(result.engines) == ["none", "mask10", "cacheaware"]
    none = result.engines["none"]
    assert none.calls == sum(sum(1 for m in s.messages if m["role"] == "assistant") for s in sessions)
    assert none.compactions == 0 and none.retention() == 1.0
    assert 0 < none.anthropic_cost < none.anthropic_no_cache
    assert 0 < none.openai_cost < none.openai_no_cache
    mask = result.engines["mask10"]
    # masked outputs leave the context but not the store: the kernel's recall gives them back
    assert mask.compactions > 0 and mask.retention("paths") == 1.0
    # rolling masking rewrites the cached prefix every call: dearer than no compaction
    assert mask.anthropic_cost > none.anthropic_cost
    ca = result.engines["cacheaware"]
    assert ca.invalid_requests == 0 and ca.over_window == 0 and ca.retention() == 1.0
    table = format_table(result)
    assert "cacheaware" in table and "×none" in table
    out = tmp_path / "r.json"
    write_json(result, out)
    data = json.loads(out.read_text())
    assert data["engines"]["none"]["anthropic_vs_none"] == 1.0
    assert {"latency_p50_ms", "latency_p95_ms", "peak_tokens", "retention_by_kind", "over_window"} <= set(data["engines"]["cacheaware"])
    assert len(data["runs"]) == 3 * len(sessions)
    html_path = tmp_path / "c.html"
    write_chart(result, html_path)
    page = html_path.read_text()
    assert "<svg" in page and "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    png = tmp_path / "c.png"
    write_chart(result, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(InputError, match=r"\.png or \.html"):
        write_chart(result, tmp_path / "c.gif")


def test_cli_bench(tmp_path: Path, tau_file: Path) -> None:
    out = tmp_path / "b.json"
    res = CliRunner().invoke(cli, ["bench", str(tau_file), "-e", "cacheaware", "--limit", "2", "--placement", "planner", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "cacheaware" in res.output and "placement planner" in res.output
    assert set(json.loads(out.read_text())["engines"]) == {"none", "cacheaware"}
    bad = CliRunner().invoke(cli, ["bench", str(tau_file), "-e", "nosuchengine", "--limit", "1"])
    assert bad.exit_code == 2 and "nosuchengine" in bad.output


class _Invalid(NoCompaction):
    @property
    def name(self) -> str:
        return "invalid"

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        return True

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        return [m for m in messages if m.get("role") != "tool"]


def test_invalid_requests_are_counted_not_fatal(tau_file: Path) -> None:
    from ctxengine.bench.runner import _profile, run_session
    from ctxengine.config import Config

    session = _sessions(tau_file, 1)[0]
    engine: ContextEngine = _Invalid()
    run = run_session(
        session, "invalid", lambda: engine, config=Config(), context_length=128_000,
        anthropic_model=_profile("claude-sonnet-4.5"), openai_model=_profile("gpt-4o"),
    )
    assert run.invalid_requests > 0 and run.invalid_details


def test_compacting_turns_are_timed_whole(swe_file: Path) -> None:
    """Each compacting call is timed as the agent waits for it (prepare + request), so never
    less than the engine's own compress on that call; the session store is a SQLite file."""
    from ctxengine.bench.runner import _profile, make_engine_factory, run_session
    from ctxengine.config import Config

    session = _sessions(swe_file, 1)[0]
    run = run_session(
        session, "compressor", make_engine_factory("compressor", Config(), 16_000), config=Config(), context_length=16_000,
        anthropic_model=_profile("claude-sonnet-4.5"), openai_model=_profile("gpt-4o"), placement="planner",
    )
    assert run.compactions > 0
    assert len(run.latencies_ms) == len(run.engine_ms) == run.compactions
    assert all(turn >= engine > 0 for turn, engine in zip(run.latencies_ms, run.engine_ms, strict=True))
    assert run.to_dict()["engine_p50_ms"] <= run.to_dict()["latency_p50_ms"]


def test_a_registered_engine_runs_as_a_users_manager_builds_it(swe_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench replays a registered engine as a user gets it: built by the session's manager,
    its originals and nodes in the session's store (the one recall reads), its counts the
    history's; a baseline comes from its factory."""
    from ctxengine.bench import session as bench_session
    from ctxengine.bench.runner import RegisteredEngine, _profile, make_engine_factory, run_session
    from ctxengine.config import Config

    seen: list[tuple[Any, Any]] = []
    original = bench_session.ContextManager.prepare

    def spy(self: Any, messages: Any, *args: Any, **kwargs: Any) -> Any:
        engine = self.engine(kwargs.get("session_id"))
        policy = getattr(engine, "_digests", None) or engine
        seen.append((getattr(getattr(policy, "originals", None), "store", None), self.store))
        return original(self, messages, *args, **kwargs)

    monkeypatch.setattr(bench_session.ContextManager, "prepare", spy)
    factory = make_engine_factory("compressor", Config(), 16_000)
    assert isinstance(factory, RegisteredEngine) and factory().name == "compressor"
    session = _sessions(swe_file, 1)[0]
    run = run_session(
        session, "compressor", factory, config=Config(), context_length=16_000,
        anthropic_model=_profile("claude-sonnet-4.5"), openai_model=_profile("gpt-4o"), placement="planner",
    )
    assert run.compactions > 0 and seen
    assert all(engine_store is not None and engine_store is manager_store for engine_store, manager_store in seen)


@pytest.mark.slow
def test_long_sessions_figure(dataset: Any) -> None:
    """The issue's figure: --compose 5 on the SWE-agent file at 128K, cacheaware + planner. The
    sample's sessions are shorter: at 64K its composed sessions overflow the window as the full
    file's do at 128K, and the same figure holds."""
    composed = compose_sessions(read_sessions(dataset.swe), 5)
    result = run_bench(composed, ["cacheaware"], context_length=128_000 if dataset.full else 64_000, placement="planner")
    ca = result.engines["cacheaware"]
    none = result.engines["none"]
    assert none.over_window > 0  # the window binds without compaction
    assert ca.over_window == 0 and ca.invalid_requests == 0
    assert ca.min_session_retention == 1.0
    assert ca.anthropic_cost <= 0.55 * none.anthropic_cost


def test_cli_rejects_bad_options_with_one_line(tau_file: Path) -> None:
    res = CliRunner().invoke(cli, ["bench", str(tau_file), "--compose", "0"])
    assert res.exit_code == 2 and "--compose" in res.output
    res = CliRunner().invoke(cli, ["bench", str(tau_file), "--model", "no-such-model", "--limit", "1"])
    assert res.exit_code == 2 and "no input price" in res.output


def test_the_default_configuration_runs_beside_the_baselines_with_a_summary_line(tmp_path: Path, tau_file: Path) -> None:
    sessions = _sessions(tau_file, 2)
    result = run_bench(sessions, ["default", "mask10", "compressor"], context_length=16_000, placement="system_and_3")
    assert list(result.engines) == ["none", "default", "mask10", "compressor"]
    assert result.label("default") == "default (compressor, planner)"
    default, compressor = result.engines["default"], result.engines["compressor"]
    assert default.calls == compressor.calls > 0
    assert all(r.engine == "default" for r in default.runs)
    table = format_table(result)
    summary = table.splitlines()[-1]
    assert summary.startswith("summary, cheapest first: ")
    for name in ("default (compressor, planner)", "mask10", "compressor"):
        assert name in summary
    t, none = result.engines["mask10"], result.engines["none"]
    ratio, openai = t.anthropic_cost / none.anthropic_cost, t.openai_cost / none.openai_cost
    rank = ranked(result).index("mask10") + 1
    assert f"{rank}. mask10 {ratio:.2f}× none (OpenAI {openai:.2f}×), {t.invalid_requests} invalid, {t.over_window} over-window, {100 * t.retention():.1f}% facts" in summary
    # ranked by cost: each configuration's position in the line follows its cost
    order = ranked(result)
    costs = [result.engines[n].anthropic_cost for n in order]
    assert costs == sorted(costs) and "none" not in order
    positions = [summary.index(f"{k}. {result.label(n)} ") for k, n in enumerate(order, 1)]
    assert positions == sorted(positions)
    page = tmp_path / "c.html"
    write_chart(result, page)
    text = page.read_text()
    assert "default (compressor, planner)" in text and "against facts kept" in text
    # one point per configuration, the no-compaction baseline at 1.00×
    assert text.count("<circle") == len(result.engines)
    assert next((a, round(b, 6), c) for a, b, c in cost_and_facts(result) if a == "none") == ("none", 1.0, 1.0)
    # the same configuration under two names runs once
    same = run_bench(sessions[:1], ["default", "compressor"], context_length=16_000, placement="planner")
    assert same.engines["default"].anthropic_cost == same.engines["compressor"].anthropic_cost


def test_cli_bench_with_no_data_names_the_flag_the_variable_and_the_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no data folder here nor beside it
    res = CliRunner().invoke(cli, ["bench", "-e", "mask10"])
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    for needle in ("--data DIR", "CTXENGINE_DATA", "scripts/fetch_data", str(tmp_path / "data")):
        assert needle in text, needle
    missing = CliRunner().invoke(cli, ["bench", "nosuch.jsonl"])
    assert missing.exit_code == 2 and "nosuch.jsonl: no such file" in missing.output and "scripts/fetch_data" in missing.output
    (tmp_path / "empty").mkdir()
    empty = CliRunner().invoke(cli, ["bench", "--data", "empty"])
    assert empty.exit_code == 2 and "no *.jsonl trajectories" in empty.output
    monkeypatch.setenv("CTXENGINE_DATA", str(tmp_path / "empty"))
    named = CliRunner().invoke(cli, ["bench"])
    assert named.exit_code == 2 and f"looked in {tmp_path / 'empty'})" in " ".join(named.output.split())


def test_cli_bench_finds_the_data_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tau_file: Path) -> None:
    folder = tmp_path / "trajectories"
    folder.mkdir()
    (folder / "tau.jsonl").write_text("\n".join(tau_file.read_text(encoding="utf-8").splitlines()[:1]) + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    by_flag = CliRunner().invoke(cli, ["bench", "--data", str(folder), "-e", "mask10"])
    assert by_flag.exit_code == 0, by_flag.output
    assert "mask10" in by_flag.output
    monkeypatch.setenv("CTXENGINE_DATA", str(folder))
    by_env = CliRunner().invoke(cli, ["bench", "-e", "mask10"])
    assert by_env.exit_code == 0, by_env.output
    assert f"replaying the trajectories of {folder}" in by_env.output
    monkeypatch.delenv("CTXENGINE_DATA")
    (tmp_path / "data").symlink_to(folder)
    by_default = CliRunner().invoke(cli, ["bench", "-e", "mask10"])
    assert by_default.exit_code == 0 and f"replaying the trajectories of {tmp_path / 'data'}" in by_default.output
