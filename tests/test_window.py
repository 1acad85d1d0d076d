"""The window cap: no request leaves the manager larger than the window, whatever the engine."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ctxengine.config import Config
from ctxengine.engine import ContextEngine
from ctxengine.errors import ConfigError, ContextWindowError
from ctxengine.manager import ContextManager
from ctxengine.messages import Message, content_text, validate
from ctxengine.store.sqlite import SqliteStore
from ctxengine.tokens import ExactCounter, estimate, estimate_message_tokens
from ctxengine.window import (
    TOOLS_OVERHEAD_TOKENS,
    ToolTokens,
    WindowCap,
    WindowCounter,
    WindowLimit,
    WindowTally,
    default_completion_reserve,
)

O200K = ExactCounter()


def _listing(n: int) -> str:
    return "\n".join(
        f"/sys/devices/pci0000:00/0000:00:{i % 32:02x}.{i % 8}/power/runtime_status{i}"
        for i in range(n)
    )


def _call(cid: str, command: str) -> Message:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": cid,
                "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": command})},
            }
        ],
    }


def _session(giant: int = 4000) -> list[Message]:
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Find the power settings under /sys and fix src/Power.java"},
        _call("c1", "find /sys -name power"),
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": _listing(giant) + "\nError: permission denied on /sys/kernel/debug",
        },
        _call("c2", "cat src/Power.java"),
        {"role": "tool", "tool_call_id": "c2", "content": "class Power { }"},
    ]


class KeepAll(ContextEngine):
    """An engine that never compacts: whatever it returns must still fit."""

    @property
    def name(self) -> str:
        return "keepall"

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        return False

    def compress(
        self,
        messages: list[Message],
        current_tokens: int | None = None,
        focus_topic: str | None = None,
    ) -> list[Message]:
        return list(messages)


def _mgr(n: int = 8000, store: Any = None, config: Config | None = None) -> ContextManager:
    return ContextManager(
        config or Config(),
        model="gpt-4o",
        context_length=n,
        store=store,
        engine_factory=lambda: KeepAll(context_length=n),
    )


def test_limit_is_window_minus_reserve_minus_margin() -> None:
    w = WindowLimit.for_window(128_000)
    assert (w.reserve, w.margin, w.limit) == (8000, 3840, 128_000 - 8000 - 3840)
    assert default_completion_reserve(32_000) == 2000
    assert default_completion_reserve(1_000_000) == 8192
    assert WindowLimit.for_window(32_000, completion_reserve=0, margin_ratio=0.0).limit == 32_000
    with pytest.raises(ContextWindowError, match="leave no room"):
        WindowLimit.for_window(1000, completion_reserve=990)


def test_config_keys_set_the_limit() -> None:
    cfg = Config.from_dict({"context": {"completion_reserve": 1000, "window_margin": 0.1}})
    assert _mgr(10_000, config=cfg).window.limit == 10_000 - 1000 - 1000
    with pytest.raises(ConfigError):
        Config.from_dict({"context": {"window_margin": 0.9}})


def test_a_giant_output_is_cut_and_the_request_fits_by_o200k() -> None:
    msgs = _session()
    before = copy.deepcopy(msgs)
    mgr = _mgr(8000)
    out = mgr.prepare(msgs)
    assert msgs == before  # the caller's list is untouched
    assert O200K.count_messages(out) <= mgr.window.limit
    assert not [v for v in validate(out) if v.severity == "error"]
    assert len(out) == len(msgs)  # nothing dropped: the output was cut in place
    cut = content_text(out[3]["content"])
    assert cut.startswith("[ctxengine:cut")
    assert "Error: permission denied on /sys/kernel/debug" in cut  # error lines listed verbatim
    assert [m for m in out if m["role"] == "user"] == [m for m in msgs if m["role"] == "user"]
    assert mgr.status()["window_cuts"] == 1


def test_a_fitting_request_is_untouched() -> None:
    msgs = _session(giant=50)
    assert _mgr(8000).prepare(msgs) == msgs


def test_the_estimate_is_not_trusted_on_long_texts() -> None:
    # hex digests: the estimate undercounts them by about a quarter; long texts are counted exactly
    blob = "\n".join(f"{i:08x}{'deadbeef' * 7}" for i in range(1400))
    counter = WindowCounter()
    assert counter.count(blob) == O200K.count(blob)
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "hash them"},
        _call("c1", "sha"),
        {"role": "tool", "tool_call_id": "c1", "content": blob},
    ]
    mgr = _mgr(int(O200K.count_messages(msgs) * 1.02))
    out = mgr.prepare(msgs)
    assert O200K.count_messages(out) <= mgr.window.limit


def test_cut_originals_stay_retrievable_through_recall() -> None:
    store = SqliteStore(":memory:")
    mgr = _mgr(8000, store=store)
    out = mgr.prepare(_session())
    assert "/sys/devices/pci0000:00/0000:00:10.0/power/runtime_status2000" not in json.dumps(out)
    assert mgr.retrievable("/sys/devices/pci0000:00/0000:00:10.0/power/runtime_status2000")
    # the marker names the stored original, which ctx_expand gives back whole
    marker = content_text(out[3]["content"]).splitlines()[0]
    ref = marker.split("ref=")[1].split(":")[0].split(";")[0].strip()
    recall = mgr._session(None).recall
    assert recall is not None
    answer = json.loads(recall.handle("ctx_expand", {"id": ref, "max_tokens": 200_000}))
    assert answer["messages"][0]["message"]["content"] == _session()[3]["content"]


def test_the_latest_user_message_is_never_cut_older_ones_become_stubs() -> None:
    old = "please remember: " + "alpha beta gamma " * 900
    new = "now do this: " + "delta epsilon " * 200
    msgs: list[Message] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": old},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": new},
    ]
    mgr = _mgr(3000, store=SqliteStore(":memory:"))
    out = mgr.prepare(msgs)
    assert out[-1] == msgs[-1]
    assert content_text(out[1]["content"]).startswith("[ctxengine:cut")
    assert O200K.count_messages(out) <= mgr.window.limit
    assert mgr.retrievable("please remember: alpha beta gamma")


def test_anchors_that_cannot_fit_are_a_clear_error() -> None:
    msgs: list[Message] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "word " * 5000},
    ]
    with pytest.raises(ContextWindowError, match="latest user message"):
        _mgr(2000).prepare(msgs)


def test_many_small_exchanges_are_dropped_whole_oldest_first() -> None:
    msgs: list[Message] = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}]
    for k in range(200):
        msgs += [
            _call(f"c{k}", f"step {k}"),
            {"role": "tool", "tool_call_id": f"c{k}", "content": f"done {k}"},
        ]
    cap = WindowCap(WindowLimit.for_window(2000))
    res = cap.fit(msgs)
    assert res.dropped > 0 and res.tokens <= cap.limit
    assert not [v for v in validate(res.messages) if v.severity == "error"]
    assert res.messages[:2] == msgs[:2] and res.messages[-2:] == msgs[-2:]


def test_request_is_capped_too() -> None:
    mgr = _mgr(8000)
    req = mgr.request(_session())
    assert O200K.count_messages(req) <= mgr.window.limit


class CountingExact:
    """o200k behind the counter seam, recording each text it tokenizes."""

    name = "o200k-counting"
    per_message = True

    def __init__(self) -> None:
        self.texts: list[str] = []

    def count(self, text: str) -> int:
        self.texts.append(text)
        return O200K.count(text)

    def count_messages(self, messages: Any) -> int:
        return sum(O200K.count_messages([m]) for m in messages)


def test_a_list_that_extends_the_last_one_costs_only_its_new_messages() -> None:
    exact = CountingExact()
    cap = WindowCap(WindowLimit.for_window(8000), WindowCounter(exact))
    tally = WindowTally()
    msgs = _session(giant=50)
    assert not cap.fit(msgs, tally=tally).changed
    first = tally.sizes[:]
    more = [*msgs, {"role": "user", "content": "next"}]
    cap.fit(more, tally=tally)
    assert tally.sizes[: len(first)] == first and len(tally.sizes) == len(more)
    seen = len(exact.texts)
    cap.fit(list(more), tally=tally)  # the same list again (request after prepare): no counting
    assert len(exact.texts) == seen
    assert tally.total >= O200K.count_messages(more)


def test_texts_are_tokenized_only_when_the_safe_bound_is_not_under_the_limit() -> None:
    blob = "\n".join(f"{i:08x}{'deadbeef' * 7}" for i in range(1400))
    msgs: list[Message] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "hash them"},
        _call("c1", "sha"),
        {"role": "tool", "tool_call_id": "c1", "content": blob},
    ]
    exact = CountingExact()
    big = WindowCap(WindowLimit.for_window(1_000_000), WindowCounter(exact))
    res = big.fit(msgs)
    assert not res.changed and exact.texts == []  # the byte bound is clearly under the limit
    assert res.tokens >= O200K.count_messages(msgs)  # a bound never undercounts
    # near the limit the exact count decides: it fits exactly, nothing is cut
    n = O200K.count_messages(msgs)
    tight = WindowCap(WindowLimit.for_window(n + 10, completion_reserve=0, margin_ratio=0.0), WindowCounter(exact))
    res = tight.fit(msgs)
    assert not res.changed and res.tokens == n and blob in exact.texts
    # one token less and the output is cut to fit, by o200k
    small = WindowCap(WindowLimit.for_window(n - 1, completion_reserve=0, margin_ratio=0.0), WindowCounter(CountingExact()))
    res = small.fit(msgs)
    assert res.changed and O200K.count_messages(res.messages) <= n - 1


def test_the_manager_keeps_running_sums_per_session_and_holds_the_window() -> None:
    mgr = _mgr(8000)
    msgs = _session(giant=50)
    out = mgr.prepare(msgs, session_id="a")
    for k in range(40):
        out = mgr.prepare([*out, _call(f"x{k}", f"ls {k}"), {"role": "tool", "tool_call_id": f"x{k}", "content": _listing(60)}], session_id="a")
        req = mgr.request(out, session_id="a")
        assert O200K.count_messages(req) <= mgr.window.limit
    assert mgr.status("a")["window_cuts"] > 0
    tally = mgr._session("a").tally
    assert tally.msgs == out and tally.total >= O200K.count_messages(out)


def _users_session(turns: int, words: int) -> list[Message]:
    msgs: list[Message] = [{"role": "system", "content": "You are a careful coding agent."}]
    for t in range(turns):
        msgs += [
            {"role": "user", "content": f"request {t}: handle item-{t} " + "and keep it tidy " * (words // 4)},
            _call(f"c{t}", f"make item-{t}"),
            {"role": "tool", "tool_call_id": f"c{t}", "content": f"built item-{t}"},
            {"role": "assistant", "content": f"Done with item {t}."},
        ]
    return msgs


def _grep(mgr: ContextManager, query: str) -> str:
    recall = mgr._session(None).recall
    assert recall is not None
    return recall.handle("ctx_grep", {"query": query})


@pytest.mark.parametrize("engine", ["rules", "cacheaware"])
def test_stubs_and_records_that_overflow_a_small_window_fold_into_one_line(engine: str) -> None:
    msgs = _users_session(10, 60)
    mgr = ContextManager(
        Config.from_dict({"context": {"engine": engine}}), model="gpt-4o", context_length=500, store=SqliteStore(":memory:")
    )
    out = mgr.prepare(msgs)  # no ContextWindowError: the system prompt and the latest user fit
    assert O200K.count_messages(out) <= mgr.window.limit
    assert out[0] == msgs[0]
    assert msgs[-4] in out  # the latest user message, verbatim
    assert any(content_text(m.get("content")).startswith("[ctxengine:folded") for m in out)
    assert not [v for v in validate(out) if v.severity == "error"]
    for t in range(9):  # each older request is back through recall, verbatim
        assert f"request {t}: handle item-{t} " in _grep(mgr, f"request {t}: handle item-{t} ")


def test_more_user_text_than_the_window_becomes_stubs_then_one_folded_line() -> None:
    msgs = _users_session(700, 200)
    assert O200K.count_messages([m for m in msgs if m["role"] == "user"]) > 128_000
    mgr = ContextManager(
        Config.from_dict({"context": {"engine": "rules"}}), model="gpt-4o", context_length=128_000, store=SqliteStore(":memory:")
    )
    out = mgr.prepare(msgs)
    assert O200K.count_messages(out) <= mgr.window.limit
    assert msgs[-4] in out
    assert not [v for v in validate(out) if v.severity == "error"]
    stubs = [m for m in out if m["role"] == "user" and content_text(m["content"]).startswith("[ctxengine:cut")]
    assert stubs  # older requests are short recall stubs
    assert mgr.retrievable("request 3: handle item-3 and keep it tidy")
    assert "request 3: handle item-3 " in _grep(mgr, "request 3: handle item-3 ")


def test_without_recall_nothing_is_folded() -> None:
    msgs = _users_session(10, 60)
    # no ref_for, but the caller keeps the originals (a store it recorded them in)
    res = WindowCap(WindowLimit.for_window(500)).fit(msgs, originals=True)
    assert res.tokens <= res.limit
    assert not any(content_text(m.get("content")).startswith("[ctxengine:folded") for m in res.messages)


def test_without_kept_originals_no_user_message_is_cut() -> None:
    msgs = _users_session(10, 60)
    cap = WindowCap(WindowLimit.for_window(500))
    with pytest.raises(ContextWindowError, match="no session store keeps the originals, so older user messages are kept whole"):
        cap.fit(msgs)  # no store behind: a stub would be the only copy left
    small = _users_session(3, 8)
    small[3] = {**small[3], "content": _listing(300)}  # one output far over the window
    res = cap.fit(small)  # cutting outputs is enough: they are cut, every user message stays
    assert res.cut and res.tokens <= res.limit
    assert all(m in res.messages for m in small if m["role"] == "user")


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "short text " * 10},
        {"role": "tool", "tool_call_id": "c1", "content": "x = 1\n" * 5_000},  # over EXACT_CHARS
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{\"a\": 1}"}}]},
        {"role": "assistant", "content": "ok", "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "w", "arguments": "y" * 30_000}}]},
        {"role": "user", "content": [{"type": "text", "text": "z" * 25_000}, {"type": "image_url", "image_url": {"url": "data:"}}]},
        {"role": "user", "content": {"weird": "q" * 21_000}},
    ],
)
def test_count_message_from_an_estimate_equals_count_messages(message: dict[str, Any]) -> None:
    """``count_message(m, estimated)`` is ``count_messages([m])``: the estimate for a message of
    short texts, an exact count as soon as one text reaches ``exact_chars``."""
    counter = WindowCounter()
    seen: list[Any] = []

    def estimated(m: Any) -> int:
        seen.append(m)
        return estimate_message_tokens(m)

    assert counter.count_message(message, estimated) == WindowCounter().count_messages([message])


# texts near any length, of four-space runs (the cheapest characters to estimate), digits,
# letters, CJK and lone surrogates
_PIECES = st.sampled_from(["    ", " ", "a", "1", "{", "\n", "é", "漢", "😀", "\ud800"])
_TEXTS = st.builds(lambda parts, k: "".join(parts) * k, st.lists(_PIECES, max_size=12), st.integers(1, 40))


@settings(max_examples=400, deadline=None)
@given(texts=st.lists(_TEXTS, min_size=1, max_size=3), exact_chars=st.integers(0, 200), calls=st.booleans())
@example(texts=[" " * 200], exact_chars=200, calls=False)  # estimated at 14 tokens: the walk finds it long
@example(texts=["    " * 50 + "a"], exact_chars=201, calls=False)
def test_count_message_skips_the_walk_only_for_messages_without_a_long_text(texts: list[str], exact_chars: int, calls: bool) -> None:
    """The shortcut (an estimate too small for any text of ``exact_chars``) answers what the
    walk answers, whatever the texts and the limit; its bound holds for each text."""
    for t in texts:
        assert 20 * estimate(t) >= len(t) - 3
    message: dict[str, Any] = {"role": "user", "content": [{"type": "text", "text": t} for t in texts[1:]] or texts[0]}
    if calls:
        message = {"role": "assistant", "content": texts[0], "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": texts[-1]}}]}
    exact = ExactCounter()
    counter = WindowCounter(exact, exact_chars=exact_chars)
    assert counter.count_message(message, estimate_message_tokens) == WindowCounter(exact, exact_chars=exact_chars).count_messages([message])


def _schemas(n: int) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": f"t{i}", "description": "Fetch the page at the URL and return its text. " * 4, "parameters": {"type": "object", "properties": {"url": {"type": "string"}}}}}
        for i in range(n)
    ]


def test_tool_tokens_are_the_serialised_schemas_counted_once_per_list() -> None:
    counted: list[str] = []

    def exact(text: str) -> int:
        counted.append(text)
        return O200K.count(text)

    tt = ToolTokens(estimate, exact)
    tools = _schemas(5)
    text = json.dumps(tools, ensure_ascii=False, separators=(",", ":"))
    assert tt.count(tools) == (estimate(text) + TOOLS_OVERHEAD_TOKENS, O200K.count(text) + TOOLS_OVERHEAD_TOKENS)
    assert tt.count(tools) == tt.count(json.loads(json.dumps(tools)))  # the same list, decoded again
    assert len(counted) == 1
    assert tt.known(_schemas(6)) is None  # never counted: known() does not count it
    assert len(counted) == 1
    assert tt.count([]) == (0, 0) and tt.known([]) == (0, 0)
    # Anthropic's shape and non-ASCII descriptions are serialised as they are
    anthropic = [{"name": "lire", "description": "Lit le fichier « à côté »", "input_schema": {"type": "object"}}]
    raw = json.dumps(anthropic, ensure_ascii=False, separators=(",", ":"))
    assert tt.count(anthropic)[1] == O200K.count(raw) + TOOLS_OVERHEAD_TOKENS


def test_the_cap_holds_messages_to_the_limit_minus_the_tool_definitions() -> None:
    cap = WindowCap(WindowLimit.for_window(32_000))
    msgs = _session(giant=500)
    size = cap.measure(msgs)
    assert not cap.over(msgs)
    reserve = cap.limit - size + 500
    assert cap.over(msgs, reserve=reserve)
    fitted = cap.fit(msgs, reserve=reserve)
    assert fitted.changed and cap.measure(fitted.messages) <= cap.limit - reserve
    assert fitted.limit == cap.limit - reserve
    assert cap.room(fitted.messages, reserve=reserve) == cap.limit - reserve - cap.measure(fitted.messages)
    with pytest.raises(ContextWindowError, match="tool definitions alone"):
        cap.fit(msgs, reserve=cap.limit)


def test_an_image_counts_as_its_fixed_cost_never_its_bytes() -> None:
    """Images (OpenAI image_url, Anthropic image blocks, images inside tool results) count
    IMAGE_TOKENS each in the window, whatever the size of their base64 data."""
    from ctxengine.tokens import IMAGE_TOKENS, MESSAGE_OVERHEAD_TOKENS

    data = "iVBORw0KGgo" + "A" * 400_000
    openai: Message = {"role": "user", "content": [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}]}
    anthropic: Message = {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]}
    in_result: Message = {"role": "tool", "tool_call_id": "c1", "content": [{"type": "tool_result", "content": [{"type": "image", "source": {"type": "base64", "data": data}}]}]}
    counter = WindowCounter()
    assert counter.exact_message(openai) == MESSAGE_OVERHEAD_TOKENS + O200K.count("what is this") + IMAGE_TOKENS
    assert counter.exact_message(anthropic) == MESSAGE_OVERHEAD_TOKENS + IMAGE_TOKENS
    assert IMAGE_TOKENS <= counter.exact_message(in_result) < IMAGE_TOKENS + 20  # + the call id


def test_tool_lists_remembered_by_identity_are_bounded() -> None:
    from ctxengine import window

    tt = ToolTokens(estimate, estimate)
    big = _schemas(400)  # ~100 KB of JSON
    for _ in range(60):
        tt.count(json.loads(json.dumps(big)))  # a new list each time, counted once
    assert tt._id_bytes <= window._TOOL_IDS_BYTES and len(tt._by_id) < 60
    for i in range(300):
        tt.count([{"name": f"t{i}"}])
    assert len(tt._by_id) <= window._TOOL_IDS


def test_without_recall_no_marker_or_stub_names_a_recall_tool() -> None:
    """prepare(recall=False) (a client that sends no tools, e.g. aider): the window cap's cuts
    say what was removed and that the original is in the session store, never ctx_expand."""
    pasted = "please fix src/pkg/parser.py\n\nsrc/pkg/parser.py\n```python\n" + "x = compute(1)  # step\n" * 1200 + "```"
    msgs: list[Message] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": pasted},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "now the tests"},
    ]
    for recall, named in ((False, False), (None, True)):
        mgr = _mgr(8000, store=SqliteStore(":memory:"))
        out = mgr.prepare(msgs, recall=recall)
        text = json.dumps(out)
        assert content_text(out[1]["content"]).startswith("[ctxengine:cut ref=")
        assert ("ctx_expand" in text) is named
        assert "ctx_grep" not in text
        if not named:
            assert "kept verbatim in the session store" in text
            assert "src/pkg/parser.py" in content_text(out[1]["content"])  # what was removed, in words an agent can use
            assert mgr.tools(session_id=None) == []  # the recall tools are not offered either
        assert mgr.retrievable("x = compute(1)  # step")


def test_the_fold_line_without_recall_names_no_tool() -> None:
    line = WindowCap._fold_message(5, 2, recall=False)
    assert "ctx_" not in content_text(line["content"]) and "session store" in content_text(line["content"])
    assert "ctx_grep" in content_text(WindowCap._fold_message(5, 2)["content"])
