"""A caller resending its whole history gets the session's working context back (issue 13.5).

The manager recognises the part of a history it has seen, hands the engine the working context
plus only the new messages, records only those, and starts a branch when the caller edits or
truncates its history.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctxengine.config import Config
from ctxengine.errors import InvalidMessages
from ctxengine.history import SessionHistory, TurnInput
from ctxengine.manager import ContextManager
from ctxengine.messages import Message, content_text
from ctxengine.store import SqliteStore

WINDOW = 8_000


def _turns(n: int, *, tag: str = "", size: int = 30) -> list[list[Message]]:
    """``n`` agent turns: an assistant tool call and its (sizeable) result, a user nudge every 5."""
    out: list[list[Message]] = []
    for k in range(n):
        turn: list[Message] = [
            {"role": "assistant", "content": None, "tool_calls": [{"id": f"{tag}c{k}", "type": "function", "function": {"name": "run", "arguments": f'{{"step": {k}}}'}}]},
            {"role": "tool", "tool_call_id": f"{tag}c{k}", "content": f"{tag} output of step {k}: " + f"line {k} of /src/{tag}mod{k}.py ok\n" * size},
        ]
        if k % 5 == 4:
            turn.append({"role": "user", "content": f"{tag} keep going after step {k}"})
        out.append(turn)
    return out


def _head(tag: str = "") -> list[Message]:
    return [{"role": "system", "content": "You are a careful agent."}, {"role": "user", "content": f"{tag} fix the build, task marker {tag}FIRST"}]


def _mgr(store: Any = None, window: int = WINDOW) -> ContextManager:
    # the summarizing path compacts at a known threshold: what these history tests need
    return ContextManager(Config.from_dict({"compression": {"mode": "summary"}}), model="claude-sonnet-4.5", provider="anthropic", context_length=window, store=store)


def _texts(msgs: list[Message]) -> str:
    return "\n".join(content_text(m.get("content")) for m in msgs)


def test_a_caller_resending_its_full_history_compacts_as_often_as_one_keeping_the_prepared_list() -> None:
    turns = _turns(20)
    kept, full = _mgr(), _mgr()
    raw = list(_head())
    working = kept.prepare(raw, session_id="s")
    resent = full.prepare(list(raw), session_id="s")
    assert resent == working
    for turn in turns:
        raw = [*raw, *turn]
        working = kept.prepare([*working, *turn], session_id="s")
        resent = full.prepare(list(raw), session_id="s")  # a fresh list each turn, as a gateway sends
        assert resent == working  # the same working context, message for message
    assert kept.status("s")["compactions"] >= 1  # the scenario does compact
    assert full.status("s")["compactions"] == kept.status("s")["compactions"] <= 2


def test_a_json_decoded_history_is_recognised_by_value() -> None:
    import json

    mgr = _mgr()
    raw = list(_head())
    out: list[Message] = []
    for turn in _turns(20):
        raw = [*raw, *turn]
        out = mgr.prepare(json.loads(json.dumps(raw)), session_id="g")  # new dicts every turn
    assert mgr.status("g")["compactions"] <= 2
    assert out[0]["role"] == "system" and content_text(out[-1]["content"]) == content_text(raw[-1]["content"])


def test_a_truncated_history_branches_and_drops_the_removed_turns() -> None:
    mgr = _mgr()
    raw = list(_head())
    for turn in _turns(16):
        raw = [*raw, *turn]
        mgr.prepare(list(raw), session_id="s")
    compactions = mgr.status("s")["compactions"]
    assert compactions >= 1
    # a retry: the client drops its last turn and sends another one instead
    retry: list[Message] = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "retry1", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "retry1", "content": "retried output"},
    ]
    dropped = raw[-2:]
    out = mgr.prepare([*raw[:-2], *retry], session_id="s")
    text = _texts(out)
    assert "retried output" in text
    assert content_text(dropped[-1]["content"]) not in text  # the dropped output is gone
    assert not any(m.get("tool_call_id") == dropped[-1]["tool_call_id"] for m in out)
    assert mgr.status("s")["compactions"] == compactions  # the compacted head was kept, not redone
    assert mgr.engine("s").__class__.__name__  # the session goes on
    nxt = mgr.prepare([*raw[:-2], *retry, {"role": "user", "content": "thanks"}], session_id="s")
    assert nxt[: len(out)] == out and nxt[-1]["content"] == "thanks"


def test_an_edit_in_the_compacted_part_starts_over_without_resurrecting_the_old_text() -> None:
    mgr = _mgr()
    raw = list(_head())
    for turn in _turns(16):
        raw = [*raw, *turn]
        out = mgr.prepare(list(raw), session_id="s")
    assert "FIRST" in _texts(out)  # the first user message is an anchor: kept (or summarized)
    edited = [raw[0], {"role": "user", "content": "a different task, marker SECOND"}, *raw[2:8]]
    out = mgr.prepare(edited, session_id="s")
    text = _texts(out)
    assert "SECOND" in text
    assert "FIRST" not in text  # neither the old message nor a summary of it comes back
    assert "step 12" not in text


def test_sessions_never_cross() -> None:
    mgr = _mgr()
    raws: dict[str, list[Message]] = {"a": list(_head("A")), "b": list(_head("B"))}
    turns = {"a": _turns(14, tag="A"), "b": _turns(14, tag="B")}
    outs: dict[str, list[Message]] = {}
    for k in range(14):
        for sid in ("a", "b"):
            raws[sid] = [*raws[sid], *turns[sid][k]]
            outs[sid] = mgr.prepare(list(raws[sid]), session_id=sid)
    assert "Bmod" not in _texts(outs["a"]) and "Amod" not in _texts(outs["b"])
    assert "B output" not in _texts(outs["a"]) and "A output" not in _texts(outs["b"])
    # a session's raw history sent under the other id is a different conversation there
    out = mgr.prepare(list(raws["a"]), session_id="b")
    assert "B output" not in _texts(out)


def test_the_prepared_list_caller_keeps_working_as_before() -> None:
    mgr = _mgr()
    working = mgr.prepare(_head(), session_id="s")
    for turn in _turns(16):
        working = mgr.prepare([*working, *turn], session_id="s")
    assert mgr.status("s")["compactions"] >= 1
    # dropping its own latest turn branches from its own list
    out = mgr.prepare(working[:-2], session_id="s")
    assert out == working[:-2]


def test_only_new_messages_are_validated_with_indices_in_the_callers_list() -> None:
    mgr = _mgr()
    raw = list(_head())
    for turn in _turns(12):
        raw = [*raw, *turn]
        mgr.prepare(list(raw), session_id="s")
    bad = [*raw, {"role": "tool", "tool_call_id": "nobody", "content": "orphan"}]
    with pytest.raises(InvalidMessages) as info:
        mgr.prepare(bad, session_id="s")
    assert [v.index for v in info.value.violations] == [len(raw)]
    # a call left pending last turn must be answered now
    call: Message = {"role": "assistant", "content": None, "tool_calls": [{"id": "p1", "type": "function", "function": {"name": "run", "arguments": "{}"}}]}
    mgr.prepare([*raw, call], session_id="s")
    with pytest.raises(InvalidMessages, match="p1"):
        mgr.prepare([*raw, call, {"role": "user", "content": "never mind"}], session_id="s")


def test_the_store_records_each_turn_by_appending_only_its_new_messages(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    mgr = _mgr(store=store)
    raw = list(_head())
    out: list[Message] = []
    for turn in _turns(16):
        raw = [*raw, *turn]
        out = mgr.prepare(list(raw), session_id="s")
    assert mgr.status("s")["store_errors"] == 0
    assert store.history("s") == out  # the tip is the working context
    kinds = [e.kind for e in store.events("s")]
    assert "compaction" in kinds
    assert kinds.count("append") >= len(kinds) - 2 * kinds.count("compaction") - 1
    originals = store.originals("s")
    assert [m for m in originals if m.get("role") == "tool"] == [m for m in raw if m.get("role") == "tool"]
    store.close()


def test_session_history_maps_raw_indices_through_compactions() -> None:
    h = SessionHistory()
    msgs: list[Message] = [{"role": "system", "content": "s"}, *({"role": "user", "content": f"u{i}"} for i in range(6))]
    t = h.begin(msgs)
    assert t.kind == "first" and t.base == 0
    compacted = [msgs[0], {"role": "user", "content": "[summary]"}, *msgs[4:]]
    h.finish(t, t.messages, compacted)
    assert h.r0 == 4 and h.wpos == [2, 3, 4]
    more = [*msgs, {"role": "user", "content": "u6"}]
    t = h.begin(list(more))
    assert t.kind == "resend" and t.messages == [*compacted, more[-1]] and t.base == len(compacted)
    h.finish(t, t.messages, t.messages)
    t = h.begin([*more[:5], {"role": "user", "content": "other"}])  # truncated at raw 5 (verbatim)
    assert t.kind == "branch" and t.messages == [*compacted[:3], {"role": "user", "content": "other"}]
    t = h.begin([msgs[0], {"role": "user", "content": "edited"}])  # changed at raw 1 (compacted)
    assert t.kind == "fresh" and t.reset_engine


def test_a_turn_that_fails_is_retried_without_duplicating_the_store(tmp_path: Path) -> None:
    from ctxengine.engine import ContextEngine
    from ctxengine.errors import EngineError

    class Breaks(ContextEngine):
        broken = False

        @property
        def name(self) -> str:
            return "breaks"

        def update_from_response(self, usage: Any) -> None:
            self._record_usage(usage)

        def should_compress(self, prompt_tokens: int | None = None) -> bool:
            return self.broken

        def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
            return []  # breaks rule 1 when it runs

    engine = Breaks(context_length=WINDOW)
    store = SqliteStore(tmp_path / "s.db")
    mgr = ContextManager(Config(), model="gpt-4o", context_length=WINDOW, store=store, engine_factory=lambda: engine)
    raw = list(_head())
    turns = _turns(3)
    for turn in turns[:2]:
        raw = [*raw, *turn]
        mgr.prepare(list(raw), session_id="s")
    engine.broken = True
    with pytest.raises(EngineError):
        mgr.prepare([*raw, *turns[2]], session_id="s")
    engine.broken = False
    out = mgr.prepare([*raw, *turns[2]], session_id="s")
    assert store.history("s") == out == [*raw, *turns[2]]
    store.close()


class _Folding:
    """A worst case for resurrection: folds old messages into a summary quoting all their words,
    and carries its previous summary into the next one (as an iterative summarizer does)."""

    @staticmethod
    def factory() -> Any:
        from ctxengine.engine import ContextEngine

        class Folding(ContextEngine):
            def __init__(self) -> None:
                super().__init__(context_length=WINDOW)
                self.previous = ""

            @property
            def name(self) -> str:
                return "folding"

            def update_from_response(self, usage: Any) -> None:
                self._record_usage(usage)

            def should_compress(self, prompt_tokens: int | None = None) -> bool:
                return False

            def should_compress_preflight(self, messages: list[Message]) -> bool:
                return len(messages) > 9

            def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
                head, old, tail = messages[:1], messages[1:-4], messages[-4:]
                while tail and tail[0].get("role") != "user":  # keep the tail's turns whole
                    old, tail = [*old, tail[0]], tail[1:]
                if not old:
                    return messages
                self.previous = " ".join([self.previous, *(content_text(m.get("content")) for m in old)]).strip()
                return [*head, {"role": "user", "content": f"[summary] {self.previous}"}, *tail]

            def on_session_reset(self) -> None:
                self.previous = ""

        return Folding()


def test_no_sequence_of_appends_retries_and_edits_resurrects_a_dropped_word() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    ops = st.lists(st.tuples(st.sampled_from(["add", "add", "add", "truncate", "edit"]), st.integers(0, 10_000)), min_size=1, max_size=40)

    @settings(max_examples=60, deadline=None)
    @given(st.integers(8, 25), ops)
    def run(grow: int, steps: list[tuple[str, int]]) -> None:
        mgr = ContextManager(Config(), model="gpt-4o", context_length=WINDOW, engine_factory=_Folding.factory)
        raw: list[Message] = [{"role": "system", "content": "sys"}]
        word = 0
        for op, n in [("add", 0)] * grow + steps:
            if op == "truncate" and len(raw) > 2:
                raw = raw[: 1 + n % (len(raw) - 1)]
            elif op == "edit" and len(raw) > 2:
                i = 1 + n % (len(raw) - 1)
                word += 1
                raw = [*raw[:i], {"role": "user", "content": f"w{word}"}]
            else:
                word += 1
                raw = [*raw, {"role": "user", "content": f"w{word}"}]
            out = mgr.prepare(list(raw), session_id="p")
            said = {w for m in raw for w in content_text(m.get("content")).split()}
            shown = {w for m in out for w in content_text(m.get("content")).split() if w != "[summary]"}
            assert shown <= said, f"resurrected: {sorted(shown - said)}"
            assert content_text(out[-1].get("content")) == content_text(raw[-1].get("content"))

    run()


def test_record_returns_the_ids_of_the_whole_history_while_writing_only_the_new_messages(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    h = SessionHistory()
    raw = list(_head())
    for turn in _turns(4):
        raw = [*raw, *turn]
        t = h.begin(list(raw))
        ids = h.record(store, "s", t, t.messages)
        h.finish(t, t.messages, t.messages)
        assert ids == store.history_ids("s")
        assert t.kind == "first" or t.base == len(raw) - len(turn)
    assert [e.kind for e in store.events("s")] == ["messages", "append", "append", "append"]
    store.close()


def test_the_planner_inputs_kept_turn_by_turn_equal_a_full_recount() -> None:
    import itertools

    from ctxengine.caching import _turn_starts, plan_breakpoints
    from ctxengine.messages import is_summary
    from ctxengine.tokens import estimate_message_tokens

    mgr = _mgr()
    raw = list(_head())
    seen_summary = False
    for turn in _turns(18):
        raw = [*raw, *turn]
        out = mgr.prepare(list(raw), session_id="s")
        known = mgr._session("s").history.planner_inputs(out)
        assert known is not None
        sums, stable, turns = known
        assert sums == list(itertools.accumulate(estimate_message_tokens(m) for m in out))
        assert stable == max((i for i, m in enumerate(out) if is_summary(m)), default=-1)
        seen_summary = seen_summary or stable >= 0
        assert plan_breakpoints(out, prefix_tokens=sums, stable=stable) == plan_breakpoints(out)
        assert turns == _turn_starts(out)
        previous = mgr._session("s").last_request
        expected = plan_breakpoints(out, min_cache_tokens=mgr.profile.min_cache_tokens, native_anthropic=mgr.caching.native_anthropic, previous=previous)
        assert mgr.breakpoints(out, session_id="s") == expected
    assert seen_summary  # the sums followed a compaction too
    assert mgr._session("s").history.planner_inputs([*out, {"role": "user", "content": "x"}]) is None


def test_engine_tool_results_the_manager_added_stay_when_the_raw_history_is_resent() -> None:
    import json

    from ctxengine.engine import ContextEngine

    class Tools(ContextEngine):
        @property
        def name(self) -> str:
            return "tools"

        def update_from_response(self, usage: Any) -> None:
            self._record_usage(usage)

        def should_compress(self, prompt_tokens: int | None = None) -> bool:
            return False

        def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
            return messages

        def get_tool_schemas(self) -> list[dict[str, Any]]:
            return [{"name": "recall", "description": "d", "parameters": {"type": "object", "properties": {}}}]

        def handle_tool_call(self, name: str, args: Any, **kwargs: Any) -> str:
            return json.dumps({"found": "it"})

    mgr = ContextManager(Config(), model="gpt-4o", context_length=WINDOW, engine_factory=Tools)
    call: Message = {"role": "assistant", "content": None, "tool_calls": [{"id": "r1", "type": "function", "function": {"name": "recall", "arguments": "{}"}}]}
    raw = [*_head(), call]
    out = mgr.prepare(list(raw), session_id="s")
    assert out[-1] == {"role": "tool", "tool_call_id": "r1", "content": json.dumps({"found": "it"})}
    # the client never saw the engine's answer: its raw history lacks it, and is still recognised
    raw = [*raw, {"role": "assistant", "content": "found it"}, {"role": "user", "content": "good"}]
    out2 = mgr.prepare(list(raw), session_id="s")
    assert out2 == [*out, *raw[-2:]]


def test_each_message_is_estimated_once_per_session_however_long_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctxengine.tokens as tokens_module
    from ctxengine.history import TurnInput
    from ctxengine.tokens import estimate_message_tokens

    estimated: list[int] = []

    def counting(m: Message) -> int:
        estimated.append(id(m))
        return estimate_message_tokens(m)

    # the session's per-message counts (ctxengine.tokens.MessageTokens) take the estimate when built
    monkeypatch.setattr(tokens_module, "estimate_message_tokens", counting)
    h = SessionHistory()
    working = _head()
    h.finish(TurnInput("first", working, 0, 0), working, working)
    for turn in _turns(300, size=2):  # far past the memo's floor of 256 entries
        given = [*working, *turn]
        t = h.begin(given)
        h.finish(t, t.messages, t.messages)
        working = t.messages
    assert len(estimated) == len(set(estimated)) == len(working)
    # the planner's fallback (a list that is not the working context) finds them memoised too
    assert h.message_tokens(working[1:]) == [estimate_message_tokens(m) for m in working[1:]]
    assert len(estimated) == len(working)


def test_asking_a_resending_caller_about_the_raw_history_first_changes_no_turn() -> None:
    """After a resend the raw history is compared first when no list can extend both it and the
    working context: every turn maps exactly as with the original order (continue, then resend),
    for callers that resend (decoded again or not), keep the prepared list, truncate or edit."""
    import json as _json

    from hypothesis import given, settings
    from hypothesis import strategies as st

    ops = st.lists(
        st.tuples(st.sampled_from(["resend", "resend", "json", "prepared", "truncate", "edit"]), st.integers(0, 10_000)), min_size=1, max_size=40
    )

    @settings(max_examples=60, deadline=None)
    @given(st.integers(4, 20), ops)
    def run(grow: int, steps: list[tuple[str, int]]) -> None:
        mgr = ContextManager(Config(), model="gpt-4o", context_length=WINDOW, engine_factory=_Folding.factory)
        raw: list[Message] = [{"role": "system", "content": "sys"}]
        out: list[Message] = []
        for word, (op, n) in enumerate([("resend", 0)] * grow + steps, start=1):
            msg = {"role": "user", "content": f"w{word}"}
            if op == "truncate" and len(raw) > 2:
                raw = raw[: 1 + n % (len(raw) - 1)]
            elif op == "edit" and len(raw) > 2:
                raw = [*raw[: 1 + n % (len(raw) - 1)], msg]
            else:
                raw = [*raw, msg]
            given_ = [*out, msg] if op == "prepared" and out else _json.loads(_json.dumps(raw)) if op == "json" else list(raw)
            if op == "prepared" and out:
                raw = [*out, msg]  # a prepared-list caller: its history is what it was given back
            h = mgr._session("p").history
            kept = h._last_kind
            h._last_kind = None  # the original order: the working context first
            ref = h.begin(given_)
            h._last_kind = kept
            got = h.begin(given_)
            assert (got.kind, got.messages, got.base, got.caller_start, got.pending, got.pending_raw, got.pending_r0) == (
                ref.kind, ref.messages, ref.base, ref.caller_start, ref.pending, ref.pending_raw, ref.pending_r0,
            )
            out = mgr.prepare(given_, session_id="p")

    run()


def test_the_token_memo_stays_bounded_by_the_working_context() -> None:
    h = SessionHistory()
    working = _head()
    h.finish(TurnInput("first", working, 0, 0), working, working)
    limit = 4 * len(h.working) + 256
    for k in range(2_000):  # messages asked once each (the planner's fallback for other lists)
        h.message_tokens([{"role": "user", "content": f"m{k}"}])
        h.message_tokens(working)  # and the working context again: read only
        assert len(h.tokens.estimates) <= limit + 1
    assert all(m in h.tokens.estimates for m in working)  # the working context stays memoised


# -- cache markers are not edits (Claude Code moves its marker to the newest message each turn) --

_EPHEMERAL = [{"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"}, {"type": "ephemeral", "ttl": "5m"}]


def _marked_as_sent(history: list[Message], turn: int) -> list[Message]:
    """``history`` as a marker-placing client sends it on ``turn``: decoded anew, a marker (its
    ``ttl`` varying from turn to turn) on the newest message only, string content written as one
    marked text block, and on some turns a marker on the system prompt's block as well."""
    import json

    out: list[Message] = json.loads(json.dumps(history))
    marker = _EPHEMERAL[turn % len(_EPHEMERAL)]
    last = out[-1]
    content = last.get("content")
    if isinstance(content, str):
        last["content"] = [{"type": "text", "text": content, "cache_control": dict(marker)}]
    elif isinstance(content, list) and content:
        content[-1] = {**content[-1], "cache_control": dict(marker)}
    else:
        last["cache_control"] = dict(marker)
    if turn % 3 == 0:
        out[0] = {"role": "system", "content": [{"type": "text", "text": out[0]["content"], "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}
    return out


def test_without_markers_removes_only_transport_details_and_never_edits_the_input() -> None:
    from ctxengine.history import same_but_markers, without_markers

    plain: Message = {"role": "user", "content": "hi"}
    assert without_markers(plain) is plain
    marked: Message = {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}
    assert without_markers(marked) == plain and marked["content"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert same_but_markers(marked, plain)
    two: Message = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}, "cache_control": {}}]}
    assert without_markers(two) == {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]}
    # a tool result's nested blocks, a message-level marker, a tool call's marker
    nested: Message = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "r", "cache_control": {}}]}]}
    assert without_markers(nested) == {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "r"}]}]}
    call: Message = {"role": "assistant", "content": None, "cache_control": {}, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}, "cache_control": {}}]}
    assert without_markers(call) == {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    # text is content: another text, or a marker key inside a tool's arguments, is an edit
    assert not same_but_markers(marked, {"role": "user", "content": "ho"})
    args: Message = {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"cache_control": 1}'}}]}
    assert not same_but_markers(args, {**args, "tool_calls": [{**args["tool_calls"][0], "function": {"name": "f", "arguments": "{}"}}]})


def test_a_moved_marker_is_a_resend_and_the_working_context_carries_this_turns_markers() -> None:
    h = SessionHistory()
    base = [*_head(), *[m for t in _turns(3, size=2) for m in t]]
    first = _marked_as_sent(base[:3], 0)
    t = h.begin(first)
    h.finish(t, t.messages, t.messages)
    for n in range(4, len(base) + 1):
        sent = _marked_as_sent(base[:n], n)
        t = h.begin(sent)
        assert t.kind in ("continue", "resend") and t.base == n - 1  # only the newest message is new
        assert t.messages == sent  # every message as sent this turn, markers included
        h.finish(t, t.messages, t.messages)
        assert h.raw == sent and h.working == sent


def test_a_moved_marker_in_a_compacted_session_keeps_the_compaction() -> None:
    h = SessionHistory()
    msgs: list[Message] = [{"role": "system", "content": "s"}, *({"role": "user", "content": f"u{i}"} for i in range(6))]
    sent = _marked_as_sent(msgs, 1)
    t = h.begin(sent)
    compacted = [sent[0], {"role": "user", "content": "[summary]"}, *sent[4:]]
    h.finish(t, t.messages, compacted)
    more = _marked_as_sent([*msgs, {"role": "user", "content": "u6"}], 2)
    t = h.begin(more)
    assert t.kind == "resend" and t.base == len(compacted)
    # the summary stays; the verbatim messages are this turn's copies (the old newest one unmarked)
    assert t.messages == [compacted[0], compacted[1], *more[4:]]
    assert t.messages[len(compacted) - 1] == {"role": "user", "content": "u5"}


def test_a_real_edit_next_to_a_moved_marker_is_still_a_branch() -> None:
    h = SessionHistory()
    msgs: list[Message] = [{"role": "system", "content": "s"}, *({"role": "user", "content": f"u{i}"} for i in range(6))]
    t = h.begin(_marked_as_sent(msgs, 1))
    h.finish(t, t.messages, t.messages)
    edited = _marked_as_sent([*msgs[:5], {"role": "user", "content": "u4 edited"}, {"role": "user", "content": "u6"}], 2)
    t = h.begin(edited)
    assert t.kind == "branch" and t.messages == edited


def _claude_code_run(mgr: ContextManager, base: list[Message], start: int, stop: int, *, first_turn: int) -> tuple[list[Message], int]:
    """Turns ``start..stop`` of a marker-moving client through ``prepare``, the proxy's way:
    the quick turn first (``may_compact=False``), the full one only when it is refused.
    Returns the last context sent and how many turns were refused."""
    from ctxengine.manager import CompactionDue

    out: list[Message] = []
    refused = 0
    for n in range(start, stop + 1):
        sent = _marked_as_sent(base[:n], n)
        try:
            out = mgr.prepare(sent, session_id="s", defer_record=True, may_compact=n == first_turn)
        except CompactionDue:
            refused += 1
            out = mgr.prepare(sent, session_id="s", defer_record=True)
        mgr.flush_records("s")
    return out, refused


def test_a_marker_moving_client_takes_the_quick_turn_and_the_store_keeps_each_message_once(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    mgr = _mgr(store=store, window=200_000)
    base = [*_head(), *[m for t in _turns(12, size=3) for m in t]]
    out, refused = _claude_code_run(mgr, base, 3, 20, first_turn=3)
    assert refused == 0  # every appending turn was quick
    assert out == _marked_as_sent(base[:20], 20)  # sent as the client sent it: this turn's markers only
    assert store.get_session("s").stored == 20  # each message once, whatever its markers were
    assert store.history("s") == base[:20]  # recorded without the markers
    # a restart: a new manager resumes from the store, the resent history appends again
    mgr2 = _mgr(store=store, window=200_000)
    assert mgr2.resume_session("s")
    out2, refused2 = _claude_code_run(mgr2, base, 21, 24, first_turn=-1)
    # (the first turn after a resume records in full, but after the response as any turn that
    # continues the session: it is quick too)
    assert refused2 == 0 and out2 == _marked_as_sent(base[:24], 24)
    assert store.get_session("s").stored == 24
    store.close()


def test_after_a_restart_a_compacted_marker_moving_session_compacts_nothing_new(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    mgr = _mgr(store=store)
    base = [*_head(), *[m for t in _turns(30) for m in t]]
    stop = len(base) - 4
    out, _ = _claude_code_run(mgr, base, 3, stop, first_turn=3)
    compactions = mgr.counters("s")["compactions"]
    assert compactions >= 1
    stored = store.get_session("s").stored
    mgr2 = _mgr(store=store)
    assert mgr2.resume_session("s")
    again = _marked_as_sent(base[:stop], stop + 1)  # the same history, the markers moved
    out2 = mgr2.prepare(again, session_id="s", defer_record=True)  # (a resumed turn: the worker thread's call)
    assert mgr2.counters("s")["compactions"] == 0
    assert [without_markers_all(m) for m in out2] == [without_markers_all(m) for m in out]  # no more than before
    assert out2[-1] == again[-1]  # with this turn's marker
    mgr2.flush_records("s")
    assert store.get_session("s").stored == stored
    store.close()


def without_markers_all(m: Message) -> Message:
    from ctxengine.history import without_markers

    return dict(without_markers(m))


def test_recognising_a_moved_marker_looks_at_the_few_messages_that_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctxengine.history.markers as history_markers
    import ctxengine.history.session as history_module  # where SessionHistory calls it

    h = SessionHistory()
    base = [*_head(), *[m for t in _turns(100, size=1) for m in t]]
    t = h.begin(_marked_as_sent(base[:-1], 1))
    h.finish(t, t.messages, t.messages)
    calls: list[Any] = []
    real = history_module.without_markers

    def counting(m: Any) -> Any:
        calls.append(m)
        return real(m)

    monkeypatch.setattr(history_module, "without_markers", counting)
    monkeypatch.setattr(history_markers, "without_markers", counting)
    t = h.begin(_marked_as_sent(base, 2))  # the system prompt's marker went, the newest message's moved
    assert t.kind in ("continue", "resend") and t.base == len(base) - 1
    assert len(calls) <= 4 < len(base)  # two messages compared, not the whole history


def test_aiders_trailing_reminder_is_not_history_every_turn_appends(tmp_path: Path) -> None:
    # aider ends every request with a system reminder; the next request has the assistant's
    # answer and a new request where the reminder was, and the reminder at the end again
    from ctxengine.manager import CompactionDue

    store = SqliteStore(tmp_path / "s.db")
    mgr = _mgr(store=store, window=200_000)
    reminder: Message = {"role": "system", "content": "Reply with whole files."}
    history: list[Message] = [{"role": "system", "content": "Act as an expert developer."}, {"role": "user", "content": "Change the greeting"}, {"role": "assistant", "content": "Ok."}]
    refused = 0
    for k in range(12):
        history = [*history, {"role": "user", "content": f"request {k}"}]
        sent = json.loads(json.dumps([*history, reminder]))
        try:
            out = mgr.prepare(sent, session_id="s", defer_record=True, may_compact=k == 0)
        except CompactionDue:
            refused += 1
            out = mgr.prepare(sent, session_id="s", defer_record=True)
        assert out == sent  # the reminder at the end, where the client put it
        mgr.flush_records("s")
        history = [*history, {"role": "assistant", "content": f"answer {k}"}]
    assert refused == 0
    assert store.history("s") == sent
    # each message once, and each turn's reminder (after another message each time)
    assert store.get_session("s").stored == len(sent) - 1 + 12
    # a real edit of the history is still a branch
    t = mgr._sessions["s"].history.begin([*history[:3], {"role": "user", "content": "edited"}, reminder])
    assert t.kind == "branch"


def test_a_message_retold_with_a_tail_added_or_dropped() -> None:
    from ctxengine.history import same_but_tail

    base = {"role": "user", "content": "fix the bug"}
    told = {"role": "user", "content": "fix the bug\n\nReply with SEARCH/REPLACE blocks."}
    assert same_but_tail(base, told) and same_but_tail(told, base)
    parts = {"role": "user", "content": [{"type": "text", "text": "fix the bug"}, {"type": "image_url", "image_url": {"url": "u"}}]}
    assert same_but_tail(parts, {**parts, "content": [*parts["content"], {"type": "text", "text": "reminder"}]})
    assert same_but_tail({"role": "user", "content": [{"type": "text", "text": "fix the bug", "cache_control": {"type": "ephemeral"}}]}, told)
    assert not same_but_tail(base, {"role": "user", "content": "please fix the bug"})  # a head is no tail
    assert not same_but_tail(base, {"role": "assistant", "content": "fix the bug and more"})
    assert not same_but_tail(base, {"role": "user", "content": "fix the bug!", "name": "other"})
