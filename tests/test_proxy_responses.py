"""The Responses API adapter: input items as canonical messages and back (byte for byte),
engine edits written where they were made, remote compaction tokens, the recall round trip,
and the stream tracker on the event sequences the API sends."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxengine.engine import normalize_usage
from ctxengine.messages import content_text, validate
from ctxengine.proxy.apis import ToolCall
from ctxengine.proxy.responses import (
    COMPACTION_PREFIX,
    META_KEY,
    RESPONSES,
    ResponsesHistory,
    compact_input,
    compact_reply,
    decode_compaction,
    encode_compaction,
    session_hint,
)
from ctxengine.proxy.streams import Event, EventSplitter, ResponsesStream

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def roundtrip(body: dict[str, Any]) -> dict[str, Any]:
    msgs = RESPONSES.messages(body)
    # the store keeps messages as JSON: what comes back from JSON must write the same items
    msgs = orjson.loads(orjson.dumps(msgs))
    return RESPONSES.with_messages(body, msgs)


def errors(messages: list[dict[str, Any]]) -> list[Any]:
    return validate(messages, errors_only=True)


# -- strategies -------------------------------------------------------------------------------

texts = st.text(max_size=24)
ids = st.text(alphabet="abcdef0123456789", min_size=4, max_size=10)


@st.composite
def shuffled(draw: st.DrawFn, required: dict[str, Any], optional: dict[str, st.SearchStrategy[Any]]) -> dict[str, Any]:
    """A dict with the required keys, some optional ones, in a drawn key order."""
    pairs = list(required.items())
    for key, strategy in optional.items():
        if draw(st.booleans()):
            pairs.append((key, draw(strategy)))
    order = draw(st.permutations(pairs))
    return dict(order)


input_part = st.one_of(
    st.builds(lambda t: {"type": "input_text", "text": t}, texts),
    st.builds(lambda u, d: {"type": "input_image", "image_url": u, "detail": d}, st.just("data:image/png;base64,iVBO"), st.sampled_from(["auto", "low"])),
    st.builds(lambda f: {"type": "input_image", "file_id": f}, ids),
    st.builds(lambda f, n: {"type": "input_file", "file_id": f, "filename": n}, ids, texts),
)
output_part = st.one_of(
    st.builds(lambda t: {"type": "output_text", "text": t, "annotations": []}, texts),
    st.builds(lambda t: {"type": "output_text", "text": t, "annotations": [], "logprobs": []}, texts),
    st.builds(lambda t: {"type": "refusal", "refusal": t}, texts),
)


@st.composite
def input_message(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["user", "user", "developer", "system"]))
    content = draw(st.one_of(texts, st.lists(input_part, max_size=3)))
    return draw(shuffled({"role": role, "content": content}, {"type": st.just("message"), "id": ids.map("msg_".__add__), "status": st.just("completed")}))


@st.composite
def assistant_message(draw: st.DrawFn) -> dict[str, Any]:
    content = draw(st.one_of(texts, st.lists(output_part, min_size=1, max_size=3)))
    optional = {"type": st.just("message"), "id": ids.map("msg_".__add__), "status": st.just("completed"), "phase": st.sampled_from(["commentary", "final_answer"])}
    return draw(shuffled({"role": "assistant", "content": content}, optional))


reasoning = st.builds(
    lambda i, summary, enc, with_enc: {"type": "reasoning", "id": "rs_" + i, "summary": [{"type": "summary_text", "text": s} for s in summary], **({"encrypted_content": enc} if with_enc else {})},
    ids,
    st.lists(texts, max_size=2),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=", min_size=8, max_size=60),
    st.booleans(),
)
json_args = st.dictionaries(st.sampled_from(["cmd", "path", "n", "q"]), st.one_of(texts, st.integers(-5, 500), st.booleans())).map(lambda d: json.dumps(d))


@st.composite
def call(draw: st.DrawFn, call_id: str) -> dict[str, Any]:
    kind = draw(st.sampled_from(["function_call", "function_call", "custom_tool_call", "local_shell_call", "shell_call", "apply_patch_call", "computer_call"]))
    opt_id = {"id": ids.map("fc_".__add__), "status": st.just("completed")}
    if kind == "function_call":
        args = draw(st.one_of(json_args, texts))
        return draw(shuffled({"type": kind, "call_id": call_id, "name": draw(st.sampled_from(["shell", "read", "ctx_grep"])), "arguments": args}, opt_id))
    if kind == "custom_tool_call":
        return draw(shuffled({"type": kind, "call_id": call_id, "name": "apply_patch", "input": draw(texts)}, opt_id))
    if kind == "apply_patch_call":
        op = {"type": "update_file", "path": draw(texts), "diff": draw(texts)}
        return draw(shuffled({"type": kind, "call_id": call_id, "operation": op}, opt_id))
    action = {"type": "exec", "command": draw(st.lists(texts, min_size=1, max_size=3)), "timeout_ms": draw(st.integers(0, 9999))}
    return draw(shuffled({"type": kind, "id": "lsh_" + call_id, "call_id": call_id, "action": action, "status": "completed"}, {}))


_ANSWERS = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "local_shell_call": "local_shell_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "computer_call": "computer_call_output",
}


@st.composite
def answer(draw: st.DrawFn, call_item: dict[str, Any]) -> dict[str, Any]:
    kind = _ANSWERS[call_item["type"]]
    if kind in ("function_call_output", "custom_tool_call_output") and draw(st.booleans()):
        kind = draw(st.sampled_from(["function_call_output", kind]))  # Codex answers shells this way
    cid = call_item["call_id"]
    if kind in ("function_call_output", "custom_tool_call_output"):
        output: Any = draw(st.one_of(texts, st.lists(st.one_of(input_part), max_size=2)))
    elif kind == "shell_call_output":
        output = [{"stdout": draw(texts), "stderr": draw(texts), "outcome": {"type": "exit", "exit_code": draw(st.integers(0, 2))}}]
    elif kind == "computer_call_output":
        output = {"type": "computer_screenshot", "image_url": "data:image/png;base64,AAAA"}
    else:
        output = draw(texts)
    return draw(shuffled({"type": kind, "call_id": cid, "output": output}, {"id": ids.map("fco_".__add__), "status": st.just("completed")}))


opaque = st.one_of(
    st.builds(lambda i: {"type": "item_reference", "id": "msg_" + i}, ids),
    st.builds(lambda e: {"type": "compaction", "id": "cmp_1", "encrypted_content": e}, st.text(alphabet="abcXYZ0123", min_size=4, max_size=40)),
    st.builds(lambda q: {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": q}}, texts),
    st.builds(lambda v: {"type": "ghost_snapshot", "ghost_commit": {"id": v}}, texts),
    st.builds(lambda v: {"type": "mcp_call", "id": "mcp_1", "name": "x", "arguments": "{}", "output": v, "server_label": "s"}, texts),
)


@st.composite
def conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Items as a client sends them: user turns and assistant turns (reasoning, text, calls,
    then their outputs in any order), with opaque items, unanswered calls and orphan outputs."""
    items: list[dict[str, Any]] = []
    counter = 0
    for _ in range(draw(st.integers(1, 6))):
        what = draw(st.sampled_from(["user", "assistant", "assistant", "opaque"]))
        if what == "user":
            items.append(draw(input_message()))
        elif what == "opaque":
            items.append(draw(opaque))
        else:
            turn: list[dict[str, Any]] = []
            calls = []
            for _ in range(draw(st.integers(0, 4))):
                part = draw(st.sampled_from(["reasoning", "text", "call", "call", "opaque"]))
                if part == "reasoning":
                    turn.append(draw(reasoning))
                elif part == "text":
                    turn.append(draw(assistant_message()))
                elif part == "opaque":
                    turn.append(draw(opaque))
                else:
                    counter += 1
                    c = draw(call(f"call_{counter}"))
                    turn.append(c)
                    calls.append(c)
            if not turn:
                turn.append(draw(assistant_message()))
            outputs = [draw(answer(c)) for c in calls if draw(st.integers(0, 9)) > 0]  # sometimes unanswered
            if draw(st.integers(0, 9)) == 0:
                outputs.append({"type": "function_call_output", "call_id": "call_orphan", "output": "lost"})
            outputs = list(draw(st.permutations(outputs)))
            interleave = draw(st.booleans())
            if outputs and interleave:
                outputs = [*outputs[:1], draw(opaque), *outputs[1:]]
            items += turn + list(outputs)
    return items


any_item = st.one_of(input_message(), assistant_message(), reasoning, opaque, call("call_x"), call("call_y"), st.just({"type": "function_call_output", "call_id": "call_x", "output": "x"}))


def bodies(items: st.SearchStrategy[list[dict[str, Any]]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda inp, instr, extra: {"model": "gpt-5", **({"instructions": instr} if instr is not None else {}), "input": inp, **extra},
        items,
        st.one_of(st.none(), texts),
        st.sampled_from([{}, {"store": False, "include": ["reasoning.encrypted_content"], "stream": True, "prompt_cache_key": "k"}]),
    )


# -- the lossless mapping ---------------------------------------------------------------------


@PROPERTY
@given(bodies(conversation()))
def test_conversations_round_trip_byte_for_byte_and_validate(body: dict[str, Any]) -> None:
    before = copy.deepcopy(body)
    msgs = RESPONSES.messages(body)
    assert errors(msgs) == []
    assert orjson.dumps(roundtrip(body)) == orjson.dumps(body)
    assert body == before  # nothing mutated
    assert RESPONSES.problem(body) is None


@PROPERTY
@given(bodies(st.lists(any_item, max_size=12)))
def test_items_in_any_order_round_trip_and_validate(body: dict[str, Any]) -> None:
    msgs = RESPONSES.messages(body)
    assert errors(msgs) == []
    assert orjson.dumps(roundtrip(body)) == orjson.dumps(body)


@PROPERTY
@given(bodies(conversation()))
def test_engines_see_the_text_of_every_output_and_call(body: dict[str, Any]) -> None:
    msgs = RESPONSES.messages(body)
    tool_text = {m["tool_call_id"]: m["content"] for m in msgs if m["role"] == "tool"}
    for item in body["input"]:
        if item.get("type") == "function_call_output" and item["call_id"] in tool_text:
            assert tool_text[item["call_id"]] == item["output"]
    args = {c["id"]: c["function"]["arguments"] for m in msgs for c in m.get("tool_calls") or []}
    for item in body["input"]:
        if item.get("type") == "function_call" and item["call_id"] in args:
            assert args[item["call_id"]] == item["arguments"]
        if item.get("type") == "custom_tool_call" and item["call_id"] in args:
            assert args[item["call_id"]] == item["input"]


def test_each_item_kind_maps_to_its_canonical_form() -> None:
    body = {
        "model": "gpt-5",
        "instructions": "You are Codex.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: on"}]},
            {"role": "user", "content": "fix the test"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "look first"}], "encrypted_content": "gAAAA"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]},
            {"type": "function_call", "name": "shell", "arguments": '{"command":["ls"]}', "call_id": "call_1"},
            {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch\n*** End Patch"},
            {"type": "function_call_output", "call_id": "call_1", "output": "a.py\nb.py"},
            {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done!"},
            {"type": "item_reference", "id": "msg_9"},
            {"role": "user", "content": "thanks"},
        ],
    }
    msgs = RESPONSES.messages(body)
    plain = [{k: v for k, v in m.items() if k != META_KEY} for m in msgs]
    assert plain == [
        {"role": "system", "content": "You are Codex."},
        {"role": "developer", "content": [{"type": "input_text", "text": "sandbox: on"}]},
        {"role": "user", "content": "fix the test"},
        {
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Looking.", "annotations": []}],
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"command":["ls"]}'}},
                {"id": "call_2", "type": "function", "function": {"name": "apply_patch", "arguments": "*** Begin Patch\n*** End Patch"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"},
        {"role": "tool", "tool_call_id": "call_2", "content": "Done!"},  # the item_reference rides on it
        {"role": "user", "content": "thanks"},
    ]
    # the messages whose default form is exact carry no private key
    assert META_KEY not in msgs[2] and META_KEY not in msgs[4] and META_KEY not in msgs[6]
    assert RESPONSES.with_messages(body, msgs) == body


def test_a_string_input_and_no_instructions() -> None:
    body = {"model": "gpt-5", "input": "hello"}
    msgs = RESPONSES.messages(body)
    assert [{k: v for k, v in m.items() if k != META_KEY} for m in msgs] == [{"role": "user", "content": "hello"}]
    assert RESPONSES.with_messages(body, msgs) == body
    # an engine that adds a message turns the string into items
    grown = RESPONSES.with_messages(body, [{"role": "user", "content": "[summary]"}, *msgs])
    assert grown["input"] == [{"role": "user", "content": "[summary]"}, {"role": "user", "content": "hello"}]


def test_unanswered_calls_and_orphan_outputs_are_kept_verbatim_and_stay_valid() -> None:
    items = [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "b", "output": "B"},
        {"type": "function_call_output", "call_id": "zz", "output": "orphan"},
        {"type": "function_call_output", "call_id": "b", "output": "second answer"},
        {"role": "user", "content": "more"},
        {"type": "function_call_output", "call_id": "a", "output": "too late"},
    ]
    body = {"model": "m", "input": items}
    msgs = RESPONSES.messages(body)
    assert errors(msgs) == []
    assistant = msgs[1]
    assert [c["id"] for c in assistant["tool_calls"]] == ["b"]
    assert msgs[-1]["role"] == "user" and msgs[-1]["content"] is None  # the late output: opaque
    assert orjson.dumps(RESPONSES.with_messages(body, msgs)) == orjson.dumps(body)


# -- engine edits -----------------------------------------------------------------------------


def codex_turn() -> dict[str, Any]:
    return {
        "model": "gpt-5-codex",
        "instructions": "sys",
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "run the tests"}]},
            {"type": "reasoning", "summary": [], "encrypted_content": "ENC1"},
            {"type": "function_call", "name": "shell", "arguments": '{"command":["pytest"]}', "call_id": "c1"},
            {"type": "function_call_output", "call_id": "c1", "output": "line\n" * 50},
            {"type": "reasoning", "summary": [], "encrypted_content": "ENC2"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "All green."}], "phase": "final_answer"},
        ],
    }


def edit(msgs: list[dict[str, Any]], at: int, change: Callable[[dict[str, Any]], dict[str, Any]]) -> list[dict[str, Any]]:
    return [change(m) if i == at else m for i, m in enumerate(msgs)]


def test_a_cut_output_changes_only_that_output() -> None:
    body = codex_turn()
    msgs = RESPONSES.messages(body)
    tool = next(i for i, m in enumerate(msgs) if m["role"] == "tool")
    out = RESPONSES.with_messages(body, edit(msgs, tool, lambda m: {**m, "content": "[ctxengine:cut ref=1] line"}))
    expected = copy.deepcopy(body)
    expected["input"][3]["output"] = "[ctxengine:cut ref=1] line"
    assert orjson.dumps(out) == orjson.dumps(expected)


def test_edited_arguments_and_text_keep_the_reasoning_in_place() -> None:
    body = codex_turn()
    msgs = RESPONSES.messages(body)
    a1 = next(i for i, m in enumerate(msgs) if m.get("tool_calls"))
    elided = edit(msgs, a1, lambda m: {**m, "tool_calls": [{**m["tool_calls"][0], "function": {"name": "shell", "arguments": "{}"}}]})
    out = RESPONSES.with_messages(body, elided)["input"]
    assert out[1] == {"type": "reasoning", "summary": [], "encrypted_content": "ENC1"}
    assert out[2] == {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "c1"}
    last = len(msgs) - 1
    shorter = edit(msgs, last, lambda m: {**m, "content": "Green."})
    out = RESPONSES.with_messages(body, shorter)["input"]
    assert out[4]["encrypted_content"] == "ENC2"
    # the item had a list of parts: the engine's string becomes one part
    assert out[5] == {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Green.", "annotations": []}], "phase": "final_answer"}


def test_engine_made_messages_are_written_from_their_fields() -> None:
    body = codex_turn()
    msgs = RESPONSES.messages(body)
    summary = {"role": "user", "content": "[CONTEXT COMPACTION] the tests ran", "ctxengine": {"summary": True}}
    record = {"role": "assistant", "content": [{"type": "text", "text": "[ctxengine:record] shell pytest -> ok"}]}
    made = [msgs[0], summary, record, msgs[-2] if msgs[-2]["role"] != "tool" else msgs[-1]]
    out = RESPONSES.with_messages(body, made)
    assert out["instructions"] == "sys"
    assert out["input"][0] == {"role": "user", "content": "[CONTEXT COMPACTION] the tests ran"}  # no private keys leak
    assert out["input"][1] == {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "[ctxengine:record] shell pytest -> ok"}]}


def test_dropping_a_tool_pair_drops_its_items_and_a_new_call_is_a_function_call() -> None:
    body = codex_turn()
    msgs = RESPONSES.messages(body)
    kept = [m for m in msgs if not m.get("tool_calls") and m["role"] != "tool"]
    out = RESPONSES.with_messages(body, kept)["input"]
    assert [i.get("type") for i in out] == ["message", "reasoning", "message"]
    added = [*kept, {"role": "assistant", "content": None, "tool_calls": [{"id": "n1", "type": "function", "function": {"name": "ctx_grep", "arguments": '{"q":"x"}'}}]}, {"role": "tool", "tool_call_id": "n1", "content": "hit"}]
    out = RESPONSES.with_messages(body, added)["input"]
    assert out[-2:] == [
        {"type": "function_call", "name": "ctx_grep", "arguments": '{"q":"x"}', "call_id": "n1"},
        {"type": "function_call_output", "call_id": "n1", "output": "hit"},
    ]


def test_object_outputs_are_shown_as_json_and_a_cut_keeps_a_valid_item() -> None:
    items = [
        {"role": "user", "content": "ls"},
        {"type": "shell_call", "id": "sh_1", "call_id": "s1", "action": {"type": "exec", "command": ["ls"]}, "status": "completed"},
        {"type": "shell_call_output", "call_id": "s1", "output": [{"stdout": "a\nb", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]},
    ]
    body = {"model": "m", "input": items}
    msgs = RESPONSES.messages(body)
    assert msgs[1]["tool_calls"][0]["function"] == {"name": "shell", "arguments": '{"type":"exec","command":["ls"]}'}
    assert json.loads(msgs[2]["content"])[0]["stdout"] == "a\nb"
    # an edit that is still JSON goes in; a cut that is not JSON leaves the original
    smaller = [{"stdout": "a", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]
    out = RESPONSES.with_messages(body, edit(msgs, 2, lambda m: {**m, "content": json.dumps(smaller)}))
    assert out["input"][2]["output"] == smaller
    out = RESPONSES.with_messages(body, edit(msgs, 2, lambda m: {**m, "content": "[cut]"}))
    assert out["input"][2] == items[2]


def test_a_real_engine_compaction_writes_valid_responses_input() -> None:
    from ctxengine.engines.rules import RulesEngine

    body = codex_turn()
    many = [body["input"][0]]
    for n in range(30):
        many += [
            {"type": "reasoning", "summary": [], "encrypted_content": f"E{n}"},
            {"type": "function_call", "name": "shell", "arguments": json.dumps({"command": ["cat", f"src/f{n}.py"]}), "call_id": f"c{n}"},
            {"type": "function_call_output", "call_id": f"c{n}", "output": f"src/f{n}.py\n" + "code line\n" * 300},
        ]
    many.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "now?"}]})
    body = {**body, "input": many}
    msgs = RESPONSES.messages(body)
    engine = RulesEngine(context_length=20_000)
    out = engine.compress(msgs)
    assert errors(out) == []
    written = RESPONSES.with_messages(body, out)
    assert len(orjson.dumps(written)) < len(orjson.dumps(body)) / 2
    items = written["input"]
    calls = {i["call_id"] for i in items if i.get("type") == "function_call"}
    outputs = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
    assert calls == outputs
    for at, item in enumerate(items):  # every kept call still follows its reasoning item
        if item.get("type") == "function_call":
            assert items[at - 1].get("type") == "reasoning"
    assert items[0] == many[0] and items[-1] == many[-1]


# -- compaction -------------------------------------------------------------------------------


def test_a_compaction_reply_expands_into_the_messages_it_stands_for() -> None:
    body = codex_turn()
    msgs = compact_input(body)
    assert msgs == RESPONSES.messages(body)
    compacted = [msgs[0], {"role": "user", "content": "[CONTEXT COMPACTION] ran the tests; all green"}, *msgs[-3:]]
    reply = compact_reply(body, compacted, {"input_tokens": 900, "input_tokens_details": {"cached_tokens": 100}, "output_tokens": 50}, created_at=7)
    assert reply["object"] == "response.compaction" and reply["created_at"] == 7
    (item,) = reply["output"]
    assert item["type"] == "compaction" and item["encrypted_content"].startswith(COMPACTION_PREFIX)
    assert reply["usage"]["input_tokens"] == 900 and reply["usage"]["input_tokens_details"]["cached_tokens"] == 100
    assert normalize_usage(reply["usage"]).total_tokens == 950
    # the instructions are re-sent by the client; the token holds the rest, in order
    assert decode_compaction(item["encrypted_content"]) == compacted[1:]
    # Codex's next request: its context, our item, the new turn
    later = {
        "model": "gpt-5-codex",
        "instructions": "sys",
        "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "ctx"}]}, item, {"role": "user", "content": "next"}],
    }
    expanded = RESPONSES.messages(later)
    assert errors(expanded) == []
    assert [m.get("content") for m in expanded][2:] == [m.get("content") for m in compacted[1:]] + ["next"]
    written = RESPONSES.with_messages(later, expanded)["input"]
    assert written[0] == later["input"][0]
    assert written[1] == {"role": "user", "content": "[CONTEXT COMPACTION] ran the tests; all green"}
    assert orjson.dumps(written[2:-1]) == orjson.dumps(body["input"][1:])  # the kept tail, byte for byte
    assert written[-1] == {"role": "user", "content": "next"}


def test_developer_items_the_client_resends_stay_out_of_the_token() -> None:
    body = {"model": "m", "instructions": "sys", "input": [{"type": "message", "role": "developer", "content": "perm"}, {"role": "user", "content": "hi"}]}
    msgs = compact_input(body)
    made_system = {"role": "system", "content": "[ctxengine:summary] kept"}
    noted = {**msgs[0], "content": "sys\n[Note: compacted]"}  # the instructions, an engine's note added
    reply = compact_reply(body, [noted, *msgs[1:], made_system])
    assert [m["content"] for m in decode_compaction(reply["output"][0]["encrypted_content"])] == ["hi", "[ctxengine:summary] kept"]


def test_a_foreign_compaction_item_is_kept_verbatim_and_a_damaged_token_is_named() -> None:
    theirs = {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAB-openai"}
    body = {"model": "m", "input": [theirs, {"role": "user", "content": "hi"}]}
    msgs = RESPONSES.messages(body)
    assert msgs[0][META_KEY] == {"opaque": [theirs]} and msgs[0]["role"] == "user"
    assert RESPONSES.with_messages(body, msgs) == body
    bad = {"model": "m", "input": [{"role": "user", "content": "x"}, {"type": "compaction", "encrypted_content": COMPACTION_PREFIX + "!!!"}]}
    problem = RESPONSES.problem(bad)
    assert problem is not None and problem.startswith("input[1]:") and "ctxengine compaction token" in problem
    with pytest.raises(ValueError, match=r"input\[1\]"):
        RESPONSES.messages(bad)
    assert decode_compaction(encode_compaction([{"role": "user", "content": "é"}])) == [{"role": "user", "content": "é"}]


# -- requests, responses, the recall round trip ------------------------------------------------


def test_problems_name_the_index_and_what_is_wrong() -> None:
    assert RESPONSES.problem([]) == "the request body must be a JSON object, not list"
    assert RESPONSES.problem({"input": "x"}) == "'model' is required and must be a string"
    assert RESPONSES.problem({"model": "m", "input": 3}) == "'input' must be a string or a list of items, not int"
    assert RESPONSES.problem({"model": "m", "input": [{"role": "user", "content": "a"}, 5]}) == "input[1]: must be an object, not int"
    assert RESPONSES.problem({"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}) == "input[0]: a function_call item needs a string 'call_id'"
    assert "role" in str(RESPONSES.problem({"model": "m", "input": [{"role": "robot", "content": "a"}]}))
    assert "'output'" in str(RESPONSES.problem({"model": "m", "input": [{"type": "function_call_output", "call_id": "c", "output": 3}]}))
    assert RESPONSES.problem({"model": "m", "input": [], "instructions": 4}) == "'instructions' must be a string, not int"


def test_requests_with_server_side_history_pass_through() -> None:
    assert RESPONSES.passthrough_reason({"model": "m", "input": [], "previous_response_id": "resp_1"}) is not None
    assert RESPONSES.passthrough_reason({"model": "m", "input": [], "conversation": {"id": "conv_1"}}) is not None
    assert RESPONSES.passthrough_reason({"model": "m", "prompt": {"id": "pmpt_1"}}) == "no input"
    assert RESPONSES.passthrough_reason({"model": "m", "input": "hi", "store": True}) is None
    assert RESPONSES.problem({"model": "m", "previous_response_id": "resp_1"}) is None
    with pytest.raises(ValueError, match="previous_response_id"):
        compact_input({"model": "m", "input": [], "previous_response_id": "resp_1"})
    with pytest.raises(ValueError, match=r"input\[0\]"):
        compact_input({"model": "m", "input": [7]})


def test_tools_are_flat_and_not_strict() -> None:
    engine_tool: dict[str, Any] = {"type": "function", "function": {"name": "ctx_grep", "description": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
    body = {"model": "m", "input": "x", "tools": [{"type": "function", "name": "shell", "parameters": {}}, {"type": "custom", "name": "apply_patch"}, {"type": "web_search"}]}
    assert RESPONSES.tool_names(body) == {"shell", "apply_patch"}
    out = RESPONSES.with_tools(body, [engine_tool])
    assert out["tools"][-1] == {"type": "function", "name": "ctx_grep", "description": "search", "parameters": engine_tool["function"]["parameters"], "strict": False}
    assert body["tools"] == out["tools"][:3] and len(body["tools"]) == 3


RESPONSE: dict[str, Any] = {
    "id": "resp_1",
    "object": "response",
    "status": "completed",
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "E"},
        {"type": "reasoning", "id": "rs_2", "summary": []},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "ctx_grep", "arguments": '{"q":"err"}', "status": "completed"},
    ],
    "usage": {"input_tokens": 1200, "input_tokens_details": {"cached_tokens": 1024}, "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 10}, "total_tokens": 1230},
}


def test_calls_followup_and_without_calls() -> None:
    assert RESPONSES.calls(RESPONSE) == [ToolCall("call_1", "ctx_grep", {"q": "err"})]
    body = {"model": "m", "input": "find it", "store": False}
    call = RESPONSES.calls(RESPONSE)[0]
    nxt = RESPONSES.followup(body, RESPONSES.assistant_message(RESPONSE), [(call, "3 hits")])
    assert nxt["input"] == [
        {"role": "user", "content": "find it"},
        RESPONSE["output"][0],  # rs_2 has no encrypted content: without storage it cannot go back
        RESPONSE["output"][2],
        {"type": "function_call_output", "call_id": "call_1", "output": "3 hits"},
    ]
    assert body["input"] == "find it"
    shown = RESPONSES.without_calls(RESPONSE, {"ctx_grep"})
    # rs_2 went with the call after it (the API rejects a reasoning item without its following item)
    assert [i["id"] for i in shown["output"]] == ["rs_1"] and len(RESPONSE["output"]) == 3
    more = {"output": [*RESPONSE["output"][1:], {"type": "message", "id": "msg_1", "role": "assistant", "content": []}]}
    assert [i["id"] for i in RESPONSES.without_calls(more, {"ctx_grep"})["output"]] == ["rs_2", "msg_1"]
    mixed = {"output": [*RESPONSE["output"], {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "p"}]}
    assert [c.name for c in RESPONSES.calls(mixed)] == ["ctx_grep", "apply_patch"]  # not only the engine's


def test_usage_and_errors() -> None:
    usage = RESPONSES.usage(RESPONSE)
    assert usage is not None
    u = normalize_usage(usage)
    assert (u.prompt_tokens, u.completion_tokens, u.cache_read_tokens, u.total_tokens) == (1200, 30, 1024, 1230)
    assert RESPONSES.error(400, "bad") == {"error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": "invalid_request_error"}}
    assert RESPONSES.error(502, "down")["error"]["type"] == "server_error"


def test_session_hint() -> None:
    assert session_hint({"prompt_cache_key": "conv-1"}, {"session_id": "s"}) == "conv-1"
    assert session_hint({}, {"Session_Id": "s"}) == "s"
    assert session_hint({}, {"thread-id": "t"}) == "t"
    assert session_hint({}, {}) is None


# -- streams ----------------------------------------------------------------------------------


def sse(events: list[dict[str, Any]], start: int = 0) -> bytes:
    out = b""
    for n, e in enumerate(events):
        e = {**e, "sequence_number": start + n}
        out += b"event: " + e["type"].encode() + b"\ndata: " + json.dumps(e).encode() + b"\n\n"
    return out


def response_obj(rid: str, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": rid, "object": "response", "status": status, "model": "gpt-5", "output": output, "usage": usage}


USAGE = {"input_tokens": 500, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 520}


def call_events(idx: int, fid: str, cid: str, name: str, args: str) -> list[dict[str, Any]]:
    added = {"type": "function_call", "id": fid, "call_id": cid, "name": name, "arguments": "", "status": "in_progress"}
    done = {**added, "arguments": args, "status": "completed"}
    return [
        {"type": "response.output_item.added", "output_index": idx, "item": added},
        {"type": "response.function_call_arguments.delta", "item_id": fid, "output_index": idx, "delta": args[:3]},
        {"type": "response.function_call_arguments.delta", "item_id": fid, "output_index": idx, "delta": args[3:]},
        {"type": "response.function_call_arguments.done", "item_id": fid, "output_index": idx, "arguments": args},
        {"type": "response.output_item.done", "output_index": idx, "item": done},
    ]


def text_events(idx: int, mid: str, text: str) -> list[dict[str, Any]]:
    part = {"type": "output_text", "text": "", "annotations": []}
    item = {"type": "message", "id": mid, "status": "in_progress", "role": "assistant", "content": []}
    return [
        {"type": "response.output_item.added", "output_index": idx, "item": item},
        {"type": "response.content_part.added", "item_id": mid, "output_index": idx, "content_index": 0, "part": part},
        {"type": "response.output_text.delta", "item_id": mid, "output_index": idx, "content_index": 0, "delta": text, "logprobs": []},
        {"type": "response.output_text.done", "item_id": mid, "output_index": idx, "content_index": 0, "text": text, "logprobs": []},
        {"type": "response.content_part.done", "item_id": mid, "output_index": idx, "content_index": 0, "part": {**part, "text": text}},
        {"type": "response.output_item.done", "output_index": idx, "item": {**item, "status": "completed", "content": [{**part, "text": text}]}},
    ]


def run(tracker: ResponsesStream, raw: bytes, chunk: int = 17) -> list[dict[str, Any]]:
    splitter = EventSplitter()
    shown: list[dict[str, Any]] = []
    events: list[Event] = []
    for at in range(0, len(raw), chunk):
        events += splitter.feed(raw[at : at + chunk])
    events += splitter.flush()
    for event in events:
        tracker.feed(event)
        out = tracker.visible(event)
        for again in EventSplitter().feed(out or b""):
            assert again.raw.startswith(b"event: " + again.data["type"].encode() + b"\n")
            shown.append(again.data)
    return shown


def test_a_plain_stream_is_relayed_as_is_and_its_usage_read() -> None:
    events = [
        {"type": "response.created", "response": response_obj("resp_1", "in_progress", [])},
        {"type": "response.in_progress", "response": response_obj("resp_1", "in_progress", [])},
        *text_events(0, "msg_1", "Hello"),
        {"type": "response.completed", "response": response_obj("resp_1", "completed", [], USAGE)},
    ]
    raw = sse(events)
    tracker = ResponsesStream()
    splitter = EventSplitter()
    relayed = b""
    for event in splitter.feed(raw):
        tracker.feed(event)
        relayed += tracker.visible(event) or b""
    assert relayed == raw
    assert tracker.usage == USAGE and tracker.finished and tracker.status == "completed"
    assert not tracker.engine_calls_only() and tracker.calls() == []


def test_engine_calls_are_hidden_and_the_follow_up_round_continues_the_stream() -> None:
    tools = frozenset({"ctx_grep"})
    round1: list[dict[str, Any]] = [
        {"type": "response.created", "response": response_obj("resp_1", "in_progress", [])},
        {"type": "response.in_progress", "response": response_obj("resp_1", "in_progress", [])},
        {"type": "response.output_item.added", "output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": []}},
        {"type": "response.output_item.done", "output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "E"}},
        *call_events(1, "fc_1", "call_1", "ctx_grep", '{"q":"TypeError"}'),
        {"type": "response.completed", "response": response_obj("resp_1", "completed", [], USAGE)},
    ]
    first = ResponsesStream(engine_tools=tools)
    shown = run(first, sse(round1))
    # the reasoning item went with the engine's call that followed it
    assert [e["type"] for e in shown] == ["response.created", "response.in_progress"]
    assert first.engine_calls_only() and first.usage == USAGE
    assert first.calls() == [("call_1", "ctx_grep", {"q": "TypeError"})]
    assistant = first.assistant_message()
    assert [i["type"] for i in assistant["output"]] == ["reasoning", "function_call"]
    assert assistant["output"][1]["arguments"] == '{"q":"TypeError"}'
    # the follow-up round: the answer is a client call and text
    round2 = [
        {"type": "response.created", "response": response_obj("resp_2", "in_progress", [])},
        {"type": "response.in_progress", "response": response_obj("resp_2", "in_progress", [])},
        *text_events(0, "msg_2", "Found it."),
        *call_events(1, "fc_2", "call_2", "shell", '{"command":["pytest"]}'),
        {"type": "response.completed", "response": response_obj("resp_2", "completed", [{"type": "message", "id": "msg_2"}, {"type": "function_call", "id": "fc_2", "name": "shell"}], USAGE)},
    ]
    second = first.next_round()
    shown2 = run(second, sse(round2))
    assert "response.created" not in [e["type"] for e in shown2]
    seqs = [e["sequence_number"] for e in shown + shown2]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert {e["output_index"] for e in shown2 if "output_index" in e} == {0, 1}
    final = shown2[-1]
    assert final["type"] == "response.completed"
    assert [i.get("id") for i in final["response"]["output"]] == ["msg_2", "fc_2"]
    assert not second.engine_calls_only()


def test_mixed_calls_show_the_clients_and_hide_the_engines() -> None:
    events = [
        {"type": "response.created", "response": response_obj("resp_1", "in_progress", [])},
        *call_events(0, "fc_1", "call_1", "ctx_grep", "{}"),
        *call_events(1, "fc_2", "call_2", "shell", "{}"),
        {"type": "response.completed", "response": response_obj("resp_1", "completed", [{"type": "function_call", "name": "ctx_grep"}, {"type": "function_call", "name": "shell"}], USAGE)},
    ]
    tracker = ResponsesStream(engine_tools=frozenset({"ctx_grep"}))
    shown = run(tracker, sse(events))
    assert not tracker.engine_calls_only()
    assert all(e.get("item_id") != "fc_1" for e in shown)
    assert {e["output_index"] for e in shown if "output_index" in e} == {0}
    assert shown[-1]["response"]["output"] == [{"type": "function_call", "name": "shell"}]


def test_closing_and_failure_events() -> None:
    tracker = ResponsesStream(engine_tools=frozenset({"ctx_grep"}))
    run(tracker, sse([{"type": "response.created", "response": response_obj("resp_1", "in_progress", [])}, *call_events(0, "fc_1", "c", "ctx_grep", "{}"), {"type": "response.completed", "response": response_obj("resp_1", "completed", [], USAGE)}]))
    (end,) = EventSplitter().feed(tracker.closing())
    assert end.data["type"] == "response.completed" and end.data["response"]["output"] == [] and end.data["sequence_number"] == tracker.last_sequence + 1
    (err,) = EventSplitter().feed(tracker.failure(400, json.dumps({"error": {"message": "too long", "type": "invalid_request_error", "code": "context_length_exceeded"}}).encode()))
    assert err.data["type"] == "error" and err.data["code"] == "context_length_exceeded" and err.data["message"] == "too long"
    (err,) = EventSplitter().feed(tracker.failure(502, b"bad gateway"))
    assert err.data["message"] == "bad gateway" and err.data["code"] == "server_error"


# -- turn after turn --------------------------------------------------------------------------


@PROPERTY
@given(conversation(), st.data())
def test_a_history_converts_growing_and_edited_inputs_as_a_fresh_conversion_does(items: list[dict[str, Any]], data: st.DataObject) -> None:
    history = ResponsesHistory()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(items)), max_size=4)))
    bodies = [{"model": "m", "instructions": "sys", "input": items[:c]} for c in [*cuts, len(items)]]
    if data.draw(st.booleans()) and len(items) > 1:  # a client that rewrote its history (its own /compact)
        bodies.append({"model": "m", "instructions": "sys", "input": [items[-1], *items[:-1]]})
    for body in bodies:
        msgs = history.messages(body)
        assert msgs == RESPONSES.messages(body)
        assert orjson.dumps(history.with_messages(body, msgs)) == orjson.dumps(body)
        assert orjson.dumps(history.with_messages(body, msgs)) == orjson.dumps(body)  # from the memo


def test_a_resent_history_keeps_its_message_objects() -> None:
    history = ResponsesHistory()
    body = codex_turn()
    first = history.messages(body)
    grown = {**body, "input": [*body["input"], {"role": "user", "content": "and now?"}]}
    second = history.messages(grown)
    assert all(a is b for a, b in zip(first, second, strict=False))
    assert second[-1] == {"role": "user", "content": "and now?"}
    with pytest.raises(ValueError, match=r"input\[7\]"):
        history.messages({**grown, "input": [*grown["input"], {"type": "function_call", "name": 3}]})


def canonical(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fields engines read (content as its text: a string written into an item whose
    content was a list comes back as one part), without opaque messages (their items may ride
    on a neighbour once the messages between them are gone)."""
    return [
        {k: (content_text(v) if k == "content" else v) for k, v in m.items() if k != META_KEY}
        for m in msgs
        if "opaque" not in (m.get(META_KEY) or {})
    ]


@PROPERTY
@given(bodies(conversation()), st.data())
def test_what_an_engine_writes_is_what_the_provider_reads(body: dict[str, Any], data: st.DataObject) -> None:
    msgs = RESPONSES.messages(body)
    edited: list[dict[str, Any]] = []
    for at, m in enumerate(msgs):
        json_output = any(e[0] == "j" for e in (m.get(META_KEY) or {}).get("items", []))
        how = data.draw(st.sampled_from(["keep", "keep", "edit", "drop"]))
        nxt = msgs[at + 1] if at + 1 < len(msgs) else None
        opaque_next = nxt is not None and nxt["role"] == "user" and nxt.get("content") is None and "opaque" in (nxt.get(META_KEY) or {})
        if how == "drop" and edited and edited[-1]["role"] == "assistant" and nxt is not None and (nxt["role"] == "assistant" or opaque_next):
            # two assistant turns with nothing between are one turn in Responses; an opaque item
            # (an item_reference) after an assistant turn is read as part of that turn
            how = "keep"
        if how == "edit" and m["role"] == "tool" and not json_output:
            m = {**m, "content": "[cut] " + str(m["content"])[:5]}
        elif how == "edit" and m["role"] == "assistant":
            calls = [{**c, "function": {**c["function"], "arguments": "{}"}} for c in m.get("tool_calls") or []]
            m = {**m, "content": "[edited]", **({"tool_calls": calls} if calls else {})}
        elif how == "drop" and m["role"] == "user" and m.get("content") is not None:
            continue  # an engine may summarise user turns away too
        edited.append(m)
    written = RESPONSES.with_messages(body, edited)
    assert all(META_KEY not in i for i in written["input"] if isinstance(i, dict))
    again = RESPONSES.messages(written)
    assert errors(again) == []
    assert canonical(again) == canonical(edited)


def test_a_reasoning_item_goes_with_the_last_of_the_calls_it_preceded() -> None:
    items = [
        {"role": "user", "content": "go"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "A"},
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "B"},
        {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{}"},
        {"type": "function_call", "call_id": "c", "name": "h", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "A"},
        {"type": "function_call_output", "call_id": "b", "output": "B"},
        {"type": "function_call_output", "call_id": "c", "output": "C"},
    ]
    body = {"model": "m", "input": items}
    msgs = RESPONSES.messages(body)

    def without(ids: set[str]) -> list[Any]:
        kept = [
            {**m, "tool_calls": [c for c in m["tool_calls"] if c["id"] not in ids]} if m.get("tool_calls") else m
            for m in msgs
            if m.get("tool_call_id") not in ids
        ]
        return [i.get("id") or i.get("call_id") for i in RESPONSES.with_messages(body, kept)["input"][1:]]

    assert without({"a"}) == ["rs_2", "b", "c", "b", "c"]  # rs_1 preceded only the removed call
    assert without({"b"}) == ["rs_1", "a", "rs_2", "c", "a", "c"]  # rs_2 still precedes c
    assert without({"b", "c"}) == ["rs_1", "a", "a"]


def test_a_stream_without_engine_calls_keeps_its_bytes_when_engine_tools_were_added() -> None:
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response_obj("resp_1", "in_progress", [])},
        {"type": "response.output_item.added", "output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": []}},
        {"type": "response.reasoning_summary_part.added", "item_id": "rs_1", "output_index": 0, "summary_index": 0, "part": {"type": "summary_text", "text": ""}},
        {"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0, "summary_index": 0, "delta": "Thinking"},
        {"type": "response.output_item.done", "output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Thinking"}]}},
        *text_events(1, "msg_1", "Hi"),
        *call_events(2, "fc_1", "call_1", "shell", '{"command":["ls"]}'),
        {"type": "response.completed", "response": response_obj("resp_1", "completed", [{"type": "message"}], USAGE)},
    ]
    raw = sse(events)
    tracker = ResponsesStream(engine_tools=frozenset({"ctx_grep"}))
    relayed = b""
    for event in EventSplitter().feed(raw):
        tracker.feed(event)
        relayed += tracker.visible(event) or b""
    assert relayed == raw
    assert tracker.calls() == [("call_1", "shell", {"command": ["ls"]})] and not tracker.engine_calls_only()


@PROPERTY
@given(bodies(conversation()))
def test_an_uncompacted_reply_stands_for_the_whole_history_but_what_the_client_resends(body: dict[str, Any]) -> None:
    reply = compact_reply(body, compact_input(body))
    later = {"model": "m", "input": [*reply["output"], {"role": "user", "content": "next"}]}
    written = RESPONSES.with_messages(later, RESPONSES.messages(later))["input"]
    resent = [i for i in body["input"] if i.get("type") in (None, "message") and i["role"] in ("system", "developer")]
    expected = [i for i in body["input"] if not any(i is r for r in resent)]
    assert orjson.dumps(written) == orjson.dumps([*expected, {"role": "user", "content": "next"}])


def test_a_string_written_into_an_item_that_had_parts_becomes_one_part() -> None:
    body = codex_turn()
    msgs = RESPONSES.messages(body)
    out = RESPONSES.with_messages(body, edit(msgs, 1, lambda m: {**m, "content": "run the tests, quickly"}))
    assert out["input"][0] == {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "run the tests, quickly"}]}
    plain = {"model": "m", "input": [{"role": "user", "content": "hi"}]}
    msgs = RESPONSES.messages(plain)
    assert RESPONSES.with_messages(plain, edit(msgs, 0, lambda m: {**m, "content": "hello"}))["input"] == [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("engine", ["compressor", "rules"])
def test_the_manager_compacts_a_codex_history_into_valid_responses_input(engine: str) -> None:
    from ctxengine.config import Config
    from ctxengine.manager import ContextManager

    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the failing test in src/app.py"}]},
        {"type": "compaction", "encrypted_content": "theirs"},
    ]
    for n in range(40):
        items += [
            {"type": "reasoning", "summary": [], "encrypted_content": f"E{n}"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"step {n}"}]},
            {"type": "function_call", "name": "shell", "arguments": json.dumps({"command": ["cat", f"src/f{n}.py"]}), "call_id": f"c{n}"},
            {"type": "function_call_output", "call_id": f"c{n}", "output": f"src/f{n}.py\nError: boom {n}\n" + "code line\n" * 200},
        ]
        if n % 10 == 9:
            items.append({"role": "user", "content": f"continue {n}"})
    body = {"model": "gpt-5", "instructions": "You are Codex.", "input": items, "store": False}
    mgr = ContextManager(Config.model_validate({"context": {"engine": engine}}), model="gpt-5", context_length=16_000)
    history = ResponsesHistory()
    out = mgr.prepare(history.messages(body), session_id="s")
    written = history.with_messages(body, out)
    assert len(orjson.dumps(written)) < len(orjson.dumps(body)) / 2
    w = written["input"]
    assert errors(RESPONSES.messages(written)) == []
    assert sorted(i["call_id"] for i in w if i.get("type") == "function_call") == sorted(i["call_id"] for i in w if i.get("type") == "function_call_output")
    assert all(META_KEY not in i for i in w)
    if engine == "rules":  # it never drops a user message; the compressor summarises old ones, opaque ones too
        assert {"type": "compaction", "encrypted_content": "theirs"} in w
    assert written["instructions"].startswith("You are Codex.") and w[-1] == items[-1]  # (the compressor adds a note)


json_values = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=5), lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
fuzz_item = st.dictionaries(
    st.sampled_from(["type", "role", "content", "call_id", "name", "arguments", "input", "output", "action", "id", "encrypted_content", "tools"]),
    st.one_of(
        st.sampled_from(["message", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output", "shell_call", "shell_call_output", "reasoning", "compaction", "user", "assistant", "developer", "c1", COMPACTION_PREFIX + "x"]),
        json_values,
    ),
    max_size=6,
)


@PROPERTY
@given(st.lists(st.one_of(fuzz_item, any_item, any_item, any_item, conversation().map(lambda c: c[0]), json_values), max_size=8))
def test_any_input_is_named_as_a_problem_or_converts_losslessly(items: list[Any]) -> None:
    body = {"model": "m", "input": items}
    problem = RESPONSES.problem(body)
    if problem is not None:
        assert problem.startswith("input[")
        with pytest.raises(ValueError, match=r"^input\["):
            RESPONSES.messages(body)
        return
    msgs = RESPONSES.messages(body)
    assert errors(msgs) == []
    assert orjson.dumps(roundtrip(body)) == orjson.dumps(body)


def test_a_reasoning_item_is_shown_once_the_item_after_it_is_the_clients() -> None:
    def reasoning_events(idx: int, rid: str) -> list[dict[str, Any]]:
        return [
            {"type": "response.output_item.added", "output_index": idx, "item": {"type": "reasoning", "id": rid, "summary": []}},
            {"type": "response.reasoning_summary_text.delta", "item_id": rid, "output_index": idx, "summary_index": 0, "delta": "hm"},
            {"type": "response.output_item.done", "output_index": idx, "item": {"type": "reasoning", "id": rid, "summary": [], "encrypted_content": "E"}},
        ]

    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response_obj("resp_1", "in_progress", [])},
        *reasoning_events(0, "rs_1"),
        *call_events(1, "fc_1", "call_1", "ctx_grep", "{}"),
        *reasoning_events(2, "rs_2"),
        *text_events(3, "msg_1", "Here."),
        *reasoning_events(4, "rs_3"),
        *call_events(5, "fc_2", "call_2", "shell", "{}"),
        {"type": "response.completed", "response": response_obj("resp_1", "completed", [{"type": "reasoning", "id": r} for r in ("rs_1", "rs_2", "rs_3")], USAGE)},
    ]
    tracker = ResponsesStream(engine_tools=frozenset({"ctx_grep"}))
    shown = run(tracker, sse(events))
    ids = [e.get("item_id") or (e.get("item") or {}).get("id") for e in shown[1:-1]]
    assert "rs_1" not in ids and "fc_1" not in ids
    assert ids[:3] == ["rs_2", "rs_2", "rs_2"] and ids[3] == "msg_1"  # held, then shown before the text
    assert [e["output_index"] for e in shown[1:-1]] == sorted(e["output_index"] for e in shown[1:-1])
    assert {e["output_index"] for e in shown[1:-1]} == {0, 1, 2, 3}
    seqs = [e["sequence_number"] for e in shown]
    assert seqs == sorted(seqs)
    assert [i["id"] for i in shown[-1]["response"]["output"]] == ["rs_2", "rs_3"]
    assert [i["id"] for i in tracker.visible_output()] == ["rs_2", "msg_1", "rs_3", "fc_2"]
