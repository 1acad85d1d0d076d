"""Summarizers: the template, the extractive summarizer, the fact ledger, the LLM summarizer
(against the stub server over real HTTP)."""

from __future__ import annotations

import json

import pytest

from ctxengine.clients.openai_compat import OpenAICompatClient
from ctxengine.errors import SummarizerAuthError, SummarizerContextError, SummarizerError
from ctxengine.facts import Facts, extract_facts
from ctxengine.messages import Message
from ctxengine.summarize.base import (
    SECTIONS,
    Summarizer,
    has_template,
    parse_sections,
    render_sections,
)
from ctxengine.summarize.extractive import ExtractiveSummarizer
from ctxengine.summarize.ledger import LEDGER_HEADING, apply_ledger
from ctxengine.summarize.llm import LlmSummarizer, chunk_span
from ctxengine.testing.stub_server import StubReply, StubServer
from ctxengine.tokens import estimate

TEMPLATE = render_sections({"Goal": ["- stub goal"], "Progress/Done": ["- stub work"]})


def span() -> list[Message]:
    return [
        {"role": "user", "content": "Fix the login bug in src/auth/login.py. Never change the public API."},
        {
            "role": "assistant",
            "content": "I will read the login module first.",
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": "src/auth/login.py"})}}],
        },
        {"role": "tool", "tool_call_id": "a", "content": "def login(user):\n    raise ValueError('bad')\n"},
        {
            "role": "assistant",
            "content": "Running the tests to see the failure.",
            "tool_calls": [{"id": "b", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": "pytest tests/test_auth.py"})}}],
        },
        {"role": "tool", "tool_call_id": "b", "content": "FAILED tests/test_auth.py::test_login - ValueError: bad\nsee https://docs.example.com/auth"},
    ]


# -- template ---------------------------------------------------------------------------------------------


def test_render_and_parse_round_trip() -> None:
    text = render_sections({"Goal": ["- g"], "Progress/Done": ["- d1", "- d2"], "Critical Context": ["- c"]})
    assert has_template(text)
    parsed = parse_sections(text)
    assert parsed["Goal"] == "- g"
    assert parsed["Progress/Done"] == "- d1\n- d2"
    assert parsed["Progress/Blocked"] == "- (none)"
    assert [s for s in SECTIONS if s in parsed] == list(SECTIONS)


def test_has_template_rejects_prose_and_partial_structure() -> None:
    assert not has_template("The user wanted a FastAPI app and we built it.")
    assert not has_template("## Goal\nx\n## Progress\ny")
    assert has_template(TEMPLATE.upper().replace("## ", "## "))  # headings are case-insensitive


# -- extractive --------------------------------------------------------------------------------------------


def test_extractive_fills_every_section_from_the_span() -> None:
    s = ExtractiveSummarizer()
    assert isinstance(s, Summarizer)
    text = s.summarize(span())
    assert has_template(text)
    sec = parse_sections(text)
    assert "Fix the login bug" in sec["Goal"]
    assert '"Fix the login bug in src/auth/login.py. Never change the public API."' in sec["Constraints & Preferences"]
    assert "read_file(src/auth/login.py)" in sec["Progress/Done"]
    assert "pytest tests/test_auth.py" in sec["Progress/Done"]
    assert "ValueError" in sec["Progress/Blocked"]
    assert "src/auth/login.py" in sec["Relevant Files"]
    assert "https://docs.example.com/auth" in sec["Critical Context"]
    assert "Running the tests" in sec["Next Steps"]


def test_extractive_is_deterministic() -> None:
    s = ExtractiveSummarizer()
    assert s.summarize(span(), focus_topic="auth") == ExtractiveSummarizer().summarize(span(), focus_topic="auth")


def test_extractive_updates_the_previous_summary() -> None:
    s = ExtractiveSummarizer()
    first = s.summarize(span()[:3])
    later: list[Message] = [
        {"role": "assistant", "content": "Patching the module.", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "edit_file", "arguments": json.dumps({"path": "src/auth/session.py"})}}]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
    ]
    second = parse_sections(s.summarize(later, previous_summary=first))
    assert "Fix the login bug" in second["Goal"]  # kept, not replaced by the new span
    assert "read_file(src/auth/login.py)" in second["Progress/Done"]  # old progress kept
    assert "edit_file(src/auth/session.py)" in second["Progress/Done"]  # new progress added
    assert "(earlier) I will read the login module first." in second["Progress/Done"]  # in progress → done
    assert "Patching the module." in second["Progress/In Progress"]


def test_extractive_respects_the_budget_by_dropping_oldest_progress() -> None:
    many: list[Message] = [{"role": "user", "content": "go"}]
    for k in range(60):
        many += [
            {"role": "assistant", "content": f"step {k}", "tool_calls": [{"id": f"x{k}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": f"make target{k} " + "v" * 80})}}]},
            {"role": "tool", "tool_call_id": f"x{k}", "content": f"built target{k}"},
        ]
    text = ExtractiveSummarizer().summarize(many, budget_tokens=600)
    small = ExtractiveSummarizer().summarize(many, budget_tokens=20_000)
    assert len(text) < len(small)
    assert "target59" in text and "make target0 " not in text


# -- ledger ---------------------------------------------------------------------------------------------------


def test_ledger_appends_missing_facts_under_critical_context() -> None:
    facts = extract_facts(span())
    result = apply_ledger(TEMPLATE, facts, budget_tokens=5_000)
    assert result.complete
    for f in facts.all():
        assert f in result.text
    sec = parse_sections(result.text)
    assert f"Critical Context/{LEDGER_HEADING[4:]}" in sec
    assert has_template(result.text)


def test_ledger_skips_facts_present_elsewhere() -> None:
    facts = Facts(paths=["src/a.py", "src/b.py"], tools=["bash"])
    result = apply_ledger(TEMPLATE + "\nsrc/a.py\n", facts, "ran bash on src/b.py", budget_tokens=1_000)
    assert result.text == TEMPLATE + "\nsrc/a.py\n"
    assert sum(result.added.values()) == 0


def test_ledger_budget_drops_paths_before_errors_and_counts_them() -> None:
    facts = Facts(errors=["Error: disk full"], paths=[f"src/pkg/module_{i}.py" for i in range(200)])
    result = apply_ledger(TEMPLATE, facts, budget_tokens=150)
    assert "Error: disk full" in result.text
    assert result.dropped["paths"] > 0 and result.dropped["errors"] == 0
    assert not result.complete
    assert "Not shown for lack of space" in result.text


def test_ledger_quotes_users_most_recent_first_within_their_budget() -> None:
    users = [f"message {i} " + "u" * 200 for i in range(5)]
    result = apply_ledger(TEMPLATE, Facts(users=users), budget_tokens=10_000, user_budget_tokens=150)
    assert users[4] in result.text
    assert users[0] not in result.text
    assert result.added["users"] >= 1 and result.dropped["users"] >= 1


# -- LLM summarizer over HTTP ------------------------------------------------------------------------------


def llm(server: StubServer, *, context_length: int = 16_000, retries: int = 1, timeout: float = 5.0) -> LlmSummarizer:
    client = OpenAICompatClient(base_url=server.openai_base_url, api_key="test-key", timeout=timeout)
    return LlmSummarizer(client, "stub-model", context_length=context_length, timeout=timeout, retries=retries, sleep=lambda _s: None)


def test_llm_summary_uses_the_prompt_files() -> None:
    with StubServer([StubReply.ok(TEMPLATE)]) as server:
        out = llm(server).summarize(span(), focus_topic="the login flow", budget_tokens=2_000)
        assert out == TEMPLATE.strip()
        req = server.requests[0]
        assert req.body["model"] == "stub-model"
        system, user = req.body["messages"]
        assert system["role"] == "system" and "## Critical Context" in system["content"]
        assert "src/auth/login.py" in user["content"] and "→ called read_file" in user["content"]
        assert "the login flow" in user["content"]
        assert req.headers["authorization"] == "Bearer test-key"


def test_llm_update_sends_the_previous_summary() -> None:
    with StubServer([StubReply.ok(TEMPLATE)]) as server:
        llm(server).summarize(span(), previous_summary="## Goal\nprevious goal text")
        assert "previous goal text" in server.requests[0].prompt_text
        assert "<previous-summary>" in server.requests[0].prompt_text


@pytest.mark.parametrize(
    "bad",
    [StubReply.empty(), StubReply.ok("Just prose without headings."), StubReply.truncated(TEMPLATE), StubReply.fail(500)],
    ids=["empty", "template-less", "truncated", "server-error"],
)
def test_llm_retries_once_then_succeeds(bad: StubReply) -> None:
    with StubServer([bad, StubReply.ok(TEMPLATE)]) as server:
        assert llm(server).summarize(span()) == TEMPLATE.strip()
        assert server.calls == 2


def test_llm_fails_after_one_retry() -> None:
    with StubServer(default=StubReply.empty()) as server:
        with pytest.raises(SummarizerError, match="after a retry"):
            llm(server).summarize(span())
        assert server.calls == 2


def test_llm_auth_error_is_not_retried() -> None:
    with StubServer(default=StubReply.unauthorized()) as server:
        with pytest.raises(SummarizerAuthError):
            llm(server, retries=2).summarize(span())
        assert server.calls == 1


def test_oversized_span_is_summarized_in_chunks_never_truncated() -> None:
    big: list[Message] = [{"role": "user", "content": "start"}]
    for k in range(30):
        big += [
            {"role": "assistant", "content": f"look at part {k}", "tool_calls": [{"id": f"c{k}", "type": "function", "function": {"name": "cat", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{k}", "content": f"MARK{k}\n" + "data line\n" * 150},
        ]
    with StubServer(default=StubReply.ok(TEMPLATE)) as server:
        s = llm(server, context_length=8_000)
        s.summarize(big, budget_tokens=2_000)
        assert server.calls > 1
        sent = "\n".join(r.prompt_text for r in server.requests)
        for k in range(30):
            assert f"MARK{k}\n" in sent  # every part reached the model
        # each request fits the summarizer's window; later ones update the running summary
        for r in server.requests:
            assert len(r.prompt_text) // 4 < 8_000
        assert all("<previous-summary>" in r.prompt_text for r in server.requests[1:])


def test_a_single_huge_message_is_split_by_lines() -> None:
    huge = [{"role": "tool", "tool_call_id": "x", "content": "\n".join(f"line {i}" for i in range(5_000))}]
    chunks = chunk_span(huge, 1_000)
    assert len(chunks) > 1
    joined = "\n".join(chunks)
    assert "line 0" in joined and "line 4999" in joined


def test_provider_context_error_halves_the_chunks() -> None:
    with StubServer([StubReply.context_too_long()], default=StubReply.ok(TEMPLATE)) as server:
        s = llm(server, context_length=16_000)
        s.summarize(span() * 3)
        assert server.calls >= 2


def test_summarizer_window_too_small_is_a_context_error() -> None:
    with StubServer() as server, pytest.raises(SummarizerContextError, match="window"):
        llm(server, context_length=3_000).summarize(span(), budget_tokens=2_000)


def test_llm_from_config_builds_the_client() -> None:
    from ctxengine.config import SummarizerConfig

    with StubServer([StubReply.ok(TEMPLATE)]) as server:
        cfg = SummarizerConfig(provider="custom", model="local-model", base_url=server.openai_base_url, context_length=32_000, max_retries=0)
        s = LlmSummarizer.from_config(cfg)
        assert s.summarize(span()) == TEMPLATE.strip()
        assert server.requests[0].body["model"] == "local-model"



def test_max_tokens_is_capped_for_the_model() -> None:
    with StubServer([StubReply.ok(TEMPLATE), StubReply.ok(TEMPLATE)]) as server:
        client = OpenAICompatClient(base_url=server.openai_base_url, api_key="k", max_retries=0)
        LlmSummarizer(client, "m", context_length=200_000, max_output_tokens=4_000).summarize(span(), budget_tokens=10_000)
        LlmSummarizer(client, "m", context_length=200_000).summarize(span(), budget_tokens=2_000)
        assert [r.body["max_tokens"] for r in server.requests] == [4_000, 3_256]


# -- bounded quotes and budgets (a client that pastes whole files into user messages) -------------


def _pasting_user(ask: str, files: dict[str, int]) -> str:
    """An aider-like user message: the request, then each file's name and its fenced contents."""
    parts = [ask, "", "I added these files to the chat:"]
    for name, lines in files.items():
        body = "\n".join(f"def f{i}(x):\n    return x + {i}  # {name}" for i in range(lines))
        parts += ["", name, "```python", body, "```"]
    return "\n".join(parts)


def test_a_pasted_file_is_quoted_by_the_users_words_and_the_file_names() -> None:
    from ctxengine.summarize.ledger import QUOTE_TOKENS, brief_quote

    text = _pasting_user("Add input validation to src/pkg/parser.py and raise ValueError.", {"src/pkg/parser.py": 300, "src/pkg/index.py": 300})
    assert len(text) > 20_000
    q = brief_quote(text, pointer="kept verbatim in the session store")
    assert q.startswith("Add input validation to src/pkg/parser.py and raise ValueError.")
    assert "src/pkg/parser.py, src/pkg/index.py" in q and "kept verbatim in the session store" in q
    assert "return x" not in q  # the pasted contents are not quoted
    assert estimate(q) <= QUOTE_TOKENS + 40
    short = "Fix the bug in src/a.py please"
    assert brief_quote(short) == short


def test_48k_characters_of_user_messages_stay_within_the_quote_budget() -> None:
    users = [_pasting_user(f"Request {k}: refactor src/m{k}.py", {f"src/m{k}.py": 160}) for k in range(12)]
    assert sum(len(u) for u in users) >= 48_000
    required = Facts(users=users)
    result = apply_ledger(TEMPLATE, required, budget_tokens=1_000, user_budget_tokens=1_000, quote_tokens=120, pointer="kept verbatim in the session store")
    added = estimate(result.text) - estimate(TEMPLATE)
    assert added <= 1_000 + 60  # headings aside
    assert result.added["users"] >= 5 and result.briefed_users
    assert "Request 11: refactor src/m11.py" in result.text  # most recent first
    assert "ctx_grep" not in result.text
    # whole (unbounded) quotes of the same messages blow far past it: the case measured with aider
    whole = apply_ledger(TEMPLATE, required, budget_tokens=100_000, user_budget_tokens=100_000)
    assert len(whole.text) > 48_000


def test_fit_ledger_keeps_summary_and_ledger_within_the_budget() -> None:
    from ctxengine.summarize.assembly import bounded, fit_ledger

    users = [_pasting_user(f"Request {k}: refactor src/m{k}.py", {f"src/m{k}.py": 160}) for k in range(12)]
    required = Facts(users=users, paths=[f"src/deep/p{i}.py" for i in range(400)], errors=[f"ValueError: bad {i}" for i in range(50)])
    summary = ExtractiveSummarizer().summarize(span(), budget_tokens=2_000)
    notes: list[str] = []
    ledger = fit_ledger(
        summary,
        required,
        [],
        tokens_of=lambda m: estimate(str(m.get("content"))),
        facts_of=lambda m: Facts(),
        hard_limit=100_000,
        context_length=128_000,
        min_output_tokens=50,
        shrink=lambda text, tokens: bounded(text, tokens, lambda n: ExtractiveSummarizer().summarize(span(), budget_tokens=n), notes),
        budget=2_000,
        quote_budget=1_000,
        quote_tokens=120,
        pointer="kept verbatim in the session store",
    )
    assert estimate(ledger.text) <= 2_000
    assert ledger.added.get("users") and not ledger.complete  # the rest is counted, not dropped silently
    assert "kept verbatim in the session store" in ledger.text


def test_the_extractive_summary_never_exceeds_its_budget_even_with_carried_context() -> None:
    prev = render_sections({"Goal": ["- g"], "Critical Context": [f"- https://example.com/page/{i}" for i in range(400)]})
    text = ExtractiveSummarizer().summarize(span(), previous_summary=prev, budget_tokens=2_000)
    assert estimate(text) <= 2_000
    assert has_template(text)


def test_rules_inside_pasted_files_are_not_the_users_constraints() -> None:
    user = _pasting_user("Please keep the API stable.", {"src/x.py": 5}) + "\n```python\n# you must never call this\n```"
    text = ExtractiveSummarizer().summarize([{"role": "user", "content": user}], budget_tokens=2_000)
    constraints = parse_sections(text)["Constraints & Preferences"]
    assert "Please keep the API stable." in constraints
    assert "must never call" not in constraints
