"""The server: its lifecycle, the secret that signs thinking and reasoning, the request log,
the stats, and the script that decides each reply."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import uuid
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .handler import RequestHandler
from .script import (
    RECALL_TOOL,
    SUMMARY_ASK,
    has_task,
    last_result,
    last_user_text,
    pick_tool_call,
    tool_names,
)
from .stats import new_stats
from .task import MARKER, Reply, Task, file_code
from .tokens import encoding
from .validate import Rejection, validate_chat, validate_messages, validate_responses


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
        self.stats: dict[str, Any] = new_stats()
        self._reread = "none"  # the re-read scenario: none -> asked -> checked
        self._reasoning: dict[str, str] = {}  # reasoning id -> its encrypted_content
        self._call_reasoning: dict[str, str] = {}  # function_call id -> reasoning id before it

    def reset(self) -> None:
        with self._lock:
            self.stats = new_stats()

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

        class Handler(RequestHandler):
            server_ref = upstream

        self._server = ThreadingHTTPServer((self.host, self._port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        encoding()
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
    def validate(self, api: str, body: dict[str, Any]) -> Rejection | None:
        """(reason, provider message) of a rejection, or None."""
        if api == "chat":
            return validate_chat(body.get("messages") or [])
        if api == "messages":
            return validate_messages(body, self.sign)
        if api == "responses":
            return validate_responses(
                body.get("input") or [], self._reasoning, self._call_reasoning
            )
        return None

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
        if not has_task(whole):
            return Reply(text="OK.")
        last = last_result(api, conv_items)
        names = {n for n, _s, _k in tool_names(api, tools)}
        found = {int(n): c for n, c in MARKER.findall(whole)}
        if SUMMARY_ASK.search(last_user_text(conv_items)):
            # the client's own compaction (Codex, Claude Code /compact): a summary of the progress
            with self._lock:
                self.stats["client_compactions"] += 1
            read = "\n".join(f"MARKER part{i:02d} = {c}" for i, c in sorted(found.items()))
            return Reply(
                text=f"Summary of progress on BENCH-TASK: files read so far, with their codes:\n{read}\nNext: read the next file."
            )
        if last is not None and last[0] == "recall":
            with self._lock:
                if file_code(1) in last[1]:
                    self.stats["recall_answered"] += 1
            return self._final()
        # the step is the highest file whose marker the conversation holds: the proxy or the
        # client may have dropped or summarised the earlier results, never the latest one
        step = max(found) if found else 0
        if not tools:
            return self._plain(conv_items, api)
        reread = self._reread_step(api, tools, step, whole, last)
        if reread is not None:
            return reread
        if self.task.reread is not None and self._reread == "checked":
            # the re-read file's marker is now the newest: the task goes on after ``after``
            step = max(step, self.task.reread[0])
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

    def _reread_step(self, api: str, tools: list[Any], step: int, whole: str, last: tuple[str, str] | None) -> Reply | None:
        """The re-read scenario (``Task.reread``): ask for the early file again once ``after``
        is read; on the next request, note what the client answered and whether the file's
        content is anywhere in the request."""
        if self.task.reread is None:
            return None
        after, again = self.task.reread
        with self._lock:
            state = self._reread
            if state == "none" and step >= after:
                self._reread = "asked"
            elif state == "asked":
                self._reread = "checked"
                self.stats["reread"] = {"answer": (last[1] if last else "")[:300], "in_view": self.task.content_line(again) in whole}
        if state == "none" and step >= after:
            return pick_tool_call(api, tools, self.task, again)
        return None

    def _recall_done(self, items: list[Any]) -> bool:
        """A recall call is in the conversation: an item or block *named* the recall tool (a
        record's text that only mentions it, as a cut marker does, is not a call)."""
        return f'"name": "{RECALL_TOOL}"' in json.dumps(items)

    def _final(self) -> Reply:
        with self._lock:
            self.stats["finished"] = True
        lines = [f"MARKER part{i:02d} = {file_code(i)}" for i in range(1, self.task.steps + 1)]
        return Reply(text="TASK DONE\n" + "\n".join(lines))

    def _plain(self, items: list[Any], api: str) -> Reply:
        """A reply without tools (aider): ask for the next file not yet in the conversation."""
        text = json.dumps(items, ensure_ascii=False)
        found = {int(n) for n, _c in MARKER.findall(text)}
        for i in range(1, self.task.steps + 1):
            if i not in found:
                with self._lock:
                    self.stats["steps_seen"].add(i)
                return Reply(
                    text=f"To continue I need to see {self.task.name(i)}. Please add {self.task.name(i)} to the chat."
                )
        return self._final()
