"""The compressor as the default engine: cache-aware cuts, giant outputs wherever they sit, no
thrash, user messages never lost at any window, bounded summaries, Hermes' constructor."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxengine.engines.compressor import ContextCompressor
from ctxengine.engines.kit.cutpolicy import CutScan
from ctxengine.errors import ConfigError
from ctxengine.facts import Facts
from ctxengine.messages import Message, content_text, is_summary, validate
from ctxengine.summarize.assembly import split_summary
from ctxengine.summarize.ledger import TextIndex, apply_ledger
from ctxengine.tokens import EstimateCounter, estimate


def estimate_messages_tokens(messages: list[Message]) -> int:
    return EstimateCounter().count_messages(messages)


def call(cid: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def tool_turn(cid: str, output: str) -> list[Message]:
    return [
        {"role": "assistant", "content": None, "tool_calls": [call(cid, "bash", command=f"run {cid}")]},
        {"role": "tool", "tool_call_id": cid, "content": output},
    ]


def listing(n: int, tag: str = "") -> str:
    return "\n".join(f"/repo/src/{tag}module{i}/File{i}.java" for i in range(n))


def drive(engine: ContextCompressor, steps: list[list[Message]], start: list[Message]) -> tuple[list[list[Message]], list[bool]]:
    """A per-turn loop as the manager runs it: preflight/threshold, compress, send, usage."""
    sent: list[list[Message]] = []
    fired: list[bool] = []
    ctx = list(start)
    for new in steps:
        ctx = [*ctx, *new]
        tokens = estimate_messages_tokens(ctx)
        fire = engine.should_compress(tokens) or engine.should_compress_preflight(ctx)
        if fire:
            ctx = engine.compress(ctx, current_tokens=tokens)
        fired.append(fire and engine.last_report is not None and engine.last_report.messages_after > 0)
        sent.append(ctx)
        t = estimate_messages_tokens(ctx)
        engine.update_from_response({"prompt_tokens": t, "completion_tokens": 10, "total_tokens": t + 10})
    return sent, fired


def test_a_giant_output_in_the_protected_head_is_cut_before_it_is_sent() -> None:
    giant = listing(60_000)  # ~1M characters in the first exchange
    msgs: list[Message] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "list the repo"}, *tool_turn("c0", giant)]
    e = ContextCompressor(context_length=128_000)
    assert e.should_compress_preflight(msgs)
    out = e.compress(msgs, current_tokens=estimate_messages_tokens(msgs))
    assert estimate_messages_tokens(out) < 0.1 * 128_000
    assert out[:3] == msgs[:3]  # place kept: same head, the output cut in place
    assert content_text(out[3]["content"]).startswith("[ctxengine:cut")
    # protection keeps its facts: every path is in the record or retrievable verbatim
    text = content_text(out[3]["content"])
    for p in ("/repo/src/module0/File0.java", "/repo/src/module59999/File59999.java", "/repo/src/module31337/File31337.java"):
        assert p in text or e.retrievable(p)
    assert not [v for v in validate(out) if v.severity == "error"]


def test_a_giant_output_in_the_tail_does_not_make_it_compact_every_turn() -> None:
    e = ContextCompressor(context_length=32_000)
    start: list[Message] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    steps = [tool_turn(f"c{k}", listing(4_000, f"t{k}") if k == 3 else f"line {k}\n" * 30) for k in range(40)]
    sent, fired = drive(e, steps, start)
    assert all(estimate_messages_tokens(s) <= 32_000 for s in sent)
    run = best = 0
    for f in fired:
        run = run + 1 if f else 0
        best = max(best, run)
    assert best <= e.max_consecutive
    assert sum(fired) <= 6


def test_recent_outputs_stay_whole_and_older_ones_are_cut_in_one_batch() -> None:
    e = ContextCompressor(context_length=128_000, batch=4, cost_aware=False)
    start: list[Message] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    body = "\n".join(f"line {i} of a long output src/a/B{i}.java" for i in range(400))
    steps = [tool_turn(f"c{k}", f"output {k}\n{body}") for k in range(12)]
    sent, fired = drive(e, steps, start)
    assert any(fired)
    last = sent[-1]
    tools = [m for m in last if m.get("role") == "tool"]
    # the last keep_recent outputs are whole
    assert all(not content_text(m["content"]).startswith("[ctxengine:cut") for m in tools[-e.keep_recent :])
    assert any(content_text(m["content"]).startswith("[ctxengine:cut") for m in tools[: -e.keep_recent])
    # cuts come in batches: never on two calls in a row here, and cut records are final
    assert not any(a and b for a, b in itertools.pairwise(fired))
    for prev, cur in itertools.pairwise(sent):
        for a, b in zip(prev, cur, strict=False):
            if content_text(a.get("content")).startswith("[ctxengine:cut"):
                assert a == b


def test_a_batch_cut_waits_until_it_pays_for_the_cache_it_invalidates() -> None:
    e = ContextCompressor(context_length=128_000, batch=2)
    msgs: list[Message] = [{"role": "system", "content": "s" * 200_000}, {"role": "user", "content": "task"}]
    for k in range(6):
        msgs += tool_turn(f"c{k}", f"out {k}\n" + "y" * 2_000)
    # a huge cached prefix before two small outputs: cutting them cannot pay within 8 calls
    assert not e.should_compress_preflight(msgs)
    assert e._due_batch(msgs, [e._tokens(m) for m in msgs]) == []


def _session(n_users: int, words: int) -> list[Message]:
    msgs: list[Message] = [{"role": "system", "content": "You are terse."}]
    for k in range(n_users):
        msgs.append({"role": "user", "content": f"ask {k}: " + " ".join(f"w{k}x{j}" for j in range(words))})
        msgs += tool_turn(f"c{k}", f"done {k} in src/m{k}.py")
    return msgs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(window=st.integers(500, 8_000), n_users=st.integers(10, 120), words=st.integers(1, 60))
def test_no_user_message_is_ever_just_gone(window: int, n_users: int, words: int) -> None:
    msgs = _session(n_users, words)
    e = ContextCompressor(context_length=window)
    out = e.compress(msgs, current_tokens=max(e.threshold_tokens, estimate_messages_tokens(msgs)))
    assert not [v for v in validate(out) if v.severity == "error"]
    text = "\n".join(content_text(m.get("content")) for m in out)
    users = [content_text(m["content"]) for m in msgs if m["role"] == "user"]
    gone = [u for u in users if u not in text]
    assert all(e.retrievable(u) for u in gone)
    if gone:
        assert e.last_report is not None
        assert any(f"{len(gone)} older user message(s) not quoted whole" in n for n in e.last_report.notes)
    assert content_text(msgs[-3]["content"]) in text  # the latest user message stays verbatim


def test_a_20000_message_session_keeps_every_user_message_or_says_where_it_is() -> None:
    msgs = _session(6_667, 8)  # 20,002 messages
    e = ContextCompressor(context_length=128_000)
    out = e.compress(msgs, current_tokens=estimate_messages_tokens(msgs))
    text = "\n".join(content_text(m.get("content")) for m in out)
    users = [content_text(m["content"]) for m in msgs if m["role"] == "user"]
    kept = [u for u in users if u in text]
    assert len(kept) + sum(e.retrievable(u) for u in users if u not in text) == len(users)
    assert estimate_messages_tokens(out) <= 128_000
    # the quotes share the summary's budget (at most half of it): the most recent ones are
    # quoted, the summary stays within its budget, the rest is retrievable verbatim
    assert len(kept) > 200
    summary = next(content_text(m["content"]) for m in out if is_summary(m))
    assert estimate(split_summary(summary)[0]) <= e.max_summary_tokens


def _crowded() -> list[Message]:
    """An older user message between a large first one and a large latest one (a shape the
    contract kit found): the kept messages leave less than no room beside the summary."""

    def call(cid: str, name: str, path: str) -> dict[str, Any]:
        return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps({"path": path})}}

    notes = "\n".join(f"note {i}: the parser in src/app/main.py rejects input {i} with ValueError" for i in range(65))
    msgs: list[Message] = [
        {"role": "user", "content": "Fix the parser in src/app/main.py"},
        {"role": "user", "content": notes},
        {"role": "assistant", "content": "Looking.", "tool_calls": [call("c1", "read_file", "src/app/main.py")]},
        {"role": "tool", "tool_call_id": "c1", "content": "\n".join(f"{i:6d}  x = compute(a, b) + {i}" for i in range(1, 70))},
        {"role": "assistant", "content": "", "tool_calls": [call("c2", "bash", "deploy.sh")]},
        {"role": "tool", "tool_call_id": "c2", "content": "\n".join(f"{i}  bash: deploy.sh: Permission denied" for i in range(25))},
    ]
    for k in range(4, 10):
        msgs.append({"role": "assistant", "content": f"Checking lib/module_{k}.py next.", "tool_calls": [call(f"c{k}", "read_file", f"lib/module_{k}.py")]})
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": f"def handler_{k}():\n    raise KeyError('missing key {k}')"})
    msgs.append({"role": "assistant", "content": "", "tool_calls": [call("c3", "search", "src/app/main.py")]})
    msgs.append({"role": "tool", "tool_call_id": "c3", "content": "import os"})
    msgs.append({"role": "user", "content": "next: keep /etc/hosts.conf as it is\ndo not touch file:///tmp/report.html\nthe deploy script fails with: bash: deploy.sh: Permission denied\nand java.lang.NullPointerException: null shows up in the log\nplease rerun the tests afterwards"})
    msgs.append({"role": "user", "content": "\n".join(f"step {i}: rerun tests/test_api.py against http://localhost:8080/health and report" for i in range(100))})
    return msgs


def test_an_older_user_message_is_quoted_when_the_kept_messages_leave_no_room() -> None:
    msgs = _crowded()
    e = ContextCompressor(context_length=4_000, quiet_mode=True)
    out = e.compress(msgs, current_tokens=estimate_messages_tokens(msgs))
    older, latest = msgs[-2], msgs[-1]
    summaries = "\n".join(content_text(m.get("content")) for m in out if is_summary(m))
    assert older in out or content_text(older["content"]) in summaries
    assert latest in out
    assert not [v for v in validate(out) if v.severity == "error"]


def test_the_same_compression_in_a_fresh_process(tmp_path: Any) -> None:
    """Nothing process-wide (memo, cooldown, cache) changes what the engine writes: this
    process, warmed by other compressions, gives what a fresh interpreter gives."""
    import subprocess
    import sys

    from ctxengine.loop import fingerprint

    for window in (4_000, 8_000):  # warm whatever a compression could leave behind
        ContextCompressor(context_length=window, quiet_mode=True).compress(_session(30, 20), current_tokens=window)
    msgs = _crowded()
    here = fingerprint(ContextCompressor(context_length=4_000, quiet_mode=True).compress(msgs, current_tokens=estimate_messages_tokens(msgs)))
    (tmp_path / "msgs.json").write_text(json.dumps(msgs), encoding="utf-8")
    script = (
        "import json, sys\n"
        "from ctxengine.engines.compressor import ContextCompressor\n"
        "from ctxengine.loop import fingerprint\n"
        "from ctxengine.tokens import estimate_messages_tokens\n"
        "msgs = json.load(open(sys.argv[1], encoding='utf-8'))\n"
        "out = ContextCompressor(context_length=4_000, quiet_mode=True).compress(msgs, current_tokens=estimate_messages_tokens(msgs))\n"
        "print(fingerprint(out))\n"
    )
    fresh = subprocess.run([sys.executable, "-c", script, str(tmp_path / "msgs.json")], capture_output=True, text=True, check=True, timeout=120)
    assert fresh.stdout.strip() == here


def test_text_index_answers_like_in() -> None:
    text = "## Goal\n- fix src/a.py, then /etc/x.conf\nERROR: boom at line 3\nhttps://a.example/x?y=1."
    idx = TextIndex(text)
    for probe in ("src/a.py", "/etc/x.conf", "ERROR: boom at line 3", "https://a.example/x?y=1", "boom", "nope", "src/b.py", "a.py, then"):
        assert (probe in idx) == (probe in text), probe


def test_the_ledger_reports_user_messages_it_could_not_quote() -> None:
    facts = Facts(users=["first ask " + "a" * 400, "second ask"])
    r = apply_ledger("## Goal\n- x\n", facts, budget_tokens=1_000, user_budget_tokens=20)
    assert r.unquoted_users == ["first ask " + "a" * 400]
    assert "second ask" in r.text


class _Verbose:
    name = "verbose"

    def __init__(self, reply: str) -> None:
        self.reply = reply

    def summarize(self, span: Any, **kw: Any) -> str:
        return self.reply


TEMPLATE = "\n".join(f"## {h}\n- item" for h in ("Goal", "Constraints & Preferences", "Progress", "Key Decisions", "Relevant Files", "Next Steps", "Critical Context"))


def _long_session() -> list[Message]:
    msgs: list[Message] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    for k in range(60):
        msgs += tool_turn(f"c{k}", f"out {k}\n" + "q" * 1_500)
    msgs.append({"role": "user", "content": "next"})
    return msgs


def test_a_summary_over_its_budget_is_cut_to_it() -> None:
    flood = TEMPLATE + "\n" + "\n".join(f"- detail {i} " + "x" * 80 for i in range(5_000))
    e = ContextCompressor(context_length=20_000, summarizer=_Verbose(flood))
    out = e.compress(_long_session())
    summary = next(m for m in out if content_text(m.get("content")).startswith("[CONTEXT COMPACTION]"))
    assert estimate_messages_tokens([summary]) < e.max_summary_tokens + 2_500
    assert e.last_report is not None and any("cut to its budget" in n or "over its budget" in n for n in e.last_report.notes)


def test_a_summary_that_does_not_shrink_the_context_is_rejected() -> None:
    e = ContextCompressor(context_length=20_000, summarizer=_Verbose(TEMPLATE + "\n" + "- " + "z " * 3_000))
    msgs = _long_session()
    out = e.compress(msgs[:8] + msgs[-30:])
    assert e.last_report is not None
    if any("does not shrink" in n for n in e.last_report.notes):
        assert e.last_report.fallback == "extractive"
    assert estimate_messages_tokens(out) < estimate_messages_tokens(msgs)


def test_hermes_constructor_keywords_keep_hermes_meaning() -> None:
    e = ContextCompressor(
        "gpt-4o",
        threshold_percent=0.6,
        protect_first_n=2,
        protect_last_n=7,
        summary_target_ratio=0.95,
        quiet_mode=True,
        config_context_length=100_000,
        provider="openai",
        api_mode="chat_completions",
        abort_on_summary_failure=True,
        max_tokens=20_000,
    )
    assert e.name == "compressor"
    assert e.context_length == 100_000
    assert e.threshold_tokens == int(80_000 * 0.6)  # the reply's reservation comes out first
    assert e.summary_target_ratio == 0.80  # clamped as Hermes does
    assert (e.protect_first_n, e.protect_last_n) == (2, 7)
    assert e.abort_on_summary_failure
    e.last_prompt_tokens = -1  # hosts set sentinels while awaiting usage
    assert e.get_status()["last_prompt_tokens"] == 0
    with pytest.raises(TypeError, match="threshhold"):
        ContextCompressor(threshhold=0.5)
    with pytest.raises(ConfigError):
        ContextCompressor(context_length=0)


def test_abort_on_summary_failure_keeps_the_messages() -> None:
    class Broken:
        name = "broken"

        def summarize(self, span: Any, **kw: Any) -> str:
            from ctxengine.errors import SummarizerError

            raise SummarizerError("down")

    e = ContextCompressor(context_length=20_000, summarizer=Broken(), abort_on_summary_failure=True, giant_ratio=0.9)
    msgs = _long_session()
    msgs = [*msgs[:82], msgs[-1]]  # over the threshold, under the hard limit
    out = e.compress(msgs)
    assert out == msgs
    assert e.last_report is not None and e.last_report.fallback == "unchanged"


def test_the_per_call_check_answers_as_a_fresh_scan_does() -> None:
    body = "\n".join(f"row {i} src/x/Y{i}.java" for i in range(300))
    msgs: list[Message] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    steps = [tool_turn(f"c{k}", f"out {k}\n{body}" if k % 3 else "short") for k in range(15)]
    kept = ContextCompressor(context_length=128_000, batch=4, cost_aware=False)
    for new in steps:
        msgs = [*msgs, *new]
        fresh = ContextCompressor(context_length=128_000, batch=4, cost_aware=False)
        assert kept.should_compress_preflight(msgs) == fresh.should_compress_preflight(msgs)


def test_a_cut_that_cannot_free_what_is_needed_is_not_made() -> None:
    from ctxengine.engine import CompactionReport

    engine = ContextCompressor(context_length=32_000)
    msgs: list[Message] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    for i in range(6):
        msgs += tool_turn(f"c{i}", listing(120, tag=f"t{i}"))
    toks = [engine._tokens(m) for m in msgs]
    report = CompactionReport(engine.name, len(msgs), len(msgs), 0, 0)
    waiting = engine._waiting(msgs, toks)
    assert waiting, "the older outputs are cuttable"
    held = sum(toks[i] for i in waiting)
    same, done = engine._cut_stage(msgs, list(toks), batch=True, report=report, everything=True, need=held + 1)
    assert same is msgs and done == [] and not report.notes
    trial = list(toks)
    out, done = engine._cut_stage(msgs, trial, batch=True, report=report, everything=True, need=held)
    assert done == waiting and sum(trial) < sum(toks)
    assert all(out[i] is not msgs[i] for i in done)


def test_the_scan_carried_over_a_compaction_equals_a_fresh_scan(trajectories: list[dict[str, Any]]) -> None:
    """After each compaction the per-call scan is rebuilt from the scan of the compacted list
    (the engine got a deep copy of it, as the manager hands it): it must equal a scan of the
    result from scratch, or the next checks would decide on stale tokens and candidates."""
    def fields(s: CutScan) -> tuple[Any, ...]:
        return (s.n, s.toks, s.cum, s.total, s.groups, s.cands, s.cand_max)

    engine = ContextCompressor(context_length=32_000, quiet_mode=True)
    msgs = max((t["messages"] for t in trajectories), key=len)
    ctx: list[Message] = list(msgs[:2])
    carried = 0
    for m in msgs[2:]:
        ctx = [*ctx, m]
        tokens = estimate_messages_tokens(ctx)
        if engine.should_compress(tokens) or engine.should_compress_preflight(ctx):
            out = engine.compress(copy.deepcopy(ctx), current_tokens=tokens)
            if out != ctx:
                state = engine._scan_state
                assert state is not None and state.seen is out
                fresh = ContextCompressor(context_length=32_000, quiet_mode=True)
                assert fields(state) == fields(fresh._scan(out))
                carried += 1
            ctx = out
        t = estimate_messages_tokens(ctx)
        engine.update_from_response({"prompt_tokens": t, "completion_tokens": 10, "total_tokens": t + 10})
    assert carried >= 3


@pytest.mark.parametrize("context_length", [8_000, 32_000])
def test_the_per_call_checks_kept_incrementally_equal_a_pass_over_the_candidates(trajectories: list[dict[str, Any]], context_length: int) -> None:
    """The largest candidate (for a giant output) and the candidates before the kept tail are
    kept or found without a pass over every candidate: each call they equal that pass, through
    appended turns and compactions (the scan carried over)."""
    engine = ContextCompressor(context_length=context_length, quiet_mode=True)
    msgs = max((t["messages"] for t in trajectories), key=len)
    ctx: list[Message] = list(msgs[:2])
    seen_cands = giants = 0
    for m in msgs[2:]:
        ctx = [*ctx, m]
        scan = engine._scan(ctx)
        assert scan.cands == sorted(set(scan.cands))
        assert scan.cand_max == max((scan.toks[i] for i in scan.cands), default=-1)
        giant = any(scan.toks[i] > engine.giant_tokens for i in scan.cands)
        assert engine._giant_waits(scan) == giant
        keep = engine.keep_recent
        tail = len(ctx) if keep <= 0 or not scan.groups else scan.groups[-keep] if len(scan.groups) >= keep else scan.groups[0]
        waiting = [i for i in scan.cands if i < tail]
        due = bool(engine._batch_pays(waiting, scan.toks, scan.total, scan.cum.__getitem__))
        assert engine._scan_batch_due(ctx, scan) == due
        seen_cands += bool(scan.cands)
        giants += giant
        tokens = estimate_messages_tokens(ctx)
        if engine.should_compress(tokens) or engine.should_compress_preflight(ctx):
            ctx = engine.compress(copy.deepcopy(ctx), current_tokens=tokens)
        t = estimate_messages_tokens(ctx)
        engine.update_from_response({"prompt_tokens": t, "completion_tokens": 10, "total_tokens": t + 10})
    assert seen_cands > 0
    assert giants > 0  # a giant output was met (and cut)
