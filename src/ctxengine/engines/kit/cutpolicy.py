"""The cache-aware cut policy: which tool outputs to cut, and when (DESIGN §3.8, §3.11).

Tool outputs are cut (head + tail lines and their facts, :func:`ctxengine.engines.kit.cut_output`)
in batches, soon after use: an output stays whole while it is one of the last ``keep_recent``
tool exchanges, and the older whole outputs are cut together once ``batch`` of them (or
``batch_tokens``) wait *and* the cut pays for the cache it invalidates
(:func:`ctxengine.cost.compaction_break_even`). A giant output (over ``giant_ratio`` of the
window) is cut wherever it sits, before it is ever sent. Cut text is never cut again, so the
settled prefix stays byte-stable.

:class:`CachedCuts` is a mixin for an engine: it reads the engine's settings attributes
(declared below) and its per-message token counts (``tokens``, the session's), and keeps the
per-call scan and the originals it removed.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

from ctxengine.cost import compaction_break_even
from ctxengine.engine import CompactionReport
from ctxengine.engines.kit.cut import cut_output
from ctxengine.engines.kit.records import MARK
from ctxengine.engines.kit.tail import tail_by_exchanges
from ctxengine.facts import FactMemo, Facts, extract_facts
from ctxengine.messages import Message, content_text, message_text, tool_call_args, tool_calls
from ctxengine.summarize.assembly import own_summary
from ctxengine.summarize.extractive import PRUNED_MARKER
from ctxengine.tokens import MessageTokens, TokenCounter

__all__ = [
    "BATCH",
    "BATCH_TOKENS",
    "CUTS_SUFFICED",
    "CUT_MIN_TOKENS",
    "CUT_TOKENS",
    "GIANT_RATIO",
    "KEEP_RECENT",
    "MIN_CUT_TOKENS",
    "CachedCuts",
    "CutScan",
    "is_settled_text",
]

KEEP_RECENT = 3
"""Tool exchanges at the end kept whole (the agent is still using them): an output is whole for
at least the two calls after the one that produced it."""
BATCH = 3
BATCH_TOKENS = 6_000
"""Older whole outputs are cut together once this many wait, or once they hold this many tokens
(measured on the long sessions: batches of 3 cost the same as 4-6 and keep each compaction
short)."""
CUT_TOKENS = 256
"""What a cut output keeps: marker, first and last lines, facts of the removed middle."""
CUT_MIN_TOKENS = 400
"""Outputs shorter than this are never cut: the record would save little."""
GIANT_RATIO = 0.08
"""An output over this fraction of the window is cut wherever it sits, before it is sent."""
GIANT_TOKENS = 8_000
GIANT_KEEP_RATIO = 0.02
"""What a giant output keeps (of the window, at least CUT_TOKENS, at most 4,000 tokens)."""
MIN_CUT_TOKENS = 64
"""The least a tool output is cut to when the window requires it (the marker and a line)."""
MIN_HORIZON = 8
"""A batch cut must pay for its cache rewrite within max(MIN_HORIZON, calls so far) calls."""
CUTS_SUFFICED = "cutting the older outputs was enough: no summary needed"


def is_settled_text(text: str) -> bool:
    """True for an output ctxengine already wrote or cut (final: never cut again). A prefix
    test: this runs on every output each call, so it never scans the text."""
    return text.startswith(MARK) or text.startswith(PRUNED_MARKER)


@dataclass(slots=True)
class CutScan:
    """The per-call view of a message list (see :meth:`CachedCuts._scan`)."""

    n: int = 0
    first: Message | None = None
    last: Message | None = None
    toks: list[int] = field(default_factory=list)
    cum: list[int] = field(default_factory=lambda: [0])
    total: int = 0
    groups: list[int] = field(default_factory=list)
    """Indices of assistant messages whose tool results follow (tool exchanges)."""
    cands: list[int] = field(default_factory=list)
    """Tool outputs large enough to cut and not cut yet (in increasing order)."""
    cand_max: int = -1
    """The largest of their token counts (-1: none), so finding a giant is no pass over them."""
    seen: list[Message] | None = None
    """The list scanned last (a reference, for :meth:`CachedCuts._carry_scan`)."""


def _push(st: CutScan, msgs: list[Message], i: int, tokens: int, cuttable: bool) -> None:
    """Add ``msgs[i]`` (``tokens`` of it; ``cuttable``: a tool output to cut) to the scan."""
    st.toks.append(tokens)
    st.total += tokens
    st.cum.append(st.total)
    if msgs[i].get("role") == "tool":
        prev = msgs[i - 1] if i > 0 else None
        if prev is not None and prev.get("role") == "assistant" and prev.get("tool_calls"):
            st.groups.append(i - 1)
        if cuttable:
            st.cands.append(i)
            st.cand_max = max(st.cand_max, tokens)


class CachedCuts:
    """Mixin: the cache-aware cut policy over the engine's settings (see the module docstring)."""

    context_length: int
    counter: TokenCounter
    tokens: MessageTokens
    """Each message's count (the session's, :attr:`ctxengine.engine.Services.tokens`, else the
    engine's own over ``counter``): the engine sets it with its counter."""
    keep_recent: int
    batch: int
    batch_tokens: int
    cut_tokens: int
    cut_min_tokens: int
    giant_ratio: float
    cost_aware: bool
    _calls: int
    _stable_ratio: float
    _originals: list[str]
    _fact_memo: dict[int, tuple[Message, Facts]]
    _text_facts: FactMemo
    _scan_state: CutScan | None

    def _init_cuts(
        self,
        *,
        keep_recent: int = KEEP_RECENT,
        batch: int = BATCH,
        batch_tokens: int = BATCH_TOKENS,
        cut_tokens: int = CUT_TOKENS,
        cut_min_tokens: int = CUT_MIN_TOKENS,
        giant_ratio: float = GIANT_RATIO,
        cost_aware: bool = True,
    ) -> None:
        """Set the policy's settings (clamped to sane values) and its fresh state."""
        self.keep_recent = max(0, int(keep_recent))
        self.batch = max(1, int(batch))
        self.batch_tokens = max(0, int(batch_tokens))
        self.cut_tokens = max(64, int(cut_tokens))
        self.cut_min_tokens = max(self.cut_tokens + 1, int(cut_min_tokens))
        self.giant_ratio = float(giant_ratio)
        self.cost_aware = bool(cost_aware)
        self._fact_memo = {}
        self._text_facts = FactMemo()
        self._reset_cuts()

    def _reset_cuts(self) -> None:
        """A new session: what was removed, the scan, the calls and what the cache reads."""
        self._originals = []  # what left the context (cut outputs, user messages): retrievable
        self._scan_state = None
        self._calls = 0
        self._stable_ratio = 1.0

    def _tokens(self, m: Message) -> int:
        return self.tokens.message(m)

    def _facts(self, m: Message) -> Facts:
        """The facts of one message, memoised per message object (a message is extracted once
        however many compactions see it)."""
        hit = self._fact_memo.get(id(m))
        if hit is not None and hit[0] is m:
            return hit[1]
        f = extract_facts([m], memo=self._text_facts)
        if len(self._fact_memo) > 50_000:
            self._fact_memo.clear()
        self._fact_memo[id(m)] = (m, f)
        return f

    @property
    def giant_tokens(self) -> int:
        """Outputs larger than this are cut wherever they sit (``giant_ratio`` of the window,
        and at least GIANT_TOKENS or half the window, whichever is less)."""
        ratio = int(self.context_length * self.giant_ratio)
        # an ordinary long output (a few thousand tokens) is not giant in a small window: it is
        # kept whole for its turns like any other; giant means over GIANT_TOKENS as well, unless
        # that is more than half the window (the engine's window is the room its messages have:
        # a client's tool definitions took the rest, and the output just read must reach the model)
        return max(self.cut_min_tokens, ratio, min(GIANT_TOKENS, self.context_length // 2))

    @property
    def giant_keep_tokens(self) -> int:
        return max(self.cut_tokens, min(4_000, int(self.context_length * GIANT_KEEP_RATIO)))

    def _scan(self, msgs: list[Message]) -> CutScan:
        """What the per-call check needs, kept incrementally: a list that extends the one seen
        last (same message objects) costs only its new messages, so the check before each call
        stays flat however long the session grows; any other list is scanned anew."""
        st = self._scan_state
        n = st.n if st is not None else 0
        if st is None or n == 0 or len(msgs) < n or msgs[n - 1] is not st.last or msgs[0] is not st.first:
            st = CutScan()
            n = 0
        for i in range(n, len(msgs)):
            m = msgs[i]
            t = self._tokens(m)
            _push(st, msgs, i, t, m.get("role") == "tool" and self._cuttable(m, t))
        if msgs:
            st.n, st.first, st.last = len(msgs), msgs[0], msgs[-1]
        st.seen = msgs
        self._scan_state = st
        return st

    def _carry_scan(self, out: list[Message]) -> None:
        """After a compaction to ``out``: the next check rescans only what changed. Each message
        of ``out`` equal to the one at its index in the list scanned last (the engine got a copy
        of it: a cut leaves the other messages in place, a summary keeps the head) takes its
        tokens and its cut candidacy from that scan; the others are counted as a rescan would.
        The work moves into the compaction, which already walked these messages; a list the
        scan did not see (no scan yet, another list) is simply scanned anew at the next call."""
        old, self._scan_state = self._scan_state, None
        seen = old.seen if old is not None else None
        if old is None or seen is None or old.n != len(seen) or not out:
            return
        cands = set(old.cands)
        st = CutScan()
        for i, m in enumerate(out):
            if i < old.n and seen[i] == m:
                t = old.toks[i]
                cand = i in cands
            else:
                t = self._tokens(m)
                cand = m.get("role") == "tool" and self._cuttable(m, t)
            _push(st, out, i, t, cand)
        st.n, st.first, st.last, st.seen = len(out), out[0], out[-1], out
        self._scan_state = st

    def _giant_waits(self, scan: CutScan) -> bool:
        """True when a giant output waits to be cut (never sent yet: cutting it costs nothing)."""
        # any(scan.toks[i] > limit for i in scan.cands), without the pass over every
        # candidate each call (a long session holds hundreds)
        return scan.cand_max > self.giant_tokens

    def _scan_batch_due(self, messages: list[Message], scan: CutScan) -> bool:
        """True when a batch of older whole outputs is due and pays for itself."""
        keep = self.keep_recent
        tail = len(messages) if keep <= 0 or not scan.groups else scan.groups[-keep] if len(scan.groups) >= keep else scan.groups[0]
        waiting = scan.cands[: bisect.bisect_left(scan.cands, tail)]  # the candidates before ``tail`` (in order)
        return bool(self._batch_pays(waiting, scan.toks, scan.total, lambda k: scan.cum[k]))

    def _cuttable(self, m: Message, tokens: int) -> bool:
        if m.get("role") != "tool" or tokens < self.cut_min_tokens:
            return False
        content = m.get("content")
        if not isinstance(content, str | list):
            return False
        text = content_text(content)
        return not is_settled_text(text)

    def _giants(self, msgs: list[Message], toks: list[int]) -> list[int]:
        limit = self.giant_tokens
        return [i for i, m in enumerate(msgs) if toks[i] > limit and self._cuttable(m, toks[i])]

    def _tail_start(self, msgs: list[Message]) -> int:
        """Where the last ``keep_recent`` tool exchanges begin (kept whole)."""
        return tail_by_exchanges(msgs, self.keep_recent)

    def _waiting(self, msgs: list[Message], toks: list[int]) -> list[int]:
        end = self._tail_start(msgs)
        return [i for i in range(end) if self._cuttable(msgs[i], toks[i])]

    def _due_batch(self, msgs: list[Message], toks: list[int]) -> list[int]:
        """The older whole outputs to cut now, or ``[]``: enough of them wait *and* cutting
        them pays for the cache it invalidates within as many calls as the session has made
        (at least MIN_HORIZON)."""
        waiting = self._waiting(msgs, toks)
        if not waiting:
            return []
        total = sum(toks)
        return self._batch_pays(waiting, toks, total, lambda k: sum(toks[:k]))

    def _batch_pays(self, waiting: list[int], toks: list[int], total: int, prefix: Callable[[int], int]) -> list[int]:
        """``waiting`` when it is a batch worth cutting now, else ``[]`` (``prefix(k)``: tokens
        of the first ``k`` messages)."""
        if not waiting:
            return []
        sizes = list(map(toks.__getitem__, waiting))  # (a loop in C: checked every call)
        # when the provider reads little of a kept prefix from cache (a rolling placement such
        # as system_and_3 re-reads only the system prompt after any edit), every cut rewrites
        # nearly everything: batches grow so that rewrites are rarer (up to 8x; measured on the
        # long sessions: 0.65x -> 0.52x of no compaction under system_and_3)
        scale = 1.0 / max(0.125, min(1.0, self._stable_ratio))
        if len(waiting) < self.batch * scale and sum(sizes) < self.batch_tokens * scale:
            return []
        if not self.cost_aware:
            return waiting
        saved = sum(max(0, t - self.cut_tokens) for t in sizes)
        stable = int(prefix(waiting[0]) * self._stable_ratio)
        horizon = max(MIN_HORIZON, self._calls)
        return waiting if compaction_break_even(total, total - saved, stable) <= horizon else []

    def _cut(self, m: Message, budget: int) -> Message:
        text = content_text(m.get("content"))
        cut = cut_output(text, budget_tokens=budget, counter=self.counter, memo=self._text_facts)
        if cut == text:
            return m
        self._keep_original(text)
        return {**m, "content": cut}

    def _keep_original(self, text: str) -> None:
        self._originals.append(text)

    def _remember(self, span: list[Message]) -> None:
        """Keep the text of messages a summary replaces (and each tool call's arguments as the
        model wrote them) so the engine's ``retrievable`` answers for them as recall over the
        store does."""
        for m in span:
            if own_summary(m) or is_settled_text(content_text(m.get("content"))):
                continue  # already a record: its originals were kept when it was written
            text = message_text(m)
            if text:
                self._keep_original(text)
            for c in tool_calls(m):
                args = tool_call_args(c)
                values = [args] if isinstance(args, str) else [v for v in args.values() if isinstance(v, str)]
                for v in values:
                    if v:
                        self._keep_original(v)

    def _cut_stage(
        self,
        msgs: list[Message],
        toks: list[int],
        *,
        batch: bool,
        report: CompactionReport,
        everything: bool = False,
        need: int = 0,
    ) -> tuple[list[Message], list[int]]:
        """Cut giant outputs anywhere and, with ``batch``, the batch of older whole outputs when
        it is due (``everything``: every older whole output). Returns the new list and the
        indices cut (``toks`` is updated in place).

        ``need``: the cut is wanted only if it can free at least this many tokens; when the
        outputs to cut hold fewer, nothing is cut (a cut frees at most an output's own tokens,
        so the answer is known without cutting)."""
        giants = self._giants(msgs, toks)
        waiting = (self._waiting(msgs, toks) if everything else self._due_batch(msgs, toks)) if batch else []
        targets = sorted(set(giants) | set(waiting))
        if not targets or sum(toks[i] for i in targets) < need:
            return msgs, []
        out = list(msgs)
        done: list[int] = []
        big = set(giants)
        for i in targets:
            budget = self.giant_keep_tokens if i in big and i >= self._tail_start(msgs) else self.cut_tokens
            new = self._cut(msgs[i], budget)
            if new is msgs[i]:
                continue
            out[i] = new
            toks[i] = self._tokens(new)
            done.append(i)
        if done:
            report.notes.append(f"cut {len(done)} tool output(s) to head and tail lines with their facts (originals retrievable)")
        return out, done

    def _cuts_suffice(
        self, msgs: list[Message], toks: list[int], cut: list[int], *, before: int, total: int, target: int, report: CompactionReport
    ) -> list[Message] | None:
        """The cut-first trial of a summarizing engine at its threshold: every older whole
        output cut too (``cut``: the indices already cut in ``msgs``). When that brings the
        context of ``before`` tokens (``total`` of them counted in ``toks`` before any cut) to
        ``target`` or under, the new list, with ``report.replaced`` and a note saying so; else
        ``None``, and the trial leaves no note behind (``toks`` is left as it was)."""
        trial_toks = list(toks)
        trial_notes = len(report.notes)
        need = before - (total - sum(toks)) - target
        trial, more = self._cut_stage(msgs, trial_toks, batch=True, report=report, everything=True, need=need)
        both = sorted(set(cut) | set(more))
        if both and before - (total - sum(trial_toks)) <= target:
            report.replaced = both
            report.notes.append(CUTS_SUFFICED)
            return trial
        # not enough: the summary folds those outputs anyway, and cutting them first would
        # only rewrite the head; the trial is dropped (its originals stay retrievable)
        del report.notes[trial_notes:]
        return None

    def _clip_to_limit(self, msgs: list[Message], report: CompactionReport, limit: int, start: int = 0) -> list[Message]:
        """Last resort: cut the largest tool outputs from ``start`` on (head + tail lines + their
        facts) until the list fits ``limit`` tokens. Never touches user, system or assistant
        messages, nor anything before ``start`` (the stable prefix)."""
        toks = [self._tokens(m) for m in msgs]
        total = sum(toks)
        if total <= limit:
            return msgs
        out = list(msgs)
        # Outputs an earlier pass already cut are final: re-cutting them would rewrite text that
        # was sent and cached (prefix stability) for a few tokens each time.
        tools = [
            i
            for i, m in enumerate(msgs)
            if i >= start and m.get("role") == "tool" and not is_settled_text(content_text(m.get("content")))
        ]
        order = sorted(tools, key=lambda i: -toks[i])
        for i in order:
            if total <= limit:
                break
            excess = total - limit
            keep = max(MIN_CUT_TOKENS, toks[i] - excess - 50)
            candidate = self._cut(msgs[i], keep)
            if candidate is msgs[i]:
                continue
            new = self._tokens(candidate)
            if new >= toks[i]:
                continue  # cutting would not shrink it: leave the message byte-identical
            out[i] = candidate
            total += new - toks[i]
            report.notes.append(f"tool output at {i} cut from {toks[i]:,} to {new:,} tokens to fit the window")
        if total > limit:
            report.notes.append(f"still {total:,} tokens after cutting tool outputs (hard limit {limit:,})")
        return out
