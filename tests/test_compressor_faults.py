"""A standalone compressor (no store) never drops a user message, whatever its summarizer does
(issue 39, item 3): a property test over summarizer faults × session shapes.

The faults are those the fault campaign drives through a stub server (``scripts/fault_campaign.py``),
as what reaches the engine: an error (a 500, a reset, a body cut short, a timeout: the client
raises :class:`SummarizerError`), an authentication error, a bug (any exception), an empty or
template-less reply, a reply cut short mid-template, one far over its budget, and replies that
echo the user's words (whole or in part). After every compaction each user message the engine was
given is verbatim in what it returned (a message of its own, or quoted in the summary) or kept by
the engine (:meth:`ContextCompressor.retrievable`)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ctxengine.config import Config
from ctxengine.engines.compressor import ContextCompressor
from ctxengine.errors import ContextWindowError, SummarizerAuthError, SummarizerError
from ctxengine.facts import Facts
from ctxengine.manager import ContextManager
from ctxengine.messages import Message, content_text, is_summary, validate
from ctxengine.summarize.assembly import fit_ledger
from ctxengine.summarize.base import render_sections
from ctxengine.tokens import estimate, estimate_messages_tokens

TEMPLATE = render_sections({"Goal": ["- keep going"], "Progress/Done": ["- earlier work summarized"]})
FAULTS = ("error", "auth", "bug", "empty", "prose", "cut-short", "huge", "echo-half", "echo-whole", "ok")


class FaultySummarizer:
    """What a summarizer behind a faulty server hands the engine (see the module docstring)."""

    name = "faulty"

    def __init__(self, faults: list[str]) -> None:
        self.faults = faults
        self.calls = 0

    def summarize(self, span: list[Message], *, previous_summary: str | None = None, focus_topic: str | None = None, budget_tokens: int = 2000) -> str:
        fault = self.faults[self.calls % len(self.faults)]
        self.calls += 1
        users = [content_text(m.get("content")) for m in span if m.get("role") == "user"]
        if fault == "error":
            raise SummarizerError("the response body was cut short (malformed JSON)")
        if fault == "auth":
            raise SummarizerAuthError("401 invalid api key")
        if fault == "bug":
            raise RuntimeError("summarizer bug")
        if fault == "empty":
            return ""
        if fault == "prose":
            return "Sure! Here is a summary in prose."
        if fault == "cut-short":
            return TEMPLATE[: len(TEMPLATE) // 2]
        if fault == "huge":
            return render_sections({"Goal": ["- goal"], "Progress/Done": [f"- step {i} " + "x" * 200 for i in range(400)]})
        if fault == "echo-half":
            return render_sections({"Goal": [f"- {u[: len(u) // 2]}" for u in users[:6]], "Progress/Done": ["- ok"]})
        if fault == "echo-whole":
            return render_sections({"Goal": ["- keep going"], "Constraints & Preferences": [f'- User: "{u}"' for u in users[:8]], "Progress/Done": ["- ok"]})
        return TEMPLATE


@st.composite
def user_texts(draw: st.DrawFn, t: int) -> str:
    kind = draw(st.sampled_from(["short", "rule", "words", "multiline", "pasted"]))
    if kind == "short":
        return draw(st.sampled_from(["go on", "yes", "ok, next", f"now item {t}"]))
    if kind == "rule":  # one line the extractive summary lists among the constraints
        return f"You must never touch src/legacy_{t}.py and please keep the public API of item {t}"
    if kind == "words":
        n = draw(st.integers(5, 300))
        return f"request {t}: " + " ".join(draw(st.sampled_from(["handle", "item", "keep", "tidy", "src/a.py", "fix", "the", "bug"])) for _ in range(n))
    if kind == "multiline":
        return "\n".join(f"step {k} of request {t}: check module m{k}" for k in range(draw(st.integers(2, 30))))
    body = "\n".join(f"    line_{k} = compute({k})" for k in range(draw(st.integers(10, 400))))
    return f"request {t}: here is the file\nsrc/pkg/m{t}.py\n```python\n{body}\n```\nplease fix it"


@st.composite
def sessions(draw: st.DrawFn, start: int, turns: int) -> list[Message]:
    msgs: list[Message] = []
    for t in range(start, start + turns):
        msgs.append({"role": "user", "content": draw(user_texts(t))})
        for k in range(draw(st.integers(0, 2))):
            cid = f"c{t}_{k}"
            lines = draw(st.sampled_from([1, 5, 40, 400]))
            call = {"id": cid, "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/m{t}_{k}.py"})}}
            msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
            msgs.append({"role": "tool", "tool_call_id": cid, "content": "\n".join(f"line {i} of src/m{t}_{k}.py: v = f({i})" for i in range(lines))})
        msgs.append({"role": "assistant", "content": draw(st.sampled_from(["Done.", f"Done with item {t}; next.", "ok " * 200]))})
    return msgs


def users_of(msgs: list[Message]) -> list[str]:
    return [content_text(m.get("content")) for m in msgs if m.get("role") == "user" and not is_summary(m)]


def dropped_users(given: list[str], out: list[Message], engine: ContextCompressor) -> list[str]:
    sent = "\n".join(content_text(m.get("content")) for m in out)
    return [u for u in given if u not in sent and not engine.retrievable(u)]


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    faults=st.lists(st.sampled_from(FAULTS), min_size=1, max_size=3),
    window=st.sampled_from([500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000]),
    host=st.booleans(),
    data=st.data(),
)
@example(faults=["error"], window=500, host=True, data=None)
@example(faults=["error"], window=4_000, host=False, data=None)
def test_no_user_message_is_dropped_under_any_summarizer_fault(faults: list[str], window: int, host: bool, data: st.DataObject | None) -> None:
    engine = ContextCompressor(context_length=window, summarizer=FaultySummarizer(faults), quiet_mode=True)
    # host: the engine behind a manager without a store (the window cap after it), else alone
    mgr = ContextManager(Config(), model="gpt-4o", context_length=window, store=None, engine_factory=lambda: engine) if host else None
    system: Message = {"role": "system", "content": "You are a careful coding agent."}
    if data is None:  # the campaign's shape: 30 requests of ~200 words, an answer each
        campaign: list[Message] = []
        for t in range(30):
            campaign += [{"role": "user", "content": f"request 3-{t}: please handle item-3-{t} " + "and keep it tidy " * 50}, {"role": "assistant", "content": f"Done with item {t}; next."}]
        rounds = [campaign]
    else:
        n = data.draw(st.integers(1, 3), label="compactions")
        rounds = [data.draw(sessions(20 * r, data.draw(st.integers(3, 15), label="turns")), label=f"round {r}") for r in range(n)]
    given_users: list[str] = []
    msgs: list[Message] = [system]
    for new in rounds:
        msgs = [*msgs, *new]
        given_users += users_of(new)
        if mgr is None:
            out = engine.compress(msgs, current_tokens=max(estimate_messages_tokens(msgs), engine.threshold_tokens))
        else:
            try:
                out = mgr.prepare(msgs, compact=True)
            except ContextWindowError:
                continue  # nothing sent: the caller is told the window is too small
        assert not [v for v in validate(out) if v.severity == "error"]
        assert out[0] is msgs[0] or content_text(out[0].get("content")).startswith(content_text(system.get("content")))
        lost = dropped_users(given_users, out, engine)
        assert not lost, f"{len(lost)} of {len(given_users)} user messages neither verbatim nor kept (faults {faults}): {lost[0][:80]!r}"
        msgs = out


def test_the_ledgers_last_resort_lists_every_user_message_it_leaves_out() -> None:
    """When not even the ledger's headings fit beside a summary that cannot shrink, the summary
    goes alone: every user message it does not hold is listed (the engine keeps it), those the
    last ledger had quoted included."""
    summary = render_sections({"Goal": ["- goal"], "Progress/Done": [f"- step {i} of the long work" for i in range(260)]})
    users = ["go on", "now fix src/a.py", "please keep the API"]
    required = Facts(users=users, paths=[f"src/deep/pkg_{i}/module_{i}.py" for i in range(200)])
    budget = estimate(summary) + 30  # room for a few quotes, not for the facts' headings as well
    ledger = fit_ledger(
        summary, required, [], tokens_of=lambda m: 10, facts_of=lambda m: Facts(), hard_limit=100_000, context_length=200_000,
        min_output_tokens=100, shrink=lambda text, tokens: text, budget=budget, quote_budget=budget // 2,
    )
    assert estimate(ledger.text) <= budget or ledger.text == summary
    missing = [u for u in users if u not in ledger.text]
    assert missing and sorted(missing) == sorted(ledger.unquoted_users)
