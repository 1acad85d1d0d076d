"""scripts/bench_clients.py's own logic: the split of each upstream request into the part no
compaction may change and the rest, and the client's pause across the proxy's restart."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ctxengine.testing.strict_upstream import count_request_tokens

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_clients_script", ROOT / "scripts" / "bench_clients.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[spec.name]
        raise
    return module


TOOLS = [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
DEVELOPER = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are a coding agent. " * 40}]}
PROMPT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "BENCH-TASK: read part01.txt"}]}
OUTPUT = "Chunk ID: 1\nOutput:\n" + "hotel kilo november quebec tango\n" * 60


def _responses_body() -> dict[str, Any]:
    return {
        "model": "gpt-5-codex",
        "tools": TOOLS,
        "input": [
            DEVELOPER,
            PROMPT,
            {"type": "message", "role": "user", "content": "[ctxengine:digest ref=ab: 4 earlier messages folded]\nActions: ..."},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Planning."}], "encrypted_content": "xyz"},
            {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd": "cat part01.txt"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "[ctxengine:cut ref=cd] head\n...\ntail"},
            {"type": "function_call", "call_id": "c2", "name": "exec_command", "arguments": '{"cmd": "cat part02.txt"}'},
            {"type": "function_call_output", "call_id": "c2", "output": OUTPUT},
        ],
    }


def test_a_responses_request_splits_into_its_fixed_part_and_outputs(bench: ModuleType) -> None:
    body = _responses_body()
    parts = bench.request_parts("/v1/responses", body)
    fixed = count_request_tokens({"tools": TOOLS, "input": [DEVELOPER, PROMPT]})
    assert parts == {"tokens": count_request_tokens(body), "fixed": fixed, "whole": 1, "cut": 1}
    assert 0 < parts["fixed"] < parts["tokens"]


def test_a_chat_request_counts_system_and_user_messages_as_fixed_not_records(bench: ModuleType) -> None:
    system = {"role": "system", "content": "You read files."}
    user = {"role": "user", "content": "BENCH-TASK: read part01.txt"}
    digest = {"role": "user", "content": "[ctxengine:digest ref=1: folded]"}
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]}
    result = {"role": "tool", "tool_call_id": "t1", "content": OUTPUT}
    body = {"messages": [system, user, digest, call, result]}
    parts = bench.request_parts("/v1/chat/completions", body)
    assert parts["fixed"] == count_request_tokens({"messages": [system, user]})
    assert (parts["whole"], parts["cut"]) == (1, 0)


def test_an_anthropic_user_turn_carrying_tool_results_is_not_fixed(bench: ModuleType) -> None:
    prompt = {"role": "user", "content": [{"type": "text", "text": "BENCH-TASK: read part01.txt"}]}
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "u1", "name": "Read", "input": {}}]}
    results = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u1", "content": OUTPUT}]}
    body = {"system": "You are Claude.", "messages": [prompt, call, results]}
    parts = bench.request_parts("/v1/messages", body)
    assert parts["fixed"] == count_request_tokens({"system": "You are Claude.", "messages": [prompt]})
    assert (parts["whole"], parts["cut"]) == (1, 0)


def test_only_answered_task_requests_are_read_from_the_log(bench: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "upstream.jsonl"
    task = _responses_body()
    rejected = {"path": "/v1/responses", "status": 400, "body": task}
    other = {"path": "/v1/responses", "status": 200, "body": {"input": "hello"}}
    answered = {"path": "/v1/responses", "status": 200, "body": task}
    log.write_text("\n".join(json.dumps(r) for r in (rejected, other, answered)) + "\nnot json\n")
    assert bench.task_requests(log) == [bench.request_parts("/v1/responses", task)]
    assert bench.task_requests(tmp_path / "missing.jsonl") == []


def test_the_fixed_share_and_the_saving_on_the_rest(bench: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "upstream.jsonl"
    body = _responses_body()
    log.write_text(json.dumps({"path": "/v1/responses", "status": 200, "body": body}) + "\n")
    fixed = bench.request_parts("/v1/responses", body)["fixed"]
    row: dict[str, Any] = {"sent_tokens": 4 * fixed}
    bench._fixed_share(row, log, removed=fixed)
    assert row["fixed_tokens"] == fixed
    assert row["fixed"] == 0.25
    assert row["saved_rest"] == round(1 / 3, 3)
    assert len(row["per_request"]) == 1


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_a_client_without_a_slow_tool_is_paused_until_the_restart_is_over(bench: ModuleType) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        restart = bench.Restarter(2, pause=True)
        restart.proc = proc
        restart.on_step(1)  # not the restart step
        assert not restart.due.is_set() and _state(proc.pid) != "T"
        restart.on_step(2)
        assert restart.due.is_set() and restart.paused
        deadline = time.monotonic() + 5
        while _state(proc.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _state(proc.pid) == "T"  # stopped
        restart.watch(proc, None, {}).join(timeout=5)  # no proxy: nothing to restart, resumed
        deadline = time.monotonic() + 5
        while _state(proc.pid) == "T" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _state(proc.pid) != "T" and not restart.paused
    finally:
        proc.kill()
        proc.wait(timeout=5)


def test_a_client_with_a_slow_tool_is_never_paused(bench: ModuleType) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        restart = bench.Restarter(2)
        restart.proc = proc
        restart.on_step(2)
        assert restart.due.is_set() and not restart.paused
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=5)
