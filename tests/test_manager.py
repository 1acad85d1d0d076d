"""ContextManager: the per-turn loop, hygiene, engine tools, usage, caching, lifecycle, store."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from ctxengine.config import Config
from ctxengine.engine import ContextEngine
from ctxengine.errors import ConfigError, EngineError, InvalidMessages
from ctxengine.manager import HYGIENE_RATIO, ContextManager, default_store
from ctxengine.messages import Message, content_text
from ctxengine.tokens import EstimateCounter


class TinyEngine(ContextEngine):
    """A test engine: compresses on demand by dropping the oldest non-system, non-user messages
    (whole tool groups) until ``keep`` remain after the system prompt."""

    def __init__(self, *, context_length: int = 1000, fire_at: int | None = None, keep: int = 2, reduce: bool = True) -> None:
        super().__init__(context_length=context_length, threshold=0.5)
        self.fire_at = fire_at
        self.keep = keep
        self.reduce = reduce
        self.events: list[tuple[str, Any]] = []
        self.compress_calls = 0

    @property
    def name(self) -> str:
        return "tiny"

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)
        self.events.append(("usage", self.last_prompt_tokens))

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        return self.fire_at is not None and (prompt_tokens or 0) >= self.fire_at

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        self.compress_calls += 1
        if not self.reduce:
            return messages
        head = [m for m in messages[:1] if m.get("role") == "system"]
        users = [m for m in messages if m.get("role") == "user"]
        last_user = users[-1:] if users else []
        return [*head, *last_user]

    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        self.events.append(("start", session_id))

    def on_session_end(self, session_id: str, messages: list[Message]) -> None:
        self.events.append(("end", (session_id, len(messages))))

    def on_session_reset(self) -> None:
        super().on_session_reset()
        self.events.append(("reset", None))


class ToolEngine(TinyEngine):
    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return [{"name": "recall", "description": "get it back", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}]

    def handle_tool_call(self, name: str, args: Mapping[str, Any], **kwargs: Any) -> str:
        return json.dumps({"found": args.get("query"), "session": kwargs.get("session_id")})


class MemoryRecorder:
    """An in-memory SessionRecorder (the protocol's two writes)."""

    def __init__(self) -> None:
        self.histories: list[tuple[str, int]] = []
        self.compactions: list[tuple[str, dict[str, Any], int, int]] = []

    def record_messages(self, session_id: str, messages: Sequence[Message]) -> list[str]:
        self.histories.append((session_id, len(messages)))
        return [str(i) for i in range(len(messages))]

    def record_compaction(self, session_id: str, report: Mapping[str, Any], before: Sequence[Message], after: Sequence[Message]) -> str:
        self.compactions.append((session_id, dict(report), len(before), len(after)))
        return "c1"


def _mgr(engine_factory: Any = None, model: str = "gpt-4o", **kw: Any) -> ContextManager:
    cfg = kw.pop("config", None) or Config()
    return ContextManager(cfg, model=model, context_length=1000, engine_factory=engine_factory or (lambda: TinyEngine()), **kw)


def _history(n_pairs: int, size: int = 10) -> list[Message]:
    msgs: list[Message] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "do it"}]
    for k in range(n_pairs):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"c{k}", "type": "function", "function": {"name": "run", "arguments": "{}"}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": "word " * size})
    return msgs


def test_from_config_builds_the_configured_engine_and_status() -> None:
    cfg = Config.from_dict({"context": {"engine": "cacheaware"}, "model": {"default": "anthropic/claude-sonnet-4.5"}})
    mgr = ContextManager.from_config(cfg, store=None)
    assert mgr.engine().name == "cacheaware"
    assert mgr.context_length == 200_000
    st = mgr.status()
    assert st["caching"] == "Prompt caching: ENABLED (Claude via OpenRouter, 5m TTL)"
    assert st["hygiene_threshold"] == int(200_000 * HYGIENE_RATIO)
    with pytest.raises(ConfigError, match="no model"):
        ContextManager.from_config(Config(), store=None)


def test_from_config_reads_a_yaml_file(tmp_path: Any) -> None:
    p = tmp_path / "config.yaml"
    p.write_text("context:\n  engine: rules\nprompt_caching:\n  cache_ttl: 1h\n", encoding="utf-8")
    mgr = ContextManager.from_config(p, model="claude-sonnet-4.5", store=None)
    assert mgr.engine().name == "rules"
    assert mgr.caching.line == "Prompt caching: ENABLED (Claude via Anthropic, 1h TTL)"


def test_prepare_returns_input_unchanged_below_thresholds_and_never_mutates() -> None:
    mgr = _mgr()
    msgs = _history(2)
    snapshot = copy.deepcopy(msgs)
    out = mgr.prepare(msgs)
    assert out == msgs and msgs == snapshot


def test_invalid_input_raises_listing_every_problem() -> None:
    mgr = _mgr()
    bad = [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "nope", "content": "r"}, {"role": "wizard", "content": "y"}]
    with pytest.raises(InvalidMessages) as err:
        mgr.prepare(bad)
    codes = {v.code for v in err.value.violations}
    assert codes == {"result_without_call", "bad_role"}


def test_pending_tool_calls_of_the_last_assistant_are_accepted() -> None:
    mgr = _mgr()
    msgs = _history(1)
    msgs.append({"role": "assistant", "content": None, "tool_calls": [{"id": "p1", "type": "function", "function": {"name": "run", "arguments": "{}"}}]})
    assert mgr.prepare(msgs) == msgs


def _grow(mgr: ContextManager, start: list[Message], turns: int, size: int) -> list[Message]:
    msgs = start
    for k in range(turns):
        msgs = mgr.prepare(msgs)
        tokens = mgr.count_tokens(msgs)
        mgr.update_from_response({"prompt_tokens": tokens, "completion_tokens": 5})
        msgs = [
            *msgs,
            {"role": "assistant", "content": None, "tool_calls": [{"id": f"g{k}", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"g{k}", "content": "word " * size},
        ]
    return msgs


def test_hygiene_never_fires_below_85_percent() -> None:
    eng = TinyEngine(context_length=1000)
    mgr = _mgr(lambda: eng)
    msgs = _history(1)
    for k in range(40):
        msgs = mgr.prepare(msgs)
        tokens = mgr.count_tokens(msgs)
        assert tokens < 850
        mgr.update_from_response({"prompt_tokens": tokens})
        if tokens < 800:
            msgs = [*msgs, {"role": "assistant", "content": f"note {k}"}, {"role": "user", "content": "go on"}]
    assert mgr.status()["hygiene_fired"] == 0 and eng.compress_calls == 0


def test_hygiene_fires_exactly_once_when_crossing_85_percent() -> None:
    # the engine cannot reduce the context: hygiene must still fire only once while it stays above
    eng = TinyEngine(context_length=1000, reduce=False)
    mgr = _mgr(lambda: eng)
    _grow(mgr, _history(1), turns=30, size=40)
    # the context stays above the hygiene threshold: the window cap, not the engine, holds it
    assert mgr.window.limit >= mgr.status()["last_tokens"] > mgr.hygiene_threshold
    assert mgr.status()["window_cuts"] > 0
    assert mgr.status()["hygiene_fired"] == 1
    assert eng.compress_calls == 1


def test_hygiene_rearms_after_the_session_fell_below_and_compacts() -> None:
    eng = TinyEngine(context_length=1000)
    rec = MemoryRecorder()
    mgr = _mgr(lambda: eng, store=rec)
    _grow(mgr, _history(1), turns=60, size=40)
    fired = mgr.status()["hygiene_fired"]
    assert fired >= 2  # crossed, compacted below, grew, crossed again
    assert eng.compress_calls == fired
    assert [c[1]["trigger"] for c in rec.compactions] == ["hygiene"] * fired


def test_hygiene_needs_four_messages_and_compression_enabled() -> None:
    big = "word " * 800  # with the history: above the hygiene threshold (850), inside the window
    eng = TinyEngine(context_length=1000)
    mgr = _mgr(lambda: eng)
    mgr.prepare([{"role": "system", "content": "s"}, {"role": "user", "content": big}])
    assert mgr.status()["hygiene_fired"] == 0
    off = Config.from_dict({"compression": {"enabled": False}})
    eng2 = TinyEngine(context_length=1000, fire_at=1)
    mgr2 = _mgr(lambda: eng2, config=off)
    msgs = [*_history(2), {"role": "user", "content": big}]
    assert mgr2.prepare(msgs) == msgs
    assert eng2.compress_calls == 0 and mgr2.status()["hygiene_fired"] == 0


def test_engine_trigger_compacts_and_records() -> None:
    rec = MemoryRecorder()
    eng = TinyEngine(context_length=1000, fire_at=100)
    mgr = _mgr(lambda: eng, store=rec, session_id="s1")
    msgs = _history(6, size=20)
    out = mgr.prepare(msgs)
    assert [m["role"] for m in out] == ["system", "user"]
    assert mgr.status()["compactions"] == 1
    sid, report, n_before, n_after = rec.compactions[0]
    assert (sid, n_before, n_after) == ("s1", len(msgs), 2)
    assert report["engine"] == "tiny" and report["trigger"] == "engine"
    assert rec.histories == [("s1", len(msgs))]


class Dropper(TinyEngine):
    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        return [m for m in messages if m.get("role") != "tool"]


class Mutator(TinyEngine):
    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        messages[1]["content"] = "edited"
        return list(messages)


class UserDropper(TinyEngine):
    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        return messages[:1]


@pytest.mark.parametrize(
    ("cls", "rule"),
    [(Dropper, "rule 1 (valid in, valid out)"), (Mutator, "rule 2 (no mutation of the input)"), (UserDropper, "rule 5 (anchors survive)")],
)
def test_broken_engine_output_names_the_rule(cls: type[TinyEngine], rule: str) -> None:
    mgr = _mgr(lambda: cls(context_length=1000, fire_at=1))
    with pytest.raises(EngineError, match=rule.replace("(", r"\(").replace(")", r"\)")):
        mgr.prepare(_history(3))


def test_non_strict_manager_counts_engine_errors() -> None:
    mgr = _mgr(lambda: Dropper(context_length=1000, fire_at=1), strict=False)
    mgr.prepare(_history(3))
    assert mgr.status()["engine_errors"] == 1


def test_engine_tools_are_merged_and_dispatched() -> None:
    mgr = _mgr(lambda: ToolEngine(context_length=1000), session_id="t")
    agent_tools = [{"type": "function", "function": {"name": "run", "parameters": {}}}]
    merged = mgr.tools(agent_tools)
    assert [t["function"]["name"] for t in merged] == ["run", "recall"]
    assert mgr.tools([{"type": "function", "function": {"name": "recall"}}]) == [{"type": "function", "function": {"name": "recall"}}]
    msgs = _history(1)
    msgs.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "r1", "type": "function", "function": {"name": "recall", "arguments": json.dumps({"query": "src/a.py"})}},
                {"id": "x1", "type": "function", "function": {"name": "run", "arguments": "{}"}},
            ],
        }
    )
    msgs.append({"role": "tool", "tool_call_id": "x1", "content": "ran"})
    out = mgr.prepare(msgs, tools=agent_tools)
    assert len(out) == len(msgs) + 1
    assert out[-1]["tool_call_id"] == "r1"
    assert json.loads(out[-1]["content"]) == {"found": "src/a.py", "session": "t"}
    assert mgr.prepare(out) == out  # already answered: not dispatched twice


def test_update_from_response_reads_both_usage_shapes_and_anchors_counts() -> None:
    eng = TinyEngine(context_length=1000)
    mgr = _mgr(lambda: eng)
    msgs = mgr.prepare(_history(1))
    mgr.request(msgs)
    mgr.update_from_response({"prompt_tokens": 500, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 300}})
    assert eng.last_prompt_tokens == 500
    more = [*msgs, {"role": "assistant", "content": "ok"}]
    assert mgr.count_tokens(more) > 500  # anchored on the real 500, plus the new message
    mgr.update_from_response({"input_tokens": 50, "output_tokens": 9, "cache_read_input_tokens": 400, "cache_creation_input_tokens": 100})
    assert eng.last_prompt_tokens == 550
    st = mgr.status()
    assert st["cache_read_tokens"] == 700 and st["cache_write_tokens"] == 100


def test_request_adds_markers_only_for_claude() -> None:
    msgs = _history(3)
    assert _mgr(model="anthropic/claude-sonnet-4.5").placement == "planner"  # the default, by measurement
    seed_cfg = Config.from_dict({"prompt_caching": {"strategy": "system_and_3"}})
    claude = _mgr(model="anthropic/claude-sonnet-4.5", config=seed_cfg)
    req = claude.request(msgs)
    assert req[0]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in msgs[0] and msgs[0]["content"] == "sys"
    gpt = _mgr(model="gpt-4o")
    assert gpt.request(msgs) == msgs
    planner_cfg = Config.from_dict({"prompt_caching": {"strategy": "planner"}})
    planner = _mgr(model="claude-sonnet-4.5", config=planner_cfg)
    assert planner.breakpoints(msgs) == []  # every prefix is below Claude's 1,024-token minimum


def test_lifecycle_hooks_and_many_sessions() -> None:
    engines: list[TinyEngine] = []

    def factory() -> TinyEngine:
        e = TinyEngine(context_length=1000)
        engines.append(e)
        return e

    mgr = _mgr(factory)
    a = mgr.prepare(_history(1), session_id="a")
    mgr.prepare(_history(2), session_id="b")
    assert len(engines) == 2 and mgr.sessions == ["a", "b"]
    assert engines[0].events[0] == ("start", "a") and engines[1].events[0] == ("start", "b")
    mgr.reset_session("a")
    assert ("reset", None) in engines[0].events
    mgr.end_session("a", a)
    assert engines[0].events[-1] == ("end", ("a", len(a)))
    assert mgr.sessions == ["b"]
    with mgr:
        pass
    assert engines[1].events[-1][0] == "end" and mgr.sessions == []


def test_sessions_are_served_in_parallel_threads() -> None:
    engines: dict[str, TinyEngine] = {}
    lock = threading.Lock()

    def factory() -> TinyEngine:
        e = TinyEngine(context_length=100_000)
        with lock:
            engines[str(len(engines))] = e
        return e

    mgr = _mgr(factory)
    errors: list[BaseException] = []

    def worker(sid: str) -> None:
        try:
            msgs = _history(1)
            for _ in range(30):
                msgs = mgr.prepare(msgs, session_id=sid)
                mgr.update_from_response({"prompt_tokens": 10}, session_id=sid)
                msgs = [*msgs, {"role": "assistant", "content": "x"}, {"role": "user", "content": sid}]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"s{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(engines) == 4
    assert all(sum(1 for e in eng.events if e[0] == "usage") == 30 for eng in engines.values())
    assert all(mgr.status(f"s{i}")["turns"] == 30 for i in range(4))


def test_pressure_warnings_are_off_by_default_and_available() -> None:
    mgr = _mgr(lambda: TinyEngine(context_length=1000))
    mgr.prepare(_history(30, size=10))
    assert "pressure_warning" not in mgr.status()
    on = Config.from_dict({"prompt_caching": {"pressure_warnings": True}})
    mgr2 = _mgr(lambda: TinyEngine(context_length=1000), config=on)
    msgs = _history(18, size=10)
    assert 425 <= mgr2.count_tokens(msgs) < 850  # between 85 % of the threshold and hygiene
    mgr2.prepare(msgs)
    assert mgr2.status()["pressure_warning"].startswith("Context is ")
    assert "to compaction threshold" in mgr2.status()["pressure_warning"]


def test_default_store_respects_config() -> None:
    assert default_store(Config.from_dict({"store": {"enabled": False}})) is None
    mgr = ContextManager.from_config(Config.from_dict({"store": {"enabled": False}}), model="gpt-4o")
    assert mgr.store is None


def test_default_store_opens_sqlite(tmp_path: Any) -> None:
    cfg = Config.from_dict({"store": {"path": str(tmp_path / "s.db")}})
    store = default_store(cfg)
    assert store is not None
    ids = store.record_messages("s", _history(1))
    assert len(ids) == 4
    close = getattr(store, "close", None)
    if callable(close):
        close()


def test_store_is_wired_by_default_and_reaches_the_lcm_engine(tmp_path: Any) -> None:
    cfg = Config.from_dict({"context": {"engine": "lcm"}, "store": {"path": str(tmp_path / "sessions.db")}})
    with ContextManager.from_config(cfg, model="claude-sonnet-4.5", session_id="lcm-1") as mgr:
        assert mgr.store is not None
        msgs = _history(3)
        assert mgr.prepare(msgs) == msgs
        st = mgr.status()
        assert st["store"] == type(mgr.store).__name__ and st["store_errors"] == 0
        assert getattr(mgr.engine(), "store", None) is mgr.store


class SummaryRefresher(TinyEngine):
    """Replaces everything but the system prompt and the real latest user message by one new
    marked summary (the way folding engines update their own summaries)."""

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        real = [m for m in messages if m.get("role") == "user" and not content_text(m.get("content")).startswith("[ctxengine:")]
        return [messages[0], real[-1], {"role": "assistant", "content": "[ctxengine:test node=2] folded"}]


def test_an_engine_user_role_summary_is_not_the_latest_user_message() -> None:
    history = [*_history(2), {"role": "user", "content": "[ctxengine:test node=1] earlier turns, folded"}]
    mgr = _mgr(lambda: SummaryRefresher(context_length=1000, fire_at=1))
    out = mgr.prepare(history)
    assert out[1] == {"role": "user", "content": "do it"}
    assert out[-1]["content"].startswith("[ctxengine:test node=2]")


@pytest.mark.parametrize("kind", ["not_a_directory", "not_a_database"])
def test_a_store_that_cannot_be_opened_fails_at_construction_naming_the_path(tmp_path: Any, kind: str) -> None:
    from ctxengine.errors import StoreError

    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory, not a database " * 100)
    path = blocker / "sub" / "s.db" if kind == "not_a_directory" else blocker
    cfg = Config.from_dict({"store": {"path": str(path)}})
    with pytest.raises(StoreError, match=str(path).replace(".", r"\.")):
        ContextManager.from_config(cfg, model="gpt-4o")
    with pytest.raises(StoreError):
        default_store(cfg)
    # turned off, the same config runs without a store
    off = Config.from_dict({"store": {"path": str(path), "enabled": False}})
    assert ContextManager.from_config(off, model="gpt-4o").store is None


class _PlainEstimate(EstimateCounter):
    """The estimate without the session's shared memo (the manager shares it only with the
    plain :class:`EstimateCounter`)."""


def test_the_session_shared_estimate_memo_changes_no_decision() -> None:
    """The engine's counter, the trigger's anchored count and the window counter read the
    estimates the session's history memoises: every turn's output, count and status are those
    of a manager that estimates each message anew."""

    def run(counter: Any) -> list[Any]:
        mgr = ContextManager(Config(), model="gpt-4o", context_length=200_000, store=None, counter=counter)
        msgs: list[Message] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "do it"}]
        seen: list[Any] = []
        for k in range(40):
            msgs = mgr.prepare(msgs)
            seen.append((json.dumps(msgs, sort_keys=True), mgr.count_tokens(msgs)))
            mgr.update_from_response({"prompt_tokens": 900 + 37 * k, "completion_tokens": 5})
            size = 21_000 if k % 9 == 4 else 400 + 150 * (k % 5)  # some outputs reach EXACT_CHARS
            msgs = [
                *msgs,
                {"role": "assistant", "content": f"step {k}", "tool_calls": [{"id": f"g{k}", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": f"g{k}", "content": f"line {k} of output, path /src/f{k}.py\n" * (size // 30)},
            ]
        st = mgr.status()
        seen.append({k: st[k] for k in ("compactions", "turns", "last_tokens", "window_cuts")})
        return seen

    shared = run(None)
    assert shared == run(_PlainEstimate())
    assert shared[-1]["compactions"] > 0


def test_prepare_compact_compacts_now_whatever_the_trigger_says() -> None:
    from ctxengine.config import Config

    # the summarizing path: digests (the default) fold these finished turns on their own
    mgr = ContextManager(Config.from_dict({"compression": {"mode": "summary"}}), model="gpt-4o", store=None)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "fix the build"}]
    for i in range(12):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": f"c{i}", "content": f"output {i}\n" + "a line of output\n" * 200}]
    msgs.append({"role": "user", "content": "compact, please"})
    plain = mgr.prepare(msgs, session_id="s")
    assert plain == msgs and mgr.counters("s")["compactions"] == 0  # far under a 128K window
    out = mgr.prepare(msgs, session_id="s", compact=True)
    assert mgr.counters("s")["compactions"] == 1 and mgr.status("s")["last_compaction"]["trigger"] == "client"
    assert mgr.count_tokens(out) < mgr.count_tokens(msgs) and out[-1] == msgs[-1]
