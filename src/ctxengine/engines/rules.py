"""The ``rules`` engine: deterministic, zero-inference compaction (seed 004).

Six rules, in the seed's priority order, as a policy over the shared kit
(:mod:`ctxengine.engines.kit`):

1. **Collapse succeeded tool pairs.** A tool result that reports no failure becomes a one-line
   record, ``[ctxengine:tool: read_file("config.yaml") → ok, 347 chars]``; the assistant's call
   stays (so the pair stays a valid, shorter pair, never an orphan) and call arguments longer
   than ``max_tool_output_chars`` are elided to a small JSON object (previews and elision:
   :mod:`~.kit.calls`).
2. **Truncate large tool outputs.** A result that reports a failure (or every result when
   ``keep_tool_summary`` is off) and is longer than ``max_tool_output_chars`` keeps its first
   ``head_lines`` and last ``tail_lines`` lines (the kit's one cut, :func:`~.kit.cut_output`).
3. **Drop system messages after turn** ``drop_system_after_turn``: later system messages become
   a one-line marker. The system prompt before that turn is never rewritten.
4. **Collapse consecutive assistant messages**: of a run of assistant messages without tool
   calls only the last is kept.
5. **User messages are never touched.**
6. **The protected tail is never touched** (the last ``protect_last_n_turns`` turns, a turn
   being a user message or an assistant message with its tool results), except to hold the
   window (below).

**Preservation guarantee.** Whatever a rule removes, the paths, URLs and error lines of the
removed text are listed verbatim in a facts block of the record that replaces it, unless
already shown by the record, its call, a user message or an earlier record. With a session
store (``Services.store``) the originals are recorded, each record names its node (``ref=``,
``ctx_expand`` returns it) and lists at most ``fact_tokens`` of facts: the rest is one
``ctx_grep`` away instead of a block of thousands of listing paths in every request. Without a
store every fact is listed.

**Batches and prefix stability.** A compaction compacts everything outside the protected tail
at once; when it cannot get down to ``target_ratio``, the next trigger waits for a whole batch
(:class:`~.kit.pacing.Pacing`). Records are never rewritten and everything up to the last
record of an earlier compaction is settled, so the prefix stays byte-stable.

**Never over the window.** If the result still exceeds the window, the largest outputs of the
protected tail are cut, then the records this compaction wrote are shrunk, in one pass (linear
in the session); facts that do not fit go to recall (with a store) or are left out with a note
(without one). The kernel's window cap holds the window for every engine in any case.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ctxengine.boundaries import group_spans
from ctxengine.config import CompactionConfig
from ctxengine.engine import CompactionReport, ContextEngine, Services
from ctxengine.engines.kit import (
    LINE_CHARS,
    MARK,
    call_of,
    cut_output,
    fit_facts,
    header,
    is_marked,
    render_facts,
    split_facts_block,
    unseen,
)
from ctxengine.engines.kit.build import checked, session_counter, with_overrides
from ctxengine.engines.kit.calls import call_preview, elide_args
from ctxengine.engines.kit.originals import Originals, Refs
from ctxengine.engines.kit.pacing import Pacing, settled_end
from ctxengine.engines.kit.tail import tail_by_turns
from ctxengine.facts import Facts, error_lines, paths_in, urls_in
from ctxengine.messages import (
    Message,
    check,
    content_text,
    message_text,
    tool_call_id,
    tool_calls,
)
from ctxengine.models import DEFAULT_CONTEXT_LENGTH
from ctxengine.tokens import MessageTokens, TokenCounter, estimate

__all__ = ["MARK", "RulesEngine", "RulesSettings"]

RulesSettings = CompactionConfig
"""The engine's settings model: the ``rules:`` section (seed 004's ``compaction:`` block)."""

_FAILURE_RE = re.compile(
    r"(?i)\b(?:errors?|exception|traceback|failed|failure|fatal|panic)\b"
    r"|permission denied|not found|no such file|cannot find symbol|segmentation fault"
)
"""What makes a tool result *failed* (rule 2) rather than succeeded (rule 1): narrower than the
error facts (a file view naming ``IOException`` did not fail)."""


def _facts_of(message: Mapping[str, Any]) -> Facts:
    text = message_text(message)
    if not text:
        return Facts()
    return Facts([], paths_in(text), urls_in(text), [], error_lines(content_text(message.get("content"))))


class RulesEngine(ContextEngine):
    """Seed 004's deterministic compaction (see the module docstring)."""

    deterministic = True
    calls_model = False
    Settings: ClassVar[type[CompactionConfig]] = CompactionConfig

    def __init__(
        self,
        *,
        context_length: int = DEFAULT_CONTEXT_LENGTH,
        settings: CompactionConfig | None = None,
        originals: Originals | None = None,
        counter: TokenCounter | None = None,
        **overrides: Any,
    ) -> None:
        self.settings = s = with_overrides(CompactionConfig, settings, overrides)
        # each message's count: the session's (Services.tokens), else the engine's own over
        # ``counter`` (context.token_counter)
        self.tokens = MessageTokens.of(counter)
        self.counter: TokenCounter = self.tokens.counter
        super().__init__(context_length=context_length, threshold=s.trigger_threshold)
        self.originals = originals
        self.pacing = Pacing(min_gain=s.min_gain, rewrite_every=0)
        self.last_resort_cuts = 0
        self.notes: list[str] = []
        self._index: dict[str, frozenset[str]] = {}

    @classmethod
    def from_config(cls, settings: CompactionConfig | None = None, services: Services | None = None) -> RulesEngine:
        """The ``rules:`` section (``compaction:`` in seed 004), originals in ``services.store``."""
        settings, services = checked(CompactionConfig, settings, services)
        return cls(
            context_length=services.context_length,
            settings=settings,
            originals=Originals.from_services(services),
            counter=session_counter(services),
        )

    def tokens_of(self, message: Mapping[str, Any]) -> int:
        """Tokens of one message with the configured counter (``context.token_counter``),
        read from the session's per-message counts."""
        return self.tokens.message(message)

    @property
    def name(self) -> str:
        return "rules"

    @property
    def target_tokens(self) -> int:
        return int(self.context_length * self.settings.target_ratio)

    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        if self.originals is not None:
            self.originals.use_session(session_id)

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)
        self.pacing.tick()

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        """True at ``trigger_threshold`` of the window; after a compaction that could not reach
        ``target_ratio``, only once a whole batch (trigger − target) has accumulated."""
        tokens = self.last_prompt_tokens if prompt_tokens is None else prompt_tokens
        return self.settings.enabled and self.pacing.armed(tokens, self.threshold_tokens, self.context_length)

    def should_compress_preflight(self, messages: list[Message]) -> bool:
        return self.should_compress(self.tokens.count_messages(messages))

    def on_session_reset(self) -> None:
        super().on_session_reset()
        self.pacing.reset()
        self.last_resort_cuts = 0
        self.notes = []

    def update_model(self, model: str, context_length: int, **kwargs: Any) -> None:
        super().update_model(model, context_length, **kwargs)
        self.pacing.rearm_at = None

    def retrievable(self, text: str) -> bool:
        return self.originals is not None and self.originals.retrievable(text)

    def get_status(self) -> dict[str, Any]:
        status = super().get_status()
        status.update(target_tokens=self.target_tokens, last_resort_cuts=self.last_resort_cuts, notes=list(self.notes))
        return status

    def protected_tail_start(self, messages: Sequence[Message]) -> int:
        return tail_by_turns(messages, self.settings.protect_last_n_turns)

    def listed(self, message: Mapping[str, Any]) -> frozenset[str]:
        """Facts a record lists (cached by its text: records are never rewritten)."""
        text = content_text(message.get("content"))
        if message.get("role") == "user" or not text.startswith(MARK):
            return frozenset()
        hit = self._index.get(text)
        if hit is None:
            if len(self._index) >= 8192:
                self._index.clear()
            hit = self._index[text] = frozenset(split_facts_block(text)[1].all())
        return hit

    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        """Compact ``messages`` by the six rules; never mutates. Raises
        :class:`~ctxengine.errors.InvalidMessages` for input that breaks the chat format."""
        t0 = time.perf_counter()
        check(messages, allow_pending_calls=True)
        run = _Pass(self, messages)
        out = run.execute()
        if run.total <= self.context_length and not self.pacing.worth(run.tokens_before, run.total, self.threshold_tokens):
            return list(messages)
        run.refs.commit({content_text(m.get("content")) for m in run.new.values() if m is not None})
        self.pacing.compacted(after=run.total, target=self.target_tokens, batch=self.threshold_tokens - self.target_tokens)
        self.compression_count += 1
        self.last_resort_cuts += run.cuts
        self.notes = run.notes
        self.last_report = CompactionReport(self.name, len(messages), len(out), run.tokens_before, run.total, replaced=sorted(run.new), notes=list(run.notes), elapsed_ms=(time.perf_counter() - t0) * 1000.0)
        return out


class _Pass:
    """One compaction of one list: the running token total and the replacements."""

    def __init__(self, engine: RulesEngine, messages: Sequence[Message]) -> None:
        self.e = engine
        self.s = engine.settings
        self.src = messages
        self.window = engine.context_length
        self.threshold = engine.threshold_tokens
        self.tokens = [engine.tokens_of(m) for m in messages]
        self.tokens_before = self.total = sum(self.tokens)
        self.new: dict[int, Message | None] = {}
        self.notes: list[str] = []
        self.cuts = 0
        self.refs = Refs(engine.originals, messages)
        self.fact_budget = self.s.fact_tokens if engine.originals is not None else None
        # facts shown by what is never removed: records (their blocks) and user messages
        self.known: set[str] = set()
        for m in messages:
            self.known.update(engine.listed(m))
            if m.get("role") == "user":
                self.known.update(_facts_of({"role": "tool", "content": content_text(m.get("content"))}).all())

    def _set(self, i: int, message: Message | None) -> None:
        after = 0 if message is None else self.e.tokens_of(message)
        self.total += after - self.tokens[i]
        self.tokens[i] = after
        self.new[i] = message

    def _current(self, i: int) -> Message | None:
        return self.new[i] if i in self.new else self.src[i]

    def _block(self, facts: Facts, *shown: str, budget: int | None = None) -> tuple[list[str], int]:
        """The facts block of what ``shown`` and known facts do not cover, within the budget;
        the listed facts become known. Returns the lines and how many were left out."""
        missing = unseen(facts, *shown, known=self.known)
        chosen, dropped = fit_facts(missing, self.fact_budget if budget is None else budget)
        self.known.update(chosen.all())
        return render_facts(chosen), dropped

    def execute(self) -> list[Message]:
        spans = group_spans(self.src)
        tail = tail_by_turns(self.src, self.s.protect_last_n_turns, spans)
        cutoff = self._system_cutoff()
        settled = settled_end(self.src)
        for start, end in spans:
            if start >= tail:
                break
            if start < settled:
                continue
            first = self.src[start]
            role = first.get("role")
            if role == "assistant" and (end - start > 1 or tool_calls(first)):
                self._group(start, end)
            elif role == "user" or is_marked(first):
                continue
            elif role in ("system", "developer"):
                if start > cutoff:
                    self._system(start)
            elif role == "assistant" and self.s.collapse_consecutive_assistant:
                self._superseded_run(start, tail)
        if self.total > self.window or (self.total > self.threshold and self.e.pacing.rearm_at is not None):
            # no nibbling: when the last compaction already could not get under its target and
            # this one cannot get under the trigger, the giant outputs of the protected tail are
            # cut now instead of compacting a little on every turn
            self._hold_window(tail, min(settled, tail))
        return [r for i in range(len(self.src)) if (r := self._current(i)) is not None]

    def _system_cutoff(self) -> int:
        k = self.s.drop_system_after_turn
        if k <= 0:
            return len(self.src)
        users = [i for i, m in enumerate(self.src) if m.get("role") == "user"]
        return users[k - 1] if len(users) >= k else len(self.src)

    # -- rule 3 ---------------------------------------------------------------------------------
    def _system(self, i: int) -> None:
        m = self.src[i]
        text = content_text(m.get("content"))
        if not text.strip():
            return
        first = text.strip().splitlines()[0]
        first = first if len(first) <= 80 else first[:80] + "…"
        marker = header("system", f"{json.dumps(first, ensure_ascii=False)}, {len(text)} chars dropped")
        if len(marker) < len(text):
            self._set(i, {**m, "content": marker})

    # -- rule 4 ---------------------------------------------------------------------------------
    def _superseded_run(self, start: int, tail: int) -> None:
        src = self.src

        def plain(j: int) -> bool:
            return src[j].get("role") == "assistant" and not tool_calls(src[j])

        if start + 1 >= len(src) or not plain(start + 1) or is_marked(src[start]):
            return
        last = start + 1
        while last + 1 < len(src) and plain(last + 1):
            last += 1
        superseded = [j for j in range(start, last) if j < tail and not is_marked(src[j]) and j not in self.new]
        if not superseded:
            return
        facts = Facts()
        for j in superseded:
            facts = facts.merge(_facts_of(src[j]))
        lines, _ = self._block(facts, message_text(src[last]), budget=None if self.fact_budget is None else self.fact_budget)
        for j in superseded:
            self._set(j, None)
        if lines:
            head = header("assistant", f"{len(superseded)} earlier message(s) collapsed")
            self._set(superseded[0], {"role": "assistant", "content": "\n".join([head, *lines])})

    # -- rules 1 and 2 --------------------------------------------------------------------------
    def _group(self, start: int, end: int) -> None:
        a = self.src[start]
        new_a = self._elide_args(a)
        if new_a is not None:
            self._set(start, new_a)
        a_now = new_a or a
        calls = tool_calls(a_now)
        by_id = {tool_call_id(c): c for c in reversed(calls)}
        for pos, i in enumerate(range(start + 1, end)):
            r = self.src[i]
            if is_marked(r):
                continue
            cid = r.get("tool_call_id")
            call = by_id.get(cid) if isinstance(cid, str) else None
            if call is None and pos < len(calls):
                call = calls[pos]
            new_r = self._result(i, call, message_text(a_now))
            if new_r is not None:
                self._set(i, new_r)

    def _elide_args(self, a: Message) -> Message | None:
        """Arguments longer than ``max_tool_output_chars`` elided (:func:`~.kit.calls.elide_args`)."""
        return elide_args(a, self.s.max_tool_output_chars) if self.s.keep_tool_summary else None

    def _result(self, i: int, call: Mapping[str, Any] | None, call_text: str) -> Message | None:
        """Rule 1's record or rule 2's cut of tool result ``i`` (None: keep it)."""
        r = self.src[i]
        text = content_text(r.get("content"))
        if not text:
            return None
        facts = _facts_of(r)
        failed = any(_FAILURE_RE.search(e) for e in facts.errors)
        if not failed and self.s.keep_tool_summary:
            return self._record(i, call, call_text, facts)
        if len(text) > self.s.max_tool_output_chars:
            cut = self._cut(i, call, None)
            if cut is not None:  # later records need not repeat what this one lists
                self.known.update(split_facts_block(content_text(cut.get("content")))[1].all())
            return cut
        return None

    def _record(self, i: int, call: Mapping[str, Any] | None, call_text: str, facts: Facts) -> Message | None:
        r = self.src[i]
        text = content_text(r.get("content"))
        ref = self.refs.node([i], kind="tool", text=None)
        head = header("tool", f"{call_preview(call)} → ok, {len(text)} chars", ref=ref)
        own = unseen(facts, head, call_text)
        if len(head) + sum(len(f) + 1 for f in own.all()) + 8 >= len(text):
            # not shorter on its own: keep the original (decided without the facts known from
            # elsewhere, which grow between compactions, so the verdict never flips later)
            return None
        lines, dropped = self._block(own, budget=self.fact_budget)
        if dropped:
            more = "via ctx_grep" if self.e.originals is None or self.e.originals.reach.tools else self.e.originals.pointer()
            head = head[:-1] + f"; {dropped} more facts {more}]"
        content = "\n".join([head, *lines])
        self.refs.text(ref, content)
        return {**r, "content": content}

    def _cut(self, i: int, call: Mapping[str, Any] | None, budget: int | None) -> Message | None:
        """Tool result ``i`` cut to its head and tail lines (the kit's cut) plus the facts of
        the removed middle: every fact without a store or ``budget``, else within it."""
        r = self.src[i]
        text = content_text(r.get("content"))
        if budget is None:
            all_lines = text.split("\n")
            ends = all_lines[: self.s.head_lines] + (all_lines[-self.s.tail_lines :] if self.s.tail_lines and len(all_lines) > self.s.head_lines + self.s.tail_lines else [])
            facts = unseen(_facts_of(r), known=self.known)
            room = self.fact_budget if self.fact_budget is not None else sum(estimate(f) + 1 for f in facts.all())
            budget = sum(estimate(x[:LINE_CHARS]) + 2 for x in ends) + 60 + room
            if budget >= estimate(text):
                return None  # its facts are the output: a record would not be shorter
        ref = self.refs.node([i], kind="cut", text=None)
        recall = self.e.originals is None or self.e.originals.reach.tools  # no recall tool named where none reaches the model
        cut = cut_output(text, budget_tokens=budget, ref=ref, head_lines=self.s.head_lines, tail_lines=self.s.tail_lines, known=self.known, recall=recall)
        if cut == text or len(cut) >= len(text):
            return None
        first, _, rest = cut.partition("\n")
        preview = call_preview(call if call is not None else call_of(self.src, i))
        cut = f"{first[:-1]}; {preview}]" + (f"\n{rest}" if rest else "")
        self.refs.text(ref, cut)
        return {**r, "content": cut}

    # -- never over the window ----------------------------------------------------------------
    def _hold_window(self, tail: int, unsettled: int) -> None:
        """Largest first: cut the protected outputs, then shrink what this compaction may still
        change (its records, outputs kept whole because a record would not be shorter), each to
        what the excess leaves it. A fixed number of passes: linear in the session."""
        pool = sorted(
            (i for i in range(unsettled, len(self.src)) if self.src[i].get("role") == "tool" and not is_marked(self.src[i]) and self._current(i) is not None),
            key=lambda i: (-self.tokens[i], i),
        )
        lost = 0
        # facts must go anyway: keep them only up to halfway from the trigger to the window, so
        # the next turns have room (a settled record is never shrunk again)
        ceiling = (self.threshold + self.window) // 2
        for phase in ("cut", "shrink", "shrink"):
            goal = self.threshold if phase == "cut" else ceiling
            if phase != "cut" and self.total <= self.window:
                break
            for i in pool:
                if self.total <= (goal if phase == "cut" else self.window):
                    break
                if phase == "cut" and (i in self.new or i < tail or (self.total <= self.window and self.tokens[i] < self.window // 16)):
                    continue
                excess = self.total - goal
                overhead = self.e.tokens_of({**self.src[i], "content": ""})
                budget = None if phase == "cut" else max(60, self.tokens[i] - excess - overhead - 32)
                before = self._current(i)
                built = self._cut(i, None, budget)
                if built is None or self.e.tokens_of(built) >= self.tokens[i]:
                    continue
                if budget is not None:
                    gone = unseen(_facts_of(self.src[i]), content_text(built.get("content")), known=self.known).all()
                    after = self.total - self.tokens[i] + self.e.tokens_of(built)
                    if gone and after + estimate("\n".join(gone)) <= self.window:
                        # what it leaves out would fit the window: keep as much as fits it
                        for margin in (0, 32):
                            wider = self._cut(i, None, max(60, self.tokens[i] - (self.total - self.window) - overhead - margin))
                            if wider is not None and self.total - self.tokens[i] + self.e.tokens_of(wider) <= self.window:
                                built = wider
                                break
                self._set(i, built)
                if before is self.src[i]:
                    self.cuts += 1
                    self.notes.append(f"last resort: cut protected tool output at message {i} to fit the window")
                if phase == "shrink":
                    left = len(unseen(_facts_of(self.src[i]), content_text(built.get("content")), known=self.known))
                    lost += left
        if lost:
            where = self.e.originals.pointer() if self.e.originals is not None else "left out: they alone overflow the window"
            self.notes.append(f"{lost} facts of the largest outputs did not fit the window: {where}")
        if self.total > self.window:
            self.notes.append(f"still over the window ({self.total} > {self.window} estimated tokens): what remains is user messages, the system prompt and protected turns")

