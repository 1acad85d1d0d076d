"""Nothing the caller sends is cut unrecorded (issue 39, item 1): ``request()`` given messages
``prepare()`` never returned prepares them first (every original in the store before anything is
cut); ``fit_window(session_id=...)`` records what it cuts; ``ctxengine compact`` and the Hermes
plugin record each session before compacting it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ctxengine.cli.main import cli
from ctxengine.config import Config
from ctxengine.engine import ContextEngine
from ctxengine.integrations.hermes.adapter import HermesAdapter, HermesSettings
from ctxengine.manager import ContextManager
from ctxengine.messages import Message, content_text, validate
from ctxengine.store import open_store
from ctxengine.store.sqlite import SqliteStore
from ctxengine.tokens import ExactCounter

O200K = ExactCounter()
WINDOW = 32_000
LINES = [f"{i:06d} building module m{i} ok checksum={i * 7919 % 100003}" for i in range(16_000)]
BIG = "\n".join(LINES)  # ~750K characters, ~250K tokens: far over the window
MIDDLE = LINES[8000]


class Keeper(ContextEngine):
    """Never compacts: only the window cap cuts."""

    @property
    def name(self) -> str:
        return "keeper"

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        return False

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        return messages


def _opening() -> list[Message]:
    return [{"role": "system", "content": "You are a build agent."}, {"role": "user", "content": "read the build log and tell me what failed"}]


def _tool_turn(content: str = BIG, cid: str = "c1") -> list[Message]:
    call = {"id": cid, "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": "cat build.log"})}}
    return [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": cid, "content": content}]


def _mgr(store: Any, engine: str, **kw: Any) -> ContextManager:
    factory = Keeper if engine == "keeper" else None
    return ContextManager(Config(), model="gpt-4o", context_length=WINDOW, store=store, engine_factory=factory, **kw)


def _grep(mgr: ContextManager, text: str, session: str = "default") -> int:
    answer = json.loads(mgr.handle_tool_call("ctx_grep", {"query": text}, session_id=session))
    return int(answer["count"])


@pytest.mark.parametrize("engine", ["compressor", "keeper"])
def test_request_records_a_tool_output_appended_after_prepare_before_cutting_it(engine: str) -> None:
    store = SqliteStore(":memory:")
    mgr = _mgr(store, engine)
    msgs = mgr.prepare(_opening())
    msgs = [*msgs, *_tool_turn()]  # the easy mistake: the tool result appended after prepare
    req = mgr.request(msgs)
    assert O200K.count_messages(req) <= mgr.window.limit
    assert len(content_text(req[-1]["content"])) < len(BIG)  # it was cut ...
    assert _grep(mgr, MIDDLE) == 1  # ... and its original is in the store, found by recall
    assert mgr.retrievable(BIG)
    assert any(hit.role == "tool" for hit in store.search(MIDDLE, session_id="default"))
    assert validate(req) == []
    # the next turn goes on from what request() sent: no branch, nothing recorded twice
    turns = mgr.counters()["turns"]
    nxt = mgr.prepare([*req, {"role": "assistant", "content": "module m8000 is fine"}, {"role": "user", "content": "and m9000?"}])
    assert nxt[-1]["content"] == "and m9000?" and mgr.counters()["turns"] == turns + 1


def test_request_of_what_prepare_returned_is_not_a_new_turn() -> None:
    store = SqliteStore(":memory:")
    mgr = ContextManager(Config(), model="anthropic/claude-sonnet-4.5", provider="anthropic", context_length=WINDOW, store=store)
    msgs = mgr.prepare([*_opening(), *_tool_turn("all 40 modules built"), {"role": "user", "content": "x " * 3000}])
    req = mgr.request(msgs)
    assert mgr.counters()["turns"] == 1
    mgr.request(req)  # the request itself again (its marked copies): still what prepare returned
    mgr.request(list(json.loads(json.dumps(msgs))))  # decoded again: equal messages
    assert mgr.counters()["turns"] == 1


def test_request_without_any_prepare_records_first() -> None:
    store = SqliteStore(":memory:")
    mgr = _mgr(store, "keeper")
    req = mgr.request([*_opening(), *_tool_turn(), {"role": "user", "content": "well?"}])
    assert O200K.count_messages(req) <= mgr.window.limit
    assert _grep(mgr, MIDDLE) == 1


def test_request_prepares_with_the_tools_and_recall_of_the_last_prepare() -> None:
    tools = [
        {"type": "function", "function": {"name": f"tool_{k}", "description": "d " * 400, "parameters": {"type": "object", "properties": {}}}}
        for k in range(20)
    ]
    mgr = _mgr(SqliteStore(":memory:"), "keeper")
    msgs = mgr.prepare(_opening(), tools, recall=False)
    tool_tokens = mgr.count_tools(tools)
    assert tool_tokens > 5000
    req = mgr.request([*msgs, *_tool_turn()])
    assert O200K.count_messages(req) + tool_tokens <= mgr.window.limit  # the tool definitions were counted
    text = json.dumps(req)
    assert "ctx_grep" not in text and "ctx_expand" not in text  # recall=False held
    assert "kept verbatim in the session store" in text
    assert mgr.retrievable(BIG)


def test_fit_window_with_a_session_records_what_it_cuts() -> None:
    store = SqliteStore(":memory:")
    mgr = _mgr(store, "keeper")
    history = [*_opening(), *_tool_turn(), {"role": "user", "content": "well?"}]
    fitted = mgr.fit_window(history, session_id="failed-turn")
    assert O200K.count_messages(fitted) <= mgr.window.limit
    assert any(hit.role == "tool" for hit in store.search(MIDDLE, session_id="failed-turn"))
    assert "ref=" in content_text(fitted[3]["content"]).split("\n")[0]  # the cut points at its original
    assert "failed-turn" not in mgr.sessions  # no session state made


def test_fit_window_without_a_session_records_nothing_and_claims_nothing() -> None:
    store = SqliteStore(":memory:")
    mgr = _mgr(store, "keeper")
    fitted = mgr.fit_window([*_opening(), *_tool_turn(), {"role": "user", "content": "well?"}])
    assert O200K.count_messages(fitted) <= mgr.window.limit
    assert store.search(MIDDLE) == []
    assert "session store" not in json.dumps(fitted) and "ref=" not in json.dumps(fitted)


def test_compact_on_the_command_line_records_the_session_before_cutting(tmp_path: Path) -> None:
    older_user = "\n".join(f"pasted line {i} of the spec value={i * 13}" for i in range(12_000))
    session = {"id": "cli-session", "messages": [*_opening()[:1], {"role": "user", "content": older_user}, *_tool_turn(), {"role": "user", "content": "now fix it"}]}
    path, out = tmp_path / "in.json", tmp_path / "out.json"
    path.write_text(json.dumps(session), encoding="utf-8")
    res = CliRunner().invoke(cli, ["compact", str(path), "--context-length", "16000", "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    compacted = json.loads(out.read_text(encoding="utf-8"))["messages"]
    text = json.dumps(compacted)
    assert MIDDLE not in text and "pasted line 6000 of" not in text  # both were cut ...
    assert "ctx_grep" not in text and "ctx_expand" not in text  # a file's reader has no recall tools
    for needle in (MIDDLE, "pasted line 6000 of the spec"):  # ... and both are in the store
        found = CliRunner().invoke(cli, ["sessions", "search", needle], catch_exceptions=False)
        assert "cli-session" in found.output, found.output


def test_hermes_records_the_history_before_compacting_it(tmp_path: Path) -> None:
    cfg = Config().with_overrides(store={"backend": "sqlite", "path": str(tmp_path / "ctx.db")})
    a = HermesAdapter(HermesSettings(cfg, "compressor"), store=open_store(cfg.store))
    a.update_model("stub-model", WINDOW)
    a.on_session_start("h1", platform="cli")
    msgs = [*_opening(), *_tool_turn(), {"role": "user", "content": "well?"}]
    out = a.compress(msgs, current_tokens=O200K.count_messages(msgs))
    assert MIDDLE not in json.dumps(out)
    answer = json.loads(a.handle_tool_call("ctx_grep", {"query": MIDDLE}))
    assert answer["count"] == 1


@pytest.mark.parametrize("engine", ["rules", "cacheaware", "compressor"])
def test_an_engines_cut_names_no_recall_tool_the_model_cannot_call(engine: str) -> None:
    mgr = ContextManager(Config().with_overrides(context={"engine": engine}), model="gpt-4o", context_length=16_000, store=SqliteStore(":memory:"))
    out = mgr.prepare([*_opening(), *_tool_turn(), {"role": "user", "content": "well?"}], recall=False)
    head = content_text(out[3]["content"]).split("\n")[0]
    assert head.startswith("[ctxengine:cut ref=") and "kept verbatim in the session store" in head
    assert "ctx_grep" not in json.dumps(out) and "ctx_expand" not in json.dumps(out)
