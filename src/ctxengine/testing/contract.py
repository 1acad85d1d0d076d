"""The engine contract kit: property-test any :class:`ContextEngine` against DESIGN §3.3.

One call does it::

    from ctxengine.testing import check_engine_contract

    def test_my_engine_keeps_the_contract():
        report = check_engine_contract(lambda: MyEngine(context_length=4_000))
        assert report.turn_compactions > 0

Pass a *factory* (a callable returning a fresh engine) with a small ``context_length`` so
that compaction really fires on the generated conversations; an engine instance works too (it
is reset with ``on_session_reset()`` between examples). The kit draws conversations from
:func:`ctxengine.testing.strategies.conversations` (sized relative to the engine's threshold)
and, for each one:

* calls ``compress`` on the whole conversation (a forced compaction, as a manual ``/compress``
  does), and
* replays it as an agent loop: before every assistant message the working context goes
  through the per-turn path (``should_compress(tokens)`` → ``compress`` when it says so), the
  engine is told the usage of the request (``update_from_response``), and the next messages
  are appended to what was sent.

It checks, on every ``compress`` call (``W`` the input, ``O`` the output):

1. **Valid in, valid out** — ``validate(O)`` reports no error (every call keeps exactly one
   result, no orphan results, legal roles); ``compress`` returns a list and does not raise.
2. **No mutation** — ``W`` serializes to the same bytes before and after; ``O is not W``.
3. **Under the threshold nothing changes** — on the per-turn path, while the request holds at
   most half of ``threshold_tokens`` (margin for engines that count with another tokenizer),
   ``should_compress`` is False, so the request goes out unchanged.
4. **No fabrication** — every message of ``O`` is accounted for. It is either
   *verbatim* (equal to a message of ``W``); or *marked* (:func:`ctxengine.messages.is_summary`:
   its text starts with ``[CONTEXT COMPACTION]`` or ``[ctxengine:``; engines write summaries,
   folded spans and records this way); or a *placeholder result* (a ``tool`` message whose
   ``tool_call_id`` is that of a tool message of ``W``: a stub, a cut output, a one-line
   record — any content); or a *reduced call* (an assistant message whose tool calls, by id
   and function name, all belong to one assistant message of ``W``); or a *reduced message*
   (role of a message of ``W``). For reduced calls and reduced messages every non-empty line
   of the text must occur in the text of ``W`` (cut or merged text), except short annotation
   lines in square brackets (``[...truncated 40 lines...]``, at most 500 characters).
5. **Anchors survive** — a leading system prompt stays the first message and keeps its text
   (a note may be appended); every user message of ``W`` is in ``O`` verbatim, or its text is
   quoted verbatim (leading and trailing whitespace aside) inside a marked summary (folding
   older user turns is allowed; their images are not checked), or, for an older one, the
   engine's ``retrievable(text)`` returns it verbatim (a long pasted message quoted briefly,
   its original in the store, as invariant 8 allows for facts); the latest user message is
   always in ``O`` verbatim. After the replay, every user message of the conversation passes
   the same test against the last request.
6. **Deterministic engines are deterministic** (``engine.deterministic`` is True) — two fresh
   engines give byte-identical outputs for the forced compaction and for every request of the
   replay.
7. **Prefix stability** — let compaction *k* turn ``W_k`` into ``O_k`` and the next one turn
   ``W_j = O_k + appended`` into ``O_j``. The messages compaction *k* wrote (those of ``O_k``
   that are not in ``W_k`` verbatim: cut outputs, records, a note on the system prompt) are
   final: each must still be in ``O_j`` byte for byte (JSON, key order included). The one
   exception is a fold: when the first message of ``O_j`` that differs from ``O_k`` is a marked
   summary (not a tool result), the span from there on was folded into a summary in one batch
   (iterative summaries update themselves this way), and anything after it may change.
   Editing already-compacted messages in place is what is forbidden: they are read from the
   prompt cache, and re-editing them costs a cache write of everything after them each time.
   Not checked while the system prompt and user messages alone overflow the window.
8. **Preservation guarantee** (deterministic engines) — the facts of ``W``
   (:func:`ctxengine.facts.extract_facts`: user texts, file paths, URLs, tool names, error
   lines) all occur in the text of ``O``; after the replay, the facts of the whole
   conversation occur in the last request. An engine that keeps originals in a store may
   define ``retrievable(fact: str) -> bool``: a fact missing from the text counts as kept
   when it returns True ("or retrievable verbatim from the store"). Exception: when ``O`` plus the missing facts
   would not fit in ``context_length`` (a giant output, or user messages that alone fill the
   window), the facts may live in a store instead (DESIGN §3.8); the report counts them as
   ``facts_beyond_window``.

Then the kernel's guarantees (DESIGN §3.9), which hold for any engine once it runs inside
:class:`~ctxengine.ContextManager` (``kernel=True``, the default):

10. **Window held** — each conversation is replayed through a manager serving the engine
    (:func:`ctxengine.loop.replay`, an in-memory SQLite store): every request, counted with
    the o200k tokenizer, is within the window minus the completion reserve and margin.
11. **Removed facts retrievable** — after that replay every fact of the conversation is in
    the last request or returned verbatim by recall (:meth:`ContextManager.retrievable`).
12. **No thrash** — on a session whose second tool output alone is about three windows, the
    engine (its own trigger, no kernel guard) compacts on at most 3 consecutive turns.

A broken invariant raises :class:`ContractViolation` (an ``AssertionError``) naming the
invariant, the engine and the problem, with the smallest example hypothesis could shrink to.
Invariant 9 of DESIGN §3.3 (failure never loses context) needs a failing summarizer and is
tested per engine, not here.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import hypothesis.internal.conjecture.engine as _hypothesis_engine
import hypothesis.internal.conjecture.providers as _hypothesis_providers
from hypothesis import HealthCheck, Phase, Verbosity, given
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as hypothesis_settings

from ctxengine.config import Config
from ctxengine.engine import ContextEngine
from ctxengine.errors import ContextWindowError, EngineError
from ctxengine.facts import FACT_KINDS, context_text, extract_facts, missing_facts
from ctxengine.loop import recorded_turns, replay, run_compress, should_compact
from ctxengine.manager import MAX_CONSECUTIVE_COMPACTIONS
from ctxengine.messages import (
    Message,
    content_text,
    is_summary,
    message_text,
    tool_call_id,
    tool_call_name,
    tool_calls,
    validate,
)
from ctxengine.testing.strategies import conversations
from ctxengine.tokens import estimate, estimate_messages_tokens

__all__ = ["INVARIANTS", "ContractReport", "ContractViolation", "EngineSource", "check_engine_contract"]

INVARIANTS: dict[int, str] = {
    1: "valid in, valid out",
    2: "no mutation",
    3: "under the threshold nothing changes",
    4: "no fabrication",
    5: "anchors survive",
    6: "deterministic engines are deterministic",
    7: "prefix stability",
    8: "preservation guarantee",
    10: "window held (kernel, exact count)",
    11: "removed facts retrievable (kernel recall)",
    12: "no thrash",
}
"""The invariants of DESIGN §3.3 the kit checks, by number."""

EngineSource = ContextEngine | Callable[[], ContextEngine]
"""An engine instance, or a callable returning a fresh engine (preferred)."""

MAX_ANNOTATION_CHARS = 500
"""Longest bracketed annotation line a reduced message may add (truncation notes, the system
prompt note of the seed's compressor, which is about 240 characters)."""

_SHOW_STRING = 160
_SHOW_MESSAGES = 60


class ContractViolation(AssertionError):
    """An engine broke an invariant. ``invariant`` is its number (see :data:`INVARIANTS`),
    ``example`` the message list (the engine's input) that shows it."""

    def __init__(self, invariant: int, engine: str, detail: str, example: Sequence[Message], where: str = "") -> None:
        self.invariant = invariant
        self.engine = engine
        self.detail = detail
        self.example = list(example)
        self.where = where
        head = f"invariant {invariant} ({INVARIANTS.get(invariant, '?')}) broken by engine {engine!r}: {detail}"
        if where:
            head += f"\n  where: {where}"
        super().__init__(f"{head}\n  minimal example ({len(self.example)} messages):\n{show_messages(self.example)}")


@dataclass(slots=True)
class ContractReport:
    """What :func:`check_engine_contract` exercised (it raises on the first violation).

    ``checks`` counts, per invariant number, how many times it was checked;
    ``turn_compactions`` counts compactions fired by ``should_compress`` on the per-turn path
    (0 means the generated sessions never reached the threshold: use a smaller
    ``context_length``, or invariants 3 and 7 were barely exercised); ``facts_beyond_window``
    counts facts missing from outputs that could not have held them inside the window;
    ``anchors_beyond_window`` counts checks made on inputs whose system prompt and user
    messages alone overflow the window (only the latest user message is then required
    verbatim, and prefix stability is not checked).
    """

    engine: str
    deterministic: bool
    examples: int = 0
    compress_calls: int = 0
    turn_compactions: int = 0
    facts_beyond_window: int = 0
    anchors_beyond_window: int = 0
    checks: dict[int, int] = field(default_factory=lambda: dict.fromkeys(INVARIANTS, 0))
    max_consecutive_compactions: int = 0
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        counts = ", ".join(f"{k}:{v}" for k, v in sorted(self.checks.items()))
        text = (
            f"engine {self.engine!r}: {self.examples} examples, {self.compress_calls} compress calls, "
            f"{self.turn_compactions} per-turn compactions, {self.facts_beyond_window} facts and "
            f"{self.anchors_beyond_window} anchor sets beyond the window; "
            f"checks per invariant {counts}"
        )
        return text + "".join(f"\n  note: {n}" for n in self.notes)


def show_messages(messages: Sequence[Any]) -> str:
    """A readable, bounded rendering of a message list: one JSON line per message, long
    strings cut in the middle, at most 60 messages."""

    def shorten(v: Any) -> Any:
        if isinstance(v, str) and len(v) > _SHOW_STRING:
            half = _SHOW_STRING // 2
            return f"{v[:half]}…[{len(v) - _SHOW_STRING} chars]…{v[-half:]}"
        if isinstance(v, list):
            return [shorten(x) for x in v]
        if isinstance(v, dict):
            return {k: shorten(x) for k, x in v.items()}
        return v

    lines = []
    for i, m in enumerate(messages[:_SHOW_MESSAGES]):
        lines.append(f"    [{i}] {json.dumps(shorten(m), ensure_ascii=False, default=repr)}")
    if len(messages) > _SHOW_MESSAGES:
        lines.append(f"    … {len(messages) - _SHOW_MESSAGES} more")
    return "\n".join(lines) if lines else "    (empty)"


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=repr)


def _is_fold(message: Message) -> bool:
    """A marked summary standing for a span (tool-result records stand for one output only)."""
    return message.get("role") != "tool" and is_summary(message)


def _is_annotation(line: str) -> bool:
    s = line.strip()
    return s.startswith("[") and s.endswith("]") and len(s) <= MAX_ANNOTATION_CHARS


class _Harness:
    """Makes engines, checks each call, and keeps the report."""

    def __init__(self, source: EngineSource) -> None:
        if isinstance(source, ContextEngine):
            self._instance: ContextEngine | None = source
            self._factory: Callable[[], ContextEngine] | None = None
        elif callable(source):
            self._instance = None
            self._factory = source
        else:
            raise TypeError(f"check_engine_contract needs a ContextEngine or a factory returning one, not {type(source).__name__}")
        self._sessions = 0
        probe = self._make()
        self.name = str(probe.name)
        self.deterministic = bool(probe.deterministic)
        self.threshold = int(probe.threshold_tokens)
        self.context_length = int(probe.context_length)
        self.report = ContractReport(self.name, self.deterministic)

    def _make(self) -> ContextEngine:
        if self._factory is not None:
            engine = self._factory()
            if not isinstance(engine, ContextEngine):
                raise TypeError(f"the engine factory returned a {type(engine).__name__}, not a ContextEngine")
            return engine
        assert self._instance is not None
        self._instance.on_session_reset()
        return self._instance

    def fresh(self) -> tuple[ContextEngine, str]:
        engine = self._make()
        self._sessions += 1
        session_id = f"contract-{self._sessions}"
        engine.on_session_start(session_id)
        return engine, session_id

    def fail(self, invariant: int, detail: str, example: Sequence[Message], where: str = "") -> ContractViolation:
        return ContractViolation(invariant, self.name, detail, example, where)

    def count(self, *invariants: int) -> None:
        for n in invariants:
            self.report.checks[n] += 1

    # -- one compress call ----------------------------------------------------------------------
    def compress(self, engine: ContextEngine, messages: list[Message], tokens: int, where: str) -> list[Message]:
        before = _dumps(messages)
        self.report.compress_calls += 1
        try:
            out: Any = run_compress(engine, messages, tokens=tokens, copy_input=False).output
        except EngineError as exc:
            if _dumps(messages) != before:
                raise self.fail(2, f"compress changed its input: {exc}", json.loads(before), where) from exc
            raise self.fail(1, f"compress failed: {exc}", messages, where) from exc
        self.count(2)
        if _dumps(messages) != before:
            old = json.loads(before)
            idx = next((i for i, (a, b) in enumerate(zip(old, messages, strict=False)) if _dumps(a) != _dumps(b)), min(len(old), len(messages)))
            raise self.fail(2, f"compress changed its input (first changed message: {idx})", old, where)
        if out is messages:
            raise self.fail(2, "compress returned the caller's list object instead of a new list", messages, where)
        if not isinstance(out, list):
            raise self.fail(1, f"compress returned a {type(out).__name__}, not a list", messages, where)
        self.check_output(engine, messages, out, where)
        return out

    def check_output(self, engine: ContextEngine, inp: list[Message], out: list[Message], where: str) -> None:
        self.count(1)
        errors = [v for v in validate(out) if v.severity == "error"]
        if errors and not [v for v in validate(inp) if v.severity == "error"]:
            shown = "; ".join(str(v) for v in errors[:5])
            raise self.fail(1, f"valid input gave invalid output: {shown}\n  output:\n{show_messages(out)}", inp, where)
        self.check_fabrication(inp, out, where)
        self.check_anchors(inp, out, where, engine=engine)
        if self.deterministic:
            self.check_facts(engine, inp, out, where)

    def check_fabrication(self, inp: list[Message], out: list[Message], where: str) -> None:
        self.count(4)
        verbatim = {_dumps(m) for m in inp}
        result_ids = {m.get("tool_call_id") for m in inp if m.get("role") == "tool"}
        call_sets = [{(tool_call_id(c), tool_call_name(c)) for c in tool_calls(m)} for m in inp if m.get("role") == "assistant" and tool_calls(m)]
        roles = {m.get("role") for m in inp}
        source_text = "\n".join(message_text(m) for m in inp)
        for j, m in enumerate(out):
            if not isinstance(m, dict):
                raise self.fail(1, f"output message {j} is a {type(m).__name__}", inp, where)
            if _dumps(m) in verbatim or is_summary(m):
                continue
            role = m.get("role")
            calls = tool_calls(m)
            if role == "tool":
                if m.get("tool_call_id") in result_ids:
                    continue
                raise self.fail(4, f"output message {j} is a tool result for call id {m.get('tool_call_id')!r}, which no input tool message answers: {show_messages([m])}", inp, where)
            if role == "assistant" and calls:
                pairs = {(tool_call_id(c), tool_call_name(c)) for c in calls}
                if not any(pairs <= s for s in call_sets):
                    raise self.fail(4, f"output message {j} has tool calls {sorted(pairs)} that no single input assistant message issued", inp, where)
                text = content_text(m.get("content"))
            elif role in roles:
                text = message_text(m)
            else:
                raise self.fail(4, f"output message {j} has role {role!r}, which no input message has, and is not a marked summary", inp, where)
            for line in text.splitlines():
                s = line.strip()
                if s and s not in source_text and not _is_annotation(s):
                    raise self.fail(
                        4,
                        f"output message {j} ({role}) is not an input message and not a marked summary, and its line {s[:200]!r} occurs in no input message",
                        inp,
                        where,
                    )

    def check_anchors(self, inp: list[Message], out: list[Message], where: str, *, final: bool = False, engine: ContextEngine | None = None) -> None:
        self.count(5)
        if not final and inp and inp[0].get("role") in ("system", "developer"):
            first = out[0] if out else {}
            if first.get("role") != inp[0].get("role") or content_text(inp[0].get("content")) not in content_text(first.get("content")):
                raise self.fail(5, "the system prompt is not the first output message with its text intact", inp, where)
        users = [m for m in inp if m.get("role") == "user" and not is_summary(m)]
        if not users:
            return
        kept = Counter(_dumps(m) for m in out if m.get("role") == "user")
        summaries = "\n".join(content_text(m.get("content")) for m in out if is_summary(m))
        needed = Counter(_dumps(m) for m in users)
        if self.anchors_overflow(inp):
            # the anchors alone overflow the window: something of them has to give
            self.report.anchors_beyond_window += 1
            users = users[-1:] if not final else []
        retrievable = getattr(engine, "retrievable", None)
        latest = users[-1] if users else None
        for u in users:
            key = _dumps(u)
            if kept[key] >= needed[key]:
                continue
            text = content_text(u.get("content")).strip()
            if u is not latest and callable(retrievable) and text and retrievable(content_text(u.get("content"))):
                continue  # an older message kept in the store, quoted briefly or not at all
            if not summaries or text not in summaries:
                idx = inp.index(u)
                raise self.fail(5, f"user message {idx} is neither in the output verbatim nor quoted verbatim in a marked summary: {show_messages([u])}", inp, where)
        if not final and users and _dumps(users[-1]) not in kept:
            raise self.fail(5, f"the latest user message (input message {inp.index(users[-1])}) is not in the output verbatim", inp, where)

    def anchors_overflow(self, messages: list[Message]) -> bool:
        """True when the system prompt and the user messages alone exceed the window."""
        anchors = [m for i, m in enumerate(messages) if m.get("role") == "user" or (i == 0 and m.get("role") in ("system", "developer"))]
        return estimate_messages_tokens(anchors) > self.context_length > 0

    def check_facts(self, engine: ContextEngine, inp: list[Message], out: list[Message], where: str) -> None:
        self.count(8)
        facts = extract_facts(inp, include_users=False)
        facts.users = list(dict.fromkeys(t for m in inp if m.get("role") == "user" and not is_summary(m) for t in [content_text(m.get("content"))] if t.strip()))
        missing = missing_facts(facts, context_text(out))
        retrievable = getattr(engine, "retrievable", None)
        if len(missing) and callable(retrievable):
            for kind in FACT_KINDS:
                setattr(missing, kind, [f for f in getattr(missing, kind) if not retrievable(f)])
        if len(missing) and estimate_messages_tokens(out) + estimate("\n".join(missing.all())) > self.context_length > 0:
            # keeping them would not fit the window: the documented trade-off (kept in a store)
            self.report.facts_beyond_window += len(missing)
            return
        if len(missing):
            shown = "; ".join(f"{k}: {[f[:120] for f in getattr(missing, k)[:3]]}" for k in FACT_KINDS if getattr(missing, k))
            raise self.fail(8, f"{len(missing)} fact(s) of the input are missing from the output: {shown}", inp, where)

    def check_prefix(self, prev_in: list[Message], prev_out: list[Message], inp: list[Message], out: list[Message], where: str) -> None:
        if self.anchors_overflow(inp):
            # nothing can fit: squeezing what was already cut is the engine's last resort
            self.report.anchors_beyond_window += 1
            return
        self.count(7)
        before = {_dumps(m) for m in prev_in}
        a = [_dumps(m) for m in prev_out]
        written = [(i, key) for i, (key, m) in enumerate(zip(a, prev_out, strict=True)) if key not in before and not _is_fold(m)]
        now = [_dumps(m) for m in out]
        first = next((i for i, (x, y) in enumerate(zip(now, a, strict=False)) if x != y), min(len(now), len(a)))
        if first < len(out) and _is_fold(out[first]):
            return  # a span from `first` on was folded into a summary: one batch rewrite
        left = Counter(now)
        for i, key in written:
            if left[key] > 0:
                left[key] -= 1
                continue
            raise self.fail(
                7,
                f"this compaction re-edited message {i}, which the previous compaction wrote (records are final; "
                f"only a fold of the span into a marked summary may replace them)\n"
                f"  previous output:\n{show_messages(prev_out)}\n  this output:\n{show_messages(out)}",
                inp,
                where,
            )

    # -- one example ------------------------------------------------------------------------------
    def run(self, conv: list[Message]) -> None:
        self.report.examples += 1
        tokens = estimate_messages_tokens(conv)
        engine, sid = self.fresh()
        out = self.compress(engine, conv, tokens, "forced compress() of the whole conversation")
        engine.on_session_end(sid, out)
        if self.deterministic:
            engine2, sid2 = self.fresh()
            out2 = self.compress(engine2, conv, tokens, "forced compress(), second fresh engine")
            engine2.on_session_end(sid2, out2)
            self.count(6)
            if _dumps(out) != _dumps(out2):
                raise self.fail(6, f"two fresh engines compressed the same input differently\n  first:\n{show_messages(out)}\n  second:\n{show_messages(out2)}", conv, "forced compress()")
        sent = self.replay(conv)
        if self.deterministic:
            again = self.replay(conv)
            self.count(6)
            for k, (x, y) in enumerate(zip(sent, again, strict=True)):
                if _dumps(x) != _dumps(y):
                    raise self.fail(6, f"request {k} of the replay differs between two fresh engines", x, "per-turn replay")

    def replay(self, conv: list[Message]) -> list[list[Message]]:
        engine, sid = self.fresh()
        points = sorted({i for i, m in enumerate(conv) if m.get("role") == "assistant" and i > 0} | {len(conv)})
        sent: list[list[Message]] = []
        context: list[Message] = []
        last = 0
        previous: tuple[list[Message], list[Message]] | None = None
        for k, p in enumerate(points):
            request = context + conv[last:p]
            last = p
            tokens = estimate_messages_tokens(request)
            where = f"per-turn replay, request {k} ({tokens:,} estimated tokens, threshold {self.threshold:,})"
            try:
                triggered = bool(engine.should_compress(tokens))
                fire = should_compact(engine, tokens, request)  # the trigger every caller uses
            except EngineError as exc:
                raise self.fail(1, str(exc), request, where) from exc
            except Exception as exc:
                raise self.fail(1, f"should_compress raised {type(exc).__name__}: {exc}", request, where) from exc
            if self.threshold > 0 and tokens * 2 <= self.threshold:
                self.count(3)
                if triggered:
                    raise self.fail(3, f"should_compress({tokens}) is True at under half the threshold ({self.threshold})", request, where)
            if fire:
                out = self.compress(engine, request, tokens, where)
                self.report.turn_compactions += 1
                if previous is not None:
                    self.check_prefix(previous[0], previous[1], request, out, where)
                previous = (request, out)
            else:
                out = request
            sent_tokens = estimate_messages_tokens(out)
            engine.update_from_response({"prompt_tokens": sent_tokens, "completion_tokens": 16, "total_tokens": sent_tokens + 16})
            sent.append(out)
            context = list(out)
        final = sent[-1] if sent else []
        self.check_anchors(conv, final, "after the replay: the last request against the whole conversation", final=True, engine=engine)
        if self.deterministic:
            self.check_facts(engine, conv, final, "after the replay: the last request against the whole conversation")
        engine.on_session_end(sid, final)
        return sent


    # -- the kernel's guarantees ---------------------------------------------------------------
    def kernel(self, conv: list[Message]) -> None:
        """Replay ``conv`` through a :class:`~ctxengine.ContextManager` serving this engine
        (the one agent loop, an in-memory store): every request fits the window by the o200k
        count (invariant 10), and every fact of the conversation is in the last request or
        returned verbatim by recall (invariant 11)."""
        from ctxengine.manager import ContextManager
        from ctxengine.store.sqlite import SqliteStore

        store = SqliteStore(":memory:")
        mgr = ContextManager(Config(), model="contract", context_length=self.context_length, store=store, engine_factory=self._make, strict=False)
        sid = "contract-kernel"
        exact = mgr.window_counter

        def after(k: int, request: list[Message], appended: list[Message]) -> None:
            tokens = sum(exact.exact_messages(request))
            self.count(10)
            if tokens > mgr.window.limit:
                raise self.fail(10, f"request {k} is {tokens:,} o200k tokens, over the limit {mgr.window.limit:,}", request, "kernel replay")
            mgr.update_from_response({"prompt_tokens": tokens, "completion_tokens": 16}, session_id=sid)

        try:
            try:
                last, _ = replay(conv, lambda w: mgr.prepare(w, session_id=sid), after)
            except ContextWindowError:
                if not self.anchors_overflow(conv):
                    raise
                self.report.anchors_beyond_window += 1
                return
            first_assistant = max((i for i, m in enumerate(conv) if m.get("role") == "assistant"), default=len(conv))
            facts = extract_facts(conv[:first_assistant])
            missing = missing_facts(facts, context_text(last))
            self.count(11)
            lost = [f for f in missing.all() if not mgr.retrievable(f, session_id=sid)]
            if lost:
                raise self.fail(11, f"{len(lost)} fact(s) neither in the last request nor returned by recall: {lost[:5]}", conv, "kernel replay")
        finally:
            mgr.close()
            store.close()

    def thrash(self) -> None:
        """A session with a giant output early on, replayed at the engine level (the engine's
        own trigger, no kernel guard): the engine compacts on at most
        :data:`MAX_CONSECUTIVE_COMPACTIONS` consecutive turns (invariant 12)."""
        session = giant_output_session(self.context_length)
        engine, sid = self.fresh()
        streak = best = 0
        context: list[Message] = []
        initial, chunks = recorded_turns(session)
        request = initial
        for k, chunk in enumerate(chunks):
            tokens = estimate_messages_tokens(request)
            where = f"giant-output session, request {k}"
            try:
                fire = should_compact(engine, tokens, request)
                out = run_compress(engine, request, tokens=tokens).output if fire else request
            except EngineError as exc:
                raise self.fail(1, str(exc), request, where) from exc
            changed = out != request
            streak = streak + 1 if changed else 0
            best = max(best, streak)
            sent = estimate_messages_tokens(out)
            engine.update_from_response({"prompt_tokens": sent, "completion_tokens": 16, "total_tokens": sent + 16})
            context = list(out)
            request = [*context, *chunk]
        engine.on_session_end(sid, context)
        self.count(12)
        self.report.max_consecutive_compactions = best
        if best > MAX_CONSECUTIVE_COMPACTIONS:
            raise self.fail(12, f"the engine compacted on {best} consecutive turns (at most {MAX_CONSECUTIVE_COMPACTIONS})", session, "giant-output session")


def giant_output_session(context_length: int, turns: int = 14) -> list[Message]:
    """A coding session whose second tool output alone is about three windows (for windows up
    to ~100K tokens), followed by small turns: an engine that nibbles instead of cutting the
    giant compacts on every turn."""
    lines = max(200, min(context_length // 5, 20_000))  # about 3 windows (at most ~300K tokens)
    giant = "\n".join(f"/sys/devices/platform/serial8250/tty/ttyS{i}/power/runtime_status" for i in range(lines))
    msgs: list[Message] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "List the devices under /sys and fix src/Serial.java"},
    ]
    for k in range(turns):
        cid = f"g{k}"
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{"id": cid, "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": f"step {k}"})}}]})
        msgs.append({"role": "tool", "tool_call_id": cid, "content": giant if k == 1 else f"ok {k}: src/Serial.java line {k}"})
    msgs.append({"role": "assistant", "content": "done"})
    return msgs


@contextmanager
def _shrink_limit(seconds: float) -> Iterator[None]:
    """Bound the time hypothesis spends shrinking a failure (five minutes by default, long when
    each example runs an engine over whole conversations). The limit is a module constant of
    hypothesis' engine; when a hypothesis version lacks it, its default applies."""
    name = "MAX_SHRINKING_SECONDS"
    old = getattr(_hypothesis_engine, name, None)
    if old is None:
        yield
        return
    setattr(_hypothesis_engine, name, seconds)
    try:
        yield
    finally:
        setattr(_hypothesis_engine, name, old)


@contextmanager
def _no_local_constants() -> Iterator[None]:
    """Draw with no "local constants" while the kit runs, so a fixed seed gives the same
    conversations whatever ran before in the process.

    Hypothesis mixes into what it draws the literals of every module it counts as the user's
    own code that is imported so far (ctxengine's, a plugin's): a process-wide pool that grows
    as tests import more of the code, so the same seed gave other conversations alone than
    after other tests. The pool and its cache are hypothesis internals; when a version lacks
    them, its default applies.
    """
    get = getattr(_hypothesis_providers, "_get_local_constants", None)
    make = getattr(_hypothesis_providers, "Constants", None)
    cache = getattr(getattr(_hypothesis_providers, "CONSTANTS_CACHE", None), "cache", None)
    if get is None or make is None or cache is None or not hasattr(cache, "clear"):
        yield
        return
    empty = make()
    cache.clear()  # drawable constants computed with the pool as it was
    setattr(_hypothesis_providers, "_get_local_constants", lambda: empty)  # noqa: B010
    try:
        yield
    finally:
        setattr(_hypothesis_providers, "_get_local_constants", get)  # noqa: B010
        cache.clear()


def check_engine_contract(
    engine: EngineSource,
    *,
    examples: int = 50,
    seed: int | None = 0,
    max_turns: int = 6,
    huge_tokens: int | None = None,
    shrink_seconds: float = 30.0,
    kernel: bool = True,
) -> ContractReport:
    """Property-test ``engine`` against the invariants of DESIGN §3.3 (see the module docs).

    ``engine``: a factory returning a fresh engine (preferred; give it a small
    ``context_length`` such as 4,000 so compaction fires), or an engine instance (reset with
    ``on_session_reset()`` between examples). ``examples``: conversations to generate.
    ``seed``: fixed by default so runs are reproducible (the same conversations in any process,
    whatever ran before); ``None`` for a fresh random run.
    ``max_turns``: user turns per conversation. ``huge_tokens``: size bound of the occasional
    huge tool output; default twice the engine's threshold (at least 500, at most 100,000), so
    a single output can cross the threshold as in real sessions. ``shrink_seconds``: time
    spent shrinking a failure to a smaller example before it is reported. ``kernel``: also
    replay each conversation through a ContextManager serving the engine (invariants 10, 11)
    and run the giant-output session (invariant 12); needs the ``exact`` extra.

    Returns a :class:`ContractReport`; raises :class:`ContractViolation` (an
    ``AssertionError``) naming the broken invariant with the smallest example found.
    """
    harness = _Harness(engine)
    if huge_tokens is None:
        huge_tokens = max(500, min(2 * harness.threshold, 100_000))
    if harness.threshold <= 0:
        harness.report.notes.append("threshold_tokens is 0: invariant 3 (under the threshold) not checked")
    strategy = conversations(max_turns=max_turns, huge_tokens=huge_tokens)

    @hypothesis_settings(
        max_examples=examples,
        deadline=None,
        database=None,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
    )
    @given(strategy)
    def prop(conv: list[Message]) -> None:
        harness.run(conv)
        if kernel:
            harness.kernel(conv)

    if seed is not None:
        prop = hypothesis_seed(seed)(prop)
    pinned = _no_local_constants() if seed is not None else nullcontext()
    with _shrink_limit(shrink_seconds), pinned, warnings.catch_warnings():
        # hypothesis renders the failing conversation (tens of KB) for its own report, which
        # the kit replaces with a bounded rendering: its size warning is noise here
        warnings.filterwarnings("ignore", message="Generating overly large repr")
        prop()
    if kernel:
        harness.thrash()
    if harness.report.turn_compactions == 0:
        harness.report.notes.append(
            f"no compaction fired on the per-turn path (threshold {harness.threshold:,} tokens): "
            "give the engine a smaller context_length to exercise invariants 3 and 7"
        )
    return harness.report
