"""A re-read answered "unchanged since last read" after a compaction: the earlier output is back
in view in the very next request (ctxengine.kernel.pointers), with the default engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxengine.config import Config
from ctxengine.kernel.pointers import RESTORED_NOTE, is_pointer, restore_pointed
from ctxengine.manager import CompactionDue, ContextManager
from ctxengine.messages import Message, content_text, validate

CLAUDE = "Wasted call — file unchanged since your last Read. Refer to that earlier tool_result instead."
CLAUDE_OLD = "File unchanged since last read. The content from the earlier Read tool_result in this conversation is still current — refer to that instead of re-reading."
QWEN = "[File /work/data_2.txt unchanged since last read in this session — the full content was provided earlier in this conversation. Refer to it instead of re-reading.]"


def _data(k: int) -> str:
    return "\n".join(f"data_{k} row {i}: value={k * 1000 + i} key=K{k}x{i:04d}" for i in range(120))


def _read(i: int, path: str, result: str, *, name: str = "Read") -> list[Message]:
    return [
        {"role": "assistant", "content": f"Reading {path}.", "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps({"file_path": path})}}]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": result},
    ]


def _session(stub: str, steps: int = 14) -> list[Message]:
    """Reads data_0 … data_{steps-1}; data_2 is read again at the end and answered with ``stub``."""
    msgs: list[Message] = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Sum the value column of every data file."}]
    for k in range(steps):
        msgs += _read(k, f"/work/data_{k}.txt", _data(k))
    msgs += _read(99, "/work/data_2.txt", stub)
    return msgs


def _manager(tmp_path: Path, window: int = 40_000) -> ContextManager:
    cfg = Config().with_overrides(store={"enabled": True, "backend": "sqlite", "path": str(tmp_path / "s.db")})
    return ContextManager(cfg, model="anthropic/claude-sonnet-4.5", context_length=window)


@pytest.mark.parametrize("stub", [CLAUDE, CLAUDE_OLD, QWEN], ids=["claude-code", "claude-code-older", "qwen-code"])
def test_a_reread_stub_after_a_compaction_brings_the_earlier_read_back(tmp_path: Path, stub: str) -> None:
    msgs = _session(stub)
    with _manager(tmp_path) as mgr:
        # the agent resends its whole history every turn, as a proxy's client does
        for end in range(4, len(msgs) - 1, 2):
            mgr.prepare(msgs[:end], session_id="s")
        assert mgr.counters("s")["compactions"] >= 1
        before = mgr.prepare(msgs[:-2], session_id="s")
        assert _data(2) not in "\n".join(content_text(m.get("content")) for m in before), "the early read was folded"
        out = mgr.prepare(msgs, session_id="s")
    assert not [v for v in validate(out) if v.severity == "error"]
    last = content_text(out[-1].get("content"))
    assert out[-1]["tool_call_id"] == "c99"
    assert last.startswith(stub) and RESTORED_NOTE in last and _data(2) in last


def test_the_restored_read_stays_in_the_working_context_next_turn(tmp_path: Path) -> None:
    msgs = _session(CLAUDE)
    with _manager(tmp_path) as mgr:
        for end in range(4, len(msgs) + 1, 2):
            out = mgr.prepare(msgs[:end], session_id="s")
        more = [*msgs, {"role": "assistant", "content": "The sum is 42."}, {"role": "user", "content": "thanks"}]
        nxt = mgr.prepare(more, session_id="s")
    assert nxt[: len(out)] == out, "the restored message is not rewritten the turn after"
    assert _data(2) in content_text(nxt[len(out) - 1].get("content"))


def test_a_prepared_list_continued_restores_from_the_store(tmp_path: Path) -> None:
    """A library caller that passes back what prepare returned: the early read lives only in
    the store (its digest's node)."""
    msgs = _session(CLAUDE)
    with _manager(tmp_path) as mgr:
        working = mgr.prepare(msgs[:4], session_id="s")
        for end in range(6, len(msgs) - 1, 2):
            working = mgr.prepare([*working, *msgs[end - 2 : end]], session_id="s")
        assert _data(2) not in "\n".join(content_text(m.get("content")) for m in working)
        out = mgr.prepare([*working, *msgs[-2:]], session_id="s")
    assert _data(2) in content_text(out[-1].get("content"))


def test_nothing_is_added_while_the_earlier_read_is_in_view(tmp_path: Path) -> None:
    msgs = _session(CLAUDE, steps=3)
    with _manager(tmp_path, window=200_000) as mgr:
        out = mgr.prepare(msgs, session_id="s")
    assert out[-1] == msgs[-1]


def test_the_quiet_path_hands_a_pointer_to_the_worker(tmp_path: Path) -> None:
    msgs = _session(CLAUDE, steps=3)
    with _manager(tmp_path, window=200_000) as mgr:
        mgr.prepare(msgs[:-2], session_id="s")
        with pytest.raises(CompactionDue):
            mgr.prepare(msgs, session_id="s", may_compact=False)
        assert mgr.prepare(msgs, session_id="s")[-1] == msgs[-1]


def test_pointer_detection_and_matching() -> None:
    assert is_pointer({"role": "tool", "tool_call_id": "x", "content": CLAUDE})
    assert is_pointer({"role": "tool", "tool_call_id": "x", "content": QWEN})
    assert not is_pointer({"role": "user", "content": CLAUDE})
    assert not is_pointer({"role": "tool", "tool_call_id": "x", "content": "file contents\nline 2"})
    # a different file is not restored; the same file read by another tool name is not either
    raw = [*_read(1, "/a.txt", "AAA"), *_read(2, "/b.txt", "BBB", name="View")]
    working: list[Message] = [{"role": "user", "content": "go"}, *_read(3, "/b.txt", CLAUDE)]
    assert restore_pointed(working, 1, raw, None) is working
    working2: list[Message] = [{"role": "user", "content": "go"}, *_read(3, "/a.txt", CLAUDE)]
    out = restore_pointed(working2, 1, raw, None)
    assert out is not working2 and content_text(out[-1]["content"]).endswith("\nAAA")
    assert working2[-1]["content"] == CLAUDE, "the caller's message is not mutated"
