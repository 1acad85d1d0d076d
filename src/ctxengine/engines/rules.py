"""The ``rules`` engine: deterministic, zero-inference compaction (seed 004).

Six rules, in the seed's priority order:

1. **Collapse succeeded tool pairs.** A tool result that reports no failure becomes a one-line
   record, ``[ctxengine:tool: read_file("config.yaml") → ok, 347 chars]``; the assistant's call
   stays (so the pair stays a valid, shorter pair, never an orphan) and call arguments longer
   than ``max_tool_output_chars`` are elided to a small JSON object.
2. **Truncate large tool outputs.** A result that reports a failure (or every result when
   ``keep_tool_summary`` is off) and is longer than ``max_tool_output_chars`` keeps its first
   ``head_lines`` and last ``tail_lines`` lines around ``[...truncated N lines...]``.
3. **Drop system messages after turn** ``drop_system_after_turn``: later system messages become
   a one-line marker. The system prompt before that turn is never rewritten.
4. **Collapse consecutive assistant messages**: of a run of assistant messages without tool
   calls only the last is kept.
5. **User messages are never touched.**
6. **The protected tail is never touched.** It is the last ``protect_last_n_turns`` *turns*,
   where a turn is a user message or an assistant message together with its tool results. The
   seed counts turns by user messages only, but agent trajectories often hold one or two user
   messages followed by hundreds of tool exchanges; counting exchanges too keeps the recent
   working set verbatim in both kinds of session.

**Preservation guarantee.** Whatever a rule removes, the file paths, URLs and error lines of
the removed text (as :mod:`ctxengine.facts` defines them, the same definitions the benchmark
uses) are appended verbatim to the record that replaces it: a ``[facts]`` block of ``urls:``,
``paths:`` and ``errors:`` lines. A fact is left out only when it is already shown by the
record itself, its own tool call, a user message, or the facts block of a record written by an
earlier compaction; none of those is ever removed, so a later compaction cannot lose it. Tool
names survive because calls are kept.

**Batches and prefix stability.** A compaction compacts everything outside the protected tail
at once (a manual ``compress`` too), so the next trigger is far away; when even that cannot
bring the context down to ``target_ratio`` of the window, the next trigger waits until a whole
batch (trigger − target) has accumulated (:meth:`RulesEngine.should_compress`). Records start
with ``[ctxengine:`` and are never rewritten, and everything up to the last record of an
earlier compaction is settled and never revisited, so the prefix sent after a compaction stays
byte-stable (prompt caches stay warm) and applying the engine twice gives the same output as
once. Each keep-or-record verdict depends only on the message and its own tool group.

**Never over the window.** If the result still exceeds the window (the protected tail holds a
giant tool output), the largest tool outputs in the tail are cut the same way as a last resort
until the context is back under the trigger threshold, keeping every fact. Only when facts
alone overflow the window (a recursive listing can hold more distinct paths than any window)
are some left out, from the largest output this compaction touches, paths first; a note in
``last_report.notes`` and :meth:`RulesEngine.get_status` says how many.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ctxengine.boundaries import group_spans
from ctxengine.engine import CompactionReport, ContextEngine
from ctxengine.facts import Facts, error_lines, paths_in, urls_in
from ctxengine.messages import (
    Message,
    check,
    content_text,
    message_text,
    tool_call_args,
    tool_call_id,
    tool_call_name,
    tool_calls,
)
from ctxengine.models import DEFAULT_CONTEXT_LENGTH
from ctxengine.tokens import estimate, estimate_message_tokens

__all__ = ["MARK", "RulesEngine", "RulesSettings"]

MARK = "[ctxengine:"
"""Prefix of every message this engine writes; such messages are never compacted again."""

LINE_CAP = 240
"""Kept head/tail lines longer than this are cut: a single line can hold a whole minified file
(the data has 96K-character lines), and the facts list keeps what the cut removes."""

ELIDED_KEY = "_ctxengine_elided_chars"
"""Key of the JSON object that replaces over-long tool-call arguments."""

ARGS_HEAD = 160
"""Characters of elided arguments kept as a preview."""

CALL_PREVIEW = 60
"""Characters of a call's first argument shown in a record (``read_file("config.yaml")``)."""


class _CompactionSection(Protocol):
    """What :meth:`RulesEngine.from_config` reads from ``config.compaction``."""

    enabled: bool
    trigger_threshold: float
    protect_last_n_turns: int
    max_tool_output_chars: int
    keep_tool_summary: bool
    drop_system_after_turn: int
    collapse_consecutive_assistant: bool
    head_lines: int
    tail_lines: int
    target_ratio: float


class _HasCompaction(Protocol):
    @property
    def compaction(self) -> _CompactionSection: ...


@dataclass(frozen=True, slots=True)
class RulesSettings:
    """The rules engine's knobs; defaults are seed 004's ``compaction:`` block.

    ``target_ratio`` (0.35) is where a compaction should land: far enough under the trigger
    (0.60) that compactions come in batches and the prefix stays cached between them; when the
    protected part alone is above it, the next trigger is deferred by that same batch size.
    ``keep_tool_summary`` off disables rule 1, so succeeded outputs are only truncated (rule 2).
    ``drop_system_after_turn`` 0 disables rule 3.
    """

    enabled: bool = True
    trigger_threshold: float = 0.60
    protect_last_n_turns: int = 5
    max_tool_output_chars: int = 500
    keep_tool_summary: bool = True
    drop_system_after_turn: int = 1
    collapse_consecutive_assistant: bool = True
    head_lines: int = 10
    tail_lines: int = 5
    target_ratio: float = 0.35


_FAILURE_RE = re.compile(
    r"(?i)\b(?:errors?|exception|traceback|failed|failure|fatal|panic)\b"
    r"|permission denied|not found|no such file|cannot find symbol|segmentation fault"
)
"""What makes a tool result *failed* (rule 2 keeps its head and tail) rather than succeeded
(rule 1 collapses it). Narrower than the error facts: a file view that merely names
``IOException`` in its code did not fail, though those lines are still kept as facts."""

FACTS_HEADER = "[facts]"
"""Line that opens the facts block of a record: ``urls: …`` and ``paths: …`` (space
separated, as neither contains spaces) then ``errors:`` and one error line per line. Separators
cost what a newline costs, so a facts block measures what its facts measure."""


def _result_facts(message: Mapping[str, Any]) -> Facts:
    """:func:`ctxengine.facts.extract_facts` of one tool or assistant message (no users)."""
    text = message_text(message)
    if not text:
        return Facts()
    tools = [tool_call_name(c) for c in tool_calls(message)]
    errors = error_lines(content_text(message.get("content")))
    return Facts([], paths_in(text), urls_in(text), list(dict.fromkeys(tools)), errors)


def _failed(errors: Sequence[str]) -> bool:
    return any(_FAILURE_RE.search(e) for e in errors)


class _FactIndex:
    """Facts listed by records, cached by the record's text.

    Records (``[ctxengine:`` messages) are never rewritten, so a fact they list stays in the
    context and later records need not repeat it. Keyed by the text itself (not by object
    identity), so copies of a list hit the same entries.
    """

    MAX_ENTRIES = 8192

    def __init__(self) -> None:
        self._cache: dict[str, frozenset[str]] = {}

    def of(self, message: Mapping[str, Any]) -> frozenset[str]:
        text = content_text(message.get("content"))
        if message.get("role") == "user" or not text.startswith(MARK):
            return frozenset()
        hit = self._cache.get(text)
        if hit is None:
            hit = frozenset(_split_record(text)[1].all())
            if len(self._cache) >= self.MAX_ENTRIES:
                self._cache.clear()
            self._cache[text] = hit
        return hit


def _split_record(text: str) -> tuple[str, Facts]:
    """A record's text before its facts block, and the facts the block lists."""
    before, sep, block = text.rpartition("\n" + FACTS_HEADER + "\n")
    if not sep:
        return text, Facts()
    facts = Facts()
    in_errors = False
    for line in block.split("\n"):
        if in_errors:
            facts.errors.append(line)
        elif line.startswith("urls: "):
            facts.urls += line[6:].split(" ")
        elif line.startswith("paths: "):
            facts.paths += line[7:].split(" ")
        elif line == "errors:":
            in_errors = True
    return before, facts


def _is_marked(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    if isinstance(content, str):
        return content.startswith(MARK)
    return content_text(content).startswith(MARK)


def _cap(line: str) -> str:
    if len(line) <= LINE_CAP:
        return line
    return f"{line[:LINE_CAP]}…[+{len(line) - LINE_CAP} chars]"


def _head_tail(text: str, head: int, tail: int) -> tuple[list[str], int]:
    """The kept lines of ``text`` (long lines capped) and how many lines were dropped."""
    lines = text.splitlines()
    if len(lines) <= head + tail:
        return [_cap(x) for x in lines], 0
    removed = len(lines) - head - tail
    kept = [_cap(x) for x in lines[:head]]
    kept.append(f"[...truncated {removed} lines...]")
    if tail:
        kept += [_cap(x) for x in lines[-tail:]]
    return kept, removed


def _facts_lines(missing: Facts, budget_tokens: int | None = None) -> tuple[list[str], Facts, int]:
    """Render facts as a block (see :data:`FACTS_HEADER`).

    With ``budget_tokens``, facts are chosen errors first (most telling), then URLs, then
    paths, while their estimated tokens fit (a fact too large is skipped; smaller ones after
    it may still fit). Returns (lines, the facts kept, how many were left out).
    """
    kept = Facts()
    dropped = 0
    used = estimate(FACTS_HEADER) + 4 if budget_tokens is not None else 0
    for kind, label in (("errors", "errors:"), ("urls", "urls: "), ("paths", "paths: ")):
        items = getattr(missing, kind)
        if not items:
            continue
        chosen: list[str] = getattr(kept, kind)
        for item in items:
            cost = estimate(item) + (0 if chosen else estimate(label) + 1)
            if budget_tokens is not None and used + cost > budget_tokens:
                dropped += 1
                continue
            used += cost
            chosen.append(item)
    return _render_facts(kept), kept, dropped


def _render_facts(facts: Facts) -> list[str]:
    if not (facts.paths or facts.urls or facts.errors):
        return []
    lines = [FACTS_HEADER]
    if facts.urls:
        lines.append("urls: " + " ".join(facts.urls))
    if facts.paths:
        lines.append("paths: " + " ".join(facts.paths))
    if facts.errors:
        lines += ["errors:", *facts.errors]
    return lines


def _missing(facts: Facts, kept_text: str, known: frozenset[str] | set[str] = frozenset(), anchors: str = "") -> Facts:
    """The facts of ``facts`` not in ``kept_text``, not ``known`` from records and not in the
    ``anchors`` text (user messages, which are never touched)."""

    def gone(f: str) -> bool:
        return f not in known and f not in kept_text and f not in anchors

    return Facts([], [p for p in facts.paths if gone(p)], [u for u in facts.urls if gone(u)], [], [e for e in facts.errors if gone(e)])


def _call_preview(call: Mapping[str, Any] | None) -> str:
    """``name("first argument")``, the first argument cut to CALL_PREVIEW characters."""
    if call is None:
        return "tool"
    name = tool_call_name(call)
    args = tool_call_args(call)
    if isinstance(args, dict):
        if ELIDED_KEY in args:
            first: Any = args.get("head", "")
        else:
            first = next(iter(args.values()), "") if args else ""
        more = len(args) > 1 and ELIDED_KEY not in args
    else:
        first, more = args, False
    if not isinstance(first, str):
        first = json.dumps(first, ensure_ascii=False, sort_keys=True)
    if len(first) > CALL_PREVIEW:
        first = first[:CALL_PREVIEW] + "…"
    shown = json.dumps(first, ensure_ascii=False) if first or args else ""
    return f"{name}({shown}{', …' if more else ''})"


class RulesEngine(ContextEngine):
    """Seed 004's deterministic compaction (see the module docstring for the rules).

    ``compress`` always compacts (a manual ``/compress`` does too); ``should_compress`` fires
    at ``trigger_threshold`` × ``context_length``. ``focus_topic`` is ignored: the rules do not
    rank content. Output messages that need no change are the caller's own (never mutated)
    dict objects; changed ones are new dicts with every unknown key preserved.
    """

    deterministic = True

    def __init__(
        self,
        *,
        context_length: int = DEFAULT_CONTEXT_LENGTH,
        settings: RulesSettings | None = None,
        **overrides: Any,
    ) -> None:
        s = settings or RulesSettings()
        if overrides:
            s = dataclasses.replace(s, **overrides)
        self.settings = s
        super().__init__(context_length=context_length, threshold=s.trigger_threshold)
        self.last_resort_cuts = 0
        self.notes: list[str] = []
        self._facts = _FactIndex()
        self._rearm_at: int | None = None

    @classmethod
    def from_config(cls, config: _HasCompaction, context_length: int, **services: Any) -> RulesEngine:
        """Build from ``config.compaction`` (the seed's ``compaction:`` block).

        Services (store, summarizer, counter) are accepted and ignored: the rules need none.
        """
        c = config.compaction
        settings = RulesSettings(
            enabled=c.enabled,
            trigger_threshold=c.trigger_threshold,
            protect_last_n_turns=c.protect_last_n_turns,
            max_tool_output_chars=c.max_tool_output_chars,
            keep_tool_summary=c.keep_tool_summary,
            drop_system_after_turn=c.drop_system_after_turn,
            collapse_consecutive_assistant=c.collapse_consecutive_assistant,
            head_lines=c.head_lines,
            tail_lines=c.tail_lines,
            target_ratio=c.target_ratio,
        )
        return cls(context_length=context_length, settings=settings)

    # -- the contract -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return "rules"

    @property
    def target_tokens(self) -> int:
        """Where a compaction should land: ``target_ratio`` × ``context_length``."""
        return int(self.context_length * self.settings.target_ratio)

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        """True at ``trigger_threshold`` of the window.

        When the last compaction could not get down to ``target_ratio`` (user messages, the
        system prompt and the protected turns alone are that large), it fires again only once
        the context has grown by a whole batch (trigger − target tokens) since, or reaches
        halfway from the trigger to the window, instead of every few calls: each compaction
        rewrites the end of the cached prefix, so it must reclaim a batch to be worth it.
        """
        if not self.settings.enabled:
            return False
        tokens = self.last_prompt_tokens if prompt_tokens is None else prompt_tokens
        if tokens < self.threshold_tokens:
            return False
        if self._rearm_at is not None:
            ceiling = (self.threshold_tokens + self.context_length) // 2
            return tokens >= min(self._rearm_at, max(ceiling, self.threshold_tokens))
        return True

    def should_compress_preflight(self, messages: list[Message]) -> bool:
        return self.should_compress(sum(estimate_message_tokens(m) for m in messages))

    def on_session_reset(self) -> None:
        super().on_session_reset()
        self.last_resort_cuts = 0
        self.notes = []
        self._rearm_at = None

    def update_model(self, model: str, context_length: int, **kwargs: Any) -> None:
        super().update_model(model, context_length, **kwargs)
        self._rearm_at = None

    def get_status(self) -> dict[str, Any]:
        status = super().get_status()
        status["target_tokens"] = self.target_tokens
        status["last_resort_cuts"] = self.last_resort_cuts
        status["notes"] = list(self.notes)
        return status

    def protected_tail_start(self, messages: Sequence[Message]) -> int:
        """Index where the protected tail of ``messages`` begins (``len`` when nothing is
        protected): the last ``protect_last_n_turns`` turns, a turn being a user message or
        an assistant message with its tool results."""
        return _tail_start(self.settings.protect_last_n_turns, messages, group_spans(messages))

    def compress(
        self,
        messages: list[Message],
        current_tokens: int | None = None,
        focus_topic: str | None = None,
    ) -> list[Message]:
        """Compact ``messages`` by the six rules (see the module docstring); never mutates.

        Raises :class:`~ctxengine.errors.InvalidMessages` when the input breaks the chat
        format. ``current_tokens`` is not used for decisions: the engine measures with
        :func:`ctxengine.tokens.estimate` so its decisions are reproducible.
        """
        t0 = time.perf_counter()
        check(messages, allow_pending_calls=True)
        run = _Pass(self.settings, messages, self.context_length, self.threshold_tokens, self._facts)
        out = run.execute()
        batch = max(1, self.threshold_tokens - self.target_tokens)
        self._rearm_at = run.total + batch if run.total > self.target_tokens else None
        self.compression_count += 1
        self.last_resort_cuts += run.cuts
        self.notes = run.notes
        self.last_report = CompactionReport(
            engine=self.name,
            messages_before=len(messages),
            messages_after=len(out),
            tokens_before=run.tokens_before,
            tokens_after=run.total,
            replaced=sorted(run.replaced),
            notes=list(run.notes),
            elapsed_ms=(time.perf_counter() - t0) * 1000.0,
        )
        return out


def _tail_start(n: int, messages: Sequence[Message], spans: list[tuple[int, int]]) -> int:
    if n <= 0:
        return len(messages)
    counted = 0
    for start, _end in reversed(spans):
        if messages[start].get("role") in ("user", "assistant"):
            counted += 1
            if counted == n:
                return start
    return 0


class _Pass:
    """One compaction of one list; holds the running token total and what changed."""

    def __init__(
        self,
        settings: RulesSettings,
        messages: Sequence[Message],
        context_length: int,
        threshold_tokens: int,
        index: _FactIndex,
    ) -> None:
        self.s = settings
        self.src = messages
        self.window = context_length
        self.threshold = threshold_tokens
        self.tokens = [estimate_message_tokens(m) for m in messages]
        self.tokens_before = sum(self.tokens)
        self.total = self.tokens_before
        # output slots: index -> replacement message, or None to drop
        self.new: dict[int, Message | None] = {}
        self.replaced: set[int] = set()
        self.notes: list[str] = []
        self.cuts = 0
        self.open_from = 0
        # facts shown by messages that are never removed: records (listed facts) and users
        self.known: set[str] = set()
        for m in messages:
            self.known.update(index.of(m))
        self.anchors = "\n".join(content_text(m.get("content")) for m in messages if m.get("role") == "user")

    # -- bookkeeping ----------------------------------------------------------------------
    def _set(self, i: int, message: Message | None) -> None:
        after = 0 if message is None else estimate_message_tokens(message)
        self.total += after - self.tokens[i]
        self.tokens[i] = after
        self.new[i] = message
        self.replaced.add(i)

    def _current(self, i: int) -> Message | None:
        return self.new[i] if i in self.new else self.src[i]

    def _learn(self, missing: Facts) -> None:
        self.known.update(missing.paths)
        self.known.update(missing.urls)
        self.known.update(missing.errors)

    # -- the pass ---------------------------------------------------------------------------
    def execute(self) -> list[Message]:
        spans = group_spans(self.src)
        tail_start = self._tail_start(spans)
        system_cutoff = self._system_cutoff()
        # Everything up to the last record of an earlier compaction was settled by it (kept
        # or recorded) and is sent from the cache: never revisit it. This also freezes
        # protected messages that preceded a last-resort cut.
        settled = max((i + 1 for i, m in enumerate(self.src) if _is_marked(m)), default=0)
        self.open_from = min(settled, tail_start)
        for start, end in spans:
            if start >= tail_start:
                break
            if start < settled:
                continue
            first = self.src[start]
            role = first.get("role")
            if role == "assistant" and (end - start > 1 or tool_calls(first)):
                self._group(start, end)
            elif role == "user" or _is_marked(first):
                continue
            elif role in ("system", "developer"):
                if start > system_cutoff:
                    self._system(start)
            elif role == "assistant" and self.s.collapse_consecutive_assistant:
                self._superseded_run(start, tail_start)
        if self.total > self.window:
            self._last_resort(tail_start)
        if self.total > self.window:
            self._squeeze()
        if self.total > self.window:
            self._drop_facts(tail_start)
        if self.total > self.window:
            self.notes.append(
                f"still over the window ({self.total} > {self.window} estimated tokens): "
                "what remains is user messages, the system prompt and protected turns"
            )
        out: list[Message] = []
        for i, m in enumerate(self.src):
            if i in self.new:
                r = self.new[i]
                if r is not None:
                    out.append(r)
            else:
                out.append(m)
        return out

    def _tail_start(self, spans: list[tuple[int, int]]) -> int:
        return _tail_start(self.s.protect_last_n_turns, self.src, spans)

    def _system_cutoff(self) -> int:
        """Index of the user message that ends turn ``drop_system_after_turn`` (system
        messages after it are dropped); past the end when the rule is off or not reached."""
        k = self.s.drop_system_after_turn
        if k <= 0:
            return len(self.src)
        seen = 0
        for i, m in enumerate(self.src):
            if m.get("role") == "user":
                seen += 1
                if seen == k:
                    return i
        return len(self.src)

    # -- rule 3 -----------------------------------------------------------------------------
    def _system(self, i: int) -> None:
        m = self.src[i]
        if _is_marked(m):
            return
        text = content_text(m.get("content"))
        if not text.strip():
            return
        first = text.strip().splitlines()[0]
        if len(first) > 80:
            first = first[:80] + "…"
        marker = f"{MARK}system: {json.dumps(first, ensure_ascii=False)}, {len(text)} chars dropped]"
        if len(marker) >= len(text):
            return
        self._set(i, {**m, "content": marker})

    # -- rule 4 -----------------------------------------------------------------------------
    def _superseded_run(self, start: int, tail_start: int) -> None:
        """``start`` is a plain assistant message; if the next one is too, it is superseded.

        The superseded messages of a run (all before its last) are dropped; when they hold
        facts the context would otherwise lose, one marker message listing them takes the
        first one's place.
        """
        src = self.src

        def plain(j: int) -> bool:
            m = src[j]
            return m.get("role") == "assistant" and not tool_calls(m)

        if start + 1 >= len(src) or not plain(start + 1) or _is_marked(src[start]):
            return
        last = start + 1
        while last + 1 < len(src) and plain(last + 1):
            last += 1
        superseded = [j for j in range(start, last) if j < tail_start and not _is_marked(src[j]) and j not in self.new]
        if not superseded:
            return
        facts = Facts()
        for j in superseded:
            facts = facts.merge(_result_facts(src[j]))
        missing = _missing(facts, message_text(src[last]), self.known, self.anchors)
        lines, _, _ = _facts_lines(missing)
        for j in superseded:
            self._set(j, None)
        if lines:
            head = f"{MARK}assistant: {len(superseded)} earlier message(s) collapsed]"
            self._set(superseded[0], {"role": "assistant", "content": "\n".join([head, *lines])})
            self._learn(missing)

    # -- rules 1 and 2 ------------------------------------------------------------------------
    def _group(self, start: int, end: int) -> None:
        """An assistant message with its tool results (rule 1, then rule 2 per result)."""
        a = self.src[start]
        new_a = self._elide_args(a)
        if new_a is not None:
            self._set(start, new_a)
        a_now = new_a if new_a is not None else a
        a_text = message_text(a_now)
        calls = tool_calls(a_now)
        by_id: dict[str, Mapping[str, Any]] = {}
        for c in calls:
            by_id.setdefault(tool_call_id(c), c)
        for pos, i in enumerate(range(start + 1, end)):
            r = self.src[i]
            if _is_marked(r):
                continue
            cid = r.get("tool_call_id")
            call = by_id.get(cid) if isinstance(cid, str) else None
            if call is None and pos < len(calls):
                call = calls[pos]
            new_r = self._result(r, call, a_text)
            if new_r is not None:
                self._set(i, new_r)

    def _elide_args(self, a: Message) -> Message | None:
        """Rule 1's "drop the raw request": arguments longer than ``max_tool_output_chars``
        become ``{"_ctxengine_elided_chars": N, "head": "…", "facts": "…"}`` (still JSON)."""
        limit = self.s.max_tool_output_chars
        raw_calls = a.get("tool_calls")
        if not self.s.keep_tool_summary or not isinstance(raw_calls, list):
            return None
        changed = False
        new_calls: list[Any] = []
        for c in raw_calls:
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict):
                new_calls.append(c)
                continue
            args = fn.get("arguments")
            if not isinstance(args, str) or len(args) <= limit or args.startswith('{"' + ELIDED_KEY):
                new_calls.append(c)
                continue
            kept: dict[str, Any] = {ELIDED_KEY: len(args), "head": args[:ARGS_HEAD]}
            facts = Facts([], paths_in(args), urls_in(args), [], [])
            missing = _missing(facts, json.dumps(kept, ensure_ascii=False))
            flines, _, _ = _facts_lines(missing)
            if flines:
                kept["facts"] = "\n".join(flines)
            new_args = json.dumps(kept, ensure_ascii=False)
            if len(new_args) >= len(args):
                new_calls.append(c)
                continue
            new_calls.append({**c, "function": {**fn, "arguments": new_args}})
            changed = True
        return {**a, "tool_calls": new_calls} if changed else None

    def _result(self, r: Message, call: Mapping[str, Any] | None, call_text: str) -> Message | None:
        """The replacement of tool result ``r`` by rule 1 or 2 (or None to keep it)."""
        text = content_text(r.get("content"))
        if not text:
            return None
        facts = _result_facts(r)
        failed = _failed(facts.errors)
        if not failed and self.s.keep_tool_summary:
            kind = "tool"
        elif len(text) > self.s.max_tool_output_chars:
            kind = "truncated"
        else:
            return None
        built = self._record(r, text, facts, failed, kind, call, call_text, None)
        return built[0] if built is not None else None

    def _record(
        self,
        r: Message,
        text: str,
        facts: Facts,
        failed: bool,
        kind: str,
        call: Mapping[str, Any] | None,
        call_text: str,
        max_tokens: int | None,
        *,
        learn: bool = True,
    ) -> tuple[Message, int] | None:
        """A record standing for tool result ``r``: a header, the head and tail lines unless
        ``kind`` is ``tool``, then the facts neither shown by the record or its call nor
        already known to the context. With ``max_tokens``, facts that would make the message
        larger are left out (errors last). Returns the message and the number of facts left
        out, or None when the record would not be shorter than ``text``."""
        status = "error" if failed else "ok"
        preview = _call_preview(call)
        if kind == "tool":
            header = f"{MARK}tool: {preview} → ok, {len(text)} chars]"
            body: list[str] = []
        else:
            nlines = text.count("\n") + 1
            why = "; cut to fit the window" if kind == "cut" else ""
            header = f"{MARK}{kind}: {preview} → {status}, {len(text)} chars, {nlines} lines{why}]"
            body, _ = _head_tail(text, self.s.head_lines, self.s.tail_lines)
        kept = "\n".join([header, *body])
        own = _missing(facts, kept + "\n" + call_text)
        if max_tokens is None and len(kept) + sum(len(x) + 1 for x in _facts_lines(own)[0]) >= len(text):
            # not shorter on its own: keep the original. Decided without the facts known from
            # elsewhere, which grow between compactions, so the verdict never flips later.
            return None
        missing = _missing(own, "", self.known, self.anchors)
        msg, dropped = self._fit(r, kept, missing, max_tokens)
        if len(content_text(msg.get("content"))) >= len(text):
            return None
        if learn:
            self._learn(missing)
        return msg, dropped

    @staticmethod
    def _fit(r: Message, kept: str, missing: Facts, max_tokens: int | None) -> tuple[Message, int]:
        """``r`` with content ``kept`` plus the facts block; with ``max_tokens``, as many facts
        as keep the message within it. Returns the message and how many facts were left out."""
        flines, _, dropped = _facts_lines(missing)
        msg = {**r, "content": "\n".join([kept, *flines])}
        if max_tokens is None or not flines or estimate_message_tokens(msg) <= max_tokens:
            return msg, dropped
        room = max_tokens - estimate_message_tokens({**r, "content": kept})
        while True:
            flines, chosen, dropped = _facts_lines(missing, max(0, room))
            msg = {**r, "content": "\n".join([kept, *flines])}
            over = estimate_message_tokens(msg) - max_tokens
            if over <= 0 or not flines:
                break
            room -= max(1, over)
        # the per-fact costs round up: top up with facts that still fit, checked exactly
        failures = 0
        for kind in ("errors", "urls", "paths"):
            have: list[str] = getattr(chosen, kind)
            taken = set(have)
            for item in getattr(missing, kind):
                if failures >= 16:
                    break
                if item in taken:
                    continue
                have.append(item)
                trial = {**r, "content": "\n".join([kept, *_render_facts(chosen)])}
                if estimate_message_tokens(trial) <= max_tokens:
                    msg, dropped, failures = trial, dropped - 1, 0
                    taken.add(item)
                else:
                    have.pop()
                    failures += 1
        return msg, dropped

    # -- never over the window ----------------------------------------------------------------
    def _last_resort(self, tail_start: int) -> None:
        """Cut the largest tool outputs of the protected tail (head and tail lines plus every
        fact) until the context is under the trigger again.

        Cut records never let other records rely on their facts (no dedupe against them), so
        if some of their facts must go later (:meth:`_drop_facts`), nothing else is lost.
        """
        candidates = self._tail_candidates(tail_start)
        for i in candidates:
            if self.total <= self.threshold:
                break
            built = self._cut(i, None)
            if built is not None:
                self.cuts += 1
                self._cut_note(i, built[0], built[1])

    def _tail_candidates(self, tail_start: int) -> list[int]:
        found = [
            i
            for i in range(tail_start, len(self.src))
            if i not in self.new
            and self.src[i].get("role") == "tool"
            and not _is_marked(self.src[i])
            and len(content_text(self.src[i].get("content"))) > self.s.max_tool_output_chars
        ]
        found.sort(key=lambda i: (-self.tokens[i], i))
        return found

    def _cut_note(self, i: int, facts: Facts, dropped: int) -> None:
        text = content_text(self.src[i].get("content"))
        note = f"last resort: cut protected tool output at message {i} ({len(text)} chars) to fit the window"
        if dropped:
            note += f"; {dropped} of its {len(facts)} facts did not fit the window and were left out"
        self.notes.append(note)

    def _cut(self, i: int, max_tokens: int | None, *, apply: bool = True) -> tuple[Facts, int, Message] | None:
        """A cut record for protected tool output ``i`` (set in place unless ``apply`` is
        False); None when that is not shorter. Returns its facts, how many were left out, and
        the record."""
        r = self.src[i]
        text = content_text(r.get("content"))
        facts = _result_facts(r)
        failed = _failed(facts.errors)
        call = self._call_of(i)
        call_text = message_text(self._current(self._owner(i)) or {})
        built = self._record(r, text, facts, failed, "cut", call, call_text, max_tokens, learn=False)
        if built is None:
            return None
        if apply:
            self._set(i, built[0])
        return facts, built[1], built[0]

    def _records(self) -> list[int]:
        """Tool records this compaction wrote, largest first. Records of earlier compactions
        are never rewritten: they are the cached prefix."""
        found = [
            i
            for i, m in self.new.items()
            if m is not None and m.get("role") == "tool" and _is_marked(m)
        ]
        found.sort(key=lambda i: (-self.tokens[i], i))
        return found

    @staticmethod
    def _record_parts(text: str) -> tuple[str, Facts]:
        """A record's header line and every fact it shows (its lines and its listed facts)."""
        before, listed = _split_record(text)
        header, _, body = before.partition("\n")
        facts = Facts(
            [],
            list(dict.fromkeys([*listed.paths, *paths_in(body)])),
            list(dict.fromkeys([*listed.urls, *urls_in(body)])),
            [],
            list(dict.fromkeys([*listed.errors, *error_lines(body)])),
        )
        return header, _missing(facts, header)

    def _squeeze(self) -> None:
        """Still over the window: reduce the largest records this compaction wrote to their
        header and facts (their head and tail lines go), dropping no fact."""
        for i in self._records():
            if self.total <= self.window:
                break
            m = self._current(i)
            assert m is not None
            text = content_text(m.get("content"))
            header, facts = self._record_parts(text)
            msg, _ = self._fit(m, header, facts, None)
            if len(content_text(msg.get("content"))) < len(text):
                self._set(i, msg)
                self.notes.append(f"squeezed the record at message {i} to its header and facts to stay inside the window")

    def _drop_facts(self, tail_start: int) -> None:
        """Facts alone overflow the window (a listing with more distinct paths than the window
        holds): take them from the largest record this compaction wrote or protected output,
        paths before URLs before error lines (records already sent are never rewritten).

        When what must go is large anyway, the message keeps facts only up to halfway between
        the trigger and the window, so the agent has room for its next turns and later outputs
        for their own facts; when little must go, it keeps every fact that fits the window.
        Reported in the notes."""
        # outputs no earlier compaction settled: the protected tail, and outputs the rules
        # kept whole because a record with all their facts would not be shorter
        pool = [*self._records(), *self._tail_candidates(min(tail_start, self.open_from))]
        pool.sort(key=lambda i: (-self.tokens[i], i))
        ceiling = (self.threshold + self.window) // 2
        shrunk: dict[int, tuple[Message, int, int]] = {}  # index -> (message before, dropped, facts)

        def choose(i: int, m: Message) -> tuple[Message, int, int] | None:
            others = self.total - self.tokens[i]
            chosen: tuple[Message, int, int] | None = None
            for budget in (max(0, ceiling - others), max(0, self.window - others)):
                built = self._shrink(i, m, budget)
                if built is None:
                    continue
                msg, dropped, total_facts, lost = built
                chosen = (msg, dropped, total_facts)
                if lost:
                    # facts another message still shows are not lost
                    rest = "\n".join(message_text(c) for j in range(len(self.src)) if j != i and (c := self._current(j)) is not None)
                    lost = [f for f in lost if f not in rest]
                if others + estimate_message_tokens(msg) + estimate("\n".join(lost)) > self.window:
                    break  # what it leaves out could not have fitted anyway
            return chosen

        for i in pool:
            if self.total <= self.window:
                break
            m = self._current(i)
            assert m is not None
            chosen = choose(i, m)
            if chosen is None:
                continue
            self._set(i, chosen[0])
            shrunk[i] = (m, chosen[1], chosen[2])
            if not _is_marked(m):
                self.cuts += 1
        # Messages shrunk early were sized while later ones were still large: give each the
        # room the others left once all of them shrank (nothing here has been sent yet).
        for i, (m, dropped, total_facts) in shrunk.items():
            before = self._current(i)
            self._set(i, m)
            chosen = choose(i, m)
            if chosen is not None and chosen[1] < dropped and self.total - self.tokens[i] + estimate_message_tokens(chosen[0]) <= self.window:
                self._set(i, chosen[0])
                dropped = chosen[1]
            else:
                self._set(i, before)
            self.notes.append(
                f"message {i}: {dropped} of its {total_facts} facts left out: they alone overflow the window"
            )

    def _shrink(self, i: int, m: Message, budget: int) -> tuple[Message, int, int, list[str]] | None:
        """``m`` (a record this compaction wrote, or an uncut protected output) reduced to fit
        ``budget`` tokens; with its dropped-fact count, fact count and the facts it lost."""
        if _is_marked(m):
            header, facts = self._record_parts(content_text(m.get("content")))
            msg, dropped = self._fit(m, header, facts, budget)
            if estimate_message_tokens(msg) >= self.tokens[i]:
                return None
        else:
            built = self._cut(i, budget, apply=False)
            if built is None:
                return None
            facts, dropped, msg = built
        text = content_text(msg.get("content"))
        lost = [f for f in facts.all() if f not in text]
        return msg, dropped, len(facts), lost

    def _owner(self, i: int) -> int:
        j = i
        while j > 0 and self.src[j].get("role") == "tool":
            j -= 1
        return j

    def _call_of(self, i: int) -> Mapping[str, Any] | None:
        owner = self._owner(i)
        a = self._current(owner)
        if a is None:
            return None
        calls = tool_calls(a)
        cid = self.src[i].get("tool_call_id")
        for c in calls:
            if tool_call_id(c) == cid:
                return c
        pos = i - owner - 1
        return calls[pos] if 0 <= pos < len(calls) else None
