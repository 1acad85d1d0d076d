"""A client that sends no tools (aider through the proxy): ``prepare(recall=False)``.

The synthetic aider-like session of ``scripts/aider_session.py`` (system prompt, the fixed
example exchange, user turns pasting 1–3 files of 1–4K tokens, SEARCH/REPLACE replies) replayed
the way the proxy does: no marker names a recall tool, compaction leaves room for the next
turns, summaries stay within their budget, no request is over the window or invalid.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ctxengine.config import Config
from ctxengine.manager import ContextManager
from ctxengine.messages import Message
from ctxengine.store.sqlite import SqliteStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from aider_session import aider_session, measure


@pytest.mark.parametrize("window", [16_000, 40_000])
def test_an_aider_session_saves_without_thrashing_or_naming_recall(window: int) -> None:
    run = measure(window, turns=30)
    assert run.over_window == 0 and run.invalid == 0
    assert run.tool_names_shown == 0  # no marker, summary or note names ctx_expand / ctx_grep
    assert run.max_cut_streak <= 1  # never cut by the window cap twice in a row
    assert run.largest_summary_tokens <= run.summary_ceiling
    if window == 40_000:
        assert run.saved >= 0.5
        assert run.cut_turns == 0
        assert run.compact_turns <= run.turns * 0.6  # compactions leave room for the next turns


def test_recall_false_offers_no_recall_tools_and_none_keeps_todays_behaviour() -> None:
    history: list[Message] = aider_session(12)
    ctx = ContextManager(Config(), model="gpt-4o", context_length=16_000, store=SqliteStore(":memory:"))
    for end in range(4, len(history) + 1, 2):
        ctx.prepare(history[:end], session_id="a", recall=False)
    s = ctx._session("a")
    assert s.lost and not s.reach.tools
    assert ctx.tools(session_id="a") == [] and not ctx.status("a")["recall_offered"]
    # the same session with the default: the recall tools go out again (the library user
    # sends ctx.tools(...)), and the engine's reach follows
    ctx.prepare(history, session_id="a")
    assert s.reach.tools and s.engine.reach is s.reach  # type: ignore[attr-defined]
    assert {t["function"]["name"] for t in ctx.tools(session_id="a")} >= {"ctx_grep", "ctx_expand"}


@pytest.mark.parametrize("engine", ["rules", "cacheaware"])
def test_other_engines_follow_the_flag_through_their_originals(engine: str) -> None:
    cfg = Config()
    cfg.context.engine = engine
    ctx = ContextManager(cfg, model="gpt-4o", context_length=16_000, store=SqliteStore(":memory:"))
    history = aider_session(14)
    for end in range(4, len(history) + 1, 2):
        out = ctx.prepare(history[:end], session_id="a", recall=False)
        text = "\n".join(str(m.get("content")) for m in out)
        assert "ctx_grep" not in text and "ctx_expand" not in text
    originals = ctx.engine("a").originals  # type: ignore[attr-defined]
    assert originals is not None and originals.reach is ctx._session("a").reach
