"""Digest mode on a Codex-shaped history (the shape recorded from the Codex CLI through the
proxy): developer instructions, an environment-context user message, then the task, then
``exec_command`` calls whose outputs open with Codex's header (``Chunk ID`` … ``Output:``,
its own truncation note) before the body. Cuts keep the header and the body's first lines;
the task stays verbatim when a user-role digest follows it (rule 5); every request fits."""

from __future__ import annotations

import json

from ctxengine.config import Config
from ctxengine.engines.kit.cut import cut_output, harness_header, header_lines
from ctxengine.engines.kit.tail import plan_head_tail
from ctxengine.manager import ContextManager
from ctxengine.messages import Message, content_text, validate

TASK = "BENCH-TASK: the folder /work/ws holds part01.txt to part16.txt. Read them one at a time, in order, and when all are read report the line 'MARKER partNN = CODE' of each."
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa"]


def codex_output(k: int, lines: int = 128) -> str:
    """One ``exec_command`` output as Codex returns it: header, truncation note, then the file."""
    body = [f"MARKER part{k:02d} = {k * 7919:010X}"]
    body += [f"{k:02d}.{i * 16:05d} " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(12)) for i in range(lines)]
    head = [f"Chunk ID: {k:06x}", "Wall time: 0.0000 seconds", "Process exited with code 0", f"Original token count: {40 * lines}", "Output:"]
    note = [f"Warning: truncated output (original token count: {40 * lines})", f"Total output lines: {lines + 60}", ""]
    return "\n".join([*head, *note, *body])


def codex_history(steps: int) -> list[Message]:
    msgs: list[Message] = [
        {"role": "developer", "content": [{"type": "input_text", "text": "You are a coding agent running in the Codex CLI. " * 20}]},
        {"role": "developer", "content": [{"type": "input_text", "text": "<permissions instructions>sandbox: danger-full-access</permissions instructions>"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "<environment_context>\n  <cwd>/work/ws</cwd>\n  <shell>bash</shell>\n</environment_context>"}]},
        {"role": "user", "content": [{"type": "input_text", "text": TASK}]},
    ]
    for k in range(1, steps + 1):
        call = {"id": f"call_{k}", "type": "function", "function": {"name": "exec_command", "arguments": json.dumps({"cmd": f"cat /work/ws/part{k:02d}.txt"})}}
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": f"call_{k}", "content": codex_output(k)}]
    return msgs


def test_the_codex_header_is_found_through_its_truncation_note() -> None:
    lines = codex_output(1).split("\n")
    assert header_lines(lines) == 8  # five header lines, two notes, the blank line
    assert lines[header_lines(lines)].startswith("MARKER part01")
    assert header_lines(["plain output", "more output", "Output"]) == 0
    assert header_lines(["x" * 300, "Output:"]) == 0
    assert header_lines(["Output:", "body"]) == 1
    assert header_lines(["Error:", "Traceback (most recent call last):"]) == 1
    assert harness_header("no header here\nat all") is None


def test_a_cut_keeps_the_header_and_the_bodys_first_lines() -> None:
    text = codex_output(3)
    cut = cut_output(text, budget_tokens=220, ref="r1", head_lines=3, tail_lines=2)
    out = cut.split("\n")
    assert out[0].startswith("[ctxengine:cut ref=r1:") and "after line 11" in out[0]
    assert out[1] == harness_header(text)
    assert "Chunk ID: 000003" in out[1] and "Process exited with code 0" in out[1] and "Total output lines: 188" in out[1]
    assert out[2] == f"MARKER part03 = {3 * 7919:010X}"  # the body's first line: never cut before it
    # a budget that cannot hold the header: the cut still fits it
    small = cut_output(text, budget_tokens=60, ref="r1", head_lines=3, tail_lines=2)
    assert len(small) < len(text) and "Chunk ID" not in small.split("\n")[1:2]


def test_the_latest_user_message_is_the_users_not_a_digest_after_it() -> None:
    digest = {"role": "user", "content": "[ctxengine:digest: 4 earlier messages folded]\nActions:\n- exec_command: cat part01.txt"}
    msgs = [*codex_history(6)[:4], digest, *codex_history(6)[4:]]
    toks = [len(content_text(m.get("content"))) // 4 + 4 for m in msgs]
    plan = plan_head_tail(msgs, toks, protect_first_n=3, protect_last_n=2, tail_budget=200, soft_cap=lambda head: 400)
    assert 3 not in plan.middle  # the task is kept: pulled out of the middle
    assert plan.pulled_user == 3


def test_digest_mode_replays_a_codex_session_at_16k_within_the_window() -> None:
    cfg = Config().with_overrides(compression={"mode": "digest"})
    mgr = ContextManager(cfg, model="gpt-5-codex", context_length=16000, store=None)  # strict: a broken rule raises
    history = codex_history(16)
    compactions = 0
    for n in range(6, len(history) + 1, 2):
        out = mgr.prepare(history[:n], session_id="codex")
        assert validate(out) == []
        assert mgr.window.measure(out) <= mgr.window.limit
        assert any(m.get("role") == "user" and content_text(m.get("content")) == TASK for m in out)
        for m in out:
            text = content_text(m.get("content"))
            if m.get("role") == "tool" and text.startswith("[ctxengine:cut"):
                assert "Process exited with code 0" in text and "\nMARKER part" in text
        last = out[-1]
        assert last.get("role") == "tool" and content_text(last.get("content")) == history[n - 1]["content"]  # the newest output whole
        compactions = mgr.counters("codex")["compactions"]
    assert compactions >= 1
    assert mgr.status("codex")["engine_errors"] == 0
