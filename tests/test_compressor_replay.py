"""The compressor replayed on agent sessions (the sample, and the published trajectories when
found: see tests/conftest.py) at a 32K window."""

from __future__ import annotations

from typing import Any

import pytest

from ctxengine.bench.replay import replay_session
from ctxengine.clients.openai_compat import OpenAICompatClient
from ctxengine.engine import CompactionReport
from ctxengine.engines.compressor import CUTS_SUFFICED, ContextCompressor
from ctxengine.facts import FACT_KINDS, extract_facts
from ctxengine.messages import Message
from ctxengine.summarize.llm import LlmSummarizer
from ctxengine.testing.stub_server import StubReply, StubServer
from ctxengine.tokens import estimate

WINDOW = 32_000


class Recording(ContextCompressor):
    """Keeps every report and drives compress like ``while should_compress(): compress()``."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.reports: list[CompactionReport] = []
        self.per_turn: list[int] = []

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        out = super().compress(messages, current_tokens, focus_topic)
        assert self.last_report is not None
        self.reports.append(self.last_report)
        n = 1
        while n < 5 and self.should_compress():
            out = super().compress(out)
            n += 1
        self.per_turn.append(n)
        return out


def first_non_system_is_user(requests: list[str]) -> Any:
    def hook(i: int, request: list[Message], tokens: int) -> None:
        roles = [m["role"] for m in request if m["role"] != "system"]
        if roles and roles[0] != "user":
            requests.append(f"call {i} starts with {roles[0]}")

    return hook


def paths_fit(messages: list[Message]) -> bool:
    """Whether the path facts of a session could fit next to the rest in the window at all."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return estimate("\n".join(extract_facts(messages[:last]).paths)) < WINDOW // 2


@pytest.mark.slow
def test_extractive_replay_keeps_every_fact_and_every_request_valid(trajectories: list[dict[str, Any]], dataset: Any) -> None:
    bad_starts: list[str] = []
    compacted = 0
    for t in trajectories:
        engine = Recording(context_length=WINDOW)
        r = replay_session(t["messages"], engine, session_id=t["id"], on_request=first_non_system_is_user(bad_starts), retrievable=engine.retrievable)
        assert r.invalid_requests == 0, (t["id"], r.invalid_details)
        assert r.over_window == 0, t["id"]
        for kind in FACT_KINDS:
            if kind == "paths" and not paths_fit(t["messages"]):
                # a recursive listing with thousands of paths cannot fit a 32K window: most
                # are kept, the rest is counted (a session store makes them retrievable)
                assert r.facts_kept[kind] >= 0.6 * r.facts_total[kind], (t["id"], kind)
                continue
            assert r.facts_kept[kind] == r.facts_total[kind], (t["id"], kind, r.facts_missing.get(kind))
        # later compressions keep compressing: never a one-message summary
        for rep in engine.reports:
            if rep.replaced and CUTS_SUFFICED not in rep.notes:
                assert len(rep.replaced) >= 2, (t["id"], rep.notes)
        assert max(engine.per_turn, default=0) <= 1, t["id"]
        compacted += r.compactions
    assert not bad_starts
    # the replay did exercise compaction: 31 compactions on the sample, over 50 on the full files
    assert compacted > (50 if dataset.full else 25)


@pytest.mark.slow
def test_failing_summarizer_loses_nothing_and_never_loops(trajectories: list[dict[str, Any]]) -> None:
    # the SWE-agent sessions: recorded (msb-) or written by scripts/make_sessions.py
    sessions = [t for t in trajectories if t["id"].startswith(("msb-", "synthetic-swe/"))][:6]
    assert len(sessions) == 6
    with StubServer(default=StubReply.fail(500, "upstream exploded")) as server:
        for t in sessions:
            client = OpenAICompatClient(base_url=server.openai_base_url, api_key="k", max_retries=0, timeout=5)
            engine = Recording(context_length=WINDOW, summarizer=LlmSummarizer(client, "stub", context_length=128_000))
            r = replay_session(t["messages"], engine, session_id=t["id"], retrievable=engine.retrievable)
            assert r.invalid_requests == 0 and r.over_window == 0
            assert r.facts_kept["users"] == r.facts_total["users"], t["id"]
            for kind in ("tools", "errors", "urls"):
                assert r.facts_kept[kind] == r.facts_total[kind], (t["id"], kind)
            assert max(engine.per_turn, default=0) <= 1
            # every summary fell back (cut-only compactions write no summary: nothing to fall back from)
            summaries = [rep for rep in engine.reports if rep.replaced and not all(n.startswith("cut ") or n == CUTS_SUFFICED for n in rep.notes)]
            assert all(rep.fallback == "extractive" for rep in summaries)
        assert server.calls > 0
