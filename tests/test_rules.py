"""The ``rules`` engine (seed 004): each rule, the guarantees, and replays of the real data."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from ctxengine.bench.replay import replay_session
from ctxengine.config import Config
from ctxengine.engines.rules import MARK, RulesEngine, RulesSettings
from ctxengine.errors import InvalidMessages
from ctxengine.facts import (
    FACT_KINDS,
    context_text,
    error_lines,
    extract_facts,
    missing_facts,
)
from ctxengine.messages import is_summary, validate
from ctxengine.registry import create_engine
from ctxengine.tokens import estimate_messages_tokens

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "coding_session.json"

Msg = dict[str, Any]


# -- builders -------------------------------------------------------------------------------
def system(text: str = "You are a coding agent.") -> Msg:
    return {"role": "system", "content": text}


def user(text: str = "Fix the bug.") -> Msg:
    return {"role": "user", "content": text}


def plain(text: str) -> Msg:
    return {"role": "assistant", "content": text}


def call(cid: str, name: str = "read_file", **args: Any) -> Msg:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args or {"path": "config.yaml"})}}


def group(cid: str, output: str, name: str = "read_file", text: str | None = "Reading.", **args: Any) -> list[Msg]:
    return [
        {"role": "assistant", "content": text, "tool_calls": [call(cid, name, **args)]},
        {"role": "tool", "tool_call_id": cid, "name": name, "content": output},
    ]


def file_view(path: str, lines: int = 60) -> str:
    body = "\n".join(f"{i:4d}  value_{i} = compute({i})  # see src/pkg/mod_{i % 7}.py" for i in range(1, lines + 1))
    return f"[File: {path} ({lines} lines total)]\n{body}"


def failing_run(n_lines: int = 60) -> str:
    head = [f"test_{i} PASSED" for i in range(n_lines // 2)]
    tb = [
        "Traceback (most recent call last):",
        '  File "/srv/app/app.py", line 88, in create_order',
        "ValueError: discount expired",
        "FAILED tests/test_orders.py::test_expired - AssertionError: 500 != 422",
    ]
    tail = [f"trailing line {i}" for i in range(n_lines // 2)]
    return "\n".join([*head, *tb, *tail])


def session(n_groups: int = 12, output_lines: int = 60) -> list[Msg]:
    msgs = [system(), user("Fix the expired-discount bug; see https://tracker.example.com/SHOP-1432")]
    for k in range(n_groups):
        msgs += group(f"c{k}", file_view(f"src/pkg/module_{k}.py", output_lines), path=f"src/pkg/module_{k}.py")
    return msgs


def engine(window: int = 4000, **overrides: Any) -> RulesEngine:
    return RulesEngine(context_length=window, **overrides)


def errors_of(messages: list[Msg]) -> list[str]:
    return [str(v) for v in validate(messages) if v.severity == "error"]


def load_example() -> list[Msg]:
    data = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    msgs: list[Msg] = data["messages"]
    return msgs


# -- rule 1: collapse succeeded tool pairs ----------------------------------------------------------
def test_rule1_collapses_a_succeeded_pair_into_a_one_line_record_and_keeps_the_pair() -> None:
    msgs = [system(), user(), *group("a", "key: value\n" * 80, path="config.yaml"), *group("b", "x" * 100), *session(5)[2:]]
    out = engine(protect_last_n_turns=2).compress(msgs)
    record = out[3]
    assert record["role"] == "tool" and record["tool_call_id"] == "a" and record["name"] == "read_file"
    assert record["content"].splitlines()[0] == f'{MARK}tool: read_file("config.yaml") → ok, {len("key: value" * 80) + 80} chars]'
    assert out[2]["tool_calls"] == msgs[2]["tool_calls"]  # the call stays: a valid, shorter pair
    assert errors_of(out) == []
    assert is_summary(record)


def test_rule1_elides_long_call_arguments_but_keeps_their_paths_and_json() -> None:
    content = "\n".join(f"line {i} in lib/util_{i}.py" for i in range(80))
    msgs = [system(), user(), *group("w", "wrote 2400 bytes", name="write_file", path="src/app/main.py", content=content), *session(5)[2:]]
    out = engine(protect_last_n_turns=2).compress(msgs)
    args = json.loads(out[2]["tool_calls"][0]["function"]["arguments"])
    assert args["_ctxengine_elided_chars"] == len(msgs[2]["tool_calls"][0]["function"]["arguments"])
    text = context_text(out)
    for p in extract_facts(msgs[2:4]).paths:
        assert p in text


def test_rule1_keeps_paths_and_urls_of_the_collapsed_output() -> None:
    output = "see https://docs.example.com/api/v2 and /etc/app/settings.toml\n" + file_view("src/x/y.py")
    msgs = [system(), user(), *group("a", output), *session(5)[2:]]
    out = engine(protect_last_n_turns=2).compress(msgs)
    assert out[3]["content"].startswith(MARK + "tool:")
    missing = missing_facts(extract_facts(msgs[2:4]), context_text(out))
    assert len(missing) == 0


def test_keep_tool_summary_off_only_truncates() -> None:
    msgs = [system(), user(), *group("a", file_view("src/a.py")), *session(5)[2:]]
    out = engine(protect_last_n_turns=2, keep_tool_summary=False).compress(msgs)
    assert out[3]["content"].startswith(MARK + "cut")
    assert out[2] is msgs[2]  # no argument elision either


# -- rule 2: truncate large tool outputs ---------------------------------------------------------
def test_rule2_keeps_head_and_tail_lines_of_a_failed_output_and_every_error_line() -> None:
    run = failing_run(60)
    msgs = [system(), user(), *group("t", run, name="run_terminal", command="pytest -q"), *session(5)[2:]]
    out = engine(protect_last_n_turns=2).compress(msgs)
    lines = out[3]["content"].splitlines()
    src = run.splitlines()
    # the kit's one cut: a marker naming what was removed, head and tail lines, the facts
    assert lines[0].startswith(f"{MARK}cut: {len(src) - 15} of 64 lines removed after line 10")
    assert 'run_terminal("pytest -q")' in lines[0]
    assert lines[1:11] == src[:10]
    assert lines[11:16] == src[-5:]
    for e in error_lines(run):
        assert e in out[3]["content"]


def test_rule2_leaves_a_short_failed_output_alone() -> None:
    short = "Traceback (most recent call last):\nValueError: bad"
    msgs = [system(), user(), *group("t", short, name="run_terminal", command="x"), *session(5)[2:]]
    out = engine(protect_last_n_turns=2).compress(msgs)
    assert out[3] is msgs[3]


def test_rule2_caps_giant_single_lines_and_keeps_their_facts() -> None:
    line = "ERROR: " + " ".join(f"symbol_{i} unresolved" for i in range(3000)) + " in /opt/lib/libfoo.so"
    msgs = [system(), user(), *group("t", line, name="run_terminal", command="ldd"), *session(5)[2:]]
    out = engine(200_000, protect_last_n_turns=2).compress(msgs)
    assert len(out[3]["content"]) < 1000
    assert len(missing_facts(extract_facts(msgs[2:4]), context_text(out))) == 0


# -- rule 3: system messages after turn 1 ---------------------------------------------------------
def test_rule3_replaces_later_system_messages_with_a_marker_and_never_the_prompt() -> None:
    reminder = "Reminder: you have these skills loaded:\n" + "skill text\n" * 200
    msgs = [system("PROMPT " * 300), user(), *group("a", "x" * 50), system(reminder), *session(5)[2:]]
    out = engine(protect_last_n_turns=2).compress(msgs)
    assert out[0] is msgs[0]
    assert out[4]["role"] == "system"
    assert out[4]["content"] == f'{MARK}system: "Reminder: you have these skills loaded:", {len(reminder)} chars dropped]'
    kept = engine(protect_last_n_turns=2, drop_system_after_turn=0).compress(msgs)
    assert kept[4] is msgs[4]


def test_rule3_counts_turns_by_user_messages() -> None:
    msgs = [system(), system("second system part " * 50), user(), system("after turn one " * 50), *session(5)[2:]]
    out = engine(protect_last_n_turns=2).compress(msgs)
    assert out[1] is msgs[1]  # before the first user turn: part of the prompt
    assert out[3]["content"].startswith(MARK + "system:")


# -- rule 4: consecutive assistant messages ---------------------------------------------------------
def test_rule4_keeps_only_the_last_of_a_run_of_plain_assistant_messages() -> None:
    run = [plain("Thinking about it."), plain("Still thinking."), plain("Decided: patch app.py.")]
    msgs = [system(), user(), *run, *session(5)[2:]]
    out = engine(protect_last_n_turns=2).compress(msgs)
    assert out[2] is msgs[4]
    assert len(out) == len(msgs) - 2


def test_rule4_keeps_the_facts_of_dropped_messages_in_a_marker() -> None:
    run = [plain("The failure is in src/app/main.py, see https://docs.example.com/x"), plain("Decided: patch it.")]
    msgs = [system(), user(), *run, *session(5)[2:]]
    out = engine(protect_last_n_turns=2).compress(msgs)
    assert out[2]["content"].startswith(MARK + "assistant: 1 earlier message(s) collapsed]")
    assert "src/app/main.py" in out[2]["content"] and "https://docs.example.com/x" in out[2]["content"]
    assert out[3] is msgs[3]
    off = engine(protect_last_n_turns=2, collapse_consecutive_assistant=False).compress(msgs)
    assert off[2] is msgs[2]


# -- rules 5 and 6: users and the protected tail ---------------------------------------------------------
def test_rule5_user_messages_stay_verbatim_even_when_huge() -> None:
    big = "Please read all of this. " * 5000
    msgs = [system(), user(big), *session(10)[2:], user("second ask: keep the API"), *session(6)[2:]]
    e = engine(2000)
    out = e.compress(msgs)
    assert [m for m in out if m["role"] == "user"] == [m for m in msgs if m["role"] == "user"]


def test_rule6_protected_tail_is_untouched_and_counts_tool_exchanges() -> None:
    msgs = session(12)
    out = engine(protect_last_n_turns=3).compress(msgs)
    assert out[-6:] == msgs[-6:] and all(a is b for a, b in zip(out[-6:], msgs[-6:], strict=True))
    assert out[-7]["content"].startswith(MARK)


def test_fewer_turns_than_protected_means_nothing_changes() -> None:
    msgs = session(3)
    out = engine(100, protect_last_n_turns=5).compress(msgs)
    # everything is protected; only the last-resort cut may act, and it keeps pairs valid
    assert errors_of(out) == []
    assert [m["role"] for m in out] == [m["role"] for m in msgs]


# -- guarantees ---------------------------------------------------------------------------------
def test_no_mutation_determinism_and_idempotence_on_the_example() -> None:
    msgs = load_example()
    before = copy.deepcopy(msgs)
    out1 = engine(32_000).compress(msgs)
    assert msgs == before
    out2 = engine(32_000).compress(copy.deepcopy(msgs))
    assert json.dumps(out1, ensure_ascii=False) == json.dumps(out2, ensure_ascii=False)
    again = engine(32_000).compress(out1)
    assert again == out1
    assert errors_of(out1) == []
    assert estimate_messages_tokens(out1) < 0.5 * estimate_messages_tokens(msgs)
    assert len(missing_facts(extract_facts(msgs), context_text(out1))) == 0


def test_prefix_stays_byte_stable_between_compactions() -> None:
    e = engine(6000, protect_last_n_turns=3)
    msgs = session(10)
    first = e.compress(msgs)
    grown = [*first, *group("n1", file_view("src/new/a.py")), *group("n2", file_view("src/new/b.py"))]
    second = e.compress(grown)
    # what the first compaction wrote (everything before its protected tail) is sent unchanged
    settled = len(first) - 6
    assert json.dumps(second[:settled]) == json.dumps(first[:settled])
    assert second[settled + 1]["content"].startswith(MARK)  # the former tail got compacted now


def test_parallel_calls_and_reused_ids_stay_valid_pairs() -> None:
    par = {
        "role": "assistant",
        "content": None,
        "tool_calls": [call("p1", path="src/a.py"), call("p2", path="src/b.py"), call("p3", "search", pattern="TODO")],
    }
    results = [
        {"role": "tool", "tool_call_id": "p2", "content": file_view("src/b.py")},
        {"role": "tool", "tool_call_id": "p1", "content": file_view("src/a.py")},
        {"role": "tool", "tool_call_id": "p3", "content": "src/c.py:1: TODO\n" * 40},
    ]
    reused = [*group("dup", file_view("src/d.py")), *group("dup", failing_run(), name="run_terminal", command="pytest")]
    msgs = [system(), user(), par, *results, *reused, *session(5)[2:]]
    out = engine(protect_last_n_turns=2).compress(msgs)
    assert errors_of(out) == []
    assert out[3]["content"].startswith(f'{MARK}tool: read_file("src/b.py")')  # matched by id
    assert out[4]["content"].startswith(f'{MARK}tool: read_file("src/a.py")')
    assert out[9]["content"].startswith(f"{MARK}cut") and 'run_terminal("pytest")' in out[9]["content"].split("\n")[0]
    assert len(missing_facts(extract_facts(msgs), context_text(out))) == 0


def test_bad_input_raises_invalid_messages() -> None:
    e = engine()
    with pytest.raises(InvalidMessages) as info:
        e.compress([system(), user(), {"role": "tool", "tool_call_id": "nope", "content": "x"}])
    assert "result_without_call" in str(info.value)
    with pytest.raises(InvalidMessages):
        e.compress([user(), {"role": "assistant", "tool_calls": [call("a")]}, user("next")])
    with pytest.raises(InvalidMessages):
        e.compress([{"role": "wizard", "content": "x"}])


def test_pending_calls_at_the_end_are_accepted() -> None:
    msgs = [*session(8), {"role": "assistant", "content": None, "tool_calls": [call("last")]}]
    out = engine(protect_last_n_turns=2).compress(msgs)
    assert out[-1] is msgs[-1]


# -- never over the window ------------------------------------------------------------------------
def test_last_resort_cuts_a_giant_protected_output_and_keeps_its_facts() -> None:
    giant = "\n".join(f"{i}: processing src/gen/file_{i % 50}.py ok" for i in range(40_000))
    giant += "\nFATAL: out of memory in src/gen/file_7.py"
    msgs = [*session(4), *group("big", giant, name="run_terminal", command="make all")]
    e = engine(32_000)
    out = e.compress(msgs)
    assert estimate_messages_tokens(out) <= 32_000
    assert out[-1]["content"].startswith(f"{MARK}cut") and 'run_terminal("make all")' in out[-1]["content"].split("\n")[0]
    assert "FATAL: out of memory in src/gen/file_7.py" in out[-1]["content"]
    assert e.last_report is not None and any("last resort" in n for n in e.last_report.notes)
    status = e.get_status()
    assert status["last_resort_cuts"] == 1 and status["notes"]
    assert errors_of(out) == []
    assert len(missing_facts(extract_facts(msgs), context_text(out))) == 0


def test_facts_that_cannot_fit_the_window_are_partly_kept_and_reported() -> None:
    listing = "\n".join(f"/repo/src/main/java/com/example/deep/pkg{i // 40}/Type{i}.java" for i in range(6000))
    msgs = [*session(3), *group("ls", listing, name="find_file", pattern="*.java")]
    e = engine(32_000)
    out = e.compress(msgs)
    assert estimate_messages_tokens(out) <= 32_000
    assert e.last_report is not None
    assert any("left out" in n for n in e.last_report.notes)
    kept = sum(1 for p in listing.splitlines() if p in out[-1]["content"])
    assert 100 < kept < 6000


# -- triggering, config, registry -------------------------------------------------------------------
def test_should_compress_fires_at_the_trigger_and_defers_by_a_batch() -> None:
    e = engine(10_000)
    assert e.threshold_tokens == 6000
    assert not e.should_compress(5999) and e.should_compress(6000)
    e.update_from_response({"prompt_tokens": 7000, "completion_tokens": 10})
    assert e.should_compress()
    huge_user = [system(), user("x " * 30_000), *session(6)[2:]]
    e.compress(huge_user)  # cannot get under the target: the user message is protected
    assert not e.should_compress(6500)
    assert e.should_compress(8000)  # halfway from the trigger to the window at most
    e.on_session_reset()
    assert e.should_compress(6000)
    assert not engine(10_000, enabled=False).should_compress(9000)


def test_from_config_and_registry() -> None:
    cfg = Config.from_dict({"compaction": {"protect_last_n_turns": 2, "max_tool_output_chars": 300, "trigger_threshold": 0.5}})
    e = create_engine(cfg, name="rules", context_length=20_000)
    assert isinstance(e, RulesEngine) and e.name == "rules" and e.deterministic
    assert e.settings.protect_last_n_turns == 2 and e.settings.max_tool_output_chars == 300
    assert e.threshold_tokens == 10_000
    assert RulesSettings is type(Config().compaction) and RulesSettings() == Config().compaction  # one model, no copies


def test_report_counts_and_focus_topic_is_ignored() -> None:
    msgs = session(10)
    e = engine()
    out = e.compress(msgs, focus_topic="anything")
    assert out == engine().compress(msgs)
    r = e.last_report
    assert r is not None and r.engine == "rules" and e.compression_count == 1
    assert r.messages_before == len(msgs) and r.messages_after == len(out)
    assert r.tokens_after < r.tokens_before and r.replaced and 0 < r.reduction < 1


# -- the real trajectories ------------------------------------------------------------------------------
class _Recording(RulesEngine):
    """The rules engine, remembering the notes of every compaction of a replay."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.all_notes: list[str] = []

    def compress(self, messages: list[Msg], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Msg]:
        out = super().compress(messages, current_tokens, focus_topic)
        assert self.last_report is not None
        self.all_notes.extend(self.last_report.notes)
        return out


@pytest.mark.slow
def test_replay_every_trajectory_valid_inside_the_window_and_facts_kept(trajectories: list[dict[str, Any]]) -> None:
    for t in trajectories:
        e = _Recording(context_length=32_000)
        res = replay_session(t["messages"], e, session_id=t["id"])
        notes = e.all_notes
        assert res.invalid_requests == 0, (t["id"], res.invalid_details)
        assert res.over_window == 0, t["id"]
        for kind in FACT_KINDS:
            if kind == "paths" and any("left out" in n for n in notes):
                continue  # a listing with more distinct paths than the window holds
            assert res.facts_kept[kind] == res.facts_total[kind], (t["id"], kind, res.facts_missing.get(kind))


@pytest.mark.slow
def test_compacting_each_whole_trajectory_keeps_every_fact_and_is_idempotent(trajectories: list[dict[str, Any]]) -> None:
    for t in trajectories:
        msgs = t["messages"]
        frozen = copy.deepcopy(msgs)
        e = RulesEngine(context_length=1_000_000, protect_last_n_turns=5)
        out = e.compress(msgs)
        assert msgs == frozen
        assert errors_of(out) == [], t["id"]
        assert len(missing_facts(extract_facts(msgs), context_text(out))) == 0, t["id"]
        assert RulesEngine(context_length=1_000_000).compress(out) == out, t["id"]


@pytest.mark.parametrize("window", [1000, 4000])
def test_the_engine_contract_kit_passes(window: int) -> None:
    from ctxengine.testing.contract import check_engine_contract

    report = check_engine_contract(lambda: RulesEngine(context_length=window), examples=25)
    assert report.turn_compactions > 0
