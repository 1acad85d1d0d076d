"""The compressor engine: budgets, the four phases, roles, iterative summaries, failure paths."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import pytest

from ctxengine.config import Config
from ctxengine.engine import Services
from ctxengine.engines.compressor import SUMMARY_PREFIX, ContextCompressor
from ctxengine.errors import SummarizerAuthError, SummarizerError
from ctxengine.messages import Message, content_text, is_summary, validate
from ctxengine.registry import create_engine
from ctxengine.summarize.extractive import ExtractiveSummarizer
from ctxengine.summarize.llm import LlmSummarizer
from ctxengine.tokens import estimate, estimate_messages_tokens

NOTE = "[Note: Some earlier conversation turns have been compacted"


def call(cid: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def tool_turn(cid: str, name: str, output: str, **args: Any) -> list[Message]:
    return [
        {"role": "assistant", "content": None, "tool_calls": [call(cid, name, **args)]},
        {"role": "tool", "tool_call_id": cid, "content": output},
    ]


def seed_example() -> list[Message]:
    """The seed's before/after example: 45 messages of a FastAPI session."""
    msgs: list[Message] = [
        {"role": "system", "content": "You are a helpful assistant..."},
        {"role": "user", "content": "Help me set up a FastAPI project"},
        *tool_turn("c1", "terminal", "directory created", command="mkdir project"),
        *tool_turn("c2", "write_file", "file written (2.3KB)", path="main.py"),
    ]
    # "... 30 more turns of file editing, testing, debugging ..." (messages 6..37)
    files = ["main.py", "tests/test_api.py", "requirements.txt", "app/models.py"]
    for k in range(16):
        f = files[k % len(files)]
        body = f"# {f} revision {k}\n" + ("def handler():\n    return {'ok': True}\n" * 50)
        msgs += tool_turn(f"e{k}", "write_file" if k % 2 else "read_file", body, path=f)
    msgs += tool_turn("c38", "terminal", "8 passed, 2 failed\nFAILED tests/test_api.py::test_create_user - AssertionError\n" + "." * 5000, command="pytest")
    msgs.append({"role": "user", "content": "Fix the failing tests"})
    msgs += tool_turn("c41", "read_file", "import pytest\n" + "x = 1\n" * 500, path="tests/test_api.py")
    msgs.append({"role": "assistant", "content": "I see the issue with the test fixtures..."})
    msgs.append({"role": "user", "content": "Great, also add error handling"})
    assert len(msgs) == 45
    return msgs


def make(context_length: int = 20_000, **kw: Any) -> ContextCompressor:
    # these tests exercise the summary path: cutting outputs first would often make it unneeded
    kw.setdefault("cut_before_summary", False)
    return ContextCompressor(context_length=context_length, **kw)


# -- budgets and accounting -----------------------------------------------------------------------


def test_seed_computed_values_for_a_200k_model() -> None:
    e = ContextCompressor(context_length=200_000)
    assert e.threshold_tokens == 100_000
    assert e.tail_token_budget == 20_000
    assert e.max_summary_tokens == 10_000


def test_summary_budget_is_clamped() -> None:
    e = ContextCompressor(context_length=200_000)
    assert e.summary_budget(1_000) == 2_000
    assert e.summary_budget(30_000) == 6_000
    assert e.summary_budget(500_000) == 10_000
    big = ContextCompressor(context_length=1_000_000)
    assert big.summary_budget(10_000_000) == 12_000
    # a 32K window's ceiling (1,600) is under the floor: the floor wins
    assert ContextCompressor(context_length=32_000).summary_budget(50_000) == 2_000


def test_update_model_recomputes_budgets() -> None:
    e = ContextCompressor(context_length=200_000)
    e.update_model("small", 32_000)
    assert (e.context_length, e.threshold_tokens, e.tail_token_budget, e.max_summary_tokens) == (32_000, 16_000, 3_200, 1_600)


def test_should_compress_prefers_real_prompt_tokens() -> None:
    e = ContextCompressor(context_length=10_000)
    assert not e.should_compress()
    e.update_from_response({"prompt_tokens": 6_000, "completion_tokens": 10, "total_tokens": 6_010})
    assert (e.last_prompt_tokens, e.last_completion_tokens, e.last_total_tokens) == (6_000, 10, 6_010)
    assert e.should_compress()
    assert not e.should_compress(prompt_tokens=4_999)
    e.update_from_response({"input_tokens": 100, "output_tokens": 5})
    assert not e.should_compress()


def test_preflight_uses_the_estimate() -> None:
    e = ContextCompressor(context_length=1_000)
    small = [{"role": "user", "content": "hi"}]
    big = [{"role": "user", "content": "x" * 4_000}]
    assert not e.should_compress_preflight(small)
    assert e.should_compress_preflight(big)


def test_preflight_anchors_on_the_last_real_count() -> None:
    e = ContextCompressor(context_length=10_000)
    sent: list[Message] = [{"role": "user", "content": "hi"}]
    assert not e.should_compress_preflight(sent)
    e.update_from_response({"prompt_tokens": 4_990, "completion_tokens": 5})
    grown = [*sent, {"role": "assistant", "content": "x" * 200}]
    # the provider's 4,990 plus the estimate of what was appended, not an estimate of all
    assert e.should_compress_preflight(grown)
    # a list that does not start with what was sent is estimated from scratch
    assert not e.should_compress_preflight([{"role": "user", "content": "another conversation"}])


def test_disabled_engine_never_fires() -> None:
    e = ContextCompressor(context_length=1_000, enabled=False)
    assert not e.should_compress(prompt_tokens=10_000)


# -- the seed's before/after example -------------------------------------------------------------------


def test_seed_before_after_example() -> None:
    before = seed_example()
    snapshot = copy.deepcopy(before)
    # giant_ratio: the seed's example predates cutting giant outputs, and its 3K-token pytest
    # output is over 8 % of this 20K window (test_a_giant_output_is_cut_even_in_the_tail)
    e = make(20_000, protect_first_n=2, protect_last_n=5, giant_ratio=0.5)
    tokens = estimate_messages_tokens(before)
    assert tokens >= e.threshold_tokens
    after = e.compress(before, current_tokens=tokens)

    assert before == snapshot, "the input was mutated"
    assert len(after) == 8
    assert [m["role"] for m in after] == ["system", "user", "assistant", "user", "assistant", "tool", "assistant", "user"]
    assert after[0]["content"].startswith("You are a helpful assistant...")
    assert NOTE in after[0]["content"]
    assert after[1] is before[1]
    summary = content_text(after[2]["content"])
    assert summary.startswith(SUMMARY_PREFIX)
    for heading in ("## Goal", "## Progress", "### Done", "## Relevant Files", "## Next Steps", "## Critical Context"):
        assert heading in summary
    for fact in ("main.py", "tests/test_api.py", "requirements.txt", "mkdir project", "pytest"):
        assert fact in summary
    assert after[3:] == before[40:]
    assert all(a is b for a, b in zip(after[3:], before[40:], strict=True))
    assert not [v for v in validate(after) if v.severity == "error"]
    r = e.last_report
    assert r is not None and r.fallback is None
    assert (r.messages_before, r.messages_after) == (45, 8)
    assert r.replaced == list(range(2, 40))
    assert r.tokens_after < r.tokens_before
    assert e.compression_count == 1
    assert e._previous_summary is not None and "## Goal" in e._previous_summary


def test_second_compression_updates_the_summary_and_keeps_the_system_prompt() -> None:
    e = make(20_000, protect_first_n=2, protect_last_n=5)
    first = e.compress(seed_example())
    system_after_first = copy.deepcopy(first[0])
    more = list(first)
    for k in range(14):
        more += tool_turn(f"n{k}", "edit_file", f"edited src/handlers/err{k}.py\n" + "y = 2\n" * 300, path=f"src/handlers/err{k}.py")
    more.append({"role": "user", "content": "Now document it"})
    second = e.compress(more)
    assert second[0] == system_after_first, "the system prompt changed after the first compression"
    assert content_text(second[0]["content"]).count(NOTE) == 1
    summaries = [m for m in second if is_summary(m)]
    assert len(summaries) == 1
    text = content_text(summaries[0]["content"])
    # updated, not restarted: facts of the first span survive next to the new ones
    assert "tests/test_api.py" in text and "requirements.txt" in text
    assert "src/handlers/err0.py" in text
    assert e.compression_count == 2
    # the second compression summarized many messages, not just one
    assert e.last_report is not None and len(e.last_report.replaced) > 10
    assert second[-1] == {"role": "user", "content": "Now document it"}


def test_focus_topic_reaches_the_summary() -> None:
    e = make(20_000, protect_first_n=2, protect_last_n=5)
    out = e.compress(seed_example(), focus_topic="database migrations")
    assert "Focus: database migrations" in content_text(out[2]["content"])


def test_under_the_threshold_nothing_changes() -> None:
    e = make(200_000)
    msgs = seed_example()
    out = e.compress(msgs)
    assert out == msgs
    assert e.compression_count == 0


def test_default_head_keeps_the_first_exchange_whole() -> None:
    e = make(20_000)
    msgs = seed_example()
    out = e.compress(msgs)
    # protect_first_n=3 ends inside the first tool group: the group stays whole in the head
    assert out[1] is msgs[1] and out[3] is msgs[3]
    assert is_summary(out[4])
    assert not [v for v in validate(out) if v.severity == "error"]


def test_pruned_tool_outputs_are_cleared_for_the_summarizer() -> None:
    seen: list[Sequence[Message]] = []

    class Recording(ExtractiveSummarizer):
        def summarize(self, span: Sequence[Message], **kw: Any) -> str:
            seen.append(span)
            return super().summarize(span, **kw)

    e = make(20_000, protect_first_n=2, protect_last_n=5, summarizer=Recording())
    e.compress(seed_example())
    tools = [m for m in seen[0] if m["role"] == "tool"]
    long_ones = [m for m in tools if "revision" in content_text(m["content"])]
    assert long_ones and all(content_text(m["content"]).startswith("[Old tool output cleared to save context space]") for m in long_ones)
    assert any(content_text(m["content"]) == "directory created" for m in tools)  # short: kept


# -- roles, users, groups ------------------------------------------------------------------------------------


def agent_session(n_groups: int, size: int = 2_000) -> list[Message]:
    msgs: list[Message] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Demo of the tools"},
        {"role": "user", "content": "Task: fix the bug in src/app/core.py, never touch tests/"},
    ]
    for k in range(n_groups):
        msgs += tool_turn(f"id{k % 3}", "bash", f"out {k} src/pkg/f{k}.java\n" + "z" * size, command=f"cat src/pkg/f{k}.java")
    return msgs


def test_summary_never_creates_two_consecutive_same_role_messages() -> None:
    msgs = agent_session(40)  # head ends with a user message, the tail starts with an assistant
    out = make(20_000).compress(msgs)
    non_system = [m for m in out if m["role"] != "system"]
    assert non_system[0]["role"] == "user"
    k = next(i for i, m in enumerate(out) if is_summary(m))
    assert out[k]["role"] != out[k - 1]["role"] or out[k - 1] is msgs[k - 1]
    if k + 1 < len(out):
        assert out[k]["role"] != out[k + 1]["role"]
    assert not [v for v in validate(out) if v.severity == "error"]
    # ids repeat across groups (real data does this): results still follow their own call
    assert out[-1] is msgs[-1]


def test_parallel_tool_calls_are_never_split() -> None:
    msgs = agent_session(30)
    par: Message = {"role": "assistant", "content": None, "tool_calls": [call("p1", "read", path="a/b.py"), call("p2", "read", path="c/d.py")]}
    msgs += [par, {"role": "tool", "tool_call_id": "p1", "content": "A" * 3000}, {"role": "tool", "tool_call_id": "p2", "content": "B" * 3000}]
    msgs += agent_session(6)[3:]
    for last_n in range(1, 25):
        out = make(20_000, protect_last_n=last_n).compress(msgs)
        assert not [v for v in validate(out) if v.severity == "error"], last_n
        if par in out:
            i = out.index(par)
            assert [m.get("tool_call_id") for m in out[i + 1 : i + 3]] == ["p1", "p2"]


def test_task_and_latest_user_messages_stay_verbatim() -> None:
    msgs = agent_session(10)
    latest = {"role": "user", "content": "Please keep the public API unchanged"}
    msgs.append(latest)
    msgs += agent_session(40)[3:]
    out = make(20_000).compress(msgs)
    assert msgs[2] in out  # the task-setting user message
    assert latest in out  # the latest user message, pulled out of the summarized span
    assert not [v for v in validate(out) if v.severity == "error"]


def test_older_user_messages_are_quoted_in_the_summary() -> None:
    msgs = agent_session(5)
    for k in range(8):
        msgs.append({"role": "user", "content": f"Constraint {k}: use tabs in file{k}.py"})
        msgs += tool_turn(f"u{k}", "bash", "q" * 3000, command="ls")
    msgs += agent_session(20)[3:]
    msgs.append({"role": "user", "content": "final question"})
    out = make(20_000).compress(msgs)
    text = "\n".join(content_text(m.get("content")) for m in out)
    for k in range(8):
        assert f"Constraint {k}: use tabs in file{k}.py" in text


def test_user_quote_budget_caps_the_quotes_and_the_rest_stays_retrievable() -> None:
    msgs = agent_session(5)
    asks = [f"Request number {k} " + "w" * 400 for k in range(6)]
    for k, ask in enumerate(asks):
        msgs.append({"role": "user", "content": ask})
        msgs += tool_turn(f"u{k}", "bash", "q" * 3000, command="ls")
    msgs += agent_session(20)[3:]
    msgs.append({"role": "user", "content": "final question"})
    e = make(20_000, user_quote_budget_tokens=250)
    out = e.compress(msgs)
    text = "\n".join(content_text(m.get("content")) for m in out)
    # the budget caps the quotes (most recent first); the others are retrievable verbatim
    quoted = [a for a in asks if a in text]
    assert quoted == asks[-len(quoted):] and 1 <= len(quoted) < len(asks)
    assert all(e.retrievable(a) for a in asks)
    assert e.last_report is not None and any("not quoted whole in the summary" in n for n in e.last_report.notes)


def test_user_messages_that_cannot_fit_go_to_recall_and_the_report_says_so() -> None:
    msgs: list[Message] = [{"role": "system", "content": "sys"}]
    asks = [f"Request number {k}: " + "w" * 600 for k in range(40)]
    for k, ask in enumerate(asks):
        msgs.append({"role": "user", "content": ask})
        msgs += tool_turn(f"u{k}", "bash", f"ok {k}", command="ls")
    e = make(4_000)
    out = e.compress(msgs)
    text = "\n".join(content_text(m.get("content")) for m in out)
    assert e.counter.count_messages(out) <= e.context_length
    gone = [a for a in asks if a not in text]
    assert gone, "40 messages of 150 tokens cannot all fit a 4,000-token window"
    # never just gone: each is retrievable verbatim, and the report says how many moved
    assert all(e.retrievable(a) for a in gone)
    assert e.last_report is not None
    assert any(f"{len(gone)} older user message(s) not quoted whole" in n for n in e.last_report.notes)


def test_a_huge_latest_output_is_cut_to_fit_the_window() -> None:
    msgs = agent_session(10)
    msgs += tool_turn("big", "bash", "\n".join(f"/repo/src/file{i}.java" for i in range(20_000)), command="find /repo")
    e = make(32_000)
    out = e.compress(msgs)
    assert estimate_messages_tokens(out) <= e.hard_limit_tokens
    assert not [v for v in validate(out) if v.severity == "error"]
    assert e.last_report is not None and any("cut" in n for n in e.last_report.notes)


# -- failures ------------------------------------------------------------------------------------------


class Failing:
    name = "failing"

    def __init__(self, exc: Exception | None = None, text: str = "") -> None:
        self.exc = exc
        self.text = text
        self.calls = 0

    def summarize(self, span: Sequence[Message], **kw: Any) -> str:
        self.calls += 1
        if self.exc is not None:
            raise self.exc
        return self.text


@pytest.mark.parametrize(
    "summarizer",
    [Failing(SummarizerError("boom")), Failing(text=""), Failing(text="just prose, no template"), Failing(RuntimeError("bug"))],
    ids=["error", "empty", "template-less", "crash"],
)
def test_summarizer_failure_falls_back_to_the_extractive_summary(summarizer: Failing) -> None:
    e = make(20_000, protect_first_n=2, protect_last_n=5, summarizer=summarizer)
    out = e.compress(seed_example())
    assert e.last_report is not None and e.last_report.fallback == "extractive"
    assert is_summary(out[2]) and "## Goal" in content_text(out[2]["content"])
    assert "tests/test_api.py" in content_text(out[2]["content"])
    assert e.get_status()["last_error"]


def test_auth_error_keeps_messages_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    e = make(20_000, summarizer=Failing(SummarizerAuthError("invalid api key")), giant_ratio=0.5)
    msgs = seed_example()
    with caplog.at_level(logging.WARNING, logger="ctxengine.compressor"):
        out = e.compress(msgs)
    assert out == msgs
    assert e.compression_count == 0
    status = e.get_status()
    assert "authentication" in status["last_error"] and "invalid api key" in status["last_error"]
    assert any("authentication" in r.getMessage() for r in caplog.records)
    assert e.last_report is not None and e.last_report.fallback == "unchanged"
    # and it does not retry every turn
    assert not e.should_compress(prompt_tokens=e.threshold_tokens + 1)


def test_auth_error_over_the_hard_limit_uses_the_deterministic_path() -> None:
    e = make(20_000, summarizer=Failing(SummarizerAuthError("invalid api key")))
    msgs = seed_example()
    out = e.compress(msgs, current_tokens=e.hard_limit_tokens + 1)
    assert len(out) < len(msgs)
    assert e.last_report is not None and e.last_report.fallback == "extractive"


def test_backoff_when_compression_cannot_get_below_the_threshold() -> None:
    # a huge head (system prompt) that compression cannot touch
    msgs: list[Message] = [{"role": "system", "content": "s" * 48_000}, {"role": "user", "content": "task"}]
    msgs += agent_session(10)[3:]
    e = make(20_000, backoff_turns=2)
    tokens = estimate_messages_tokens(msgs)
    assert e.should_compress(tokens)
    out = e.compress(msgs, current_tokens=tokens)
    after = estimate_messages_tokens(out)
    assert after >= e.threshold_tokens
    # no loop: the next two turns are skipped, then it may fire again (not disabled forever)
    assert [e.should_compress(after) for _ in range(3)] == [False, False, True]
    # and the hard limit overrides the back-off
    e.compress(out, current_tokens=after)
    assert e.should_compress(e.hard_limit_tokens)


def test_compress_loop_terminates() -> None:
    msgs: list[Message] = [{"role": "system", "content": "s" * 48_000}, {"role": "user", "content": "task"}]
    msgs += agent_session(10)[3:]
    e = make(20_000)
    e.update_from_response({"prompt_tokens": estimate_messages_tokens(msgs)})
    calls = 0
    while e.should_compress() and calls < 10:
        msgs = e.compress(msgs)
        calls += 1
    assert calls == 1


# -- configuration -----------------------------------------------------------------------------------------


def test_from_config_defaults_to_digests_with_the_extractive_summarizer_behind() -> None:
    """No summarizer configured: the default compacts with digests (folding at 55 % of the
    window), and the summary it falls back to is the extractive one (no LLM)."""
    e = create_engine(Config(), context_length=200_000)
    assert isinstance(e, ContextCompressor)
    assert e.mode == "digest"
    assert isinstance(e.summarizer, ExtractiveSummarizer)
    assert e.threshold_tokens == 110_000
    summary = create_engine(Config.from_dict({"compression": {"mode": "summary"}}), context_length=200_000)
    assert isinstance(summary, ContextCompressor) and summary.mode == "summary"
    assert summary.threshold_tokens == 100_000


def test_from_config_reads_compression_and_auxiliary() -> None:
    cfg = Config.from_dict(
        {
            "compression": {"threshold": 0.6, "target_ratio": 0.3, "protect_last_n": 7, "backoff_turns": 5},
            "auxiliary": {"compression": {"provider": "custom", "model": "qwen2.5", "base_url": "http://127.0.0.1:9/v1", "context_length": 32_000}},
        }
    )
    e = ContextCompressor.from_config(cfg.compressor, Services(context_length=100_000, config=cfg))
    assert (e.threshold_tokens, e.tail_token_budget, e.protect_last_n, e.backoff_turns) == (60_000, 18_000, 7, 5)
    assert isinstance(e.summarizer, LlmSummarizer)
    assert e.summarizer.context_length == 32_000
    assert e.get_status()["summarizer"] == "llm"


def test_compressor_keeps_the_engine_contract() -> None:
    from ctxengine.testing.contract import check_engine_contract

    report = check_engine_contract(lambda: ContextCompressor(context_length=4_000), examples=25)
    assert report.turn_compactions > 0


def test_assistant_then_user_boundary_gets_no_repeated_role() -> None:
    msgs: list[Message] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Book a flight"},
        {"role": "assistant", "content": "Sure, which date?"},
    ]
    for k in range(30):
        msgs += [{"role": "user", "content": f"detail {k} " + "d" * 600}, {"role": "assistant", "content": f"noted {k} " + "n" * 600}]
    msgs.append({"role": "user", "content": "confirm"})
    msgs.append({"role": "assistant", "content": "Confirmed."})
    e = make(20_000)
    out = e.compress(msgs)
    roles = [m["role"] for m in out]
    assert all(a != b for a, b in pairwise(roles[1:])), roles
    assert {"role": "user", "content": "confirm"} in out
    text = "\n".join(content_text(m.get("content")) for m in out)
    for m in msgs:
        if m["role"] == "user":
            assert m["content"] in text
    # a later compression separates the summary from the user's words again
    more = [*out, *msgs[3:40]]
    assert not [v for v in validate(e.compress(more)) if v.severity == "error"]


# -- the LLM summarizer inside the engine, over real HTTP ------------------------------------------------


def llm_engine(server: Any, **kw: Any) -> ContextCompressor:
    from ctxengine.clients.openai_compat import OpenAICompatClient

    client = OpenAICompatClient(base_url=server.openai_base_url, api_key="k", max_retries=0, timeout=5)
    # giant_ratio: as in test_seed_before_after_example (the seed's example predates giant cuts)
    kw.setdefault("giant_ratio", 0.5)
    return make(20_000, protect_first_n=2, protect_last_n=5, summarizer=LlmSummarizer(client, "stub", context_length=64_000), **kw)


LLM_SUMMARY = """## Goal
Set up a FastAPI project with tests and error handling
## Constraints & Preferences
- (none)
## Progress
### Done
- Created project structure
### In Progress
- Fixing 2 failing tests
### Blocked
- (none)
## Key Decisions
- (none)
## Relevant Files
- main.py — FastAPI app
## Next Steps
- Add error handling
## Critical Context
- (none)
"""


def test_llm_summary_is_used_and_the_ledger_completes_it() -> None:
    from ctxengine.testing.stub_server import StubReply, StubServer

    with StubServer([StubReply.ok(LLM_SUMMARY)]) as server:
        e = llm_engine(server)
        out = e.compress(seed_example())
        summary = content_text(out[2]["content"])
        assert "Set up a FastAPI project with tests and error handling" in summary
        # the model left these out; the ledger put them back under Critical Context
        critical = summary[summary.index("## Critical Context") :]
        for fact in ("app/models.py", "FAILED tests/test_api.py::test_create_user - AssertionError", "write_file"):
            assert fact in critical
        # facts kept verbatim in the tail are not repeated
        assert "tests/test_api.py" not in critical.replace("FAILED tests/test_api.py", "")
        assert e.last_report is not None and e.last_report.fallback is None
        assert server.calls == 1


def test_llm_failures_fall_back_and_say_so() -> None:
    from ctxengine.testing.stub_server import StubReply, StubServer

    with StubServer([StubReply.ok("no template here"), StubReply.empty()]) as server:
        e = llm_engine(server)
        out = e.compress(seed_example())
        assert server.calls == 2  # one retry, then the extractive summary
        assert e.last_report is not None and e.last_report.fallback == "extractive"
        assert "## Goal" in content_text(out[2]["content"])
        assert "after a retry" in e.get_status()["last_error"]


def test_llm_401_keeps_the_conversation_unchanged() -> None:
    from ctxengine.testing.stub_server import StubReply, StubServer

    with StubServer(default=StubReply.unauthorized()) as server:
        e = llm_engine(server)
        msgs = seed_example()
        assert e.compress(msgs) == msgs
        assert server.calls == 1
        assert "401" in e.get_status()["last_error"]


def test_without_recall_the_summary_names_no_recall_tool() -> None:
    from ctxengine.engines.kit import RecallReach

    msgs: list[Message] = [{"role": "system", "content": "sys"}]
    for k in range(40):
        msgs.append({"role": "user", "content": f"Request number {k}: " + "w" * 600})
        msgs += tool_turn(f"u{k}", "bash", f"ok {k} in /srv/app/file{k}.py\nValueError: bad {k}", command="ls")
    reach = RecallReach(tools=False)
    e = make(4_000, reach=reach)
    out = e.compress(msgs)
    text = "\n".join(content_text(m.get("content")) for m in out)
    assert "ctx_grep" not in text and "ctx_expand" not in text
    assert "kept verbatim in the session store" in text
    assert e.last_report is not None and not any("ctx_grep" in n for n in e.last_report.notes)
    # the same engine object follows the flag the host sets each turn
    reach.tools = True
    e2 = make(4_000, reach=reach)
    text2 = "\n".join(content_text(m.get("content")) for m in e2.compress(msgs))
    assert "ctx_grep" in text2


def test_a_compaction_of_pasted_files_lands_well_under_the_threshold() -> None:
    """aider pastes whole files into user messages: the summary quotes their first words and
    file names (the contents stay retrievable), so the result lands at or under
    ``TARGET_AFTER_RATIO × threshold`` and the next turns append without compacting."""
    from ctxengine.engines.compressor import TARGET_AFTER_RATIO

    msgs: list[Message] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "example"}, {"role": "assistant", "content": "ok"}]
    asks = []
    for k in range(12):
        ask = f"Please refactor src/m{k}.py"
        asks.append(ask)
        body = "\n".join(f"def f{i}(x):\n    return x + {i}" for i in range(250))
        msgs.append({"role": "user", "content": f"{ask}\n\nsrc/m{k}.py\n```python\n{body}\n```"})
        msgs.append({"role": "assistant", "content": f"src/m{k}.py\n```python\n<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n```"})
    e = make(40_000)
    out = e.compress(msgs)
    assert estimate_messages_tokens(out) <= TARGET_AFTER_RATIO * e.threshold_tokens
    assert out[-1] == msgs[-1] and out[1] == msgs[1]
    text = "\n".join(content_text(m.get("content")) for m in out)
    summary = next(content_text(m.get("content")) for m in out if is_summary(m))
    assert estimate(summary) <= e.summary_budget(10**9) + 120  # its header and end line aside
    for k, ask in enumerate(asks):
        assert ask in text  # the user's own words …
        assert f"src/m{k}.py" in text  # … and the file names stay in context
        user = msgs[3 + 2 * k]
        assert user in out or e.retrievable(user["content"])  # the pasted contents: kept or in the store
    assert any(m not in out for m in msgs[3:-4:2])  # older pasted files did move out
