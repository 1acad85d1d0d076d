"""What the scripted model does with the client's tools: which tool reads the next file, and how
to read the conversation (the last tool results, the task prompt, a compaction request)."""

from __future__ import annotations

import json
import re
from typing import Any

from .task import Reply, Task

_READ_NAMES = ("read", "read_file", "readfile", "view", "cat", "file_read", "open_file")
_SHELL_NAMES = (
    "bash",
    "shell",
    "exec_command",
    "run_shell_command",
    "local_shell",
    "run",
    "terminal",
    "shell_command",
)
RECALL_TOOL = "ctx_grep"


def tool_names(api: str, tools: list[Any]) -> list[tuple[str, dict[str, Any], str]]:
    """(name, parameters schema, kind) of each declared tool."""
    out: list[tuple[str, dict[str, Any], str]] = []
    for t in tools or []:
        if not isinstance(t, dict):
            continue
        if api == "chat" and isinstance(t.get("function"), dict):
            f = t["function"]
            out.append((str(f.get("name", "")), f.get("parameters") or {}, "function"))
        elif api == "responses":
            if t.get("type") == "local_shell":
                out.append(("local_shell", {}, "local_shell"))
            elif t.get("type") == "function":
                out.append((str(t.get("name", "")), t.get("parameters") or {}, "function"))
            elif t.get("type") == "custom":
                out.append((str(t.get("name", "")), {}, "custom"))
        elif api == "messages" and "name" in t:
            out.append((str(t["name"]), t.get("input_schema") or {}, "function"))
    return out


def pick_tool_call(
    api: str, tools: list[Any], task: Task, i: int, slow: float = 0.0
) -> Reply | None:
    """A call of one of the client's own tools that reads file ``i``, or None. ``slow`` > 0
    prefers a shell tool and sleeps that long before reading (a benchmark restarts the proxy
    meanwhile)."""
    declared = tool_names(api, tools)
    by_lower = {name.lower(): (name, schema, kind) for name, schema, kind in declared}
    path = str(task.path(i))
    prefix = f"sleep {slow:g}; " if slow else ""
    order = (_SHELL_NAMES, _READ_NAMES) if slow else (_READ_NAMES, _SHELL_NAMES)
    for names in order:
        reply = _call_from(names, by_lower, task, i, path, prefix)
        if reply is not None:
            return reply
    return None


def _call_from(
    names: tuple[str, ...],
    by_lower: dict[str, tuple[str, dict[str, Any], str]],
    task: Task,
    i: int,
    path: str,
    prefix: str,
) -> Reply | None:
    for want in names:
        if want not in by_lower:
            continue
        name, schema, kind = by_lower[want]
        props = (schema.get("properties") or {}) if isinstance(schema, dict) else {}
        if names is _READ_NAMES:
            key = next(
                (k for k in ("file_path", "path", "filename", "file", "target_file") if k in props),
                None,
            )
            if key is None and props:
                key = next(iter(props))
            return Reply(tool=name, args={key or "path": path})
        if kind == "local_shell":
            return Reply(
                tool=name,
                args={"command": ["bash", "-lc", f"{prefix}cat {path}"]},
                tool_kind="local_shell",
            )
        key = (
            next((k for k in ("command", "cmd", "commands", "script") if k in props), None)
            or "command"
        )
        if (props.get(key) or {}).get("type") == "array":
            return Reply(
                tool=name,
                args={key: ["bash", "-lc", f"{prefix}cat {path}"], "workdir": str(task.root)},
            )
        args: dict[str, Any] = {key: f"{prefix}cat {path}"}
        if prefix and "yield_time_ms" in props:  # Codex's exec_command returns after 10 s otherwise
            args["yield_time_ms"] = 30_000
        if "description" in (schema.get("required") or []):
            args["description"] = f"Read {task.name(i)}"
        return Reply(tool=name, args=args)
    return None


SUMMARY_ASK = re.compile(
    r"CONTEXT CHECKPOINT COMPACTION|create a detailed summary of the conversation|handoff summary",
    re.I,
)


def last_user_text(items: list[Any]) -> str:
    for it in reversed(items):
        if isinstance(it, dict) and it.get("role") == "user":
            c = it.get("content")
            if isinstance(c, str):
                return c
            return " ".join(str(b.get("text", "")) for b in c or [] if isinstance(b, dict))
    return ""


def has_task(text: str) -> bool:
    return "BENCH-TASK" in text


def last_result(api: str, items: list[Any]) -> tuple[str, str] | None:
    """("recall" | "tool", text) of the trailing tool results, or None when the conversation
    does not end with one."""
    if not items:
        return None
    texts: list[str] = []
    kind = "tool"
    recall_ids = _recall_ids(items)
    # walk back over the trailing results
    for it in reversed(items):
        if not isinstance(it, dict):
            break
        if api == "chat" and it.get("role") == "tool":
            texts.append(json.dumps(it.get("content"), ensure_ascii=False))
            if it.get("tool_call_id") in recall_ids:
                kind = "recall"
            continue
        if api == "messages" and it.get("role") == "user" and isinstance(it.get("content"), list):
            res = [
                b for b in it["content"] if isinstance(b, dict) and b.get("type") == "tool_result"
            ]
            if res:
                texts.extend(json.dumps(b.get("content"), ensure_ascii=False) for b in res)
                if any(b.get("tool_use_id") in recall_ids for b in res):
                    kind = "recall"
            break
        if api == "responses" and str(it.get("type", "")).endswith("_output"):
            texts.append(json.dumps(it.get("output"), ensure_ascii=False))
            if it.get("call_id") in recall_ids:
                kind = "recall"
            continue
        break
    if not texts:
        return None
    return kind, "\n".join(texts)


def _recall_ids(items: list[Any]) -> set[str]:
    """The ids of the recall tool's calls in a conversation (any API's shape)."""
    recall_ids: set[str] = set()
    for it in items:
        if not isinstance(it, dict):
            continue
        for c in it.get("tool_calls") or []:
            if (c.get("function") or {}).get("name") == RECALL_TOOL:
                recall_ids.add(str(c.get("id")))
        content = it.get("content")
        for b in content if isinstance(content, list) else []:
            if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("name") == RECALL_TOOL:
                recall_ids.add(str(b.get("id")))
        if it.get("type") == "function_call" and it.get("name") == RECALL_TOOL:
            recall_ids.add(str(it.get("call_id")))
    return recall_ids
