"""Chain several recorded tasks into one long session (``ctxengine bench --compose N``).

A gateway agent often does task after task in one session; that is where windows bind and
compaction decides cost. :func:`compose_sessions` builds such sessions from single-task
trajectories: the first task's system prompt once, then every task's own messages in order
(each later task starts with its own user message), with tool-call ids renamed where a later
task reuses one, so every id stays unique. The input messages are never edited. The index of
each later task's first message is kept (``meta["task_starts"]``: where ``ctxengine bench
--pause`` puts a person's pause).
"""

from __future__ import annotations

from collections.abc import Sequence

from ctxengine.io import Session
from ctxengine.messages import Message, tool_call_id, tool_calls

__all__ = ["compose", "compose_sessions"]


def compose(sessions: Sequence[Session], session_id: str | None = None) -> Session:
    """One session made of ``sessions`` in order (see the module docstring)."""
    if not sessions:
        raise ValueError("compose needs at least one session")
    out: list[Message] = []
    used: set[str] = set()
    starts: list[int] = []
    for k, s in enumerate(sessions):
        msgs = s.messages
        start = 0
        if k > 0:
            while start < len(msgs) and msgs[start].get("role") in ("system", "developer"):
                start += 1
            starts.append(len(out))
        rename: dict[str, str] = {}
        for m in msgs[start:]:
            if m.get("role") == "assistant" and tool_calls(m):
                calls = []
                changed = False
                for c in m["tool_calls"]:
                    cid = tool_call_id(c) if isinstance(c, dict) else ""
                    if cid and cid in used:
                        new_id = f"{cid}~t{k}"
                        n = 2
                        while new_id in used:
                            new_id = f"{cid}~t{k}.{n}"
                            n += 1
                        rename[cid] = new_id
                        calls.append({**c, "id": new_id})
                        changed = True
                        cid = new_id
                    else:
                        rename.pop(cid, None)
                        calls.append(c)
                    if cid:
                        used.add(cid)
                out.append({**m, "tool_calls": calls} if changed else m)
            elif m.get("role") == "tool" and m.get("tool_call_id") in rename:
                out.append({**m, "tool_call_id": rename[str(m.get("tool_call_id"))]})
            else:
                out.append(m)
    sid = session_id or "+".join(s.id for s in sessions)
    return Session(sid, out, list(sessions[0].tools), {"composed_of": [s.id for s in sessions], "task_starts": starts})


def compose_sessions(sessions: Sequence[Session], n: int) -> list[Session]:
    """Consecutive groups of ``n`` sessions, each composed into one (a shorter last group too)."""
    if n < 1:
        raise ValueError(f"--compose needs N >= 1, got {n}")
    if n == 1:
        return list(sessions)
    out = []
    for g in range(0, len(sessions), n):
        group = sessions[g : g + n]
        out.append(compose(group, f"composed-{g // n + 1}({len(group)} tasks)"))
    return out
