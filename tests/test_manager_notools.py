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


def _files_message(parts: int) -> Message:
    """aider's files message: every file in the chat with its current contents, resent each turn."""
    body = "\n".join(f"part{k:02d}.txt\n```\n" + "\n".join(f"MARKER part{k:02d} line {j} = {k * 1000 + j}" for j in range(300)) + "\n```" for k in range(1, parts + 1))
    return {"role": "user", "content": "I have *added these files to the chat* so you can go ahead and edit them.\n\n" + body}


def _aider_turns(turns: int) -> list[list[Message]]:
    """What aider sends each turn: the fixed example exchange, ONE files message rewritten in
    place with the files added so far, the chat, the latest request, and a trailing reminder."""
    head: list[Message] = [
        {"role": "system", "content": "Act as an expert software developer."},
        {"role": "user", "content": "Change the greeting to be more casual"},
        {"role": "assistant", "content": "Ok, I will switch the greeting."},
        {"role": "user", "content": "I switched to a new code base. Please don't consider the above files."},
        {"role": "assistant", "content": "Ok."},
    ]
    chat: list[Message] = [{"role": "user", "content": "BENCH-TASK: report the MARKER line of every part file."}]
    out = []
    for t in range(1, turns + 1):
        files = [_files_message(t), {"role": "assistant", "content": "Ok, any changes I propose will be to those files."}]
        out.append([*head, *files, *chat, {"role": "system", "content": "Reply with whole files."}])
        chat = [*chat, {"role": "assistant", "content": f"I need part{t + 1:02d}.txt."}, {"role": "user", "content": f"I added these files to the chat: part{t + 1:02d}.txt"}]
    return out


@pytest.mark.parametrize("engine", ["compressor", "cacheaware", "rules", "lcm"])
def test_a_message_the_client_rewrites_in_place_stays_verbatim(engine: str) -> None:
    """aider's files message changes every turn at the same place: it is the model's working set.
    Compaction keeps its latest version verbatim (a summary would take the files away from a
    client that cannot recall them) and never grows the request."""
    cfg = Config()
    cfg.context.engine = engine
    ctx = ContextManager(cfg, model="gpt-4o", context_length=16_000, store=SqliteStore(":memory:"))
    for given in _aider_turns(3):
        out = ctx.prepare(given, session_id="a", recall=False)
        files = given[5]["content"]
        assert any(m.get("content") == files for m in out), "the latest files message is sent verbatim"
        assert ctx.count_tokens(out) <= ctx.count_tokens(given)  # a compaction never grows the request
    assert ctx._session("a").reach.live == frozenset({files})


def test_a_rewritten_message_is_found_only_when_what_follows_is_unchanged() -> None:
    from ctxengine.history import SessionHistory

    turns = _aider_turns(3)
    h = SessionHistory()
    first = h.begin(turns[0])
    h.finish(first, first.messages, first.messages)
    assert h.live_texts(first, turns[0]) == frozenset()
    second = h.begin(turns[1])
    assert second.live_at == 5
    assert h.live_texts(second, turns[1]) == frozenset({turns[1][5]["content"]})
    h.finish(second, second.messages, second.messages)
    # an edit followed by other messages than those seen is a plain edit, not a live message
    edited = [*turns[2][:5], {"role": "user", "content": "something else"}, {"role": "user", "content": "and more"}]
    assert h.begin(edited).live_at is None
