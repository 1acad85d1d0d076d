"""The ``cacheaware`` engine: deterministic compaction shaped by prompt-cache economics.

Under explicit cache breakpoints a request costs little for the prefix it shares with the
previous one (read at 0.1×) and a lot for everything after the first changed byte (written
again at 1.25×). Replays of real agent sessions (DESIGN §3.8) show what follows; this engine is
that policy, built on the shared kit (:mod:`ctxengine.engines.kit`):

1. **Keep recent outputs whole.** The last ``keep_recent`` tool exchanges are never touched:
   the agent is still working with them.
2. **Compact older exchanges in batches.** Once ``batch`` older whole outputs wait (or
   ``batch_tokens``), and the rewrite pays for the cache it invalidates, the runs of agent
   turns before the recent ones are folded into digests (``fold_batches``: the actions as
   ``tool: command line`` plus the facts seen) or each output is cut to a record (head and tail
   lines plus the facts of the removed middle). One rewrite per batch, never one per call. The
   exchanges an earlier turn left whole are folded with that turn's digest, into one.
3. **Fold the finished turn** when a new user turn begins, its earlier digests with it, into
   one digest (it rewrites almost nothing but the new user message, which is written anyway,
   and every later call reads one digest per finished turn), and fold old turns down to
   ``fold_target`` when the context passes ``fold_ratio`` of the window. With a store
   (``fold_tasks``), a finished task is folded once a later one has begun: its run and
   digests, what the task before it left whole, and the user messages ``task_users`` names
   (by default those sent again later, e.g. a harness's demonstration that comes with every
   task: thousands of tokens every later call would read twice; ``all``: every one, shown by
   its beginning), into digests; the originals stay one ``ctx_expand`` away. The protected
   tail and the current task's user messages stay whole.
4. **Cut a giant new output before it is ever sent** (over ``giant_ratio`` of the window): it
   was never cached, so cutting it costs nothing, and it could not fit anyway.
5. **Never touch the settled prefix again**, and never thrash (:class:`~.kit.pacing.Pacing`):
   a compaction freeing less than ``min_gain`` of the threshold is not done, and at most one
   prefix rewrite happens per ``rewrite_every`` turns unless the window requires it.
6. **Unless the cache is cold.** When more than the cache TTL has passed since the last
   request (a person paused; ``cache_ttl``, ``auto`` included, as the host marks requests:
   :class:`~ctxengine.caching.CachePace`), the whole prompt is written again anyway: the
   waiting older exchanges are folded then, whatever the batch size and pacing say.

With a session store (``Services.store``) the originals of everything removed are recorded
and each record's marker names a node (``ref=``) that ``ctx_expand`` returns verbatim; records
list only ``fact_tokens`` of facts and the rest stays one ``ctx_grep`` away (DESIGN §3.8: keeping
every path of a huge listing in context is what makes it expensive). Without a store, every
fact is listed in context.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from ctxengine.caching import CachePace
from ctxengine.config import CacheAwareConfig
from ctxengine.cost import compaction_break_even
from ctxengine.engine import CompactionReport, ContextEngine, Services
from ctxengine.engines.kit import call_of, cut_output, header, is_marked
from ctxengine.engines.kit.build import checked, session_counter, with_overrides
from ctxengine.engines.kit.cut import harness_header
from ctxengine.engines.kit.cutpolicy import GIANT_TOKENS
from ctxengine.engines.kit.digest import digest
from ctxengine.engines.kit.originals import Originals, Refs
from ctxengine.engines.kit.pacing import Pacing, first_change, giant_outputs
from ctxengine.engines.kit.tail import Layout
from ctxengine.facts import extract_facts
from ctxengine.messages import Message, content_text, tool_call_name
from ctxengine.models import DEFAULT_CONTEXT_LENGTH
from ctxengine.tokens import MessageTokens, TokenCounter, estimate

__all__ = ["CacheAwareEngine", "CacheAwareSettings"]

USER_CHARS = 300
"""Characters of a folded task's user message a digest shows (the store keeps the original)."""

CacheAwareSettings = CacheAwareConfig
"""The engine's settings model (the ``cacheaware:`` section of the config)."""


class CacheAwareEngine(ContextEngine):
    """See the module docstring. Deterministic: same input, same output."""

    deterministic = True
    calls_model = False
    Settings: ClassVar[type[CacheAwareConfig]] = CacheAwareConfig

    def __init__(
        self,
        *,
        context_length: int = DEFAULT_CONTEXT_LENGTH,
        threshold: float | None = None,
        settings: CacheAwareConfig | None = None,
        originals: Originals | None = None,
        counter: TokenCounter | None = None,
        cache_ttl: str = "5m",
        clock: Callable[[], float] = time.monotonic,
        **overrides: Any,
    ) -> None:
        """``cache_ttl`` is the TTL the host marks requests with (``5m``, ``1h`` or ``auto``),
        ``clock`` the time in seconds (a replay's simulated clock): together they say when the
        cache is cold (item 6 of the module docstring). ``counter`` counts tokens
        (``context.token_counter``, default the estimate); a session's
        :class:`~ctxengine.tokens.MessageTokens` (what ``from_config`` passes) is also where
        each message's count is read, else the engine counts into a private one."""
        self.settings = s = with_overrides(CacheAwareConfig, settings, overrides)
        self.cache_ttl = cache_ttl
        self.clock = clock
        self.cache_pace = CachePace()
        # each message's count: the session's (Services.tokens), else the engine's own over
        # ``counter`` (context.token_counter)
        self.tokens = MessageTokens.of(counter)
        self.counter: TokenCounter = self.tokens.counter
        self.threshold_ratio = s.fold_ratio
        super().__init__(context_length=context_length, threshold=threshold)
        self.originals = originals
        self.pacing = Pacing(min_gain=s.min_gain, rewrite_every=s.rewrite_every)
        self._expected_stable: int | None = None
        self._stable_ratio = 1.0
        self._declined: tuple[int, int, int] | None = None  # a finished run compress would not fold

    @classmethod
    def from_config(cls, settings: CacheAwareConfig | None = None, services: Services | None = None) -> CacheAwareEngine:
        """Settings from the ``cacheaware:`` section, originals in ``services.store``."""
        settings, services = checked(CacheAwareConfig, settings, services)
        return cls(
            context_length=services.context_length,
            settings=settings,
            originals=Originals.from_services(services),
            counter=session_counter(services),
            cache_ttl=str(getattr(services.config, "cache_ttl", "5m")),
        )

    @property
    def name(self) -> str:
        return "cacheaware"

    def _tokens(self, m: Mapping[str, Any]) -> int:
        return self.tokens.message(m)

    # -- the contract -----------------------------------------------------------------------
    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        if self.originals is not None:
            self.originals.use_session(session_id)

    def update_from_response(self, usage: Any) -> None:
        u = self._record_usage(usage)
        self.pacing.tick()
        self.cache_pace.observe(self.clock(), self.cache_pace.ttl(self.cache_ttl))
        self.cache_pace.wrote(u.cache_write_tokens, u.prompt_tokens)
        if self._expected_stable is not None and (u.cache_read_tokens or u.cache_write_tokens):
            # the first response after a compaction says how much of the prefix we kept was
            # really read from cache: later batches are weighed with what the provider delivers
            if self._expected_stable > 0:
                self._stable_ratio = min(1.0, u.cache_read_tokens / self._expected_stable)
            self._expected_stable = None

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        tokens = self.last_prompt_tokens if prompt_tokens is None else prompt_tokens
        return self.pacing.armed(tokens, self.threshold_tokens, self.context_length)

    def should_compress_preflight(self, messages: list[Message]) -> bool:
        # every question below reads one layout of ``messages`` (:meth:`_layout`)
        giant, waiting = self._plan(messages)
        if giant:
            return True
        if self.roomy(self._layout(messages).totals[-1]):
            return False
        if waiting and self.cold():
            return True
        if not self.pacing.may_rewrite():
            return False
        if self._batch_due(messages, waiting) and self._may_be_worth(messages):
            return True
        run = self._finished_run(messages)
        return run is not None and self._run_key(messages, run) != self._declined  # not asked again

    def on_session_reset(self) -> None:
        super().on_session_reset()
        self.pacing.reset()
        self.cache_pace = CachePace()
        self._expected_stable = None
        self._stable_ratio = 1.0
        self._declined = None

    @property
    def floor_tokens(self) -> int:
        """The fold floor: below it only what the window requires is done (``fold_floor`` of
        the window, at most ``fold_floor_tokens``)."""
        s = self.settings
        share = int(s.fold_floor * self.context_length)
        return min(share, s.fold_floor_tokens) if s.fold_floor_tokens > 0 else share

    def roomy(self, tokens: int) -> bool:
        """True while a context of ``tokens`` is under the fold floor (:attr:`floor_tokens`):
        no batch, finished turn or task is folded then, even on a cold cache."""
        return tokens < self.floor_tokens

    def cold(self) -> bool:
        """True when the cache has expired since the last request: a rewrite costs nothing more."""
        return self.cache_pace.cold(self.clock())

    def retrievable(self, text: str) -> bool:
        """True when the store-backed recall returns ``text`` verbatim (needs a store)."""
        return self.originals is not None and self.originals.retrievable(text)

    # -- planning ---------------------------------------------------------------------------
    _last_layout: Layout | None = None  # the layout of the last list planned (:meth:`_layout`)

    def _cuttable(self, m: Mapping[str, Any]) -> bool:
        return m.get("role") == "tool" and not is_marked(m) and self._tokens(m) >= self.settings.cut_min_tokens

    def _tail_start(self, messages: Sequence[Message]) -> int:
        return self._layout(messages).tail(self.settings.keep_recent)

    def _plan(self, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
        """(giant outputs in the protected tail, whole outputs waiting before it)."""
        lay = self._layout(messages)
        tail = lay.tail(self.settings.keep_recent)
        # an ordinary file read (a few thousand tokens) is not giant in a small window: the model
        # sees it whole for its turns (as the compressor's cut policy rules: kit.cutpolicy)
        limit = max(self.settings.giant_ratio * self.context_length, min(GIANT_TOKENS, self.context_length // 2))
        cuttable = self._cuttables(lay)
        k = bisect_left(cuttable, tail)
        giant = [i for i in cuttable[k:] if lay.tokens[i] > limit]
        return giant, cuttable[:k]

    def _batch_due(self, messages: Sequence[Message], waiting: list[int]) -> bool:
        """Enough whole outputs wait *and* the rewrite pays for the cache it invalidates within
        as many further calls as the session has made (at least ``min_horizon``)."""
        s = self.settings
        if not waiting:
            return False
        lay = self._layout(messages)
        sizes = [lay.tokens[i] for i in waiting]
        if len(waiting) < s.batch and sum(sizes) < s.batch_tokens:
            return False
        if not s.cost_aware:
            return True
        before = lay.totals[-1]
        saved = sum(max(0, t - s.record_tokens) for t in sizes)
        stable = int(lay.totals[waiting[0]] * self._stable_ratio)
        return compaction_break_even(before, before - saved, stable) <= max(s.min_horizon, self.pacing.turn)

    def _may_be_worth(self, messages: Sequence[Message]) -> bool:
        """Whether a batch could free enough to be done (``compress`` declines one freeing less
        than ``min_gain`` of the threshold): at most everything in the runs before the protected
        tail is freed. In a window far larger than the session no batch ever is, and the
        preflight then does not send every turn to a compaction that changes nothing."""
        lay = self._layout(messages)
        most = sum(lay.total(a, b) for a, b in self._runs(messages))
        return self.pacing.worth(most, 0, self.threshold_tokens)

    def _runs(self, messages: Sequence[Message]) -> list[tuple[int, int]]:
        """Runs of agent turns (assistant messages with their results; never user messages,
        the system prompt or an earlier record) before the protected tail, oldest first."""
        lay = self._layout(messages)
        tail = lay.tail(self.settings.keep_recent)
        runs: list[tuple[int, int]] | None = lay.memo.get(("runs", tail))
        if runs is None:
            runs = lay.memo[("runs", tail)] = _runs_before(lay, tail)
        return list(runs)

    def _batch_runs(self, messages: Sequence[Message]) -> list[tuple[int, int]]:
        """The runs a batch folds (:meth:`_runs`); a run left from an earlier turn (its last
        exchanges, kept whole when the next turn began) starts at the digests before it, so that
        turn's digest and what it left become one digest: the rewrite starts there anyway (the
        user message after it is written again either way) and every later call reads one."""
        last_user = next((k for k in range(len(messages) - 1, -1, -1) if messages[k].get("role") == "user" and not is_marked(messages[k])), -1)
        out: list[tuple[int, int]] = []
        for a, b in self._runs(messages):
            if b <= last_user:
                a = self._digests_before(messages, a)
            out.append((a, b))
        return out

    @staticmethod
    def _digests_before(messages: Sequence[Message], a: int) -> int:
        """Where the digests right before ``messages[a]`` begin (``a`` when there are none)."""
        while a > 0 and is_marked(messages[a - 1]) and messages[a - 1].get("role") in ("assistant", "user"):
            a -= 1
        return a

    def _run_key(self, messages: Sequence[Message], run: tuple[int, int]) -> tuple[int, int, int]:
        """What identifies a finished run between turns: where it is and its size."""
        return run[0], run[1], self._layout(messages).total(*run)

    def _finished_run(self, messages: Sequence[Message]) -> tuple[int, int] | None:
        """The run of the turn that just ended with the digests before it (back to the turn's
        user message), when a new user turn has just begun and that span holds
        ``fold_run_tokens`` or more."""
        s = self.settings
        if s.fold_run_tokens <= 0 or not messages or messages[-1].get("role") != "user":
            return None
        lay = self._layout(messages)
        roles = lay.roles
        u = len(messages)
        while u > 0 and roles[u - 1] == "user":
            u -= 1
        runs = self._runs(messages)
        if not runs:
            return None
        a, b = runs[-1]
        if b < u and b < lay.tail(s.keep_recent) and any(roles[k] != "user" for k in range(b, u)):
            return None
        a = self._digests_before(messages, a)  # the turn's earlier digests: one digest per finished turn
        if lay.total(a, b) < s.fold_run_tokens:
            return None
        return a, b

    def _task_span(self, messages: Sequence[Message]) -> tuple[int, int] | None:
        """The finished task to fold once a later one has begun (:func:`finished_task`); None
        without a store (a user message is never lost) and with ``fold_tasks`` off."""
        s = self.settings
        if not s.fold_tasks or self.originals is None or not messages:
            return None
        return finished_task(messages, self._tail_start(messages), s.fold_run_tokens, self._tokens)

    def _layout(self, messages: Sequence[Message]) -> Layout:
        """The layout of ``messages`` (:class:`~.kit.tail.Layout`): the last one when it is of
        this list (equal messages), else the last one extended (a new turn appends to the
        context the previous one was sent), else built afresh. One layout answers every
        question of a preflight; the next turn reads only what it appended."""
        last = self._last_layout
        if last is not None and last.describes(messages):
            return last
        lay = Layout.of(messages, count=self._tokens, marked=is_marked, previous=last)
        self._last_layout = lay
        return lay

    def _cuttables(self, lay: Layout) -> list[int]:
        """The outputs :meth:`_cuttable` accepts, in order."""
        key = ("cuttable", self.settings.cut_min_tokens)
        found: list[int] | None = lay.memo.get(key)
        if found is None:
            least = self.settings.cut_min_tokens
            roles, tokens, marked = lay.roles, lay.tokens, lay.marked
            found = lay.memo[key] = [i for i in range(len(roles)) if roles[i] == "tool" and not marked[i] and tokens[i] >= least]
        return found

    # -- compaction -------------------------------------------------------------------------
    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        t0 = time.perf_counter()
        s = self.settings
        before = sum(self._tokens(m) for m in messages)
        # the host's count (tool definitions included; a forced compaction is judged at the
        # threshold) and a manual compaction with a topic count as reaching the threshold
        judged = max(before, int(current_tokens or 0))
        over = judged >= self.threshold_tokens or focus_topic is not None
        giant, waiting = self._plan(messages)
        ids = Refs(self.originals, messages)
        plan: dict[int, tuple[int, Message]] = {}  # start -> (end, replacement)
        notes: list[str] = []
        for i in giant:
            plan[i] = (i + 1, self._cut(messages, i, s.giant_tokens, ids))
        may_fold = over or not self.roomy(judged)  # under the fold floor: only the giant outputs
        cold, rewrite = may_fold and bool(waiting) and self.cold(), may_fold and self.pacing.may_rewrite()
        if over or cold or rewrite:
            self._fold_task(messages, plan, ids, notes)
        batch = cold or ((over or rewrite) and self._batch_due(messages, waiting))
        if batch and s.fold_batches:
            self._fold(messages, self._batch_runs(messages), plan, ids, -1)
            notes.append("folded a batch of older exchanges into digests")
        elif batch or over:
            for i in (k for k in waiting if not _planned(plan, k, k + 1)):
                plan[i] = (i + 1, self._cut(messages, i, s.record_tokens, ids))
        if (finished := self._finished_run(messages) if may_fold else None) is not None and not _planned(plan, *finished):
            self._fold(messages, [finished], plan, ids, -1)
            notes.append("folded the finished turn into a digest")
        out = _apply(messages, plan)
        tokens = sum(self._tokens(m) for m in out)
        if tokens >= self.threshold_tokens:
            self._fold(messages, self._runs(messages), plan, ids, int(s.fold_target * self.context_length), tokens)
            out = _apply(messages, plan)
            tokens = sum(self._tokens(m) for m in out)
        if tokens >= self.threshold_tokens:
            # no nibbling: what may be folded cannot get under the threshold, so the giant
            # outputs of the protected tail are cut instead; never the newest ones, which the
            # model has not read yet (a giant one was cut above; the window cap holds the window)
            sizes = [self._tokens(m) for m in messages]
            for i in giant_outputs(messages[: _newest_results(messages)], sizes, start=self._tail_start(messages), excess=tokens - self.threshold_tokens, min_tokens=s.giant_tokens):
                if not any(a <= i < e for a, (e, _) in plan.items()):
                    plan[i] = (i + 1, self._cut(messages, i, s.giant_tokens, ids))
                    notes.append(f"cut the protected output at message {i} to get under the threshold")
            out = _apply(messages, plan)
            tokens = sum(self._tokens(m) for m in out)
        required = over or bool(giant) or cold
        if not plan or (not required and not self.pacing.worth(before, tokens, self.threshold_tokens)):
            # a finished run not worth folding now is not worth it on the next turns either,
            # until the context changes: the preflight does not ask again for it
            self._declined = self._run_key(messages, finished) if finished is not None else None
            return list(messages)
        self._declined = None
        ids.commit({content_text(new.get("content")) for _, new in plan.values()})
        stable = first_change(messages, out)
        self._expected_stable = sum(self._tokens(m) for m in out[:stable])
        self.pacing.compacted(after=tokens, target=int(s.fold_target * self.context_length), batch=max(1, self.threshold_tokens - int(s.fold_target * self.context_length)), rewrote=stable < len(messages))
        self.compression_count += 1
        replaced = sorted(k for a, (e, _) in plan.items() for k in range(a, e))
        self.last_report = CompactionReport(self.name, len(messages), len(out), before, tokens, replaced=replaced, notes=notes, elapsed_ms=(time.perf_counter() - t0) * 1000.0)
        return out

    def _fold_task(self, messages: Sequence[Message], plan: dict[int, tuple[int, Message]], ids: Refs, notes: list[str]) -> None:
        """Fold the finished task (:meth:`_task_span`), if any, into digests in ``plan``."""
        task = self._task_span(messages)
        if task is not None:
            self._fold(messages, task_pieces(messages, task, self.settings.task_users), plan, ids, -1, role="user")
            if any(task[0] <= k < task[1] for k in plan):
                notes.append("folded the finished task into digests")

    def _fact_tokens(self) -> int | None:
        return self.settings.fact_tokens if self.originals is not None else None

    def _cut(self, messages: Sequence[Message], i: int, budget: int, ids: Refs) -> Message:
        m = messages[i]
        text = content_text(m.get("content"))
        if self.originals is None:
            # no store: every fact of the output stays in context
            facts = extract_facts([m])
            budget += sum(estimate(f) + 1 for f in (*facts.paths, *facts.urls, *facts.errors))
        lead = harness_header(text)
        if lead is not None:  # a harness's header (Codex's exec output) on top of the body's lines
            budget += 2 * (estimate(lead) + 1)
        ref = ids.node([i], kind="cut", text=None)
        recall = self.originals is None or self.originals.reach.tools  # no recall tool named where none reaches the model
        cut = cut_output(text, budget_tokens=budget, ref=ref, head_lines=self.settings.head_lines, tail_lines=self.settings.tail_lines, recall=recall)
        call = call_of(messages, i)
        if call is not None and cut.startswith("[ctxengine:cut"):
            first, _, rest = cut.partition("\n")
            cut = f"{first[:-1]}; {tool_call_name(call)} output]" + (f"\n{rest}" if rest else "")
        ids.text(ref, cut)
        return {**{k: v for k, v in m.items() if k != "content"}, "content": cut}

    def _fold(
        self,
        messages: Sequence[Message],
        runs: list[tuple[int, int]],
        plan: dict[int, tuple[int, Message]],
        ids: Refs,
        target: int,
        tokens: int | None = None,
        role: str | None = None,
    ) -> None:
        """Fold ``runs`` (oldest first) into digests until the context is under ``target``
        (every run when ``target`` < 0); replaces what ``plan`` held inside them, never a
        planned span reaching outside a run. ``role``: the digests' role (default: the one
        that alternates with their neighbours)."""
        if tokens is None:
            tokens = sum(self._tokens(m) for m in _apply(messages, plan))
        for a, b in runs:
            if target >= 0 and tokens <= target:
                break
            if any(k < a < e or (a <= k < b < e) for k, (e, _) in plan.items()):
                continue  # it would split a span planned already
            inner = [k for k in plan if a <= k < b]
            current = sum(self._tokens(m) for m in _apply(messages[a:b], {k - a: (e - a, r) for k, (e, r) in plan.items() if a <= k < b}))
            ref = ids.node(list(range(a, b)), kind="digest", text=None)
            hint = ("ctx_grep" if self.originals.reach.tools else "the session store") if self.originals else "the store"
            body = digest(messages[a:b], budget_tokens=self.settings.digest_tokens, fact_tokens=self._fact_tokens(), recall_hint=hint, user_chars=USER_CHARS if self.originals else None, name_tokens=self.settings.name_tokens, context=[*messages[:a], *messages[b:]])
            text = header("digest", f"{b - a} earlier messages folded", ref=ref) + "\n" + body
            prev = messages[a - 1].get("role") if a > 0 else None
            nxt = messages[b].get("role") if b < len(messages) else None
            new: Message = {"role": role or ("assistant" if nxt in ("user", None) or prev in ("user", "system") else "user"), "content": text}
            saved = current - self._tokens(new)
            if saved <= 0:
                continue
            for k in inner:
                del plan[k]
            plan[a] = (b, new)
            ids.text(ref, text)
            tokens -= saved


def task_pieces(messages: Sequence[Message], task: tuple[int, int], task_users: str) -> list[tuple[int, int]]:
    """``task`` split around the user messages it keeps: with ``task_users: repeated`` a user
    message is folded only when its text is sent again later (a harness's demonstration
    that comes with every task); the others stay verbatim where they are."""
    a, b = task
    if task_users == "all":
        return [task]
    later = {content_text(m.get("content")) for m in messages[b:] if m.get("role") == "user"}
    kept = [k for k in range(a, b) if messages[k].get("role") == "user" and not is_marked(messages[k]) and content_text(messages[k].get("content")) not in later]
    pieces: list[tuple[int, int]] = []
    for k in [*kept, b]:
        if k > a:
            pieces.append((a, k))
        a = k + 1
    return pieces


def _planned(plan: Mapping[int, tuple[int, Message]], a: int, b: int) -> bool:
    """Whether a span of ``plan`` overlaps ``messages[a:b]``."""
    return any(k < b and a < e for k, (e, _) in plan.items())


def _apply(messages: Sequence[Message], plan: Mapping[int, tuple[int, Message]]) -> list[Message]:
    out: list[Message] = []
    i = 0
    while i < len(messages):
        if i in plan:
            end, new = plan[i]
            out.append(new)
            i = end
        else:
            out.append(messages[i])
            i += 1
    return out


def _runs_before(lay: Layout, tail: int) -> list[tuple[int, int]]:
    """:meth:`CacheAwareEngine._runs` read off a layout whose protected tail starts at ``tail``."""
    roles, marked = lay.roles, lay.marked
    runs: list[tuple[int, int]] = []
    start = end = -1
    for a, b in lay.spans:
        if a >= tail:
            break
        if roles[a] == "assistant" and not marked[a]:
            start = a if start < 0 else start
            end = b
        elif start >= 0:
            runs.append((start, end))
            start = -1
    if start >= 0:
        runs.append((start, end))
    return runs


def _newest_results(messages: Sequence[Message]) -> int:
    """Where the trailing tool results begin (the outputs of the last call, which the model has
    not read yet); ``len(messages)`` when the conversation does not end with tool results."""
    i = len(messages)
    while i > 0 and messages[i - 1].get("role") == "tool":
        i -= 1
    return i


def finished_task(messages: Sequence[Message], tail: int, least: int, count: Callable[[Mapping[str, Any]], int]) -> tuple[int, int] | None:
    """The finished task to fold once a later one has begun: its user messages (the request,
    whose originals the store keeps), its run and digests, and the last exchanges the task
    before it left whole; never the protected tail (from ``tail`` on). None when no user
    message with a run after it precedes the current one, or when the span holds less than
    ``least`` tokens (``count``)."""

    def user(k: int) -> bool:
        return messages[k].get("role") == "user" and not is_marked(messages[k])

    u = next((k for k in range(len(messages) - 1, -1, -1) if user(k)), -1)
    while u > 0 and user(u - 1):
        u -= 1  # where the current task's user messages begin
    end = min(u, tail)
    p = next((k for k in range(end - 1, -1, -1) if user(k)), -1)
    if p < 0 or not any(messages[k].get("role") == "assistant" and not is_marked(messages[k]) for k in range(p + 1, end)):
        return None
    while p > 0 and user(p - 1):
        p -= 1
    a = p
    while a > 0 and not is_marked(messages[a - 1]) and messages[a - 1].get("role") in ("assistant", "tool"):
        a -= 1  # what the task before left whole
    if sum(count(messages[k]) for k in range(a, end)) < least:
        return None
    return a, end
