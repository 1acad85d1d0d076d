"""The lossless engine: folding, the node DAG, the recall tools, escalation, the contract."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

import pytest

from ctxengine.bench.replay import replay_session
from ctxengine.config import Config
from ctxengine.engine import Services
from ctxengine.engines.kit import parse_header
from ctxengine.engines.lcm import NODE_RE, LcmEngine, digest
from ctxengine.errors import ConfigError, SummarizerError
from ctxengine.facts import extract_facts
from ctxengine.messages import Message, content_text, is_summary, validate
from ctxengine.registry import EngineRegistry
from ctxengine.store import SqliteStore
from ctxengine.testing.contract import check_engine_contract


def _agent_session(turns: int, out_lines: int = 60) -> list[Message]:
    msgs: list[Message] = [{"role": "system", "content": "You are a coding agent. Use the tools."}]
    for t in range(turns):
        if t % 3 == 0:
            msgs.append({"role": "user", "content": f"Task {t}: fix the bug reported at https://bugs.example.org/{t}"})
        cid = f"call_{t}"
        path = f"src/module_{t}/file_{t}.py"
        msgs.append({"role": "assistant", "content": f"Reading {path} next.", "tool_calls": [{"id": cid, "type": "function", "function": {"name": "read_file" if t % 2 else "run_tests", "arguments": json.dumps({"path": path})}}]})
        body = "\n".join(f"{path}:{i}: value = compute({i}, {t})" for i in range(out_lines))
        msgs.append({"role": "tool", "tool_call_id": cid, "content": f"{body}\nTypeError: unsupported operand in step {t}"})
    msgs.append({"role": "assistant", "content": "All done."})
    return msgs


@pytest.fixture
def store() -> SqliteStore:
    return SqliteStore(":memory:")


def _engine(store: SqliteStore, **kw: Any) -> LcmEngine:
    kw.setdefault("context_length", 20_000)
    return LcmEngine(store=store, **kw)


def test_needs_an_injected_store() -> None:
    with pytest.raises(ConfigError, match="session store"):
        LcmEngine.from_config(Config().lcm, Services(context_length=100_000))
    with pytest.raises(ConfigError, match="session store"):
        EngineRegistry(entry_points=False).create("lcm", Config())


def test_from_config_reads_the_lcm_section(store: SqliteStore) -> None:
    cfg = Config.from_dict({"lcm": {"threshold": 0.6, "condense_after": 3, "leaf_chunk_tokens": 5000, "fresh_tail_messages": 8}})
    eng = EngineRegistry(entry_points=False).create("lcm", cfg, context_length=50_000, store=store)
    assert isinstance(eng, LcmEngine)
    assert (eng.name, eng.threshold_tokens, eng.condense_after, eng.leaf_chunk_tokens, eng.fresh_tail_messages) == ("lcm", 30_000, 3, 5000, 8)
    assert eng.deterministic


def test_threshold_default_is_75_percent(store: SqliteStore) -> None:
    eng = _engine(store, context_length=100_000)
    assert eng.threshold_tokens == 75_000
    assert not eng.should_compress(74_999)
    assert eng.should_compress(75_000)
    eng.update_from_response({"prompt_tokens": 80_000, "completion_tokens": 10})
    assert eng.should_compress()


def test_fold_keeps_anchors_pairs_and_every_original(store: SqliteStore) -> None:
    msgs = _agent_session(40)
    snapshot = copy.deepcopy(msgs)
    eng = _engine(store)
    out = eng.compress(msgs)
    assert msgs == snapshot  # not mutated
    assert out is not msgs
    assert [v for v in validate(out) if v.severity == "error"] == []
    assert out[0] == msgs[0]
    assert out[-1] == msgs[-1]
    latest_user = [m for m in msgs if m["role"] == "user"][-1]
    assert latest_user in out
    summaries = [m for m in out if is_summary(m)]
    assert summaries
    for s in summaries:
        text = content_text(s["content"])
        match = NODE_RE.match(text)
        assert match is not None
        assert "Expand for details" in text and f'lcm_expand(node_id="{match.group(1)}")' in text
    report = eng.last_report
    assert report is not None and report.tokens_after < report.tokens_before / 2
    # the replaced messages come back verbatim, in order, through the nodes
    replaced = [msgs[i] for i in report.replaced]
    recovered = [m for s in summaries for _, m in store.node_messages(NODE_RE.match(content_text(s["content"])).group(1))]  # type: ignore[union-attr]
    assert recovered == replaced
    # every user message folded away is quoted verbatim in a summary
    text = "\n".join(content_text(m["content"]) for m in out)
    for u in (m for m in msgs if m["role"] == "user"):
        assert u["content"] in text


def test_under_the_fold_size_nothing_changes(store: SqliteStore) -> None:
    msgs = _agent_session(3, out_lines=2)
    out = _engine(store).compress(msgs)
    assert out == msgs


def test_same_input_same_output_across_stores() -> None:
    msgs = _agent_session(40)
    a = _engine(SqliteStore(":memory:")).compress(msgs)
    b = _engine(SqliteStore(":memory:")).compress(msgs)
    assert json.dumps(a) == json.dumps(b)


def test_nodes_condense_into_a_dag(store: SqliteStore) -> None:
    eng = _engine(store, leaf_chunk_tokens=1000, condense_after=2, fresh_tail_messages=4)
    msgs = _agent_session(40)
    out = eng.compress(msgs)
    depths = [int(NODE_RE.match(content_text(m["content"])).group(2)) for m in out if is_summary(m)]  # type: ignore[union-attr]
    assert max(depths) >= 1
    top = next(m for m in out if is_summary(m))
    top_id = NODE_RE.match(content_text(top["content"])).group(1)  # type: ignore[union-attr]
    info = json.loads(eng.handle_tool_call("lcm_describe", {"node_id": top_id}))
    assert info["depth"] >= 1
    assert all(c["kind"] == "node" for c in info["children"])
    child = info["children"][0]["id"]
    assert json.loads(eng.handle_tool_call("lcm_describe", {"node_id": child}))["parents"] == [top_id]
    # expanding the top node walks down to the originals, in order, page by page
    got: list[Message] = []
    offset: int | None = 0
    while offset is not None:
        page = json.loads(eng.handle_tool_call("lcm_expand", {"node_id": top_id, "max_tokens": 800, "offset": offset}))
        got += [e["message"] for e in page["messages"]]
        offset = page["next_offset"]
    assert got == [m for _, m in store.node_messages(top_id)]
    assert got == msgs[1 : 1 + len(got)]


def test_incremental_compactions_reuse_nodes_and_keep_the_prefix(store: SqliteStore) -> None:
    eng = _engine(store, context_length=12_000)
    full = _agent_session(60)
    working = full[:40]
    out1 = eng.compress(working)
    working2 = [*out1, *full[40:]]
    out2 = eng.compress(working2)
    first_summary = next(i for i, m in enumerate(out1) if is_summary(m))
    assert out2[:first_summary] == out1[:first_summary]
    assert [v for v in validate(out2) if v.severity == "error"] == []
    # nothing lost across both: every tool output is retrievable verbatim
    for m in full:
        if m["role"] == "tool":
            last = m["content"].splitlines()[-1]
            assert eng.retrievable(last), last


def test_grep_tool_scopes_modes_and_errors(store: SqliteStore) -> None:
    a = _engine(store)
    a.on_session_start("alpha")
    a.compress(_agent_session(20))
    b = _engine(store)
    b.on_session_start("beta")
    b.compress([{"role": "user", "content": "only in beta: TypeError: unsupported operand in step 7"}])
    res = json.loads(a.handle_tool_call("lcm_grep", {"query": "TypeError: unsupported operand in step 7"}))
    # one session searched: its results do not repeat the session id (answers stay small)
    assert res["count"] >= 1 and all("session_ids" not in r for r in res["results"])
    everywhere = json.loads(a.handle_tool_call("lcm_grep", {"query": "TypeError: unsupported operand in step 7", "scope": "all"}))
    assert {s for r in everywhere["results"] for s in r["session_ids"]} >= {"alpha", "beta"}
    rx = json.loads(a.handle_tool_call("lcm_grep", json.dumps({"query": r"step 1[0-9]$", "mode": "regex", "limit": 50})))
    # error lines that match are listed once each, in one result
    assert sorted(ln.split()[-1] for r in rx["results"] if r["kind"] == "message" for ln in r["snippet"].split("\n")) == [str(i) for i in range(10, 20)]
    assert "error" in json.loads(a.handle_tool_call("lcm_grep", {"query": "(", "mode": "regex"}))
    assert "error" in json.loads(a.handle_tool_call("lcm_grep", {"query": "x", "scope": "galaxy"}))
    assert "error" in json.loads(a.handle_tool_call("lcm_grep", {"pattern": "x"}))
    assert "not found" in json.loads(a.handle_tool_call("lcm_describe", {"node_id": "ffff"}))["error"].lower() or "no summary node" in json.loads(a.handle_tool_call("lcm_describe", {"node_id": "ffff"}))["error"]
    assert json.loads(a.handle_tool_call("lcm_nope", {})) == {"error": "Unknown tool: lcm_nope"}
    assert [t["name"] for t in a.get_tool_schemas()] == ["lcm_grep", "lcm_describe", "lcm_expand"]


def test_expand_budget_and_oversized_messages(store: SqliteStore) -> None:
    eng = _engine(store, context_length=10_000, fresh_tail_messages=2)
    big = "\n".join(f"line {i} of a very long build log" for i in range(3000))
    msgs: list[Message] = [
        {"role": "user", "content": "build it"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "b", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "b", "content": big},
        {"role": "assistant", "content": "built"},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "ok"},
    ]
    out = eng.compress(msgs)
    node = next(NODE_RE.match(content_text(m["content"])).group(1) for m in out if is_summary(m))  # type: ignore[union-attr]
    first = eng.expand(node, max_tokens=200)
    assert [e["message"] for e in first["messages"]] == msgs[:2]
    assert (first["next_offset"], first["truncated"]) == (2, False)
    page = eng.expand(node, max_tokens=200, offset=2)
    assert page["truncated"] is True and len(page["messages"]) == 1
    assert big.startswith(page["messages"][0]["message"]["content"])
    whole = eng.expand(node, max_tokens=100_000)
    assert [e["message"] for e in whole["messages"]] == msgs[:3]  # "built" alone is too small to fold
    assert whole["next_offset"] is None
    assert eng.retrievable("line 2999 of a very long build log")


class _ScriptedSummarizer:
    """A summarizer seam double: answers from a script, records the budgets it was given."""

    name = "scripted"

    def __init__(self, answers: Sequence[str | Exception]) -> None:
        self.answers = list(answers)
        self.budgets: list[int] = []

    def summarize(self, span: Sequence[Message], *, previous_summary: str | None = None, focus_topic: str | None = None, budget_tokens: int = 2000) -> str:
        self.budgets.append(budget_tokens)
        answer = self.answers.pop(0) if self.answers else "short summary"
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_escalation_llm_then_shorter_then_deterministic(store: SqliteStore) -> None:
    msgs = _agent_session(12)
    failing = _ScriptedSummarizer([SummarizerError("endpoint down"), "word " * 5000])
    eng = _engine(store, summarizer=failing, leaf_chunk_tokens=100_000)
    out = eng.compress(msgs)
    assert failing.budgets == [1200, 600]  # the target, then half of it
    assert eng.last_report is not None and eng.last_report.fallback == "extractive"
    summary = next(content_text(m["content"]) for m in out if is_summary(m))
    assert "Actions:\n- run_tests: src/module_0/file_0.py\n- read_file: " in summary  # the kit's digest
    assert not eng.deterministic


def test_llm_summary_used_and_users_still_quoted(store: SqliteStore) -> None:
    msgs = _agent_session(12)
    good = _ScriptedSummarizer(["The agent read files and ran tests; step 7 failed with a TypeError."])
    eng = _engine(store, summarizer=good, leaf_chunk_tokens=100_000)
    out = eng.compress(msgs)
    summary = next(content_text(m["content"]) for m in out if is_summary(m))
    assert "step 7 failed with a TypeError" in summary
    assert "User: Task 0: fix the bug reported at https://bugs.example.org/0" in summary
    assert eng.last_report is not None and eng.last_report.fallback is None


def test_digest_shows_facts_until_the_fact_budget() -> None:
    span = _agent_session(30)[1:]
    small = digest(span, budget_tokens=300, fact_tokens=200, recall_hint="lcm_grep")
    assert small.startswith("User: Task 0")
    assert "[not shown here:" in small and "lcm_grep finds them" in small
    full = digest(span, budget_tokens=300, fact_tokens=100_000)
    facts = extract_facts(span)
    assert all(p in full for p in facts.paths) and all(e in full for e in facts.errors)


def test_keeps_the_engine_contract() -> None:
    report = check_engine_contract(lambda: LcmEngine(store=SqliteStore(":memory:"), context_length=4000), examples=20)
    assert report.turn_compactions > 0


@pytest.mark.slow
def test_every_compacted_fact_is_retrievable_on_the_trajectories(trajectories: list[dict[str, Any]], dataset: Any) -> None:
    total = 0
    compactions = 0
    from_store = 0
    for tr in trajectories:
        eng = LcmEngine(store=SqliteStore(":memory:"), context_length=32_000)

        def retrievable(fact: str, eng: LcmEngine = eng) -> bool:
            nonlocal from_store
            found = eng.retrievable(fact)  # only asked for facts no longer in the context
            from_store += found
            return found

        result = replay_session(tr["messages"], eng, session_id=tr["id"], retrievable=retrievable)
        assert result.invalid_requests == 0, result.invalid_details
        assert result.facts_missing == {}, (tr["id"], result.facts_missing)
        total += sum(result.facts_total.values())
        compactions += result.compactions
    # the sample: 7 compactions, 855 facts, 39 from the store; the full files: over 30, 3000, 100
    assert compactions >= (30 if dataset.full else 5) and total > (3000 if dataset.full else 800)
    assert from_store > (100 if dataset.full else 30)  # compaction really moved facts out of the context


def test_summaries_after_the_latest_user_message_are_the_assistants(store: SqliteStore) -> None:
    # one task, then a long run of tool calls: the fold lands after the user message
    msgs = _agent_session(1)[:-1]
    for t in range(1, 40):
        cid = f"more_{t}"
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{"id": cid, "type": "function", "function": {"name": "bash", "arguments": "{}"}}]})
        msgs.append({"role": "tool", "tool_call_id": cid, "content": "\n".join(f"output line {i} of step {t}" for i in range(80))})
    out = _engine(store).compress(msgs)
    last_user = [m for m in out if m["role"] == "user"][-1]
    assert last_user == msgs[1]  # the task itself, verbatim
    after = out[out.index(last_user) + 1 :]
    summaries = [m for m in after if is_summary(m)]
    assert summaries and all(m["role"] == "assistant" for m in summaries)
    # the next compaction recognises them as nodes (not as text to fold again)
    grown = [*out, *msgs[-4:]]
    again = _engine(store).compress(grown)
    assert [m for m in again if is_summary(m)][: len(summaries)] == summaries or len([m for m in again if is_summary(m)]) < len(summaries)
    assert not any("[ctxengine:lcm" in content_text(m["content"]).split("\n", 1)[1] for m in again if is_summary(m) and "\n" in content_text(m["content"]))


def test_a_giant_new_output_is_cut_before_it_is_sent(store: SqliteStore) -> None:
    listing = "\n".join(f"./src/pkg{i // 50}/Module{i}.java" for i in range(6000))
    msgs: list[Message] = [
        {"role": "system", "content": "agent"},
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "ls", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "ls", "content": listing},
    ]
    eng = _engine(store, context_length=32_000)
    out = eng.compress(msgs)
    assert [v for v in validate(out) if v.severity == "error"] == []
    assert out[:3] == msgs[:3]
    cut = out[3]
    assert cut["tool_call_id"] == "ls" and is_summary(cut)
    assert eng.counter.count_messages(out) < 32_000
    text = content_text(cut["content"])
    assert "./src/pkg0/Module0.java" in text and "./src/pkg119/Module5999.java" in text  # head and tail
    marker = parse_header(text)  # the kit's one cut, its ref the node recall expands
    assert marker is not None and marker.kind == "cut" and marker.ref is not None
    node = marker.ref
    whole = eng.expand(node, max_tokens=200_000)
    assert whole["messages"][0]["message"] == msgs[3]
    assert eng.retrievable("./src/pkg60/Module3000.java")
