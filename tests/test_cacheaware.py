"""The cacheaware engine: batches, giant outputs, folding, prefix stability, facts, recall."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from ctxengine.config import Config
from ctxengine.engine import Services
from ctxengine.engines.cacheaware import CacheAwareEngine, CacheAwareSettings
from ctxengine.engines.kit.originals import Originals
from ctxengine.facts import FACT_KINDS, context_text, extract_facts, missing_facts
from ctxengine.messages import Message, validate
from ctxengine.recall import Recall
from ctxengine.registry import EngineRegistry
from ctxengine.store import SqliteStore

CUT_MARK = "[ctxengine:cut"
DIGEST_MARK = "[ctxengine:digest"


def _output(k: int, lines: int = 60) -> str:
    body = [f"{n}: line {n} of output {k} with some words in it" for n in range(lines)]
    body[30] = f"ERROR: build failed in src/main/java/App{k}.java"
    body[31] = f"see https://example.com/docs/{k}"
    return "\n".join(body)


def _session(groups: int, lines: int = 60) -> list[Message]:
    msgs: list[Message] = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix the build."}]
    for k in range(groups):
        msgs.append({"role": "assistant", "content": f"step {k}", "tool_calls": [{"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": f"cat src/f{k}.txt"})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": _output(k, lines)})
    return msgs


def _engine(store: SqliteStore | None = None, **kw: Any) -> CacheAwareEngine:
    kw.setdefault("fold_batches", False)
    kw.setdefault("rewrite_every", 0)
    kw.setdefault("min_gain", 0.0)
    kw.setdefault("fold_floor", 0.0)  # these tests drive the batching itself (the floor: below)
    originals = Originals(store, "s1") if store is not None else None
    return CacheAwareEngine(context_length=kw.pop("context_length", 100_000), settings=CacheAwareSettings(cost_aware=False, **kw), originals=originals)


@pytest.fixture
def store() -> SqliteStore:
    return SqliteStore(":memory:")


def _valid(msgs: list[Message]) -> bool:
    return not [v for v in validate(msgs) if v.severity == "error"]


def test_registered_as_a_builtin() -> None:
    assert "cacheaware" in EngineRegistry(entry_points=False).names()
    assert EngineRegistry(entry_points=False).create("cacheaware").name == "cacheaware"


def test_settings_come_from_the_config_section_and_services() -> None:
    cfg = Config.from_dict({"cacheaware": {"keep_recent": 4, "batch": 5}})
    eng = CacheAwareEngine.from_config(cfg.cacheaware, Services(context_length=64_000))
    assert eng.settings.keep_recent == 4 and eng.context_length == 64_000 and eng.originals is None
    built = EngineRegistry(entry_points=False).create("cacheaware", cfg, context_length=32_000, store=SqliteStore(":memory:"))
    assert isinstance(built, CacheAwareEngine)
    assert built.settings.batch == 5 and built.context_length == 32_000 and built.originals is not None
    with pytest.raises(TypeError, match="settings must be a CacheAwareConfig, not Config"):
        CacheAwareEngine.from_config(cfg, Services(context_length=32_000))  # type: ignore[arg-type]
    with pytest.raises(Exception, match="keep_recent"):
        Config.from_dict({"cacheaware": {"keep_recent": -1}})


def test_under_the_fold_floor_nothing_is_folded_but_what_the_window_requires(store: SqliteStore) -> None:
    """A conversation in a fifth of its window is left whole: no batch, no finished turn, no
    cold-cache fold; past the floor the same batch is folded; a giant output is still cut."""
    now = [0.0]
    msgs = [*_session(12), {"role": "user", "content": "Now the tests."}]
    size = sum(CacheAwareEngine()._tokens(m) for m in msgs)
    roomy = CacheAwareEngine(context_length=size * 5, settings=CacheAwareSettings(batch=2, min_horizon=1, rewrite_every=0, min_gain=0.0), originals=Originals(store, "s1"), clock=lambda: now[0])
    assert roomy.floor_tokens == min(int(size * 5 * 0.5), 24_000) and roomy.roomy(size)
    roomy.update_from_response({"prompt_tokens": size})
    now[0] = 10_000.0  # a cold cache does not make a fold worth it either
    assert roomy.cold() and not roomy.should_compress_preflight(msgs)
    assert roomy.compress(msgs) == msgs and roomy.compression_count == 0
    tight = CacheAwareEngine(context_length=size * 5, settings=CacheAwareSettings(batch=2, min_horizon=1, rewrite_every=0, min_gain=0.0, fold_floor=0.15), originals=Originals(store, "s2"))
    assert not tight.roomy(size) and tight.should_compress_preflight(msgs)
    assert len(tight.compress(msgs)) < len(msgs)
    # a giant new output is cut whatever the floor says: it was never cached, and could not fit
    giant = [*_session(2), {"role": "assistant", "content": None, "tool_calls": [{"id": "g", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "g", "content": _output(99, lines=3000)}]
    big = CacheAwareEngine(context_length=400_000, settings=CacheAwareSettings(fold_floor_tokens=0), originals=Originals(store, "s3"))
    assert big.roomy(sum(big._tokens(m) for m in giant)) and big.should_compress_preflight(giant)
    assert CUT_MARK in big.compress(giant)[-1]["content"]


def test_the_fold_floor_is_a_share_of_the_window_capped_in_tokens() -> None:
    assert CacheAwareEngine(context_length=32_000).floor_tokens == 16_000
    assert CacheAwareEngine(context_length=200_000).floor_tokens == 24_000
    uncapped = CacheAwareEngine(context_length=200_000, settings=CacheAwareSettings(fold_floor_tokens=0))
    assert uncapped.floor_tokens == 100_000
    assert CacheAwareEngine(context_length=32_000, settings=CacheAwareSettings(fold_floor=0.0)).floor_tokens == 0
    with pytest.raises(Exception, match="fold_floor"):
        Config.from_dict({"cacheaware": {"fold_floor": 1.5}})


def test_recent_outputs_stay_whole_and_batches_wait() -> None:
    eng = _engine(keep_recent=3, batch=6, batch_tokens=10**9)
    short = _session(8)  # 5 outputs waiting: below the batch
    assert not eng.should_compress_preflight(short)
    full = _session(9)  # 6 waiting: a batch is due
    assert eng.should_compress_preflight(full)
    snapshot = copy.deepcopy(full)
    out = eng.compress(full)
    assert full == snapshot  # input untouched
    assert _valid(out) and len(out) == len(full)
    tools = [m["content"] for m in out if m["role"] == "tool"]
    assert all(t.startswith(CUT_MARK) for t in tools[:6])
    assert tools[6:] == [m["content"] for m in full if m["role"] == "tool"][6:]
    assert eng.compression_count == 1 and eng.last_report is not None and eng.last_report.replaced


def test_cut_records_keep_head_tail_and_the_facts_of_the_middle() -> None:
    eng = _engine(keep_recent=1, batch=1)
    msgs = _session(2)
    out = eng.compress(msgs)
    record = out[3]["content"]
    assert record.startswith(CUT_MARK) and "bash output" in record
    assert "0: line 0 of output 0" in record and "59: line 59 of output 0" in record
    assert record.count("\n[facts]\n") == 1  # the kit's one fact-block format
    assert "ERROR: build failed in src/main/java/App0.java" in record
    assert "https://example.com/docs/0" in record
    assert "line 20 of output 0" not in record
    facts = extract_facts(msgs[:4])
    assert not missing_facts(facts, context_text(out)).all()


def test_the_cut_prefix_is_never_touched_again() -> None:
    eng = _engine(keep_recent=2, batch=2)
    msgs = _session(4)
    first = eng.compress(msgs)
    grown = [*first, *_session(8)[len(msgs):]]
    second = eng.compress(grown)
    cut_end = max(i for i, m in enumerate(first) if str(m.get("content", "")).startswith(CUT_MARK))
    assert second[: cut_end + 1] == first[: cut_end + 1]
    again = eng.compress(second)
    assert again == second and again is not second  # nothing left to do: an equal, new list


def test_deterministic() -> None:
    msgs = _session(12)
    assert _engine(batch=4).compress(msgs) == _engine(batch=4).compress(msgs)


def test_giant_new_output_is_cut_before_it_is_sent_and_recallable(store: SqliteStore) -> None:
    eng = _engine(store, context_length=10_000, keep_recent=3, giant_ratio=0.1)
    msgs = _session(1, lines=3000)  # one fresh output far above 10 % of the window
    assert eng.should_compress_preflight(msgs)
    out = eng.compress(msgs)
    record = out[-1]["content"]
    assert record.startswith(CUT_MARK)
    assert sum(len(str(m.get("content"))) for m in out) < 10_000
    assert eng.retrievable("1500: line 1500 of output 0 with some words in it")
    # the marker names a node that the store-backed recall expands to the original, verbatim
    ref = record.split("ref=", 1)[1].split(":", 1)[0]
    answer = json.loads(Recall(store, "s1").handle("ctx_expand", {"id": ref, "max_tokens": 100_000}))
    assert answer["messages"][0]["message"]["content"] == msgs[-1]["content"]
    assert eng.get_tool_schemas() == []  # recall tools are the kernel's, offered for every engine


def test_without_a_store_every_fact_stays_in_context() -> None:
    eng = _engine(context_length=10_000, keep_recent=3, giant_ratio=0.1)
    msgs = _session(1, lines=3000)
    out = eng.compress(msgs)
    assert not missing_facts(extract_facts(msgs), context_text(out)).all()
    assert not eng.retrievable("1500: line 1500 of output 0 with some words in it")


def test_old_turns_fold_into_digests_over_the_threshold_keeping_users(store: SqliteStore) -> None:
    eng = _engine(store, context_length=6_000, keep_recent=2, batch=1, fold_ratio=0.25, fold_target=0.1, fold_tasks=False)
    msgs: list[Message] = [{"role": "system", "content": "sys"}]
    for t in range(4):
        msgs.append({"role": "user", "content": f"task {t}: fix src/t{t}.py"})
        for k in range(3):
            cid = f"t{t}c{k}"
            msgs.append({"role": "assistant", "content": f"working on {t}.{k}", "tool_calls": [{"id": cid, "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": f"run {t} {k}"})}}]})
            msgs.append({"role": "tool", "tool_call_id": cid, "content": _output(t * 10 + k, 40)})
    out = eng.compress(msgs)
    assert _valid(out)
    assert any(str(m.get("content", "")).startswith(DIGEST_MARK) for m in out)
    assert [m["content"] for m in out if m["role"] == "user" and not str(m["content"]).startswith("[ctxengine:")] == [m["content"] for m in msgs if m["role"] == "user"]
    assert out[0] == msgs[0]
    facts = extract_facts(msgs)
    missing = missing_facts(facts, context_text(out))
    for k in FACT_KINDS:
        assert all(eng.retrievable(f) for f in getattr(missing, k)), k


def test_a_finished_turn_is_folded_when_the_next_one_starts() -> None:
    eng = _engine(keep_recent=1, batch=100, batch_tokens=10**9, fold_run_tokens=500)
    msgs = [*_session(6), {"role": "user", "content": "Next task: update the docs."}]
    assert eng.should_compress_preflight(msgs)
    out = eng.compress(msgs)
    assert out[2]["content"].startswith(DIGEST_MARK) and out[2]["role"] == "assistant"
    assert out[-1] == msgs[-1] and _valid(out)
    assert "bash" in out[2]["content"]


def test_a_finished_turn_is_folded_with_its_earlier_digests_into_one(store: SqliteStore) -> None:
    eng = _engine(store, keep_recent=1, batch=3, batch_tokens=10**9, fold_batches=True, fold_run_tokens=500, fold_tasks=False)
    msgs = _session(5)
    first = eng.compress(msgs)  # a batch of the turn: one digest, the last exchange whole
    assert sum(str(m.get("content", "")).startswith(DIGEST_MARK) for m in first) == 1
    msgs = [*first, *_session(9)[len(msgs) :], {"role": "user", "content": "Next task: update the docs."}]
    assert eng.should_compress_preflight(msgs)
    out = eng.compress(msgs)
    digests = [m for m in out if str(m.get("content", "")).startswith(DIGEST_MARK)]
    # the turn's first digest and the rest of its run are one digest now; the last exchange,
    # the most recent output, stays whole before the new user message
    assert len(digests) == 1 and out[2] is digests[0] and out[-3:] == msgs[-3:] and _valid(out)
    assert "- bash: cat src/f7.txt" in digests[0]["content"]
    missing = missing_facts(extract_facts(_session(9)), context_text(out))
    assert missing.all() and all(eng.retrievable(f) for f in missing.all())


def test_what_an_earlier_turn_left_whole_is_folded_with_its_digest(store: SqliteStore) -> None:
    eng = _engine(store, keep_recent=2, batch=4, batch_tokens=10**9, fold_batches=True, fold_run_tokens=500, fold_tasks=False)
    msgs = [*_session(6), {"role": "user", "content": "Next task: update the docs."}]
    ended = eng.compress(msgs)  # the finished turn: one digest, its last two exchanges whole
    assert ended[2]["content"].startswith(DIGEST_MARK) and ended[3:] == msgs[-5:]
    nxt = [{**m, "tool_call_id": f"n{m['tool_call_id']}"} if m["role"] == "tool" else m for m in _session(6)[2:]]
    nxt = [{**m, "tool_calls": [{**m["tool_calls"][0], "id": f"n{m['tool_calls'][0]['id']}"}]} if m["role"] == "assistant" else m for m in nxt]
    out = eng.compress([*ended, *nxt])
    assert _valid(out)
    # the earlier turn: one digest (its digest and the exchanges it left), then its user message
    assert out[2]["content"].startswith(DIGEST_MARK) and out[3] == msgs[-1]
    assert "Earlier: [ctxengine:digest" in out[2]["content"] and "- bash: cat src/f5.txt" in out[2]["content"]
    assert out[4]["content"].startswith(DIGEST_MARK) and out[-4:] == nxt[-4:]
    assert len(out) == 9


def _next_task(k: int, groups: int) -> list[Message]:
    """A later task of the same session: its user message and run (ids of its own)."""
    out: list[Message] = [{"role": "user", "content": f"Task {k}: update docs/part{k}.md.\n" + "Here is how to work. " * 40}]
    for m in _session(groups)[2:]:
        if m["role"] == "tool":
            out.append({**m, "tool_call_id": f"t{k}{m['tool_call_id']}"})
        else:
            out.append({**m, "tool_calls": [{**m["tool_calls"][0], "id": f"t{k}{m['tool_calls'][0]['id']}"}]})
    return out


def test_a_finished_task_folds_with_its_user_message_once_the_next_one_begins(store: SqliteStore) -> None:
    eng = _engine(store, keep_recent=2, batch=100, batch_tokens=10**9, fold_run_tokens=500, task_users="all")
    first = [{"role": "system", "content": "You are an agent."}, *_next_task(1, 6)]
    msgs = [*first, _next_task(2, 0)[0]]
    assert eng.should_compress_preflight(msgs)
    out = eng.compress(msgs)
    assert _valid(out) and out[0] == msgs[0]
    # the first task (its user message, its run but the protected tail) is one digest; its
    # last two exchanges (the model has not seen the newest yet) and the new task stay whole
    assert out[1]["content"].startswith(DIGEST_MARK) and out[1]["role"] == "user"
    assert "User: Task 1: update docs/part1.md." in out[1]["content"] and "- bash: cat src/f3.txt" in out[1]["content"]
    assert out[2:] == msgs[-5:]
    assert not any(m["content"] == first[1]["content"] for m in out) and eng.retrievable(first[1]["content"])
    missing = missing_facts(extract_facts(msgs), context_text(out))
    assert missing.all() and all(eng.retrievable(f) for f in missing.all())
    # what the first task left whole folds with the second task at the third one; the latest
    # user message stays verbatim
    second = [*out, *_next_task(2, 5)[1:], _next_task(3, 0)[0]]
    again = eng.compress(second)
    assert _valid(again) and again[1] == out[1] and again[2]["content"].startswith(DIGEST_MARK)
    assert "User: Task 2: update docs/part2.md." in again[2]["content"] and "- bash: cat src/f5.txt" in again[2]["content"]
    assert again[3:] == second[-5:] and again[-1]["content"].startswith("Task 3:")


def test_by_default_a_finished_task_folds_only_the_user_messages_sent_again_later(store: SqliteStore) -> None:
    eng = _engine(store, keep_recent=2, batch=100, batch_tokens=10**9, fold_run_tokens=500)
    demo: Message = {"role": "user", "content": "Here is a demonstration of how to work.\n" + "open src/Demo.java, then edit it. " * 60}
    first = _next_task(1, 6)
    msgs = [{"role": "system", "content": "You are an agent."}, demo, *first, demo, _next_task(2, 0)[0]]
    out = eng.compress(msgs)
    assert _valid(out) and out[0] == msgs[0]
    # the demonstration comes again with the next task: its first copy folds; the first task's
    # own request stays verbatim between the digests of what came before and after it
    assert out[1]["content"].startswith(DIGEST_MARK) and out[1]["role"] == "user" and "User: Here is a demonstration" in out[1]["content"]
    assert out[2] == first[0]
    assert out[3]["content"].startswith(DIGEST_MARK) and "- bash: cat src/f3.txt" in out[3]["content"]
    assert out[4:] == msgs[-6:]
    assert sum(m == demo for m in out) == 1 and eng.retrievable(demo["content"])


def test_without_a_store_or_with_fold_tasks_off_user_messages_are_never_folded(store: SqliteStore) -> None:
    msgs = [{"role": "system", "content": "You are an agent."}, *_next_task(1, 6), _next_task(2, 0)[0]]
    for eng in (_engine(keep_recent=2, batch=100, batch_tokens=10**9, fold_run_tokens=500), _engine(store, keep_recent=2, batch=100, batch_tokens=10**9, fold_run_tokens=500, fold_tasks=False)):
        out = eng.compress(msgs)
        assert _valid(out) and out[1] == msgs[1] and out[2]["content"].startswith(DIGEST_MARK) and out[-1] == msgs[-1]


def test_batches_fold_into_digests_of_actions_and_facts(store: SqliteStore) -> None:
    eng = _engine(store, keep_recent=2, batch=4, fold_batches=True)
    msgs = _session(8)
    out = eng.compress(msgs)
    assert _valid(out)
    digests = [m["content"] for m in out if str(m.get("content", "")).startswith(DIGEST_MARK)]
    assert len(digests) == 1 and "- bash: cat src/f0.txt" in digests[0]
    assert out[-4:] == msgs[-4:]  # the recent exchanges stay whole
    missing = missing_facts(extract_facts(msgs), context_text(out))
    assert all(eng.retrievable(f) for f in missing.all())


def test_a_small_gain_is_not_worth_a_rewrite() -> None:
    eng = _engine(keep_recent=1, batch=1, min_gain=0.5, cut_min_tokens=1)
    msgs = _session(2, lines=40)
    out = eng.compress(msgs)
    assert out == msgs and eng.compression_count == 0


def test_one_prefix_rewrite_per_n_turns() -> None:
    eng = _engine(keep_recent=1, batch=1, rewrite_every=3)
    eng.compress(_session(3))
    assert eng.compression_count == 1
    assert not eng.should_compress_preflight(_session(5))
    for _ in range(3):
        eng.update_from_response({"prompt_tokens": 1000})
    assert eng.should_compress_preflight(_session(5))


def test_batches_weigh_the_cache_reads_the_provider_reported() -> None:
    """After a compaction, usage with no cache reads (a placement that only keeps the system
    prompt warm) makes the next batch wait until it pays for a full rewrite."""
    decisions = []
    for reads_all in (True, False):
        eng = CacheAwareEngine(context_length=100_000, settings=CacheAwareSettings(keep_recent=1, batch=2, batch_tokens=10**9, min_horizon=1, fold_batches=False, rewrite_every=0, fold_floor=0.0))
        for _ in range(20):  # a session with some history: the first batch pays
            eng.update_from_response({"prompt_tokens": 1000})
        msgs = _session(12)
        out = eng.compress(msgs)
        assert out != msgs and eng.last_report is not None
        eng.update_from_response({"prompt_tokens": 5000, "cache_read_input_tokens": 10**6 if reads_all else 0, "cache_creation_input_tokens": 100})
        grown = [*out, *_session(14)[len(msgs):]]
        decisions.append(eng.should_compress_preflight(grown))
    assert decisions == [True, False]


def test_a_finished_run_not_worth_folding_leaves_the_next_turns_cheap() -> None:
    """A finished run of tool exchanges that folding would not free enough of a large window
    for is declined by ``compress``; the preflight then does not ask for it again on every
    turn (which sent each turn of a long Claude session to a worker thread for nothing)."""
    from ctxengine.config import Config
    from ctxengine.manager import ContextManager

    mgr = ContextManager(Config(), model="claude-sonnet-4.5", store=None)
    msgs: list[Message] = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix the failing test in src/app."}]
    for i in range(8):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"cmd": f"cat src/app/m{i}.py"})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "\n".join(f"src/app/m{i}.py:{k}: value_{i}_{k} = compute({k}, {i})" for k in range(20))})
    msgs += [{"role": "assistant", "content": "The test passes now."}, {"role": "user", "content": "Thanks. Now the docs."}]
    out = mgr.prepare(msgs, session_id="t")
    out = mgr.prepare([*out, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "And the docs?"}], session_id="t")
    assert mgr.status("t")["compactions"] == 0  # folding the run frees too little of a 200K window
    for k in range(3):  # the following turns only append: each is a cheap turn
        out = [*out, {"role": "assistant", "content": f"step {k}"}, {"role": "user", "content": f"go on {k}"}]
        assert mgr.prepare(out, session_id="t", may_compact=False) == out


def test_the_newest_output_is_never_cut_to_get_under_the_threshold() -> None:
    """When nothing foldable gets the context under the threshold, a protected output is cut,
    but not the one the model has not read yet (it was cut before it was ever seen: a Codex
    session at 16K read every other file cut); the one it has read is."""
    msgs = _session(2, lines=300)
    msgs[-1] = {**msgs[-1], "content": _output(1, 400)}  # the newest is the largest
    eng = _engine(keep_recent=2, context_length=12_000)
    out = eng.compress(msgs, current_tokens=eng.threshold_tokens + 1)
    assert _valid(out)
    assert out[-1] == msgs[-1]  # the newest output whole
    assert out[3]["content"].startswith(CUT_MARK)  # the one already read is cut
    assert eng.last_report is not None and eng.last_report.notes == ["cut the protected output at message 3 to get under the threshold"]


def test_a_batch_that_cannot_be_worth_folding_is_not_asked_for() -> None:
    """In a window far larger than the session a due batch can never free ``min_gain`` of the
    threshold, and ``compress`` declines it: the preflight does not ask for it every turn (each
    such turn ran a compaction that changed nothing, ~12 ms)."""
    msgs = _session(12)
    small = _engine(keep_recent=2, batch=4, batch_tokens=10**9, min_gain=0.02, context_length=200_000)
    assert small.should_compress_preflight(msgs)
    huge = _engine(keep_recent=2, batch=4, batch_tokens=10**9, min_gain=0.02, context_length=10_000_000)
    assert not huge.should_compress_preflight(msgs)
    assert huge.compress(msgs) == msgs  # what it would have run: nothing changes


def test_records_go_to_a_store_that_only_records_and_adds_nodes_one_by_one() -> None:
    """A store without batched node writes (``storage.NodeBatchStore``): the compacted context
    is recorded when the first record takes its ids, and each kept record's node is added."""
    from ctxengine.engines.kit.originals import Originals, Refs
    from ctxengine.storage import NodeStage

    class Minimal:
        def __init__(self) -> None:
            self.recorded: list[int] = []
            self.nodes: list[tuple[str, list[tuple[str, str]]]] = []

        def record_messages(self, session_id: str, messages: Any) -> list[str]:
            self.recorded.append(len(messages))
            return [f"m{i}" for i in range(len(messages))]

        def add_node(self, session_id: str, node_id: str, *, depth: int, text: str, children: Any, meta: Any = None) -> bool:
            self.nodes.append((node_id, list(children)))
            return True

    store = Minimal()
    originals = Originals(store, "s", stage=NodeStage())  # a stage is ignored: the store cannot take it
    assert originals.stage is None
    msgs = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "b"}]
    refs = Refs(originals, msgs)
    kept = refs.node([1, 2], kind="digest", text="[digest] a b")
    dropped = refs.node([2], kind="cut", text="[cut] b")
    assert store.recorded == [3] and kept != dropped
    refs.commit({"[digest] a b"})
    assert store.nodes == [(kept, [("message", "m1"), ("message", "m2")])]
