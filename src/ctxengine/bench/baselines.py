"""The two baselines every benchmark shows next to the engines.

``none``
    No compaction at all: what the session costs when the context only grows (requests past
    the window are counted, not refused).
``mask10``
    Rolling observation masking, the baseline of the JetBrains "Complexity Trap" study: on
    every call, each tool output older than the last 10 is replaced by a short placeholder.
    Cheap to compute and effective on raw size, but every call edits one more old message, so
    under explicit cache breakpoints each request rewrites the prefix after it.
``hermes`` (optional: ``-e hermes``)
    Hermes Agent's own compressor, the seed system, run from the ``hermes-agent`` package in a
    separate venv (:mod:`ctxengine.bench.hermes_env`), so speed and cost can be stated as ratios
    to it in the same run.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from ctxengine.engine import CompactionReport, ContextEngine
from ctxengine.errors import EngineError
from ctxengine.messages import Message, content_text
from ctxengine.models import DEFAULT_CONTEXT_LENGTH
from ctxengine.tokens import estimate_messages_tokens

__all__ = ["MASK_PLACEHOLDER", "HermesBaseline", "MaskingBaseline", "NoCompaction"]

MASK_PLACEHOLDER = "[ctxengine:masked] Old tool output omitted for brevity."


class NoCompaction(ContextEngine):
    """The ``none`` baseline: never compresses."""

    deterministic = True

    def __init__(self, *, context_length: int = DEFAULT_CONTEXT_LENGTH, threshold: float | None = None) -> None:
        super().__init__(context_length=context_length, threshold=threshold)

    @property
    def name(self) -> str:
        return "none"

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        return False

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        return list(messages)


class MaskingBaseline(ContextEngine):
    """The ``mask10`` baseline: tool outputs older than the last ``keep`` are masked, every call."""

    deterministic = True

    def __init__(self, *, context_length: int = DEFAULT_CONTEXT_LENGTH, threshold: float | None = None, keep: int = 10) -> None:
        super().__init__(context_length=context_length, threshold=threshold)
        self.keep = keep

    @property
    def name(self) -> str:
        return f"mask{self.keep}"

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        return True

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        tools = [i for i, m in enumerate(messages) if m.get("role") == "tool"]
        old = [i for i in tools[: max(0, len(tools) - self.keep)] if content_text(messages[i].get("content")) != MASK_PLACEHOLDER]
        if not old:
            return list(messages)
        out = list(messages)
        for i in old:
            out[i] = {**messages[i], "content": MASK_PLACEHOLDER}
        self.compression_count += 1
        self.last_report = CompactionReport(
            self.name,
            len(messages),
            len(out),
            estimate_messages_tokens(messages),
            estimate_messages_tokens(out),
            replaced=old,
        )
        return out


class _HermesWorker:
    """One subprocess running Hermes' compressor (``hermes_worker.py``) for every ``hermes``
    baseline engine of this process; started on first use, stopped at exit."""

    _shared: _HermesWorker | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        from ctxengine.bench.hermes_env import hermes_python

        self._python = str(hermes_python())
        self._home = tempfile.mkdtemp(prefix="ctxengine-hermes-home-")
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and not k.startswith("HERMES_")}
        env["HERMES_HOME"] = self._home  # no config, no keys: Hermes' summarizer is unavailable
        self._proc = subprocess.Popen(
            [self._python, str(Path(__file__).with_name("hermes_worker.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self._ids = itertools.count(1)
        self._call_lock = threading.Lock()
        atexit.register(self.close)

    @classmethod
    def get(cls) -> _HermesWorker:
        with cls._lock:
            if cls._shared is None or cls._shared._proc.poll() is not None:
                cls._shared = cls()
            return cls._shared

    def new_id(self) -> int:
        return next(self._ids)

    def call(self, **request: Any) -> dict[str, Any]:
        with self._call_lock:
            stdin, stdout = self._proc.stdin, self._proc.stdout
            if stdin is None or stdout is None:  # pragma: no cover - Popen with PIPE always has them
                raise EngineError("the Hermes worker has no pipes")
            try:
                stdin.write(json.dumps(request) + "\n")
                stdin.flush()
                line = stdout.readline()
            except (BrokenPipeError, OSError) as exc:
                raise EngineError(f"the Hermes worker stopped: {exc}") from exc
        if not line:
            raise EngineError(f"the Hermes worker exited (code {self._proc.poll()}); is hermes-agent importable by {self._python}?")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise EngineError(f"Hermes' compressor: {answer['error']}")
        return answer

    def close(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(OSError):
                if self._proc.stdin is not None:
                    self._proc.stdin.close()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        shutil.rmtree(self._home, ignore_errors=True)


class HermesBaseline(ContextEngine):
    """The ``hermes`` baseline: Hermes Agent's own ``ContextCompressor`` (``hermes-agent`` from
    PyPI, in its own venv, through a subprocess) with its summarizer unavailable, so it uses its
    deterministic fallback handoff. Its thresholds are Hermes' (50 % of the window, 75 % below
    512K tokens). ``elapsed_ms`` of each compaction is measured in the worker around
    ``compress`` alone, like ctxengine's engines in-process."""

    def __init__(self, *, context_length: int = DEFAULT_CONTEXT_LENGTH, model: str = "anthropic/claude-sonnet-4.5") -> None:
        super().__init__(context_length=context_length)
        self._worker = _HermesWorker.get()
        self._id = self._worker.new_id()
        info = self._worker.call(cmd="new", id=self._id, context_length=context_length, model=model)
        self.threshold_tokens = int(info.get("threshold_tokens", self.threshold_tokens))
        if self.context_length:
            self.threshold_ratio = self.threshold_tokens / self.context_length

    @property
    def name(self) -> str:
        return "hermes"

    def update_from_response(self, usage: Any) -> None:
        u = self._record_usage(usage)
        self._worker.call(cmd="usage", id=self._id, usage={"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens, "total_tokens": u.total_tokens})

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        tokens = self.last_prompt_tokens if prompt_tokens is None else prompt_tokens
        return bool(self._worker.call(cmd="should", id=self._id, tokens=int(tokens))["ok"])

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        answer = self._worker.call(cmd="compress", id=self._id, messages=messages, current_tokens=current_tokens)
        out: list[Message] = answer["messages"]
        self.compression_count = int(answer.get("count", self.compression_count + 1))
        self.last_report = CompactionReport(
            self.name,
            len(messages),
            len(out),
            estimate_messages_tokens(messages),
            estimate_messages_tokens(out),
            elapsed_ms=float(answer.get("elapsed_ms", 0.0)),
        )
        return out

    def on_session_end(self, session_id: str, messages: list[Message]) -> None:
        self._worker.call(cmd="drop", id=self._id)
