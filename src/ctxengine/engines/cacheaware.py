"""The ``cacheaware`` engine: deterministic compaction shaped by prompt-cache economics.

Under explicit cache breakpoints a request costs little for the prefix it shares with the
previous one (read at 0.1×) and a lot for everything after the first changed byte (written
again at 1.25×). Replays of real agent sessions (DESIGN §3.8) show what follows, and this
engine does exactly that:

1. **Cut tool outputs in batches, soon after use.** A tool result stays whole while it is one
   of the last ``keep_recent`` tool exchanges (the agent is still working with it). Once enough
   older whole outputs have piled up (``batch`` of them, or ``batch_tokens``), all of them are
   cut at once: first ``head_lines`` and last ``tail_lines`` lines kept, plus a verbatim list of
   the paths, URLs and error lines of the removed middle. One rewrite per batch instead of one
   per call.
2. **Fold old turns into fact digests** when the context still passes ``fold_ratio`` of the
   window: the oldest assistant/tool runs (never user messages, never the system prompt) become
   one digest of the actions taken and the facts seen, down to ``fold_target`` of the window.
3. **Cut a giant new output before it is ever sent** (over ``giant_ratio`` of the window): it
   was never cached, so cutting it costs nothing, and it could not fit anyway.
4. **Never touch the cut prefix again.** Records and digests start with ``[ctxengine:`` and are
   left alone by later passes, so the prefix stays byte-stable and is read from cache.

Everything removed stays in the engine (the originals, per session) and can be read back
verbatim through the ``ctx_grep`` tool, so the preservation guarantee holds for facts that
do not fit the records (a recursive listing can hold more distinct paths than any window).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxengine.boundaries import group_spans
from ctxengine.cost import compaction_break_even
from ctxengine.engine import CompactionReport, ContextEngine
from ctxengine.facts import FACT_KINDS, Facts, extract_facts
from ctxengine.messages import (
    Message,
    content_text,
    is_summary,
    message_text,
    tool_call_name,
    tool_calls,
)
from ctxengine.models import DEFAULT_CONTEXT_LENGTH
from ctxengine.tokens import estimate_message_tokens

__all__ = ["CacheAwareEngine", "CacheAwareSettings"]

CUT_MARK = "[ctxengine:cut]"
DIGEST_MARK = "[ctxengine:digest]"
GREP_TOOL = "ctx_grep"
_RECORD_TOKENS = 200
"""Rough size of a cut record (header, head and tail lines, a few facts)."""


@dataclass(frozen=True, slots=True)
class CacheAwareSettings:
    """Knobs of the cacheaware engine; the defaults are the measured sweet spot on the shared
    trajectories (keep a few outputs whole, cut in batches of about six)."""

    keep_recent: int = 3
    """Tool exchanges at the end kept whole: the agent is still using them."""
    batch: int = 6
    """Cut once this many older whole outputs are waiting…"""
    batch_tokens: int = 6000
    """…or once they hold this many tokens."""
    cut_min_tokens: int = 120
    """Outputs shorter than this are never cut: the record would save nothing."""
    head_lines: int = 6
    tail_lines: int = 3
    max_line_chars: int = 300
    max_fact_lines: int | None = 12
    """Facts listed in one record; the rest stay retrievable through ``ctx_grep`` (DESIGN §3.8:
    keeping every path of a huge listing in context is what makes it expensive). ``None``
    lists every fact, as the contract kit's invariant 8 asks of deterministic engines."""
    giant_ratio: float = 0.08
    """A new output larger than this fraction of the window is cut before it is sent."""
    fold_ratio: float = 0.55
    """Fold old turns into digests when the context passes this fraction of the window…"""
    fold_target: float = 0.35
    """…down to this fraction."""
    fold_run_tokens: int = 8000
    """When a new user turn begins, the previous turn's assistant/tool run is folded into a
    digest if it holds at least this many tokens (0 turns this off)."""
    max_action_chars: int = 160
    cost_aware: bool = True
    """Cut a batch only when it pays for its cache rewrite (Anthropic rates, see
    :func:`ctxengine.cost.compaction_break_even`); off: cut as soon as a batch is full. The
    prefix a cut leaves untouched counts as cached in the proportion the provider's usage
    (``cache_read_input_tokens``) showed after the previous compaction."""
    min_horizon: int = 8


def _cap(line: str, n: int) -> str:
    return line if len(line) <= n else line[:n] + "…"


class CacheAwareEngine(ContextEngine):
    """See the module docstring. Deterministic: same input, same output."""

    deterministic = True

    def __init__(
        self,
        *,
        context_length: int = DEFAULT_CONTEXT_LENGTH,
        threshold: float | None = None,
        settings: CacheAwareSettings | None = None,
    ) -> None:
        self.settings = settings or CacheAwareSettings()
        self.threshold_ratio = self.settings.fold_ratio
        super().__init__(context_length=context_length, threshold=threshold)
        self._originals: list[str] = []
        self._recallable: set[str] = set()
        self._tok: dict[int, tuple[Mapping[str, Any], int]] = {}
        self._calls = 0
        self._expected_stable: int | None = None
        self._stable_ratio = 1.0
        self._fact_memo: dict[int, tuple[Mapping[str, Any], Facts]] = {}

    @classmethod
    def from_config(cls, config: Any, context_length: int, **services: Any) -> CacheAwareEngine:
        """Defaults only: the engine has no config section yet (its knobs are
        :class:`CacheAwareSettings`)."""
        return cls(context_length=context_length)

    @property
    def name(self) -> str:
        return "cacheaware"

    # -- token counts, memoised per message object ------------------------------------------
    def _tokens(self, m: Mapping[str, Any]) -> int:
        hit = self._tok.get(id(m))
        if hit is not None and hit[0] is m:
            return hit[1]
        t = estimate_message_tokens(m)
        if len(self._tok) > 200_000:
            self._tok.clear()
        self._tok[id(m)] = (m, t)
        return t

    def _facts(self, m: Mapping[str, Any]) -> Facts:
        hit = self._fact_memo.get(id(m))
        if hit is not None and hit[0] is m:
            return hit[1]
        f = extract_facts([m])
        if len(self._fact_memo) > 50_000:
            self._fact_memo.clear()
        self._fact_memo[id(m)] = (m, f)
        return f

    # -- the contract -----------------------------------------------------------------------
    def update_from_response(self, usage: Any) -> None:
        u = self._record_usage(usage)
        self._calls += 1
        if self._expected_stable is not None and (u.cache_read_tokens or u.cache_write_tokens):
            # the first response after a compaction says how much of the prefix we kept was
            # really read from cache (a rolling placement such as system_and_3 reads only the
            # system prompt): later batches are weighed with what the provider delivers
            if self._expected_stable > 0:
                self._stable_ratio = min(1.0, u.cache_read_tokens / self._expected_stable)
            self._expected_stable = None

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        tokens = self.last_prompt_tokens if prompt_tokens is None else prompt_tokens
        return tokens >= self.threshold_tokens

    def should_compress_preflight(self, messages: list[Message]) -> bool:
        giant, batch = self._plan(messages)
        return bool(giant) or self._batch_due(messages, batch) or self._finished_run(messages) is not None

    def on_session_reset(self) -> None:
        super().on_session_reset()
        self._originals.clear()
        self._recallable.clear()
        self._calls = 0
        self._expected_stable = None
        self._stable_ratio = 1.0

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return [
            {
                "name": GREP_TOOL,
                "description": "Search the full text of tool outputs and turns that were cut from the context; returns the matching original lines verbatim.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "Text to look for (case-insensitive substring)."},
                        "limit": {"type": "integer", "description": "Maximum lines to return (default 50)."},
                    },
                    "required": ["query"],
                },
            }
        ]

    def handle_tool_call(self, name: str, args: Mapping[str, Any], **kwargs: Any) -> str:
        if name != GREP_TOOL:
            return json.dumps({"error": f"Unknown tool: {name}"})
        query = str(args.get("query", "")).lower()
        if not query:
            return json.dumps({"error": "query is empty"})
        limit = int(args.get("limit", 50) or 50)
        hits: list[str] = []
        for n, text in enumerate(self._originals):
            for line in text.splitlines():
                if query in line.lower():
                    hits.append(f"[{n}] {line}")
                    if len(hits) >= limit:
                        return json.dumps({"matches": hits, "truncated": True}, ensure_ascii=False)
        return json.dumps({"matches": hits, "truncated": False}, ensure_ascii=False)

    def retrievable(self, text: str) -> bool:
        """True when ``text`` occurs verbatim in something this engine removed (``ctx_grep``
        returns it)."""
        if text in self._recallable:
            return True
        return any(text in o for o in self._originals)

    def get_status(self) -> dict[str, Any]:
        st = super().get_status()
        st["originals_kept"] = len(self._originals)
        return st

    # -- planning ---------------------------------------------------------------------------
    def _cuttable(self, m: Mapping[str, Any]) -> bool:
        if m.get("role") != "tool":
            return False
        if is_summary(m):
            return False
        return self._tokens(m) >= self.settings.cut_min_tokens

    def _tail_start(self, messages: Sequence[Message], spans: list[tuple[int, int]]) -> int:
        """Index where the protected tail (the last ``keep_recent`` tool exchanges) begins."""
        keep = self.settings.keep_recent
        groups = [a for a, b in spans if b - a > 1 and messages[a].get("role") == "assistant"]
        if keep <= 0 or not groups:
            return len(messages)
        return groups[-keep] if len(groups) >= keep else groups[0]

    def _plan(self, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
        """(giant outputs in the protected tail, whole outputs waiting before it)."""
        tail_start = self._tail_start(messages, group_spans(messages))
        giant_limit = self.settings.giant_ratio * self.context_length
        giant = [i for i in range(tail_start, len(messages)) if self._cuttable(messages[i]) and self._tokens(messages[i]) > giant_limit]
        waiting = [i for i in range(tail_start) if self._cuttable(messages[i])]
        return giant, waiting

    def _batch_due(self, messages: Sequence[Message], waiting: list[int]) -> bool:
        """A batch is due when enough whole outputs wait *and* the cut pays for the cache it
        invalidates within as many further calls as the session has already made (a session
        that has run N calls is taken to run about N more; at least ``min_horizon``)."""
        s = self.settings
        if not waiting:
            return False
        sizes = [self._tokens(messages[i]) for i in waiting]
        if len(waiting) < s.batch and sum(sizes) < s.batch_tokens:
            return False
        if not s.cost_aware:
            return True
        toks = [self._tokens(m) for m in messages]
        before = sum(toks)
        saved = sum(max(0, t - _RECORD_TOKENS) for t in sizes)
        stable = int(sum(toks[: waiting[0]]) * self._stable_ratio)
        horizon = max(s.min_horizon, self._calls)
        return compaction_break_even(before, before - saved, stable) <= horizon

    # -- compaction -------------------------------------------------------------------------
    def compress(
        self,
        messages: list[Message],
        current_tokens: int | None = None,
        focus_topic: str | None = None,
    ) -> list[Message]:
        t0 = time.perf_counter()
        before_tokens = sum(self._tokens(m) for m in messages)
        giant, waiting = self._plan(messages)
        over = before_tokens >= self.threshold_tokens
        out = list(messages)
        replaced: list[int] = []
        cut = giant + (waiting if (over or self._batch_due(messages, waiting)) else [])
        owners = self._owners(messages)
        for i in sorted(cut):
            out[i] = self._cut(messages[i], owners.get(i))
            replaced.append(i)
        notes: list[str] = []
        tokens = sum(self._tokens(m) for m in out)
        finished = self._finished_run(out)
        if finished is not None:
            out, folded, tokens = self._fold(out, [finished], -1.0)
            if folded:
                notes.append(f"folded the {folded} messages of the finished turn into a digest")
        if tokens >= self.threshold_tokens:
            out, folded, tokens = self._fold(out, self._runs(out, group_spans(out)), self.settings.fold_target * self.context_length)
            if folded:
                notes.append(f"folded {folded} messages into digests")
        if out == messages:
            return list(messages)
        first_changed = next(
            (i for i, (a, b) in enumerate(zip(out, messages, strict=False)) if a is not b and a != b),
            min(len(out), len(messages)),
        )
        self._expected_stable = sum(self._tokens(m) for m in out[:first_changed])
        self.compression_count += 1
        self.last_report = CompactionReport(
            self.name,
            len(messages),
            len(out),
            before_tokens,
            tokens,
            replaced=replaced,
            notes=notes,
            elapsed_ms=(time.perf_counter() - t0) * 1000.0,
        )
        return out

    def _owners(self, messages: Sequence[Message]) -> dict[int, Mapping[str, Any]]:
        """Tool result index → the tool call it answers (matched by position in its group)."""
        out: dict[int, Mapping[str, Any]] = {}
        for start, end in group_spans(messages):
            calls = tool_calls(messages[start])
            by_id = {c.get("id"): c for c in calls}
            for k, i in enumerate(range(start + 1, end)):
                call = by_id.get(messages[i].get("tool_call_id"))
                if call is None and k < len(calls):
                    call = calls[k]
                if call is not None:
                    out[i] = call
        return out

    def _remember(self, removed: Sequence[Mapping[str, Any]]) -> None:
        for m in removed:
            text = message_text(m)
            if text:
                self._originals.append(text)
        for m in removed:
            facts = self._facts(m)
            for k in FACT_KINDS:
                self._recallable.update(getattr(facts, k))

    def _fact_lines(self, facts: Facts, kept: str) -> tuple[list[str], int]:
        lines: list[str] = []
        dropped = 0
        for kind, label in (("errors", "error"), ("paths", "path"), ("urls", "url")):
            for f in getattr(facts, kind):
                if f in kept:
                    continue
                cap = self.settings.max_fact_lines
                if cap is not None and len(lines) >= cap:
                    dropped += 1
                    continue
                lines.append(f"{label}: {f}")
        return lines, dropped

    def _cut(self, m: Message, call: Mapping[str, Any] | None) -> Message:
        s = self.settings
        text = content_text(m.get("content"))
        all_lines = text.splitlines()
        n = len(all_lines)
        if n <= s.head_lines + s.tail_lines:
            kept_lines = [_cap(x, s.max_line_chars) for x in all_lines]
            removed = 0
        else:
            kept_lines = [_cap(x, s.max_line_chars) for x in all_lines[: s.head_lines]]
            removed = n - s.head_lines - s.tail_lines
            kept_lines.append(f"[… {removed} lines cut …]")
            kept_lines += [_cap(x, s.max_line_chars) for x in all_lines[n - s.tail_lines :]]
        kept = "\n".join(kept_lines)
        facts = self._facts(m)
        fact_lines, dropped = self._fact_lines(facts, kept)
        tool = tool_call_name(call) if call is not None else "tool"
        header = f"{CUT_MARK} {tool} output, {n} lines, ~{self._tokens(m)} tokens; full text via {GREP_TOOL}"
        parts = [header, kept]
        if fact_lines:
            parts.append("facts of the cut lines:\n" + "\n".join(fact_lines))
        if dropped:
            parts.append(f"[{dropped} more facts retrievable via {GREP_TOOL}]")
        self._remember([m])
        new = {k: v for k, v in m.items() if k != "content"}
        new["content"] = "\n".join(parts)
        return new

    def _runs(self, messages: Sequence[Message], spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Runs of foldable units (assistant turns with their results; never user messages, the
        system prompt or an earlier digest) before the protected tail, oldest first."""
        tail_start = self._tail_start(messages, spans)
        runs: list[tuple[int, int]] = []
        start = -1
        end = -1
        for a, b in spans:
            if a >= tail_start:
                break
            m = messages[a]
            foldable = m.get("role") == "assistant" and not content_text(m.get("content")).startswith(DIGEST_MARK)
            if foldable:
                if start < 0:
                    start = a
                end = b
            elif start >= 0:
                runs.append((start, end))
                start = -1
        if start >= 0:
            runs.append((start, end))
        return runs

    def _finished_run(self, messages: Sequence[Message]) -> tuple[int, int] | None:
        """The run of the turn that just ended, when a new user turn has just begun and that run
        holds ``fold_run_tokens`` or more: folding it now rewrites almost nothing but the new
        user message, which is written anyway."""
        s = self.settings
        if s.fold_run_tokens <= 0 or not messages or messages[-1].get("role") != "user":
            return None
        u = len(messages)
        while u > 0 and messages[u - 1].get("role") == "user":
            u -= 1
        spans = group_spans(messages)
        runs = self._runs(messages, spans)
        if not runs:
            return None
        a, b = runs[-1]
        # only the protected tail (kept whole for now) may sit between the run and the new turn
        if b < u and b < self._tail_start(messages, spans) and any(messages[k].get("role") != "user" for k in range(b, u)):
            return None
        if sum(self._tokens(messages[k]) for k in range(a, b)) < s.fold_run_tokens:
            return None
        return a, b

    def _fold(self, messages: list[Message], runs: list[tuple[int, int]], target: float) -> tuple[list[Message], int, int]:
        """Fold ``runs`` (oldest first) into digests until the context is under ``target``."""
        tokens = sum(self._tokens(m) for m in messages)
        replace: dict[int, tuple[int, Message]] = {}
        folded = 0
        for a, b in runs:
            if tokens <= target:
                break
            span = messages[a:b]
            before = sum(self._tokens(m) for m in span)
            digest = self._digest(messages, a, b)
            saved = before - self._tokens(digest)
            if saved <= 0:
                continue
            replace[a] = (b, digest)
            tokens -= saved
            folded += b - a
        if not replace:
            return messages, 0, tokens
        out: list[Message] = []
        i = 0
        while i < len(messages):
            if i in replace:
                end, digest = replace[i]
                out.append(digest)
                i = end
            else:
                out.append(messages[i])
                i += 1
        return out, folded, sum(self._tokens(m) for m in out)

    def _digest(self, messages: Sequence[Message], a: int, b: int) -> Message:
        s = self.settings
        span = messages[a:b]
        actions: list[str] = []
        for m in span:
            for c in tool_calls(m):
                fn = c.get("function") or {}
                args = fn.get("arguments") if isinstance(fn, dict) else ""
                if not isinstance(args, str):
                    args = json.dumps(args, ensure_ascii=False)
                actions.append(f"- {tool_call_name(c)}: {_cap(' '.join(args.split()), s.max_action_chars)}")
        facts = Facts()
        for m in span:
            facts = facts.merge(self._facts(m))
        head = f"{DIGEST_MARK} {len(span)} earlier messages folded; full text via {GREP_TOOL}"
        kept = "\n".join([head, *actions])
        fact_lines, dropped = self._fact_lines(facts, kept)
        tools = [t for t in facts.tools if t not in kept]
        parts = [kept]
        if tools:
            parts.append("tools: " + ", ".join(tools))
        if fact_lines:
            parts.append("facts:\n" + "\n".join(fact_lines))
        if dropped:
            parts.append(f"[{dropped} more facts retrievable via {GREP_TOOL}]")
        # remember both the originals and the records they had become
        self._remember(span)
        prev = messages[a - 1].get("role") if a > 0 else None
        nxt = messages[b].get("role") if b < len(messages) else None
        role = "assistant" if nxt in ("user", None) or prev in ("user", "system") else "user"
        return {"role": role, "content": "\n\n".join(parts)}
