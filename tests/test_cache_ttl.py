"""cache_ttl: auto, a cold cache, and pacing in the bench (pauses between tasks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ctxengine.bench.compose import compose
from ctxengine.bench.replay import SimClock
from ctxengine.bench.runner import run_bench
from ctxengine.caching import CachePace, caching_status
from ctxengine.cli.main import cli
from ctxengine.config import Config
from ctxengine.cost import AnthropicCache
from ctxengine.engines.cacheaware import CacheAwareEngine, CacheAwareSettings
from ctxengine.errors import ConfigError
from ctxengine.io import Session
from ctxengine.manager import ContextManager
from ctxengine.messages import Message


def test_auto_keeps_5m_while_machine_paced_and_takes_1h_once_pauses_cost_more() -> None:
    pace = CachePace()
    for k in range(50):  # an agent loop: a request every 20 s
        pace.observe(20.0 * k, pace.ttl("auto"))
        pace.wrote(2_000, 40_000)
    assert pace.ttl("auto") == "5m" and pace.ttl("1h") == "1h" and pace.ttl("5m") == "5m"
    now = 20.0 * 50
    for _ in range(3):  # a person pauses 15 minutes, three times: 3 × 40K written again at 1.25×
        now += 900.0
        assert pace.cold(now)
        pace.observe(now, pace.ttl("auto"))
        pace.wrote(40_000, 40_000)
    assert pace.ttl("auto") == "1h"
    # a pause longer than the hour costs the same with either TTL: it never counts
    other = CachePace()
    other.observe(0.0, "5m")
    other.wrote(0, 50_000)
    other.observe(7_200.0, "5m")
    assert other.ttl("auto") == "5m" and not CachePace().cold(1e9)


def test_auto_is_a_valid_setting_and_the_status_says_so() -> None:
    assert Config.from_dict({"prompt_caching": {"cache_ttl": "auto"}}).cache_ttl == "auto"
    with pytest.raises(ConfigError):
        Config.from_dict({"prompt_caching": {"cache_ttl": "2h"}})
    status = caching_status("claude-sonnet-4.5", "anthropic", cache_ttl="auto")
    assert status.enabled and status.auto_ttl and status.cache_ttl == "5m" and "auto TTL" in status.line


def test_the_manager_marks_a_person_paced_session_with_the_hour_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = Config.from_dict({"prompt_caching": {"cache_ttl": "auto"}})
    mgr = ContextManager(cfg, model="claude-sonnet-4.5", provider="anthropic", store=None)
    clock = iter([0.0, 1_000.0, 2_000.0, 3_000.0])
    monkeypatch.setattr("ctxengine.kernel.breakpoints.time.monotonic", lambda: next(clock))
    msgs: list[Message] = [{"role": "system", "content": "s " * 3000}, {"role": "user", "content": "hello " * 2000}]

    def ttls(request: list[Message]) -> set[str]:
        out = set()
        for m in request:
            content = m.get("content")
            for part in content if isinstance(content, list) else []:
                mark = part.get("cache_control") if isinstance(part, dict) else None
                if mark:
                    out.add(mark.get("ttl", "5m"))
        return out

    assert ttls(mgr.request(msgs, session_id="p")) == {"5m"}
    mgr.update_from_response({"prompt_tokens": 9_000, "completion_tokens": 5, "cache_creation_input_tokens": 9_000}, session_id="p")
    mgr.request(msgs, session_id="p")  # 1,000 s later: the prefix was written again
    mgr.update_from_response({"prompt_tokens": 9_000, "completion_tokens": 5, "cache_creation_input_tokens": 0}, session_id="p")
    assert ttls(mgr.request(msgs, session_id="p")) == {"1h"}


def test_a_cold_cache_lets_the_digest_policy_fold_what_waits() -> None:
    now = [0.0]
    engine = CacheAwareEngine(context_length=100_000, settings=CacheAwareSettings(batch=50, batch_tokens=10**6, fold_floor=0.0), clock=lambda: now[0])
    msgs: list[Message] = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix it"}]
    for k in range(6):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": f"cat f{k}"})}}
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": f"c{k}", "content": "line of output\n" * 300}]
    engine.update_from_response({"prompt_tokens": 8_000, "completion_tokens": 10})
    now[0] = 60.0  # warm: no batch is due, nothing happens
    assert not engine.cold() and not engine.should_compress_preflight(msgs)
    assert engine.compress(msgs) == msgs
    now[0] = 1_000.0  # past the 5-minute TTL: the whole prompt is written anyway
    assert engine.cold() and engine.should_compress_preflight(msgs)
    out = engine.compress(msgs)
    assert len(out) < len(msgs) and out[-2:] == msgs[-2:]


def test_the_cost_model_prices_each_request_with_its_own_ttl() -> None:
    sim = AnthropicCache(input_price=1e6, min_cache_tokens=0, ttl="5m")
    msgs: list[Message] = [{"role": "user", "content": "x"}]
    first = sim.call(msgs, [0], tokens=[1000], now=0.0, ttl="1h")
    assert first.write_tokens == 1000 and first.cost == pytest.approx(2000.0)
    later = sim.call(msgs, [0], tokens=[1000], now=1_800.0)  # the hour entry still lives
    assert later.read_tokens == 1000
    with pytest.raises(ValueError, match="ttl"):
        sim.call(msgs, [0], tokens=[1000], ttl="2h")  # type: ignore[arg-type]


def _task(k: int) -> Session:
    msgs: list[Message] = [{"role": "system", "content": "agent " * 400}, {"role": "user", "content": f"task {k}: " + "fix the build " * 200}]
    for j in range(3):
        call = {"id": f"c{j}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": f"ls {j}"})}}
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": f"c{j}", "content": f"file{j}.py\n" * 200}]
    msgs.append({"role": "assistant", "content": f"done with task {k}"})
    return Session(f"t{k}", msgs)


def test_pauses_between_composed_tasks_cost_what_the_ttl_says() -> None:
    long = compose([_task(k) for k in range(4)])
    assert len(long.meta["task_starts"]) == 3
    clock = SimClock(900.0, {id(long.messages[i]) for i in long.meta["task_starts"]})
    clock.advance([long.messages[long.meta["task_starts"][0]]])
    assert clock.t == 920.0 and clock.paused == 1
    costs = {}
    for ttl in ("5m", "1h"):
        cfg = Config.from_dict({"prompt_caching": {"cache_ttl": ttl}})
        paced = run_bench([long], ["none"], config=cfg, context_length=128_000, pause=900.0)
        steady = run_bench([long], ["none"], config=cfg, context_length=128_000)
        assert paced.pause == 900.0 and paced.cache_ttl == ttl
        costs[ttl] = (paced.engines["none"].anthropic_cost, steady.engines["none"].anthropic_cost)
    # pauses past five minutes make the 5m TTL write the prefix again; the hour keeps it
    assert costs["5m"][0] > costs["5m"][1]
    assert costs["1h"][0] == pytest.approx(costs["1h"][1])


def test_cli_bench_takes_a_pause_and_a_ttl(tmp_path: Path) -> None:
    f = tmp_path / "s.jsonl"
    f.write_text("\n".join(json.dumps({"id": s.id, "messages": s.messages}) for s in (_task(0), _task(1))), encoding="utf-8")
    res = CliRunner().invoke(cli, ["bench", str(f), "--compose", "2", "-e", "cacheaware", "--pause", "600", "--cache-ttl", "auto"])
    assert res.exit_code == 0, res.output
    assert "cache TTL auto, 600 s pause between tasks" in res.output and "summary, cheapest first" in res.output
    res = CliRunner().invoke(cli, ["bench", str(f), "--cache-ttl", "2h"])
    assert res.exit_code == 2
