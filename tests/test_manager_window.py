"""The window holds what the provider counts: tool definitions in the cap, hygiene and the
engine's trigger; windows set at run time; recall answers sized to the room left."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from ctxengine.config import Config
from ctxengine.engine import ContextEngine
from ctxengine.errors import ConfigError, ContextWindowError
from ctxengine.manager import CompactionDue, ContextManager
from ctxengine.messages import Message
from ctxengine.recall import EXPAND_TOOL, GREP_TOOL
from ctxengine.store.sqlite import SqliteStore
from ctxengine.tokens import MESSAGE_OVERHEAD_TOKENS, ExactCounter
from ctxengine.window import TOOLS_OVERHEAD_TOKENS, WindowCounter

EXACT = ExactCounter()


class Quiet(ContextEngine):
    """Compacts only when the manager's count reaches ``fire_at``; keeps system and user messages."""

    def __init__(self, *, context_length: int = 20_000, fire_at: int | None = None) -> None:
        super().__init__(context_length=context_length, threshold=0.5)
        self.fire_at = fire_at
        self.seen: list[int] = []
        self.compressed = 0
        self.models: list[tuple[str, int]] = []

    @property
    def name(self) -> str:
        return "quiet"

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        self.seen.append(int(prompt_tokens or 0))
        return self.fire_at is not None and (prompt_tokens or 0) >= self.fire_at

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        self.compressed += 1
        return [m for m in messages if m.get("role") in ("system", "user")]

    def update_model(self, model: str, context_length: int, **kwargs: Any) -> None:
        super().update_model(model, context_length, **kwargs)
        self.models.append((model, context_length))


def _tools(n: int = 42, words: int = 60) -> list[dict[str, Any]]:
    """A LangGraph-sized tool list: ``n`` tools with long descriptions and six parameters each."""
    vocab = ["read", "the", "file", "at", "the", "given", "path", "and", "return", "its", "lines", "with", "numbers", "optional", "offset", "limit", "pattern"]
    out = []
    for i in range(n):
        desc = " ".join(vocab[(i + k) % len(vocab)] for k in range(words))
        props = {f"arg_{j}": {"type": "string", "description": f"{desc[:120]} ({j})"} for j in range(6)}
        out.append({"type": "function", "function": {"name": f"tool_{i}", "description": desc, "parameters": {"type": "object", "properties": props, "required": ["arg_0"]}}})
    return out


def _tool_tokens(tools: list[dict[str, Any]]) -> int:
    return EXACT.count(json.dumps(tools, ensure_ascii=False, separators=(",", ":"))) + TOOLS_OVERHEAD_TOKENS


def _session(pairs: int, size: int) -> list[Message]:
    msgs: list[Message] = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "fix the failing test"}]
    for k in range(pairs):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"c{k}", "type": "function", "function": {"name": "tool_1", "arguments": "{}"}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": "\n".join(f"line {k}.{j}: value {j * 7919 % 1000}" for j in range(size))})
    return msgs


def _mgr(window: int = 20_000, engine: Quiet | None = None, **kw: Any) -> tuple[ContextManager, Quiet]:
    eng = engine or Quiet(context_length=window)
    return ContextManager(Config(), model="gpt-4o", context_length=window, engine_factory=lambda: eng, **kw), eng


def _sent(mgr: ContextManager, msgs: list[Message]) -> int:
    return sum(WindowCounter().exact_messages(msgs))


def test_tool_definitions_count_in_the_window_cap() -> None:
    tools = _tools()
    t = _tool_tokens(tools)
    assert 9_000 < t < 14_000  # the 42-tool LangGraph agent of the field report
    mgr, _ = _mgr()
    history = _session(10, 60)  # about 9K tokens: fits alone, not with the tools
    assert _sent(mgr, history) + t > mgr.window.limit > _sent(mgr, history)
    out = mgr.prepare(history, tools=tools)
    assert _sent(mgr, out) + t <= mgr.window.limit
    assert mgr.status()["tool_tokens"] == t
    assert mgr.request(out)[-1] == out[-1]  # request() holds the same window: nothing cut again
    # without tools the same history is sent whole
    plain, _ = _mgr()
    assert plain.prepare(history) == history


def test_tools_alone_that_do_not_fit_are_a_clear_error() -> None:
    mgr, _ = _mgr(window=10_000)
    with pytest.raises(ContextWindowError, match="tool definitions"):
        mgr.prepare(_session(1, 5), tools=_tools())


def test_the_system_prompt_latest_user_and_tools_overflowing_name_the_tools() -> None:
    mgr, _ = _mgr()
    msgs: list[Message] = [{"role": "system", "content": "rule " * 3000}, {"role": "user", "content": "word " * 3000}]
    with pytest.raises(ContextWindowError, match="the tool definitions"):
        mgr.prepare(msgs, tools=_tools())


def test_the_engine_works_against_the_window_less_the_tools() -> None:
    """The engine's window is what its messages have room for, and its trigger sees the
    messages' tokens: a fixed tool list does not hold every turn over the threshold (Claude
    Code sends ~19K tokens of tool schemas, more than half of a 40K window)."""
    tools = _tools()
    t = _tool_tokens(tools)
    history = _session(4, 40)
    mgr, eng = _mgr(engine=Quiet(fire_at=t + 100))
    window = mgr.context_length
    mgr.prepare(history)  # no tools: the whole window
    assert eng.context_length == window
    seen_alone = eng.seen[-1]
    mgr.prepare(history, tools=tools)
    assert eng.context_length == window - t  # the room the messages have
    assert eng.seen[-1] == seen_alone < t  # the trigger judged the messages, not the tools
    assert eng.compressed == 0
    mgr.prepare(history)  # the tools dropped: the whole window again
    assert eng.context_length == window
    # a tool list larger than three quarters of the window leaves the engine a quarter of it
    big = _tools(50)
    assert _tool_tokens(big) > 3 * window // 4
    mgr.prepare(_session(1, 5), tools=big)
    assert eng.context_length == window // 4
    # hygiene (85 % of the window) fires on messages + tools as well
    hmgr, heng = _mgr()
    big = _session(10, 50)
    counted = hmgr.count_tokens(big)
    assert counted < hmgr.hygiene_threshold <= counted + t
    hmgr.prepare(big, tools=tools)
    assert hmgr.status()["hygiene_fired"] == 1 and heng.compressed == 1


def test_the_engines_and_recall_tools_count_too() -> None:
    mgr, _ = _mgr(store=SqliteStore(":memory:"))
    history = _session(2, 5)
    agent = _tools(2, 10)
    mgr.prepare(history, tools=agent)
    before = mgr.status()["tool_tokens"]
    assert before == _tool_tokens(agent)
    # once the context lost text the recall tools go out: the request carries them
    mgr.engine().fire_at = 0  # type: ignore[attr-defined]
    mgr.prepare([*history, {"role": "user", "content": "next"}], tools=agent)
    sent = mgr.tools(agent)
    assert {t["function"]["name"] for t in sent} >= {GREP_TOOL, EXPAND_TOOL}
    assert abs(mgr.status()["tool_tokens"] - _tool_tokens(sent)) <= 4  # counted as two lists: their seam


def test_the_anchor_takes_the_tools_out_of_the_prompt_tokens() -> None:
    tools = _tools(5, 30)
    mgr, eng = _mgr()
    history = _session(2, 10)
    out = mgr.prepare(history, tools=tools)
    decision_tools = mgr._sessions["default"].tool_tokens
    mgr.update_from_response({"prompt_tokens": 5_000, "completion_tokens": 10})
    assert mgr.count_tokens(out) == 5_000 - decision_tools
    nxt = [*out, {"role": "user", "content": "again"}]
    mgr.prepare(nxt, tools=tools)
    # the trigger sees the messages of the provider's count: their anchor + what is new
    # (the engine's window is the window less the tools)
    assert 5_000 - decision_tools <= eng.seen[-1] <= 5_000 - decision_tools + 20


def test_the_tool_list_is_counted_once_per_distinct_list() -> None:
    mgr, _ = _mgr()
    calls: list[int] = []
    counts = mgr._tool_counts
    original = counts._exact

    def spy(text: str) -> int:
        calls.append(len(text))
        return original(text)

    counts._exact = spy
    tools = _tools()
    history = _session(1, 5)
    mgr.prepare(history, tools=tools)
    mgr.prepare([*history, {"role": "user", "content": "a"}], tools=tools)  # the same object
    mgr.prepare([*history, {"role": "user", "content": "a"}, {"role": "user", "content": "b"}], tools=json.loads(json.dumps(tools)))  # decoded again
    assert len(calls) == 1
    changed = json.loads(json.dumps(tools))
    changed[0]["function"]["description"] += " and more"
    mgr.prepare([*history, {"role": "user", "content": "c"}], tools=changed)
    assert len(calls) == 2


def test_the_quiet_turn_hands_a_new_tool_list_to_the_worker() -> None:
    mgr, _ = _mgr()
    tools = _tools()
    history = _session(1, 5)
    mgr.prepare(history)
    nxt = [*history, {"role": "user", "content": "a"}]
    with pytest.raises(CompactionDue, match="tool list"):
        mgr.prepare(nxt, tools=tools, may_compact=False)
    mgr.prepare(nxt, tools=tools)
    # counted once: the quiet turn takes the same list decoded again
    out = mgr.prepare([*nxt, {"role": "user", "content": "b"}], tools=json.loads(json.dumps(tools)), may_compact=False)
    assert out[-1]["content"] == "b"


def test_set_context_length_reaches_open_and_new_sessions() -> None:
    engines: list[Quiet] = []

    def make() -> Quiet:
        engines.append(Quiet(context_length=20_000))
        return engines[-1]

    mgr = ContextManager(Config(), model="my-local-model", context_length=20_000, engine_factory=make)
    assert mgr.status()["window_source"] == "argument"
    mgr.prepare(_session(1, 5), session_id="a")
    limit = mgr.window.limit
    mgr.set_context_length(16_385, source="learnt")
    assert mgr.context_length == 16_385 and mgr.window.limit < limit
    assert mgr.hygiene_threshold == int(16_385 * 0.85)
    assert engines[0].context_length == 16_385 and engines[0].threshold_tokens == int(16_385 * 0.5)
    mgr.prepare(_session(1, 5), session_id="b")
    assert engines[1].context_length == 16_385
    st = mgr.status("a")
    assert st["context_length"] == 16_385 and st["window_source"] == "learnt" and st["window_limit"] == mgr.window.limit
    # the same window again changes nothing
    calls = len(engines[0].models)
    mgr.set_context_length(16_385, source="learnt")
    assert len(engines[0].models) == calls


def test_set_context_length_waits_for_no_session() -> None:
    eng = Quiet()
    mgr, _ = _mgr(engine=eng)
    mgr.prepare(_session(1, 5))
    s = mgr._sessions["default"]
    held = threading.Event()
    release = threading.Event()

    def busy() -> None:
        with s.lock:
            held.set()
            release.wait(5)

    th = threading.Thread(target=busy)
    th.start()
    held.wait(5)
    mgr.set_context_length(8_000, source="learnt")  # returns at once
    assert eng.context_length == 20_000  # told at its next call
    release.set()
    th.join()
    mgr.prepare([*_session(1, 5), {"role": "user", "content": "x"}])
    assert eng.context_length == 8_000


def test_set_context_length_rejects_bad_windows_and_changes_nothing() -> None:
    mgr, _ = _mgr()
    for bad in (0, -5, 1.5, "16k", True):
        with pytest.raises(ConfigError, match="positive"):
            mgr.set_context_length(bad)  # type: ignore[arg-type]
    cfg = Config.from_dict({"context": {"completion_reserve": 9_000}})
    strict = ContextManager(cfg, model="gpt-4o", context_length=20_000, engine_factory=Quiet)
    with pytest.raises(ContextWindowError, match="leave no room"):
        strict.set_context_length(8_000)
    assert strict.context_length == 20_000 and strict.window.window.context_length == 20_000


def test_room_is_what_the_window_has_left() -> None:
    mgr, _ = _mgr()
    tools = _tools(5, 30)
    out = mgr.prepare(_session(3, 20), tools=tools)
    t = _tool_tokens(tools)
    assert mgr.room(out, tools) == mgr.window.limit - t - _sent(mgr, out)
    assert mgr.room(out) == mgr.room(out, tools)  # None: the tools the last prepare counted
    call: Message = {"role": "assistant", "content": None, "tool_calls": [{"id": f"r{i}", "type": "function", "function": {"name": EXPAND_TOOL, "arguments": '{"id": "x"}'}} for i in range(4)]}
    with_call = mgr.room([*out, call], tools)
    assert with_call == mgr.room(out, tools) - _sent(mgr, [call])
    assert mgr.room(_session(40, 60), tools) == 0  # over the window: nothing left


def _recall_mgr(window: int = 16_000) -> tuple[ContextManager, list[Message]]:
    store = SqliteStore(":memory:")
    mgr = ContextManager(Config(), model="gpt-4o", context_length=window, engine_factory=lambda: Quiet(context_length=window, fire_at=0), store=store)
    history = _session(6, 300)
    mgr.prepare(history)
    return mgr, history


def test_recall_answers_are_bounded_by_max_tokens_and_say_how_to_get_the_rest() -> None:
    mgr, _ = _recall_mgr()
    store = mgr.store
    assert isinstance(store, SqliteStore)
    hits = json.loads(mgr.handle_tool_call(GREP_TOOL, {"query": "line 3.17"}))
    ref = hits["results"][0]["id"]
    whole = json.loads(mgr.handle_tool_call(EXPAND_TOOL, {"id": ref}))
    full_text = whole["messages"][0]["message"]["content"]
    assert EXACT.count(full_text) > 2_000
    answer = mgr.handle_tool_call(EXPAND_TOOL, {"id": ref}, max_tokens=600)
    assert EXACT.count(answer) <= 600
    data = json.loads(answer)
    assert data["truncated"] and "text_offset" in data["note"]
    # the rest, asked as the note says, completes the message verbatim
    got = data["messages"][0]["message"]["content"]
    while data.get("next_text_offset") is not None:
        data = json.loads(mgr.handle_tool_call(EXPAND_TOOL, {"id": ref, "offset": data["next_offset"], "text_offset": data["next_text_offset"]}, max_tokens=600))
        got += data["messages"][0]["message"]["content"]
    assert got == full_text


def test_four_recall_calls_in_one_reply_share_the_room() -> None:
    mgr, _ = _recall_mgr(window=12_000)
    context = mgr._sessions["default"].last_sent
    ids = [h["id"] for h in json.loads(mgr.handle_tool_call(GREP_TOOL, {"query": "value", "limit": 20}))["results"]][:4]
    call: Message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": f"r{i}", "type": "function", "function": {"name": EXPAND_TOOL, "arguments": json.dumps({"id": ref})}} for i, ref in enumerate(ids)],
    }
    room = mgr.room([*context, call])
    share = room // len(ids) - MESSAGE_OVERHEAD_TOKENS
    results: list[Message] = [
        {"role": "tool", "tool_call_id": f"r{i}", "content": mgr.handle_tool_call(EXPAND_TOOL, {"id": ref}, max_tokens=share)} for i, ref in enumerate(ids)
    ]
    followup = [*context, call, *results]
    assert _sent(mgr, followup) <= mgr.window.limit
    unbounded: list[Message] = [{"role": "tool", "tool_call_id": f"r{i}", "content": mgr.handle_tool_call(EXPAND_TOOL, {"id": ref})} for i, ref in enumerate(ids)]
    assert _sent(mgr, [*context, call, *unbounded]) > mgr.window.limit  # what the field report saw


def test_grep_and_other_tools_answers_are_bounded_too() -> None:
    mgr, _ = _recall_mgr()
    answer = mgr.handle_tool_call(GREP_TOOL, {"query": "value", "limit": 100}, max_tokens=300)
    assert EXACT.count(answer) <= 300
    data = json.loads(answer)
    assert data["omitted"] > 0 and "narrow the query" in data["note"]
    with pytest.raises(ValueError, match="max_tokens"):
        mgr.handle_tool_call(GREP_TOOL, {"query": "value"}, max_tokens=0)


class Talker(Quiet):
    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return [{"name": "talk", "description": "says a lot", "parameters": {"type": "object", "properties": {}}}]

    def handle_tool_call(self, name: str, args: Any, **kwargs: Any) -> str:
        return json.dumps({"said": "blah " * 2000})


def test_an_engine_tools_answer_is_cut_with_a_note() -> None:
    mgr = ContextManager(Config(), model="gpt-4o", context_length=20_000, engine_factory=Talker)
    mgr.prepare(_session(1, 5))
    answer = mgr.handle_tool_call("talk", {}, max_tokens=200)
    assert EXACT.count(answer) <= 200
    data = json.loads(answer)
    assert data["truncated"] and data["text"].startswith('{"said": "blah') and "cut" in data["note"]
    assert len(mgr.handle_tool_call("talk", {})) > 9_000  # unbounded without max_tokens


def test_the_engine_sees_the_usage_without_the_tool_definitions() -> None:
    """The provider's prompt tokens count the tool definitions: the engine, whose window is the
    window less them, gets its messages' share (else its anchored trigger would judge messages +
    tools against the messages' threshold). Tools open the prompt: they come out of the cached
    part first."""
    tools = _tools(5, 30)
    mgr, eng = _mgr()
    mgr.prepare(_session(2, 10), tools=tools)
    t = mgr._sessions["default"].tool_tokens
    assert t > 0
    mgr.update_from_response({"input_tokens": 100, "cache_read_input_tokens": 4_000, "cache_creation_input_tokens": 900, "output_tokens": 10})
    assert eng.last_prompt_tokens == 5_000 - t
    assert mgr.status()["cache_read_tokens"] == 4_000  # the session's own counters keep the provider's figures
    mgr.update_from_response({"prompt_tokens": 5_000, "completion_tokens": 10})
    assert eng.last_prompt_tokens == 5_000 - t


def test_the_output_just_read_reaches_the_model_whole_when_tools_take_much_of_the_window() -> None:
    """The default engine works against the room the tools leave (here ~9K of 16K): an output
    of ~3.5K tokens just read is not a giant there, and is sent whole (a cut before the model
    ever saw it would cost the agent the file it asked for)."""
    tools = _tools(20, 60)
    ctx = ContextManager(Config(), model="gpt-4o", context_length=16_000, store=SqliteStore(":memory:"))
    history = _session(0, 0)
    for k in range(4):
        history = [*history, *_session(1, 330)[2:]]
        history[-2] = {**history[-2], "tool_calls": [{"id": f"r{k}", "type": "function", "function": {"name": "tool_1", "arguments": "{}"}}]}
        history[-1] = {**history[-1], "tool_call_id": f"r{k}"}
        out = ctx.prepare(history, tools=tools, session_id="s")
        assert out[-1] == history[-1], f"turn {k}: the newest output is sent whole"
    engine = ctx.engine("s")
    assert engine.context_length < 11_000  # the engine's room: the window less the tools
    assert EXACT.count(str(history[-1]["content"])) > engine.context_length // 4  # over the old giant limit


@pytest.mark.parametrize("engine", ["compressor", "rules"])
def test_the_stored_originals_are_the_messages_as_sent_after_window_cuts(engine: str) -> None:
    """The window cap's cut is recorded like a compaction: the session's originals (what a
    restart resumes from and a router is seeded with) are the messages as sent, never the
    cut copies the working context carries on later turns."""
    cfg = Config()
    cfg.context.engine = engine
    cfg.compression.mode = "summary"  # the summarizing compressor leaves the window cap work to do
    store = SqliteStore(":memory:")
    ctx = ContextManager(cfg, model="gpt-4o", context_length=16_000, store=store)
    tools = _tools(20, 60)
    history = _session(0, 0)
    cut = False
    for k in range(10):
        history = [*history, *_session(1, 300)[2:]]
        history[-2] = {**history[-2], "tool_calls": [{"id": f"r{k}", "type": "function", "function": {"name": "tool_1", "arguments": "{}"}}]}
        history[-1] = {**history[-1], "tool_call_id": f"r{k}"}
        out = ctx.prepare(json.loads(json.dumps(history)), tools=tools, session_id="s", defer_record=True)
        ctx.flush_records("s")
        cut = cut or any("[ctxengine:" in str(m.get("content")) for m in out)
        assert store.originals("s") == history, f"turn {k}"
    assert cut and ctx.status("s")["window_cuts"] >= 1
