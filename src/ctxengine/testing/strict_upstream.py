"""A strict, scripted LLM upstream on 127.0.0.1 that plays an agent task and rejects what a
provider rejects, for benchmarks and tests that drive real clients through ``ctxengine proxy``.

It speaks ``POST /v1/chat/completions``, ``POST /v1/messages`` (and ``/v1/messages/count_tokens``)
and ``POST /v1/responses``, streamed (the real SSE event sequences) or not, and logs every
request (path, headers, body, status, the reason of a rejection) to a JSON Lines file.

The task (:class:`Task`): read ``part01.txt`` … ``partNN.txt`` in a work folder, one per step,
with the **client's own tools** (a read tool such as ``Read``/``read_file``, else a shell tool
such as ``Bash``/``shell``/``exec_command``, chosen from the tools the request declares), then
answer ``TASK DONE`` with every file's code. Each file is ~3K tokens, so a 16K–40K window needs
compaction. The step is read from the *last* tool result (the highest ``MARKER partNN`` in it),
so it survives a proxy that dropped the earlier turns. Once the ``ctx_grep`` recall tool is
offered (the proxy adds it after a compaction) the script calls it once for ``part01``'s code
before finishing, and counts the answer when it holds the code. A request without tools whose
conversation holds the task gets plain-text replies that ask for the next file by name (aider
adds a file named in a reply to its chat).

Rejections, each in the provider's 400 shape:

* a tool call without its result, or a result without its call (chat, messages, responses);
* a thinking block whose signature is not the one this server issued for it, byte for byte;
* a Responses ``function_call_output`` without its ``function_call``, a reasoning item altered,
  or a ``function_call`` this server issued after a reasoning item sent without that item;
* a request over the window, counted with o200k over system, messages and tool definitions:
  every string in the system prompt/instructions and messages/input (ids, signatures and
  encrypted reasoning left out), 3 tokens a message, and the tool list as compact JSON with
  non-ASCII kept, as ctxengine's window counts it (OpenAI: ``context_length_exceeded`` "This
  model's maximum context length is N tokens…"; Responses: the same code; Anthropic: ``prompt
  is too long: N tokens > M maximum``).

Usage::

    with StrictUpstream(Task(root, steps=12), window=32_000, log_path=path) as up:
        ...  # point the proxy's upstream base URLs at up.openai_base_url / up.anthropic_base_url
        up.stats  # requests, rejections by reason, tokens, recall answers, finished
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["Reply", "StrictUpstream", "Task", "count_request_tokens"]

_WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
]
_MARKER = re.compile(r"MARKER part(\d+) = ([A-Z0-9]+)")
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


def _code(i: int) -> str:
    return hashlib.sha256(f"part{i}".encode()).hexdigest()[:10].upper()


@dataclass
class Task:
    """The scripted task: ``steps`` files of about ``file_tokens`` o200k tokens under ``root``."""

    root: Path
    steps: int = 12
    file_tokens: int = 3000
    prompt: str = ""

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if not self.prompt:
            self.prompt = (
                f"BENCH-TASK: the folder {self.root} holds part01.txt to part{self.steps:02d}.txt. Read them one "
                "at a time, in order, and when all are read report the line 'MARKER partNN = CODE' of each."
            )

    def name(self, i: int) -> str:
        return f"part{i:02d}.txt"

    def path(self, i: int) -> Path:
        return self.root / self.name(i)

    def code(self, i: int) -> str:
        return _code(i)

    def write(self) -> None:
        """Write the task's files (about 4.3 characters per o200k token of this text)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for i in range(1, self.steps + 1):
            lines = [f"MARKER part{i:02d} = {_code(i)}"]
            n = 0
            while n < self.file_tokens:
                words = [_WORDS[(i * 7 + n + k * 3) % len(_WORDS)] for k in range(12)]
                lines.append(f"{i:02d}.{n:05d} " + " ".join(words))
                n += 16
            self.path(i).write_text("\n".join(lines) + "\n", encoding="utf-8")


@dataclass
class Reply:
    """What the script answers: text, or one tool call (``tool`` name and ``args`` object)."""

    text: str | None = None
    tool: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    tool_kind: str = "function"  # or "local_shell" (Responses' built-in shell)


# --------------------------------------------------------------------------- token counting

_ENC: Any = None


def _encoding() -> Any:
    global _ENC
    if _ENC is None:
        from ctxengine.tokens import _load_encoding

        _ENC = _load_encoding("o200k_base")
    return _ENC


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            if k in (
                "signature",
                "encrypted_content",
                "cache_control",
                "id",
                "call_id",
                "tool_call_id",
                "tool_use_id",
                "type",
                "role",
                "status",
            ):
                continue
            if k == "data" and value.get("type") == "redacted_thinking":
                continue
            if k in ("source", "image_url") and not isinstance(v, str):
                yield "[image]" * 200  # ~ a small image
                continue
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def count_request_tokens(body: dict[str, Any]) -> int:
    """o200k tokens of a request: system/instructions, messages/input and tool definitions."""
    enc = _encoding()
    parts: list[str] = []
    items: list[Any] = []
    for key in ("system", "instructions"):
        if body.get(key):
            parts.extend(_strings(body[key]))
    for key in ("messages", "input"):
        value = body.get(key)
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, list):
            items.extend(value)
    for item in items:
        parts.extend(_strings(item))
    tools = body.get("tools") or []
    n = sum(len(enc.encode(p, disallowed_special=())) for p in parts) + 3 * len(items)
    if tools:  # the list as compact JSON, non-ASCII kept (how ctxengine's window counts them)
        text = json.dumps(tools, ensure_ascii=False, separators=(",", ":"))
        n += len(enc.encode(text, disallowed_special=()))
    return n


# --------------------------------------------------------------------------- the script


def _tool_names(api: str, tools: list[Any]) -> list[tuple[str, dict[str, Any], str]]:
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
    declared = _tool_names(api, tools)
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


_SUMMARY_ASK = re.compile(
    r"CONTEXT CHECKPOINT COMPACTION|create a detailed summary of the conversation|handoff summary",
    re.I,
)


def _last_user_text(items: list[Any]) -> str:
    for it in reversed(items):
        if isinstance(it, dict) and it.get("role") == "user":
            c = it.get("content")
            if isinstance(c, str):
                return c
            return " ".join(str(b.get("text", "")) for b in c or [] if isinstance(b, dict))
    return ""


def _has_task(text: str) -> bool:
    return "BENCH-TASK" in text


# --------------------------------------------------------------------------- the server


class StrictUpstream:
    """The server. ``window`` is the model's context length; ``on_step(step)`` is called after
    the reply that asks for file ``step`` has been sent (a benchmark restarts the proxy there)."""

    def __init__(
        self,
        task: Task,
        *,
        window: int = 32_000,
        log_path: Path | str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        secret: bytes | None = None,
        on_step: Callable[[int], None] | None = None,
        chunk_delay: float = 0.0,
        slow_step: int | None = None,
        slow_seconds: float = 6.0,
    ) -> None:
        self.task = task
        self.window = window
        self.log_path = Path(log_path) if log_path else None
        self.host, self._port = host, port
        self.secret = secret or uuid.uuid4().bytes
        self.on_step = on_step
        self.chunk_delay = chunk_delay
        self.slow_step, self.slow_seconds = slow_step, slow_seconds
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.stats: dict[str, Any] = self._new_stats()
        self._reasoning: dict[str, str] = {}  # reasoning id -> its encrypted_content
        self._call_reasoning: dict[str, str] = {}  # function_call id -> reasoning id before it

    @staticmethod
    def _new_stats() -> dict[str, Any]:
        return {
            "requests": 0,
            "chat_requests": 0,
            "rejected": Counter(),
            "over_window": 0,
            "max_tokens_seen": 0,
            "input_tokens": 0,
            "steps_seen": set(),
            "recall_calls": 0,
            "recall_answered": 0,
            "client_compactions": 0,
            "finished": False,
            "paths": Counter(),
        }

    def reset(self) -> None:
        with self._lock:
            self.stats = self._new_stats()

    # ----------------------------------------------------------------- lifecycle
    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    @property
    def openai_base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> StrictUpstream:
        upstream = self

        class Handler(_Handler):
            server_ref = upstream

        self._server = ThreadingHTTPServer((self.host, self._port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        _encoding()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> StrictUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- helpers
    def sign(self, text: str) -> str:
        mac = hmac.new(self.secret, text.encode("utf-8"), hashlib.sha256).digest()
        return base64.b64encode(b"SIG1" + mac).decode()

    def log(self, record: dict[str, Any]) -> None:
        if self.log_path is None:
            return
        with self._lock, self.log_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")

    # ----------------------------------------------------------------- validation
    def validate(self, api: str, body: dict[str, Any]) -> tuple[str, str] | None:
        """(reason, provider message) of a rejection, or None."""
        if api == "chat":
            return self._validate_chat(body.get("messages") or [])
        if api == "messages":
            return self._validate_messages(body)
        if api == "responses":
            return self._validate_responses(body.get("input") or [])
        return None

    def _validate_chat(self, messages: list[Any]) -> tuple[str, str] | None:
        pending: list[str] = []
        known: set[str] = set()
        for m in messages:
            role = m.get("role") if isinstance(m, dict) else None
            if role == "tool":
                tid = m.get("tool_call_id")
                if tid not in known:
                    return (
                        "result_without_call",
                        "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
                    )
                if tid in pending:
                    pending.remove(tid)
                continue
            if pending:
                return (
                    "call_without_result",
                    "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. "
                    f"The following tool_call_ids did not have response messages: {', '.join(pending)}",
                )
            if role == "assistant":
                for c in m.get("tool_calls") or []:
                    pending.append(c.get("id"))
                    known.add(c.get("id"))
        if pending:
            return (
                "call_without_result",
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. "
                f"The following tool_call_ids did not have response messages: {', '.join(pending)}",
            )
        return None

    def _validate_messages(self, body: dict[str, Any]) -> tuple[str, str] | None:
        messages = body.get("messages") or []
        thinking_on = isinstance(body.get("thinking"), dict) and body["thinking"].get("type") in (
            "enabled",
            "adaptive",
        )
        prev_uses: list[str] = []
        for idx, m in enumerate(messages):
            content = m.get("content")
            blocks = content if isinstance(content, list) else []
            if m.get("role") == "user":
                results = [
                    b.get("tool_use_id")
                    for b in blocks
                    if isinstance(b, dict) and b.get("type") == "tool_result"
                ]
                for r in results:
                    if r not in prev_uses:
                        return (
                            "result_without_call",
                            f"messages.{idx}.content.0: unexpected `tool_use_id` found in `tool_result` blocks: {r}. "
                            "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.",
                        )
                missing = [u for u in prev_uses if u not in results]
                if missing:
                    return (
                        "call_without_result",
                        f"messages.{idx}: `tool_use` ids were found without `tool_result` blocks immediately after: {', '.join(missing)}. "
                        "Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
                    )
                prev_uses = []
            elif m.get("role") == "assistant":
                if prev_uses:
                    return (
                        "call_without_result",
                        f"messages.{idx}: `tool_use` ids were found without `tool_result` blocks immediately after: {', '.join(prev_uses)}.",
                    )
                prev_uses = [
                    str(b.get("id"))
                    for b in blocks
                    if isinstance(b, dict) and b.get("type") == "tool_use"
                ]
                for j, b in enumerate(blocks):
                    if (
                        isinstance(b, dict)
                        and b.get("type") == "thinking"
                        and b.get("signature") != self.sign(str(b.get("thinking", "")))
                    ):
                        return (
                            "bad_thinking_signature",
                            f"messages.{idx}.content.{j}: Invalid `signature` in `thinking` block",
                        )
                    if isinstance(b, dict) and b.get("type") == "redacted_thinking":
                        return (
                            "bad_thinking_signature",
                            f"messages.{idx}.content.{j}: Invalid `data` in `redacted_thinking` block",
                        )
        if prev_uses:
            return (
                "call_without_result",
                f"`tool_use` ids were found without `tool_result` blocks immediately after: {', '.join(prev_uses)}.",
            )
        if thinking_on and messages:
            # the assistant turn of a running tool loop must start with its thinking block
            last_user = messages[-1]
            ends_in_results = isinstance(last_user.get("content"), list) and any(
                isinstance(b, dict) and b.get("type") == "tool_result" for b in last_user["content"]
            )
            if ends_in_results and len(messages) >= 2:
                prev = messages[-2]
                blocks = prev.get("content") if isinstance(prev.get("content"), list) else []
                issued = any(
                    isinstance(b, dict)
                    and b.get("type") == "tool_use"
                    and str(b.get("id", "")).startswith("toolu_strict")
                    for b in blocks
                )
                if issued and not (
                    blocks
                    and isinstance(blocks[0], dict)
                    and blocks[0].get("type") in ("thinking", "redacted_thinking")
                ):
                    return (
                        "thinking_missing",
                        f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{blocks[0].get('type') if blocks else 'text'}`. "
                        "When `thinking` is enabled, a final `assistant` message must start with a thinking block.",
                    )
        return None

    def _validate_responses(self, items: Any) -> tuple[str, str] | None:
        if not isinstance(items, list):
            return None
        calls: set[str] = set()
        seen_reasoning: set[str] = set()
        for it in items:
            if not isinstance(it, dict):
                continue
            kind = it.get("type")
            if kind == "reasoning":
                rid = str(it.get("id", ""))
                if rid in self._reasoning:
                    if (
                        it.get("encrypted_content") is not None
                        and it.get("encrypted_content") != self._reasoning[rid]
                    ):
                        return (
                            "reasoning_altered",
                            f"The encrypted content for item {rid} could not be verified.",
                        )
                    if it.get("summary") not in (
                        None,
                        [],
                        [{"type": "summary_text", "text": self._summary(rid)}],
                    ):
                        return (
                            "reasoning_altered",
                            f"Item '{rid}' of type 'reasoning' was modified.",
                        )
                seen_reasoning.add(rid)
            elif kind in ("function_call", "local_shell_call", "custom_tool_call"):
                calls.add(str(it.get("call_id")))
                fid = str(it.get("id", ""))
                need = self._call_reasoning.get(fid)
                if need and need not in seen_reasoning:
                    return (
                        "reasoning_missing",
                        f"Item '{fid}' of type '{kind}' was provided without its required 'reasoning' item: '{need}'.",
                    )
            elif kind in (
                "function_call_output",
                "local_shell_call_output",
                "custom_tool_call_output",
            ):
                cid = str(it.get("call_id"))
                if cid not in calls:
                    return (
                        "result_without_call",
                        f"No tool call found for function call output with call_id {cid}.",
                    )
        return None

    def _summary(self, rid: str) -> str:
        return f"Planning the next read ({rid[-6:]})."

    # ----------------------------------------------------------------- the script
    def script(self, api: str, body: dict[str, Any]) -> Reply:
        """The reply to a valid request (and the stats of the step it serves)."""
        tools = body.get("tools") or []
        conv = body.get("messages") if api != "responses" else body.get("input")
        conv_items = conv if isinstance(conv, list) else [{"role": "user", "content": conv or ""}]
        whole = (
            json.dumps(conv_items, ensure_ascii=False)
            + json.dumps(body.get("system") or "")
            + str(body.get("instructions") or "")
        )
        if not _has_task(whole):
            return Reply(text="OK.")
        last = self._last_result(api, conv_items)
        names = {n for n, _s, _k in _tool_names(api, tools)}
        found = {int(n): c for n, c in _MARKER.findall(whole)}
        if _SUMMARY_ASK.search(_last_user_text(conv_items)):
            # the client's own compaction (Codex, Claude Code /compact): a summary of the progress
            with self._lock:
                self.stats["client_compactions"] += 1
            read = "\n".join(f"MARKER part{i:02d} = {c}" for i, c in sorted(found.items()))
            return Reply(
                text=f"Summary of progress on BENCH-TASK: files read so far, with their codes:\n{read}\nNext: read the next file."
            )
        if last is not None and last[0] == "recall":
            with self._lock:
                if _code(1) in last[1]:
                    self.stats["recall_answered"] += 1
            return self._final()
        # the step is the highest file whose marker the conversation holds: the proxy or the
        # client may have dropped or summarised the earlier results, never the latest one
        step = max(found) if found else 0
        if not tools:
            return self._plain(conv_items, api)
        if step >= self.task.steps:
            if RECALL_TOOL in names and not self._recall_done(conv_items):
                with self._lock:
                    self.stats["recall_calls"] += 1
                return Reply(tool=RECALL_TOOL, args={"query": "MARKER part01"})
            return self._final()
        nxt = step + 1
        reply = pick_tool_call(
            api, tools, self.task, nxt, self.slow_seconds if nxt == self.slow_step else 0.0
        )
        if reply is None:
            return Reply(
                text=f"I cannot read files with the tools offered ({', '.join(sorted(names))})."
            )
        with self._lock:
            self.stats["steps_seen"].add(nxt)
        return reply

    def _recall_done(self, items: list[Any]) -> bool:
        return RECALL_TOOL in json.dumps(items)

    def _final(self) -> Reply:
        with self._lock:
            self.stats["finished"] = True
        lines = [f"MARKER part{i:02d} = {_code(i)}" for i in range(1, self.task.steps + 1)]
        return Reply(text="TASK DONE\n" + "\n".join(lines))

    def _plain(self, items: list[Any], api: str) -> Reply:
        """A reply without tools (aider): ask for the next file not yet in the conversation."""
        text = json.dumps(items, ensure_ascii=False)
        found = {int(n) for n, _c in _MARKER.findall(text)}
        for i in range(1, self.task.steps + 1):
            if i not in found:
                with self._lock:
                    self.stats["steps_seen"].add(i)
                return Reply(
                    text=f"To continue I need to see {self.task.name(i)}. Please add {self.task.name(i)} to the chat."
                )
        return self._final()

    def _last_result(self, api: str, items: list[Any]) -> tuple[str, str] | None:
        """("recall" | "tool", text) of the trailing tool results, or None when the conversation
        does not end with one."""
        if not items:
            return None
        texts: list[str] = []
        kind = "tool"
        recall_ids: set[str] = set()
        for it in items:
            if not isinstance(it, dict):
                continue
            for c in it.get("tool_calls") or []:
                if (c.get("function") or {}).get("name") == RECALL_TOOL:
                    recall_ids.add(str(c.get("id")))
            content = it.get("content")
            for b in content if isinstance(content, list) else []:
                if (
                    isinstance(b, dict)
                    and b.get("type") == "tool_use"
                    and b.get("name") == RECALL_TOOL
                ):
                    recall_ids.add(str(b.get("id")))
            if it.get("type") == "function_call" and it.get("name") == RECALL_TOOL:
                recall_ids.add(str(it.get("call_id")))
        # walk back over the trailing results
        for it in reversed(items):
            if not isinstance(it, dict):
                break
            if api == "chat" and it.get("role") == "tool":
                texts.append(json.dumps(it.get("content"), ensure_ascii=False))
                if it.get("tool_call_id") in recall_ids:
                    kind = "recall"
                continue
            if (
                api == "messages"
                and it.get("role") == "user"
                and isinstance(it.get("content"), list)
            ):
                res = [
                    b
                    for b in it["content"]
                    if isinstance(b, dict) and b.get("type") == "tool_result"
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


# --------------------------------------------------------------------------- HTTP


def _sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + json.dumps(data) + "\n\n").encode()


def _split(text: str, n: int = 3) -> list[str]:
    if not text:
        return [""]
    size = max(1, len(text) // n + 1)
    return [text[i : i + size] for i in range(0, len(text), size)]


class _Handler(BaseHTTPRequestHandler):
    server_ref: StrictUpstream
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        up = self.server_ref
        up.log(
            {
                "t": time.time(),
                "method": "GET",
                "path": self.path,
                "headers": dict(self.headers.items()),
            }
        )
        if self.path.rstrip("/").endswith("/models"):
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": "bench-model", "object": "model", "created": 0, "owned_by": "bench"}
                    ],
                    "models": [],
                },
            )
            return
        self._json(
            404,
            {
                "error": {
                    "message": f"no route {self.path}",
                    "type": "invalid_request_error",
                    "code": "not_found",
                }
            },
        )

    def do_POST(self) -> None:
        up = self.server_ref
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?")[0]
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_raw": raw[:2000].decode("utf-8", "replace")}
        record: dict[str, Any] = {
            "t": time.time(),
            "method": "POST",
            "path": self.path,
            "headers": dict(self.headers.items()),
            "body": body,
        }
        if path.endswith("/messages/count_tokens"):
            n = count_request_tokens(body)
            record.update(status=200, tokens=n)
            up.log(record)
            self._json(200, {"input_tokens": n})
            return
        if path.endswith("/chat/completions"):
            api = "chat"
        elif path.endswith("/messages"):
            api = "messages"
        elif path.endswith("/responses"):
            api = "responses"
        else:
            record.update(status=404)
            up.log(record)
            self._json(
                404,
                {
                    "error": {
                        "message": f"Invalid URL (POST {self.path})",
                        "type": "invalid_request_error",
                        "code": None,
                    }
                },
            )
            return
        with up._lock:
            up.stats["requests"] += 1
            up.stats["paths"][path] += 1
        tokens = count_request_tokens(body)
        record["tokens"] = tokens
        bad = up.validate(api, body)
        if bad is None and tokens > up.window:
            bad = ("over_window", "")
        if bad is not None:
            reason, message = bad
            with up._lock:
                up.stats["rejected"][reason] += 1
                if reason == "over_window":
                    up.stats["over_window"] += 1
            record.update(status=400, rejected=reason)
            up.log(record)
            self._error(api, reason, message, tokens)
            return
        reply = up.script(api, body)
        with up._lock:
            if "BENCH-TASK" in json.dumps(body.get("messages") or body.get("input") or ""):
                up.stats["chat_requests"] += 1
                up.stats["input_tokens"] += tokens
            up.stats["max_tokens_seen"] = max(up.stats["max_tokens_seen"], tokens)
        record.update(
            status=200,
            reply={"text": (reply.text or "")[:200], "tool": reply.tool, "args": reply.args},
        )
        up.log(record)
        stream = bool(body.get("stream"))
        model = str(body.get("model") or "bench-model")
        if api == "chat":
            self._chat(reply, model, tokens, stream, body)
        elif api == "messages":
            self._messages(reply, model, tokens, stream, body)
        else:
            self._responses(reply, model, tokens, stream, body)
        # the file this reply asks for: a call of the client's tool, or (no tools) a request in words
        asked = json.dumps(reply.args) if reply.tool else (reply.text or "")
        if up.on_step is not None and reply.tool != RECALL_TOOL and "TASK DONE" not in asked:
            m = re.search(r"part(\d+)\.txt", asked)
            if m:
                up.on_step(int(m.group(1)))

    # ----------------------------------------------------------------- errors
    def _error(self, api: str, reason: str, message: str, tokens: int) -> None:
        up = self.server_ref
        if api == "messages":
            if reason == "over_window":
                message = f"prompt is too long: {tokens} tokens > {up.window} maximum"
            self._json(
                400,
                {
                    "type": "error",
                    "error": {"type": "invalid_request_error", "message": message},
                    "request_id": f"req_{uuid.uuid4().hex[:24]}",
                },
            )
            return
        if reason == "over_window":
            message = (
                f"This model's maximum context length is {up.window} tokens. However, your messages resulted in {tokens} tokens. "
                "Please reduce the length of the messages."
            )
            if api == "responses":
                message = "Your input exceeds the context window of this model. Please adjust your input and try again."
            self._json(
                400,
                {
                    "error": {
                        "message": message,
                        "type": "invalid_request_error",
                        "param": "messages" if api == "chat" else "input",
                        "code": "context_length_exceeded",
                    }
                },
            )
            return
        self._json(
            400,
            {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": "messages" if api == "chat" else "input",
                    "code": None,
                }
            },
        )

    # ----------------------------------------------------------------- chat completions
    def _chat(
        self, reply: Reply, model: str, tokens: int, stream: bool, body: dict[str, Any]
    ) -> None:
        cid = f"chatcmpl-{uuid.uuid4().hex[:20]}"
        call: dict[str, Any] | None = None
        if reply.tool:
            call = {
                "id": f"call_strict{uuid.uuid4().hex[:16]}",
                "type": "function",
                "function": {"name": reply.tool, "arguments": json.dumps(reply.args)},
            }
        usage = {"prompt_tokens": tokens, "completion_tokens": 20, "total_tokens": tokens + 20}
        finish = "tool_calls" if call else "stop"
        if not stream:
            msg: dict[str, Any] = {"role": "assistant", "content": reply.text}
            if call:
                msg["tool_calls"] = [call]
            self._json(
                200,
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                    "usage": usage,
                },
            )
            return
        base = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }
        events = [
            _sse(
                {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": "" if not call else None},
                            "finish_reason": None,
                        }
                    ],
                }
            )
        ]
        if reply.text:
            for piece in _split(reply.text):
                events.append(
                    _sse(
                        {
                            **base,
                            "choices": [
                                {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                            ],
                        }
                    )
                )
        if call:
            args = call["function"]["arguments"]
            events.append(
                _sse(
                    {
                        **base,
                        "choices": [
                            {
                                "index": 0,
                                "delta": {
                                    "tool_calls": [
                                        {
                                            "index": 0,
                                            "id": call["id"],
                                            "type": "function",
                                            "function": {"name": reply.tool, "arguments": ""},
                                        }
                                    ]
                                },
                                "finish_reason": None,
                            }
                        ],
                    }
                )
            )
            for piece in _split(args):
                events.append(
                    _sse(
                        {
                            **base,
                            "choices": [
                                {
                                    "index": 0,
                                    "delta": {
                                        "tool_calls": [
                                            {"index": 0, "function": {"arguments": piece}}
                                        ]
                                    },
                                    "finish_reason": None,
                                }
                            ],
                        }
                    )
                )
        events.append(
            _sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        )
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(_sse({**base, "choices": [], "usage": usage}))
        events.append(b"data: [DONE]\n\n")
        self._stream(events)

    # ----------------------------------------------------------------- anthropic messages
    def _messages(
        self, reply: Reply, model: str, tokens: int, stream: bool, body: dict[str, Any]
    ) -> None:
        up = self.server_ref
        mid = f"msg_strict{uuid.uuid4().hex[:16]}"
        thinking_on = isinstance(body.get("thinking"), dict) and body["thinking"].get("type") in (
            "enabled",
            "adaptive",
        )
        blocks: list[dict[str, Any]] = []
        if thinking_on:
            thought = f"Step planning {uuid.uuid4().hex[:8]}: read the next file."
            blocks.append({"type": "thinking", "thinking": thought, "signature": up.sign(thought)})
        if reply.text:
            blocks.append({"type": "text", "text": reply.text})
        if reply.tool:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_strict{uuid.uuid4().hex[:16]}",
                    "name": reply.tool,
                    "input": reply.args,
                }
            )
        stop = "tool_use" if reply.tool else "end_turn"
        usage = {
            "input_tokens": tokens,
            "output_tokens": 20,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        if not stream:
            self._json(
                200,
                {
                    "id": mid,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": blocks,
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": usage,
                },
            )
            return
        events = [
            _sse(
                {
                    "type": "message_start",
                    "message": {
                        "id": mid,
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {**usage, "output_tokens": 1},
                    },
                },
                "message_start",
            )
        ]
        for i, b in enumerate(blocks):
            if b["type"] == "thinking":
                events.append(
                    _sse(
                        {
                            "type": "content_block_start",
                            "index": i,
                            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                        },
                        "content_block_start",
                    )
                )
                events.append(
                    _sse(
                        {
                            "type": "content_block_delta",
                            "index": i,
                            "delta": {"type": "thinking_delta", "thinking": b["thinking"]},
                        },
                        "content_block_delta",
                    )
                )
                events.append(
                    _sse(
                        {
                            "type": "content_block_delta",
                            "index": i,
                            "delta": {"type": "signature_delta", "signature": b["signature"]},
                        },
                        "content_block_delta",
                    )
                )
            elif b["type"] == "text":
                events.append(
                    _sse(
                        {
                            "type": "content_block_start",
                            "index": i,
                            "content_block": {"type": "text", "text": ""},
                        },
                        "content_block_start",
                    )
                )
                for piece in _split(b["text"]):
                    events.append(
                        _sse(
                            {
                                "type": "content_block_delta",
                                "index": i,
                                "delta": {"type": "text_delta", "text": piece},
                            },
                            "content_block_delta",
                        )
                    )
            else:
                events.append(
                    _sse(
                        {
                            "type": "content_block_start",
                            "index": i,
                            "content_block": {
                                "type": "tool_use",
                                "id": b["id"],
                                "name": b["name"],
                                "input": {},
                            },
                        },
                        "content_block_start",
                    )
                )
                for piece in _split(json.dumps(b["input"])):
                    events.append(
                        _sse(
                            {
                                "type": "content_block_delta",
                                "index": i,
                                "delta": {"type": "input_json_delta", "partial_json": piece},
                            },
                            "content_block_delta",
                        )
                    )
            events.append(_sse({"type": "content_block_stop", "index": i}, "content_block_stop"))
        events.append(
            _sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": 20},
                },
                "message_delta",
            )
        )
        events.append(_sse({"type": "message_stop"}, "message_stop"))
        self._stream(events)

    # ----------------------------------------------------------------- responses
    def _responses(
        self, reply: Reply, model: str, tokens: int, stream: bool, body: dict[str, Any]
    ) -> None:
        up = self.server_ref
        rid = f"resp_strict{uuid.uuid4().hex[:16]}"
        items: list[dict[str, Any]] = []
        reasoning_id = f"rs_strict{uuid.uuid4().hex[:16]}"
        summary = up._summary(reasoning_id)
        enc = up.sign(reasoning_id + summary)
        up._reasoning[reasoning_id] = enc
        items.append(
            {
                "id": reasoning_id,
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": summary}],
                "encrypted_content": enc,
            }
        )
        if reply.text:
            items.append(
                {
                    "id": f"msg_strict{uuid.uuid4().hex[:16]}",
                    "type": "message",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
                }
            )
        if reply.tool:
            fid = f"fc_strict{uuid.uuid4().hex[:16]}"
            up._call_reasoning[fid] = reasoning_id
            call_id = f"call_strict{uuid.uuid4().hex[:16]}"
            if reply.tool_kind == "local_shell":
                items.append(
                    {
                        "id": fid,
                        "type": "local_shell_call",
                        "status": "completed",
                        "call_id": call_id,
                        "action": {"type": "exec", "command": reply.args["command"], "env": {}},
                    }
                )
            else:
                items.append(
                    {
                        "id": fid,
                        "type": "function_call",
                        "status": "completed",
                        "call_id": call_id,
                        "name": reply.tool,
                        "arguments": json.dumps(reply.args),
                    }
                )
        usage = {
            "input_tokens": tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 10},
            "total_tokens": tokens + 20,
        }
        resp = {
            "id": rid,
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": model,
            "output": items,
            "usage": usage,
            "parallel_tool_calls": False,
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "metadata": {},
            "temperature": 1.0,
            "top_p": 1.0,
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "store": body.get("store", True),
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "output_text": reply.text or "",
        }
        if not stream:
            self._json(200, resp)
            return
        seq = 0
        events: list[bytes] = []

        def ev(kind: str, data: dict[str, Any]) -> None:
            nonlocal seq
            events.append(_sse({"type": kind, "sequence_number": seq, **data}, kind))
            seq += 1

        start = {**resp, "status": "in_progress", "output": [], "usage": None}
        ev("response.created", {"response": start})
        ev("response.in_progress", {"response": start})
        for idx, it in enumerate(items):
            if it["type"] == "reasoning":
                ev(
                    "response.output_item.added",
                    {"output_index": idx, "item": {**it, "summary": []}},
                )
                ev(
                    "response.reasoning_summary_part.added",
                    {
                        "item_id": it["id"],
                        "output_index": idx,
                        "summary_index": 0,
                        "part": {"type": "summary_text", "text": ""},
                    },
                )
                ev(
                    "response.reasoning_summary_text.delta",
                    {
                        "item_id": it["id"],
                        "output_index": idx,
                        "summary_index": 0,
                        "delta": summary,
                    },
                )
                ev(
                    "response.reasoning_summary_text.done",
                    {"item_id": it["id"], "output_index": idx, "summary_index": 0, "text": summary},
                )
                ev(
                    "response.reasoning_summary_part.done",
                    {
                        "item_id": it["id"],
                        "output_index": idx,
                        "summary_index": 0,
                        "part": {"type": "summary_text", "text": summary},
                    },
                )
            elif it["type"] == "message":
                text = it["content"][0]["text"]
                ev(
                    "response.output_item.added",
                    {"output_index": idx, "item": {**it, "status": "in_progress", "content": []}},
                )
                ev(
                    "response.content_part.added",
                    {
                        "item_id": it["id"],
                        "output_index": idx,
                        "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": []},
                    },
                )
                for piece in _split(text):
                    ev(
                        "response.output_text.delta",
                        {
                            "item_id": it["id"],
                            "output_index": idx,
                            "content_index": 0,
                            "delta": piece,
                            "logprobs": [],
                        },
                    )
                ev(
                    "response.output_text.done",
                    {
                        "item_id": it["id"],
                        "output_index": idx,
                        "content_index": 0,
                        "text": text,
                        "logprobs": [],
                    },
                )
                ev(
                    "response.content_part.done",
                    {
                        "item_id": it["id"],
                        "output_index": idx,
                        "content_index": 0,
                        "part": {"type": "output_text", "text": text, "annotations": []},
                    },
                )
            elif it["type"] == "function_call":
                ev(
                    "response.output_item.added",
                    {"output_index": idx, "item": {**it, "status": "in_progress", "arguments": ""}},
                )
                for piece in _split(it["arguments"]):
                    ev(
                        "response.function_call_arguments.delta",
                        {"item_id": it["id"], "output_index": idx, "delta": piece},
                    )
                ev(
                    "response.function_call_arguments.done",
                    {"item_id": it["id"], "output_index": idx, "arguments": it["arguments"]},
                )
            else:
                ev(
                    "response.output_item.added",
                    {"output_index": idx, "item": {**it, "status": "in_progress"}},
                )
            ev("response.output_item.done", {"output_index": idx, "item": it})
        ev("response.completed", {"response": resp})
        self._stream(events)

    # ----------------------------------------------------------------- wire
    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, events: list[bytes]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for e in events:
                self.wfile.write(f"{len(e):x}\r\n".encode() + e + b"\r\n")
                self.wfile.flush()
                if self.server_ref.chunk_delay:
                    time.sleep(self.server_ref.chunk_delay)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()


def main(argv: list[str] | None = None) -> None:
    """``python -m ctxengine.testing.strict_upstream --port 9000 --log requests.jsonl DIR``."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("root", type=Path)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--window", type=int, default=32_000)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--log", type=Path)
    a = p.parse_args(argv)
    task = Task(a.root, steps=a.steps)
    task.write()
    up = StrictUpstream(task, window=a.window, log_path=a.log, port=a.port).start()
    print(
        f"listening on {up.openai_base_url} / {up.anthropic_base_url}; task: {task.prompt}",
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()
