"""ctxengine inside LiteLLM, tested with the real thing: the LiteLLM proxy from PyPI started as a
process with a config naming ctxengine's hook, in front of the strict upstream; the OpenAI SDK
and the Anthropic SDK (streamed) through it for a multi-turn tool task at a 20K window. And the
LiteLLM SDK with one line, and the hook failing open (``sdk_check.py``, run in the same python).

LiteLLM runs from a python that has it (:func:`ctxengine.bench.litellm_env.litellm_python`: the
venv ``python scripts/litellm_env.py`` builds, which ``.ci/run`` does); without one these tests
are skipped, saying so.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from ctxengine.bench.litellm_env import (
    Deployment,
    LiteLLMEnvUnavailable,
    LiteLLMProxy,
    litellm_config,
    litellm_python,
)
from ctxengine.store.sqlite import SqliteStore
from ctxengine.testing.strict_upstream import StrictUpstream, Task
from ctxengine.testing.strict_upstream.drivers import anthropic_task, openai_task

pytestmark = pytest.mark.litellm

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-litellm-master"
WINDOW = 20_000
STEPS = 8  # 8 files of ~3K tokens: 24K+ of history at a 20K window


@pytest.fixture(scope="module")
def litellm_py() -> Path:
    try:
        return litellm_python(REPO / ".cache" / "litellm-venv", REPO)
    except LiteLLMEnvUnavailable as exc:
        pytest.skip(f"LiteLLM unavailable: {exc}")


def _upstream_bodies(log: Path, path: str) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return [r["body"] for r in records if r.get("path") == path and r.get("status") == 200]


def _originals(store_path: Path, expected: int) -> dict[str, str]:
    """Each stored session's originals as one text, once ``expected`` sessions hold the final
    answer (the last turn is written just after its response)."""
    deadline = time.monotonic() + 10
    while True:
        store = SqliteStore(store_path)
        try:
            texts = {s.id: json.dumps(store.originals(s.id)) for s in store.list_sessions()}
        finally:
            store.close()
        if (len(texts) == expected and all("TASK DONE" in t for t in texts.values())) or time.monotonic() > deadline:
            return texts
        time.sleep(0.2)


def test_openai_and_anthropic_clients_through_the_litellm_proxy(tmp_path: Path, litellm_py: Path) -> None:
    task = Task(tmp_path / "ws", steps=STEPS)
    task.write()
    store_path = tmp_path / "sessions.db"
    (tmp_path / "ctxengine.yaml").write_text(f"store:\n  path: {store_path}\n")
    log = tmp_path / "upstream.jsonl"
    with StrictUpstream(task, window=WINDOW, log_path=log) as up:
        config = tmp_path / "litellm.yaml"
        config.write_text(
            litellm_config(
                [Deployment("agent-model", "openai/agent-model", up.openai_base_url, WINDOW), Deployment("claude-agent", "anthropic/claude-sonnet-4-5", up.anthropic_base_url, WINDOW)],
                master_key=KEY,
            )
        )
        runs = {}
        with LiteLLMProxy(litellm_py, config, tmp_path / "litellm.log", {"CTXENGINE_CONFIG": str(tmp_path / "ctxengine.yaml")}) as proxy:
            up.reset()
            runs["openai"] = (openai_task(proxy.base_url + "/v1", KEY, "agent-model", task), dict(up.stats))
            up.reset()
            runs["anthropic"] = (anthropic_task(proxy.base_url, KEY, "claude-agent", task), dict(up.stats))
            texts = _originals(store_path, 2)
            assert "context management failed" not in proxy.tail(2000), proxy.tail()  # no call failed open
    for name, (sent, stats) in runs.items():
        # the task finished; every request upstream valid and within the window
        assert stats["finished"], (name, stats)
        assert stats["rejected"] == {} and stats["over_window"] == 0, (name, stats)
        assert stats["max_tokens_seen"] <= WINDOW, (name, stats)
        # compaction happened: the client's history outgrew the window, the upstream's did not
        assert max(sent) > WINDOW, (name, sent)
        assert stats["input_tokens"] < 0.8 * sum(sent), (name, stats["input_tokens"], sum(sent))
    for path in ("/v1/chat/completions", "/v1/messages"):
        last = json.dumps(_upstream_bodies(log, path)[-1])
        assert "[ctxengine:" in last, path  # the compacted turns' marker
    last_messages = json.dumps(_upstream_bodies(log, "/v1/messages")[-1])
    assert "cache_control" in last_messages  # a Claude model: breakpoints placed
    # the store holds the originals: one session per conversation, every file whole in each
    assert len(texts) == 2, list(texts)
    for sid, text in texts.items():
        assert text.count("BENCH-TASK") == 1, sid  # one conversation, not two mixed
        for i in range(1, STEPS + 1):
            assert f"MARKER part{i:02d} = {task.code(i)}" in text, (sid, i)


def test_the_sdk_line_and_failing_open(tmp_path: Path, litellm_py: Path) -> None:
    proc = subprocess.run(
        [str(litellm_py), str(Path(__file__).with_name("sdk_check.py")), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(REPO / "src")},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    sdk = out["sdk"]
    # litellm.callbacks = [hook]: the task finished, compacted, valid and within the window
    assert sdk["finished"] and sdk["rejected"] == {} and sdk["over_window"] == 0, sdk
    assert sdk["client_tokens"] > 20_000 >= sdk["max_tokens_seen"], sdk
    assert sdk["failed"] == 0 and len(sdk["sessions"]) == 1 and all(sdk["markers"]), sdk
    # LiteLLM's session id (the request's, or metadata's), a name, else derived: never mixed
    naming = out["naming"]
    assert naming[:3] == ["litellm:conv-a", "litellm:conv-b", "named-c"] and naming[3].startswith("px-") and len(naming) == 4, naming
    assert out["retry"]["seconds"] < 10 and out["retry"]["failed"] == 0, out["retry"]
    # planning broke: the call succeeded, held under the window by the window cap alone; counted
    capped = out["capped"]
    assert out["client_over_tokens"] > 20_000, out
    assert capped["ok"] is True and capped["rejected"] == {} and 0 < capped["max_tokens_seen"] <= 20_000, capped
    assert capped["failed"] == 1 and capped["fail_open_metric"] == 1.0, capped
    # the window cap broke too: the call went upstream as it came (which rejects it: over the window)
    unchanged = out["unchanged"]
    assert unchanged["requests"] == 1 and unchanged["rejected"] == {"over_window": 1}, unchanged
    assert unchanged["failed"] == 1 and unchanged["ok"] == "ContextWindowExceededError", unchanged
    # shadow mode: every call went as it came (the upstream saw the over-window ones) and the
    # request log holds, per call, what ctxengine would have sent
    proc = subprocess.run(
        [str(litellm_py), str(Path(__file__).with_name("sdk_check.py")), str(tmp_path / "shadow"), "shadow"],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(REPO / "src")},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    shadow = json.loads(proc.stdout.strip().splitlines()[-1])["shadow"]
    assert shadow["over_window"] > 0 and shadow["rows"] == shadow["calls"] == shadow["shadow_rows"], shadow
    assert shadow["would_save"] > 0 and shadow["compactions"] > 0, shadow
