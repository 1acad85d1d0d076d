"""ctxengine inside the real Hermes Agent: its plugin manager, its agent loop, its functions."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def run_in_hermes(python: Path, script: str, home: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (a file path or code) with Hermes' python and ``HERMES_HOME=home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "OPENAI_", "ANTHROPIC_", "OPENROUTER_"))}
    env["HERMES_HOME"] = str(home)
    cmd = [str(python), script, *args] if script.endswith(".py") else [str(python), "-c", script, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(home), check=False)


def _home(tmp_path: Path, config: str) -> Path:
    home = tmp_path / "hermes-home"
    home.mkdir()
    (home / "config.yaml").write_text(textwrap.dedent(config), encoding="utf-8")
    return home


_PROBE = textwrap.dedent(
    """
    import json
    from hermes_cli.plugins import get_plugin_manager, get_plugin_context_engine
    from agent.context_engine import ContextEngine
    from run_agent import AIAgent
    eng = get_plugin_context_engine()
    plugin = [p for p in get_plugin_manager().list_plugins() if p["name"] == "ctxengine"]
    agent = AIAgent(base_url="http://127.0.0.1:9/v1", api_key="k", model="stub-model", provider="custom",
                    quiet_mode=True, enabled_toolsets=["file"], skip_context_files=True, skip_memory=True)
    cc = agent.context_compressor
    print(json.dumps({
        "registered": type(eng).__name__ if eng is not None else None,
        "is_hermes_engine": isinstance(eng, ContextEngine),
        "plugin": plugin[0] if plugin else None,
        "active": type(cc).__module__ + "." + type(cc).__name__,
        "active_is_copy": cc is not eng,
        "context_length": cc.context_length,
        "status": cc.get_status(),
    }, default=str))
    """
)


def _probe(hermes_python: Path, home: Path) -> dict:
    proc = run_in_hermes(hermes_python, _PROBE, home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_hermes_plugin_manager_discovers_and_activates_the_engine(hermes_python: Path, tmp_path: Path) -> None:
    """The README's route: `hermes plugins enable ctxengine` (Hermes' own command), then
    `context.engine: ctxengine` (here with a `ctxengine:` section choosing the engine)."""
    import yaml

    home = tmp_path / "hermes-home"
    home.mkdir()
    enable = run_in_hermes(hermes_python, "import sys; from hermes_cli.main import main; sys.argv = ['hermes', 'plugins', 'enable', 'ctxengine']; main()", home)
    assert enable.returncode == 0, enable.stdout + enable.stderr
    config = yaml.safe_load((home / "config.yaml").read_text(encoding="utf-8"))
    assert "ctxengine" in config["plugins"]["enabled"]
    config["context"] = {**(config.get("context") or {}), "engine": "ctxengine"}
    config["model"] = {**(config.get("model") or {}), "context_length": 100_000}
    config["ctxengine"] = {"engine": "rules", "store": {"path": str(tmp_path / "ctx.db")}}
    (home / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    got = _probe(hermes_python, home)
    assert got["registered"] == "CtxEngineContextEngine" and got["is_hermes_engine"]
    assert got["plugin"]["enabled"] is True and got["plugin"]["source"] == "entrypoint"
    assert got["active"] == "ctxengine.integrations.hermes.engine.CtxEngineContextEngine"
    assert got["active_is_copy"]  # Hermes deep-copies the registered engine for each agent
    assert got["context_length"] == 100_000
    assert got["status"]["engine"] == "ctxengine:rules" and got["status"]["store"] == "SqliteStore"


def test_hermes_never_activates_the_plugin_by_itself(hermes_python: Path, tmp_path: Path) -> None:
    home = _home(tmp_path, """
        plugins: {enabled: [ctxengine]}
        model: {context_length: 100000}
    """)
    got = _probe(hermes_python, home)
    assert got["registered"] == "CtxEngineContextEngine"  # registered, selectable ...
    assert got["active"] == "agent.context_compressor.ContextCompressor"  # ... but not selected


def test_hermes_loads_the_directory_variant(hermes_python: Path, tmp_path: Path) -> None:
    where = run_in_hermes(hermes_python, "from ctxengine.integrations.hermes.install import hermes_plugins_dir; print(hermes_plugins_dir())", tmp_path)
    assert where.returncode == 0, where.stderr
    plugins_dir = Path(where.stdout.strip())
    written = run_in_hermes(hermes_python, str(REPO / "src" / "ctxengine" / "cli" / "main.py"), tmp_path, "hermes", "install-plugin", "--force")
    target = plugins_dir / "context_engine" / "ctxengine"
    try:
        assert written.returncode == 0, written.stderr
        assert (target / "plugin.yaml").is_file()
        home = _home(tmp_path, """
            context: {engine: ctxengine}
            model: {context_length: 100000}
        """)  # no plugins.enabled: the directory route does not need it
        got = _probe(hermes_python, home)
        assert got["registered"] is None
        assert got["active"] == "ctxengine.integrations.hermes.engine.CtxEngineContextEngine"
    finally:
        for f in ("__init__.py", "plugin.yaml"):
            (target / f).unlink(missing_ok=True)
        if target.is_dir():
            import shutil

            shutil.rmtree(target, ignore_errors=True)


@pytest.mark.parametrize(("engine", "grep"), [("compressor", "ctx_grep"), ("lcm", "lcm_grep")])
def test_hermes_agent_loop_compacts_through_ctxengine(hermes_python: Path, tmp_path: Path, engine: str, grep: str) -> None:
    """Hermes' own loop, ten turns of tool calls against StubServer (streamed), a 64K window: it
    passes the threshold, compacts through ctxengine, sends no invalid request, keeps every user
    message, and a last turn gets a compacted fact back through ctxengine's ctx_grep."""
    proc = run_in_hermes(hermes_python, str(HERE / "hermes_agent_loop.py"), tmp_path, str(tmp_path), "10", engine)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["engine_class"] == "CtxEngineContextEngine" and got["status"]["engine"] == f"ctxengine:{engine}"
    assert got["compression_count"] >= 1 and got["compactions_in_store"] == got["compression_count"]
    assert got["invalid"] == []
    assert got["missing_users"] == []
    assert got["requests"] >= 20  # a tool call and an answer per turn
    # ctxengine's recall is in Hermes' tool list, and Hermes dispatches the model's call to it
    assert grep in got["tools"]
    assert got["recall_answer"] is not None and "value_0_7 = compute(7)" in got["recall_answer"]


_COMPAT = textwrap.dedent(
    """
    import copy, json, sys
    from pathlib import Path
    from agent.model_metadata import estimate_messages_tokens_rough as hermes_rough
    from agent.prompt_caching import _apply_cache_marker as hermes_marker
    from ctxengine.tokens import estimate_messages_tokens_rough as ours_rough
    from ctxengine.caching import _apply_cache_marker as ours_marker
    convs = []
    for f in sorted(Path(sys.argv[1]).glob("*.jsonl"))[:3]:
        for line in f.read_text().splitlines()[:20]:
            if line.strip():
                convs.append(json.loads(line)["messages"])
    convs.append([{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 5000}}]}])
    convs.append([{"role": "user", "content": "日本語のテキスト" * 30}])
    rough = [(hermes_rough(c), ours_rough(c)) for c in convs]
    cases = [{"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": "text", "text": "a"}]},
             {"role": "user", "content": ""}, {"role": "assistant", "content": None, "tool_calls": []},
             {"role": "assistant", "content": ""}, {"role": "tool", "tool_call_id": "c", "content": "out"},
             {"role": "tool", "tool_call_id": "c", "content": ""}, {"role": "system", "content": [1]}]
    marks = []
    for native in (False, True):
        for m in cases:
            a, b = copy.deepcopy(m), copy.deepcopy(m)
            hermes_marker(a, {"type": "ephemeral", "ttl": "1h"}, native_anthropic=native)
            ours_marker(b, {"type": "ephemeral", "ttl": "1h"}, native_anthropic=native)
            marks.append([a, b])
    print(json.dumps({"rough": rough, "marks": marks}))
    """
)


def test_seed_names_give_hermes_numbers(hermes_python: Path, tmp_path: Path, data_dir: Path) -> None:
    proc = run_in_hermes(hermes_python, _COMPAT, tmp_path, str(data_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(got["rough"]) >= 3
    assert all(h == o for h, o in got["rough"]), got["rough"]
    assert all(a == b for a, b in got["marks"]), got["marks"]


_SIGNATURE = textwrap.dedent(
    """
    import inspect, json
    from agent.context_compressor import ContextCompressor as Hermes
    from ctxengine.engines.compressor import ContextCompressor as Ours
    params = [p for p in inspect.signature(Hermes.__init__).parameters if p != "self"]
    kwargs = {"model": "anthropic/claude-sonnet-4.5", "threshold_percent": 0.6, "protect_first_n": 3, "protect_last_n": 10,
              "summary_target_ratio": 0.3, "quiet_mode": True, "summary_model_override": None, "base_url": "",
              "api_key": "", "config_context_length": 100000, "provider": "", "api_mode": "",
              "abort_on_summary_failure": False, "max_tokens": None}
    missing = sorted(set(params) - set(kwargs))
    engine = Ours(**kwargs)
    print(json.dumps({"missing": missing, "name": engine.name, "context_length": engine.context_length,
                      "threshold_tokens": engine.threshold_tokens}))
    """
)


def test_context_compressor_accepts_hermes_constructor_keywords(hermes_python: Path, tmp_path: Path) -> None:
    proc = run_in_hermes(hermes_python, _SIGNATURE, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["missing"] == []  # every keyword of Hermes' signature is exercised above
    assert got["name"] == "compressor"
    assert got["context_length"] == 100_000 and got["threshold_tokens"] == 60_000


def test_bench_runs_hermes_compressor_as_a_baseline(hermes_python: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxengine.bench.runner import run_bench
    from ctxengine.io import Session

    monkeypatch.setenv("CTXENGINE_HERMES_PYTHON", str(hermes_python))
    msgs: list[dict] = [{"role": "system", "content": "You are a coding agent."}]
    for i in range(40):
        msgs += [
            {"role": "user", "content": f"user message #{i}: check /src/m{i}.py"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"/src/m{i}.py"})}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"/src/m{i}.py\n" + "value = compute(1)  # filler\n" * 150},
            {"role": "assistant", "content": f"m{i} looks fine."},
        ]
    result = run_bench([Session(id="synthetic", messages=msgs)], ["compressor", "hermes"], context_length=32_000)
    hermes = result.to_dict()["engines"]["hermes"]
    assert hermes["calls"] == result.engines["none"].calls and hermes["compactions"] >= 1
    assert hermes["latency_p50_ms"] > 0
    assert "latency_p50_vs_hermes" in result.to_dict()["engines"]["compressor"]
