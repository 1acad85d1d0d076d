"""``ctxengine compact``, ``count`` and ``engines`` through click's runner (real files, no mocks)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ctxengine.cli.cmd_compact import PROGRESS_MIN_SESSIONS, _context_length
from ctxengine.cli.main import cli
from ctxengine.config import Config
from ctxengine.messages import validate
from ctxengine.tokens import estimate_messages_tokens

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "coding_session.json"


def run(*args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def example() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    return data


def test_the_bundled_example_is_what_the_generator_writes(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import make_example
    finally:
        sys.path.pop(0)
    out = tmp_path / "session.json"
    assert make_example.main(["make_example", str(out)]) == 0
    assert out.read_bytes() == EXAMPLE.read_bytes()
    data = example()
    msgs = data["messages"]
    assert len(msgs) >= 80 and 30_000 <= estimate_messages_tokens(msgs) <= 40_000
    assert [v for v in validate(msgs) if v.severity == "error"] == []
    assert sum(1 for m in msgs if m["role"] == "user") == 2
    assert any(len(m.get("tool_calls") or []) > 1 for m in msgs)  # parallel calls


def test_compact_example_keeps_the_object_shape_and_prints_a_table(tmp_path: Path) -> None:
    out = tmp_path / "compacted.json"
    res = run("compact", str(EXAMPLE), "--engine", "rules", "--context-length", "32000", "-o", str(out))
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text(encoding="utf-8"))
    src = example()
    assert data["id"] == src["id"] and data["tools"] == src["tools"] and data["meta"] == src["meta"]
    assert estimate_messages_tokens(data["messages"]) < 0.5 * estimate_messages_tokens(src["messages"])
    table = res.stderr.splitlines()
    assert table[0].split() == ["session", "messages", "tokens", "after", "reduction", "engine", "ms"]
    assert src["id"] in table[1] and "rules" in table[1] and "%" in table[1]


def test_compact_writes_to_stdout_and_reads_stdin() -> None:
    msgs = example()["messages"]
    res = run("compact", "-", "--engine", "rules", "--context-length", "32000", input=json.dumps(msgs))
    assert res.exit_code == 0
    out = json.loads(res.stdout)
    assert isinstance(out, list)  # a list stays a list
    assert len(out) <= len(msgs) and out[0] == msgs[0]


def test_compact_jsonl_stays_jsonl_with_a_progress_bar(tmp_path: Path) -> None:
    src = example()
    records = [{**src, "id": f"s{k}", "extra": k} for k in range(PROGRESS_MIN_SESSIONS)]
    f = tmp_path / "many.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    res = run("compact", str(f), "--engine", "rules", "--context-length", "32000")
    assert res.exit_code == 0
    lines = res.stdout.strip().splitlines()
    assert len(lines) == PROGRESS_MIN_SESSIONS
    back = [json.loads(x) for x in lines]
    assert [b["id"] for b in back] == [r["id"] for r in records] and back[2]["extra"] == 2
    assert "compacting" in res.stderr and "total" in res.stderr


def test_model_sets_the_window(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("models:\n  tiny-model:\n    context_length: 20000\n", encoding="utf-8")
    assert _context_length(Config(), None, "gpt-4o") == 128_000
    assert _context_length(Config(), 5000, "gpt-4o") == 5000
    assert _context_length(Config.from_dict({"model": {"default": "claude-sonnet-4.5"}}), None, None) == 200_000
    res = run("compact", str(EXAMPLE), "--engine", "rules", "--config", str(cfg), "--model", "tiny-model")
    assert res.exit_code == 0
    assert estimate_messages_tokens(json.loads(res.stdout)["messages"]) < 20_000


def test_count_reports_estimated_and_exact_tokens() -> None:
    res = run("count", str(EXAMPLE))
    assert res.exit_code == 0
    header, row = res.stdout.strip().splitlines()
    assert header.split() == ["session", "messages", "estimated", "exact"]
    cells = row.split()
    est = estimate_messages_tokens(example()["messages"])
    assert cells[1] == str(len(example()["messages"])) and cells[2] == f"{est:,}"
    exact = int(cells[3].replace(",", ""))
    assert abs(exact - est) / exact < 0.25
    assert run("count", "--no-exact", str(EXAMPLE)).stdout.strip().splitlines()[1].split()[3] == "n/a"


def test_engines_lists_sources_and_the_default(tmp_path: Path) -> None:
    res = run("engines")
    assert res.exit_code == 0
    rows = {line.split()[0]: line.split()[1:] for line in res.stdout.strip().splitlines()[1:]}
    assert rows["rules"][0] == "built-in" and rows["compressor"][-1] == "*"
    cfg = tmp_path / "config.yaml"
    cfg.write_text("context:\n  engine: rules\n", encoding="utf-8")
    rows = {line.split()[0]: line.split()[1:] for line in run("engines", "--config", str(cfg)).stdout.strip().splitlines()[1:]}
    assert rows["rules"][-1] == "*" and rows["compressor"] == ["built-in"]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "no such file"),
        ("{not json", "not valid JSON"),
        ('{"foo": 1}', "no 'messages' key"),
        ('[{"role": "tool", "tool_call_id": "x", "content": "orphan"}]', "result_without_call"),
    ],
)
def test_bad_files_exit_2_with_one_line(tmp_path: Path, content: str | None, needle: str) -> None:
    f = tmp_path / "in.json"
    if content is not None:
        f.write_text(content, encoding="utf-8")
    res = run("compact", str(f), "--engine", "rules")
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctxengine: error:") and needle in lines[0]


def test_unknown_engine_and_bad_config_exit_2(tmp_path: Path) -> None:
    res = run("compact", str(EXAMPLE), "--engine", "nosuch")
    assert res.exit_code == 2 and "unknown context engine 'nosuch'" in res.stderr and "rules" in res.stderr
    cfg = tmp_path / "config.yaml"
    cfg.write_text("compaction:\n  trigger_treshold: 0.5\n", encoding="utf-8")
    res = run("compact", str(EXAMPLE), "--engine", "rules", "--config", str(cfg))
    assert res.exit_code == 2 and "compaction.trigger_treshold" in res.stderr
    res = run("count", str(tmp_path / "missing.json"))
    assert res.exit_code == 2 and "no such file" in res.stderr


BROKEN_ENGINE = '''
from ctxengine.engine import ContextEngine


class DropsResults(ContextEngine):
    """A plugin that breaks the contract: it drops every tool result."""

    @property
    def name(self):
        return "dropper"

    def update_from_response(self, usage):
        self._record_usage(usage)

    def should_compress(self, prompt_tokens=None):
        return True

    def compress(self, messages, current_tokens=None, focus_topic=None):
        return [m for m in messages if m.get("role") != "tool"]
'''


def test_an_engine_returning_an_invalid_chat_is_an_engine_error(tmp_path: Path) -> None:
    plugin = tmp_path / "plugins" / "context_engine" / "dropper"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text(BROKEN_ENGINE, encoding="utf-8")
    (plugin / "plugin.yaml").write_text("name: dropper\n", encoding="utf-8")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"plugins:\n  dirs: [{json.dumps(str(tmp_path / 'plugins'))}]\n  entry_points: false\n", encoding="utf-8")
    res = run("compact", str(EXAMPLE), "--engine", "dropper", "--config", str(cfg))
    assert res.exit_code == 2
    assert "engine 'dropper'" in res.stderr and "broke rule 1 (valid in, valid out)" in res.stderr and "(session example-" in res.stderr


@pytest.mark.parametrize("engine", ["compressor", "lcm", "cacheaware"])
def test_every_builtin_engine_compacts_the_example(engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The quick start's job with each built-in engine; lcm keeps its originals in the store."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "compacted.json"
    res = run("compact", str(EXAMPLE), "--engine", engine, "--context-length", "32000", "-o", str(out))
    assert res.exit_code == 0, res.output
    msgs = json.loads(out.read_text(encoding="utf-8"))["messages"]
    assert [v for v in validate(msgs) if v.severity == "error"] == []
    assert estimate_messages_tokens(msgs) < estimate_messages_tokens(example()["messages"])
    users = [m for m in example()["messages"] if m["role"] == "user"]
    assert users[-1] in msgs  # the latest user message is kept verbatim
    if engine == "lcm":
        listed = run("sessions", "list")
        assert example()["id"] in listed.output
