"""The Hermes plugin's behaviour without Hermes installed (the real Hermes runs in tests/hermes)."""

from __future__ import annotations

import copy
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ctxengine.caching import _apply_cache_marker
from ctxengine.config import Config
from ctxengine.engine import ContextEngine
from ctxengine.errors import ConfigError
from ctxengine.integrations.hermes.adapter import (
    HermesAdapter,
    HermesSettings,
    settings_from_hermes_config,
)
from ctxengine.messages import validate
from ctxengine.store import open_store
from ctxengine.tokens import estimate_messages_tokens, estimate_messages_tokens_rough


def _conversation(turns: int, out_chars: int = 6000) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"user message #{i}: check /src/m{i}.py"})
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"/src/m{i}.py"})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"/src/m{i}.py\n" + ("x = 1  # filler line\n" * (out_chars // 20))})
        msgs.append({"role": "assistant", "content": f"m{i} looks fine."})
    return msgs


def _adapter(tmp_path: Path, engine: str = "compressor", **store_kw: Any) -> HermesAdapter:
    cfg = Config().with_overrides(store={"backend": "sqlite", "path": str(tmp_path / "ctx.db")})
    a = HermesAdapter(HermesSettings(cfg, engine), store=open_store(cfg.store))
    a.update_model("stub-model", 32_000)
    a.on_session_start("s1", platform="cli")
    return a


def _compactions(tmp_path: Path) -> int:
    con = sqlite3.connect(str(tmp_path / "ctx.db"))
    try:
        return int(con.execute("select count(*) from compactions").fetchone()[0])
    finally:
        con.close()


def test_compress_commits_only_when_the_host_uses_the_result(tmp_path: Path) -> None:
    a = _adapter(tmp_path)
    msgs = _conversation(12)
    assert a.should_compress(estimate_messages_tokens(msgs))
    before = copy.deepcopy(msgs)
    out = a.compress(msgs, current_tokens=estimate_messages_tokens(msgs))
    assert msgs == before  # the host's list is untouched
    # the cache-aware compressor may cut old outputs rather than fold turns: fewer tokens either way
    assert estimate_messages_tokens(out) < estimate_messages_tokens(msgs) and not [v for v in validate(out) if v.severity == "error"]
    assert all(m["content"] in json.dumps(out) for m in msgs if m["role"] == "user")
    # not yet used: the live engine is as it was
    assert a.compression_count == 0 and a.engine.compression_count == 0
    a.on_session_start("s1-child", boundary_reason="compression", old_session_id="s1")
    assert a.compression_count == 1 and a.engine.compression_count == 1
    assert a.session_id == "s1"  # the same ctxengine session continues across Hermes' rotation
    assert _compactions(tmp_path) == 1


def test_a_result_the_host_dropped_leaves_the_engine_as_it_was(tmp_path: Path) -> None:
    a = _adapter(tmp_path)
    msgs = _conversation(12)
    live = a.engine
    a.compress(msgs, current_tokens=estimate_messages_tokens(msgs))  # e.g. the host timed out
    grown = [*msgs, {"role": "user", "content": "user message #99"}]
    out = a.compress(grown, current_tokens=estimate_messages_tokens(grown))
    assert a.engine is live and a.compression_count == 0  # the first result was never adopted
    carried = [{**m, "_db_persisted": True} for m in out]  # the host's own bookkeeping keys
    a.on_turn_complete([*carried, {"role": "assistant", "content": "ok"}])
    assert a.compression_count == 1 and a.engine is not live


def test_an_invalid_result_is_never_returned(tmp_path: Path) -> None:
    a = _adapter(tmp_path)
    msgs = _conversation(12)

    class Broken(ContextEngine):
        name = "broken"  # type: ignore[assignment]

        def update_from_response(self, usage: Any) -> None: ...

        def should_compress(self, prompt_tokens: int | None = None) -> bool:
            return True

        def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None, focus_topic: str | None = None) -> list[dict[str, Any]]:
            return [m for m in messages if m.get("role") != "tool"]  # orphans every call

    a._inner = Broken(context_length=32_000)
    out = a.compress(msgs)
    assert out is msgs and a.compactions_rejected == 1 and a.get_status()["compactions_rejected"] == 1


class _Returns(ContextEngine):
    """An engine whose compress returns what ``make`` builds from its input."""

    name = "returns"  # type: ignore[assignment]

    def __init__(self, make: Any) -> None:
        super().__init__(context_length=32_000)
        self.make = make

    def update_from_response(self, usage: Any) -> None: ...

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        return True

    def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None, focus_topic: str | None = None) -> list[dict[str, Any]]:
        return list(self.make(messages))


def test_a_result_without_the_system_prompt_first_is_rejected_as_the_kernel_rejects_it(tmp_path: Path) -> None:
    a = _adapter(tmp_path)
    msgs = _conversation(3)
    a._inner = _Returns(lambda ms: ms[1:])  # valid chat, but the system prompt is gone
    out = a.compress(msgs)
    assert out is msgs and a.compactions_rejected == 1


def test_a_valid_result_over_the_window_is_held_to_the_window_cap(tmp_path: Path) -> None:
    a = _adapter(tmp_path)
    msgs = _conversation(12, out_chars=20_000)  # about 60K tokens of outputs in a 32K window
    a._inner = _Returns(lambda ms: [*ms, {"role": "assistant", "content": "noted."}])
    out = a.compress(msgs)
    limit = a._cap.limit if a._cap is not None else 0
    assert 0 < limit < 32_000 and a._cap is not None
    assert sum(a._cap.counter.exact_messages(out)) <= limit < sum(a._cap.counter.exact_messages(msgs))
    assert not [v for v in validate(out) if v.severity == "error"] and out[0]["role"] == "system"
    assert out[-2]["content"] == msgs[-1]["content"] and "[ctxengine:" in json.dumps(out)


def test_deepcopy_gives_a_fresh_engine_sharing_the_store(tmp_path: Path) -> None:
    a = _adapter(tmp_path)
    a.update_from_response({"prompt_tokens": 20_000, "completion_tokens": 10})
    twin = copy.deepcopy(a)
    assert twin.store is a.store and twin.context_length == 32_000
    assert twin.last_prompt_tokens == 0 and twin._inner is None


def test_status_and_should_compress_with_the_hosts_negative_sentinel(tmp_path: Path) -> None:
    a = _adapter(tmp_path)
    a.last_prompt_tokens = -1  # Hermes: "compression just ran, awaiting real usage"
    assert a.get_status()["last_prompt_tokens"] == 0 and a.get_status()["usage_percent"] == 0
    assert a.should_compress() is False
    a.engine.last_prompt_tokens = -1
    assert a.engine.get_status()["last_prompt_tokens"] == 0


def test_lifecycle_reset_and_model_switch(tmp_path: Path) -> None:
    a = _adapter(tmp_path)
    a.update_model("bigger", 200_000)
    # the default compressor folds digests at cacheaware.fold_ratio (55 %) of the new window
    assert a.context_length == 200_000 and a.threshold_tokens == a.engine.threshold_tokens == 110_000
    a.update_from_response({"prompt_tokens": 500, "completion_tokens": 5})
    a.on_session_reset()
    assert a.last_prompt_tokens == 0 and a.engine.last_prompt_tokens == 0


def test_lcm_tools_reach_hermes_as_bare_schemas_and_answer(tmp_path: Path) -> None:
    a = _adapter(tmp_path, "lcm")
    names = {t["name"] for t in a.get_tool_schemas()}
    assert {"lcm_grep", "lcm_expand"} <= names
    assert all("type" not in t or t["type"] != "function" for t in a.get_tool_schemas())
    answer = json.loads(a.handle_tool_call("lcm_grep", {"query": "nothing-here"}))
    assert isinstance(answer, dict)


def test_settings_from_the_hermes_config_section(tmp_path: Path) -> None:
    s = settings_from_hermes_config({"ctxengine": {"engine": "rules", "compression": {"threshold": 0.6}}})
    assert s.engine_name == "rules" and s.config.compression.threshold == 0.6
    assert settings_from_hermes_config(None).engine_name == "compressor"
    with pytest.raises(ConfigError, match="unknown key"):
        settings_from_hermes_config({"ctxengine": {"bogus": 1}})
    with pytest.raises(ConfigError, match="not the plugin itself"):
        settings_from_hermes_config({"ctxengine": {"engine": "ctxengine"}})
    with pytest.raises(ConfigError, match="must be a mapping"):
        settings_from_hermes_config({"ctxengine": ["compressor"]})


def test_install_plugin_writes_the_directory_variant(tmp_path: Path) -> None:
    from ctxengine.cli.main import cli

    res = CliRunner().invoke(cli, ["hermes", "install-plugin", str(tmp_path / "plugins")])
    assert res.exit_code == 0, res.output
    d = tmp_path / "plugins" / "context_engine" / "ctxengine"
    assert "from ctxengine.integrations.hermes.plugin import register" in (d / "__init__.py").read_text()
    assert "name: ctxengine" in (d / "plugin.yaml").read_text()
    (tmp_path / "other" / "context_engine" / "ctxengine").mkdir(parents=True)
    (tmp_path / "other" / "context_engine" / "ctxengine" / "__init__.py").write_text("# someone else's\n")
    res = CliRunner().invoke(cli, ["hermes", "install-plugin", str(tmp_path / "other")])
    assert res.exit_code == 2 and "not written by ctxengine" in res.output


def test_rough_estimate_is_chars_over_four_plus_images() -> None:
    msg = {"role": "user", "content": "abcd" * 10}
    assert estimate_messages_tokens_rough([msg]) == (len(str(msg)) + 3) // 4
    img = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:" + "A" * 100_000}}]}
    assert estimate_messages_tokens_rough([img]) == (len(str({"role": "user", "content": [{"type": "image_url", "image": "[stripped]"}]})) + 3) // 4 + 1500
    cjk = {"role": "user", "content": "日本語のテキスト" * 50}
    assert estimate_messages_tokens_rough([cjk]) < estimate_messages_tokens([cjk])  # why decisions use the other


@pytest.mark.parametrize("native", [False, True])
def test_cache_marker_helper_on_every_kind_of_message(native: bool) -> None:
    marker = {"type": "ephemeral"}
    s = {"role": "user", "content": "hi"}
    _apply_cache_marker(s, marker, native_anthropic=native)
    assert s["content"] == [{"type": "text", "text": "hi", "cache_control": marker}]
    lst = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    _apply_cache_marker(lst, marker, native_anthropic=native)
    assert "cache_control" not in lst["content"][0] and lst["content"][1]["cache_control"] == marker
    empty_user = {"role": "user", "content": ""}
    _apply_cache_marker(empty_user, marker, native_anthropic=native)
    assert empty_user["cache_control"] == marker
    empty_asst = {"role": "assistant", "content": None, "tool_calls": []}
    _apply_cache_marker(empty_asst, marker, native_anthropic=native)
    assert ("cache_control" in empty_asst) is native
    tool = {"role": "tool", "tool_call_id": "c", "content": "out"}
    _apply_cache_marker(tool, marker, native_anthropic=native)
    if native:
        assert tool["cache_control"] == marker and tool["content"] == "out"
    else:
        assert "cache_control" not in tool and tool["content"][0]["cache_control"] == marker


def test_compress_on_a_pooled_thread_whose_result_times_out(tmp_path: Path) -> None:
    """Hermes' newer host: compress runs on a worker thread, on a deep copy, under a timeout;
    a result that arrives too late is not used, and the engine behaves as if it never ran."""
    from concurrent.futures import ThreadPoolExecutor

    a = _adapter(tmp_path)
    msgs = _conversation(12)
    with ThreadPoolExecutor(max_workers=1) as pool:
        late = pool.submit(a.compress, copy.deepcopy(msgs), estimate_messages_tokens(msgs)).result(timeout=60)
    assert estimate_messages_tokens(late) < estimate_messages_tokens(msgs)
    # the host gave up and went on with its own list, then compacts again later
    grown = [*msgs, {"role": "user", "content": "user message #12"}, {"role": "assistant", "content": "ok"}]
    with ThreadPoolExecutor(max_workers=1) as pool:
        used = pool.submit(a.compress, copy.deepcopy(grown), estimate_messages_tokens(grown)).result(timeout=60)
    assert a.compression_count == 0  # neither result adopted yet
    a.on_session_start("s1", boundary_reason="compression", old_session_id="s1")
    assert a.compression_count == 1 and a.engine.compression_count == 1
    assert "user message #12" in json.dumps(used)


def test_an_unknown_window_keeps_the_current_one(tmp_path: Path) -> None:
    a = _adapter(tmp_path)
    a.update_model("unknown-model", 0)
    assert a.context_length == 32_000 and a.threshold_tokens > 0


def test_hermes_baseline_without_hermes_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from ctxengine.bench.baselines import HermesBaseline, _HermesWorker
    from ctxengine.errors import EngineError

    monkeypatch.setenv("CTXENGINE_HERMES_PYTHON", sys.executable)  # a python without Hermes
    monkeypatch.setattr(_HermesWorker, "_shared", None)
    with pytest.raises(EngineError, match="is hermes-agent importable"):
        HermesBaseline(context_length=32_000)
    monkeypatch.setattr(_HermesWorker, "_shared", None)
    monkeypatch.setenv("CTXENGINE_HERMES_PYTHON", str(tmp_path / "missing" / "python"))
    from ctxengine.cli.main import cli

    session = tmp_path / "s.jsonl"
    session.write_text(json.dumps({"id": "s", "messages": _conversation(3)}) + "\n", encoding="utf-8")
    res = CliRunner().invoke(cli, ["bench", str(session), "-e", "hermes"])
    assert res.exit_code == 2 and "CTXENGINE_HERMES_PYTHON" in res.output


def test_a_dropped_result_leaves_no_trace_in_the_live_engine(tmp_path: Path) -> None:
    a = _adapter(tmp_path)
    msgs = _conversation(12)
    live = a.engine
    a.should_compress_preflight(msgs)
    a.update_from_response({"prompt_tokens": 30_000, "completion_tokens": 10})  # anchors the count
    before = {k: (copy.copy(vars(v)) if hasattr(v, "__dict__") else v) for k, v in vars(live).items() if k != "last_report"}
    a.compress(msgs, current_tokens=estimate_messages_tokens(msgs))
    a.compress([*msgs, {"role": "user", "content": "another"}])  # the first result was dropped
    a._pending = None  # and so was the second
    after = {k: (copy.copy(vars(v)) if hasattr(v, "__dict__") else v) for k, v in vars(live).items() if k != "last_report"}
    assert after == before
