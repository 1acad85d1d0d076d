"""The proxy's incremental reading of resent histories gives what a full conversion gives."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ctxengine.anthropic_adapter import anthropic_to_openai, openai_to_anthropic
from ctxengine.caching import apply_breakpoints
from ctxengine.history import same_but_markers, without_markers
from ctxengine.proxy.apis import has_cache_control
from ctxengine.proxy.incoming import IncomingHistory, TokenTally
from ctxengine.tokens import estimate_message_tokens

SYSTEM = [{"type": "text", "text": "You are an agent."}]
TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "fix the bug"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "look first", "signature": "sig1"}, {"type": "text", "text": "reading"}, {"type": "tool_use", "id": "t1", "name": "read", "input": {"p": "a.py"}}, {"type": "tool_use", "id": "t2", "name": "read", "input": {"p": "b.py"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "A"}, {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "B"}], "is_error": True}, {"type": "text", "text": "also check c.py"}]},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "t3", "name": "read", "input": {"p": "c.py"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t3", "content": "C"}]},
    {"role": "assistant", "content": "done"},
    {"role": "user", "content": [{"type": "text", "text": "thanks"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]},
]


def resent(n: int) -> list[dict[str, Any]]:
    return json.loads(json.dumps(TURNS[:n]))  # a fresh copy, as a client serialises it again


def test_each_turn_converts_like_the_whole_history() -> None:
    inc = IncomingHistory()
    previous: list[Any] = []
    for n in (1, 3, 5, 6, 7):
        msgs = resent(n)
        conv = inc.from_anthropic(SYSTEM, msgs)
        assert conv.messages == anthropic_to_openai(SYSTEM, msgs)
        # the part seen before is handed over as the same objects (the manager's memos hit)
        assert all(a is b for a, b in zip(conv.messages, previous, strict=False))
        previous = conv.messages


def test_an_edited_history_is_converted_again_from_the_edit() -> None:
    inc = IncomingHistory()
    inc.from_anthropic(SYSTEM, resent(5))
    edited = resent(5)
    edited[2]["content"][0]["content"] = "A, edited"
    conv = inc.from_anthropic("another system", edited)
    assert conv.messages == anthropic_to_openai("another system", edited)


def test_markers_written_back_equal_a_full_conversion_and_leave_other_messages_alone() -> None:
    inc = IncomingHistory()
    msgs = resent(7)
    body = {"model": "claude", "system": SYSTEM, "messages": msgs}
    original = copy.deepcopy(body)
    conv = inc.from_anthropic(SYSTEM, msgs)
    for indices in ([0, 3, 6], [0, len(conv.messages) - 1], [2, 5], [3, 4, 5]):
        sent = apply_breakpoints(conv.messages, indices, native_anthropic=True)
        out, rewritten = inc.with_markers(body, conv, conv.messages, indices, cache_ttl="5m", native_anthropic=True)
        system, full = openai_to_anthropic(sent)
        assert out["messages"] == full and out["system"] == system
        touched = {conv.owner[i] for i in indices}
        assert rewritten == sorted(touched)
        assert all(out["messages"][a] is msgs[a] for a in range(len(msgs)) if a not in touched)
    assert body == original
    assert conv.messages == anthropic_to_openai(SYSTEM, msgs)  # the context was not marked in place


def test_a_marker_where_it_was_last_turn_reuses_last_turns_message() -> None:
    inc = IncomingHistory()
    conv = inc.from_anthropic(SYSTEM, resent(5))
    first, _ = inc.with_markers({"system": SYSTEM, "messages": resent(5)}, conv, conv.messages, [0, 3], cache_ttl="5m", native_anthropic=True)
    msgs = resent(7)
    conv = inc.from_anthropic(SYSTEM, msgs)  # two more messages: the old ones are the same objects
    body = {"system": SYSTEM, "messages": msgs}
    last = len(conv.messages) - 1
    out, _ = inc.with_markers(body, conv, conv.messages, [0, 3, last], cache_ttl="5m", native_anthropic=True)
    a3 = conv.owner[3]
    assert out["system"] is first["system"] and out["messages"][a3] is first["messages"][a3]
    system, full = openai_to_anthropic(apply_breakpoints(conv.messages, [0, 3, last], native_anthropic=True))
    assert out["messages"] == full and out["system"] == system
    # another marker (the hour TTL) or another place in the group is converted again
    hour, _ = inc.with_markers(body, conv, conv.messages, [0, 3, last], cache_ttl="1h", native_anthropic=True)
    assert hour["system"] is not out["system"]
    assert (hour["system"], hour["messages"]) == openai_to_anthropic(apply_breakpoints(conv.messages, [0, 3, last], cache_ttl="1h", native_anthropic=True))
    # a history that changed there (new objects) is converted again too
    conv = IncomingHistory().from_anthropic(SYSTEM, resent(7))
    again, _ = inc.with_markers(body, conv, conv.messages, [0, 3, last], cache_ttl="1h", native_anthropic=True)
    assert again["messages"][a3] is not hour["messages"][a3] and again["messages"][a3] == hour["messages"][a3]


def test_owner_and_starts_match_a_fresh_conversion_turn_after_turn() -> None:
    # appended turns reuse last turn's lists; an edit, a dropped system prompt or a shorter
    # history must still give the indices a fresh conversion gives
    inc = IncomingHistory()
    steps: list[tuple[Any, list[dict[str, Any]]]] = [
        (SYSTEM, resent(3)),
        (SYSTEM, resent(5)),
        (SYSTEM, resent(7)),
        (None, resent(7)),
        ("another system", resent(4)),
    ]
    edited = resent(7)
    edited[4]["content"][0]["content"] = "C, edited"
    steps.append(("another system", edited))
    for system, msgs in steps:
        conv = inc.from_anthropic(system, msgs)
        fresh = IncomingHistory().from_anthropic(system, msgs)
        assert conv.messages == fresh.messages == anthropic_to_openai(system, msgs)
        assert (conv.system_index, conv.owner, conv.starts) == (fresh.system_index, fresh.owner, fresh.starts)
        assert all(conv.owner[start] == a for a, start in enumerate(conv.starts))
        assert conv.owner[: conv.system_index + 1] == ([-1] if system is not None else [])
        assert len(conv.owner) == len(conv.messages) and len(conv.starts) == len(msgs)


_PLAIN_SHAPES = st.one_of(
    st.text(max_size=12),  # a plain message (the empty string is not one)
    st.just([{"type": "text", "text": "a part"}]),
    st.just([{"type": "text", "text": "a part"}, {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]),
    st.just([{"type": "tool_result", "tool_use_id": "t9", "content": "r"}]),
    st.just([{"type": "tool_result", "tool_use_id": "t9", "content": "r"}, {"type": "text", "text": "and this"}]),
)


@given(
    st.lists(st.tuples(st.sampled_from(["user", "assistant"]), _PLAIN_SHAPES, st.booleans()), min_size=1, max_size=6),
    st.sets(st.integers(0, 12), max_size=3),
    st.sampled_from(["5m", "1h"]),
    st.booleans(),
)
def test_marked_messages_are_what_a_full_conversion_gives_whatever_their_shape(
    shapes: list[tuple[str, Any, bool]], picks: set[int], ttl: str, native: bool
) -> None:
    # a plain message (a string) is marked in place of its conversion: the bytes must not change
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    for role, content, extra in shapes:
        if isinstance(content, list) and content[0]["type"] == "tool_result":
            if msgs[-1]["role"] != "assistant":
                msgs.append({"role": "assistant", "content": [{"type": "tool_use", "id": "t9", "name": "read", "input": {}}]})
            role = "user"
        elif role == msgs[-1]["role"]:
            msgs.append({"role": "assistant" if role == "user" else "user", "content": "between"})
        msg: dict[str, Any] = {"role": role, "content": copy.deepcopy(content)}
        if extra:
            msg["x-client-key"] = 1  # a key the adapter carries: not a plain message
        msgs.append(msg)
    inc = IncomingHistory()
    conv = inc.from_anthropic(SYSTEM, msgs)
    indices = sorted({i % len(conv.messages) for i in picks} | {len(conv.messages) - 1})
    body = {"model": "claude", "system": SYSTEM, "messages": msgs}
    original = copy.deepcopy(body)
    out, _ = inc.with_markers(body, conv, conv.messages, indices, cache_ttl=ttl, native_anthropic=native)
    system, full = openai_to_anthropic(apply_breakpoints(conv.messages, indices, cache_ttl=ttl, native_anthropic=native))
    assert json.dumps(out["messages"]) == json.dumps(full)
    assert json.dumps(out["system"]) == json.dumps(system)
    assert body == original


@given(st.lists(st.tuples(st.sampled_from(["append", "edit", "truncate", "same"]), st.integers(0, 30), st.text(max_size=40)), max_size=25))
def test_a_token_tally_counts_what_a_full_estimate_counts(steps: list[tuple[str, int, str]]) -> None:
    tally = TokenTally()
    msgs: list[dict[str, Any]] = []
    for op, k, text in steps:
        if op == "append":
            msgs = [*msgs, *({"role": "user", "content": text * (i + 1)} for i in range(k % 4 + 1))]
        elif op == "edit" and msgs:
            msgs = list(msgs)
            msgs[k % len(msgs)] = {"role": "assistant", "content": text}
        elif op == "truncate":
            msgs = msgs[: k % (len(msgs) + 1)]
        assert tally.count(msgs) == sum(estimate_message_tokens(m) for m in msgs)


@given(st.lists(st.tuples(st.sampled_from(["grow", "mark", "compact", "edit", "cut", "ttl"]), st.integers(0, 40)), min_size=1, max_size=12))
def test_the_context_sent_converts_like_a_full_conversion_turn_after_turn(steps: list[tuple[str, int]]) -> None:
    # a working context as the manager hands it over after compactions: grown with the same
    # objects, markers moved, a middle replaced by a summary, a message edited, the end cut
    full = anthropic_to_openai(SYSTEM, resent(7) + resent(7) + resent(7))
    inc = IncomingHistory()
    ctx, marks, ttl, nxt = full[:6], [0, 5], "5m", 6
    for op, k in steps:
        if op == "grow":  # the history's next messages (each object once in a context)
            ctx, nxt = [*ctx, *full[nxt : nxt + k % 5 + 1]], min(len(full), nxt + k % 5 + 1)
            marks = [0, len(ctx) - 1]
        elif op == "mark":
            marks = sorted({0, k % len(ctx), len(ctx) - 1})
        elif op == "compact" and len(ctx) > 4:
            cut = 1 + k % (len(ctx) - 3)
            ctx = [ctx[0], {"role": "user", "content": f"summary of {cut} messages"}, *ctx[cut + 1 :]]
        elif op == "edit" and len(ctx) > 1:
            i = 1 + k % (len(ctx) - 1)
            ctx = [*ctx[:i], copy.deepcopy(ctx[i]), *ctx[i + 1 :]]
        elif op == "cut":
            ctx = ctx[: max(1, len(ctx) - k % 4)]
        elif op == "ttl":
            ttl = "1h" if ttl == "5m" else "5m"
        marks = [i for i in marks if i < len(ctx)]
        try:
            expected: Any = openai_to_anthropic(apply_breakpoints(ctx, marks, cache_ttl=ttl, native_anthropic=True))
        except Exception as exc:  # a cut may leave a context the converter refuses: so must this
            expected = type(exc)
        try:
            got: Any = inc.outgoing_anthropic(ctx, marks, cache_ttl=ttl, native_anthropic=True)
        except Exception as exc:
            got = type(exc)
        assert got == expected


# -- a client's cache markers are not edits (Claude Code's pattern) --------------------------------


def _conversation(turns: int) -> list[dict[str, Any]]:
    """An Anthropic agent conversation: a task, then tool calls and results, a user nudge every 4."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "fix the failing build, please"}]
    for k in range(turns):
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"step {k}"}, {"type": "tool_use", "id": f"t{k}", "name": "run", "input": {"k": k}}]})
        result: list[dict[str, Any]] = [{"type": "tool_result", "tool_use_id": f"t{k}", "content": f"output {k}: " + "ok " * 40}]
        if k % 4 == 3:
            result.append({"type": "text", "text": f"keep going after {k}"})
        msgs.append({"role": "user", "content": result})
    return msgs


_CC_SYSTEM = [{"type": "text", "text": "You are Claude Code."}, {"type": "text", "text": "Be careful with the repository."}]


def _as_claude_code_sends(history: list[dict[str, Any]], turn: int) -> tuple[Any, list[dict[str, Any]]]:
    """``history`` as Claude Code sends it on ``turn``: decoded anew, its marker on the newest
    message's last block (string content becomes a marked text block), its ``ttl`` varying, and
    on some turns a marker on the system prompt's last block."""
    msgs: list[dict[str, Any]] = json.loads(json.dumps(history))
    marker: dict[str, Any] = {"type": "ephemeral"} if turn % 2 else {"type": "ephemeral", "ttl": "1h"}
    last = msgs[-1]
    if isinstance(last["content"], str):
        last["content"] = [{"type": "text", "text": last["content"], "cache_control": marker}]
    else:
        last["content"][-1] = {**last["content"][-1], "cache_control": marker}
    system: list[dict[str, Any]] = json.loads(json.dumps(_CC_SYSTEM))
    if turn % 3 != 1:
        system[-1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    return system, msgs


def _plain(value: Any) -> Any:
    return without_markers({"content": value}, keep_shape=True)["content"]


def test_a_moved_marker_keeps_last_turns_conversion_and_converts_only_the_new_messages() -> None:
    inc = IncomingHistory()
    history = _conversation(6)
    previous: list[Any] = []
    for n in range(1, len(history) + 1):
        system, msgs = _as_claude_code_sends(history[:n], n)
        conv = inc.from_anthropic(system, msgs)
        # what the manager gets: the history without the client's markers, as a full conversion gives it
        assert conv.messages == anthropic_to_openai(_plain(system), [{**m, "content": _plain(m["content"])} for m in msgs])
        assert not has_cache_control(conv.messages)
        # last turn's objects, but for a string that came as a marked text block last turn
        reshaped = {i for i, m in enumerate(previous) if isinstance(m.get("content"), list) and m.get("role") == "user" and len(m["content"]) == 1}
        assert all(a is b for i, (a, b) in enumerate(zip(conv.messages, previous, strict=False)) if i not in reshaped)
        previous = conv.messages


def test_claude_codes_moving_marker_takes_the_quick_turn_and_the_store_keeps_each_message_once(tmp_path: Any) -> None:
    from ctxengine.config import Config
    from ctxengine.manager import CompactionDue, ContextManager
    from ctxengine.store import SqliteStore

    store = SqliteStore(tmp_path / "s.db")

    def manager() -> ContextManager:
        return ContextManager(Config(), model="claude-sonnet-4.5", provider="anthropic", context_length=200_000, store=store)

    def run(mgr: ContextManager, inc: IncomingHistory, start: int, stop: int) -> int:
        refused = 0
        for n in range(start, stop + 1):
            system, msgs = _as_claude_code_sends(history[:n], n)
            conv = inc.from_anthropic(system, msgs)
            try:
                out = mgr.prepare(conv.messages, session_id="s", defer_record=True, may_compact=False)
            except CompactionDue:
                refused += 1
                out = mgr.prepare(conv.messages, session_id="s", defer_record=True)
            assert out == conv.messages  # unchanged: the proxy sends the client's body as it came
            mgr.flush_records("s")
        return refused

    history = _conversation(10)
    inc = IncomingHistory()
    mgr = manager()
    assert run(mgr, inc, 1, 1) == 0  # a first turn is quick too: it records in full, after the response
    assert store.get_session("s").stored == len(anthropic_to_openai(_CC_SYSTEM, history[:1]))
    assert run(mgr, inc, 2, len(history) - 4) == 0  # every appending turn is quick
    stored = store.get_session("s").stored
    assert stored == len(anthropic_to_openai(_CC_SYSTEM, history[: len(history) - 4]))  # each message once
    # a restart: a new manager and a new incoming history resume from the store
    mgr2, inc2 = manager(), IncomingHistory()
    assert mgr2.resume_session("s")
    assert run(mgr2, inc2, len(history) - 3, len(history)) == 0  # the resumed turn too (it records in full, after the response)
    assert store.get_session("s").stored == len(anthropic_to_openai(_CC_SYSTEM, history))
    assert mgr2.counters("s")["compactions"] == 0
    store.close()


def test_a_context_converted_in_full_carries_the_clients_markers_of_this_turn_only() -> None:
    inc = IncomingHistory()
    history = _conversation(8)
    for n in range(6, len(history) + 1):
        system, msgs = _as_claude_code_sends(history[:n], n)
        conv = inc.from_anthropic(system, msgs)
        a = n - 2 if (n - 2) % 2 == 1 else n - 3  # the last assistant message but one
        tail = conv.messages[conv.starts[a] :]
        # a compacted working context, as the manager returns it: a summary, then the verbatim tail
        ctx = [conv.messages[0], {"role": "user", "content": "summary of the earlier turns"}, *tail]
        out_system, out_messages = inc.outgoing_anthropic(ctx, [], cache_ttl="5m", native_anthropic=True)
        assert out_system == system  # the client's system prompt, its marker as sent this turn
        assert out_messages[1:] == msgs[a:]  # the verbatim tail exactly as the client sent it
        assert not has_cache_control(out_messages[:-1])  # no marker left from an earlier turn
        # turn after turn, the same as what a proxy that saw only this request sends
        fresh = IncomingHistory()
        fconv = fresh.from_anthropic(system, msgs)
        fctx = [fconv.messages[0], ctx[1], *fconv.messages[fconv.starts[a] :]]
        assert fresh.outgoing_anthropic(fctx, [], cache_ttl="5m", native_anthropic=True) == (out_system, out_messages)


def test_a_system_prompt_the_engine_extended_keeps_the_clients_markers_on_the_clients_blocks() -> None:
    inc = IncomingHistory()
    history = _conversation(4)
    system, msgs = _as_claude_code_sends(history, 2)  # the system prompt's last block marked
    conv = inc.from_anthropic(system, msgs)
    note = {"type": "text", "text": "[Note: earlier turns were compacted]"}
    rewritten = {"role": "system", "content": [*conv.messages[0]["content"], note]}
    ctx = [rewritten, {"role": "user", "content": "summary"}, *conv.messages[conv.starts[len(msgs) - 2] :]]
    out_system, out_messages = inc.outgoing_anthropic(ctx, [], cache_ttl="5m", native_anthropic=True)
    assert out_system == [*system, note]  # the client's blocks as sent (its marker), then the note
    assert out_messages[-1] == msgs[-1]
    # a system prompt that no longer starts with the client's blocks gets no marker of theirs
    other = {"role": "system", "content": [{"type": "text", "text": "another prompt"}]}
    out_system, _ = inc.outgoing_anthropic([other, *ctx[1:]], [], cache_ttl="5m", native_anthropic=True)
    assert not has_cache_control(out_system)


def _restart_run(tmp_path: Any, marked: bool) -> tuple[int, list[Any], list[Any], Any, int, int, str, int]:
    """A compacted session of a Claude Code-like client, a restart, the same history resent."""
    from ctxengine.config import Config
    from ctxengine.manager import ContextManager
    from ctxengine.store import SqliteStore

    store = SqliteStore(tmp_path / f"s{marked}.db")

    def manager() -> ContextManager:
        return ContextManager(Config(), model="claude-sonnet-4.5", provider="anthropic", context_length=5000, store=store)

    def sends(n: int, turn: int) -> tuple[Any, list[dict[str, Any]]]:
        if marked:
            return _as_claude_code_sends(history[:n], turn)
        return json.loads(json.dumps(_CC_SYSTEM)), json.loads(json.dumps(history[:n]))

    history = _conversation(110)
    mgr, inc = manager(), IncomingHistory()
    out: list[Any] = []
    stop = len(history) - 4  # requests end with the user's tool results, as a client's do
    for n in range(1, stop + 1, 2):
        system, msgs = sends(n, n)
        out = mgr.prepare(inc.from_anthropic(system, msgs).messages, session_id="s", defer_record=True)
        mgr.flush_records("s")
    compactions, stored = mgr.counters("s")["compactions"], store.get_session("s").stored
    mgr2, inc2 = manager(), IncomingHistory()
    assert mgr2.resume_session("s")
    system, msgs = sends(stop, stop + 1)  # the same history again, the markers moved
    conv = inc2.from_anthropic(system, msgs)
    kind = mgr2._sessions["s"].history.begin(conv.messages).kind
    out2 = mgr2.prepare(conv.messages, session_id="s", defer_record=True)
    mgr2.flush_records("s")
    sent = inc2.outgoing_anthropic(out2, [], cache_ttl="5m", native_anthropic=True)
    assert sent[1][-1] == msgs[-1]  # this turn's marker (or none), as the client sent it
    after = mgr2.counters("s")["compactions"]
    grown = store.get_session("s").stored - stored
    store.close()
    return compactions, out, out2, sent, after, grown, kind, len(json.dumps(sent))


def test_after_a_restart_a_marker_moving_client_resumes_as_one_without_markers(tmp_path: Any) -> None:
    marked = _restart_run(tmp_path, True)
    plain = _restart_run(tmp_path, False)
    compactions, _, out2, _, after, grown, kind, _ = marked
    assert compactions >= 1 and compactions == plain[0]  # the same compactions before the restart
    assert kind == plain[6] == "resend"  # the resent history is recognised after the restart
    assert after == plain[4]  # compacts no more than a client without markers (the engine's own choice)
    assert len(out2) == len(plain[2]) and all(same_but_markers(a, b) for a, b in zip(out2, plain[2], strict=True))
    assert grown == plain[5]  # the store grows as it does without markers
    assert marked[7] <= plain[7] + 200  # sends no more than without markers (its markers aside)


def test_through_the_proxy_a_moving_marker_is_planned_inline_and_sent_as_the_client_sent_it(tmp_path: Any) -> None:
    # the measured regression: every turn was planned in a worker thread, the store kept 2.3x rows
    import httpx2 as httpx
    from prometheus_client.parser import text_string_to_metric_families

    from ctxengine.config import Config
    from ctxengine.proxy import ProxyServer
    from ctxengine.store import SqliteStore
    from ctxengine.testing.stub_server import StubServer

    history = _conversation(10)
    with StubServer() as stub:
        config = Config().with_overrides(
            proxy={"openai_base_url": stub.openai_base_url, "anthropic_base_url": stub.anthropic_base_url}, store={"path": str(tmp_path / "s.db")}
        )
        with ProxyServer(config) as proxy:
            for n in range(1, len(history) + 1, 2):
                system, msgs = _as_claude_code_sends(history[:n], n)
                body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "system": system, "messages": msgs}
                r = httpx.post(proxy.anthropic_base_url + "/v1/messages", json=body, headers={"x-api-key": "sk-k", "anthropic-version": "2023-06-01"})
                assert r.status_code == 200, r.text
                sent = stub.requests[-1].body
                assert sent["messages"] == msgs and sent["system"] == system  # the client's markers, as sent
            plans = {
                s.labels["where"]: s.value
                for family in text_string_to_metric_families(httpx.get(proxy.url + "/metrics").text)
                for s in family.samples
                if s.name == "ctxengine_proxy_plans_total"
            }
    # every turn inline, the first too (its session opened in a worker thread, its write after the response)
    assert plans.get("worker", 0.0) == 0.0 and plans["inline"] == float(len(range(1, len(history) + 1, 2)))
    store = SqliteStore(tmp_path / "s.db")
    (session,) = store.list_sessions()
    assert session.stored == session.length == len(anthropic_to_openai(_CC_SYSTEM, history))  # each message once
    store.close()
