"""The LLM summarizer: the structured template written by a model behind a :class:`ChatClient`.

* Prompts are data files (``prompts/system.md``, ``summarize.md``, ``update.md``, ``focus.md``).
* A reply that is empty, truncated (cut at ``max_tokens``) or missing the template headings is
  a failure; a failed call is retried (``retries`` times), then :class:`SummarizerError` is
  raised so the engine falls back to the extractive summary. Authentication errors and prompts
  that do not fit are never retried.
* **Bounded time.** One :meth:`LlmSummarizer.summarize` (one compaction) runs under one
  ``deadline`` (seconds) covering every chunk, attempt and wait: each call gets
  ``min(timeout, time left)`` for the *whole* call, body included, the SDKs' own retries are
  off, and a ``Retry-After`` longer than the time left ends the attempts. A call still running
  at its bound (a server that answers at once and trickles its body a few bytes a second resets
  every SDK read timeout) is abandoned on its worker thread and its connection closed. The
  caller gets :class:`SummarizerError` at the deadline at the latest.
* **Cooldown.** After ``failure_threshold`` consecutive failed summaries (or one that hit the
  deadline, or had a call abandoned at its timeout) the summarizer is skipped for ``cooldown`` seconds (doubling on each failed probe,
  at most 16×): :meth:`summarize` raises at once, so engines use the extractive summary without
  waiting. The first call after the cooldown probes the server again; a success resets it.
  The state belongs to the endpoint and model and is shared by every summarizer of the process
  (each session of a proxy has its own engine; a dead server costs one session the deadline,
  not all of them).
* **Bounded output.** A reply longer than the ``max_tokens`` asked for (servers that ignore
  it) is cut to it with :func:`ctxengine.summarize.base.bound_summary`. Lone surrogates in a
  reply become U+FFFD and a registered API key echoed by the server is removed
  (:mod:`ctxengine.redact`), so a summary is always encodable and secret-free.
* The summarizer's own window is checked before each call (seed 003: a summarizer with a
  smaller window than the main model silently dropped turns). A span that does not fit is
  split into chunks at message boundaries (a single oversized message is split by lines) and
  summarized chunk by chunk, each call updating the summary of the chunks before it, so
  nothing is truncated blindly. If the provider still reports a context error, the chunks are
  halved once.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from string import Template
from typing import TYPE_CHECKING

from ctxengine.clients.base import ChatClient
from ctxengine.errors import SummarizerAuthError, SummarizerContextError, SummarizerError
from ctxengine.messages import Message, content_text, tool_call_name, tool_calls
from ctxengine.models import resolve_model
from ctxengine.redact import redact, redact_messages
from ctxengine.summarize.base import bound_summary, has_template
from ctxengine.textsafe import clean
from ctxengine.tokens import estimate

if TYPE_CHECKING:
    from ctxengine.config import SummarizerConfig

__all__ = ["LlmSummarizer", "render_span"]

PROMPT_MARGIN_TOKENS = 256
"""Slack for chat-template overhead and estimate error in each summarizer request."""

MIN_CHUNK_TOKENS = 512
"""Below this much room for conversation text per call, summarizing in chunks is pointless."""

MAX_COOLDOWN_FACTOR = 16
"""The cooldown doubles after each failed probe, up to this multiple of ``cooldown``."""

BACKOFF_SECONDS = 0.5
"""First wait between attempts when the server names none (doubles per attempt, within the deadline)."""


@dataclass(slots=True)
class _Health:
    """Failure state of one endpoint and model, shared by every summarizer that uses them in
    this process: when a server is down, one session's failures spare the others the wait."""

    failures: int = 0
    probe_failures: int = 0
    cooldown_until: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


_HEALTH: dict[tuple[str, str, str], _Health] = {}
_HEALTH_LOCK = threading.Lock()


def _health_for(client: ChatClient, model: str) -> _Health:
    where = getattr(client, "base_url", None)
    key = (type(client).__qualname__, str(where) if where else f"client-{id(client)}", model)
    with _HEALTH_LOCK:
        h = _HEALTH.get(key)
        if h is None:
            h = _HEALTH[key] = _Health()
        return h


class _DeadlineExceeded(SummarizerError):
    """The summarizer's deadline passed (never retried; opens the cooldown at once)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


def _prompt(name: str) -> str:
    return resources.files("ctxengine.summarize").joinpath(f"prompts/{name}").read_text(encoding="utf-8").strip()


def render_message(m: Message) -> str:
    """One message as plain text for the summarizer prompt."""
    role = str(m.get("role"))
    text = content_text(m.get("content"))
    if role == "tool":
        return f"[tool result]\n{text}"
    lines = [f"[{role}]"]
    if text:
        lines.append(text)
    for c in tool_calls(m):
        fn = c.get("function")
        args = fn.get("arguments") if isinstance(fn, dict) else None
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False) if args is not None else ""
        lines.append(f"→ called {tool_call_name(c)}({args})")
    return "\n".join(lines)


def render_span(span: Sequence[Message]) -> str:
    return "\n\n".join(render_message(m) for m in span if m.get("role") not in ("system", "developer"))


def _split_text(text: str, limit_tokens: int) -> list[str]:
    """Split ``text`` into pieces of about ``limit_tokens`` at line boundaries (hard-split
    lines that are longer on their own)."""
    pieces: list[str] = []
    cur: list[str] = []
    size = 0
    for line in text.splitlines():
        t = estimate(line) + 1
        while t > limit_tokens:
            cut = max(1, limit_tokens * 4)
            if cur:
                pieces.append("\n".join(cur))
                cur, size = [], 0
            pieces.append(line[:cut])
            line = line[cut:]
            t = estimate(line) + 1
        if size + t > limit_tokens and cur:
            pieces.append("\n".join(cur))
            cur, size = [], 0
        cur.append(line)
        size += t
    if cur:
        pieces.append("\n".join(cur))
    return pieces


def chunk_span(span: Sequence[Message], limit_tokens: int) -> list[str]:
    """Rendered span in chunks of at most about ``limit_tokens`` (message boundaries first)."""
    chunks: list[str] = []
    cur: list[str] = []
    size = 0
    for m in span:
        if m.get("role") in ("system", "developer"):
            continue
        r = render_message(m)
        t = estimate(r) + 2
        if t > limit_tokens:
            if cur:
                chunks.append("\n\n".join(cur))
                cur, size = [], 0
            chunks.extend(_split_text(r, limit_tokens))
            continue
        if size + t > limit_tokens and cur:
            chunks.append("\n\n".join(cur))
            cur, size = [], 0
        cur.append(r)
        size += t
    if cur:
        chunks.append("\n\n".join(cur))
    return chunks


class LlmSummarizer:
    """Summaries from an LLM (see the module docstring).

    ``context_length`` is the summarizer model's own window (looked up from the model table
    when ``None``); ``timeout`` bounds each call as a whole; ``max_output_tokens`` caps the ``max_tokens``
    of each request (a summary budget of 10,000 would otherwise ask more than most models give).
    ``deadline`` bounds one :meth:`summarize` (``None``: no bound); ``retries`` is the number of
    further attempts per call; ``failure_threshold`` and ``cooldown`` drive the cooldown;
    ``redact_content`` removes key-shaped strings from the conversation before it is sent.
    ``clock`` and ``sleep`` are seams for tests.
    """

    name = "llm"

    def __init__(
        self,
        client: ChatClient,
        model: str,
        *,
        context_length: int | None = None,
        timeout: float = 60.0,
        max_output_tokens: int = 8192,
        deadline: float | None = 90.0,
        retries: int = 1,
        failure_threshold: int = 2,
        cooldown: float = 60.0,
        redact_content: bool = False,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.model = model
        if context_length is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                context_length = resolve_model(model).context_length
        self.context_length = int(context_length)
        self.timeout = float(timeout)
        self.max_output_tokens = int(max_output_tokens)
        self.deadline = None if deadline is None else float(deadline)
        self.retries = max(0, int(retries))
        self.failure_threshold = max(1, int(failure_threshold))
        self.cooldown = max(0.0, float(cooldown))
        self.redact_content = bool(redact_content)
        self._clock = clock
        self._sleep = sleep
        self._health = _health_for(client, model)
        self._local = threading.local()  # the deadline of the summary this thread is writing
        self.calls = 0
        self.abandoned = 0
        self._system = _prompt("system.md")
        self._first = Template(_prompt("summarize.md"))
        self._update = Template(_prompt("update.md"))
        self._focus = Template(_prompt("focus.md"))

    @classmethod
    def from_config(cls, config: SummarizerConfig) -> LlmSummarizer:
        """Build the client for ``auxiliary.compression`` and wrap it."""
        from ctxengine.clients.factory import build_client

        if not config.model:
            raise SummarizerError("auxiliary.compression.model is not set: there is no LLM to summarize with")
        return cls(
            build_client(config),
            config.model,
            context_length=config.context_length,
            timeout=config.timeout,
            max_output_tokens=config.max_output_tokens,
            deadline=config.deadline,
            retries=config.max_retries,
            failure_threshold=config.failure_threshold,
            cooldown=config.cooldown,
            redact_content=config.redact_content,
        )

    def summarize(
        self,
        span: Sequence[Message],
        *,
        previous_summary: str | None = None,
        focus_topic: str | None = None,
        budget_tokens: int = 2000,
    ) -> str:
        now = self._clock()
        health = self._health
        until = health.cooldown_until
        if until is not None and now < until:
            raise SummarizerError(
                f"summarizer {self.model!r} skipped: cooling down after {health.failures} consecutive failure(s); "
                f"next try in {until - now:.0f}s",
                retryable=False,
            )
        room = self._room(previous_summary, focus_topic, budget_tokens)
        if self.redact_content:
            span = redact_messages(span)
            previous_summary = redact(previous_summary) if previous_summary else previous_summary
        self._local.deadline_at = None if self.deadline is None else now + self.deadline
        abandoned = self.abandoned
        try:
            try:
                text = self._run(span, previous_summary, focus_topic, budget_tokens, room)
            except SummarizerContextError:
                # our estimate of the window was optimistic: smaller chunks, once
                text = self._run(span, previous_summary, focus_topic, budget_tokens, max(MIN_CHUNK_TOKENS, room // 2))
        except SummarizerContextError:
            raise  # the input's fault, not the server's: no cooldown
        except SummarizerError as exc:
            # a deadline hit, or a call that had to be abandoned (a server that answers but
            # trickles), costs every later compaction as much: cool down at once
            self._failed(isinstance(exc, _DeadlineExceeded) or self.abandoned > abandoned or health.cooldown_until is not None)
            raise
        finally:
            self._local.deadline_at = None
        with health.lock:
            health.failures = 0
            health.probe_failures = 0
            health.cooldown_until = None
        return text

    def __deepcopy__(self, memo: dict[int, object]) -> LlmSummarizer:
        """A copy of an engine (a host that compacts on a clone) shares its summarizer: the
        client, its connections and the endpoint's failure state are not per-conversation."""
        return self

    @property
    def cooling_down(self) -> bool:
        """True while failures keep the summarizer skipped."""
        until = self._health.cooldown_until
        return until is not None and self._clock() < until

    def _failed(self, at_once: bool) -> None:
        health = self._health
        with health.lock:
            health.failures += 1
            if at_once or health.failures >= self.failure_threshold:
                factor = min(MAX_COOLDOWN_FACTOR, 2**health.probe_failures)
                health.probe_failures += 1
                health.cooldown_until = self._clock() + self.cooldown * factor

    def _left(self) -> float | None:
        """Seconds left before the deadline (``None``: no deadline)."""
        at: float | None = getattr(self._local, "deadline_at", None)
        return None if at is None else at - self._clock()

    def _complete(self, messages: list[Message], max_tokens: int) -> str:
        """One client call, bounded as a whole (headers *and* body) by ``timeout`` and by the
        deadline: the call runs on a daemon worker thread that is abandoned, and its connection
        closed, when it outlives either. An SDK's timeouts bound each socket read, not the
        call: a server that answers at once and trickles its body a few bytes a second resets
        them on every byte, so only a clock outside the SDK bounds the call."""
        left = self._left()
        if left is not None and left <= 0:
            raise _DeadlineExceeded(f"summarizer deadline of {self.deadline:g}s passed")
        timeout = self.timeout if left is None else min(self.timeout, left)  # never past the deadline
        box: dict[str, object] = {}

        def work() -> None:
            try:
                box["text"] = self.client.complete(messages, model=self.model, max_tokens=max_tokens, timeout=timeout)
            except BaseException as exc:  # handed to the waiting thread
                box["error"] = exc

        worker = threading.Thread(target=work, name="ctxengine-summarizer-call", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            self.abandoned += 1
            close = getattr(self.client, "close", None)
            if callable(close):  # frees the socket the abandoned call reads from (and ends it)
                threading.Thread(target=close, name="ctxengine-summarizer-close", daemon=True).start()
            left = self._left()
            if left is not None and left <= 0.001:
                raise _DeadlineExceeded(f"summarizer deadline of {self.deadline:g}s passed during a call to {self.model!r}")
            raise SummarizerError(f"summarizer call to {self.model!r} took longer than its {timeout:g}s timeout (the reply was still arriving)")
        if "error" in box:
            err = box["error"]
            if isinstance(err, SummarizerError):
                raise err
            assert isinstance(err, BaseException)
            # a custom client's bug: its text may carry what the server sent
            raise SummarizerError(f"summarizer client raised {type(err).__name__}: {redact(str(err))[:400]}") from None
        text = box.get("text")
        if not isinstance(text, str):
            raise SummarizerError(f"summarizer client returned a {type(text).__name__}, not text")
        return text

    def _room(self, previous: str | None, focus: str | None, budget: int) -> int:
        """Tokens of conversation text one call can carry inside the summarizer's window."""
        fixed = estimate(self._system) + estimate(self._update.template) + estimate(focus or "")
        # the previous summary (or the running one) is at most about the reply budget
        carried = max(estimate(previous or ""), self._max_tokens(budget))
        room = self.context_length - fixed - carried - self._max_tokens(budget) - PROMPT_MARGIN_TOKENS
        if room < MIN_CHUNK_TOKENS:
            raise SummarizerContextError(
                f"summarizer model {self.model!r} has a {self.context_length:,}-token window: too small for "
                f"a {budget:,}-token summary plus the previous one; use a model with a larger window"
            )
        return room

    def _max_tokens(self, budget: int) -> int:
        # the budget is a target: leave the model room to finish the template, within what
        # the model accepts as max_tokens
        return min(int(budget * 1.5) + 256, self.max_output_tokens)

    def _run(self, span: Sequence[Message], previous: str | None, focus: str | None, budget: int, room: int) -> str:
        chunks = chunk_span(span, room) or [""]
        summary = self._call(chunks[0], previous, focus, budget)
        for chunk in chunks[1:]:
            summary = self._call(chunk, summary, focus, budget)
        return summary

    def _call(self, chunk: str, previous: str | None, focus: str | None, budget: int) -> str:
        focus_line = self._focus.substitute(topic=focus) if focus else ""
        if previous:
            prompt = self._update.substitute(previous=previous, span=chunk, focus=focus_line, budget=budget)
        else:
            prompt = self._first.substitute(span=chunk, focus=focus_line, budget=budget)
        messages: list[Message] = [
            {"role": "system", "content": self._system},
            {"role": "user", "content": prompt},
        ]
        problem: SummarizerError | None = None
        max_tokens = self._max_tokens(budget)
        for attempt in range(1 + self.retries):
            if attempt and problem is not None:
                self._wait_before_retry(problem, attempt)
            self.calls += 1
            try:
                text = self._complete(messages, max_tokens)
            except (SummarizerAuthError, SummarizerContextError, _DeadlineExceeded):
                raise
            except SummarizerError as exc:
                if not exc.retryable:
                    raise
                problem = exc
                continue
            text = clean(redact(text, shapes=False)).strip()
            if not text:
                problem = SummarizerError(f"{self.model} returned an empty summary")
                continue
            if not has_template(text):
                problem = SummarizerError(f"{self.model} returned a summary without the template headings")
                continue
            return bound_summary(text, max_tokens)
        tries = "a retry" if self.retries == 1 else ("1 attempt" if not self.retries else f"{1 + self.retries} attempts")
        raise SummarizerError(f"summary failed after {tries}: {problem}") from None

    def _wait_before_retry(self, problem: SummarizerError, attempt: int) -> None:
        """Wait what the server asked (``Retry-After``) or a short backoff, never past the
        deadline: a wait longer than the time left ends the attempts now."""
        wait = problem.retry_after if problem.retry_after is not None else BACKOFF_SECONDS * 2 ** (attempt - 1)
        left = self._left()
        if left is not None and wait >= left:
            raise _DeadlineExceeded(
                f"summarizer deadline of {self.deadline:g}s leaves {max(0.0, left):.1f}s, less than the {wait:.1f}s wait before a retry; last error: {problem}"
            )
        if wait > 0:
            self._sleep(wait)
